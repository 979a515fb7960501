"""Every prompt the agent sends, rendered from versioned template files in agent/prompts/.

Templates are `<name>_<version>.md` with `${placeholders}` (string.Template: braces in
CUDA and JSON need no escaping). A change of wording is a new version; the sha256 over a
version's files goes into each run's config, so a sweep never mixes prompts unknowingly.
The task itself is described by tasks.describe.render_task, never here.
"""
from __future__ import annotations

import hashlib
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
    """sha256 over the names and contents of one version's templates."""
    h = hashlib.sha256()
    for path in template_files(version):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
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


def system_prompt(arch: str, lang: str, version: str = PROMPT_VERSION) -> str:
    return render("system", version, gpu_name=GPU_NAMES.get(arch, arch), arch=arch,
                  arch_instructions=ARCH_INSTRUCTIONS.get(arch, "its own instructions"),
                  language_rules=render(f"lang_{fence(lang)}", version, arch=arch).strip(), fence=fence(lang))


def context_block(texts: list[str], why: str = "", version: str = PROMPT_VERSION) -> str:
    """Retrieved documentation, as the retriever rendered it; nothing retrieved -> no block at all."""
    texts = [t.strip() for t in texts if t and t.strip()]
    if not texts:
        return ""
    return render("context", version, sections="\n\n".join(texts), why=why)


def task_prompt(task_description: str, arch: str, context: str = "", version: str = PROMPT_VERSION) -> str:
    """task_description comes from tasks.describe.render_task(task, arch, language)."""
    return render("task", version, task=task_description.strip(), context=context, arch=arch)
