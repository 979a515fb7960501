"""Sweep reports: read run folders, compute the benchmark's metrics per cell and turn limit,
write report.md, report.html, report.csv and PNG plots.

A cell is (model, task, arch, context, strategy, profile feedback, history, require); its replicas are the
runs that share it. Context, profile feedback and require (were the instructions asked for: the
verdicts are the same either way, so `cwa` under require off is correct-with-arch unasked) are the
ablations: the report shows
every metric with each setting side by side (and a plot of each). Each
metric is computed per run at a turn limit T from the run's per-turn verdicts (every
candidate of turns 1..T counts), then summarised over the cell's replicas:

  compiled, arch_sass         any candidate compiled / had the requested features in SASS
                              (`arch` is the cell's target architecture, sm_90a or sm_100a)
  correct                     any candidate passed the visible workloads on a GPU
  correct_held_out            any candidate passed the visible and the held-out workloads
                              (sizes the model never saw: the generalisation question)
  cwa                         correct with arch: correct and features in SASS (and not
                              shown unexecuted by the executed check). Static: unlike
                              EvalResult.correct_with_arch it does not demand the executed check ran
  cwa_executed                correct, features in SASS and counted at run time (needs a GPU)
  fast_p                      the run's best cwa_executed kernel beats p x library
                              (fast_0 = cwa_executed): speed counts only where the requested
                              instructions were counted doing the work at run time
  speedup                     geometric mean over the cell's cwa_executed runs of each run's best speedup
  speedup_held_out            the same over the held-out sizes, of each run's best kernel (the one its
                              visible speed chose) where that kernel was right there
  sol_score                   mean over the cell's cwa_executed runs of each run's best SOL score
                              (tools/roofline.py: 1 at the roofline, 0.5 at the library)

A verdict that could not be checked (no GPU, no ncu) is unknown: a run is unknown when
none of its candidates reached the verdict and at least one was unchecked. Proportions
count known runs only, with Wilson 95% intervals that span the unknown runs both ways (an unknown
verdict is one a run got too far to settle without a GPU or the executed check: the known runs are
no random sample); a cell without known runs shows n/a, never a pass. The speedup interval is a
seeded bootstrap over the cell's runs. Replicas of a scripted: or replay: model, or of any model at
temperature 0, that got the same replies are one sample (cell_samples): copies of one draw of the
model never narrow an interval. Rows of scripted, replayed or human replies say so (model_source, and
a note naming them), whatever name a sweep gave them.

Runs left out: unfinished, interrupted or failed ones (a ptxbench or infrastructure error), a
run its model's provider stopped (model_error), or a cost cap could not count (a call without a
price), past the turns it completed, a run past its own max_turns (reports of several budgets: it
had no such turn), and a run its sweep planned (sweep.json) that never started: each stays in its
cell, counted beside the measured runs with its reason (RunRecord.left_out), so a cell's runs plus
its unfinished are the replicas planned. Fixit's teacher runs (each opened with a student's kernel:
not a benchmark run) are no runs of the report at all. Runs that would share a cell but differ in a
setting no column names (two models under one name, another language, other prompt templates or docs
versions, other requested features, other compilers ...) get model labels that name it (distinguish);
one run found in two folders is refused. Rows of a family measured over different tasks of it name their tasks.
A run that ran out of replayed, scripted or human replies (replay_end, script_end, human_end) is
finished: past its turns it counts what it reached by its last turn, and n/a for the rest.
"""
from __future__ import annotations

import base64
import csv
import hashlib
import html
import json
import math
import random
from collections import Counter
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Iterable, Sequence

from agent.trajectory import (OUT_OF_REPLIES, CandidateRecord, RunConfig, RunSummary, is_teacher_run, read_config,
                              read_summary)

FAST_P = (0.0, 0.5, 0.8, 1.0)
DEFAULT_TURN_LIMITS = (1, 4, 8)
PROPORTIONS = ("compiled", "arch_sass", "correct", "correct_held_out", "cwa", "cwa_executed") + tuple(
    f"fast_{p:g}" for p in FAST_P)
# Outcomes that settle correctness as False without a GPU verdict (nothing ran, or it failed).
_NOT_CORRECT = {"model_error", "format_error", "compile_error", "run_failed", "incorrect"}

Tri = bool | None  # True / False / None = unknown (not checked)


# ---------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------
@dataclass
class RunRecord:
    run_dir: Path
    config: RunConfig
    summary: RunSummary | None  # None: the run never finished a turn's summary
    # the model column when the default one would merge this run with runs of other settings
    # (another model under the same name, another language ...): see distinguish()
    label: str | None = None
    # False: a run its sweep planned (sweep.json) that has no run folder, so no verdict: the config is
    # the one it would have recorded (planned_runs), and it stands in its cell as left out, "not started"
    started: bool = True

    @property
    def finished(self) -> bool:
        """Ended on its own terms (budget, the model's own end). Runs that a ptxbench error stopped
        ("failed") or that were interrupted say nothing about the model: they are left out."""
        return self.summary is not None and self.summary.status == "finished"

    def measured_at(self, turn_limit: int) -> bool:
        """Its verdicts up to `turn_limit` are what the model did there (left_out says why not)."""
        return self.left_out(turn_limit) is None

    def left_out(self, turn_limit: int) -> str | None:
        """Why the metrics at `turn_limit` leave this run out, in the words its cell shows (None: they
        count it). None of these is the model's failure, so none is in a denominator, and each is shown
        beside the cell's runs: a cell never reads as if its sweep had planned fewer runs."""
        s = self.summary
        if not self.started:
            return "not started"  # its sweep planned it; it has no run folder (the sweep stopped, or it was refused)
        if s is None:
            return "no summary"  # killed before its first turn ended
        if s.status != "finished":  # a ptxbench error, a fault of the toolchain or GPU, Ctrl-C, a killed driver
            return {"failed": "infrastructure error" if s.stop_reason == "infra_error" else "ptxbench error",
                    "interrupted": "interrupted"}.get(s.status, "running or killed")
        if s.stop_reason == "max_turns" and turn_limit > self.config.budget.max_turns:
            # its budget ended it before that limit (runs of two budgets reported together): it had
            # no such turn to succeed in, and counted there it would read as a failure
            return "fewer turns"
        # the model's provider stopped it: what it would have done past its turns is unknown, and
        # resuming it may still tell. A run out of replies (a replay, a script or a reply folder) is
        # finished: past its turns it counts, with what it reached (out_of_replies_past)
        if s.stop_reason == "model_error" and turn_limit > s.turns:
            return "provider failed"
        if s.stop_reason == "max_cost" and s.usage.cost_usd is None and turn_limit > s.turns:
            # a call came back without a price (agent.budget.exhausted): the harness could not count the
            # cap, the model did not spend it; past its turns it is as unknown as after an outage
            return "cost unknown"
        return None

    def out_of_replies_past(self, turn_limit: int) -> bool:
        """A finished run whose replies ran out before `turn_limit`: a verdict it reached by its last
        turn is reached by the limit (each verdict is "reached by turn N"), one it did not reach is
        unknown there (n/a), and so is its best speedup (a later turn might have beaten it)."""
        return (self.summary is not None and self.summary.stop_reason in OUT_OF_REPLIES
                and turn_limit > self.summary.turns)


def find_run_dirs(paths: Iterable[str | Path]) -> list[Path]:
    """Run folders (those holding config.json) given directly or anywhere under sweep folders,
    each once however it was reached (a folder given twice, relative and absolute, or by a link)."""
    found: dict[Path, Path] = {}  # resolved -> as found
    for p in map(Path, paths):
        if (p / "config.json").is_file():
            dirs = [p]
        elif p.is_dir():  # a run's candidates/ folder holds no run; a sweep or model named candidates does
            dirs = sorted(c.parent for c in p.rglob("config.json") if not _inside_candidates(c.parent, p))
        else:
            dirs = []
        for d in dirs:
            found.setdefault(d.resolve(), d)
    return sorted(found.values())


def _inside_candidates(folder: Path, top: Path) -> bool:
    """Whether `folder` lies in some run's candidates/ folder (below `top`)."""
    return any(a.name == "candidates" and (a.parent / "config.json").is_file()
               for a in [folder, *folder.parents] if a != top and top in a.parents)


def load_runs(paths: Iterable[str | Path]) -> list[RunRecord]:
    """The runs under `paths`. Two folders holding one run id (a copy, or old runs moved aside)
    are refused: counting both would count that run twice."""

    # Fixit's teacher runs (a data folder among the runs) opened with a student's kernel: no benchmark runs
    runs = [RunRecord(d, read_config(d), read_summary(d)) for d in find_run_dirs(paths) if not is_teacher_run(d)]
    seen: dict[str, Path] = {}
    for r in runs:
        if r.config.run_id in seen:
            raise ValueError(f"run {r.config.run_id} is in two folders, {seen[r.config.run_id]} and {r.run_dir}: "
                             f"report one of them (counting both would count the run twice)")
        seen[r.config.run_id] = r.run_dir
    return distinguish(runs)


def planned_runs(paths: Iterable[str | Path], recorded: Iterable[str]) -> tuple[list[RunRecord], list[str]]:
    """The runs a sweep planned under `paths` (its sweep.json, written before any of them starts) that
    have no run folder among `recorded` run ids: the sweep was stopped before them, or each was refused
    before it wrote its config (an endpoint gone, a setting refused). Without them a cell would show
    the replicas that happen to exist as if they were all it planned. Each comes back with the config
    its run would have recorded (agent.run.request_config), so it stands in that run's cell, left out
    as "not started". Also notes for a sweep.json whose plan cannot be read here, with its count."""
    from agent.run import request_config
    from agent.sweep import SweepConfig, expand
    from tasks import get_task

    given = [Path(p).resolve() for p in paths]
    done = set(recorded)
    out: list[RunRecord] = []
    notes: list[str] = []
    for sweep_file in _sweep_files(given):
        try:
            data = json.loads(sweep_file.read_text())
            ids = [i for i in data["runs"] if i not in done and _under(_planned_folder(sweep_file, i), given)]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            notes.append(f"{sweep_file} cannot be read ({_first_line(exc)}): the runs its sweep planned that never "
                         f"started are not shown")
            continue
        if not ids:
            continue
        try:
            config = SweepConfig.model_validate(data["config"])
            grid = {r.run_id: r for r in expand(config) if r.run_id in ids}
        except (ValueError, KeyError, TypeError) as exc:  # a plan this checkout cannot expand (a task gone ...)
            grid, why = {}, _first_line(exc)
        else:
            why = "they are not in the grid its config gives here"
        done.update(grid)  # a copy of the sweep folder holds the same plan: its runs are these, once
        for r in grid.values():
            task = get_task(r.task)
            out.append(RunRecord(_planned_folder(sweep_file, r.run_id),
                                 request_config(r.request(config, Path(config.runs_dir)), task), None, started=False))
        if lost := len(ids) - len(grid):
            notes.append(f"{lost} run{'s' if lost > 1 else ''} that {sweep_file} planned never started and "
                         f"are in no cell: {why}")
    return out, notes


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc).strip() else type(exc).__name__


def _sweep_files(given: Sequence[Path]) -> list[Path]:
    """The sweep.json of each sweep that `given` folders hold or lie inside (the nearest above)."""
    found: set[Path] = set()
    for p in given:
        found.update(p.rglob("sweep.json") if p.is_dir() else [])
        found.update(next(([a / "sweep.json"] for a in p.parents if (a / "sweep.json").is_file()), []))
    return sorted(found)


def _planned_folder(sweep_file: Path, run_id: str) -> Path:
    """Where a run of a sweep lies: sweep.json is <runs_dir>/<sweep>/, its run ids <sweep>/..., and a
    sweep folder moved or renamed is the same sweep."""
    return sweep_file.parent.joinpath(*run_id.split("/")[1:])


def _under(folder: Path, given: Sequence[Path]) -> bool:
    folder = folder.resolve()
    return any(folder == g or g in folder.parents for g in given)


# Settings of a run that make it another experiment but are not columns of the report: within one
# sweep they are the same for every run, across sweeps (or after a config change) they may not be.
# (max_turns is left out: the turn limits are the report's axis for it. The other caps are not on
# that axis: a run a cost cap stopped at turn 2 reads as a model that failed in 8 turns.)
def _settings(c: RunConfig) -> dict[str, object]:
    from agent.sweep import model_identity

    return {"spec": model_identity(c.model), "api_base": c.api_base, "lang": c.lang, "samples": c.samples,
            "population": c.population if c.strategy == "evolve" else None, "temperature": c.temperature,
            "executed_check": c.executed_check, "context_tokens": c.context_tokens,
            "context_turn_tokens": c.context_turn_tokens, "memcheck": c.memcheck,
            # the prompts and the docs the run was asked with (short hashes): a rewrite of either is
            # another experiment under the same arm name. Runs recorded before configs held the docs
            # version are "unknown", a version of their own; the none arm sends no docs at all.
            "prompts": f"{c.prompt_version}:{c.template_hash[:12] or 'unknown'}",
            "docs": None if c.context == "none" and not c.hints else (c.knowledge_version or "unknown")[:12],
            # what judged and timed it (None: no GPU): a speedup is against the library on that GPU, and
            # a run on CPU never showed the model a correctness verdict (agent.run.gpu_change)
            # (a run resumed on a GPU after turns without one: its own experiment, from which turn)
            "gpu": c.gpu if c.gpu_from_turn is None else f"{c.gpu} from turn {c.gpu_from_turn}",
            "toolchain": _toolchain(c),
            "budget": ", ".join(f"{k}={v:g}" for k, v in c.budget.model_dump(exclude={"max_turns"}).items()
                                if v is not None) or "no caps"}


def _toolchain(c: RunConfig) -> str:
    """The tools that drew the run's verdicts, as a resume compares them (agent.run.toolchain_change):
    the compilers write the machine code that is judged, and for a run judged on a GPU torch's cuBLAS
    and cuDNN are the library its speedups are against; and the judge's rules (tools.results.RULES_VERSION).
    Runs recorded without versions: "unknown"."""
    from agent.run import judged_by

    if not c.tool_versions:
        return "unknown"
    return ", ".join(f"{n} {v}" for n, v in judged_by(c).items())


# Cell-key settings that runs told apart by distinguish() may differ in: the task (families pool
# tasks) and the two ablations. Settings only the arms that send docs have (the none arm's are None).
ABLATION_FREE = ("task", "context", "profile", "require")
DOCS_ARM_ONLY = ("docs", "context_tokens", "context_turn_tokens")


def distinguish(runs: list[RunRecord]) -> list[RunRecord]:
    """Runs that would share a cell, or a family's cell, but differ in a setting the cell key does not
    name (two models under one `name`, another language, sample count, temperature ...) get a model label
    naming the settings that differ, so they are never pooled into one row. Labels otherwise stay."""
    cells: dict[tuple[str, ...], list[RunRecord]] = {}
    for r in runs:  # the cell without its task (the family tables pool a family's tasks) and without the
        # ablations' settings: the arms the report shows side by side must differ in those alone
        r.label = None
        if not r.started:  # no recorded settings to compare: it takes its replicas' label (below)
            continue
        key = cell_key(r)
        cells.setdefault(tuple(v for i, v in enumerate(key) if KEY_NAMES[i] not in ABLATION_FREE), []).append(r)
    for key, members in cells.items():
        settings = [_settings(r.config) for r in members]
        for s, r in zip(settings, members):  # what only the arms that send docs have is no difference
            if r.config.context == "none":
                for k in DOCS_ARM_ONLY:
                    s[k] = None
        differ = [k for k in settings[0] if len({json.dumps(s[k], sort_keys=True) for s in settings
                                                 if not (k in DOCS_ARM_ONLY and s[k] is None)}) > 1]
        # Settings compared within a task only (the family tables pool tasks that may differ in them):
        # the instructions it asked for (what `arch (SASS)` and correct+arch check) and its definition
        # (workloads, tolerance ...; runs recorded before configs held its hash: "unknown"). Runs of one
        # task under another answered another question.
        for name, values in (("features", ["+".join(sorted(r.config.requested_features)) or "none" for r in members]),
                             ("task_def", [(r.config.task_hash or "unknown")[:12] for r in members])):
            per_task: dict[str, set[str]] = {}
            for r, v in zip(members, values):
                per_task.setdefault(r.config.task, set()).add(v)
            if any(len(vs) > 1 for vs in per_task.values()):
                differ.append(name)
                for s, v in zip(settings, values):
                    s[name] = v
        if not differ:
            continue
        for r, s in zip(members, settings):
            named = [k for k in differ if not (k in DOCS_ARM_ONLY and r.config.context == "none")]
            if named:  # a none-arm run that differs in docs settings alone goes with every docs arm
                r.label = f"{key[0]} ({', '.join(f'{k}={s[k]}' for k in named)})"
    labels: dict[str, str | None] = {}
    for r in runs:  # a sweep's replicas of one cell share their run id but for the last part (r<k>)
        if r.started:
            labels.setdefault(r.config.run_id.rsplit("/", 1)[0], r.label)
    for r in runs:
        if not r.started:
            r.label = labels.get(r.config.run_id.rsplit("/", 1)[0])
    return runs


def model_label(spec: str) -> str:
    """A short name for reports: scripted/replay paths become their file or folder stem."""
    for prefix in ("scripted:", "replay:"):
        if spec.startswith(prefix):
            return prefix + Path(spec.removeprefix(prefix)).stem
    return spec


# ---------------------------------------------------------------------------------------
# Per-candidate and per-run verdicts
# ---------------------------------------------------------------------------------------
def _any(values: Iterable[Tri]) -> Tri:
    """Did any candidate reach it? True if one did; unknown if none did but one was unchecked."""
    values = list(values)
    if any(v is True for v in values):
        return True
    return None if any(v is None for v in values) else False


def candidate_correct(c: CandidateRecord) -> Tri:
    if c.verdicts.correct is not None:
        return c.verdicts.correct
    if c.outcome in _NOT_CORRECT or not c.verdicts.compiled:
        return False
    if c.outcome == "correct_with_arch":
        return True
    return None  # compiled, not run: no GPU


def candidate_correct_held_out(c: CandidateRecord) -> Tri:
    """Correct on the visible workloads and on the held-out sizes the model never saw."""
    correct = candidate_correct(c)
    return correct if correct is not True else c.verdicts.correct_held_out


def candidate_cwa(c: CandidateRecord, executed: bool) -> Tri:
    """Correct with arch; `executed` demands the features were counted at run time."""
    correct = candidate_correct(c)
    if correct is False or not c.verdicts.arch_sass:
        return False
    ran = c.verdicts.arch_executed
    if ran is False:
        return False
    if executed and ran is None:
        return None
    return correct  # True, or None when correctness was not checked


@dataclass
class RunMetrics:
    """One run's verdicts within a turn limit."""

    values: dict[str, Tri]  # the PROPORTIONS
    speedup: float | None  # best speedup among its cwa candidates (None: none, or untimed)
    sol_score: float | None = None  # best SOL score among its cwa candidates
    # the held-out sizes' speedup of the kernel that gave `speedup` (None: wrong or untimed there)
    speedup_held_out: float | None = None


def run_metrics(summary: RunSummary, turn_limit: int) -> RunMetrics:
    cands = [c for t in summary.per_turn if t.turn <= turn_limit for c in t.candidates]
    # Speed is credited only to kernels whose requested instructions were counted doing the work
    # at run time (the executed check): a kernel with wgmma in its SASS that a timed run never
    # executed must not buy fast_p or a speedup. Unchecked (no GPU, check off) is unknown, never a pass.
    cwa_run = _any(candidate_cwa(c, executed=True) for c in cands)
    timed = [c for c in cands if candidate_cwa(c, executed=True) is True and c.verdicts.speedup is not None]
    # the held-out sizes choose nothing: their speedup is that of the kernel the visible speed chose
    fastest = max(timed, key=lambda c: c.verdicts.speedup, default=None)  # type: ignore[arg-type,return-value]
    best = fastest.verdicts.speedup if fastest else None
    held_out = fastest.verdicts.speedup_held_out if fastest and fastest.verdicts.correct_held_out else None
    sols = [c.verdicts.sol_score for c in cands
            if candidate_cwa(c, executed=True) is True and c.verdicts.sol_score is not None]
    values: dict[str, Tri] = {
        "compiled": any(c.verdicts.compiled for c in cands),
        "arch_sass": any(c.verdicts.compiled and c.verdicts.arch_sass for c in cands),
        "correct": _any(candidate_correct(c) for c in cands),
        "correct_held_out": _any(candidate_correct_held_out(c) for c in cands),
        "cwa": _any(candidate_cwa(c, executed=False) for c in cands),
        "cwa_executed": cwa_run,
    }
    return RunMetrics(_with_fast_p(values, best), best, max(sols) if sols else None, held_out)


def _with_fast_p(values: dict[str, Tri], best: float | None) -> dict[str, Tri]:
    """fast_p from cwa_executed and the best speedup: fast_0 is cwa_executed itself."""
    cwa_run = values["cwa_executed"]
    for p in FAST_P:
        if p == 0 or cwa_run is not True:
            values[f"fast_{p:g}"] = cwa_run
        else:  # a cwa kernel that was not timed cannot be said to beat the library
            values[f"fast_{p:g}"] = None if best is None else best > p
    return values


def _replies(run: RunRecord, turn_limit: int) -> str:
    """A fingerprint of the replies a run got up to `turn_limit` (each candidate's reply.md)."""
    h = hashlib.sha256()
    for t in run.summary.per_turn:  # type: ignore[union-attr]
        for c in t.candidates if t.turn <= turn_limit else []:
            reply = run.run_dir / c.path / "reply.md"
            h.update(c.path.encode() + b"\0" + (reply.read_bytes() if reply.is_file() else b"(none)") + b"\0")
    return h.hexdigest()


def cell_samples(runs: Sequence[RunRecord], turn_limit: int) -> list[RunMetrics]:
    """The independent samples among runs measured at `turn_limit`: one per run, except that runs of
    a deterministic model (scripted, replayed, or any model decoding greedily: temperature 0) that got
    the same replies in the same cell (its replicas) are one sample.
    n copies of one reply sequence are one draw of the model; counted n times they would narrow every
    interval as if n draws had agreed. A merged sample holds the verdicts its copies agree on (n/a
    where the same kernels got different verdicts), and the geometric mean of their speedups."""
    from agent.sweep import deterministic

    groups: dict[object, list[RunMetrics]] = {}
    for r in runs:
        greedy = deterministic(r.config.model) or 0 in (r.config.temperature, r.config.model_params.get("temperature"))
        key = (cell_key(r), _replies(r, turn_limit)) if greedy else r.run_dir
        metrics = run_metrics(r.summary, turn_limit)  # type: ignore[arg-type]
        if r.out_of_replies_past(turn_limit):
            metrics = RunMetrics({k: True if v is True else None for k, v in metrics.values.items()}, None, None, None)
        groups.setdefault(key, []).append(metrics)
    return [copies[0] if len(copies) == 1 else _merge_copies(copies) for copies in groups.values()]


def _merge_copies(copies: Sequence[RunMetrics]) -> RunMetrics:
    values: dict[str, Tri] = {}
    for name in ("compiled", "arch_sass", "correct", "correct_held_out", "cwa", "cwa_executed"):
        known = {m.values[name] for m in copies if m.values[name] is not None}
        values[name] = known.pop() if len(known) == 1 else None
    timed = [m for m in copies if m.values["cwa_executed"] is True] if values["cwa_executed"] is True else []
    speeds = [m.speedup for m in timed if m.speedup]
    sols = [m.sol_score for m in timed if m.sol_score is not None]
    best = geomean(speeds) if speeds else None  # type: ignore[arg-type]
    held = [m.speedup_held_out for m in timed if m.speedup_held_out]
    sol = sum(sols) / len(sols) if sols else None  # type: ignore[arg-type]
    return RunMetrics(_with_fast_p(values, best), best, sol, geomean(held) if held else None)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------
@dataclass
class Proportion:
    successes: int
    n: int  # runs with a known verdict
    unknown: int

    @property
    def rate(self) -> float | None:
        return self.successes / self.n if self.n else None

    def wilson(self, z: float = 1.959964) -> tuple[float, float] | None:
        """Wilson's 95% interval of the cell's rate. Runs whose verdict is unknown are no random part
        of the cell (a verdict is unchecked where a run got further: compiled on a CPU, correct where the
        executed check did not run), so the rate over known runs is no estimate of the cell's: the
        interval spans them both ways, from all of them failing to all of them passing."""
        if not self.n:
            return None
        total = self.n + self.unknown
        return _wilson(self.successes, total, z)[0], _wilson(self.successes + self.unknown, total, z)[1]


def _wilson(successes: int, n: int, z: float) -> tuple[float, float]:
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def proportion(values: Sequence[Tri]) -> Proportion:
    known = [v for v in values if v is not None]
    return Proportion(sum(1 for v in known if v), len(known), len(values) - len(known))


def geomean(xs: Sequence[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def bootstrap_geomean_ci(xs: Sequence[float], *, resamples: int = 2000, seed: int = 0) -> tuple[float, float] | None:
    """Percentile 95% interval of the geometric mean, resampling runs (seeded: reports are reproducible)."""
    if len(xs) < 2:
        return None
    rng = random.Random(seed)
    logs = [math.log(x) for x in xs]
    means = sorted(sum(rng.choice(logs) for _ in logs) / len(logs) for _ in range(resamples))
    return math.exp(means[int(0.025 * resamples)]), math.exp(means[int(0.975 * resamples) - 1])


# ---------------------------------------------------------------------------------------
# Cells
# ---------------------------------------------------------------------------------------
# model (its parameters appended when it has any), task, arch, context, strategy, profile feedback (on/off),
# history policy (full/latest), require (on/off: were the instructions asked for)
CellKey = tuple[str, str, str, str, str, str, str, str]
KEY_NAMES = ("model", "task", "arch", "context", "strategy", "profile", "history", "require")


@dataclass
class CellRow:
    key: CellKey
    turn_limit: int
    runs: int  # runs measured at this turn limit (RunRecord.measured_at)
    unfinished: int
    metrics: dict[str, Proportion]
    speedups: list[float] = field(default_factory=list)  # best speedup of each timed cwa sample
    sol_scores: list[float] = field(default_factory=list)  # best SOL score of each scored cwa sample
    # independent samples among those runs (cell_samples): fewer where a deterministic model's
    # replicas got the same replies; -1: as many as runs
    samples: int = -1
    tasks: tuple[str, ...] = ()  # the tasks of those runs (a family's row pools several)
    # what sent the replies (agent.sweep.model_identity): the provider's model, or scripted replies,
    # a replayed recording, a person, whatever name the sweep gave it
    model_source: str = ""
    # of the samples in `speedups`: their best kernel's speedup on the held-out sizes, where right there
    speedups_held_out: list[float] = field(default_factory=list)
    # the `unfinished` runs by why they are left out (RunRecord.left_out): "interrupted" -> 2 ...
    left_out: dict[str, int] = field(default_factory=dict)
    task_runs: dict[str, int] = field(default_factory=dict)  # the measured runs of each of `tasks`

    def __post_init__(self):
        if self.samples < 0:
            self.samples = self.runs

    @property
    def sol_score(self) -> float | None:
        return sum(self.sol_scores) / len(self.sol_scores) if self.sol_scores else None

    @property
    def speedup(self) -> float | None:
        return geomean(self.speedups) if self.speedups else None

    @property
    def speedup_ci(self) -> tuple[float, float] | None:
        return bootstrap_geomean_ci(self.speedups)

    @property
    def speedup_held_out(self) -> float | None:
        return geomean(self.speedups_held_out) if self.speedups_held_out else None


def arm(c: RunConfig) -> str:
    """The context column: the arm, and each --hint added on top of it (`docs+hint:warp_specialization`)."""
    return c.context + "".join(f"+hint:{h}" for h in c.hints)


def cell_key(run: RunRecord) -> CellKey:
    c = run.config
    return (run_label(run), c.task, c.arch, arm(c), c.strategy, "on" if c.profile_feedback else "off", c.history,
            c.require)


def run_label(run: RunRecord) -> str:
    """The model column: the sweep's name for the model (else its spec), its parameters, and where
    runs of other settings would share its cells, those settings (distinguish)."""
    c = run.config
    return run.label or (c.model_name or model_label(c.model)) + params_label(c.model_params)


def params_label(params: dict) -> str:
    """A model's parameters as a suffix of its label (" [reasoning_effort=high]"); "" for none.
    The same model with other parameters is another model in a comparison."""
    return (" [" + ", ".join(f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in sorted(params.items()))
            + "]") if params else ""


def family_key(run: RunRecord) -> CellKey:
    """The run's cell with its task replaced by the task's family (GEMM, attention forward, ...):
    a family's cell pools the runs of all its tasks, so fast_p there is the share of all of them."""
    from tasks.registry import task_family

    key = cell_key(run)
    return (key[0], task_family(key[1]), *key[2:])  # type: ignore[return-value]


def split_key(run: RunRecord) -> CellKey:
    """As family_key, with the task split apart (tasks.registry.task_split: train / held_out_tasks),
    so a model's results on the tasks no Fixit data came from read apart from the rest."""
    from tasks.registry import task_family, task_split

    key = cell_key(run)
    return (key[0], f"{task_family(key[1])} / {task_split(key[1])}", *key[2:])  # type: ignore[return-value]


def group_cells(runs: Sequence[RunRecord], key=cell_key) -> dict[CellKey, list[RunRecord]]:
    cells: dict[CellKey, list[RunRecord]] = {}
    for r in runs:
        cells.setdefault(key(r), []).append(r)
    return dict(sorted(cells.items()))


def summarise(runs: Sequence[RunRecord], turn_limits: Sequence[int] = DEFAULT_TURN_LIMITS,
              by=cell_key) -> list[CellRow]:
    """Rows per cell and turn limit; `by` groups runs into cells (cell_key, family_key, split_key)."""
    from agent.sweep import model_identity

    rows: list[CellRow] = []
    for key, members in group_cells(runs, by).items():
        for limit in sorted(set(turn_limits)):
            done = [r for r in members if r.measured_at(limit)]
            per_run = cell_samples(done, limit)
            metrics = {m: proportion([pr.values[m] for pr in per_run]) for m in PROPORTIONS}
            speedups = [pr.speedup for pr in per_run if pr.values["cwa_executed"] is True and pr.speedup]
            sols = [pr.sol_score for pr in per_run if pr.values["cwa_executed"] is True and pr.sol_score is not None]
            left_out = Counter(why for r in members if (why := r.left_out(limit)) is not None)
            task_runs = dict(sorted(Counter(r.config.task for r in done).items()))
            rows.append(CellRow(key, limit, len(done), len(members) - len(done), metrics, speedups, sols,
                                len(per_run), tuple(task_runs),
                                ", ".join(sorted({model_identity(r.config.model) for r in members})),
                                [pr.speedup_held_out for pr in per_run if pr.values["cwa_executed"] is True
                                 and pr.speedup and pr.speedup_held_out], dict(sorted(left_out.items())), task_runs))
    return _name_task_sets(rows)


def _name_task_sets(rows: list[CellRow]) -> list[CellRow]:
    """Rows of one family (and arch) at one turn limit are read side by side: models, context arms,
    strategies. Where their measured runs cover different tasks of the family (a model bound to some
    tasks, an arm whose runs of a task were all interrupted), a rate over an easy task next to one over
    easy and hard tasks is no comparison: each row that lacks some of the tasks the others cover names
    its tasks in the family column (or those it lacks, where that is the shorter list). Nor is one that
    weighs them otherwise (3 runs of each beside 3 of the easy task and 1 of the hard, its other runs
    left out): where rows covering the same tasks differ in their shares of runs per task, each names
    its runs per task."""
    groups: dict[tuple, list[CellRow]] = {}
    for r in rows:
        if r.runs:  # a row without measured runs shows n/a: nothing to compare
            groups.setdefault((r.turn_limit, r.key[1], r.key[2]), []).append(r)
    for members in groups.values():
        every = sorted({t for r in members for t in r.tasks})
        full = []
        for r in members:
            lacks = [t for t in every if t not in r.tasks]
            if lacks:
                which = f"tasks: {', '.join(r.tasks)}" if len(r.tasks) <= len(lacks) else f"without {', '.join(lacks)}"
                r.key = (r.key[0], f"{r.key[1]} ({which})", *r.key[2:])  # type: ignore[assignment]
            else:
                full.append(r)
        if len({tuple(Fraction(n, r.runs) for n in r.task_runs.values()) for r in full}) > 1:
            for r in full:
                per_task = ", ".join(f"{t} {n}" for t, n in r.task_runs.items())
                r.key = (r.key[0], f"{r.key[1]} (runs per task: {per_task})", *r.key[2:])  # type: ignore[assignment]
    return rows


# ---------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------
COLUMNS = [("compiled", "compiled"), ("arch_sass", "arch (SASS)"), ("correct", "correct"),
           ("correct_held_out", "correct held-out too"), ("cwa", "correct+arch"),
           ("cwa_executed", "correct+arch executed")] + [(f"fast_{p:g}", f"fast_{p:g}") for p in FAST_P]


def _fmt_prop(p: Proportion) -> str:
    if p.rate is None:
        return "n/a"
    lo, hi = p.wilson()  # type: ignore[misc]
    unknown = f", {p.unknown} n/a" if p.unknown else ""
    return f"{p.rate:.0%} [{lo:.0%}-{hi:.0%}] ({p.successes}/{p.n}{unknown})"


def _fmt_speedup(row: CellRow, held_out: bool = False) -> str:
    xs = row.speedups_held_out if held_out else row.speedups
    if not xs:
        return "n/a"
    ci = bootstrap_geomean_ci(xs)
    return f"{geomean(xs):.2f}x" + (f" [{ci[0]:.2f}-{ci[1]:.2f}]" if ci else "") + f" (n={len(xs)})"


def csv_rows(rows: Sequence[CellRow]) -> list[dict[str, object]]:
    out = []
    for r in rows:
        d: dict[str, object] = dict(zip(KEY_NAMES, r.key))
        d.update(model_source=r.model_source, turn_limit=r.turn_limit, runs=r.runs, samples=r.samples,
                 unfinished=r.unfinished)
        for m in PROPORTIONS:
            p = r.metrics[m]
            ci = p.wilson()
            d[m] = "n/a" if p.rate is None else round(p.rate, 4)
            d[f"{m}_lo"] = "" if ci is None else round(ci[0], 4)
            d[f"{m}_hi"] = "" if ci is None else round(ci[1], 4)
            d[f"{m}_n"] = p.n
            d[f"{m}_unknown"] = p.unknown
        ci = r.speedup_ci
        d["speedup_geomean"] = "n/a" if r.speedup is None else round(r.speedup, 4)
        d["speedup_lo"] = "" if ci is None else round(ci[0], 4)
        d["speedup_hi"] = "" if ci is None else round(ci[1], 4)
        d["speedup_n"] = len(r.speedups)
        ci = bootstrap_geomean_ci(r.speedups_held_out)
        d["speedup_held_out_geomean"] = "n/a" if r.speedup_held_out is None else round(r.speedup_held_out, 4)
        d["speedup_held_out_lo"] = "" if ci is None else round(ci[0], 4)
        d["speedup_held_out_hi"] = "" if ci is None else round(ci[1], 4)
        d["speedup_held_out_n"] = len(r.speedups_held_out)
        d["sol_score_mean"] = "n/a" if r.sol_score is None else round(r.sol_score, 4)
        d["sol_score_n"] = len(r.sol_scores)
        d["unfinished_why"] = _left_out_words(r)
        out.append(d)
    return out


def write_csv(rows: Sequence[CellRow], path: Path) -> None:
    data = csv_rows(rows)
    with open(path, "w", newline="") as f:
        if not data:
            f.write("")
            return
        writer = csv.DictWriter(f, fieldnames=list(data[0]))
        writer.writeheader()
        writer.writerows(data)


def _left_out_words(row: CellRow) -> str:
    """The cell's runs left out and why: "1 interrupted, 2 not started" ("" for none)."""
    return ", ".join(f"{n} {why}" for why, n in row.left_out.items())


def _table(rows: Sequence[CellRow]) -> tuple[list[str], list[list[str]]]:
    head = [*KEY_NAMES, "runs"] + [label for _, label in COLUMNS] + ["speedup (geomean)", "speedup held-out (geomean)",
                                                                     "SOL score (mean)"]
    body = []
    for r in rows:
        why = _left_out_words(r)
        runs = f"{r.runs}" + (f" (as {r.samples} sample{'s' if r.samples != 1 else ''}: same replies)"
                              if r.samples < r.runs else "") + (
            f" (+{r.unfinished} unfinished{': ' + why if why else ''})" if r.unfinished else "")
        sol = "n/a" if r.sol_score is None else f"{r.sol_score:.2f} (n={len(r.sol_scores)})"
        body.append([*r.key, runs] + [_fmt_prop(r.metrics[m]) for m, _ in COLUMNS]
                    + [_fmt_speedup(r), _fmt_speedup(r, held_out=True), sol])
    return head, body


# ---------------------------------------------------------------------------------------
# Plots (matplotlib, Agg: no display needed)
# ---------------------------------------------------------------------------------------
def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _series_label(model: str, setting: str) -> str:
    return f"{model} ({setting})"


def _na(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"n/a: {what}", ha="center", va="center", transform=ax.transAxes, color="grey")


def fast_p_curve(metrics: Sequence[RunMetrics], ps: Sequence[float]) -> list[float | None]:
    """fast_p at each p as the tables count it (run_metrics): over the runs whose verdict is known,
    so a correct-with-arch run without a speedup (untimed, or a task without a library baseline)
    is unknown for p > 0, not a run that failed to beat the library. None: no known run."""
    out: list[float | None] = []
    for p in ps:
        known = [m for m in metrics if m.values["cwa_executed"] is False
                 or (m.values["cwa_executed"] is True and (p == 0 or m.speedup is not None))]
        wins = sum(1 for m in known if m.values["cwa_executed"] and (p == 0 or m.speedup > p))  # type: ignore[operator]
        out.append(wins / len(known) if known else None)
    return out


def plot_fast_p(runs: Sequence[RunRecord], turn_limit: int, path: Path) -> None:
    """fast_p over a range of p: the share of a cell's runs whose best cwa_executed kernel beats p x library."""
    plt = _pyplot()
    ps = [i / 40 for i in range(0, 81)]  # 0 .. 2
    groups = _by_task_arch(runs)
    fig, axes = plt.subplots(1, max(1, len(groups)), figsize=(5 * max(1, len(groups)), 3.6), squeeze=False)
    for ax, ((task, arch), members) in zip(axes[0], groups.items()):
        ax.set_title(f"{task} {arch} (turn {turn_limit})", fontsize=9)
        drawn = False
        for (model, context), series in _by_model_setting(members).items():
            metrics = cell_samples([r for r in series if r.measured_at(turn_limit)], turn_limit)
            ys = fast_p_curve(metrics, ps)
            if all(y is None for y in ys):
                continue
            # its sample count beside its name: a step curve of one run reads as sure as one of ten otherwise
            ax.plot(ps, [math.nan if y is None else y for y in ys], label=f"{_series_label(model, context)}, "
                    f"n={len(metrics)}", linestyle="--" if context.split(",")[0] == "none" else "-")
            drawn = True
        if drawn:
            ax.legend(fontsize=7)
        else:
            _na(ax, "correctness not checked (no GPU)")
        ax.set_xlabel("p (speedup threshold vs library)")
        ax.set_ylabel("fast_p")
        ax.set_ylim(-0.02, 1.02)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_speedup_by_turn(runs: Sequence[RunRecord], limits: Sequence[int], path: Path) -> None:
    """Geometric-mean best speedup of cwa_executed runs at every turn limit from 1 to the report's last
    one (the tables' limits are the ticks): a run that stopped early keeps its best after."""
    plt = _pyplot()
    groups = _by_task_arch(runs)
    fig, axes = plt.subplots(1, max(1, len(groups)), figsize=(5 * max(1, len(groups)), 3.6), squeeze=False)
    for ax, ((task, arch), members) in zip(axes[0], groups.items()):
        ax.set_title(f"{task} {arch}", fontsize=9)
        drawn = False
        for (model, context), series in _by_model_setting(members).items():
            xs, ys = [], []
            for turn in range(1, max(limits) + 1):
                sp = [m.speedup for m in cell_samples([r for r in series if r.measured_at(turn)], turn)
                      if m.values["cwa_executed"] is True and m.speedup]
                if sp:
                    xs.append(turn)
                    ys.append(geomean(sp))
            if xs:
                ax.plot(xs, ys, marker="o", label=_series_label(model, context))
                drawn = True
        if drawn:
            ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
            ax.legend(fontsize=7)
        else:
            _na(ax, "no timed correct-with-arch kernel")
        ax.set_xlabel("turn limit")
        # the same turn limits as the tables, drawn or not (an empty axis would show 0..1)
        ax.set_xlim(0.5, max(limits) + 0.5)
        ax.set_xticks(sorted(set(limits)))
        ax.set_ylabel("speedup vs library (geomean)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_context(rows: Sequence[CellRow], turn_limit: int, path: Path) -> None:
    """Context modes side by side per model: arch-in-SASS rate and correct-with-arch rate."""
    plot_ablation(rows, turn_limit, path, KEY_NAMES.index("context"), "context")


def plot_ablation(rows: Sequence[CellRow], turn_limit: int, path: Path, index: int, name: str) -> None:
    """The settings of one ablation (the cell key's `index`: context, profile feedback) side by
    side per model, task and arch (never merged: tasks differ in difficulty): arch-in-SASS rate
    and correct-with-arch rate, pooled over the other keys. Each bar carries the Wilson 95% interval
    the tables give (over its n/a runs too, both ways) and its count, successes/known runs: arms
    measured over different numbers of runs, or with runs left unknown, read as such, never as two
    equally sure rates. A bar no run could fill is drawn as a hatched outline marked n/a, never as a zero."""
    plt = _pyplot()
    rows = [r for r in rows if r.turn_limit == turn_limit]
    groups = sorted({(r.key[0], r.key[1], r.key[2]) for r in rows})  # model, task, arch
    settings = sorted({r.key[index] for r in rows}, key=lambda c: (c not in ("none", "off"), c))
    fig, axes = plt.subplots(1, 2, figsize=(max(10, 2.2 * len(groups) + 3), 4.2), squeeze=False)
    width = 0.8 / max(1, len(settings))
    for ax, metric, title in ((axes[0][0], "arch_sass", "compiled with requested features (SASS)"),
                              (axes[0][1], "cwa", "correct with arch")):
        for i, setting in enumerate(settings):
            for j, group in enumerate(groups):
                pooled = [r.metrics[metric] for r in rows if r.key[:3] == group and r.key[index] == setting]
                p = Proportion(*(sum(getattr(q, k) for q in pooled) for k in ("successes", "n", "unknown")))
                x = j + (i - (len(settings) - 1) / 2) * width
                label = setting if j == 0 else None
                if p.rate is not None:
                    lo, hi = p.wilson()  # type: ignore[misc]
                    ax.bar(x, p.rate, width, label=label, color=f"C{i}", yerr=[[p.rate - lo], [hi - p.rate]],
                           capsize=2, error_kw={"elinewidth": 0.8})
                    ax.text(x, hi + 0.02, f"{p.successes}/{p.n}" + (f", {p.unknown} n/a" if p.unknown else ""),
                            ha="center", va="bottom", fontsize=6)
                else:
                    ax.bar(x, 1.0, width, label=label, fill=False, hatch="//", edgecolor=f"C{i}", alpha=0.5)
                    ax.text(x, 0.5, "n/a", ha="center", va="center", fontsize=9, color="dimgrey",
                            bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})
        ax.set_xticks(range(len(groups)), [f"{m}\n{t} {a}" for m, t, a in groups], fontsize=7)
        ax.set_ylim(0, 1.15)  # room for a count above a full bar's interval
        ax.set_ylabel("share of runs")
        ax.set_title(f"{title}, turn {turn_limit}", fontsize=9)
    # one legend for both panels, above them: never over a bar
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, title=name, fontsize=7, title_fontsize=8, loc="upper center",
               ncol=max(1, len(settings)), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _by_task_arch(runs: Sequence[RunRecord]) -> dict[tuple[str, str], list[RunRecord]]:
    out: dict[tuple[str, str], list[RunRecord]] = {}
    for r in runs:
        if r.finished:
            out.setdefault((r.config.task, r.config.arch), []).append(r)
    return dict(sorted(out.items()))


def _by_model_setting(runs: Sequence[RunRecord]) -> dict[tuple[str, str], list[RunRecord]]:
    """Plot series: model x (context, and the strategy and profile feedback where not the plain loop's)."""
    out: dict[tuple[str, str], list[RunRecord]] = {}
    for r in runs:
        c = r.config
        setting = ", ".join([arm(c)] + ([c.strategy] if c.strategy != "linear" else [])
                            + (["profile on"] if c.profile_feedback else [])
                            + ([f"history {c.history}"] if c.history != "full" else [])
                            + (["unasked"] if c.require == "off" else []))
        out.setdefault((run_label(r), setting), []).append(r)
    return dict(sorted(out.items()))


# ---------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------
@dataclass
class Report:
    out_dir: Path
    files: dict[str, Path]  # "md" | "html" | "csv" | plot name -> path
    rows: list[CellRow]
    runs: int
    unfinished: int
    families: list[CellRow] = field(default_factory=list)  # per task family (family_key)
    splits: list[CellRow] = field(default_factory=list)  # per family and task split (split_key)
    cost: dict = field(default_factory=dict)  # agent.cost.SweepCost of the runs' recorded evaluations


PLOTS = {"fast_p": "fast_p.png", "speedup_by_turn": "speedup_by_turn.png", "context": "context.png",
         "profile": "profile.png", "require": "require.png"}
ABLATION_PLOTS = ("context", "profile", "require")


def plots_for(rows: Sequence[CellRow]) -> list[str]:
    """The plots these runs can fill: an ablation's plot only where the runs vary that setting."""
    varied = {name for name in ABLATION_PLOTS if len({r.key[KEY_NAMES.index(name)] for r in rows}) > 1}
    return [name for name in PLOTS if name not in ABLATION_PLOTS or name in varied]


def write_report(paths: Iterable[str | Path], out_dir: str | Path,
                 turn_limits: Sequence[int] | None = None, tasks: Iterable[str] | None = None,
                 published: bool = False) -> Report:
    """Read runs under `paths`, write report.md/html/csv and the plots into `out_dir`. `tasks`: only
    runs of these tasks (names, aliases or groups such as gemm:*; tasks.registry.select_tasks).
    Each run gets its page (agent/show.py) under `out_dir`/runs/, linked from its cell. `published`:
    the seed study's published rows (agent/published.py) beside the runs' own, at their tasks and limits."""
    if turn_limits is not None and any(t < 1 for t in turn_limits):
        raise ValueError(f"turn limits must be at least 1, not {sorted(turn_limits)}")
    paths = list(paths)
    runs = load_runs(paths)
    absent, plan_notes = planned_runs(paths, [r.config.run_id for r in runs])
    runs = distinguish(runs + absent)
    if tasks is not None:
        from tasks.registry import select_many

        chosen = set(select_many(list(tasks)))
        runs = distinguish([r for r in runs if r.config.task in chosen])  # labels from the runs shown
    if not runs:
        raise ValueError("no runs found (a run folder holds config.json)" + ("" if tasks is None else
                                                                          " of the tasks asked for"))
    longest = max(r.config.budget.max_turns for r in runs)
    # A limit past every run's budget says the same as the budget itself.
    limits = sorted({min(t, longest) for t in (turn_limits or _default_limits(runs))})
    rows = summarise(runs, limits)
    groups = {"Per task family": summarise(runs, limits, family_key),
              "Per task family and split (held-out tasks apart)": summarise(runs, limits, split_key)}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = {name: out / PLOTS[name] for name in plots_for(rows)}
    for stale in set(PLOTS) - set(files):  # an earlier report's plot of an ablation these runs do not make
        (out / PLOTS[stale]).unlink(missing_ok=True)
    plot_fast_p(runs, limits[-1], files["fast_p"])
    plot_speedup_by_turn(runs, limits, files["speedup_by_turn"])
    if "context" in files:
        plot_context(rows, limits[-1], files["context"])
    if "profile" in files:
        plot_ablation(rows, limits[-1], files["profile"], KEY_NAMES.index("profile"), "profile feedback")
    if "require" in files:
        plot_ablation(rows, limits[-1], files["require"], KEY_NAMES.index("require"), "instructions requested")
    files["csv"] = out / "report.csv"
    write_csv(rows, files["csv"])
    files["families_csv"] = out / "report_families.csv"
    write_csv([r for g in groups.values() for r in g], files["families_csv"])
    unfinished = sum(1 for r in runs if not r.measured_at(limits[-1]))
    from agent.cost import runs_cost

    cost = runs_cost([r.run_dir for r in runs])  # what the runs' evaluations cost on the GPU
    pages = write_run_pages(runs, out / "runs")
    extra = _published_rows(rows, limits) if published else None
    notes = plan_notes + _evaluation_notes(runs, rows) + (
        [cost.line(), cost.phases_line()] if cost.gpu_s else [cost.line()])
    if published:
        from agent.published import note

        notes.append(note())
        files["published_csv"] = out / "report_published.csv"
        _write_published_csv(extra, files["published_csv"])
    files["md"] = out / "report.md"
    not_started = sum(1 for r in runs if not r.started)
    files["md"].write_text(render_markdown(rows, limits, len(runs), unfinished, notes, groups, extra, pages,
                                           not_started))
    files["html"] = out / "report.html"
    files["html"].write_text(render_html(rows, limits, len(runs), unfinished, notes, files, groups, extra, pages,
                                         not_started))
    return Report(out, files, rows, len(runs), unfinished, *groups.values(), cost=cost.model_dump())


# A cell's runs, each with its page: (cell key, [(run id, page path relative to the report, one-line gist)])
RunPages = list[tuple[CellKey, list[tuple[str, str, str]]]]


def write_run_pages(runs: Sequence[RunRecord], folder: Path) -> RunPages:
    """Each run's page (agent/show.py) in `folder`, grouped by cell as the tables group them."""
    from agent.show import load_run, write_html

    out: RunPages = []
    for key, members in group_cells(runs).items():
        links = []
        for r in sorted(members, key=lambda r: r.config.run_id):
            if not r.started:
                links.append((r.config.run_id, "", "not started: its sweep planned it, it has no run folder"))
                continue
            name = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in r.config.run_id) + ".html"
            try:
                view = load_run(r.run_dir)
                write_html(view, folder / name)
            except (ValueError, OSError) as exc:  # a damaged events log: the tables still stand, the link says why
                links.append((r.config.run_id, "", f"no page: {str(exc).splitlines()[0]}"))
                continue
            best = next((c for t in view.turns for c in t.candidates if c.best), None)
            gist = f"{view.status}, {len(view.turns)} turn(s), best: " + (
                "none" if best is None else f"{best.path} {best.outcome}"
                + (f" {best.speedup:.3f}x" if best.speedup is not None else ""))
            links.append((r.config.run_id, f"{folder.name}/{name}", gist))
        out.append((key, links))
    return out


def _published_rows(rows: Sequence[CellRow], limits: Sequence[int]) -> dict[int, list]:
    """The seed study's published rows per turn limit, for the tasks and archs these runs measured."""
    from agent.published import rows_for

    pairs = {(t, r.key[2]) for r in rows for t in r.tasks}
    return {limit: rows_for(pairs, limit) for limit in limits}


def _write_published_csv(extra: dict[int, list] | None, path: Path) -> None:
    from agent.published import csv_row

    data = [csv_row(r) for limit in sorted(extra or {}) for r in (extra or {})[limit]]
    with open(path, "w", newline="") as f:
        if data:
            writer = csv.DictWriter(f, fieldnames=list(data[0]))
            writer.writeheader()
            writer.writerows(data)


def _turn_table(rows: Sequence[CellRow], limit: int, extra: dict[int, list] | None) -> tuple[list[str], list[list[str]]]:
    """A turn limit's table: the runs' rows, each task's published rows (if asked for) after them."""
    head, body = _table([r for r in rows if r.turn_limit == limit])
    if extra:
        from agent.published import table_row

        task_col = head.index("task")
        for pub in extra.get(limit, []):
            at = max((i for i, b in enumerate(body) if b[task_col].split(" (")[0] == pub.task), default=len(body) - 1)
            body.insert(at + 1, table_row(pub, head))
    return head, body


def _default_limits(runs: Sequence[RunRecord]) -> list[int]:
    longest = max((r.config.budget.max_turns for r in runs), default=8)
    return [t for t in DEFAULT_TURN_LIMITS if t < longest] + [longest]


def _evaluation_notes(runs: Sequence[RunRecord], rows: Sequence[CellRow] = ()) -> list[str]:
    notes = sorted({r.summary.evaluation for r in runs if r.summary and r.summary.evaluation != "ok"})
    lines = [f"evaluation {n} (correctness and speed are n/a for those runs)" for n in notes]
    # A sweep may name scripted replies or a recording as it likes (model_a): say what sent them
    sources = {(r.key[0], r.model_source) for r in rows if _not_a_model(r.model_source)
               and not r.key[0].startswith(("scripted", "replay", "human"))}  # unless its label says so
    if sources:
        lines.append("replies not drawn from a model here, not a model's own result: "
                     + "; ".join(f"{label}: {_source_words(source)}" for label, source in sorted(sources)))
    if any(r.samples < r.runs for r in rows):
        lines.append("runs of a scripted: or replay: model, or of a model at temperature 0, that got the same "
                     "replies (its replicas) count as one "
                     "sample: one draw of the model, with the verdicts its copies agree on (n/a where they differ) "
                     "and the geometric mean of their speedups")
    return lines


def _not_a_model(source: str) -> bool:
    return any(part.startswith(("scripted:", "replay:")) or part == "human" for part in source.split(", "))


def _source_words(source: str) -> str:
    """scripted:a.json -> "scripted replies (a.json)": what sent a row's replies, in words."""
    words = {"scripted:": "scripted replies, written in advance", "replay:": "a recorded run's replies"}
    out = []
    for part in source.split(", "):
        prefix = next((p for p in words if part.startswith(p)), None)
        out.append("a person's replies" if part == "human" else
                   f"{words[prefix]} ({part.removeprefix(prefix)})" if prefix else part)
    return ", ".join(out)


_INTRO = ("Per cell (model x task x arch x context x strategy x profile feedback x history x require) and turn limit: the share of "
          "runs that reached each verdict with a Wilson 95% interval (stretched over the runs whose verdict is n/a, "
          "either way) and (successes/known runs); speedup is the "
          "geometric mean of each correct-with-arch run's best speedup vs the library, with a bootstrap 95% "
          "interval (held-out: that kernel's speedup on the held-out sizes, where it was right there); SOL score the mean of each such run's best score against the roofline (1 = speed of light, "
          "0.5 = the library). "
          "n/a = not checked (e.g. no GPU), never a pass.")


def _runs_line(n_runs: int, unfinished: int, not_started: int = 0) -> str:
    runs = f"{n_runs} run" if n_runs == 1 else f"{n_runs} runs"
    planned = (f"{not_started} of them planned by their sweep and never started, " if not_started else "")
    return f"{runs} ({unfinished} unfinished, interrupted or stopped by a ptxbench or infrastructure error, " \
           f"{planned}left out of the metrics and counted beside each cell's runs with why; a run its model's " \
           f"provider stopped counts up to the turns it completed, a run given fewer " \
           f"turns than a limit only up to its own; a run whose replayed, scripted or human replies ran out counts " \
           f"what it reached by its last turn)."


def _group_tables(groups: dict[str, Sequence[CellRow]] | None, limits: Sequence[int]):
    """(title, head, body) per aggregate table (per family, per family and split) and turn limit."""
    for title, group in (groups or {}).items():
        for limit in limits:
            head, body = _table([r for r in group if r.turn_limit == limit])
            yield f"{title}, turn limit {limit}", ["family" if h == "task" else h for h in head], body


def render_markdown(rows: Sequence[CellRow], limits: Sequence[int], n_runs: int, unfinished: int,
                    notes: Sequence[str], groups: dict[str, Sequence[CellRow]] | None = None,
                    extra: dict[int, list] | None = None, pages: RunPages | None = None, not_started: int = 0) -> str:
    drawn = plots_for(rows)
    lines = ["# ptxbench report", "", _runs_line(n_runs, unfinished, not_started), "", _INTRO, ""]
    lines += [f"- {n}" for n in notes] + ([""] if notes else [])
    for limit in limits:
        head, body = _turn_table(rows, limit, extra)
        lines += [f"## Turn limit {limit}", "", "| " + " | ".join(head) + " |",
                  "|" + "---|" * len(head)] + ["| " + " | ".join(b) + " |" for b in body] + [""]
    for title, head, body in _group_tables(groups, limits):
        lines += [f"## {title}", "", "| " + " | ".join(head) + " |",
                  "|" + "---|" * len(head)] + ["| " + " | ".join(b) + " |" for b in body] + [""]
    lines += ["## Plots", ""] + [f"![{name}]({fname})" for name, fname in PLOTS.items() if name in drawn] + [""]
    if pages:
        lines += ["## Runs per cell", ""]
        for key, links in pages:
            lines += [f"- {' / '.join(key)}: " + ", ".join((f"[{run_id}]({href})" if href else run_id) + f" ({gist})"
                                                      for run_id, href, gist in links)]
        lines += [""]
    return "\n".join(lines)


def render_html(rows: Sequence[CellRow], limits: Sequence[int], n_runs: int, unfinished: int,
                notes: Sequence[str], files: dict[str, Path], groups: dict[str, Sequence[CellRow]] | None = None,
                extra: dict[int, list] | None = None, pages: RunPages | None = None, not_started: int = 0) -> str:
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>ptxbench report</title><style>",
             "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:12px}"
             "td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}th{background:#f3f3f3}"
             ".na{color:#999}img{max-width:100%;display:block;margin:1em 0}",
             "</style></head><body><h1>ptxbench report</h1>",
             f"<p>{html.escape(_runs_line(n_runs, unfinished, not_started))}</p>",
             f"<p>{html.escape(_INTRO)}</p>"]
    if notes:
        parts.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    for limit in limits:
        head, body = _turn_table(rows, limit, extra)
        parts.append(f"<h2>Turn limit {limit}</h2><table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head)
                     + "</tr>")
        for b in body:
            parts.append("<tr>" + "".join(
                f"<td class='na'>{html.escape(c)}</td>" if c == "n/a" else f"<td>{html.escape(c)}</td>"
                for c in b) + "</tr>")
        parts.append("</table>")
    for title, head, body in _group_tables(groups, limits):
        parts.append(f"<h2>{html.escape(title)}</h2><table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head)
                     + "</tr>" + "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in b) + "</tr>"
                                         for b in body) + "</table>")
    parts.append("<h2>Plots</h2>")
    for name in (n for n in PLOTS if n in files):  # embedded, so the HTML file stands alone
        data = base64.b64encode(files[name].read_bytes()).decode()
        parts.append(f"<h3>{name}</h3><img alt='{name}' src='data:image/png;base64,{data}'>")
    if pages:  # each run's own page: its turns, kernels, diffs and feedback
        parts.append("<h2>Runs per cell</h2><ul>")
        for key, links in pages:
            parts.append(f"<li>{html.escape(' / '.join(key))}: " + ", ".join(
                (f"<a href='{html.escape(href)}'>{html.escape(run_id)}</a>" if href else html.escape(run_id))
                + f" ({html.escape(gist)})" for run_id, href, gist in links) + "</li>")
        parts.append("</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)


def report_json(report: Report) -> dict:
    return {"out_dir": str(report.out_dir), "runs": report.runs, "unfinished": report.unfinished,
            "files": {k: str(v) for k, v in report.files.items()}, "rows": csv_rows(report.rows),
            "families": csv_rows(report.families), "splits": csv_rows(report.splits), "cost": report.cost}

