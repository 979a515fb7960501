"""`agent solve`: settings that the run would not honour are refused up front, and what a run
records is what it did (real CLI in a subprocess, scripted replies, real ptxas, real SQLite)."""
from __future__ import annotations

import json

from agent_loop_helpers import cpu_only  # noqa: F401  (autouse fixture)
from agent_loop_helpers import GEMM_TASK, agent_cli, probe_reply, write_script
from openai_server import OpenAIServer as S
from openai_server import openai_server  # noqa: F401  (the fixture)

from agent.run import settings_problem
from agent.trajectory import read_events


def _one_line_error(p, *words):
    assert p.returncode == 2, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    message = " ".join(p.stderr.split())
    assert message.startswith("error:") and message.count("error:") == 1 and p.stdout == "", (p.stdout, p.stderr)
    for w in words:
        assert w in message, (w, message)


def test_profile_feedback_without_the_executed_check_is_refused(tmp_path):
    """The profile comes from the executed check's Nsight Compute pass: with --no-executed the
    model never sees one, yet the run would be recorded (config.json, summary.json, the sweep
    report's profile ablation) as profile feedback on."""
    model = write_script(tmp_path / "s.json", [probe_reply()])
    runs = tmp_path / "runs"
    p = agent_cli("solve", "--task", GEMM_TASK, "--model", model, "--max-turns", "1", "--context", "none",
                  "--profile-feedback", "on", "--no-executed", "--runs-dir", str(runs), "--quiet")
    _one_line_error(p, "--profile-feedback", "--no-executed")
    assert not runs.exists()
    assert settings_problem(profile_feedback=True, executed_check=False) is not None
    assert settings_problem(profile_feedback=True, executed_check=True) is None
    assert settings_problem(profile_feedback=False, executed_check=False) is None


def test_a_reply_with_a_lone_surrogate_is_recorded_and_judged(tmp_path, openai_server):
    """A server may send a JSON string escape that is half of a UTF-16 pair ("\\ud83d": an emoji
    cut in two); Python decodes it to a lone surrogate that no UTF-8 file can hold. The reply was
    paid for and is the model's data: it is recorded (reply.md, events.jsonl) and judged, not a
    ptxbench crash that loses it and asks the model again on every resume."""
    openai_server.push(S.ok("Plan \ud83d: four wgmmas.\n" + probe_reply()))
    runs = tmp_path / "runs"
    p = agent_cli("solve", "--task", GEMM_TASK, "--model", "openai/test-model", "--api-base", openai_server.base_url,
                  "--max-turns", "1", "--context", "none", "--runs-dir", str(runs), "--run-id", "r", "--quiet",
                  "--json")
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])
    s = json.loads(p.stdout)
    assert (s["status"], s["stop_reason"]) == ("finished", "max_turns")
    assert s["per_turn"][0]["candidates"][0]["outcome"] in ("unverified", "correct_with_arch")
    reply_md = (runs / "r" / "candidates" / "1-0" / "reply.md").read_text(encoding="utf-8")
    assert reply_md.startswith("Plan \ufffd: four wgmmas.") and probe_reply() in reply_md
    [response] = [e for e in read_events(runs / "r") if e["type"] == "llm_response"]
    assert response["text"] == reply_md


def test_a_kernel_that_writes_nan_is_judged_and_fed_back(tmp_path):
    """A wrong kernel whose every failing element is NaN has max_abs_err = inf (and `got` NaN).
    Its eval.json must read back as written: the feedback for the next turn, a resume, replay and
    Fixit all read it. Written as pydantic writes it (null for inf), it no longer validated, and
    the run ended `error` at the feedback. The GPU worker's verdict is the only stand-in: the real
    evaluator compiles and inspects here, and one failed visible workload is added to its result."""
    import math

    import tools.evaluator
    from agent.run import SolveRequest, solve
    from agent.trajectory import Budget
    from tools.results import EvalResult, Mismatch, WorkloadResult

    class GpuVerdict(tools.evaluator.Evaluator):
        def evaluate(self, *args, **kwargs):
            res = super().evaluate(*args, **kwargs)
            nan_out = Mismatch(output="C", max_abs_err=math.inf, max_rel_err=math.inf, mismatch_frac=1.0,
                               nan_count=7, got=math.nan, expected=0.5, passed=False)
            res.run_status, res.run_reason = "ok", None
            res.workloads = [WorkloadResult(workload="M8192", split="visible", axes={"M": 8192}, status="failed",
                                            reason="incorrect", outputs=[nan_out])]
            return res

    model = write_script(tmp_path / "s.json", [probe_reply(), probe_reply()])
    with GpuVerdict() as ev:
        s = solve(SolveRequest(task=GEMM_TASK, model=model, context="none", budget=Budget(max_turns=2),
                               runs_dir=tmp_path / "runs", run_id="r", executed_check=False), progress=False,
                  evaluator=ev)
    assert (s.status, s.stop_reason) == ("finished", "max_turns"), s.stop_detail
    assert [t.candidates[0].outcome for t in s.per_turn] == ["incorrect", "incorrect"]
    back = EvalResult.model_validate_json((tmp_path / "runs" / "r" / "candidates" / "1-0" / "eval.json").read_text())
    m = back.workloads[0].outputs[0]
    assert m.max_abs_err == math.inf and math.isnan(m.got) and m.nan_count == 7
    [feedback] = [e for e in read_events(tmp_path / "runs" / "r") if e["type"] == "feedback"]
    assert feedback["outcome"] == "incorrect"
