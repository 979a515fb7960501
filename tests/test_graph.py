"""The agent loop on CPU: real NVRTC/ptxas/cuobjdump, real SQLite checkpoints, a scripted model.

Without a GPU the loop compiles and inspects, says evaluation was skipped, and never calls
a candidate correct.
"""
from __future__ import annotations

import json

import pytest
from agent_loop_helpers import cpu_only  # noqa: F401  (autouse fixture)
from agent_loop_helpers import (BROKEN_LINE, GEMM_TASK, NO_CODE, broken_probe_reply, events, probe_reply,
                                simple_attn_bwd_reply, write_script)

from agent import feedback as fb
from agent.graph import build_graph, mermaid
from agent.run import SolveRequest, solve
from agent.trajectory import EVENT_TYPES, Budget, read_config, read_summary
from tools.results import CompileResult, Diagnostic, EvalResult, InspectResult, Mismatch, WorkloadResult


def run(tmp_path, task, replies, **kw):
    budget = Budget(**{k: kw.pop(k) for k in ("max_turns", "max_tokens", "max_cost", "max_time_s") if k in kw})
    model = write_script(tmp_path / "script.json", replies)
    summary = solve(SolveRequest(task=task, model=model, runs_dir=tmp_path / "runs", budget=budget, **kw),
                    progress=False)
    return summary, tmp_path / "runs" / summary.run_id


def requests(run_dir):
    return events(run_dir, "llm_request")


def test_mermaid_has_every_node_and_route():
    text = mermaid()
    for node in ("retrieve_context", "draft", "evaluate", "decide", "repair", "optimise", "__end__"):
        assert node in text
    assert "stop" in text and "decide -.-> repair" in text and "repair --> retrieve_context" in text
    assert build_graph().get_graph().draw_mermaid() == text


def test_compile_error_then_repair_then_success(tmp_path):
    summary, run_dir = run(tmp_path, GEMM_TASK, [broken_probe_reply(), probe_reply(), probe_reply()], max_turns=3)

    # Turn 1 failed to compile; the model was told where, with the line in its own file.
    [fb1] = [e for e in events(run_dir, "feedback") if e["turn"] == 1]
    assert fb1["kind"] == "repair" and fb1["outcome"] == "compile_error"
    assert "Compile: failed" in fb1["text"] and f"line {BROKEN_LINE}" in fb1["text"] and "flaot" in fb1["text"]
    turn2 = [r for r in requests(run_dir) if r["turn"] == 2][0]["messages"]
    assert turn2[-2]["role"] == "assistant" and "flaot d0" in turn2[-2]["content"]
    # new docs first, the feedback last: the message ends with the instruction and the turn budget
    assert turn2[-1]["role"] == "user" and turn2[-1]["content"].rstrip().endswith(fb1["text"].strip())
    assert fb1["text"].startswith("## Result of turn 1 of 3") and "This is turn 2 of 3" in fb1["text"]

    # Turn 2 compiled with wgmma + tma: the best so far, flagged unverified (no GPU), then optimise.
    assert summary.decisions == ["repair", "optimise", "stop"]
    assert summary.stop_reason == "max_turns" and summary.status == "finished" and summary.turns == 3
    assert [t.candidates[0].outcome for t in summary.per_turn] == ["compile_error", "unverified", "unverified"]
    assert summary.best_path == "candidates/2-0" and summary.best.verified is False
    assert summary.best.verdicts.compiled and summary.best.verdicts.arch_sass
    assert summary.best.verdicts.correct is None and summary.best.verdicts.correct_with_arch is None  # never "correct"
    assert summary.best_at(1) is None and summary.best_at(2).path == "candidates/2-0"
    assert summary.evaluation.startswith("skipped: no GPU")
    [fb2] = [e for e in events(run_dir, "feedback") if e["turn"] == 2]
    assert fb2["kind"] == "optimise" and "Correctness and timing: skipped" in fb2["text"]
    assert "`wgmma`: present in SASS" in fb2["text"] and "registers" in fb2["text"]
    assert "correctness is not known" in fb2["text"]

    # Every stage of every candidate is on disk and in the events.
    for t in (1, 2, 3):
        cdir = run_dir / "candidates" / f"{t}-0"
        assert (cdir / "reply.md").exists() and (cdir / "kernel.cu").exists() and (cdir / "launch.json").exists()
        assert EvalResult.model_validate_json((cdir / "eval.json").read_text()).task == GEMM_TASK
    kinds = [e["type"] for e in events(run_dir)]
    for kind in ("run_start", "retrieval", "llm_request", "llm_response", "compile", "inspect", "run", "candidate",
                 "decision", "feedback", "budget", "run_end"):
        assert kind in kinds, kind
    assert set(kinds) <= set(EVENT_TYPES)  # every event written is documented
    nodes = {(e["node"], e["phase"]) for e in events(run_dir, "node")}
    assert ("evaluate", "end") in nodes and ("optimise", "start") in nodes
    config = read_config(run_dir)
    assert len(config.template_hash) == 64 and config.tool_versions.get("ptxas")
    assert config.requested_features == ["wgmma", "tma"]
    assert read_summary(run_dir) == summary


def test_simt_kernel_gets_feedback_naming_missing_features(tmp_path):
    summary, run_dir = run(tmp_path, "attn_bwd", [simple_attn_bwd_reply(), NO_CODE], max_turns=2)
    assert summary.task == "mha_bwd_d128"  # the alias resolved
    first = summary.per_turn[0].candidates[0]
    assert first.outcome == "arch_missing" and first.verdicts.compiled and not first.verdicts.arch_sass
    [fb1] = [e for e in events(run_dir, "feedback") if e["turn"] == 1]
    assert "missing wgmma, tma" in fb1["text"]
    assert "`wgmma`: MISSING" in fb1["text"] and "`tma`: MISSING" in fb1["text"]
    assert "Correctness and timing: skipped" in fb1["text"] and "No GPU" in fb1["text"]
    assert summary.best is None  # a SIMT kernel is never the best for a wgmma + tma task
    # The no-code reply of turn 2 is a format error and still counts as a turn.
    assert summary.per_turn[1].candidates[0].outcome == "format_error" and summary.turns == 2


def test_reply_without_code_gets_format_feedback(tmp_path):
    summary, run_dir = run(tmp_path, GEMM_TASK, [NO_CODE, probe_reply()], max_turns=2, context="none")
    [fb1] = events(run_dir, "feedback")
    assert "could not be used" in fb1["text"] and "```cuda```" in fb1["text"] and "```json```" in fb1["text"]
    assert summary.decisions == ["repair", "stop"] and summary.best_path == "candidates/2-0"
    # --context none: nothing retrieved, nothing in the prompt.
    assert all(e["sections"] == [] for e in events(run_dir, "retrieval"))
    assert "Reference material" not in requests(run_dir)[0]["messages"][1]["content"]


def test_after_a_regression_the_model_is_pointed_to_its_best_kernel(tmp_path):
    summary, run_dir = run(tmp_path, GEMM_TASK, [probe_reply(), NO_CODE, NO_CODE], max_turns=3, context="none")
    fb1, fb2 = events(run_dir, "feedback")
    assert "best kernel so far" not in fb1["text"]
    assert "best kernel so far is the one from turn 1: unverified" in fb2["text"]
    assert summary.best_path == "candidates/1-0" and summary.decisions == ["optimise", "repair", "stop"]


def test_context_docs_records_the_sections_in_the_prompt(tmp_path):
    summary, run_dir = run(tmp_path, GEMM_TASK, [NO_CODE], max_turns=1, context="docs")
    [r] = events(run_dir, "retrieval")
    assert r["sections"] and r["new_sections"] == [s["id"] for s in r["sections"]]
    prompt = requests(run_dir)[0]["messages"][1]["content"]
    assert "Reference material" in prompt
    for s in r["sections"]:
        assert s["heading"] in prompt


def test_every_context_mode_reaches_the_prompt(tmp_path):
    tokens = {}
    for mode in ("none", "docs", "docs+headers", "full"):
        here = tmp_path / mode.replace("+", "_")
        here.mkdir()
        summary, run_dir = run(here, GEMM_TASK, [NO_CODE], max_turns=1, context=mode)
        [r] = events(run_dir, "retrieval")
        prompt = requests(run_dir)[0]["messages"][1]["content"]
        tokens[mode] = sum(sec["tokens"] for sec in r["sections"])
        if mode == "none":
            assert not r["sections"] and "Reference material" not in prompt
        else:
            assert r["sections"] and all(sec["heading"] in prompt for sec in r["sections"])
    assert tokens["full"] > tokens["docs"] > 0


@pytest.mark.parametrize("limit, expected_turns", [({"max_turns": 2}, 2), ({"max_tokens": 50}, 1),
                                                   ({"max_cost": 1.0}, 2), ({"max_time_s": 0.001}, 1)])
def test_budget_ends_the_run_cleanly(tmp_path, limit, expected_turns):
    replies = [{"text": NO_CODE, "usage": {"prompt_tokens": 40, "completion_tokens": 20, "cost_usd": 0.6}}] * 5
    summary, run_dir = run(tmp_path, GEMM_TASK, replies, context="none", **{"max_turns": 5, **limit})
    reason = next(iter(limit)).removesuffix("_s")
    assert summary.status == "finished" and summary.stop_reason == reason
    assert summary.turns == expected_turns and summary.usage.llm_calls == expected_turns
    assert summary.decisions[-1] == "stop" and len(summary.decisions) == expected_turns
    assert len(requests(run_dir)) == expected_turns


def test_best_of_n_evaluates_every_sample_and_continues_with_the_best(tmp_path):
    summary, run_dir = run(tmp_path, GEMM_TASK, [broken_probe_reply(), probe_reply(), NO_CODE, NO_CODE],
                           max_turns=2, samples=2, context="none")
    t1 = summary.per_turn[0]
    assert [c.outcome for c in t1.candidates] == ["compile_error", "unverified"] and t1.chosen == 1
    assert (run_dir / "candidates/1-0/eval.json").exists() and (run_dir / "candidates/1-1/eval.json").exists()
    turn2 = [r for r in requests(run_dir) if r["turn"] == 2]
    assert [r["sample"] for r in turn2] == [0, 1]
    assert "gemm_probe" in turn2[0]["messages"][-2]["content"] and "flaot" not in turn2[0]["messages"][-2]["content"]
    [fb1] = events(run_dir, "feedback")
    assert "Other samples this turn: 1-0 compile error" in fb1["text"]
    assert summary.best_path == "candidates/1-1"


def test_raw_ptx_solutions(tmp_path):
    from agent_loop_helpers import PROBE_CU, PROBE_MANIFEST, reply
    from tools.compile import compile_source

    ptx = compile_source(PROBE_CU, "cuda", "sm_90a").ptx  # what a model writing raw PTX would send
    summary, run_dir = run(tmp_path, GEMM_TASK, [reply(ptx, PROBE_MANIFEST, lang="ptx")], max_turns=1,
                           lang="ptx", context="none")
    system = requests(run_dir)[0]["messages"][0]["content"]
    assert "raw PTX" in system and "```ptx```" in system
    assert (run_dir / "candidates/1-0/kernel.ptx").exists()
    assert summary.per_turn[0].candidates[0].outcome == "unverified"
    assert read_config(run_dir).lang == "ptx"


def test_repair_starts_from_a_given_kernel_and_feedback(tmp_path):
    from agent.run import repair
    from agent.trajectory import RunConfig
    from tools.solution import extract_solution

    config = RunConfig(run_id="teacher/r/1-0", task=GEMM_TASK, model=write_script(tmp_path / "t.json", [probe_reply()]),
                       context="none", budget=Budget(max_turns=1))
    failed = extract_solution(broken_probe_reply())
    summary = repair(config, failed, "## Result of turn 1\nCompile: failed (flaot)\n", runs_dir=tmp_path, quiet=True)
    [req] = requests(tmp_path / "teacher/r/1-0")
    roles = [m["role"] for m in req["messages"]]
    assert roles == ["system", "user", "assistant", "user"] and "flaot d0" in req["messages"][2]["content"]
    assert req["messages"][3]["content"].startswith("## Result of turn 1")
    assert summary.best_path == "candidates/1-0" and summary.turns == 1


def test_wrong_manifest_is_caught_without_a_gpu(tmp_path):
    from agent_loop_helpers import PROBE_CU, PROBE_MANIFEST, reply

    manifest = {**PROBE_MANIFEST, "launches": [{**PROBE_MANIFEST["launches"][0], "args": ["tmA", "Cout"]}]}
    summary, run_dir = run(tmp_path, GEMM_TASK, [reply(PROBE_CU, manifest), NO_CODE], max_turns=2, context="none")
    first = summary.per_turn[0].candidates[0]
    assert first.outcome == "run_failed" and not first.verified and first.verdicts.correct is None
    [fb1] = events(run_dir, "feedback")
    assert "FAILED before running (the launch manifest is wrong)" in fb1["text"]
    assert "unknown name 'Cout'" in fb1["text"] and "held-out workloads (sizes not shown): 0 of 4 passed; failed: 4 manifest_error" in fb1["text"]
    assert "M4096" not in fb1["text"] and summary.best is None


def test_model_failure_stops_with_a_reason_and_a_summary(tmp_path):
    summary, run_dir = run(tmp_path, GEMM_TASK, [{"fault": "auth", "status": 401, "message": "bad key"}],
                           max_turns=3, context="none")
    assert summary.status == "finished" and summary.stop_reason == "model_error"
    assert "auth" in summary.stop_detail and summary.turns == 0 and summary.faults == 1
    [fault] = events(run_dir, "fault")
    assert fault["kind"] == "auth" and fault["retryable"] is False
    assert read_summary(run_dir).stop_reason == "model_error"


# ---- feedback rendering (no run needed) -------------------------------------------------
def _eval(**kw) -> EvalResult:
    comp = CompileResult(status="ok", arch="sm_90a", language="cuda", diagnostics=[
        Diagnostic(tool="ptxas", severity="info", code="C7515", kernel="k", message=(
            "Potential Performance Loss: wgmma.mma_async instructions are serialized due to ..."))])
    insp = InspectResult(status="ok", arch="sm_90a", flags={"wgmma_serialized": True, "setmaxnreg_ignored": False},
                         flag_evidence={"wgmma_serialized": "ptxas C7515"})
    return EvalResult(task="mha_bwd_d128", arch="sm_90a", compile=comp, inspect=insp,
                      requested_features=["wgmma", "tma"], **kw)


def test_feedback_shows_mismatches_and_only_counts_held_out_failures():
    bad = Mismatch(output="dQ", max_abs_err=3.5, max_rel_err=0.9, mismatch_frac=0.25, first_mismatch=[0, 3, 17, 5],
                   got=1.0, expected=-2.5, passed=False)
    ev = _eval(run_status="ok", workloads=[
        WorkloadResult(workload="S4096", split="visible", axes={"S": 4096}, status="failed", reason="incorrect",
                       outputs=[bad]),
        WorkloadResult(workload="S77", split="held_out", axes={"S": 77}, status="failed", reason="incorrect",
                       outputs=[bad.model_copy(update={"output": "dK_secret"})]),
        WorkloadResult(workload="S1031", split="held_out", axes={"S": 1031}, status="passed")])
    rec = fb.candidate_record(3, 0, "candidates/3-0", ev)
    assert rec.outcome == "incorrect" and rec.verified
    text = fb.render_feedback(3, "repair", "cuda", rec, ev)
    assert "output `dQ`: max abs error 3.5" in text and "(0, 3, 17, 5)" in text and "25.00%" in text
    assert "held-out workloads (sizes not shown): 1 of 2 passed; failed: 1 incorrect" in text
    assert "(got 1, expected -2.5, ratio -0.4)" in text  # the ratio shows a scale or sign error at sight
    for leak in ("S77", "77", "S1031", "1031", "dK_secret"):
        assert leak not in text
    # ptxas's info line about serialized wgmma reaches the model, as does the flag.
    assert "C7515" in text and "serialized" in text and "Architecture instructions: missing wgmma, tma" in text


def test_outcome_is_never_correct_without_a_run():
    ev = _eval()
    ev.inspect.flags["wgmma_serialized"] = False
    rec = fb.candidate_record(1, 0, "candidates/1-0", ev)
    assert rec.outcome == "arch_missing" and rec.verdicts.correct is None and not rec.verified
    json.dumps(rec.model_dump(mode="json"))


def test_a_reply_with_several_candidates_is_told_which_one_was_used(tmp_path):
    """A draft kernel, then the final one: the feedback says which block the results are about,
    and the run records it (event and candidate)."""
    draft = "First try:\n\n```cuda\nextern \"C\" __global__ void gemm_old(float* C) { C[0] = 1.f; }\n```\n\n"
    summary, run_dir = run(tmp_path, GEMM_TASK, [draft + probe_reply(), NO_CODE], max_turns=2, context="none")
    [fb1] = [e for e in events(run_dir, "feedback") if e["turn"] == 1]
    [ex] = events(run_dir, "extraction")
    assert "Your reply: " in fb1["text"] and "gemm_old" in fb1["text"] and "gemm_old" in ex["note"]
    assert summary.per_turn[0].candidates[0].note == ex["note"]


def test_wrong_answers_show_a_few_failing_elements_with_their_ratio():
    """A constant factor, seen at several places at once (the judge's own samples)."""
    import torch

    from tools.correctness import compare
    from tasks.schema import Tolerance

    ref = torch.randn(64, 32)
    got = ref.clone()
    got[3] *= 0.5  # one row halved
    m = compare("O", got, ref, Tolerance(rtol=1e-2, atol=1e-2))
    assert not m.passed and 2 <= len(m.samples) <= 4 and all(x.index[0] == 3 for x in m.samples)
    line = fb._mismatch_line(m)
    assert line.count("expected") >= 3 and "also: at (3," in line and line.count("ratio 0.5") >= 3, line
