"""Trajectories: what one agent run leaves on disk, and the types other tools read back.

    runs/<run id>/
      config.json          RunConfig: everything needed to repeat or resume the run
      events.jsonl         append-only, one JSON object per line, fsync'd per event
      checkpoint.sqlite    LangGraph checkpoint (resume)
      candidates/<turn>-<sample>/
          reply.md         the model's reply, verbatim
          kernel.cu|kernel.ptx, launch.json   the extracted solution (absent if none)
          eval.json        EvalResult (compile, inspect, run) of this candidate
      summary.json         RunSummary: status, stop reason, per-turn verdicts, best candidate

RunConfig and RunSummary are the contract with sweeps, reports and fixit: add fields
with defaults, never rename. Event types are listed in EVENT_TYPES; every event carries
`seq`, `time` (UTC ISO) and `type`.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import secrets
from pathlib import Path
from typing import Any, Iterator, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, model_validator

SCHEMA_VERSION = 1

Language = Literal["cuda", "ptx"]
ContextMode = Literal["none", "docs", "docs+headers", "full", "docs+example"]  # knowledge.retriever.MODES
# How a run searches (agent/nodes.py): linear continues one chat, one candidate a turn;
# best-of-n drafts `samples` a turn and continues from the best; evolve keeps the best
# `population` candidates and asks each turn for an improvement of a parent drawn from them.
Strategy = Literal["linear", "best-of-n", "evolve"]
STRATEGIES = ("linear", "best-of-n", "evolve")
# What of the chat each call sends (agent/nodes.py): full sends it all; latest sends the system
# prompt, the task, the last reply and its feedback (PTXBench's latest pair), so prompts stay flat.
History = Literal["full", "latest"]
HISTORIES = ("full", "latest")
# Whether the prompts ask for the architecture's instructions and state the credit rules (on), or
# never name them (off: measured unasked); judged the same either way (agent.prompts.REQUIRES).
Require = Literal["on", "off"]

# What each event type records (payload fields besides seq/time/type).
EVENT_TYPES = {
    "run_start": "resumed, retried_turn (a turn redone after the model failed), task, arch, model, budget, gpu, gpu_from_turn",
    "node": "node, phase (start|end), turn, inputs | outputs (a short description), seconds",
    "retrieval": "turn, mode, sections [{id, doc, heading, tokens, why}] as retrieved, new_sections (the ids put "
                 "into this turn's prompt), tokens, prompt_tokens, tokenizer (litellm:<model> or the chars/4 "
                 "fallback), truncated, focus (the feedback's error class: compile_error, serialization, "
                 "carried_work, other, none; turns 2+ add only sections whose why names it), example "
                 "(docs+example, turn 1: the example served or why none)",
    "llm_request": "turn, sample, model, messages (the chat sent, after the history policy), history, "
                   "context {prompt_tokens, window, reserve, source}",
    "llm_response": "turn, sample, model, text, usage {prompt_tokens, completion_tokens, cost_usd, cached_tokens, "
                    "cache_write_tokens, estimated}, latency_s, attempts, finish_reason",
    "context_exceeded": "turn, prompt_tokens, window, reserve, source, detail: the next prompt does not fit the "
                        "model's context window; the run ends (stop_reason context_exceeded), nothing is sent",
    "memcheck": "turn, sample, trigger (the visible workload's failure), status, reason, errors: compute-sanitizer "
                "memcheck on a candidate that crashed, hung or wrote out of bounds",
    "llm_response_reused": "turn, sample, seq_of_response: recorded before a crash, used again on resume (no call)",
    "fault": "turn, sample, kind, status, message, attempt, wait_s, retryable (one per failed request)",
    "llm_error": "turn, sample, kind, message, retryable: the call failed for good",
    "format_error": "turn, sample, message, finish_reason: no solution could be extracted from the reply",
    "extraction": "turn, sample, language, note: the reply held several source or JSON blocks; which were used",
    "compile": "turn, sample, result: CompileResult (without the PTX, which is in eval.json)",
    "inspect": "turn, sample, result: InspectResult",
    "run": "turn, sample, run_status, run_reason, gpu, workloads (visible ones), held_out {total, passed, failed}, "
           "speedup, executed, verdicts",
    "eval_reused": "turn, sample: eval.json written before a crash, used again on resume",
    "infra_error": "turn, sample, detail: the toolchain, GPU worker or profiler failed on this candidate (no "
                   "verdict, no eval.json; the run stops and resume evaluates it again)",
    "candidate": "turn, sample, path, outcome, verdicts, verified, error, parent",
    "decision": "turn, action (repair|optimise|stop), outcome and chosen sample of the turn, reason, "
                "best, best_speedup, best_verified, parent (whose feedback the next turn answers), "
                "population (evolve: the candidates it was drawn from, best first)",
    "feedback": "turn, kind (repair|optimise), outcome, text (the next user message, before any new docs)",
    "budget": "turn, spent {turns, llm_calls, prompt_tokens, completion_tokens, cost_usd, wall_s}, limits",
    "run_end": "status, stop_reason, stop_detail, turns, best, traceback (when ptxbench itself failed)",
}


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def new_run_id(task: str, model: str) -> str:
    """Sortable, readable and unique: 20261129-160102-mha_bwd_d128-gpt-4o-3fa2."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    short_model = "".join(c if c.isalnum() or c in "-_." else "-" for c in model.split("/")[-1].split(":")[0])[:24]
    return f"{stamp}-{task}-{short_model}-{secrets.token_hex(2)}"


# ---------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------
# Count executed instructions with the hardware counters, in the GPU worker (CUPTI; Nsight
# Compute where CUPTI cannot run; on a machine without either the check is skipped and says so). One default for `solve`, `eval`, `bench` and
# sweeps: without the check a correct kernel is not called correct-with-arch (it stays
# "unverified"), so leaving it off by default would make every run look unverified.
EXECUTED_CHECK_DEFAULT = True
# Show the model the Nsight Compute profile of its kernel (tools/profile.py) in the feedback:
# the --profile-feedback ablation. Off by default: the loop as it was, the profile opt-in until
# sweeps say it helps. One default for `solve` and sweeps.
PROFILE_FEEDBACK_DEFAULT = False


class Budget(BaseModel):
    """Whichever limit is reached first ends the run cleanly with the best result so far."""

    max_turns: int = 8
    max_tokens: int | None = None  # prompt + completion tokens over all calls
    max_cost: float | None = None  # USD, as litellm prices it
    # wall seconds the run was active (resumes add up), less its waits for a GPU another run held (Clock)
    max_time_s: float | None = None


class RunConfig(BaseModel):
    schema_version: int = SCHEMA_VERSION
    run_id: str
    task: str  # canonical task name (aliases resolved)
    task_requested: str = ""  # what the user typed, e.g. "attn_bwd"
    arch: str = "sm_90a"
    model: str  # model spec as given to agent.models.get_model
    model_name: str | None = None  # the sweep config's `name` for it (reports show it); None: outside a sweep
    api_base: str | None = None
    model_options: dict[str, float | int] = Field(default_factory=dict)  # max_retries, retry_base_s, timeout_s
    lang: Language = "cuda"
    context: ContextMode = "docs"
    context_tokens: int = 6000  # retrieval token budget
    budget: Budget = Field(default_factory=Budget)
    samples: int = 1  # candidates drafted per turn (best-of-N)
    strategy: Strategy = "linear"  # runs recorded before strategies: best-of-n when samples > 1 (below)
    population: int = 4  # evolve: how many of the best candidates parents are drawn from
    profile_feedback: bool = False  # runs recorded before the flag had no profile block
    requested_features: list[str] = Field(default_factory=list)
    prompt_version: str = "v1"
    # agent.feedback_catalogue.asked_hash: prompt_version's templates, the credit rules, the feedback's wording
    template_hash: str = ""
    # knowledge.retriever.knowledge_version(): sha256 over the docs, examples and helper headers an
    # arm can send. None: recorded before configs held it (reports count those as "unknown")
    knowledge_version: str | None = None
    # agent.run.task_hash: sha256 over the task's definition (workloads, tolerance, reference, requested
    # features ...). None: recorded before configs held it (reports count those as "unknown")
    task_hash: str | None = None
    # started by agent.run.repair from a given kernel and its feedback (Fixit's teacher): no benchmark
    # run (reports and Fixit builds leave it out)
    repair_run: bool = False
    tool_versions: dict[str, str] = Field(default_factory=dict)  # ptxas, nvrtc, cuobjdump, ptxbench, litellm, ...
    gpu: str | None = None  # what the evaluator found; None = no GPU (evaluation skipped)
    # A run started without a GPU and resumed on one (agent.run.resume): `gpu` is that GPU and this the
    # first turn judged on it; its earlier turns are unverified. None: judged on `gpu` from its start.
    gpu_from_turn: int | None = None
    executed_check: bool = False  # count executed instructions with the hardware counters (GPU only)
    seed: int | None = 0  # base seed sent to the model (varied per turn and sample); None: none sent
    temperature: float | None = None
    # passed to the provider as given (reasoning_effort, thinking, max_tokens, ...), except
    # agent.models.LOCAL_PARAMS (context_window, prompt_cache); runs recorded before had none
    model_params: dict[str, Any] = Field(default_factory=dict)
    history: History = "full"  # runs recorded before the policy sent the full chat
    # --require: on asks for the requested instructions (every run recorded before the axis did)
    require: Require = "on"
    # --hint NAME (knowledge/hints): pattern docs added whole on top of the arm; runs recorded before had none
    hints: list[str] = Field(default_factory=list)
    context_turn_tokens: int = 2000  # docs added on turns 2+ at most (whole sections), per turn
    memcheck: bool = True  # compute-sanitizer memcheck on a visible crash, hang or out-of-bounds write (GPU)
    created: str = Field(default_factory=utc_now)
    command: list[str] = Field(default_factory=list)  # argv that started the run

    @model_validator(mode="before")
    @classmethod
    def _strategy_of_old_runs(cls, data):
        """Runs recorded before `strategy` existed: several samples a turn was best-of-n."""
        if isinstance(data, dict) and "strategy" not in data and int(data.get("samples") or 1) > 1:
            data = {**data, "strategy": "best-of-n"}
        return data


# ---------------------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------------------
Outcome = Literal[
    "model_error",  # the LLM call failed for good: no reply
    "format_error",  # reply without a usable kernel + manifest
    "compile_error",
    "run_failed",  # ran on the GPU and crashed, hung, wrote out of bounds, bad manifest ...
    "incorrect",  # ran, wrong numbers on a visible workload
    "arch_missing",  # correct (or not checked), but requested features absent / serialized / not executed
    "unverified",  # compiled with the requested features; correctness not checked (no GPU)
    "correct_with_arch",
]
# The first problem to fix wins: compile_error > run_failed > incorrect > arch_missing.

# The recorded, scripted or human replies ran out: the run ended where its replies did (agent/nodes.py).
OUT_OF_REPLIES = ("replay_end", "script_end", "human_end")

StopReason = Literal[
    "max_turns", "max_tokens", "max_cost", "max_time",
    "model_error",  # auth error, retries exhausted ... (stop_detail says which)
    "replay_end",  # a replay:<run> model has no recorded response left: the natural end of a replay
    "script_end",  # a scripted:<file> model has no reply left: the natural end, like a replay's
    "human_end",  # a --model human reply folder has no reply left: the natural end, like a replay's
    "interrupted",  # Ctrl-C or a kill; resumable
    "error",  # a bug in ptxbench itself (stop_detail has the exception)
    "infra_error",  # the toolchain, GPU worker or profiler failed (not the model's kernel); resumable
    "context_exceeded",  # the next prompt does not fit the model's context window (stop_detail: the sizes)
]


class Verdicts(BaseModel):
    """The benchmark's verdicts for one candidate (EvalResult.verdicts()), None = not checked."""

    model_config = ConfigDict(populate_by_name=True)

    compiled: bool = False
    # the static SASS verdict; runs recorded before 2026-11-30 call it "arch"
    arch_sass: bool = Field(default=False, validation_alias=AliasChoices("arch_sass", "arch"))
    arch_executed_any: bool | None = None  # every requested feature executed at least once
    arch_executed: bool | None = None  # ... and carried the task's work
    correct: bool | None = None
    correct_held_out: bool | None = None
    correct_with_arch: bool | None = None
    speedup: float | None = None
    speedup_ci: list[float] | None = None
    speedup_held_out: float | None = None
    sol_score: float | None = None  # SOL-ExecBench-style score vs the roofline (tools/roofline.py)


class CandidateRecord(BaseModel):
    turn: int
    sample: int
    path: str  # relative to the run dir: "candidates/3-0"
    outcome: Outcome
    verdicts: Verdicts = Field(default_factory=Verdicts)
    verified: bool = False  # correctness was checked on a GPU (False on CPU: "unverified")
    error: str | None = None  # one line: format error / model error / compile error summary
    note: str | None = None  # the reply held several candidates: which block was used, and why
    # the candidate whose feedback this one answered (its path); None in turn 1. A chain for
    # linear and best-of-n runs, a tree for evolve.
    parent: str | None = None


class TurnRecord(BaseModel):
    turn: int
    candidates: list[CandidateRecord] = Field(default_factory=list)
    chosen: int | None = None  # sample whose reply continues the conversation
    action: Literal["repair", "optimise", "stop"] | None = None
    best: CandidateRecord | None = None  # best candidate up to and including this turn


class Usage(BaseModel):
    llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = 0.0  # None: a call had no price (self-hosted model): unknown, never $0
    cached_tokens: int = 0  # of prompt_tokens, read from the provider's prompt cache

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class RunSummary(BaseModel):
    schema_version: int = SCHEMA_VERSION
    run_id: str
    task: str
    arch: str
    model: str
    lang: Language = "cuda"
    context: ContextMode = "docs"
    samples: int = 1
    strategy: Strategy = "linear"
    profile_feedback: bool = False
    history: History = "full"
    require: Require = "on"
    hints: list[str] = Field(default_factory=list)
    model_params: dict[str, Any] = Field(default_factory=dict)
    status: Literal["running", "finished", "interrupted", "failed"] = "running"
    stop_reason: StopReason | None = None
    stop_detail: str | None = None
    turns: int = 0  # turns completed (draft rounds that produced at least one reply)
    per_turn: list[TurnRecord] = Field(default_factory=list)
    # best by the run's goal (feedback.best_eligible): correct-with-arch (on CPU: compiled with the
    # features, unverified); under require off the model's own goal, correct (reports use every candidate)
    best: CandidateRecord | None = None
    best_path: str | None = None  # relative to the run dir
    best_speedup: float | None = None
    evaluation: str = "ok"  # "ok" or "skipped: <reason>" (e.g. no GPU)
    usage: Usage = Field(default_factory=Usage)
    faults: int = 0  # failed requests that were retried or ended the run
    wall_s: float = 0.0
    decisions: list[str] = Field(default_factory=list)  # action per turn, for replay comparison
    created: str = ""
    finished: str | None = None

    def best_at(self, turn_limit: int) -> CandidateRecord | None:
        """Best candidate within the first `turn_limit` turns (metrics at turn limits 1, 4, 8)."""
        rows = [t for t in self.per_turn if t.turn <= turn_limit and t.best is not None]
        return rows[-1].best if rows else None

    def verdicts_at(self, turn_limit: int) -> dict[str, bool]:
        """Did any candidate in the first `turn_limit` turns reach each verdict?"""
        cands = [c for t in self.per_turn if t.turn <= turn_limit for c in t.candidates]
        return {
            "compiled": any(c.verdicts.compiled for c in cands),
            "arch_sass": any(c.verdicts.arch_sass for c in cands),
            "correct": any(c.verdicts.correct is True for c in cands),
            "correct_with_arch": any(c.verdicts.correct_with_arch is True for c in cands),
        }


# ---------------------------------------------------------------------------------------
# Writer / reader
# ---------------------------------------------------------------------------------------
# Recorded runs shipped with the repository (tracked by git): inputs to read and replay,
# never folders to write into. New examples may still be recorded next to them.
SHIPPED_EXAMPLES = Path(__file__).resolve().parents[1] / "runs" / "examples"


def shipped_example(path: str | Path) -> Path | None:
    """The shipped example run that `path` is or lies inside, if any; the examples folder
    itself for any other path inside it (a new run there would land among the shipped ones)."""
    try:
        rel = Path(path).resolve().relative_to(SHIPPED_EXAMPLES)
    except ValueError:
        return None
    example = SHIPPED_EXAMPLES / rel.parts[0] if rel.parts else None
    return example if example is not None and (example / "config.json").exists() else SHIPPED_EXAMPLES


# What a run folder holds below its runs folder (a sweep's run id, candidates/<turn>-<sample>/
# eval.json ...): a runs folder whose own path leaves less than this is refused up front.
_ROOM_BELOW = 512
_SYSTEM_TREES = ("/proc", "/sys", "/dev")


def folder_problem(path: str | Path, flag: str, shown: str | Path | None = None) -> str | None:
    """Why `path` cannot be a folder this command writes into, as one line naming `flag`, or
    None. Checked before any work, so a bad output folder never costs an evaluation: a file
    (or a file above it), a system tree, a name or path too long, a folder that cannot be
    written (read-only, no permission), found by making and removing a folder in the nearest
    existing one, so every reason the system has is caught, not only the ones listed.
    `shown`: the name the user gave, when `path` is the folder of a file they named."""
    import tempfile

    path = Path(path)
    given = str(shown if shown is not None else path)
    said = f"{flag} {given if len(given) <= 80 else given[:60] + '...'}"
    where = Path(os.path.abspath(path))
    if any(where == Path(t) or Path(t) in where.parents for t in _SYSTEM_TREES):
        return f"{said}: under {where.parts[0]}{where.parts[1]}, a system folder; write somewhere else"
    def exists(p: Path) -> bool:  # a name too long raises, where a missing one is False
        try:
            return p.exists()
        except OSError:
            return False

    existing = where
    while not exists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{said}: {path if existing == where else existing} is a file, not a folder"
    try:
        name_max, path_max = os.pathconf(existing, "PC_NAME_MAX"), os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    if (long := next((part for part in where.parts if len(os.fsencode(part)) > name_max), None)):
        return f"{said}: the name {long[:40]}... is longer than this file system allows ({name_max} bytes)"
    if len(os.fsencode(str(where))) + _ROOM_BELOW > path_max:
        return (f"{said}: the path is too long; runs below it need {_ROOM_BELOW} more characters than the "
                f"{path_max} this system allows")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".ptxbench-probe-", dir=existing))
    except OSError as exc:
        return f"{said}: cannot be written ({(exc.strerror or 'permission denied').lower()} in {existing})"
    return None


class TrajectoryWriter:
    """Writes one run's folder. Events are appended and fsync'd one by one, so a kill
    loses at most the event being written (readers skip a torn last line)."""

    def __init__(self, run_dir: str | Path):
        if shipped_example(run_dir):
            raise RunFolderError(f"{run_dir} is a shipped example run: read-only, never written to")
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "candidates").mkdir(exist_ok=True)
        self.events_path = self.run_dir / "events.jsonl"
        self._seq = 0
        if self.events_path.exists() and self.events_path.stat().st_size:
            self._seq = max((e.get("seq", 0) for e in read_events(self.run_dir)), default=0)
            if not _ends_with_newline(self.events_path):  # torn line from a kill: keep it, start afresh
                with open(self.events_path, "a", encoding="utf-8") as f:
                    f.write("\n")
        self._listeners: list = []

    @property
    def checkpoint_path(self) -> Path:
        return self.run_dir / "checkpoint.sqlite"

    def write_config(self, config: RunConfig) -> None:
        write_text_atomic(self.run_dir / "config.json", config.model_dump_json(indent=2) + "\n")

    def write_summary(self, summary: RunSummary) -> None:
        write_text_atomic(self.run_dir / "summary.json", summary.model_dump_json(indent=2) + "\n")

    def subscribe(self, listener) -> None:
        """listener(event: dict) is called after each event is on disk (live progress)."""
        self._listeners.append(listener)

    def event(self, type: str, **payload: Any) -> dict:
        self._seq += 1
        record = {"seq": self._seq, "time": utc_now(), "type": type, **payload}
        line = json.dumps(record, default=_json_default, ensure_ascii=False)
        with open(self.events_path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
        for listener in self._listeners:
            listener(record)
        return record

    def candidate_dir(self, turn: int, sample: int) -> Path:
        return self.run_dir / "candidates" / f"{turn}-{sample}"


def candidate_relpath(turn: int, sample: int) -> str:
    return f"candidates/{turn}-{sample}"


class RunFolderError(ValueError):
    """A run folder that cannot be read as one (bad config.json, summary.json or events.jsonl),
    or that must not be written (a shipped example); the message is one line for a person."""


def read_config(run_dir: str | Path) -> RunConfig:
    return _read_model(Path(run_dir) / "config.json", RunConfig)


def is_teacher_run(run_dir: Path) -> bool:
    """A Fixit teacher's repair run of some data folder (DATA/teacher_runs/teacher/...): the teacher's
    mistakes, not a student's own, and read as a student's its failures would go to the teacher
    again, build after build; nor are they the teacher model's benchmark runs (each opens with a
    student's kernel). Its config says so (repair_run); ones recorded before that are known by
    their place and id."""
    config = read_config(run_dir)
    return config.repair_run or ("teacher_runs" in run_dir.parts and config.run_id.startswith("teacher/"))


def read_summary(run_dir: str | Path) -> RunSummary | None:
    p = Path(run_dir) / "summary.json"
    return _read_model(p, RunSummary) if p.exists() else None


def _read_model(path: Path, model: type[BaseModel]) -> Any:
    """A pydantic record from a JSON file, or RunFolderError naming the file and the first problem."""
    try:
        return model.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise RunFolderError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except ValidationError as exc:
        e = exc.errors()[0]
        where = ".".join(str(x) for x in e["loc"])
        where = f"{where}: " if where else ""
        raise RunFolderError(f"{path}: not a valid {model.__name__}: {where}{e['msg']}") from None


# A line the writer was killed in the middle of starts like every event it writes; after a
# resume such a line is followed by the resumed run's events.
_EVENT_PREFIX = '{"seq": '


def read_events(run_dir: str | Path, type: str | None = None) -> Iterator[dict]:
    """Events of a run folder in file order (none if it has no events.jsonl); see read_event_file."""
    path = Path(run_dir) / "events.jsonl"
    if path.exists():
        yield from read_event_file(path, type)


def read_event_file(path: str | Path, type: str | None = None) -> Iterator[dict]:
    """Events in file order. A line cut short by a kill is skipped: the last line if it
    starts as a JSON object does, or any line that starts as the writer's events do.
    Anything else that is not a JSON event raises RunFolderError: a damaged log must not
    read as a short one."""
    path = Path(path)
    torn: tuple[int, str] | None = None  # an unparsable line, judged once we know whether it is the last
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8").strip()
            except UnicodeDecodeError:
                raise RunFolderError(f"{path}:{n}: not UTF-8 text (not an events log)") from None
            if not line:
                continue
            if torn is not None and not torn[1].startswith(_EVENT_PREFIX):
                raise RunFolderError(f"{path}:{torn[0]}: not a JSON event")
            torn = None
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                torn = (n, line)
                continue
            if not isinstance(record, dict) or "type" not in record:
                raise RunFolderError(f"{path}:{n}: not an event (no \"type\")")
            if type is None or record.get("type") == type:
                yield record
    if torn is not None and not torn[1].startswith("{"):
        raise RunFolderError(f"{path}:{torn[0]}: not a JSON event")


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_eval_json(path: Path, result: BaseModel) -> None:
    """A candidate's eval.json (tools.results.EvalResult), written so that it reads back as it was:
    a wrong kernel's errors hold inf (every failing element NaN or infinite) and NaN (the value it
    wrote). pydantic writes those as null, which the required float fields then refuse, and the
    feedback, a resume, replay and Fixit all read this file; JSON's Infinity/NaN words (Python's
    json and pydantic read them) keep the numbers."""
    write_text_atomic(path, json.dumps(result.model_dump(mode="json"), indent=2, ensure_ascii=False) + "\n")


def _json_default(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if isinstance(obj, (bytes, bytearray)):
        return f"<{len(obj)} bytes>"
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)
