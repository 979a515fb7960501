"""What the model is told (issue 26 item 5, issue 23 item 4) and memcheck in the loop (issue 26
item 6), on the CPU. The prompt's credit rules are rendered from the evaluator's own numbers;
memcheck's trigger and feedback go through the real loop, with a stand-in for the GPU
evaluator only (the real memcheck run is tests/gpu/test_memcheck_feedback_gpu.py)."""
from __future__ import annotations

import pytest
from agent_loop_helpers import cpu_only  # noqa: F401  (autouse fixture)
from agent_loop_helpers import GEMM_TASK, NO_CODE, events, probe_reply, write_script

from agent import feedback as fb
from agent import prompts
from agent.run import SolveRequest, solve
from agent.trajectory import Budget
from tools import credit as ncu
from tools.results import (CompileResult, Diagnostic, EvalResult, InspectResult, SanitizeResult,
                           WorkloadResult)


# ---- the system prompt ------------------------------------------------------------------
def test_credit_rules_come_from_the_evaluator_s_constants(monkeypatch):
    text = prompts.system_prompt("sm_90a", "cuda")
    assert f"at least {ncu.WORK_SHARE['wgmma']:.0%} of the task's matrix FLOPs" in text
    assert f"at least {ncu.WORK_SHARE['tma']:.0%} of the task's input bytes" in text
    assert f"{ncu.WGMMA_MIN_OF_ALL_MATH:.0%} of all the math your kernels do" in text
    assert "counted on the timed runs themselves" in text and "every run judged" in text
    assert "hidden ones included" in text and "each counter pass's runs take within 10%" in text
    assert "not serialized by ptxas" in text and "best kernel across all turns" in text
    monkeypatch.setitem(ncu.WORK_SHARE, "wgmma", 0.75)
    monkeypatch.setattr(ncu, "TMA_MAX_OTHER_READS", 3.0)
    changed = prompts.system_prompt("sm_90a", "cuda")
    assert "at least 75% of the task's matrix FLOPs" in changed and "within 3x the input bytes" in changed


def test_sm100a_prompt_says_nothing_of_wgmma():
    text = prompts.system_prompt("sm_100a", "cuda")
    assert "wgmma" not in text and "serializ" not in text
    assert "tcgen05.mma" in text and "TMA: its tensor-map loads" in text


# ---- the feedback -----------------------------------------------------------------------
def _eval(diags=(), ptx=None, **kw) -> EvalResult:
    comp = CompileResult(status="ok", arch="sm_90a", language="cuda", ptx=ptx, diagnostics=list(diags))
    insp = InspectResult(status="ok", arch="sm_90a")
    return EvalResult(task=GEMM_TASK, arch="sm_90a", compile=comp, inspect=insp, requested_features=["wgmma", "tma"],
                      **kw)


def test_ptxas_lines_without_a_source_line_are_called_ptx_lines_and_quoted():
    ptx = "\n".join(["// line 1", "  wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%f1}, %rd1, %rd2;"])
    ev = _eval([Diagnostic(tool="ptxas", severity="info", code="C7515", ptx_line=2, line=None,
                           message="Potential Performance Loss: wgmma.mma_async instructions are serialized"),
                Diagnostic(tool="ptxas", severity="warning", ptx_line=1, line=12, message="mapped one")], ptx=ptx)
    text = fb.compile_section(ev, "cuda")
    assert "lines refer to your kernel.cu" not in text
    assert "`ptx line N` is a line of the PTX NVRTC generated" in text
    assert "ptx line 2: " in text and "[ptx: wgmma.mma_async.sync.aligned.m64n128k16" in text
    assert "line 12: mapped one" in text
    mapped = _eval([Diagnostic(tool="ptxas", severity="warning", ptx_line=1, line=12, message="mapped one")], ptx=ptx)
    assert "lines refer to your kernel.cu" in fb.compile_section(mapped, "cuda")


def test_held_out_failures_by_class_with_sizes_hidden():
    held = [WorkloadResult(workload=f"S{s}", split="held_out", axes={"S": s}, status=st, reason=r, detail=f"at S={s}")
            for s, st, r in ((77, "failed", "manifest_error"), (1031, "failed", "timeout"), (513, "failed", "incorrect"),
                             (99, "failed", "out_of_bounds_write"), (2048, "passed", None))]
    line = fb.held_out_line(held)
    assert line.startswith("- held-out workloads (sizes not shown): 1 of 5 passed; failed: ")
    for cls in ("1 manifest_error", "1 timeout", "1 incorrect", "1 out-of-bounds write"):
        assert cls in line
    for leak in ("77", "1031", "513", "99", "2048"):
        assert leak not in line


def test_turn_budget_in_the_feedback():
    ev = _eval(run_status="ok", workloads=[WorkloadResult(workload="M8192", split="visible", axes={"M": 8192},
                                                          status="failed", reason="incorrect")])
    rec = fb.candidate_record(3, 0, "candidates/3-0", ev)
    text = fb.render_feedback(3, "repair", "cuda", rec, ev, max_turns=8)
    assert text.startswith("## Result of turn 3 of 8")
    assert text.rstrip().endswith("Your best kernel across all turns that is correct with the requested "
                                  "instructions is what counts, then its speed.")
    assert "This is turn 4 of 8 (4 more after this one)" in text


@pytest.mark.parametrize("san, expected", [
    (SanitizeResult(status="failed", errors=[f"Invalid __global__ write of size 2 bytes at gemm_oob+0x{i:x}0"
                                             for i in range(12)]),
     ["- Invalid __global__ write of size 2 bytes at gemm_oob+0x0", "- ... 4 more"]),
    (SanitizeResult(status="skipped", reason="workload M8192 ended with timeout"),
     ["memcheck did not run: workload M8192 ended with timeout."]),
    (SanitizeResult(status="ok"), ["memcheck found no invalid access"]),
])
def test_memcheck_section(san, expected):
    text = fb.memcheck_section(_eval(sanitize=san))
    assert text.startswith("### Memory check (compute-sanitizer memcheck")
    for e in expected:
        assert e in text
    assert fb.memcheck_section(_eval()) == ""  # not run: no section


# ---- memcheck in the loop ---------------------------------------------------------------
class OutOfBoundsGPU:
    """Stands in for the GPU evaluator: compiles and inspects for real, then reports what the
    worker reports for a kernel that wrote past its output, and memcheck's lines when asked."""

    has_gpu = False

    def __init__(self, reason: str = "out_of_bounds_write"):
        self.reason, self.calls = reason, []

    def evaluate(self, solution, task, arch, workloads="visible", executed_check=False, sanitize=False, time=True,
                 **kw) -> EvalResult:
        from tools.evaluator import Evaluator

        self.calls.append({"workloads": workloads, "sanitize": sanitize, "time": time})
        comp, insp = Evaluator.compile_and_inspect(solution, arch)
        ev = EvalResult(task=task.name, arch=arch, compile=comp, inspect=insp,
                        requested_features=task.features_for(arch), run_status="ok", gpu="stand-in",
                        workloads=[WorkloadResult(workload="M8192", split="visible", axes={"M": 8192}, status="failed",
                                                  reason=self.reason, detail="wrote outside output 'C'")])
        if sanitize:
            ev.sanitize = SanitizeResult(status="failed", errors=[
                "Invalid __global__ write of size 4 bytes at gemm_probe+0x1b0"])
        return ev

    def close(self) -> None:
        pass


def test_an_out_of_bounds_write_gets_memcheck_lines_in_its_feedback(tmp_path):
    gpu = OutOfBoundsGPU()
    model = write_script(tmp_path / "s.json", [probe_reply(), NO_CODE])
    summary = solve(SolveRequest(task=GEMM_TASK, model=model, runs_dir=tmp_path / "runs", context="none",
                                 budget=Budget(max_turns=2)), progress=False, evaluator=gpu)
    run_dir = tmp_path / "runs" / summary.run_id
    assert [c["sanitize"] for c in gpu.calls] == [False, True]
    assert gpu.calls[1] == {"workloads": "visible", "sanitize": True, "time": False}
    [mc] = events(run_dir, "memcheck")
    assert mc["trigger"] == "M8192: out_of_bounds_write" and mc["status"] == "failed"
    [fb1] = events(run_dir, "feedback")
    assert "### Memory check" in fb1["text"] and "Invalid __global__ write of size 4 bytes at gemm_probe" in fb1["text"]
    turn2 = [r for r in events(run_dir, "llm_request") if r["turn"] == 2][0]["messages"][-1]["content"]
    assert "Invalid __global__ write" in turn2


def test_memcheck_is_not_run_on_wrong_numbers_or_when_off(tmp_path):
    for name, gpu, memcheck in (("wrong", OutOfBoundsGPU("incorrect"), True), ("off", OutOfBoundsGPU(), False)):
        model = write_script(tmp_path / f"{name}.json", [probe_reply(), NO_CODE])
        summary = solve(SolveRequest(task=GEMM_TASK, model=model, runs_dir=tmp_path / name, context="none",
                                     budget=Budget(max_turns=2), memcheck=memcheck), progress=False, evaluator=gpu)
        assert [c["sanitize"] for c in gpu.calls] == [False], name
        assert not events(tmp_path / name / summary.run_id, "memcheck")
