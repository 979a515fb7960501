"""agent sweep, audited for results it could corrupt or lose when a sweep is run again into the
same folder: runs of a changed config taken for the new config's, and runs the model's provider
stopped that no command could finish. The real CLI, scripted replies, real NVRTC + ptxas."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agent_loop_helpers import probe_reply

from agent.trajectory import read_config, read_summary

REPO = Path(__file__).resolve().parents[1]
RUN = "one/scripted-good/gemm_n7168_k5120/sm_90a/none/r0"


def _config(extra: str = "", max_turns: int = 1) -> str:
    return (f'name = "one"\nmodels = ["scripted:good.json"]\ntasks = ["gemm"]\ncontexts = ["none"]\n'
            f'runs_dir = "runs"\n{extra}\n[budget]\nmax_turns = {max_turns}\n')


def _sweep(d: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent.cli", "sweep", "sweep.toml", *args], cwd=d,
                          capture_output=True, text=True, timeout=600)


def test_a_changed_setting_is_refused_not_taken_for_the_new_configs(tmp_path):
    """The run id names model, task, arch and context, not the language, budget, seed, samples or
    model parameters. Changed under the same sweep name, the finished runs were skipped as done and
    reported as the new config's (a CUDA run shown as the PTX experiment), half-finished ones resumed
    with their old settings."""
    (tmp_path / "good.json").write_text(json.dumps({"replies": [probe_reply()] * 4}))
    (tmp_path / "sweep.toml").write_text(_config())
    first = _sweep(tmp_path, "--json")
    assert first.returncode == 0, first.stderr[-2000:]
    assert read_config(tmp_path / "runs" / RUN).lang == "cuda"

    for extra, max_turns, named in (('lang = "ptx"', 1, "lang"), ("", 2, "budget"), ("seed = 7", 1, "seed"),
                                    ("temperature = 0.5", 1, "temperature"),
                                    ('models = [{spec = "scripted:good.json", params = {reasoning_effort = "high"}}]',
                                     1, "model_params")):
        text = _config(extra, max_turns)
        if extra.startswith("models"):
            text = text.replace('models = ["scripted:good.json"]\n', "")
        (tmp_path / "sweep.toml").write_text(text)
        for args in (("--dry-run",), ("--json",)):
            proc = _sweep(tmp_path, *args)
            assert proc.returncode == 2, (extra, max_turns, proc.stdout[-1500:], proc.stderr[-1500:])
            assert f"recorded with {named} = " in proc.stderr and "another `name`" in proc.stderr, proc.stderr
    # settings that do not change what a run measures are no reason to refuse
    (tmp_path / "sweep.toml").write_text(_config("concurrency = 2\nturn_limits = [1]\ncheck_models = false"))
    again = _sweep(tmp_path, "--json")
    assert again.returncode == 0, again.stderr[-2000:]
    assert (json.loads(again.stdout)["skipped"], json.loads(again.stdout)["ran"]) == (1, 0)


def test_retry_failed_finishes_a_run_its_provider_stopped(tmp_path):
    """The provider failed for good on turn 2 (here an auth error: a key revoked mid-sweep). The run
    ends `finished` with stop_reason model_error; the sweep says it did not succeed (exit 1, "--retry-failed
    redoes failed ones"), but --retry-failed only redid status `failed`: the run stayed one turn short for good, and
    the report counted it."""
    script = [probe_reply(), {"fault": "auth", "status": 401, "message": "key revoked"}, probe_reply()]
    (tmp_path / "good.json").write_text(json.dumps({"replies": script}))
    (tmp_path / "sweep.toml").write_text(_config(max_turns=2))
    first = _sweep(tmp_path, "--json")
    assert first.returncode == 1, first.stderr[-2000:]  # did not succeed
    run_dir = tmp_path / "runs" / RUN
    stopped = read_summary(run_dir)
    assert (stopped.status, stopped.stop_reason, stopped.turns) == ("finished", "model_error", 1)

    plain = _sweep(tmp_path, "--json")  # a plain re-run leaves ended runs alone, as documented
    assert json.loads(plain.stdout)["skipped"] == 1 and read_summary(run_dir).turns == 1

    retried = _sweep(tmp_path, "--retry-failed", "--json")
    assert retried.returncode == 0, retried.stderr[-2000:]
    result = json.loads(retried.stdout)
    assert (result["ran"], result["resumed"], result["succeeded"]) == (1, 1, 1)
    done = read_summary(run_dir)
    assert (done.status, done.stop_reason, done.turns) == ("finished", "max_turns", 2)
    assert [o["outcome"] for o in result["outcomes"][0]["verdicts"]] == ["unverified", "unverified"]
