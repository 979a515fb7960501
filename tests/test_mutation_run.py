"""A run's request checks and its resume rules (agent/run.py), in process: fast enough for
mutation testing (scripts/mutation.sh; tests/test_resume.py and test_solve_cli.py run the CLI in
a subprocess, which mutmut cannot follow).

- `settings_problem`: what `agent solve` and a sweep config refuse up front, each check at its
  boundary (the last value refused, the first accepted) and with the message naming the setting
  as both spell it. A setting let through records a run under an arm it is not (a docs arm with
  no docs, a profile arm whose model never saw a profile) or fails once per run of a sweep.
- `run_id_problem`: a run id names a folder under --runs-dir and nothing else.
- the resume rules: a run goes on only with the prompts, task, docs, compilers, judge's rules
  and GPU its verdicts so far were drawn with (`inputs_change`, `toolchain_change`, `gpu_change`).
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from agent import feedback_catalogue, prompts
from agent import run as ar
from agent.trajectory import Budget, RunConfig


# ---------------------------------------------------------------------------------------
# settings_problem
# ---------------------------------------------------------------------------------------
def test_the_defaults_are_a_valid_run():
    assert ar.settings_problem() is None
    # each default agrees with the others: one sample a turn is linear, the executed check is on
    # (the profile arm needs it), profile feedback off (the check may be turned off alone)
    assert ar.settings_problem(strategy="linear") is None
    assert ar.settings_problem(strategy="best-of-n") == "strategy best-of-n needs samples (--samples) of at least 2, not 1"
    assert ar.settings_problem(profile_feedback=True) is None and ar.settings_problem(executed_check=False) is None
    assert ar.settings_problem(context="none", context_tokens=0) is None  # the none arm needs no budget


@pytest.mark.parametrize("kw,problem", [
    (dict(arch="sm_80"), "unknown arch 'sm_80'; choose one of sm_90a, sm_100a"),
    (dict(lang="triton"), "unknown language 'triton'; choose cuda or ptx"),
    (dict(context="all"), "unknown context mode 'all'; choose one of none, docs, docs+headers, full, docs+example"),
    (dict(samples=0), "samples (--samples) must be at least 1, not 0"),
    (dict(strategy="beam"), "unknown strategy 'beam'; choose one of linear, best-of-n, evolve"),
    (dict(strategy="best-of-n", samples=1), "strategy best-of-n needs samples (--samples) of at least 2, not 1"),
    (dict(strategy="linear", samples=2),
     "strategy linear drafts one candidate a turn; samples 2 is best-of-n (--strategy best-of-n)"),
    (dict(population=0), "population (--population) must be at least 1, not 0"),
    (dict(profile_feedback=True, executed_check=False),
     "profile feedback (--profile-feedback on) needs the executed check, which collects the profile; drop "
     "--no-executed (executed_check = false in a sweep) or turn profile feedback off"),
    (dict(context_tokens=-1), "context_tokens (--context-tokens) must be >= 0, not -1"),
    (dict(context_tokens=0),
     "context 'docs' with context_tokens (--context-tokens) 0 gives no docs at all; use context none"),
    (dict(lang="ptx", context="docs+headers"),
     "context 'docs+headers' adds the C++ helper-header API, which a --lang ptx solution cannot include; use "
     "context docs (or docs+example) for PTX"),
    (dict(lang="ptx", context="full"),
     "context 'full' adds the C++ helper-header API, which a --lang ptx solution cannot include; use context "
     "docs (or docs+example) for PTX"),
    (dict(history="none"), "unknown history policy 'none' (--history); choose one of full, latest"),
    (dict(require="maybe"), "unknown require setting 'maybe' (--require); choose one of on, off"),
    (dict(hints=["nope"]), None),  # the retriever's own message (below)
    (dict(context_turn_tokens=-1), "context_turn_tokens (--context-turn-tokens) must be >= 0, not -1"),
    (dict(model_params={"seed": 1}), "model parameter 'seed' cannot be set: use --seed (it varies per turn and sample)"),
    (dict(model_params={"temperature": 0.5}, temperature=0.7),
     "temperature is given twice (--temperature and --model-param temperature=...): give it once"),
    (dict(temperature=-0.1), "temperature (--temperature) must be >= 0, not -0.1"),
    (dict(temperature=math.nan), "temperature (--temperature) must be >= 0, not nan"),
    (dict(temperature=math.inf), "temperature (--temperature) must be >= 0, not inf"),
    (dict(budget=Budget(max_turns=0)), "max_turns (--max-turns) must be at least 1, not 0"),
    (dict(budget=Budget(max_tokens=0)), "max_tokens (--max-tokens) must be positive, not 0"),
    (dict(budget=Budget(max_cost=-1.0)), "max_cost (--max-cost) must be positive, not -1.0"),
    (dict(budget=Budget(max_cost=math.inf)), "max_cost (--max-cost) must be positive, not inf"),
    (dict(budget=Budget(max_time_s=0.0)), "max_time_s (--max-time) must be positive, not 0.0"),
    (dict(model_options={"retries": 1, "zzz": 2}),
     "unknown model option 'retries'; known: max_retries, retry_base_s, retry_max_s, timeout_s"),
    (dict(model_options={"max_retries": -1}), "max_retries (--max-retries) must be >= 0, not -1"),
    (dict(model_options={"retry_base_s": math.nan}), "retry_base_s (--retry-wait) must be >= 0, not nan"),
    (dict(model_options={"retry_max_s": "5"}), "retry_max_s must be >= 0, not 5"),
    (dict(model_options={"timeout_s": 0}), "timeout_s (--request-timeout) must be positive, not 0"),
])
def test_each_setting_is_refused_in_one_line_naming_it(kw, problem):
    got = ar.settings_problem(**kw)
    if problem is None:
        from knowledge.retriever import hint_problem

        problem = hint_problem(kw["hints"], "sm_90a")
        assert problem and "nope" in problem
    assert got == problem


@pytest.mark.parametrize("kw", [
    dict(samples=1), dict(samples=2), dict(strategy="best-of-n", samples=2), dict(strategy="linear", samples=1),
    dict(strategy="evolve", samples=1), dict(population=1), dict(context_tokens=1), dict(context_turn_tokens=0),
    dict(lang="ptx", context="docs"), dict(lang="ptx", context="docs+example"), dict(lang="ptx", context="none",
                                                                                   context_tokens=0),
    dict(profile_feedback=True, executed_check=True), dict(profile_feedback=False, executed_check=False),
    dict(temperature=0.0), dict(budget=Budget(max_turns=1, max_tokens=1, max_cost=0.01, max_time_s=0.5)),
    dict(model_options={"max_retries": 0, "retry_base_s": 0.0, "retry_max_s": 0, "timeout_s": 0.1}),
    dict(arch="sm_100a"), dict(history="latest"), dict(require="off"), dict(model_params={"top_p": 0.9}),
])
def test_the_first_value_past_each_boundary_is_accepted(kw):
    assert ar.settings_problem(**kw) is None


def test_a_known_hint_is_checked_against_the_arch():
    from knowledge.retriever import load_hints

    name, hint = next(iter(load_hints().items()))
    assert ar.settings_problem(arch=hint.arches[0], hints=[name]) is None
    assert ar.settings_problem(arch=hint.arches[0], hints=[name, name]) == "a hint is named twice (--hint)"


def test_samples_alone_imply_best_of_n():
    assert [ar.implied_strategy(n) for n in (1, 2, 5)] == ["linear", "best-of-n", "best-of-n"]


# ---------------------------------------------------------------------------------------
# run_id_problem
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("run_id", ["", "/abs", "a//b", "a/./b", "..", "a/..", "a\\b", "a/"])
def test_a_run_id_stays_under_the_runs_dir(run_id):
    assert ar.run_id_problem(run_id) == (
        f"--run-id {run_id!r} must name a folder under --runs-dir: no leading '/', no '.' or '..' parts, no empty parts")


@pytest.mark.parametrize("run_id", ["a\nb", "a\tb", "a\x1bb", "a\x7fb", "a\x00"])
def test_a_run_id_holds_no_control_character(run_id):
    assert ar.run_id_problem(run_id) == (f"--run-id {run_id!r} holds a control character (a newline, tab or "
                                          "escape); use printable characters")


def test_a_run_id_part_fits_a_folder_name():
    """200 bytes a part: file systems allow 255, and the run folder gets suffixes ("<id>.lock")."""
    assert ar.MAX_RUN_ID_PART == 200
    assert ar.run_id_problem("a" * 200 + "/" + "é" * 100) is None  # 200 bytes each
    for long in ("a" * 201, "x/" + "é" * 100 + "a"):
        assert ar.run_id_problem(long) == "--run-id is too long: at most 200 bytes between slashes (file systems allow 255)"
    assert ar.run_id_problem("sweep/gemm/model-1 turn~2") is None and ar.run_id_problem("a ") is None


def test_a_scripted_or_replayed_model_resumes_from_any_folder(tmp_path):
    assert ar.anchor_spec("replay:runs/x", tmp_path) == f"replay:{(tmp_path / 'runs/x').resolve()}"
    assert ar.anchor_spec("scripted:s.py", tmp_path / "a") == f"scripted:{(tmp_path / 'a/s.py').resolve()}"
    assert ar.anchor_spec("replay:/abs/run", tmp_path) == "replay:/abs/run"
    assert ar.anchor_spec("scripted:/abs/../s.py", tmp_path) == "scripted:/abs/../s.py"  # absolute: as typed
    assert ar.anchor_spec("openai/replay:x", tmp_path) == "openai/replay:x"


# ---------------------------------------------------------------------------------------
# The resume rules
# ---------------------------------------------------------------------------------------
def config(**kw) -> RunConfig:
    base = dict(run_id="r1", task="gemm_n7168_k5120", model="scripted:x", prompt_version=prompts.PROMPT_VERSION,
                template_hash=feedback_catalogue.asked_hash(), task_hash=ar.task_hash(ar._get_task("gemm_n7168_k5120")),
                knowledge_version=None)
    return RunConfig(**{**base, **kw})


def judged(run_dir: Path) -> Path:
    (run_dir / "candidates" / "1-0").mkdir(parents=True)
    (run_dir / "candidates" / "1-0" / "eval.json").write_text("{}")
    return run_dir


def test_a_gpu_run_goes_on_only_on_its_gpu():
    h200 = config(gpu="NVIDIA H200")
    assert ar.gpu_change(h200, "NVIDIA H200") is None
    assert ar.gpu_change(h200, "NVIDIA B200") == (
        "run r1 was judged on NVIDIA H200; this machine's GPU is NVIDIA B200: resume it where it ran, or start a new run here")
    assert ar.gpu_change(h200, None) == ("run r1 was judged on NVIDIA H200; this machine has no GPU (its candidates "
                                         "would go unjudged): resume it where it ran, or start a new run here")
    assert ar.gpu_change(h200, "unavailable: worker failed") is None  # a worker fault: infra_error as before
    for then in (None, "unavailable: no driver"):  # never judged on a GPU: goes on anywhere
        assert ar.gpu_change(config(gpu=then), "NVIDIA B200") is None and ar.gpu_change(config(gpu=then), None) is None


def test_the_judges_are_the_compilers_the_rules_and_on_a_gpu_torch():
    versions = {"nvrtc": "13.0.88", "ptxas": "13.0.88", "cuobjdump": "13.2", "torch": "2.11", "litellm": "1.1",
                "rules": "2026-12-03"}
    assert ar.COMPILERS == ("nvrtc", "ptxas") and ar.RULES == "rules"
    assert ar.judged_by(config(tool_versions=versions)) == {"nvrtc": "13.0.88", "ptxas": "13.0.88", "rules": "2026-12-03"}
    assert ar.judged_by(config(tool_versions=versions, gpu="NVIDIA H200")) == {
        "nvrtc": "13.0.88", "ptxas": "13.0.88", "torch": "2.11", "rules": "2026-12-03"}
    # a worker that never started judged nothing with torch
    assert "torch" not in ar.judged_by(config(tool_versions=versions, gpu="unavailable: x"))
    assert ar.judged_by(config(tool_versions={"ptxas": "13.0.88"})) == {"ptxas": "13.0.88", "rules": "unversioned"}


def test_a_judged_run_goes_on_only_with_its_toolchain(tmp_path, monkeypatch):
    now = {"nvrtc": "13.0.88", "ptxas": "13.0.88", "cuobjdump": "13.2", "rules": "2026-12-03", "torch": "2.13"}
    monkeypatch.setattr(ar, "tool_versions", lambda: dict(now))
    then = {**now, "cuobjdump": "13.0", "torch": "2.11"}  # disassemblers and, off a GPU, torch judge nothing
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert ar.toolchain_change(config(tool_versions={**then, "ptxas": "12.8"}), run_dir) is None  # no verdict yet
    judged(run_dir)
    assert ar.toolchain_change(config(tool_versions=then), run_dir) is None
    assert ar.toolchain_change(config(tool_versions={}), run_dir) is None  # recorded before versions were
    assert ar.toolchain_change(config(tool_versions={**then, "ptxas": "12.8", "rules": "2026-11-30"}), run_dir) == (
        f"run {run_dir} was judged with ptxas 12.8, rules 2026-11-30; this machine has ptxas 13.0.88, rules "
        f"2026-12-03: its next candidates would be judged by another toolchain or rules; start a new run (agent "
        f"solve --task gemm_n7168_k5120 ...), or resume it where those tools are (agent doctor lists them)")
    on_gpu = config(tool_versions=then, gpu="NVIDIA H200", task_requested="gemm")
    assert "torch 2.11" in ar.toolchain_change(on_gpu, run_dir) and "--task gemm ..." in ar.toolchain_change(on_gpu, run_dir)
    # a run recorded before the rules had a version is judged by today's rules only if they say "unversioned"
    assert "rules unversioned" in ar.toolchain_change(config(tool_versions={"ptxas": "13.0.88"}), run_dir)
    # a tool missing now judges nothing here (its absence stops the run with infra_error)
    monkeypatch.setattr(ar, "tool_versions", lambda: {"rules": "2026-12-03"})
    assert ar.toolchain_change(config(tool_versions={**then, "ptxas": "12.8"}), run_dir) is None


def test_a_resumed_run_records_the_toolchain_that_judged_it(tmp_path, monkeypatch):
    now = {"ptxas": "13.0.88", "torch": "2.13"}
    monkeypatch.setattr(ar, "tool_versions", lambda: dict(now))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert ar.recorded_toolchain(config(tool_versions={"ptxas": "12.8"}), run_dir) == now  # no verdict: today's
    judged(run_dir)
    assert ar.recorded_toolchain(config(tool_versions={}), run_dir) == {}  # unknown stays unknown
    assert ar.recorded_toolchain(config(tool_versions={"ptxas": "13.0.88", "torch": "2.11"}), run_dir) == {
        "ptxas": "13.0.88", "torch": "2.11"}
    assert ar.recorded_toolchain(config(tool_versions={"ptxas": "13.0.88", "toolchain": "unavailable: x"}), run_dir) \
        == {"ptxas": "13.0.88", "torch": "2.13"}  # found now: the old "unavailable" note goes
    now["toolchain"] = "unavailable: y"
    assert ar.recorded_toolchain(config(tool_versions={"toolchain": "unavailable: x"}), run_dir)["toolchain"] == \
        "unavailable: x"


def test_a_run_goes_on_only_with_its_prompts_task_and_docs(tmp_path, monkeypatch):
    monkeypatch.setattr(ar, "tool_versions", lambda: {})
    run_dir = tmp_path / "run"
    afresh = ("start a new run (agent solve --task gemm_n7168_k5120 ...), or resume it from a checkout with the "
              "files it ran with")
    assert ar.inputs_change(config(), run_dir) is None
    here = f"{prompts.PROMPT_VERSION} {feedback_catalogue.asked_hash()[:12]}"
    assert ar.inputs_change(config(template_hash=""), run_dir) == (
        f"run {run_dir} records no prompt template hash, so which prompts its turns were asked with cannot be "
        f"checked against this checkout's ({here}); {afresh}")
    assert ar.inputs_change(config(template_hash="ab" * 32), run_dir) == (
        f"run {run_dir} was asked with prompt templates {prompts.PROMPT_VERSION} {'ab' * 6}; this checkout's are "
        f"{here} (agent/prompts/, the credit rules, the feedback's wording in agent/feedback.py): its next turns "
        f"would be asked with other prompts; {afresh}")
    assert ar.inputs_change(config(prompt_version="v0"), run_dir).startswith(
        f"run {run_dir} was asked with prompt templates v0 ")
    changed = ar.inputs_change(config(task_hash="cd" * 32, task_requested="gemm"), run_dir)
    assert changed == (
        f"run {run_dir} was judged on task gemm_n7168_k5120 as defined then ({'cd' * 6}); this checkout defines it "
        f"otherwise ({config().task_hash[:12]}: workloads, tolerance, reference or requested instructions, tasks/): "
        f"its next turns would be judged on another task; start a new run (agent solve --task gemm ...), or resume "
        f"it from a checkout with the files it ran with")
    assert ar.inputs_change(config(task_hash=None), run_dir) is None  # recorded before configs held it
    gone = ar.inputs_change(config(task="no_such_task", task_hash="ef" * 32), run_dir)
    assert gone.startswith(f"run {run_dir}: ") and "no_such_task" in gone and gone.endswith(afresh.replace(
        "gemm_n7168_k5120", "no_such_task"))
    # the docs: checked for an arm that reads them, when the config recorded their version
    from knowledge.retriever import knowledge_version

    assert ar.inputs_change(config(context="docs", knowledge_version=knowledge_version()), run_dir) is None
    assert ar.inputs_change(config(context="none", knowledge_version="00" * 32), run_dir) is None
    assert ar.inputs_change(config(context="docs", knowledge_version=None), run_dir) is None
    assert ar.inputs_change(config(context="docs", knowledge_version="00" * 32), run_dir) == (
        f"run {run_dir} retrieved from docs version {'00' * 6}; this checkout's docs (knowledge/docs, examples, "
        f"include) are {knowledge_version()[:12]}: its next turns would read other docs under the same context "
        f"arm; {afresh}")
    monkeypatch.setattr(ar, "_knowledge_version", lambda: None)
    assert "docs (knowledge/docs, examples, include) are unavailable: " in ar.inputs_change(
        config(context="full", knowledge_version="00" * 32), run_dir)
    # then the toolchain
    monkeypatch.setattr(ar, "toolchain_change", lambda c, d: f"toolchain differs for {d}")
    assert ar.inputs_change(config(), run_dir) == f"toolchain differs for {run_dir}"


def test_the_task_hash_is_the_whole_definition():
    """Any change to a definition (a workload, a tolerance) is another task: its runs are not pooled."""
    task = ar._get_task("gemm_n7168_k5120")
    h = ar.task_hash(task)
    assert len(h) == 64 and h == ar.task_hash(ar._get_task("gemm_n7168_k5120"))
    assert ar.task_hash(task.model_copy(update={"tolerance": task.tolerance.model_copy(update={"rtol": 0.02})})) != h
    assert ar.task_hash(task.model_copy(update={"workloads": task.workloads[:-1]})) != h
    import hashlib

    assert h == hashlib.sha256(task.model_dump_json().encode()).hexdigest()
