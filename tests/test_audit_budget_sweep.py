"""Audit: the budget and the sweep's checks before any run, against a real local OpenAI server.

1. A model litellm has no price for (a self-hosted vLLM/Ollama model) cost "None" a call, summed
   as $0: --max-cost never held, and the summary said $0.0000. A cost cap on such a model is
   refused up front unless its price is given (model parameter cost_per_mtok), and an unknown
   cost is recorded as unknown (null), never as $0.
2. A sweep ran a `replay:<run>` model recorded on another task and reported the replayed replies
   as that model's results on the sweep's task. It is refused before any run starts (agent
   solve too).
3. The sweep's model probe sent neither the model parameters nor the temperature: a provider
   that refuses the temperature passed the probe, then every run stopped at turn 1 with
   bad_request. The probe now sends what a run's first call sends.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from agent_loop_helpers import cpu_only  # noqa: F401  (autouse fixture)
from agent_loop_helpers import GEMM_TASK, NO_CODE, agent_cli, cli_env, write_script
from openai_server import OpenAIServer as S
from openai_server import openai_server  # noqa: F401  (the fixture)

from agent.trajectory import read_summary


def _one_line_error(p: subprocess.CompletedProcess, *words: str) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    message = " ".join(p.stderr.split())
    assert message.startswith("error:") and "Traceback" not in p.stderr, p.stderr
    for w in words:
        assert w in message, (w, message)
    return message


def _solve(server, tmp_path, *args: str, run_id: str = "t") -> subprocess.CompletedProcess:
    return agent_cli("solve", "--task", GEMM_TASK, "--model", "openai/test-model", "--api-base", server.base_url,
                     "--context", "none", "--runs-dir", str(tmp_path), "--run-id", run_id, "--no-executed", *args)


def _sweep(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    (tmp_path / "s.toml").write_text(body)
    return subprocess.run([sys.executable, "-m", "agent.cli", "sweep", "s.toml", "--json"], cwd=tmp_path,
                          env=cli_env(), capture_output=True, text=True, timeout=300)


# ---- 1. a cost cap on a model without a price ---------------------------------------------------
def test_max_cost_on_a_model_without_a_price_is_refused_before_any_call(openai_server, tmp_path):
    p = _solve(openai_server, tmp_path, "--max-cost", "0.01", "--max-turns", "3")
    _one_line_error(p, "--max-cost", "no price", "cost_per_mtok")
    assert openai_server.requests == [] and not (tmp_path / "t").exists()


def test_max_cost_holds_once_the_price_is_given(openai_server, tmp_path):
    """10 prompt + 5 completion tokens a call at $1000 per million each: $0.015 a turn, over a $0.01 cap."""
    openai_server.default = S.ok(NO_CODE, usage=(10, 5))
    p = _solve(openai_server, tmp_path, "--max-cost", "0.01", "--max-turns", "3",
               "--model-param", "cost_per_mtok=[1000, 1000]")
    summary = read_summary(tmp_path / "t")
    assert summary.stop_reason == "max_cost", (p.stderr[-2000:], summary.stop_reason)
    assert summary.usage.cost_usd == pytest.approx(0.015) and summary.turns == 1
    assert all("cost_per_mtok" not in r.body for r in openai_server.requests)  # ptxbench's side only


def test_an_unpriced_run_records_its_cost_as_unknown_not_zero(openai_server, tmp_path):
    openai_server.default = S.ok(NO_CODE)
    p = _solve(openai_server, tmp_path, "--max-turns", "1")
    assert p.returncode in (0, 1), p.stderr[-2000:]
    summary = json.loads((tmp_path / "t" / "summary.json").read_text())
    assert summary["usage"]["cost_usd"] is None, summary["usage"]
    assert "$0.0000" not in p.stdout and "cost unknown" in p.stdout, p.stdout


def test_a_sweep_with_a_cost_cap_refuses_an_unpriced_model_before_any_run(openai_server, tmp_path):
    body = (f'name = "s"\nmodels = [{{spec = "openai/test-model", api_base = "{openai_server.base_url}"}}]\n'
            f'tasks = ["gemm"]\ncontexts = ["none"]\nexecuted_check = false\ncheck_models = false\n'
            f'[budget]\nmax_turns = 2\nmax_cost = 0.01\n')
    _one_line_error(_sweep(tmp_path, body), "--max-cost", "no price")
    assert openai_server.requests == [] and not (tmp_path / "runs" / "s" / "openai-test-model").exists()


def test_an_unknown_cost_stops_a_capped_run_instead_of_counting_as_zero():
    """Belt and braces for a cap that got past the check (a run recorded before it): unknown is not under."""
    from agent.budget import Spent, exhausted
    from agent.trajectory import Budget

    spent = Spent(turns=1)
    spent.add_cost(0.001)
    spent.add_cost(None)
    assert spent.cost_usd is None
    reason, detail = exhausted(Budget(max_turns=5, max_cost=1.0), spent)
    assert reason == "max_cost" and "unknown" in detail
    assert exhausted(Budget(max_turns=5), spent) is None


# ---- 2. a replay recorded on another task -------------------------------------------------------
@pytest.fixture(scope="module")
def attn_recording(tmp_path_factory):
    """A real one-turn run of attn_fwd with a scripted model: what `replay:` reads."""
    d = tmp_path_factory.mktemp("rec")
    model = write_script(d / "s.json", [NO_CODE])
    p = agent_cli("solve", "--task", "attn_fwd", "--model", model, "--max-turns", "1", "--context", "none",
                  "--runs-dir", str(d), "--run-id", "rec", "--no-executed", "--quiet")
    assert (d / "rec" / "events.jsonl").exists(), p.stderr[-2000:]
    return d / "rec"


def test_a_sweep_refuses_a_replay_recorded_on_another_task(attn_recording, tmp_path):
    body = (f'name = "s"\nmodels = ["replay:{attn_recording}"]\ntasks = ["gemm"]\ncontexts = ["none"]\n'
            f'executed_check = false\n[budget]\nmax_turns = 1\n')
    _one_line_error(_sweep(tmp_path, body), "replay", "mha_fwd", GEMM_TASK)
    assert not (tmp_path / "runs" / "s").exists(), "refused after a run started"


def test_a_sweep_runs_a_replay_on_its_own_task(attn_recording, tmp_path):
    body = (f'name = "s"\nmodels = ["replay:{attn_recording}"]\ntasks = ["attn_fwd"]\ncontexts = ["none"]\n'
            f'executed_check = false\n[budget]\nmax_turns = 1\n')
    p = _sweep(tmp_path, body)
    assert json.loads(p.stdout)["ran"] == 1, p.stderr[-2000:]


def test_solve_refuses_a_replay_recorded_on_another_task(attn_recording, tmp_path):
    p = agent_cli("solve", "--task", "gemm", "--model", f"replay:{attn_recording}", "--max-turns", "1",
                  "--context", "none", "--runs-dir", str(tmp_path), "--run-id", "t", "--quiet")
    _one_line_error(p, "mha_fwd", GEMM_TASK, "agent eval")
    assert not (tmp_path / "t").exists()


# ---- 3. the probe sends what a run sends --------------------------------------------------------
def _probe_sweep(server, extra: str = "") -> str:
    return (f'name = "s"\ntasks = ["gemm"]\ncontexts = ["none"]\nexecuted_check = false\ntemperature = 0.2\n'
            f'seed = 5\n{extra}\n'
            f'[[models]]\nspec = "openai/test-model"\napi_base = "{server.base_url}"\n'
            f'params = {{top_p = 0.9, reasoning_effort = "high"}}\n[budget]\nmax_turns = 1\n')


def test_the_probe_fails_a_sweep_whose_temperature_the_provider_refuses(openai_server, tmp_path):
    openai_server.refuse_params = ("temperature",)
    p = _sweep(tmp_path, _probe_sweep(openai_server))
    _one_line_error(p, "test request failed", "temperature")
    assert not (tmp_path / "runs" / "s" / "openai-test-model").exists(), "runs started after a passing probe"


def test_the_probe_sends_the_same_parameters_as_the_runs_first_call(openai_server, tmp_path):
    openai_server.default = S.ok(NO_CODE)
    p = _sweep(tmp_path, _probe_sweep(openai_server))
    assert json.loads(p.stdout)["ran"] == 1, p.stderr[-2000:]
    probe, first = openai_server.requests[:2]
    assert len(openai_server.requests) == 2
    keys = lambda r: {k: v for k, v in r.body.items() if k != "messages"}  # noqa: E731
    assert keys(probe) == keys(first), (keys(probe), keys(first))
    assert (first.body["temperature"], first.body["top_p"], first.body["reasoning_effort"]) == (0.2, 0.9, "high")


# ---- a replay model swapped for another recording under the same name ---------------------------
def test_a_replay_model_pointed_at_another_recording_is_not_taken_for_the_first(tmp_path):
    """Sweep runs are all named r0: two recordings of the same cell under different models differ
    only in their folders. Pointing a replay model at the other one must not reuse the first's runs."""
    rec = tmp_path / "rec"
    for model, replies in (("a", [NO_CODE]), ("b", [NO_CODE, NO_CODE])):
        p = agent_cli("solve", "--task", "attn_fwd", "--model", write_script(tmp_path / f"{model}.json", replies),
                      "--max-turns", "1", "--context", "none", "--runs-dir", str(rec), "--run-id", f"{model}/r0",
                      "--no-executed", "--quiet")
        assert (rec / model / "r0" / "events.jsonl").exists(), p.stderr[-2000:]
    sweep = ('name = "s"\nmodels = [{{spec = "replay:{}", name = "rep"}}]\ntasks = ["attn_fwd"]\n'
             'contexts = ["none"]\nexecuted_check = false\n[budget]\nmax_turns = 1\n')
    first = _sweep(tmp_path, sweep.format(rec / "a" / "r0"))
    assert json.loads(first.stdout)["ran"] == 1, first.stderr[-2000:]
    _one_line_error(_sweep(tmp_path, sweep.format(rec / "b" / "r0")), "rep", "recorded with spec")
    # the same recording moved elsewhere is the same model: its runs are reused
    moved = tmp_path / "moved"
    (rec / "a").rename(moved)
    again = _sweep(tmp_path, sweep.format(moved / "r0"))
    assert json.loads(again.stdout)["skipped"] == 1, again.stderr[-2000:]


# ---- the counts of an interrupted sweep ---------------------------------------------------------
def test_an_interrupted_sweep_counts_only_the_runs_it_ran(tmp_path):
    """Ctrl-C after the first of three runs (concurrency 1): `ran` and `resumed` count the runs that
    started now, not the ones left unstarted (the CLI printed "3 run now" beside "2 not started")."""
    from agent.sweep import load_sweep_config, run_sweep

    write_script(tmp_path / "prose.json", [NO_CODE])
    (tmp_path / "sweep.toml").write_text(
        'name = "s"\nmodels = [{spec = "scripted:prose.json", name = "prose"}]\ntasks = ["gemm"]\n'
        'contexts = ["none"]\nreplicas = 3\nconcurrency = 1\nexecuted_check = false\n[budget]\nmax_turns = 1\n')
    cfg = load_sweep_config(tmp_path / "sweep.toml", runs_dir=str(tmp_path / "runs"))

    seen = []

    def progress(o, n, total):
        seen.append(o)
        if len(seen) == 1:
            raise KeyboardInterrupt

    result = run_sweep(cfg, progress=progress)
    assert result.interrupted and len(result.outcomes) < 3
    assert result.ran == len(result.outcomes) and result.ran + result.skipped <= result.total, result
    assert result.resumed == 0


def test_a_replay_of_an_unpriced_run_takes_a_price_for_its_cost_cap(openai_server, tmp_path):
    """The refusal's advice works for a replay too: its recorded tokens priced at the given price."""
    openai_server.default = S.ok(NO_CODE, usage=(10, 5))
    _solve(openai_server, tmp_path, "--max-turns", "1", run_id="rec")
    replay = ("solve", "--task", GEMM_TASK, "--model", f"replay:{tmp_path / 'rec'}", "--context", "none",
              "--runs-dir", str(tmp_path), "--no-executed", "--max-turns", "1", "--max-cost", "0.01")
    _one_line_error(agent_cli(*replay, "--run-id", "a"), "no price", "cost_per_mtok")
    agent_cli(*replay, "--run-id", "b", "--model-param", "cost_per_mtok=[1000, 1000]")
    summary = read_summary(tmp_path / "b")
    assert summary.usage.cost_usd == pytest.approx(0.015) and summary.stop_reason == "max_turns"
