"""agent sweep: grid expansion, deterministic run ids, resumability, local and Ray executors
giving the same per-run verdicts. Two scripted models x two tasks x context none/docs x 2
replicas, with real NVRTC + ptxas + cuobjdump (CPU: compile + inspect verdicts)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from agent_loop_helpers import NO_CODE, broken_probe_reply, probe_reply

from agent.sweep import SweepConfig, expand, load_sweep_config, run_state, run_sweep
from agent.trajectory import read_summary

GRID = """\
name = "smoke"
models = ["scripted:weak.json", {spec = "scripted:strong.json", name = "strong"}]
tasks = ["gemm", "attn_fwd"]
arches = ["sm_90a"]
contexts = ["none", "docs"]
replicas = 2
turn_limits = [1, 2]
concurrency = 4
runs_dir = "runs"

[budget]
max_turns = 2
"""


def _write_grid(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    # weak: a compile error, then the fix; strong: right at once, then a reply without code.
    (d / "weak.json").write_text(json.dumps({"replies": [broken_probe_reply(), probe_reply()]}))
    (d / "strong.json").write_text(json.dumps({"replies": [probe_reply(), NO_CODE]}))
    (d / "sweep.toml").write_text(GRID)
    return d / "sweep.toml"


def _agent(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory):
    """The grid run once with the local executor through the CLI."""
    d = tmp_path_factory.mktemp("sweep")
    _write_grid(d)
    proc = _agent("sweep", "sweep.toml", "--json", cwd=d)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return d, json.loads(proc.stdout)


def test_grid_expands_to_deterministic_ids(tmp_path):
    cfg = load_sweep_config(_write_grid(tmp_path))
    runs = expand(cfg)
    assert len(runs) == 2 * 2 * 1 * 2 * 2
    assert runs[0].run_id == "smoke/scripted-weak/gemm_n7168_k5120/sm_90a/none/r0"
    assert runs[-1].run_id == "smoke/strong/mha_fwd_d128/sm_90a/docs/r1"
    assert [r.run_id for r in expand(load_sweep_config(tmp_path / "sweep.toml"))] == [r.run_id for r in runs]
    # Script paths are anchored at the config file; replica k runs with seed k.
    assert runs[0].model.spec == f"scripted:{tmp_path / 'weak.json'}"
    assert [r.request(cfg, tmp_path).seed for r in runs[:2]] == [0, 1]
    # YAML says the same.
    (tmp_path / "s.yaml").write_text("name: y\nmodels: [openai/gpt-4o]\ntasks: [gemm_n7168_k5120]\n"
                                     "contexts: [docs]\nbudget: {max_turns: 3}\n")
    y = load_sweep_config(tmp_path / "s.yaml")
    assert [r.run_id for r in expand(y)] == ["y/openai-gpt-4o/gemm_n7168_k5120/sm_90a/docs/r0"]
    assert y.budget.max_turns == 3


def test_a_model_can_be_bound_to_some_tasks():
    cfg = SweepConfig(name="x", tasks=["gemm", "attn_fwd"], contexts=["docs"], replicas=1,
                      models=[{"spec": "openai/a", "tasks": ["gemm"]}, "openai/b"])
    assert sorted(r.run_id for r in expand(cfg)) == ["x/openai-a/gemm_n7168_k5120/sm_90a/docs/r0",
                                                      "x/openai-b/gemm_n7168_k5120/sm_90a/docs/r0",
                                                      "x/openai-b/mha_fwd_d128/sm_90a/docs/r0"]
    with pytest.raises(ValueError, match="attn_bwd|mha_bwd"):  # a task the sweep does not run
        expand(SweepConfig(name="x", tasks=["gemm"], models=[{"spec": "openai/a", "tasks": ["attn_bwd"]}]))


def test_bad_configs_are_one_line_errors(tmp_path):
    with pytest.raises(ValueError, match="share the name"):
        SweepConfig(name="x", models=["openai/a", {"spec": "openai/b", "name": "openai-a"}], tasks=["gemm"])
    with pytest.raises(ValueError, match="unknown task|close"):
        expand(SweepConfig(name="x", models=["openai/a"], tasks=["gemmm"]))
    with pytest.raises(ValueError, match="twice"):
        expand(SweepConfig(name="x", models=["openai/a"], tasks=["gemm", "gemm_n7168_k5120"]))
    with pytest.raises(ValueError, match="profile"):  # the profile arm needs the executed check's pass
        SweepConfig(name="x", models=["openai/a"], tasks=["gemm"], profile_feedback=["off", "on"], executed_check=False)
    (tmp_path / "bad.toml").write_text('name = "x"\nmodels = ["openai/a"]\ntasks = ["nope"]\n')
    proc = _agent("sweep", "bad.toml", cwd=tmp_path)
    assert proc.returncode == 2 and "error:" in proc.stderr and "Traceback" not in proc.stderr
    (tmp_path / "bad2.toml").write_text('models = ["openai/a"]\ntasks = ["gemm"]\nreplicas = 0\n')
    proc = _agent("sweep", "bad2.toml", cwd=tmp_path)
    assert proc.returncode == 2 and "replicas" in proc.stderr and "Traceback" not in proc.stderr


def test_local_sweep_runs_every_cell(local_sweep):
    d, result = local_sweep
    assert (result["total"], result["ran"], result["skipped"], result["failed"]) == (16, 16, 0, 0)
    assert result["executor"].startswith("local: no GPU")
    by_id = {o["run_id"]: o for o in result["outcomes"]}
    for ctx in ("none", "docs"):
        for k in (0, 1):
            weak = by_id[f"smoke/scripted-weak/gemm_n7168_k5120/sm_90a/{ctx}/r{k}"]
            assert [v["outcome"] for v in weak["verdicts"]] == ["compile_error", "unverified"]
            strong = by_id[f"smoke/strong/gemm_n7168_k5120/sm_90a/{ctx}/r{k}"]
            assert [v["outcome"] for v in strong["verdicts"]] == ["unverified", "format_error"]
            assert by_id[f"smoke/scripted-weak/mha_fwd_d128/sm_90a/{ctx}/r{k}"]["verdicts"][0]["outcome"] \
                == "compile_error"
    # No GPU here: the runs say their evaluation was skipped, and nothing is called correct.
    gemm = [o for o in result["outcomes"] if "/gemm_n7168_k5120/" in o["run_id"]]
    assert all(o["evaluation"].startswith("skipped: no GPU") for o in gemm)
    assert not any(v["correct"] for o in result["outcomes"] for v in o["verdicts"])
    assert (d / "runs" / "smoke" / "sweep.json").exists()


def test_second_sweep_skips_finished_and_resumes_half_finished(local_sweep, tmp_path):
    d, first = local_sweep
    copy = tmp_path / "copy"
    shutil.copytree(d, copy)
    runs = copy / "runs"
    # One run killed just before its summary, one that says it was interrupted.
    a = runs / "smoke/scripted-weak/gemm_n7168_k5120/sm_90a/docs/r1"
    b = runs / "smoke/strong/mha_fwd_d128/sm_90a/none/r0"
    (a / "summary.json").unlink()
    s = json.loads((b / "summary.json").read_text())
    (b / "summary.json").write_text(json.dumps({**s, "status": "interrupted", "stop_reason": "interrupted"}))
    assert run_state(a) == run_state(b) == "partial"
    cfg = load_sweep_config(copy / "sweep.toml", runs_dir=str(runs))
    result = run_sweep(cfg)
    assert (result.ran, result.resumed, result.skipped) == (2, 2, 14)
    before = {o["run_id"]: o["verdicts"] for o in first["outcomes"]}
    for o in result.outcomes:
        assert o.verdicts == before[o.run_id], o.run_id
        assert o.status == ("finished" if o.state_before == "partial" else "skipped")
    assert read_summary(a).status == read_summary(b).status == "finished"


def test_ray_executor_gives_the_same_results(local_sweep, tmp_path):
    pytest.importorskip("ray")
    from agent.executors import RayExecutor

    d, local = local_sweep
    cfg = load_sweep_config(d / "sweep.toml", runs_dir=str(tmp_path / "runs"), executor="ray")
    executor = RayExecutor()  # a local Ray without GPUs: every evaluation ends in a compile + inspect CPU task
    try:
        assert executor.describe().startswith("ray: no GPU in the cluster")
        result = run_sweep(cfg, executor)
    finally:
        executor.close()
    assert (result.total, result.ran, result.failed) == (16, 16, 0)
    assert executor.stats().evaluations == 24 and executor.stats().on_gpu == 0  # 16 runs, 8 fixes: 24 candidates
    assert "ms/evaluation" in result.executor  # the driver's CPU per evaluation, reported
    assert {o.run_id: o.verdicts for o in result.outcomes} == {o["run_id"]: o["verdicts"] for o in local["outcomes"]}


def test_dry_run_lists_states(local_sweep):
    d, _ = local_sweep
    proc = _agent("sweep", "sweep.toml", "--dry-run", "--json", cwd=d)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["runs"]
    assert len(rows) == 16 and {r["state"] for r in rows} == {"done"}


@pytest.mark.parametrize("example", sorted((Path(__file__).parents[1] / "docs" / "examples").glob("sweep_*")))
def test_example_configs_expand(example):
    cfg = load_sweep_config(example)
    runs = expand(cfg)
    assert runs and len({r.run_id for r in runs}) == len(runs)
