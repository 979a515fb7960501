"""Start or resume one agent run: the entry point of `agent solve` and of sweeps.

    summary = solve(SolveRequest(task="mha_bwd_d128", model="openai/gpt-4o"))
    summary = resume("20261129-160102-mha_bwd_d128-gpt-4o-3fa2")
    summary = repair(config, solution, feedback)   # start from a given kernel + feedback (fixit)

All three return the RunSummary also written to runs/<id>/summary.json. Bad input (unknown
task, bad model spec, unreachable endpoint, unknown run) raises SolveError with one line.
A run that ends for any reason (budget, model failure, Ctrl-C, a bug) still writes its
summary; Ctrl-C and kills are resumable from the SQLite checkpoint.
"""
from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import math
import os
import shlex
import signal
import socket
import sqlite3
import sys
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from agent import feedback_catalogue, prompts
from agent.budget import Clock, recursion_limit
from agent.graph import build_graph
from agent.nodes import Deps, InfraFault, Nodes, empty_arm, turn1_messages
from agent.state import initial_state, summary_from_state
from agent.trajectory import (EXECUTED_CHECK_DEFAULT, HISTORIES, PROFILE_FEEDBACK_DEFAULT, STRATEGIES, Budget, RunConfig,
                              RunFolderError, RunSummary, TrajectoryWriter, new_run_id, read_config, read_events,
                              folder_problem, read_summary, shipped_example, utc_now)
from tools.toolchain import ARCHES

DEFAULT_RUNS_DIR = "runs"
LANGS = ("cuda", "ptx")
CONTEXT_MODES = ("none", "docs", "docs+headers", "full", "docs+example")  # knowledge.retriever.MODES


class SolveError(ValueError):
    """Bad input to a run; the message is one line for a person."""


@dataclass
class SolveRequest:
    task: str
    model: str
    arch: str = "sm_90a"
    lang: str = "cuda"
    context: str = "docs"
    context_tokens: int = 6000
    budget: Budget = field(default_factory=Budget)
    samples: int = 1
    strategy: str | None = None  # linear | best-of-n | evolve; None: best-of-n when samples > 1, else linear
    population: int = 4  # evolve: the best candidates parents are drawn from
    profile_feedback: bool = PROFILE_FEEDBACK_DEFAULT
    api_base: str | None = None
    model_options: dict = field(default_factory=dict)  # max_retries, retry_base_s, timeout_s
    runs_dir: str | Path = DEFAULT_RUNS_DIR
    run_id: str | None = None
    seed: int | None = 0
    temperature: float | None = None
    executed_check: bool = EXECUTED_CHECK_DEFAULT
    human_reply_file: str | None = None
    command: list[str] = field(default_factory=list)
    history: str = "full"  # full | latest: what of the chat each call sends
    require: str = "on"  # on | off: ask for the requested instructions (and state the credit rules) or not
    hints: list[str] = field(default_factory=list)  # --hint NAME: pattern docs added whole on top of the arm
    model_params: dict = field(default_factory=dict)  # to the provider as given (agent.models.LOCAL_PARAMS aside)
    model_name: str | None = None  # a sweep's name for the model (reports show it)
    context_turn_tokens: int = 2000  # docs added on turns 2+ at most, per turn
    memcheck: bool = True  # compute-sanitizer memcheck after a visible crash, hang or out-of-bounds write


MODEL_OPTIONS = ("max_retries", "retry_base_s", "retry_max_s", "timeout_s")  # get_model's knobs


def implied_strategy(samples: int) -> str:
    """The strategy `--samples` alone means: best-of-n for several samples a turn, else linear."""
    return "best-of-n" if samples > 1 else "linear"


def settings_problem(*, arch: str = "sm_90a", lang: str = "cuda", context: str = "docs", samples: int = 1,
                     budget: Budget | None = None, context_tokens: int = 6000, temperature: float | None = None,
                     model_options: dict | None = None, strategy: str | None = None,
                     population: int = 4, history: str = "full", model_params: dict | None = None,
                     context_turn_tokens: int = 0, profile_feedback: bool = False,
                     executed_check: bool = True, require: str = "on", hints: list[str] | tuple[str, ...] = ()
                     ) -> str | None:
    """What is wrong with a run's settings, in one line naming the setting as a sweep config
    and `agent solve` spell it, or None. Shared by both, so they refuse the same things up
    front instead of failing once per run."""
    if arch not in ARCHES:
        return f"unknown arch {arch!r}; choose one of {', '.join(ARCHES)}"
    if lang not in LANGS:
        return f"unknown language {lang!r}; choose cuda or ptx"
    if context not in CONTEXT_MODES:
        return f"unknown context mode {context!r}; choose one of {', '.join(CONTEXT_MODES)}"
    if samples < 1:
        return f"samples (--samples) must be at least 1, not {samples}"
    if strategy is not None and strategy not in STRATEGIES:
        return f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}"
    if strategy == "best-of-n" and samples < 2:
        return f"strategy best-of-n needs samples (--samples) of at least 2, not {samples}"
    if strategy == "linear" and samples > 1:
        return f"strategy linear drafts one candidate a turn; samples {samples} is best-of-n (--strategy best-of-n)"
    if population < 1:
        return f"population (--population) must be at least 1, not {population}"
    if profile_feedback and not executed_check:
        # the profile is collected by the executed check's Nsight Compute pass: without it the run
        # would be recorded (and reported) as the profile arm while the model never saw one
        return ("profile feedback (--profile-feedback on) needs the executed check, which collects the profile; "
                "drop --no-executed (executed_check = false in a sweep) or turn profile feedback off")
    if context_tokens < 0:
        return f"context_tokens (--context-tokens) must be >= 0, not {context_tokens}"
    if context_tokens == 0 and context != "none":
        # the retriever returns nothing then: the run would be the none arm recorded under another name
        return f"context {context!r} with context_tokens (--context-tokens) 0 gives no docs at all; use context none"
    if lang == "ptx" and context in ("docs+headers", "full"):
        # the header API documents C++ helpers (#include <ptxbench/...>), which ptxas cannot include:
        # for a PTX run that arm is the docs arm plus text it cannot use
        return (f"context {context!r} adds the C++ helper-header API, which a --lang ptx solution cannot "
                "include; use context docs (or docs+example) for PTX")
    if history not in HISTORIES:
        return f"unknown history policy {history!r} (--history); choose one of {', '.join(HISTORIES)}"
    if require not in prompts.REQUIRES:
        return f"unknown require setting {require!r} (--require); choose one of {', '.join(prompts.REQUIRES)}"
    if hints:
        from knowledge.retriever import hint_problem

        if problem := hint_problem(list(hints), arch):
            return problem
    if context_turn_tokens < 0:
        return f"context_turn_tokens (--context-turn-tokens) must be >= 0, not {context_turn_tokens}"
    from agent.models import model_params_problem

    if (problem := model_params_problem(model_params or {}, temperature)) is not None:
        return problem
    if temperature is not None and not (math.isfinite(temperature) and temperature >= 0):
        return f"temperature (--temperature) must be >= 0, not {temperature}"
    b = budget or Budget()
    if b.max_turns < 1:
        return f"max_turns (--max-turns) must be at least 1, not {b.max_turns}"
    for key, flag, value in (("max_tokens", "--max-tokens", b.max_tokens), ("max_cost", "--max-cost", b.max_cost),
                             ("max_time_s", "--max-time", b.max_time_s)):
        if value is not None and not (math.isfinite(value) and value > 0):
            return f"{key} ({flag}) must be positive, not {value}"
    opts = model_options or {}
    unknown = sorted(set(opts) - set(MODEL_OPTIONS))
    if unknown:
        return f"unknown model option {unknown[0]!r}; known: {', '.join(MODEL_OPTIONS)}"
    for key, flag in (("max_retries", "--max-retries"), ("retry_base_s", "--retry-wait"), ("retry_max_s", None),
                      ("timeout_s", "--request-timeout")):
        value = opts.get(key)
        positive = key == "timeout_s"
        if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value)
                                      and (value > 0 if positive else value >= 0)):
            return f"{key}{f' ({flag})' if flag else ''} must be {'positive' if positive else '>= 0'}, not {value}"
    return None


MAX_RUN_ID_PART = 200  # bytes per folder name of a run id; file systems allow 255 (room for "<id>.lock" ...)


def run_id_problem(run_id: str) -> str | None:
    """A run id names a folder under --runs-dir (a sweep's has '/' between its parts): nothing
    that climbs out of it or starts at the root."""
    parts = run_id.split("/")
    if not run_id or run_id.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\\" in run_id:
        return (f"--run-id {run_id!r} must name a folder under --runs-dir: no leading '/', no '.' or '..' parts, "
                f"no empty parts")
    if any(ord(c) < 32 or ord(c) == 127 for c in run_id):  # a newline or escape in a folder name breaks every listing
        return f"--run-id {run_id!r} holds a control character (a newline, tab or escape); use printable characters"
    if any(len(p.encode()) > MAX_RUN_ID_PART for p in parts):
        return f"--run-id is too long: at most {MAX_RUN_ID_PART} bytes between slashes (file systems allow 255)"
    return None


def anchor_spec(spec: str, base: str | Path) -> str:
    """A replay:/scripted: model spec with a relative path made absolute against `base` (the
    folder it was typed in, or a sweep config's folder), so the run's config.json resumes
    from any folder. Other specs are returned as they are."""
    for prefix in ("replay:", "scripted:"):
        if spec.startswith(prefix) and not Path(spec.removeprefix(prefix)).is_absolute():
            return prefix + str((Path(base) / spec.removeprefix(prefix)).resolve())
    return spec


def solve(req: SolveRequest, *, progress: bool = True, evaluator=None,
          stop: threading.Event | None = None) -> RunSummary:
    """Start a new run and drive it to its end. `evaluator`: a shared Evaluator (sweeps); the
    run closes only one it made itself. `stop`: set by a sweep on Ctrl-C; the run ends as
    interrupted at its next step (resumable), never with a verdict it did not reach."""
    task = _get_task(req.task)
    if req.run_id is not None and (problem := run_id_problem(req.run_id)):
        raise SolveError(problem)
    if (problem := folder_problem(req.runs_dir, "--runs-dir")):  # before the model is asked or a kernel judged
        raise SolveError(problem)
    problem = settings_problem(arch=req.arch, lang=req.lang, context=req.context, samples=req.samples,
                               budget=req.budget, context_tokens=req.context_tokens, temperature=req.temperature,
                               model_options=req.model_options, strategy=req.strategy, population=req.population,
                               history=req.history, model_params=req.model_params,
                               context_turn_tokens=req.context_turn_tokens, profile_feedback=req.profile_feedback,
                               executed_check=req.executed_check, require=req.require, hints=req.hints)
    if problem:
        raise SolveError(problem)
    if req.api_base:
        _check_reachable(req.api_base)
    model = _get_model(req.model, req.api_base, req.model_options, req.human_reply_file, req.model_params)
    from agent.models import cost_cap_problem

    if req.budget.max_cost is not None and (problem := cost_cap_problem(model)):
        raise SolveError(problem)  # each call would count as $0: the cap would be there in name only
    config = request_config(req, task)
    return _start(config, task, model, initial_state(), req.runs_dir, progress, evaluator, stop=stop)


def request_config(req: SolveRequest, task) -> RunConfig:
    """The config a run of `req` records before it starts (the versions it runs with are added by
    _start). Reports build the same for a run its sweep planned that never started, so such a run
    falls in the cell its run would have."""
    return RunConfig(
        run_id=req.run_id or new_run_id(task.name, req.model), task=task.name, task_requested=req.task,
        arch=req.arch, model=anchor_spec(req.model, Path.cwd()), api_base=req.api_base,
        model_options=req.model_options, lang=req.lang, context=req.context, context_tokens=req.context_tokens,
        budget=req.budget, samples=req.samples, strategy=req.strategy or implied_strategy(req.samples),
        population=req.population, profile_feedback=req.profile_feedback,
        requested_features=task.features_for(req.arch), seed=req.seed, temperature=req.temperature,
        executed_check=req.executed_check, command=req.command or list(sys.argv), history=req.history,
        require=req.require, hints=list(req.hints), model_params=dict(req.model_params),
        context_turn_tokens=req.context_turn_tokens, memcheck=req.memcheck, model_name=req.model_name)


def replay_mismatch(req: SolveRequest) -> str | None:
    """A replay:<run> model answers what its run was asked; say so when this run asks
    something else (another task, arch or language), where the replies are likely wrong.
    SolveError when the recording's config.json is there but cannot be read."""
    if not req.model.startswith("replay:"):
        return None
    source = Path(req.model.removeprefix("replay:"))
    source = source if source.is_dir() else source.parent
    if not (source / "config.json").exists():  # a bare events.jsonl: nothing to compare with
        return None
    try:
        recorded = read_config(source)
    except RunFolderError as exc:  # there but unreadable: its replies may answer any task; not run blind
        raise SolveError(f"{req.model}: the recording's {exc}; without it the task it answered is unknown") from None
    asked = {"task": _get_task(req.task).name, "arch": req.arch, "lang": req.lang}
    differ = [k for k, v in asked.items() if getattr(recorded, k) != v]
    if not differ:
        return None
    then = ", ".join(f"{k} {getattr(recorded, k)}" for k in differ)
    now = ", ".join(f"{k} {asked[k]}" for k in differ)
    return f"{req.model} was recorded on {then}; this run is {now}: its replies answer the other problem"


def repair(config: RunConfig, solution, feedback: str, *, runs_dir: str | Path = DEFAULT_RUNS_DIR,
           quiet: bool = False, evaluator=None) -> RunSummary:
    """A run that starts from a given kernel and the feedback on it (fixit's teacher repairs):
    the chat opens with the task, the kernel as the model's reply, then the feedback."""
    task = _get_task(config.task)
    if config.api_base:
        _check_reachable(config.api_base)
    model = _get_model(config.model, config.api_base, config.model_options, None, config.model_params)
    config = config.model_copy(update={"created": utc_now(), "command": list(sys.argv), "repair_run": True,
                                       "requested_features": task.features_for(config.arch)})
    state = initial_state()
    task_text = render_statement(task, config)
    fence = "ptx" if solution.language == "ptx" else "cuda"
    reply = (f"```{fence}\n{solution.source.rstrip()}\n```\n\n```json\n"
             f"{solution.manifest.model_dump_json(indent=2, exclude_defaults=True)}\n```\n")
    state["messages"] = [*turn1_messages(config, task_text), {"role": "assistant", "content": reply}]
    state["feedback"] = feedback
    return _start(config, task, model, state, runs_dir, not quiet, evaluator, task_text=task_text)


def find_run_dir(run: str | Path, runs_dir: str | Path = DEFAULT_RUNS_DIR) -> Path:
    """A run given as its folder or as its id under `runs_dir`; SolveError if neither holds one."""
    for candidate in (Path(run), Path(runs_dir) / run):
        if (candidate / "config.json").exists():
            return candidate
    raise SolveError(f"no run {str(run)!r} in {runs_dir} (no config.json)")


def resume_command(run_dir: str | Path) -> str:
    """The command that continues this run, runnable as printed from the current folder."""
    return f"agent solve --resume {shlex.quote(str(run_dir))}"


def load_resumable(run: str | Path, runs_dir: str | Path = DEFAULT_RUNS_DIR) -> tuple[Path, RunConfig]:
    """The run's folder and config, refusing what must not be continued in place."""
    run_dir = find_run_dir(run, runs_dir)
    try:
        config = read_config(run_dir)
    except RunFolderError as exc:
        raise SolveError(str(exc)) from None
    if shipped_example(run_dir):
        # Resuming writes into the folder (events, summary, checkpoint); a shipped example
        # is tracked by git and stays as shipped. Its replies can be driven through the loop.
        raise SolveError(f"{run_dir} is a shipped example (read-only); to run the loop on its replies: "
                         f"agent solve --task {config.task_requested or config.task} --model replay:{run_dir}")
    return run_dir, config


def finished_summary(run_dir: Path) -> RunSummary | None:
    """The run's summary when it ended for good: finished, and not by a model failure (a
    resume retries that turn). None when there is something left to resume."""
    try:
        summary = read_summary(run_dir) if (run_dir / "summary.json").exists() else None
    except RunFolderError:
        return None
    if summary is None or summary.status != "finished" or summary.stop_reason == "model_error":
        return None
    return summary


def resume(run: str | Path, runs_dir: str | Path = DEFAULT_RUNS_DIR, *, progress: bool = True,
           human_reply_file: str | None = None, evaluator=None, stop: threading.Event | None = None) -> RunSummary:
    """Continue a run (its folder, or its id under `runs_dir`) from its last checkpoint:
    finished LLM calls and evaluations are not repeated. A run that already ended for good is
    returned as recorded (its summary untouched, no model built: a human run asks nobody)."""
    run_dir, config = load_resumable(run, runs_dir)
    if (ended := finished_summary(run_dir)) is not None:
        return ended
    if (problem := inputs_change(config, run_dir)) is not None:
        raise SolveError(problem)
    with run_folder_lock(run_dir):
        task = _get_task(config.task)
        model = _get_model(config.model, config.api_base, config.model_options, human_reply_file,
                           config.model_params)
        try:
            _continue_script(model, run_dir)
            writer = TrajectoryWriter(run_dir)
        except RunFolderError as exc:
            raise SolveError(str(exc)) from None
        retrieve = _get_retriever(config.context, config.hints)
        owned = evaluator is None
        evaluator = evaluator or _get_evaluator()
        gpu_now = _gpu_name(evaluator)
        if (problem := gpu_change(config, gpu_now)) is not None:
            if owned:
                evaluator.close()
            raise SolveError(problem)
        # A run that had no GPU (or whose worker could not start) goes on on this one: its config says
        # so once the graph shows which turns were judged before (_drive), never a CPU run after it.
        found_gpu = gpu_now if gpu_now is not None and not gpu_now.startswith("unavailable") \
            and gpu_now != config.gpu else None
        if (toolchain := recorded_toolchain(config, run_dir)) != config.tool_versions:
            config = config.model_copy(update={"tool_versions": toolchain})
            writer.write_config(config)
        deps = Deps(config=config, task=task, task_text=render_statement(task, config), model=model,
                    evaluator=evaluator, writer=writer, clock=Clock(), retrieve=retrieve)
        return _drive(deps, None, resumed=True, progress=progress, close_evaluator=owned, stop=stop,
                      found_gpu=found_gpu)


def inputs_change(config: RunConfig, run_dir: Path) -> str | None:
    """Why the run must not go on with this checkout's prompts, docs or toolchain (toolchain_change),
    or None. Its turns so far were asked with the prompt templates and docs recorded in its config; later
    turns asked with others would be another experiment counted under the same run (and pooled with it
    by reports). A config without a template hash (every run `agent solve` started has one) cannot show
    its prompts: refused too. One recorded before configs held the docs version goes on: it stays
    "unknown" in reports."""
    afresh = (f"start a new run (agent solve --task {config.task_requested or config.task} ...), or resume it "
              f"from a checkout with the files it ran with")
    now_prompts = (prompts.PROMPT_VERSION, feedback_catalogue.asked_hash())
    if not config.template_hash:
        return (f"run {run_dir} records no prompt template hash, so which prompts its turns were asked with "
                f"cannot be checked against this checkout's ({now_prompts[0]} {now_prompts[1][:12]}); {afresh}")
    if (config.prompt_version, config.template_hash) != now_prompts:
        return (f"run {run_dir} was asked with prompt templates {config.prompt_version} "
                f"{config.template_hash[:12]}; this checkout's are {now_prompts[0]} {now_prompts[1][:12]} "
                f"(agent/prompts/, the credit rules, the feedback's wording in agent/feedback.py): its next turns "
                f"would be asked with other prompts; {afresh}")
    try:
        now_task = task_hash(_get_task(config.task)) if config.task_hash is not None else None
    except SolveError as exc:  # the task is gone from this checkout
        return f"run {run_dir}: {exc}; {afresh}"
    if now_task != config.task_hash:
        return (f"run {run_dir} was judged on task {config.task} as defined then ({config.task_hash[:12]}); this "
                f"checkout defines it otherwise ({now_task[:12]}: workloads, tolerance, reference or requested "
                f"instructions, tasks/): its next turns would be judged on another task; {afresh}")
    if config.context != "none" and config.knowledge_version is not None:
        now_docs = _knowledge_version()
        if now_docs != config.knowledge_version:
            return (f"run {run_dir} retrieved from docs version {config.knowledge_version[:12]}; this checkout's "
                    f"docs (knowledge/docs, examples, include) are {(now_docs or 'unavailable')[:12]}: its next "
                    f"turns would read other docs under the same context arm; {afresh}")
    return toolchain_change(config, run_dir)


# The tools whose versions draw a run's verdicts: the compilers write the machine code that is judged
# (compile errors, registers, spills, the instructions themselves), so any other version is another
# toolchain. For a run judged on a GPU torch counts too: its cuBLAS and cuDNN are the library every
# speedup is measured against. The disassemblers only print that code: another release reads the same
# cubin the same way (this project's CPU machines carry 13.2 wheels, its GPU machine 13.0). A tool
# missing on either side judges nothing: without it a candidate stops the run with infra_error, no
# verdict drawn ("fix it, then resume"). (litellm, langgraph judge nothing.)
COMPILERS = ("nvrtc", "ptxas")
RULES = "rules"  # tool_versions' key for the judge's own rules (tools.results.RULES_VERSION)


def _judged_on_gpu(config: RunConfig) -> bool:
    return config.gpu is not None and not config.gpu.startswith("unavailable")


def judged_by(config: RunConfig) -> dict[str, str]:
    """What drew a run's verdicts, as its config records it: the compilers, the judge's rules
    ("unversioned" for a run recorded before rules were), and for a run judged on a GPU torch
    (its cuBLAS and cuDNN are the library). A compiler the config does not record is left out."""
    then = config.tool_versions
    names = [*COMPILERS, *(("torch",) if _judged_on_gpu(config) else ())]
    return {**{n: then[n] for n in names if n in then}, RULES: then.get(RULES, "unversioned")}


def toolchain_change(config: RunConfig, run_dir: Path) -> str | None:
    """Why the run must not go on with this machine's toolchain, or None: its verdicts so far were
    drawn by the tools recorded in its config, and its later ones would be another toolchain's,
    pooled in one run. A run that drew no verdict yet, or whose config records no tool versions, has
    nothing to compare: it goes on (recorded_toolchain)."""
    if not config.tool_versions or not _judged(run_dir):
        return None
    then, now = judged_by(config), tool_versions()
    differ = [n for n in then if n in now and then[n] != now[n]]
    if not differ:
        return None
    was = ", ".join(f"{n} {then[n]}" for n in differ)
    is_ = ", ".join(f"{n} {now[n]}" for n in differ)
    return (f"run {run_dir} was judged with {was}; this machine has {is_}: its next candidates would be judged "
            f"by another toolchain or rules; start a new run (agent solve --task {config.task_requested or config.task} "
            f"...), or resume it where those tools are (agent doctor lists them)")


def _judged(run_dir: Path) -> bool:
    """Whether the run drew a verdict: a candidate's eval.json is written only then (an infrastructure
    fault writes none, agent.nodes)."""
    return any((run_dir / "candidates").glob("*/eval.json"))


def recorded_toolchain(config: RunConfig, run_dir: Path) -> dict[str, str]:
    """The tool versions a resumed run records: before its first verdict this machine's (they will draw
    it); after, the recorded ones (toolchain_change let no other compiler through) and any tool it
    lacked then, which judges its candidates from now on. (A config recorded before configs held tool
    versions keeps none: which tools judged its first turns is unknown, not today's.)"""
    if not _judged(run_dir):
        return tool_versions()
    if not config.tool_versions:
        return {}
    now = tool_versions()
    merged = {**now, **config.tool_versions}
    if "toolchain" not in now:  # "unavailable: ..." then, found now
        merged.pop("toolchain", None)
    return merged


def task_hash(task) -> str:
    """sha256 over a task's whole definition: what its runs are judged against (workloads, held-out
    sizes, tolerance, reference, requested instructions). Another definition under the same name is
    another task: reports never pool their runs, a resume under it is refused."""
    import hashlib

    return hashlib.sha256(task.model_dump_json().encode()).hexdigest()


def _knowledge_version() -> str | None:
    """knowledge.retriever.knowledge_version(), None where the knowledge package cannot be imported."""
    try:
        from knowledge.retriever import knowledge_version
    except ImportError:
        return None
    return knowledge_version()


def gpu_change(config: RunConfig, gpu_now: str | None) -> str | None:
    """Why the run must not go on with this evaluator's GPU, or None. A run's verdicts and
    speedups were taken on the GPU recorded in its config: its later candidates judged on another
    GPU, or left unjudged without one, would stand beside them under that GPU's name. A run whose
    worker could not start ("unavailable: ...") or that never had a GPU goes on anywhere."""
    then = config.gpu
    if then is None or then.startswith("unavailable") or gpu_now == then:
        return None
    if gpu_now is not None and gpu_now.startswith("unavailable"):  # a worker fault: infra_error, as before
        return None
    now = (f"this machine's GPU is {gpu_now}" if gpu_now
           else "this machine has no GPU (its candidates would go unjudged)")
    return f"run {config.run_id} was judged on {then}; {now}: resume it where it ran, or start a new run here"


@contextlib.contextmanager
def run_folder_lock(run_dir: Path):
    """Only one process drives a run folder at a time. A second `agent solve --resume` (or a
    start under the same --run-id) while the run is still going would drive the same checkpoint
    and events log again: the turn's LLM call made twice and counted twice, events interleaved,
    a summary written under the live run. An advisory lock on the events log (no extra file in
    the folder) says so up front; the kernel drops it when its process ends, however it ends, so
    a killed run resumes as before. (The GPU worker and the compile sandbox are started with
    subprocess, which closes inherited descriptors: they never hold it.)"""
    run_dir.mkdir(parents=True, exist_ok=True)
    f = open(run_dir / "events.jsonl", "a", encoding="utf-8")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise SolveError(f"run {run_dir} is in use by another process (still running, or being resumed); "
                         f"let it end or stop it, then: {resume_command(run_dir)}") from None
    except OSError:  # a filesystem without locks (some network mounts): go on unguarded, as before
        pass
    try:
        yield
    finally:
        f.close()


def _start(config: RunConfig, task, model, state: dict, runs_dir, progress: bool, evaluator,
           task_text: str | None = None, stop: threading.Event | None = None) -> RunSummary:
    run_dir = Path(runs_dir) / config.run_id
    if shipped_example(run_dir):
        raise SolveError(f"{run_dir} is inside a shipped example (read-only): choose another --runs-dir")
    retrieve = _get_retriever(config.context, config.hints)  # a refusal here leaves no folder behind
    if (problem := empty_arm(task, config)) is not None:
        raise SolveError(problem)
    with run_folder_lock(run_dir):
        # under the lock: two starts of one id at once must not both find the folder free
        if (run_dir / "config.json").exists():
            raise SolveError(f"run {config.run_id} already exists in {runs_dir}; resume it with: "
                             f"{resume_command(run_dir)}")
        return _start_locked(config, task, model, state, run_dir, retrieve, progress, evaluator, task_text,
                             stop)


def _start_locked(config: RunConfig, task, model, state: dict, run_dir: Path, retrieve, progress: bool, evaluator,
                  task_text: str | None, stop: threading.Event | None) -> RunSummary:
    owned = evaluator is None
    evaluator = evaluator or _get_evaluator()
    config = config.model_copy(update={"prompt_version": prompts.PROMPT_VERSION,
                                       "template_hash": feedback_catalogue.asked_hash(),
                                       "knowledge_version": _knowledge_version(), "task_hash": task_hash(task),
                                       "tool_versions": tool_versions(), "gpu": _gpu_name(evaluator),
                                       "gpu_from_turn": None})  # a repair's config is its student's
    writer = TrajectoryWriter(run_dir)
    writer.write_config(config)
    deps = Deps(config=config, task=task, task_text=task_text or render_statement(task, config), model=model,
                evaluator=evaluator, writer=writer, clock=Clock(), retrieve=retrieve)
    return _drive(deps, state, resumed=False, progress=progress, close_evaluator=owned, stop=stop)


# ---------------------------------------------------------------------------------------
def _drive(deps: Deps, start_state: dict | None, *, resumed: bool, progress: bool,
           close_evaluator: bool = True, stop: threading.Event | None = None,
           found_gpu: str | None = None) -> RunSummary:
    from langgraph.checkpoint.sqlite import SqliteSaver

    from agent.progress import RunProgress

    config, writer = deps.config, deps.writer
    conn = sqlite3.connect(str(writer.checkpoint_path), check_same_thread=False)
    graph = build_graph(Nodes(deps), checkpointer=SqliteSaver(conn))
    thread = {"configurable": {"thread_id": config.run_id}, "recursion_limit": recursion_limit(config.budget)}
    snapshot = graph.get_state(thread)
    retry_turn = resumed and not snapshot.next and _retry_failed_turn(graph, thread, snapshot.values)
    if retry_turn:
        snapshot = graph.get_state(thread)
    if resumed and not snapshot.values:
        start_state = initial_state()  # killed before the first checkpoint: start over
    elif resumed and not snapshot.next and not snapshot.tasks:
        # Finished. (Killed after a node's writes were saved but before the next checkpoint:
        # `next` is empty yet `tasks` holds that node; invoke(None) applies its writes and goes on.)
        summary = summary_from_state(config, snapshot.values, "finished")
        writer.write_summary(summary)
        conn.close()
        if close_evaluator:
            deps.evaluator.close()
        return summary
    if resumed and snapshot.values:
        deps.clock = Clock(offset=(snapshot.values.get("spent") or {}).get("wall_s", 0.0))
    if found_gpu is not None:
        config = deps.config = with_found_gpu(config, found_gpu, snapshot.values if start_state is None else {})
        writer.write_config(config)
    live = RunProgress(config, enabled=progress,
                       spent=(snapshot.values.get("spent") if resumed and snapshot.values else None))
    writer.subscribe(live.on_event)
    writer.event("run_start", resumed=resumed, retried_turn=retry_turn or None, run_id=config.run_id,
                 task=config.task, arch=config.arch,
                 model=config.model, lang=config.lang, context=config.context, samples=config.samples,
                 strategy=config.strategy, profile_feedback=config.profile_feedback, require=config.require,
                 hints=config.hints,
                 budget=config.budget.model_dump(), gpu=config.gpu, gpu_from_turn=config.gpu_from_turn)
    status, stop_reason, stop_detail, tb = "finished", None, None, None
    try:
        with live, _sigterm_as_interrupt():
            final = None
            for final in graph.stream(start_state, thread, stream_mode="values"):
                if stop is not None and stop.is_set():  # between steps: every finished step is checkpointed
                    raise KeyboardInterrupt
    except KeyboardInterrupt:
        status, stop_reason = "interrupted", "interrupted"
        stop_detail = f"resume with: {resume_command(writer.run_dir)}"
        final = graph.get_state(thread).values
    except InfraFault as exc:  # not the model's fault: no verdict was drawn; resume evaluates the candidate again
        status, stop_reason = "failed", "infra_error"
        stop_detail = f"{exc}; fix it, then resume with: {resume_command(writer.run_dir)}"
        final = graph.get_state(thread).values
    except Exception as exc:  # a bug in ptxbench or a tool, not a bad kernel: record it, keep it resumable
        status, stop_reason = "failed", "error"
        stop_detail = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        tb = traceback.format_exc()
        final = graph.get_state(thread).values
    finally:
        conn.close()
        if close_evaluator:
            deps.evaluator.close()
    summary = summary_from_state(config, final or initial_state(), status, stop_reason=stop_reason,
                                 stop_detail=stop_detail)
    writer.event("run_end", status=summary.status, stop_reason=summary.stop_reason, stop_detail=summary.stop_detail,
                 turns=summary.turns, best=summary.best_path, traceback=tb)
    writer.write_summary(summary)
    return summary


def with_found_gpu(config: RunConfig, gpu: str, values: dict) -> RunConfig:
    """The config of a run without a GPU that goes on on `gpu`: from now on a run judged on that GPU
    (a report files it there, a resume elsewhere is refused), from the first turn no candidate was
    evaluated in yet (`gpu_from_turn`; the turns before it are unverified; None when there are none).
    torch is recorded anew: it is what this GPU's library speedups are measured with."""
    judged = [a["turn"] for a in values.get("attempts") or []]
    first = max(judged) + 1 if judged else 1
    versions = dict(config.tool_versions)
    if "torch" in (now := tool_versions()):
        versions["torch"] = now["torch"]
    return config.model_copy(update={"gpu": gpu, "gpu_from_turn": first if first > 1 else None,
                                     "tool_versions": versions})


def _retry_failed_turn(graph, thread: dict, values: dict) -> int | None:
    """A run stopped because the model failed (retries exhausted, an outage) before any reply
    of its last turn is resumable too: rewind that turn's draft and go on. Returns the turn."""
    per_turn = values.get("per_turn") or []
    turn = values.get("turn", 0)
    if values.get("stop_reason") != "model_error" or (per_turn and per_turn[-1]["turn"] == turn):
        return None
    messages = values.get("messages") or []
    graph.update_state(thread, {
        "turn": turn - 1, "messages": messages[:-1] if turn > 1 else [], "model_error": None,
        "stop_reason": None, "stop_detail": None, "decisions": (values.get("decisions") or [])[:-1],
        "action": None}, as_node="repair")  # the edge repair -> retrieve_context starts the turn again
    return turn


class _sigterm_as_interrupt:
    """SIGTERM (a sweep stopping a run) ends the run like Ctrl-C: summary written, resumable."""

    def __enter__(self):
        self._old = None
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGTERM, self._raise)
        return self

    @staticmethod
    def _raise(signum, frame):
        raise KeyboardInterrupt

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)


def _continue_script(model, run_dir: Path) -> None:
    """A scripted, replayed or folder-fed human model starts at its first reply in a new process;
    on resume it must go on where the run stopped. (A scripted fault uses an entry too.)"""
    kind = type(model).__name__
    if kind == "ScriptedModel":
        used = ("llm_response", "fault")
    elif kind == "ReplayModel" or (kind == "HumanModel" and model.reply_file and Path(model.reply_file).is_dir()):
        used = ("llm_response",)
    else:
        return
    model.index = sum(1 for e in read_events(run_dir) if e["type"] in used)


def _get_task(name: str):
    from tasks import UnknownTask, get_task

    try:
        return get_task(name)
    except UnknownTask as exc:
        raise SolveError(str(exc)) from None


def _get_model(spec: str, api_base: str | None, options: dict, human_reply_file: str | None,
               params: dict | None = None):
    from agent.models import get_model

    unknown = sorted(set(options or {}) - set(MODEL_OPTIONS))
    if unknown:  # e.g. {"extra": ...}: one line, not a TypeError deep in get_model
        raise SolveError(f"unknown model option {unknown[0]!r}; known: {', '.join(MODEL_OPTIONS)} (provider "
                         "parameters go in model params: --model-param key=value, or `params` in a sweep)")

    extra = {"reply_file": human_reply_file} if spec == "human" and human_reply_file else None
    if (spec == "human" and not (human_reply_file or os.environ.get("PTXBENCH_HUMAN_REPLY_FILE"))
            and not (sys.stdin.isatty() and sys.stdout.isatty())):
        # The reply would come from $EDITOR, which needs a terminal (in a pipe it prints escape codes).
        raise SolveError("--model human needs a terminal for $EDITOR; without one, give --human-reply-file "
                         "FILE or FOLDER (or set PTXBENCH_HUMAN_REPLY_FILE)")
    # The key comes from the environment, never from the run's files. A local OpenAI-compatible
    # server (vLLM, Ollama) needs none, but the openai client refuses to send a request without one.
    api_key = os.environ.get("PTXBENCH_API_KEY")
    if api_key is None and api_base and spec.startswith("openai/") and not os.environ.get("OPENAI_API_KEY"):
        api_key = "EMPTY"
    try:
        model = get_model(spec, api_base=api_base, api_key=api_key, extra=extra, params=params, **options)
    except (ValueError, OSError) as exc:
        raise SolveError(str(exc).splitlines()[0]) from None
    if type(model).__name__ == "LiteLLMModel" and not api_base and not api_key:
        import litellm  # imported by the model already

        missing = litellm.validate_environment(model=spec)
        if not missing.get("keys_in_environment", True):  # say so now, not after the first call's retries
            keys = " or ".join(missing.get("missing_keys") or ["its API key"])
            raise SolveError(f"model {spec}: set {keys} in the environment (or, for a local OpenAI-compatible "
                             f"server, `agent solve --api-base URL`, or api_base = \"URL\" beside spec in a sweep "
                             f"config)")
    return model


# Faults that may pass by themselves (the runs retry them); any other failed probe stops a sweep.
_TRANSIENT = {"rate_limit", "server_error", "timeout"}


def check_model(spec: str, api_base: str | None = None, options: dict | None = None, *,
                probe: bool = True, params: dict | None = None, temperature: float | None = None,
                seed: int | None = None) -> str | None:
    """Can runs use this model at all? Raises SolveError (one line) if not: an unknown
    provider or model, a missing key, a closed port, a missing replay or script. A litellm
    model is also sent one tiny request (`probe`) with what a run's first call sends (the model
    parameters, temperature and seed), which is what finds a wrong model name or key, or a
    parameter the provider refuses. Returns a warning when that request met a fault that may
    pass (429, 5xx)."""
    options = dict(options or {})
    try:
        if api_base:
            _check_reachable(api_base)
        model = _get_model(spec, api_base, options, None, params)
    except SolveError as exc:  # name the model: a sweep has several
        message = str(exc)
        raise SolveError(message if message.startswith("model ") else f"model {spec}: {message}") from None
    if not probe or type(model).__name__ != "LiteLLMModel":
        return None
    from agent.models import ModelError, call_options, get_model

    quick = get_model(spec, api_base=api_base, api_key=getattr(model, "api_key", None), params=params,
                      timeout_s=min(float(options.get("timeout_s", 60)), 60.0), max_retries=1, retry_base_s=1.0)
    try:  # no max_tokens of its own: a reply cap a run does not send could itself be refused (thinking budgets)
        quick.complete([{"role": "user", "content": "Reply with OK."}], **call_options(temperature, seed))
    except ModelError as exc:
        if exc.kind in _TRANSIENT:
            return f"model {spec}: a test request met {exc} (runs will retry)"
        raise SolveError(f"model {spec}: a test request failed: {str(exc).splitlines()[0]}") from None
    return None


def _check_reachable(api_base: str) -> None:
    """A dead endpoint is a one-line error now, not minutes of retries later."""
    u = urlparse(api_base)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise SolveError(f"--api-base {api_base!r} is not an http(s) URL")
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        socket.create_connection((u.hostname, port), timeout=5).close()
    except OSError as exc:
        raise SolveError(f"cannot reach {api_base}: {exc.strerror or exc}") from None


def _get_retriever(mode: str, hints: list[str] | tuple[str, ...] = ()):
    if mode == "none" and not hints:  # a hint is added on top of any arm, the none arm included
        return None
    try:
        from knowledge.retriever import retrieve
    except ImportError as exc:
        raise SolveError(f"--context {mode} needs knowledge.retriever, which is not available: {exc}") from None
    return retrieve


def _get_evaluator():
    from tools.evaluator import Evaluator

    return Evaluator()



def render_statement(task, config: RunConfig) -> str:
    """The task statement a run's model reads (tasks.describe.render_task, with its --require setting)."""
    from tasks.describe import render_task

    return render_task(task, config.arch, config.lang, prompts.requires(config.require))


def tool_versions() -> dict[str, str]:
    versions: dict[str, str] = {}
    for dist in ("ptxbench", "litellm", "langgraph", "torch"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    try:
        from tools.toolchain import find_toolchain

        versions.update(find_toolchain().versions())
    except Exception as exc:  # a missing tool shows up in the evaluation; the record says why
        versions["toolchain"] = f"unavailable: {exc}"
    from tools.results import RULES_VERSION

    versions[RULES] = RULES_VERSION
    return versions


def _gpu_name(evaluator) -> str | None:
    """The GPU the evaluator will run on (None: no GPU, or a stand-in evaluator that does not say)."""
    return evaluator.gpu_name() if hasattr(evaluator, "gpu_name") else None
