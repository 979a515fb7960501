"""Fixit data: supervised fine-tuning examples built from a model's own mistakes and their
corrections, with an explanation of why the correction works.

Stages, each small and typed:

  load_attempts(run dirs)      every candidate of every trajectory, with its EvalResult
  error_classes(attempt)       compile | features_missing | runtime | timeout | numerical |
                               input_modified | implausible | held_out
  find_pairs(attempts)         failed candidate -> the first later candidate of the same run
                               descended from it (its chat held the failed kernel), another kernel
                               than the failed one (not it sent again), that fixed
                               that error class without failing a check the failed one passed,
                               nor any check on the GPU, held-out workloads included (source
                               "trajectory"); with a teacher model, unfixed failures are
                               repaired through agent.run.repair (source "teacher"). One
                               example per (failed, fixed) kernel pair, with every class it fixed
  explain(pair)                the correcting reply's own reasoning (text outside code
                               blocks) when that reply answered the failed kernel itself, or
                               an explainer model's answer
  filter / dedupe / balance    min speedup, size; near-duplicate kernels out (Jaccard of
                               5-token shingles >= 0.9); caps per task and error class and a
                               total (--max-examples), drawn round-robin over the tasks, then
                               over each task's (error class, turn) strata, seeded
  build(runs, out)             all of the above -> train.jsonl (chat messages; loss on the last message only,
                               marked weight=1) + data_card.md + data_card.json

What counts as "fixed" is decided from verdicts, never guessed: without a GPU correctness
is unknown, so a runtime, timeout or numerical error is only ever called fixed by a
candidate that ran on a GPU; CPU-only runs give compile and features_missing pairs.
"""
from __future__ import annotations

import json
import random
import re
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Literal, Sequence

from agent.trajectory import (CandidateRecord, RunConfig, TurnRecord, is_teacher_run, read_config, read_events,
                              read_summary)
from tools.results import WRONG_NUMBERS, EvalResult
from tools.solution import Solution, SolutionError

ErrorClass = Literal["compile", "features_missing", "runtime", "timeout", "numerical", "input_modified",
                     "implausible", "held_out"]
ERROR_CLASSES: tuple[str, ...] = ("compile", "features_missing", "runtime", "timeout", "numerical", "input_modified",
                                  "implausible", "held_out")
# Failed workloads' reasons with a class of their own. Neither crashed: input_modified wrote its
# read-only inputs, implausible was timed faster than the GPU's ceiling (it skipped work). The
# other reasons are numerical (WRONG_NUMBERS) or runtime (crash, fault, bad manifest ...).
_REASON_CLASS = {"timeout": "timeout", "input_modified": "input_modified", "implausible": "implausible"}
SHINGLE = 5
DUP_JACCARD = 0.9


# ---------------------------------------------------------------------------------------
# Attempts
# ---------------------------------------------------------------------------------------
@dataclass
class Attempt:
    """One candidate of a trajectory: what the model wrote and what the evaluator said."""

    run_dir: Path
    config: RunConfig
    record: CandidateRecord
    solution: Solution | None  # None: no usable kernel in the reply
    eval: EvalResult | None
    reply: str
    feedback: str | None = None  # the user message the model saw after this candidate, if recorded
    # The candidate whose feedback this one answered (its path in the run); None: it answered the
    # task (turn 1), or for a teacher run, the student's kernel the run opened with.
    parent: str | None = None
    # The chat as sent for this candidate (its `llm_request` event): the system prompt of the run's
    # prompt version, the task message with its arm's docs, ... and the message it answered last.
    # None: not recorded (hand-written run folders).
    sent: list[dict] | None = None
    # The message that followed this candidate in a chat that went on from it (docs retrieved for
    # its result, then its feedback), as sent; None: no recorded request continued from it.
    followed_by: str | None = None

    @property
    def key(self) -> tuple[int, int]:
        return (self.record.turn, self.record.sample)


def load_attempts(run_dir: Path) -> list[Attempt]:
    """All candidates of one run, in (turn, sample) order: the turns its summary holds, and any later
    ones its events record. The summary is written after each turn's decision, so a run killed while a
    turn was judged or decided (or before its first summary) has evaluated candidates only there."""
    summary = read_summary(run_dir)
    per_turn = list(summary.per_turn) if summary is not None else []
    done = max((t.turn for t in per_turn), default=0)
    per_turn += [t for t in turns_from_events(run_dir) if t.turn > done]
    config = read_config(run_dir)
    # A feedback event names the candidate it describes (`parent`): for evolve that is the parent
    # drawn for the next turn, not the turn's own candidate. Runs recorded before that: by turn.
    about: dict[str, str] = {}
    by_turn: dict[int, str] = {}
    for e in read_events(run_dir, "feedback"):
        if e.get("parent"):
            about.setdefault(e["parent"], e.get("text"))
        else:
            by_turn[e.get("turn")] = e.get("text")
    chosen_path = {t.turn: next((c.path for c in t.candidates if t.chosen is None or c.sample == t.chosen), None)
                   for t in per_turn}
    # What the model was sent (the last request of a candidate wins: one asked again after a crash).
    sent = {(e.get("turn"), e.get("sample")): e.get("messages") for e in read_events(run_dir, "llm_request")}
    attempts = []
    for t in per_turn:
        for c in t.candidates:
            folder = run_dir / c.path
            try:
                solution = Solution.from_dir(folder)
            except SolutionError:
                solution = None
            ev_path = folder / "eval.json"
            ev = EvalResult.model_validate_json(ev_path.read_text()) if ev_path.exists() else None
            reply = (folder / "reply.md").read_text() if (folder / "reply.md").exists() else ""
            chosen = t.chosen is None or t.chosen == c.sample
            # Runs recorded before candidates named their parent continued from the previous turn's chosen one.
            parent = c.parent if c.parent is not None or t.turn == 1 else chosen_path.get(t.turn - 1)
            attempts.append(Attempt(run_dir, config, c, solution, ev, reply,
                                    about.get(c.path) or (by_turn.get(t.turn) if chosen else None), parent,
                                    sent.get((t.turn, c.sample)) or None))
    by_path = {a.record.path: a for a in attempts}
    for a in attempts:  # the first chat that went on from a candidate says what followed it
        last = a.sent[-1] if a.sent else None
        if a.parent in by_path and last and last.get("role") == "user" and by_path[a.parent].followed_by is None:
            by_path[a.parent].followed_by = last.get("content")
    return sorted(attempts, key=lambda a: a.key)


def turns_from_events(run_dir: Path) -> list[TurnRecord]:
    """The turns of a run without a summary, from its `candidate` events (the last one of a candidate
    wins: a candidate evaluated again on resume is recorded twice). Which sample a best-of-N turn went
    on with is not recorded there; each candidate names its parent, which is what pairing reads."""
    latest: dict[str, CandidateRecord] = {}
    for e in read_events(run_dir, "candidate"):
        latest[e["path"]] = CandidateRecord.model_validate(e)
    turns: dict[int, list[CandidateRecord]] = {}
    for c in sorted(latest.values(), key=lambda c: (c.turn, c.sample)):
        turns.setdefault(c.turn, []).append(c)
    return [TurnRecord(turn=t, candidates=cs) for t, cs in sorted(turns.items())]


def error_classes(a: Attempt) -> set[str]:
    """The error classes observed for a candidate (empty: nothing failed that was checked)."""
    if a.solution is None or a.eval is None:
        return set()  # no kernel: nothing to pair (a format error is not a kernel mistake)
    ev = a.eval
    if not ev.compiled:
        return {"compile"}
    found = set() if ev.arch_ok and ev.arch_executed is not False else {"features_missing"}
    if ev.run_status in ("ok", "failed"):  # it ran on a GPU
        failed = [w for w in ev.workloads if w.split == "visible" and w.status == "failed"]
        for w in failed:
            found.add(_REASON_CLASS.get(w.reason or "")
                      or ("numerical" if w.reason in WRONG_NUMBERS else "runtime"))
        if ev.run_status == "failed" and not failed:
            found.add("runtime")
        # Every visible workload passed, a held-out one failed: fitted to the sizes it was shown. (With a
        # visible failure too, the held-out ones are that same mistake.) Its feedback counted them by
        # kind, never by size, and so does the example built from it.
        if ev.run_status == "ok" and not failed and _held_out(ev, "failed"):
            found.add("held_out")
    return found


def _held_out(ev: EvalResult, status: str) -> list:
    return [w for w in ev.workloads if w.split == "held_out" and w.status == status]


def passed_checks(a: Attempt) -> set[str]:
    """The checks a candidate passed (as opposed to failed, or never ran)."""
    if a.eval is None or a.solution is None or not a.eval.compiled:
        return set()
    errors = error_classes(a)
    passed = {"compile"} | ({"features_missing"} - errors)
    if a.eval.run_status == "ok":  # the visible workloads ran on a GPU
        # A timed-out kernel never finished, so it did not show it runs cleanly either.
        passed |= {"runtime", "timeout"} - errors - ({"runtime"} if "timeout" in errors else set())
        if a.eval.correct is True:  # every visible workload passed: right numbers, inputs left alone
            passed |= {"numerical", "input_modified"}
            # plausibility is judged on the timed runs: an untimed kernel never showed it
            if all(w.timing is not None for w in a.eval.workloads if w.split == "visible"):
                passed.add("implausible")
            # generalising is shown by running the held-out sizes: all of them passed (none skipped)
            held = [w for w in a.eval.workloads if w.split == "held_out"]
            if held and all(w.status == "passed" for w in held):
                passed.add("held_out")
    return passed


GPU_FAILURES = frozenset({"runtime", "timeout", "numerical", "input_modified", "implausible", "held_out"})


def fixes(later: Attempt, failed: Attempt, error: str) -> bool:
    """`later` passed the check `failed` failed, and every check `failed` passed, and it failed
    no check on the GPU: a kernel seen to crash, hang or compute wrong numbers is no one's
    correction (a compile error answered with a crashing kernel would teach the crash), nor is
    one that failed a held-out workload (fitted to the sizes it was shown: it would teach the very
    failure to generalise that a fine-tuned model is tested for)."""
    done = passed_checks(later)
    held_out_failed = later.eval is not None and bool(_held_out(later.eval, "failed"))
    return (error in done and passed_checks(failed) <= done and not error_classes(later) & GPU_FAILURES
            and not held_out_failed and not same_kernel(later.solution, failed.solution))


def same_kernel(a: Solution | None, b: Solution | None) -> bool:
    """The same kernel sent again: its source equal but for comments and whitespace, and the same launch
    manifest. A GPU verdict can flip on it (fresh random inputs each check, a timeout under load): it
    passing the second time fixed nothing, and taught as a correction it says resending is one."""
    if a is None or b is None or a.language != b.language:
        return False
    return _tokens(a.source) == _tokens(b.source) and a.manifest == b.manifest


# ---------------------------------------------------------------------------------------
# Pairs
# ---------------------------------------------------------------------------------------
@dataclass
class Pair:
    failed: Attempt
    fixed: Attempt
    error: str  # the first of `errors` (strata, meta "error")
    source: Literal["trajectory", "teacher"]
    explanation: str = ""
    explanation_source: Literal["reply", "explainer", "none"] = "none"
    # every class `fixed` fixed of `failed`'s (merge_pairs): a kernel that failed two checks and
    # was fixed by one later kernel is one example, counted under both classes
    errors: tuple[str, ...] = ()

    def __post_init__(self):
        self.errors = self.errors or (self.error,)

    @property
    def task(self) -> str:
        return self.failed.config.task

    @property
    def turn(self) -> int:
        return self.failed.record.turn


def descends(later: Attempt, failed: Attempt, by_path: dict[str, Attempt]) -> bool:
    """`later` was written in a chat that held `failed` and its feedback: `failed` is one of its
    parents, grandparents, ... (a best-of-N sample the chat did not continue, or another evolve
    branch, is not)."""
    seen: set[str] = set()
    path = later.parent
    while path is not None and path not in seen:
        if path == failed.record.path:
            return True
        seen.add(path)
        path = by_path[path].parent if path in by_path else None
    return False


def find_pairs(attempts: Sequence[Attempt]) -> tuple[list[Pair], list[tuple[Attempt, str]]]:
    """(pairs, unfixed failures): each failed candidate x error class -> the first later candidate
    descended from it that fixed it; one pair per (failed, fixed) candidates (merge_pairs)."""
    pairs, unfixed = [], []
    by_path = {a.record.path: a for a in attempts}
    for i, a in enumerate(attempts):
        for error in sorted(error_classes(a), key=ERROR_CLASSES.index):
            fix = next((b for b in attempts[i + 1:] if descends(b, a, by_path) and fixes(b, a, error)), None)
            if fix is None:
                unfixed.append((a, error))
            else:
                pairs.append(Pair(a, fix, error, "trajectory"))
    return merge_pairs(pairs), unfixed


def merge_pairs(pairs: Sequence[Pair]) -> list[Pair]:
    """One pair per (failed, fixed) candidates and source, with every error class it fixed. Two
    pairs of the same kernels would be one training example written twice (dedupe then dropped
    the second as a near-duplicate, and its class went uncounted)."""
    merged: dict[tuple, Pair] = {}
    for p in pairs:
        key = (p.failed.run_dir, p.failed.record.path, p.fixed.run_dir, p.fixed.record.path, p.source)
        if key in merged:
            m = merged[key]
            m.errors = tuple(sorted({*m.errors, *p.errors}, key=ERROR_CLASSES.index))
            m.error = m.errors[0]
        else:
            merged[key] = Pair(p.failed, p.fixed, p.error, p.source, errors=p.errors)
    return list(merged.values())


TeacherFn = Callable[[Attempt, str], "Attempt | None"]
TEACHER_STAMP = "fixit_teacher.json"  # in a finished teacher run: which teacher, turns, failed kernel


def teacher_repair(teacher: str, work_dir: Path, api_base: str | None = None, turns: int = 3) -> TeacherFn:
    """Repair failed candidates with a teacher model through the agent loop (agent.run.repair).

    One teacher run per failed candidate, under work_dir/teacher/<run id>/<turn>-<sample>: the
    chat opens with the task, the student's kernel and the feedback the student got; the
    teacher then has `turns` turns. Its first candidate that fixes the error class is the
    correction. A teacher run that ended for good is reused, so a second build costs no calls (one
    the teacher's provider stopped is asked again; Ctrl-C stops the build), but only by
    the same teacher, with the same turns, for the same kernel and feedback of the same task, arch,
    language and task definition (TEACHER_STAMP says which): run ids repeat (a sweep run again,
    another --teacher into the same folder, one --run-id used for two experiments).
    """
    import hashlib
    import shutil

    from agent import run as agent_run
    from agent.trajectory import Budget

    def repair(failed: Attempt, error: str) -> Attempt | None:
        cfg = failed.config
        run_id = f"teacher/{cfg.run_id}/{failed.record.turn}-{failed.record.sample}"
        run_dir = work_dir / run_id
        feedback = feedback_text(failed)
        kernel = solution_block(failed.solution)  # type: ignore[arg-type]
        digest = hashlib.sha256((kernel + "\0" + feedback).encode()).hexdigest()
        # run ids repeat across experiments: a repair is of this task's (and arch's) kernel, judged by its definition
        stamp = {"teacher": teacher, "turns": turns, "failed": digest, "task": cfg.task, "arch": cfg.arch,
                 "lang": cfg.lang, "task_hash": cfg.task_hash}
        stamp_path = run_dir / TEACHER_STAMP
        done = stamp_path.is_file() and json.loads(stamp_path.read_text()) == stamp
        if not done:
            if run_dir.exists():  # died half-way, another teacher's, or another kernel's: start again
                shutil.rmtree(run_dir)
            # the student's model settings (its context window, provider options, temperature) are not
            # the teacher's: the teacher is asked with its provider's defaults
            config = cfg.model_copy(update={"run_id": run_id, "model": teacher, "api_base": api_base,
                                            "model_options": {}, "model_params": {}, "temperature": None,
                                            "model_name": None, "budget": Budget(max_turns=turns)})
            summary = agent_run.repair(config, failed.solution, feedback, runs_dir=work_dir, quiet=True)
            if summary.stop_reason == "interrupted":  # Ctrl-C (or SIGTERM) is meant for the build
                raise KeyboardInterrupt
            # Written last, and only for a run that ended for good: one the teacher's provider or the
            # infrastructure stopped is asked again by the next build, never reused as the teacher's answer.
            if agent_run.finished_summary(run_dir) is not None:
                stamp_path.write_text(json.dumps(stamp) + "\n")
        return next((b for b in load_attempts(run_dir) if fixes(b, failed, error)), None)

    return repair


# ---------------------------------------------------------------------------------------
# Text: feedback, explanation, messages
# ---------------------------------------------------------------------------------------
_FENCED = re.compile(r"```.*?(```|\Z)", re.S)


def reasoning_text(reply: str) -> str:
    """The reply without its code blocks: the model's own account of what it changed and why."""
    text = _FENCED.sub("", reply)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def feedback_text(a: Attempt) -> str:
    """What the model was (or would have been) told about this candidate."""
    if a.feedback:
        return a.feedback
    from agent import prompts
    from agent.feedback import render_feedback

    return render_feedback(a.record.turn, "repair", a.config.lang, a.record, a.eval,
                           require=prompts.requires(a.config.require))


def solution_block(s: Solution) -> str:
    """A solution as a reply shows it: source block + manifest block (extract_solution reads it back)."""
    fence = "ptx" if s.language == "ptx" else "cuda"
    manifest = s.manifest.model_dump_json(indent=2, exclude_defaults=True)
    return f"```{fence}\n{s.source.rstrip()}\n```\n\n```json\n{manifest}\n```\n"


ExplainerFn = Callable[[Pair], str]


def explainer_model(spec: str, api_base: str | None = None) -> ExplainerFn:
    from agent.models import get_model

    model = get_model(spec, api_base=api_base)

    def explain(p: Pair) -> str:
        what = p.error.replace("_", " ")
        prompt = (f"A GPU kernel for task `{p.task}` on `{p.failed.config.arch}` failed ({what}).\n\n"
                  f"Failed version:\n{solution_block(p.failed.solution)}\n"  # type: ignore[arg-type]
                  f"Evaluation feedback:\n{feedback_text(p.failed)}\n\n"
                  f"Corrected version:\n{solution_block(p.fixed.solution)}\n"  # type: ignore[arg-type]
                  "In a few sentences, explain what was wrong and why the correction works. No code.")
        return model.complete([{"role": "user", "content": prompt}]).text.strip()

    return explain


def answers(p: Pair) -> bool:
    """The fixing reply answered the failed kernel itself (its parent; a teacher's first turn
    answers the student's kernel), so its reasoning is about this mistake and not a later one."""
    if p.source == "teacher":
        return p.fixed.parent is None
    return p.fixed.parent == p.failed.record.path


def explain(p: Pair, explainer: ExplainerFn | None) -> Pair:
    if explainer is not None:
        p.explanation, p.explanation_source = explainer(p), "explainer"
    else:
        text = reasoning_text(p.fixed.reply) if answers(p) else ""
        p.explanation, p.explanation_source = text, ("reply" if text else "none")
    return p


def messages(p: Pair) -> list[dict]:
    """system, user (task + wrong kernel + feedback), assistant (reasoning + fixed kernel).

    The system prompt and the task message are those the model was sent when it wrote the wrong
    kernel (its run's prompt version; the task message with its context arm's docs), and after the
    kernel comes what was sent after it (docs retrieved for its result, then its feedback), so an
    example teaches a fix in the prompt it was written in, as the trained model is prompted in a
    sweep. Runs that recorded no requests: rendered as the loop renders them, without docs.

    Only the assistant message is trained on: it carries weight 1, the others weight 0
    (the OpenAI fine-tuning convention; `agent fixit train` turns it into prompt/completion).
    """
    from agent import prompts

    cfg = p.failed.config
    seen = p.failed.sent
    if seen and len(seen) >= 2 and [m.get("role") for m in seen[:2]] == ["system", "user"]:
        system, task_message = seen[0]["content"], seen[1]["content"]
    else:
        from tasks import get_task
        from tasks.describe import render_task

        asks = prompts.requires(cfg.require)
        system = prompts.system_prompt(cfg.arch, cfg.lang, cfg.prompt_version, asks)
        task_message = render_task(get_task(cfg.task), cfg.arch, cfg.lang, asks)
    # What followed the wrong kernel: as the fixing reply itself was sent it (it answered that kernel),
    # else as the chat that went on from it was; else the feedback recorded or rendered for it.
    answered = p.fixed.sent[-1] if p.source == "trajectory" and answers(p) and p.fixed.sent else None
    after = (answered.get("content") if answered and answered.get("role") == "user" else None) \
        or p.failed.followed_by or feedback_text(p.failed)
    wrong, fixed = solution_block(p.failed.solution), solution_block(p.fixed.solution)  # type: ignore[arg-type]
    user = (task_message.strip() + "\n\n## Your previous attempt\n\n" + wrong + "\n" + after.strip() + "\n")
    answer = (p.explanation.strip() + "\n\n" if p.explanation.strip() else "") + fixed
    return [{"role": "system", "content": system, "weight": 0},
            {"role": "user", "content": user, "weight": 0},
            {"role": "assistant", "content": answer, "weight": 1}]


# ---------------------------------------------------------------------------------------
# Filters, near-duplicates, balance
# ---------------------------------------------------------------------------------------
@dataclass
class Filters:
    min_speedup: float | None = None  # keep a pair only if its fix was timed at least this fast
    max_chars: int = 60_000  # both kernels together; longer ones do not fit a training context

    def reject(self, p: Pair) -> str | None:
        if self.min_speedup is not None:
            s = p.fixed.eval.speedup if p.fixed.eval else None
            if s is None or s < self.min_speedup:
                return "below_min_speedup"
        if len(p.failed.solution.source) + len(p.fixed.solution.source) > self.max_chars:  # type: ignore[union-attr]
            return "too_long"
        return None


def _tokens(text: str) -> list[str]:
    """The source's tokens, comments dropped (whitespace is no token)."""
    return re.findall(r"\w+|[^\w\s]", re.sub(r"//[^\n]*|/\*.*?\*/", " ", text, flags=re.S))


def shingles(text: str, k: int = SHINGLE) -> frozenset[str]:
    """k-token shingles of the text with comments dropped and whitespace normalised."""
    tokens = _tokens(text)
    if len(tokens) <= k:
        return frozenset([" ".join(tokens)])
    return frozenset(" ".join(tokens[i:i + k]) for i in range(len(tokens) - k + 1))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def dedupe(pairs: Sequence[Pair], threshold: float = DUP_JACCARD) -> tuple[list[Pair], int]:
    """Drop pairs whose (wrong kernel, fixed kernel) are near-duplicates of a kept pair's."""
    kept: list[Pair] = []
    seen: list[tuple[frozenset[str], frozenset[str]]] = []
    for p in pairs:
        sig = (shingles(p.failed.solution.source), shingles(p.fixed.solution.source))  # type: ignore[union-attr]
        if any(jaccard(sig[0], s[0]) >= threshold and jaccard(sig[1], s[1]) >= threshold for s in seen):
            continue
        kept.append(p)
        seen.append(sig)
    return kept, len(pairs) - len(kept)


def balance(pairs: Sequence[Pair], *, cap_per_task: int | None, cap_per_error: int | None,
            seed: int) -> list[Pair]:
    """Stratified down-sampling, shuffled with the seed: round-robin over the tasks, and within a
    task over its (error class, failed turn) strata, taking a pair while its task and error class
    are under their caps. The pairs come back in the order taken, so any first N of them are spread
    over the tasks first, then over each task's error classes and turns, as evenly as the data allows
    (a task with many strata does not crowd out one with few)."""
    rng = random.Random(seed)
    strata: dict[tuple, list[Pair]] = {}
    for p in pairs:
        strata.setdefault((p.task, p.error, p.turn), []).append(p)
    by_task: dict[str, list[list[Pair]]] = {}
    for key in sorted(strata):
        rng.shuffle(strata[key])
        by_task.setdefault(key[0], []).append(strata[key])
    order = sorted(by_task)
    rng.shuffle(order)
    rotation = {t: deque(rng.sample(by_task[t], len(by_task[t]))) for t in order}
    per_task: Counter = Counter()
    per_error: Counter = Counter()  # an example counts under every class it fixes, as the card counts it
    chosen: list[Pair] = []
    while any(rotation.values()):
        for t in order:
            if not rotation[t]:
                continue
            queue = rotation[t].popleft()
            p = queue.pop()
            if queue:
                rotation[t].append(queue)
            if cap_per_task is not None and per_task[p.task] >= cap_per_task:
                continue
            if cap_per_error is not None and any(per_error[e] >= cap_per_error for e in p.errors):
                continue
            per_task[p.task] += 1
            per_error.update(p.errors)
            chosen.append(p)
    return chosen


# ---------------------------------------------------------------------------------------
# The whole build
# ---------------------------------------------------------------------------------------
@dataclass
class BuildOptions:
    teacher: str | None = None
    teacher_api_base: str | None = None
    teacher_turns: int = 3
    explainer: str | None = None
    explainer_api_base: str | None = None
    filters: Filters = field(default_factory=Filters)
    cap_per_task: int | None = None
    cap_per_error: int | None = None
    # At most this many examples, the first in the balanced round-robin order (so a smaller set keeps
    # the spread over tasks, error classes and turns); with `tasks`, the same size drawn from fewer
    # tasks: the two arms of "diverse data beats more data" at equal size (docs/FIXIT.md).
    max_examples: int | None = None
    tasks: tuple[str, ...] | None = None  # only pairs of these tasks (canonical names); None: every task
    seed: int = 0
    dedupe_threshold: float = DUP_JACCARD
    # Only runs of tasks in this split (tasks.registry.task_split: "train"); None: every run. Runs of
    # held-out tasks then give no example, so a fine-tuned model can be tested on tasks it never saw.
    split: str | None = None


@dataclass
class BuildResult:
    out_dir: Path
    examples: int
    card: dict


def build(run_paths: Iterable[str | Path], out_dir: str | Path, options: BuildOptions = BuildOptions(), *,
          teacher_fn: TeacherFn | None = None, explainer_fn: ExplainerFn | None = None) -> BuildResult:
    """Run folders (or sweep folders) -> out_dir/train.jsonl + data card."""
    from agent.report import find_run_dirs

    out = Path(out_dir)
    run_dirs = [d for d in find_run_dirs(run_paths) if not is_teacher_run(d)]
    if not run_dirs:
        raise ValueError("no runs found (a run folder holds config.json)")
    seen: dict[str, Path] = {}
    for d in run_dirs:  # as agent.report.load_runs: a copy read too would count the run's failures twice
        run_id = read_config(d).run_id
        if run_id in seen:
            raise ValueError(f"run {run_id} is in two folders, {seen[run_id]} and {d}: build from one of them "
                             f"(reading both would count its failures and pairs twice)")
        seen[run_id] = d
    if teacher_fn is None and options.teacher:
        teacher_fn = teacher_repair(options.teacher, out / "teacher_runs", options.teacher_api_base,
                                    options.teacher_turns)
    if explainer_fn is None and options.explainer:
        explainer_fn = explainer_model(options.explainer, options.explainer_api_base)

    left_out: Counter = Counter()
    if options.split is not None:  # before anything reads them: no teacher repairs a held-out task either
        from tasks.registry import task_split

        splits = {d: task_split(read_config(d).task) for d in run_dirs}
        left_out.update(s for s in splits.values() if s != options.split)
        run_dirs = [d for d in run_dirs if splits[d] == options.split]
    # A run judged against another definition of its task (other workloads, held-out sizes, tolerance,
    # reference) verified its fixes against that one, and its prompts and feedback name that one's
    # visible sizes: no example of the task an adapter is evaluated on. Runs recorded before configs
    # held the hash cannot be told apart: kept, and counted on the card.
    definitions = {d: task_definition(read_config(d)) for d in run_dirs}
    left_out.update(s for s in definitions.values() if s == "other_task_definition")
    run_dirs = [d for d in run_dirs if definitions[d] != "other_task_definition"]
    unknown_definition = sum(1 for d in run_dirs if definitions[d] == "unknown")
    pairs: list[Pair] = []
    failures = Counter()
    unfixed_total = 0
    for d in run_dirs:
        attempts = load_attempts(d)
        for a in attempts:
            for e in error_classes(a):
                failures[e] += 1
        found, unfixed = find_pairs(attempts)
        pairs += found
        repaired = []
        for failed, error in unfixed:
            fix = teacher_fn(failed, error) if teacher_fn else None
            if fix is None:
                unfixed_total += 1
            else:
                repaired.append(Pair(failed, fix, error, "teacher"))
        pairs += merge_pairs(repaired)  # one teacher run per failed kernel: its fix may fix several classes

    dropped: Counter = Counter()
    kept = []
    for p in pairs:
        why = "other_task" if options.tasks is not None and p.task not in options.tasks else options.filters.reject(p)
        if why:
            dropped[why] += 1
        else:
            kept.append(p)
    kept, dupes = dedupe(kept, options.dedupe_threshold)
    dropped["near_duplicate"] = dupes
    balanced = balance(kept, cap_per_task=options.cap_per_task, cap_per_error=options.cap_per_error,
                       seed=options.seed)
    dropped["over_cap"] = len(kept) - len(balanced)
    chosen = balanced[:options.max_examples]  # round-robin order: the first N are spread as widely as all
    dropped["over_max_examples"] = len(balanced) - len(chosen)
    chosen.sort(key=lambda p: (p.task, p.error, p.failed.config.run_id, p.failed.key))
    for p in chosen:
        explain(p, explainer_fn)

    out.mkdir(parents=True, exist_ok=True)
    with open(out / "train.jsonl", "w", encoding="utf-8") as f:
        for i, p in enumerate(chosen):
            f.write(json.dumps({"messages": messages(p), "meta": example_meta(p, i)}, ensure_ascii=False) + "\n")
    card = data_card(chosen, runs=len(run_dirs), failures=failures, pairs_found=len(pairs),
                     unfixed=unfixed_total, dropped=dropped, options=options, left_out=left_out,
                     unknown_definition=unknown_definition)
    (out / "data_card.json").write_text(json.dumps(card, indent=2) + "\n")
    (out / "data_card.md").write_text(render_card(card))
    return BuildResult(out, len(chosen), card)


def task_definition(config: RunConfig) -> str:
    """`current` when the run was judged against today's definition of its task (agent.run.task_hash),
    `other_task_definition` when against another, `unknown` when it recorded none (or its task is
    no longer known here)."""
    from agent.run import task_hash
    from tasks import get_task

    if not config.task_hash:
        return "unknown"
    try:
        current = task_hash(get_task(config.task))
    except ValueError:
        return "unknown"
    return "current" if config.task_hash == current else "other_task_definition"


def example_meta(p: Pair, index: int) -> dict:
    fx = p.fixed.eval
    return {"id": f"fixit-{index:05d}", "run_id": p.failed.config.run_id, "model": p.failed.config.model,
            "task": p.task, "arch": p.failed.config.arch, "lang": p.failed.config.lang, "error": p.error,
            "errors": list(p.errors),
            "failed_turn": p.failed.record.turn, "failed_sample": p.failed.record.sample,
            "fixed_run_id": p.fixed.config.run_id, "fixed_turn": p.fixed.record.turn,
            "fixed_outcome": p.fixed.record.outcome, "fixed_speedup": fx.speedup if fx else None,
            "source": p.source, "explanation_source": p.explanation_source,
            "loss": "last message only (weight=1)"}


def data_card(chosen: Sequence[Pair], *, runs: int, failures: Counter, pairs_found: int, unfixed: int,
              dropped: Counter, options: BuildOptions, left_out: Counter = Counter(),
              unknown_definition: int = 0) -> dict:
    def count(key) -> dict:
        return dict(sorted(Counter(key(p) for p in chosen).items()))

    return {
        "examples": len(chosen), "runs": runs, "runs_left_out": dict(sorted(left_out.items())),
        # runs recorded before configs held their task's hash: judged against a definition unknown
        "runs_task_definition_unknown": unknown_definition,
        "failed_candidates_by_error": dict(sorted(failures.items())),
        "pairs_found": pairs_found, "unfixed_failures": unfixed, "dropped": dict(sorted(dropped.items())),
        # an example fixing two classes (features and numbers, say) counts under both, as its meta.errors says
        "by_task": count(lambda p: p.task),
        "by_error": dict(sorted(Counter(e for p in chosen for e in p.errors).items())),
        "by_source": count(lambda p: p.source), "by_turn": count(lambda p: p.turn),
        "by_arch": count(lambda p: p.failed.config.arch), "by_model": count(lambda p: p.failed.config.model),
        "by_explanation_source": count(lambda p: p.explanation_source),
        "options": {"teacher": options.teacher, "explainer": options.explainer,
                    "min_speedup": options.filters.min_speedup, "max_chars": options.filters.max_chars,
                    "cap_per_task": options.cap_per_task, "cap_per_error": options.cap_per_error,
                    "max_examples": options.max_examples, "tasks": list(options.tasks) if options.tasks else None,
                    "seed": options.seed, "dedupe_jaccard": options.dedupe_threshold, "shingle_tokens": SHINGLE,
                    "split": options.split},
        "format": "train.jsonl: {messages: [system, user, assistant], meta}; train on the assistant "
                  "message only (weight=1)",
    }


def render_card(card: dict) -> str:
    def table(title: str, d: dict) -> list[str]:
        rows = [f"| {k} | {v} |" for k, v in d.items()] or ["| (none) | 0 |"]
        return [f"### {title}", "", "| value | examples |", "|---|---|", *rows, ""]

    def value(v) -> str:
        return "not set" if v is None else " + ".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)

    def words(d: dict) -> str:  # {"compile": 3, "x": None} -> "compile 3, x not set"; {} -> "none"
        return ", ".join(f"{k} {value(v)}" for k, v in d.items()) or "none"

    def n(count: int, word: str) -> str:
        return f"{count} {word}" + ("" if count == 1 else "s")

    lines = ["# Fixit data card", "",
             f"{n(card['examples'], 'example')} from {n(card['runs'], 'run')}: each pairs a failed kernel and its "
             "evaluation feedback with the later kernel that fixed that error class, and an explanation.", "",
             f"- runs left out (by the split `{card['options']['split'] or 'all'}`, or judged against another "
             f"definition of their task): {words(card['runs_left_out'])}",
             f"- runs that recorded no task definition (judged against one unknown): "
             f"{card.get('runs_task_definition_unknown', 0)}",
             f"- pairs found: {card['pairs_found']}; failures left unfixed: {card['unfixed_failures']}",
             f"- dropped: {words(card['dropped'])}",
             f"- failed candidates by error class: {words(card['failed_candidates_by_error'])}",
             f"- options: {words(card['options'])}",
             f"- format: {card['format']}", ""]
    for key, title in (("by_task", "By task"), ("by_error", "By error class fixed (an example under each it fixes)"),
                       ("by_source", "By source"),
                       ("by_turn", "By failed turn"), ("by_arch", "By arch"), ("by_model", "By model"),
                       ("by_explanation_source", "By explanation source")):
        lines += table(title, card[key])
    return "\n".join(lines)
