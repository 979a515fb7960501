"""Every prompt the agent sends, rendered from versioned template files in agent/prompts/.

Templates are `<name>_<version>.md` with `${placeholders}` (string.Template: braces in
CUDA and JSON need no escaping). A change of wording is a new version; the sha256 over a
version's files and the credit rules (template_hash; with the feedback as rendered:
agent.feedback_catalogue.asked_hash) goes into each run's config, so a sweep never mixes prompts unknowingly.
The task itself is described by tasks.describe.render_task, never here.
"""
from __future__ import annotations

import hashlib
import re
import string
from pathlib import Path

PROMPT_VERSION = "v1"
PROMPTS_DIR = Path(__file__).parent / "prompts"

GPU_NAMES = {"sm_90a": "Hopper (H100, H200)", "sm_100a": "Blackwell (B200)"}
ARCH_INSTRUCTIONS = {
    "sm_90a": "wgmma, TMA, mbarrier, setmaxnreg, clusters",
    "sm_100a": "tcgen05.mma, tensor memory, TMA, mbarrier, clusters",
}


class PromptError(ValueError):
    """A template is missing or a placeholder was not given: a bug, said in one line."""


def template_files(version: str = PROMPT_VERSION) -> list[Path]:
    files = sorted(PROMPTS_DIR.glob(f"*_{version}.md"))
    if not files:
        raise PromptError(f"no prompt templates for version {version!r} in {PROMPTS_DIR}")
    return files


def template_hash(version: str = PROMPT_VERSION) -> str:
    """sha256 over the names and contents of one version's templates, then over the credit rules the
    system prompt states for each arch (credit_rules, written from tools/credit.py's own numbers): a
    run resumes only with the same prompt text, and a rule that changed (a threshold, the tie) would
    otherwise judge and describe its later turns by other rules than its first. A run records
    agent.feedback_catalogue.asked_hash, this and the feedback's wording (agent.feedback renders
    through this module, so the feedback is folded in above it, not here)."""
    h = hashlib.sha256()
    for path in template_files(version):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    for arch in sorted(GPU_NAMES):
        h.update(f"credit_rules:{arch}".encode() + b"\0" + credit_rules(arch).encode() + b"\0")
    return h.hexdigest()


def render(name: str, version: str = PROMPT_VERSION, **values: object) -> str:
    path = PROMPTS_DIR / f"{name}_{version}.md"
    if not path.exists():
        raise PromptError(f"prompt template {path.name} is missing")
    try:
        text = string.Template(path.read_text()).substitute({k: str(v) for k, v in values.items()})
    except KeyError as exc:
        raise PromptError(f"prompt template {path.name} needs a value for {exc.args[0]!r}") from None
    return text.strip() + "\n"


def fence(lang: str) -> str:
    return "ptx" if lang == "ptx" else "cuda"


# How ptxas can quietly take a requested instruction's point away, per arch (only sm_90a's wgmma has it).
SASS_CAVEATS = {"sm_90a": " (and, for wgmma, not serialized by ptxas)"}


# ---------------------------------------------------------------------------------------
# The --require axis (issue 41), in one place. On: the prompts ask for the architecture's
# instructions, the task statement lists them and the credit rules are stated. Off: no prompt,
# statement or feedback names or asks for them and no credit rule is stated; the run is still
# judged on them (SASS, executed, carried), so correct-with-arch is measured unasked. Every text
# that differs between the two is chosen here or in tasks.describe.render_task(require=...).
# ---------------------------------------------------------------------------------------
REQUIRES = ("on", "off")


def requires(setting: str) -> bool:
    """A run's `require` setting ("on" | "off", RunConfig.require) as the flag the renderers take."""
    if setting not in REQUIRES:
        raise PromptError(f"require must be one of {', '.join(REQUIRES)}, not {setting!r}")
    return setting == "on"


def goal_words(require: bool) -> str:
    """What a kernel must be for its speed to count, as the model is told it."""
    return "correct with the requested instructions" if require else "correct"


def system_prompt(arch: str, lang: str, version: str = PROMPT_VERSION, require: bool = True) -> str:
    if require:
        values = dict(request=f"Where the task asks for them, use the architecture's own instructions "
                              f"({ARCH_INSTRUCTIONS.get(arch, 'its own instructions')}).\n",
                      inspected=" and the machine code (SASS) is inspected",
                      results="the compiler's diagnostics, the SASS verdict, correctness and speed",
                      credited=" with the requested instructions credited",
                      credit_rules="\nA requested instruction is credited only if all of these hold:\n"
                                   + credit_rules(arch) + "\n")
    else:
        values = dict(request="", inspected="", results="the compiler's diagnostics, correctness and speed",
                      credited="", credit_rules="")
    text = render("system", version, gpu_name=GPU_NAMES.get(arch, arch), arch=arch, fence=fence(lang),
                  language_rules=render(f"lang_{fence(lang)}", version, arch=arch).strip(), **values)
    return re.sub(r"\n{3,}", "\n\n", text)


def credit_rules(arch: str) -> str:
    """The instruction-credit rules as the evaluator applies them, with its own numbers
    (tools/credit.py), so the prompt cannot drift from the judge."""
    from tools import credit as rules
    from tools.features import features_for

    known = set(features_for(arch))
    work = []
    if "wgmma" in known and "wgmma" in rules.WORK_SHARE:
        work.append(f"  - wgmma: its FLOPs are at least {rules.WORK_SHARE['wgmma']:.0%} of the task's matrix FLOPs "
                    f"(and at most {rules.WGMMA_MAX_OVERWORK:g}x them), and at least {rules.WGMMA_MIN_OF_ALL_MATH:.0%} "
                    "of all the math your kernels do (every tensor instruction, FP64 and integer ones included; every "
                    "other executed thread instruction, loads, stores and branches included, counts as a multiply-add, "
                    "and reductions in memory as their adds);")
    if "tma" in known and "tma" in rules.WORK_SHARE:
        work.append(f"  - TMA: its tensor-map loads (cp.async.bulk.tensor; a plain cp.async.bulk is not TMA) bring in at "
                    f"least {rules.WORK_SHARE['tma']:.0%} of the task's input bytes, "
                    f"and other global-memory reads (LDG, atomics, cp.async, plain bulk copies) stay within {rules.TMA_MAX_OTHER_READS:g}x the "
                    f"input bytes ({rules.TMA_MAX_OTHER_READS_NO_MMA:g}x for a task that asks for no matrix "
                    "instruction);")
    work.append("  - any other requested instruction: it executes.")
    lines = [
        f"- It is in the SASS of the kernels your manifest launches{SASS_CAVEATS.get(arch, '')}.",
        # tools.counted: every timed run is counted, each in one hardware counter pass (the Nsight
        # Compute fallback counts runs made after them as timed runs are); tools.credit.tie_to_timed_run
        "- It is executed by those kernels, counted on the timed runs themselves (fresh inputs, every run "
        "judged, each run read by one of the counters' passes), on every judged workload (the hidden ones "
        "included): a kernel that takes another path when counted, on its first launch or on some shapes "
        "earns nothing.",
        "- It carries the task's work:", *work,
        f"- The counted runs are the timed kernel: each counter pass's runs take within "
        f"{rules.SAME_RUN_RATIO - 1:.0%} (+{rules.SAME_RUN_SLACK_MS:g} ms), both ways, of the other timed runs.",
    ]
    return "\n".join(lines)


def history_view(messages: list[dict], policy: str) -> list[dict]:
    """What of the chat a call sends: `full`, all of it; `latest`, the system prompt, the task,
    the last reply and its feedback (PTXBench's latest pair), so the prompt stays flat over turns."""
    if policy == "full" or len(messages) <= 4:
        return list(messages)
    return list(messages[:2]) + list(messages[-2:])


def budget_line(turn: int, max_turns: int | None, require: bool = True) -> str:
    """The turn budget, as the model is told it on every turn."""
    if not max_turns:
        return ""
    left = max_turns - turn
    more = f"{left} more after this one" if left else "this is the last one"
    return (f"This is turn {turn} of {max_turns} ({more}). Your best kernel across all turns that is "
            f"{goal_words(require)} is what counts, then its speed.")


def context_block(texts: list[str], why: str = "", version: str = PROMPT_VERSION) -> str:
    """Retrieved documentation, as the retriever rendered it; nothing retrieved -> no block at all."""
    texts = [t.strip() for t in texts if t and t.strip()]
    if not texts:
        return ""
    return render("context", version, sections="\n\n".join(texts), why=why)


def task_prompt(task_description: str, arch: str, context: str = "", version: str = PROMPT_VERSION,
                max_turns: int | None = None, require: bool = True) -> str:
    """task_description comes from tasks.describe.render_task(task, arch, language, require).
    Statement, reference material and budget are paragraphs one blank line apart, whichever are
    present, so that the context arms' prompts differ by the reference material alone."""
    context, budget = context.strip(), budget_line(1, max_turns, require)
    return render("task", version, task=task_description.strip(), arch=arch,
                  context=f"\n{context}\n" if context else "", budget=f"\n{budget}" if budget else "")
