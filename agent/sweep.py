"""Sweeps: a grid of independent agent runs (models x tasks x arches x context modes x
search strategies x profile feedback x history policies x require settings x replicas), each with a deterministic
run id, run concurrently and resumably.

    load_sweep_config(path) -> SweepConfig        TOML or YAML
    expand(config) -> list[SweepRun]              the grid, in a fixed order
    run_sweep(config, executor) -> SweepResult    runs every cell not yet finished

Run ids are <sweep>/<model>/<task>/<arch>/<context>/r<k>, with a segment before r<k> for
settings other than the plain loop's (`evolve`, `profile-on`, `latest`, `require-off`, `evolve+profile-on`; see
`variant`), so a second `agent sweep` on the same config finds what the first one did: runs with a finished summary.json are skipped,
runs with a config.json but no finished summary are resumed through agent.run's resume,
the rest start fresh; --retry-failed also resumes runs a ptxbench error or the model's provider
(model_error) stopped. A run recorded under an id with another model or setting (language, budget,
seed, parameters ...) is refused, never taken for this config's, and so are unfinished runs whose
prompt templates or docs changed since they started (agent.run.resume would refuse each). Each run lives in a thread of the driver (its LLM calls are I/O);
evaluations go through the executor's shared evaluator, which queues GPU work per GPU
(agent/executors.py). Replica k runs with seed + k, so the same sweep gives the same runs.
"""
from __future__ import annotations

import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agent.trajectory import (EXECUTED_CHECK_DEFAULT, PROFILE_FEEDBACK_DEFAULT, Budget, ContextMode, History,
                              Language, Require, RunFolderError, RunSummary, Strategy, read_summary)

DONE_STATUSES = ("finished", "failed")


# ---------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------
class ModelEntry(BaseModel):
    """A model of the grid: a get_model spec, where to reach it, and the name used in run ids."""

    model_config = ConfigDict(extra="forbid")

    spec: str
    api_base: str | None = None
    name: str = ""  # slug in run ids and reports; derived from spec when empty
    options: dict = Field(default_factory=dict)  # get_model options: max_retries, retry_base_s, timeout_s
    # model parameters, sent to the provider as given (reasoning_effort, thinking, max_tokens, ...;
    # context_window and prompt_cache configure ptxbench's side): `agent solve --model-param`
    params: dict[str, Any] = Field(default_factory=dict)
    # Only these of the sweep's tasks (names or aliases); None: all of them. For models bound
    # to one task, e.g. scripted or replayed replies written for that task.
    tasks: list[str] | None = None

    @model_validator(mode="after")
    def _slug(self):
        self.name = slugify(self.name or default_model_name(self.spec))
        return self


# Stated limits on a sweep's size (docs/SWEEPS.md): a grid is a list in memory and a folder per
# run, so a typo such as `replicas = 1e8` must fail when the file is read, not exhaust the machine.
MAX_SWEEP_RUNS = 10_000
MAX_CONCURRENCY = 256  # runs in flight at once (each holds an LLM call and a kernel's evaluation)


class SweepConfig(BaseModel):
    """A sweep file, checked when it is loaded: a misspelt key (`replicaz`), an arch, budget
    or option a run would refuse is an error here, once, not a failure of every run."""

    model_config = ConfigDict(extra="forbid")

    name: str
    models: list[ModelEntry] = Field(min_length=1)
    tasks: list[str] = Field(min_length=1)  # names, aliases or groups such as gemm:* (resolved by expand)
    arches: list[str] = Field(default_factory=lambda: ["sm_90a"])
    contexts: list[ContextMode] = Field(default_factory=lambda: ["none", "docs"])
    # search strategies; None: the one `samples` implies (best-of-n for several, else linear).
    # linear runs draft one candidate a turn; best-of-n and evolve draft `samples`.
    strategies: list[Strategy] | None = None
    population: int = Field(default=4, ge=1)  # evolve: the best candidates parents are drawn from
    # the --profile-feedback ablation: "on", "off" or both
    profile_feedback: list[Literal["on", "off"]] = Field(
        default_factory=lambda: ["on" if PROFILE_FEEDBACK_DEFAULT else "off"])
    # what each call sends: the whole chat, or system + task + the last reply and its feedback
    histories: list[History] = Field(default_factory=lambda: ["full"])
    # the --require axis: "on" (ask for the instructions, state the credit rules), "off" (never name them)
    requires: list[Require] = Field(default_factory=lambda: ["on"])
    # the --hint axis: each entry a list of pattern-doc names (agent knowledge hints) added whole on
    # top of the arm; [] is no hint. The seed artifact varies one at a time: [[], ["warp_specialization"]]
    hints: list[list[str]] = Field(default_factory=lambda: [[]])
    context_turn_tokens: int = Field(default=2000, ge=0)  # docs added on turns 2+ at most, per turn
    memcheck: bool = True  # compute-sanitizer memcheck after a visible crash, hang or out-of-bounds write
    replicas: int = Field(default=1, ge=1, le=MAX_SWEEP_RUNS)
    lang: Language = "cuda"
    samples: int = Field(default=1, ge=1)
    budget: Budget = Field(default_factory=Budget)
    turn_limits: list[int] = Field(default_factory=lambda: [1, 4, 8])  # for `agent report`
    concurrency: int = Field(default=4, ge=1, le=MAX_CONCURRENCY)  # runs (and so LLM calls) in flight at once
    executor: Literal["local", "ray"] = "local"
    ray_address: str | None = None  # an existing cluster ("ray://host:10001", "auto"); None = start one
    runs_dir: str = "runs"
    executed_check: bool = EXECUTED_CHECK_DEFAULT
    check_models: bool = True  # before any run: each model is built and sent one tiny request
    context_tokens: int = 6000
    temperature: float | None = None
    seed: int = 0  # replica k runs with seed + k

    @field_validator("models", mode="before")
    @classmethod
    def _models(cls, v: Any) -> Any:  # a bare string is a spec
        return [{"spec": m} if isinstance(m, str) else m for m in (v or [])]

    @field_validator("turn_limits")
    @classmethod
    def _turn_limits(cls, v: list[int]) -> list[int]:  # the report reads each as "the first N turns"
        if not v or any(n < 1 for n in v):
            raise ValueError(f"must be whole numbers of turns, at least 1 each, not {v}")
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if slugify(v) != v:
            raise ValueError(f"sweep name {v!r} must be a slug: letters, digits, '-', '_', '.'")
        return v

    @field_validator("budget", mode="before")
    @classmethod
    def _budget_keys(cls, v: Any) -> Any:  # Budget itself tolerates extra keys (old run configs)
        unknown = sorted(set(v) - set(Budget.model_fields)) if isinstance(v, dict) else []
        if unknown:
            raise ValueError(f"unknown budget key {unknown[0]!r}; known: {', '.join(Budget.model_fields)}")
        return v

    @model_validator(mode="after")
    def _unique_models(self):
        names = [m.name for m in self.models]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"two models share the name {dupes[0]!r}: give them distinct `name`s")
        return self

    @model_validator(mode="after")
    def _runs_would_start(self):
        """The same checks `agent solve` makes, for every arch, context and model of the grid."""
        from agent.run import settings_problem

        if not self.arches or not self.contexts or not self.profile_feedback or self.strategies == [] \
                or not self.histories or not self.requires or not self.hints:
            raise ValueError("arches, contexts, strategies, profile_feedback, histories, requires and hints need at "
                             "least one entry each")
        from knowledge.retriever import hint_problem

        for arch in self.arches:
            for names in self.hints:
                if problem := hint_problem(names, arch):
                    raise ValueError(f"hints: {problem}")
        for arch in self.arches:
            for context in self.contexts:
                for strategy in self.strategy_list:
                    for m in self.models:
                        problem = settings_problem(arch=arch, lang=self.lang, context=context,
                                                   samples=self.samples_for(strategy), budget=self.budget,
                                                   context_tokens=self.context_tokens, temperature=self.temperature,
                                                   model_options=m.options, strategy=strategy,
                                                   population=self.population, model_params=m.params,
                                                   context_turn_tokens=self.context_turn_tokens,
                                                   profile_feedback="on" in self.profile_feedback,
                                                   executed_check=self.executed_check)
                        if problem:
                            raise ValueError(problem)
        return self

    @property
    def strategy_list(self) -> list[str]:
        from agent.run import implied_strategy

        return list(self.strategies) if self.strategies is not None else [implied_strategy(self.samples)]

    def samples_for(self, strategy: str) -> int:
        return 1 if strategy == "linear" else self.samples


def slugify(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.") or "model"


def default_model_name(spec: str) -> str:
    """openai/gpt-4o -> openai-gpt-4o; scripted:/x/good.json -> scripted-good."""
    for prefix in ("scripted:", "replay:"):
        if spec.startswith(prefix):
            return prefix[:-1] + "-" + Path(spec.removeprefix(prefix)).stem
    return spec


def load_sweep_config(path: str | Path, **overrides: Any) -> SweepConfig:
    """A TOML or YAML file; relative `scripted:`/`replay:` paths are relative to the file."""
    path = Path(path)
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:  # the parser's own words are kept for the place only
            mark = getattr(exc, "problem_mark", None)
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
            raise ValueError(f"not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
    else:
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            import tomli as tomllib
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"not valid TOML (a sweep config is TOML, or YAML named .yaml): "
                             f"{str(exc)[:1].lower()}{str(exc)[1:]}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a table/mapping at the top")
    data.setdefault("name", slugify(path.stem))
    data["models"] = [_anchor_model(m, path.parent) for m in data.get("models") or []]
    data.update({k: v for k, v in overrides.items() if v is not None})
    return SweepConfig.model_validate(data)


def _anchor_model(m: Any, base: Path) -> Any:
    from agent.run import anchor_spec

    spec = m if isinstance(m, str) else (m or {}).get("spec", "")
    if not isinstance(spec, str) or anchor_spec(spec, base) == spec:
        return m
    return anchor_spec(spec, base) if isinstance(m, str) else {**m, "spec": anchor_spec(spec, base)}


# ---------------------------------------------------------------------------------------
# The grid
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SweepRun:
    run_id: str
    model: ModelEntry
    task: str  # canonical name
    task_requested: str
    arch: str
    context: str
    replica: int
    strategy: str = "linear"
    profile_feedback: bool = PROFILE_FEEDBACK_DEFAULT
    history: str = "full"
    require: str = "on"
    hints: tuple[str, ...] = ()

    def request(self, sweep: SweepConfig, runs_dir: Path):
        """The agent.run.SolveRequest of this cell; replica k gets seed sweep.seed + k."""
        from agent.run import SolveRequest

        return SolveRequest(
            task=self.task, model=self.model.spec, arch=self.arch, lang=sweep.lang, context=self.context,
            context_tokens=sweep.context_tokens, budget=sweep.budget, samples=sweep.samples_for(self.strategy),
            strategy=self.strategy, population=sweep.population, profile_feedback=self.profile_feedback,
            api_base=self.model.api_base, model_options=dict(self.model.options), runs_dir=runs_dir,
            run_id=self.run_id, seed=sweep.seed + self.replica, temperature=sweep.temperature,
            executed_check=sweep.executed_check,
            command=["agent", "sweep", sweep.name, self.run_id], history=self.history, require=self.require,
            hints=list(self.hints), model_params=dict(self.model.params), context_turn_tokens=sweep.context_turn_tokens,
            memcheck=sweep.memcheck, model_name=self.model.name)


def variant(strategy: str, samples: int, profile_feedback: bool, history: str = "full", require: str = "on",
            hints: list[str] | tuple[str, ...] = ()) -> str:
    """The run-id segment for settings other than the plain loop's ("" for none): the strategy
    unless the sweep's `samples` implies it, the profile feedback unless it is the default, the
    history policy unless it is full, and `require-off` for runs not asked for the instructions.
    Runs of sweeps made before these settings existed keep their ids."""
    from agent.run import implied_strategy

    parts = [strategy] if strategy != implied_strategy(samples) else []
    if profile_feedback != PROFILE_FEEDBACK_DEFAULT:
        parts.append("profile-on" if profile_feedback else "profile-off")
    if history != "full":
        parts.append(history)
    if require != "on":
        parts.append(f"require-{require}")
    parts.extend(f"hint-{h}" for h in hints)
    return "+".join(parts)


def expand(config: SweepConfig) -> list[SweepRun]:
    """Every cell x replica, in a fixed order (model, task, arch, context, strategy, profile
    feedback, history, require, replica)."""
    from tasks import select_tasks

    # names, aliases or groups (gemm:*, attention:causal, ...); raises UnknownTask with close names
    resolved = [(t, name) for t in config.tasks for name in select_tasks(t)]
    # counted before the list is built: an absurd grid fails here without allocating it
    size = (len(config.models) * len(resolved) * len(config.arches) * len(config.contexts)
            * len(config.strategy_list) * len(config.profile_feedback) * len(config.histories) * config.replicas)
    if size > MAX_SWEEP_RUNS:
        raise ValueError(f"the grid has {size:,} runs; a sweep may have at most {MAX_SWEEP_RUNS:,} "
                         f"(split it into several sweeps, or fewer replicas)")
    runs = []
    for m in config.models:
        only = None if m.tasks is None else {name for t in m.tasks for name in select_tasks(t)}
        if only is not None and not only <= {task for _, task in resolved}:
            raise ValueError(f"model {m.name!r} lists tasks the sweep does not run: "
                             f"{sorted(only - {task for _, task in resolved})}")
        for requested, task in resolved:
            if only is not None and task not in only:
                continue
            for arch in config.arches:
                for context in config.contexts:
                    for strategy in config.strategy_list:
                        for profile in config.profile_feedback:
                            for history in config.histories:
                                for require in config.requires:
                                    for hints in config.hints:
                                        cell = variant(strategy, config.samples, profile == "on", history, require,
                                                       hints)
                                        for k in range(config.replicas):
                                            run_id = f"{config.name}/{m.name}/{task}/{arch}/{context}/" + \
                                                (f"{cell}/" if cell else "") + f"r{k}"
                                            runs.append(SweepRun(run_id, m, task, requested, arch, context, k,
                                                                 strategy, profile == "on", history, require,
                                                                 tuple(hints)))
    ids = [r.run_id for r in runs]
    if len(set(ids)) != len(ids):
        raise ValueError("the grid names one run twice (a task listed twice, or two aliases of one task?)")
    return runs


RunState = Literal["done", "partial", "new"]


def retryable(summary: RunSummary) -> bool:
    """Ended without a result of the model's own that --retry-failed redoes: a ptxbench error
    (failed), or the model's provider failing for good (model_error: an outage, exhausted retries,
    a bad key), whose turn agent.run.resume asks again."""
    return summary.status == "failed" or summary.stop_reason == "model_error"


def run_state(run_dir: Path) -> RunState:
    """done: ended for good; partial: to be resumed (interrupted, killed, or stopped by an
    infrastructure fault, which is no result of the run's); new: never started."""
    summary = _readable_summary(run_dir)
    if summary is not None and summary.status in DONE_STATUSES and summary.stop_reason != "infra_error":
        return "done"
    return "partial" if (run_dir / "config.json").exists() else "new"


def _readable_summary(run_dir: Path) -> RunSummary | None:
    """The run's summary, None when it has none or one that cannot be read (a truncated copy, a disk
    fault): no record that it ended, so it is resumed (agent.run.resume rebuilds it from the
    checkpoint, or says why not) and one bad file is that run's failure, never the sweep's."""
    try:
        return read_summary(run_dir)
    except RunFolderError:
        return None


# ---------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------
class RunOutcome(BaseModel):
    run_id: str
    state_before: RunState
    status: Literal["skipped", "finished", "failed", "interrupted", "running", "error"]
    stop_reason: str | None = None
    stop_detail: str | None = None
    evaluation: str | None = None  # "ok" or "skipped: <why>" (no GPU: compile + inspect only)
    best_outcome: str | None = None
    turns: int = 0
    verdicts: list[dict] = Field(default_factory=list)  # per candidate, in turn order (for comparisons)
    error: str | None = None  # a crash in ptxbench itself, one line
    seconds: float = 0.0
    # what its summary.json records (a skipped run: how it ended before this sweep); None: no summary
    recorded_status: str | None = None
    # ended on its own terms (budget, replay end) with the model answering: the run measured something
    succeeded: bool = False


class SweepResult(BaseModel):
    sweep: str
    runs_dir: str
    executor: str  # "local: 1 GPU" / "ray: 2 CPU actors (no GPU)" ...
    total: int
    ran: int  # started fresh or resumed now
    skipped: int  # finished before this invocation
    resumed: int
    failed: int  # runs (now or before) that ended with an error
    succeeded: int = 0  # runs (now or before) that finished with the model answering
    seconds: float
    outcomes: list[RunOutcome]
    warnings: list[str] = Field(default_factory=list)  # e.g. a model's test request was rate limited
    # Ctrl-C: runs in flight ended as interrupted at their next step, runs not started were left
    # (both resumed by the next `agent sweep`); outcomes then lists only the runs accounted for
    interrupted: bool = False
    infra_errors: int = 0  # runs stopped by a toolchain / GPU / profiler fault (resumed next time)
    # what the sweep's evaluations cost on the GPU, every recorded one of its runs (agent/cost.py)
    cost: Any = None


def verdict_sequence(summary: RunSummary) -> list[dict]:
    """What a run decided, candidate by candidate: equal sequences mean equal runs."""
    return [{"turn": t.turn, "sample": c.sample, "outcome": c.outcome,
             **c.verdicts.model_dump(include={"compiled", "arch_sass", "correct", "correct_with_arch"})}
            for t in summary.per_turn for c in t.candidates]


def outcome_from(run_id: str, before: RunState, summary: RunSummary | None, seconds: float, *,
                 skipped: bool = False, error: str | None = None) -> RunOutcome:
    if summary is None:
        return RunOutcome(run_id=run_id, state_before=before, status="error", error=error or "no summary written",
                          seconds=seconds)
    # A crash or refusal raised out of the run (`error`): this sweep's error, whatever summary.json held before
    # (an earlier stop's, or another process's that drives the run now), whose verdicts are kept below.
    status = "skipped" if skipped else "error" if error is not None else summary.status
    if error is None and summary.status == "failed":  # the run recorded its own crash
        error = summary.stop_detail
    return RunOutcome(run_id=run_id, state_before=before, status=status,
                      stop_reason=summary.stop_reason, stop_detail=summary.stop_detail, evaluation=summary.evaluation,
                      best_outcome=summary.best.outcome if summary.best else None, turns=summary.turns,
                      verdicts=verdict_sequence(summary), error=error, seconds=seconds,
                      succeeded=status != "error" and summary.status == "finished"
                      and summary.stop_reason != "model_error",
                      recorded_status=summary.status)


ProgressFn = Callable[[RunOutcome, int, int], None]  # (outcome, runs accounted for, total)


def run_sweep(config: SweepConfig, executor=None, *, progress: ProgressFn | None = None,
              retry_failed: bool = False, models_checked: list[str] | None = None,
              on_interrupt: Callable[[int], None] | None = None) -> SweepResult:
    """Run every cell that is not finished yet; `executor` defaults to the config's (and is closed after).
    `models_checked`: the warnings of a check_models the caller already made (else it is made here).
    `on_interrupt(runs in flight)`: told on Ctrl-C, before the wait for those runs to stop."""
    from agent.executors import make_executor

    from agent.trajectory import folder_problem

    if (problem := folder_problem(config.runs_dir, "runs_dir")):  # before any run starts
        raise SweepError(problem)
    runs = expand(config)
    refuse_mismatched_replays(config, runs)
    refuse_empty_arms(config, runs)
    refuse_changed_models(config, runs)
    runs_dir = Path(config.runs_dir)
    done: list[tuple[SweepRun, RunState, RunSummary]] = []
    todo: list[tuple[SweepRun, RunState]] = []
    for r in runs:
        state = run_state(runs_dir / r.run_id)
        summary = read_summary(runs_dir / r.run_id) if state == "done" else None
        if summary is not None and not (retry_failed and retryable(summary)):
            done.append((r, state, summary))
        else:
            todo.append((r, "partial" if state == "done" else state))
    refuse_changed_inputs(config, [r for r, state in todo if state == "partial"])
    # Before anything is written: a model no run could use stops the sweep here, once.
    if models_checked is not None:
        warnings = models_checked
    else:
        warnings = check_models(config, {r.model.name for r, _ in todo}) if todo else []
    copies = [m.name for m in config.models if deterministic(m.spec)] if config.replicas > 1 else []
    if copies:
        warnings = [*warnings, f"{', '.join(copies)} send{'s' if len(copies) == 1 else ''} the same replies in every "
                               f"replica: `agent report` counts {'its' if len(copies) == 1 else 'their'} "
                               f"{config.replicas} replicas of a cell as one sample"]
    sweep_dir = runs_dir / config.name
    sweep_dir.mkdir(parents=True, exist_ok=True)
    (sweep_dir / "sweep.json").write_text(json.dumps(
        {"config": config.model_dump(mode="json"), "runs": [r.run_id for r in runs]}, indent=2) + "\n")
    start = time.monotonic()
    outcomes: dict[str, RunOutcome] = {}
    lock = threading.Lock()

    def record(o: RunOutcome) -> None:
        with lock:
            outcomes[o.run_id] = o
            if progress:
                progress(o, len(outcomes), len(runs))

    for r, state, summary in done:
        record(outcome_from(r.run_id, state, summary, 0.0, skipped=True))
    own_executor = executor is None
    if todo and executor is None:
        executor = make_executor(config)
    interrupted = False
    try:
        if todo:
            evaluator = executor.evaluator()  # one for all runs: GPU work queues per GPU
            stop = threading.Event()
            pool = ThreadPoolExecutor(max_workers=config.concurrency, thread_name_prefix="sweep-run")
            futures = [pool.submit(_run_one, config, r, state, runs_dir, evaluator, stop) for r, state in todo]
            try:
                for f in as_completed(futures):
                    record(f.result())
            except KeyboardInterrupt:
                # Ctrl-C: runs not started stay unstarted; runs in flight stop at their next step and
                # record themselves interrupted (never a verdict they did not reach). The evaluator
                # stays open until they have: closing it under them is what made fake compile errors.
                # A second Ctrl-C here quits at once (the caller's business); those runs stay resumable.
                interrupted = True
                stop.set()
                pool.shutdown(wait=False, cancel_futures=True)
                if on_interrupt:
                    on_interrupt(sum(1 for f in futures if f.running()))
                for f in futures:
                    if not f.cancelled():
                        record(f.result())
            pool.shutdown()
    finally:
        if own_executor and executor is not None:
            executor.close()
    ordered = [outcomes[r.run_id] for r in runs if r.run_id in outcomes]
    # after a Ctrl-C, runs never started have no outcome: they are neither run now nor skipped
    started = [(r, s) for r, s in todo if r.run_id in outcomes]
    return SweepResult(
        sweep=config.name, runs_dir=str(runs_dir), executor=executor.describe() if executor else "none (all done)",
        total=len(runs), ran=len(started), skipped=len(done),
        resumed=sum(1 for _, s in started if s == "partial"),
        # now or before, as `succeeded` counts: a run that failed in an earlier invocation still failed
        failed=sum(1 for o in ordered if o.status in ("failed", "error") or o.recorded_status == "failed"),
        succeeded=sum(1 for o in ordered if o.succeeded), seconds=time.monotonic() - start,
        outcomes=ordered, warnings=warnings, interrupted=interrupted,
        # runs this sweep drove that an infrastructure fault stopped (an error outcome's summary is an older one)
        infra_errors=sum(1 for o in ordered if o.stop_reason == "infra_error" and o.status == "failed"),
        cost=_cost(runs_dir, [o.run_id for o in ordered]))


def _cost(runs_dir: Path, run_ids: list[str]):
    from agent.cost import sweep_cost

    return sweep_cost(runs_dir, run_ids).model_dump()


def estimate_cost(config: SweepConfig, grid: "GridSummary"):
    """GPU time of the runs the grid has not finished, each using its whole turn budget
    (agent.cost.estimate, from agent/cost_table.json)."""
    from agent.cost import estimate, load_table

    todo = [r for r in grid.runs if grid.states[r.run_id] != "done"]
    return estimate(todo, load_table(), evals_of=lambda r: config.budget.max_turns * config.samples_for(r.strategy))


class SweepError(ValueError):
    """The sweep cannot start (a model is unusable); one line, nothing was run."""


def check_models(config: SweepConfig, names: set[str]) -> list[str]:
    """Each model that has runs to do, checked once before fanning out (agent.run.check_model):
    a missing key or a closed port is one error, not the same failure in every run."""
    from agent.run import SolveError, check_model

    warnings = []
    for m in config.models:
        if m.name not in names:
            continue
        try:
            # the probe sends what replica 0's first call sends; replicas differ only in the seed
            warning = check_model(m.spec, m.api_base, m.options, probe=config.check_models, params=m.params,
                                  temperature=config.temperature, seed=config.seed)
            if config.budget.max_cost is not None:
                _check_priced(m)
        except SolveError as exc:
            raise SweepError(str(exc)) from None
        if warning:
            warnings.append(warning)
    return warnings


def _check_priced(m: ModelEntry) -> None:
    """A cost cap on a model without a price would hold in name only (every call counted as $0):
    refused for the whole sweep here, as `agent solve` refuses it for one run."""
    from agent.models import cost_cap_problem, get_model
    from agent.run import SolveError

    problem = cost_cap_problem(get_model(m.spec, api_base=m.api_base, params=m.params))
    if problem:
        raise SolveError(f"model {m.name!r}: {problem}")


def refuse_mismatched_replays(config: SweepConfig, runs: list[SweepRun]) -> None:
    """A replay:<run> model answers what its run was asked. On another task (or arch, or
    language) its replies would be reported as that model's results on a problem it never saw:
    refused before anything runs. Bind such a model to its task with `tasks = [...]`."""
    from agent.run import SolveError, replay_mismatch

    for r in runs:
        if not r.model.spec.startswith("replay:"):
            continue
        try:
            problem = replay_mismatch(r.request(config, Path(config.runs_dir)))
        except SolveError as exc:  # the recording's config.json cannot be read
            raise SweepError(f"model {r.model.name!r}: {exc}") from None
        if problem:
            raise SweepError(f"model {r.model.name!r}: {problem}; bind it to its task with `tasks = [...]` "
                             f"(another arch or language: a sweep of its own), or drop it")


def refuse_empty_arms(config: SweepConfig, runs: list[SweepRun]) -> None:
    """A docs arm that retrieves no section for a cell's task (context_tokens too small for any):
    each of its runs would be refused as it starts (agent.nodes.empty_arm), so the sweep refuses
    before any run, once, naming the first such cell. Retrieval is checked once per task, arch, arm
    and tokenizer (the model's: the budget is in its tokens)."""
    from agent.nodes import empty_arm
    from agent.run import request_config
    from knowledge.retriever import tokenizer_for
    from tasks import get_task

    seen: set[tuple] = set()
    for r in runs:
        if (cell := (r.task, r.arch, r.context, r.hints, tokenizer_for(r.model.spec))) in seen:
            continue
        seen.add(cell)
        task = get_task(r.task)
        if (problem := empty_arm(task, request_config(r.request(config, Path(config.runs_dir)), task))) is not None:
            raise SweepError(f"{r.run_id}: {problem}")


def _run_one(config: SweepConfig, r: SweepRun, state: RunState, runs_dir: Path, evaluator,
             stop: threading.Event | None = None) -> RunOutcome:
    """One run, start to end, in a worker thread. A crash is recorded, never raised: the sweep goes on."""
    from agent import run as agent_run

    start = time.monotonic()
    run_dir = runs_dir / r.run_id
    try:
        if state == "partial":
            _reopen(run_dir)
            summary = agent_run.resume(str(run_dir), runs_dir, progress=False, evaluator=evaluator, stop=stop)
        else:
            summary = agent_run.solve(r.request(config, runs_dir), progress=False, evaluator=evaluator, stop=stop)
        return outcome_from(r.run_id, state, summary, time.monotonic() - start)
    except Exception as exc:  # a bug or bad input in one run must not cost the others
        message = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        try:
            summary = read_summary(run_dir)
        except RunFolderError as unreadable:  # raised here, it would stop the whole sweep
            summary, message = None, f"{message}; {unreadable}"
        return outcome_from(r.run_id, state, summary, time.monotonic() - start, error=message)


def _reopen(run_dir: Path) -> None:
    """A run --retry-failed resumes has not ended until it ends again: its summary of the earlier end
    (failed, or the provider's model_error) says interrupted from now on. Left as it was, a driver killed
    mid-resume would leave that old end as the run's, so the next sweep skipped the run and `agent report`
    measured it at its old turns, though its checkpoint went on. (The turns it records stay.)"""
    from agent.run import run_folder_lock
    from agent.trajectory import write_text_atomic

    with run_folder_lock(run_dir):  # not under another process that drives it now
        summary = _readable_summary(run_dir)
        if summary is None or summary.status not in DONE_STATUSES or summary.stop_reason == "infra_error":
            return  # no end recorded (an infrastructure fault's is none either: run_state resumes it anyway)
        was = summary.stop_reason or summary.status
        write_text_atomic(run_dir / "summary.json", summary.model_copy(update={
            "status": "interrupted", "stop_reason": "interrupted",
            "stop_detail": f"being resumed after it ended with {was} (agent sweep --retry-failed); "
                           f"if no sweep drives it now, its driver was stopped: run the sweep again"}
        ).model_dump_json(indent=2) + "\n")


@dataclass
class GridSummary:
    """What `agent sweep --dry-run` prints: the grid and what state each run is in."""

    runs: list[SweepRun]
    states: dict[str, RunState] = field(default_factory=dict)
    runs_dir: Path = Path("runs")


def plan(config: SweepConfig) -> GridSummary:
    runs = expand(config)
    refuse_mismatched_replays(config, runs)
    refuse_empty_arms(config, runs)
    refuse_changed_models(config, runs)
    states = {r.run_id: run_state(Path(config.runs_dir) / r.run_id) for r in runs}
    refuse_changed_inputs(config, [r for r in runs if states[r.run_id] == "partial"])
    return GridSummary(runs, states, Path(config.runs_dir))


def model_identity(spec: str) -> str:
    """What names a model, for the sweep (a run recorded with another model is refused) and the
    report (runs of two models are never pooled): the spec, but for a recorded or scripted model its
    file's name, not its folder (a sweep moved with its files is the same sweep), and for a recording
    the run id its config.json holds where it can be read (sweep runs' folders are all r0, r1 ..., so
    two models' recordings of one cell share a folder name)."""
    recording = _recording_id(spec)
    return _file_identity(spec) if recording is None else f"{_file_identity(spec)} (run {recording})"


def deterministic(spec: str) -> bool:
    """A model that sends the same replies whatever the seed (scripted replies, a replayed recording):
    its replicas are copies of one draw, and `agent report` counts them as one sample."""
    return spec.startswith(("scripted:", "replay:"))


def _file_identity(spec: str) -> str:
    for prefix in ("scripted:", "replay:"):
        if spec.startswith(prefix):
            return prefix + Path(spec.removeprefix(prefix)).name
    return spec


def _recording_id(spec: str) -> str | None:
    """The run id a replay:<run> model's config.json records, None when there is none to read."""
    from agent.trajectory import read_config

    if not spec.startswith("replay:"):
        return None
    source = Path(spec.removeprefix("replay:"))
    try:
        return read_config(source if source.is_dir() else source.parent).run_id
    except (RunFolderError, OSError):
        return None


def same_model(recorded: str, now: str) -> bool:
    """Two specs name the same model (model_identity). A recording that can no longer be read (moved
    or deleted since its runs were recorded) is compared by its file name alone."""
    if model_identity(recorded) == model_identity(now):
        return True
    ids = _recording_id(recorded), _recording_id(now)
    return None in ids and _file_identity(recorded) == _file_identity(now)


def _recorded_settings(run: SweepRun, config: SweepConfig, runs_dir: Path) -> dict[str, Any]:
    """What a run of this cell records in its config.json for the settings that make it this
    experiment (not operational ones such as concurrency or retries)."""
    req = run.request(config, runs_dir)
    settings = {"lang": req.lang, "context": req.context, "context_tokens": req.context_tokens,
                "budget": req.budget.model_dump(), "samples": req.samples, "strategy": req.strategy,
                "profile_feedback": req.profile_feedback, "seed": req.seed, "temperature": req.temperature,
                "executed_check": req.executed_check, "history": req.history, "require": req.require,
                "hints": list(req.hints), "model_params": req.model_params,
                "context_turn_tokens": req.context_turn_tokens, "memcheck": req.memcheck}
    if req.strategy == "evolve":
        settings["population"] = req.population
    return settings


def refuse_changed_models(config: SweepConfig, runs: list[SweepRun]) -> None:
    """A run id names the model by its `name`, and leaves out most settings (language, budget,
    samples, seed, model parameters ...); a run recorded under that id with another spec, endpoint
    or setting would be reused or resumed as if it were this config's. Refuse, naming both, before
    anything runs. Settings a run recorded before they existed are not compared."""
    from agent.trajectory import Budget, RunFolderError, read_config

    for r in runs:
        run_dir = Path(config.runs_dir) / r.run_id
        if not (run_dir / "config.json").exists():
            continue
        try:
            recorded = read_config(run_dir)
            raw = json.loads((run_dir / "config.json").read_text())
        except (RunFolderError, OSError, ValueError):
            continue  # resuming it says what is wrong with it
        then = (recorded.model, recorded.api_base)
        if not same_model(recorded.model, r.model.spec) or recorded.api_base != r.model.api_base:
            what = "spec" if recorded.model != r.model.spec else "api_base"
            raise SweepError(
                f"model {r.model.name!r}: its runs were recorded with {what} "
                f"{then[0] if what == 'spec' else then[1]!r} and the config now says "
                f"{r.model.spec if what == 'spec' else r.model.api_base!r} (e.g. {run_dir}); give the new model "
                f"another `name`, or move its old runs away, so old results are not taken for the new model's")
        for key, now in _recorded_settings(r, config, Path(config.runs_dir)).items():
            if key not in raw:
                continue
            was = getattr(recorded, key)
            if key == "budget":
                was, now = was.model_dump(), Budget(**now).model_dump()
            if was != now:
                raise SweepError(
                    f"{run_dir} was recorded with {key} = {json.dumps(was)} and the config now says "
                    f"{json.dumps(now)}; its run id does not name {key}, so it would be reused or resumed as this "
                    f"config's: give the sweep another `name`, or move its old runs away")


def refuse_changed_inputs(config: SweepConfig, to_resume: list[SweepRun]) -> None:
    """Runs to be resumed whose prompt templates or docs differ from this checkout's: agent.run.resume
    refuses each (its later turns would be another experiment under the same run), so the sweep refuses
    them all before any run starts, naming each run and what changed, rather than running the others
    and leaving that refusal as one error line among many."""
    from agent.run import inputs_change
    from agent.trajectory import read_config

    changed = []
    for r in to_resume:
        try:
            recorded = read_config(Path(config.runs_dir) / r.run_id)
        except RunFolderError:
            continue  # resuming it says what is wrong with it
        if (problem := inputs_change(recorded, Path(config.runs_dir) / r.run_id)) is not None:
            # resume's own words, without its advice for one run (a sweep has its own below)
            changed.append(f"{r.run_id}: {problem.split('; start a new run')[0]}")
    if changed:
        raise SweepError(
            f"{len(changed)} unfinished run{'s' if len(changed) > 1 else ''} would go on with other prompts or docs "
            f"than {'they' if len(changed) > 1 else 'it'} started with: " + "; ".join(changed)
            + ". Run the sweep from a checkout with the files those runs started with, or give the sweep another "
            "`name` (or move those runs away) to start them afresh")


def models_to_run(grid: GridSummary, retry_failed: bool = False) -> set[str]:
    """Names of the models with runs left to do; with retry_failed, also those with a run it redoes (retryable).
    A model whose runs all ended for good is not checked: it may be gone (an endpoint shut down) and nothing
    of the sweep needs it."""
    def todo(r: SweepRun) -> bool:
        if grid.states[r.run_id] != "done":
            return True
        if not retry_failed:
            return False
        summary = _readable_summary(grid.runs_dir / r.run_id)
        return summary is None or retryable(summary)

    return {r.model.name for r in grid.runs if todo(r)}
