"""Instruction credit where the work is timed (docs/METHODOLOGY.md, "Instruction credit"), on CPU:
the credit runs' sequence (tools.counted.run_credit) with the worker's CPU stand-in, and the
per-workload verdict, tie and combination (tools.ncu) on rows shaped as `ncu --page raw` gives
them. The profiler itself runs in tests/gpu/test_credit_gpu.py."""
from __future__ import annotations

import contextlib

import pytest
import torch

from test_evaluator_cpu import CpuState, _ncu_row, gemm, small_gemm
from tools import counted, workspace
from tools.credit import SAME_RUN_RATIO, TaskWork, _credit, _unprofiled, combine
from tools.solution import Solution

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "adversarial"
HGMMA = "sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32__dot__sum"
FFMA = "smsp__thread_inst_executed_pred_on__dot__sum"  # every thread instruction (an FFMA too): 2 FLOPs
TMA = "l1tex__m_xbar2l1tex_read_bytes_mem_global_op_tma_ld__dot__sum"
LDG = "l1tex__t_bytes_pipe_lsu_mem_global_op_ld__dot__sum"
DUR = "gpu__time_duration__dot__sum"
WORK = TaskWork(flops=2 * 8192 * 7168 * 5120, read_bytes=(8192 + 7168) * 5120 * 2)


class ProfiledState(CpuState):
    """The CPU stand-in with a profiler window that records which launches it saw."""

    def __init__(self, kernel):
        self.launches = 0
        self.profiled: list[int] = []
        self.inside = False

        def counted(ws, call):
            self.launches += 1
            if self.inside:
                self.profiled.append(self.launches)
            return kernel(ws, call)

        super().__init__(counted)

    @contextlib.contextmanager
    def profiler_window(self):
        self.inside = True
        try:
            yield
        finally:
            self.inside = False


def credit_request(seed: int, task=None, workload: int = 0) -> dict:
    task = task or small_gemm()
    sol = Solution.from_dir(FIXTURES / "good")
    return {"cubin": b"", "manifest": sol.manifest.model_dump(mode="json"), "task": task.model_dump(mode="json"),
            "workload": task.workloads[workload].model_dump(mode="json"), "seeds": [11, 12], "time": False,
            "credit_seed": seed}


def test_the_profiled_run_is_never_the_first_launch_and_moves_with_the_seed():
    """Launch 1 (what a profiler of a fresh process sees first) is a seeded check; the profiled
    run is one of the credit runs after both checks, drawn per evaluation."""
    positions = set()
    for seed in range(40):
        state = ProfiledState(gemm)
        out = counted.run_credit(state, credit_request(seed))
        assert out["status"] == "ran", out
        assert len(state.profiled) == 1 and state.profiled[0] >= 3, state.profiled
        assert state.launches == 2 + out["runs"]
        assert state.profiled[0] == 2 + out["profiled_at"] and out["launches"] == 1
        positions.add(state.profiled[0])
    assert len(positions) >= 5  # not one fixed place a kernel could count to


def test_credit_runs_judge_nothing_and_reach_the_profiler_whatever_the_answer():
    """The evaluation judges every run; the credit process only runs them as the timed runs are
    run, so a wrong kernel is still profiled (the model learns whether its wgmma ran), and a
    kernel that faults is reported, never raised."""
    state = ProfiledState(lambda ws, c: gemm(ws, c) if c <= 2 else ws.outputs["C"].zero_())
    out = counted.run_credit(state, credit_request(3))
    assert out["status"] == "ran" and state.profiled and out["profiled_at"], out

    def faults(ws, c):
        raise RuntimeError("CUDA_ERROR_ILLEGAL_ADDRESS")

    out = counted.run_credit(ProfiledState(faults), credit_request(3))
    assert out["status"] == "failed" and out["reason"] == "run_failed" and out["profiled_at"] is None, out


def test_inputs_are_judged_against_a_regeneration_not_a_device_copy():
    """No copy of the inputs lives on the device while the candidate runs: rewriting the inputs
    and anything else it can reach still ends in input_modified."""
    task = small_gemm()
    from tools.launch import plan_launches

    sol = Solution.from_dir(FIXTURES / "good")
    ws = workspace.Workspace(task, plan_launches(sol.manifest, task, task.axis_values(task.workloads[0]),
                                              CpuState.limits), "cpu")
    assert not any(isinstance(v, dict) and v is not ws.inputs and v is not ws.outputs and
                   any(t is not None and isinstance(t, torch.Tensor) for t in v.values())
                   and set(v) == set(ws.inputs) for v in vars(ws).values()), "a second copy of the inputs"
    from tasks.generators import generate_inputs

    fresh = generate_inputs(task, task.axis_values(task.workloads[0]), 5, device="cpu")
    ws.load_inputs(fresh)
    ws.reset()
    gemm(ws, 1)
    for t in ws.inputs.values():
        t.add_(1)
    assert ws.verdict(None, task.tolerance, inputs=generate_inputs(task, task.axis_values(task.workloads[0]), 5,
                                                                     device="cpu"),
                      samples={})[0] == "input_modified"
    with pytest.raises(ValueError, match="generated again"):
        ws.verdict(None, task.tolerance, samples={})


def test_the_second_side_of_a_pair_runs_on_regenerated_inputs():
    """Whatever the first side of a pair did to the input buffers, the second (the library, when
    the candidate ran first) reads them as generated from the pair's seed."""
    import random

    task = small_gemm()
    from tools.launch import plan_launches

    sol = Solution.from_dir(FIXTURES / "good")
    axes = task.axis_values(task.workloads[0])
    ws = workspace.Workspace(task, plan_launches(sol.manifest, task, axes, CpuState.limits), "cpu")
    judge = workspace.TimedJudge(task, axes, ws, random.Random(1), "cpu")
    judge.before_pair(0, 4)
    loaded = {n: t.clone() for n, t in ws.inputs.items()}
    judge.inputs_for_run()  # the first side: as loaded
    for t in ws.inputs.values():
        t.zero_()  # the first side rewrote its inputs
    judge.inputs_for_run()  # the second side
    assert all(torch.equal(ws.inputs[n], loaded[n]) for n in loaded)


def _credited(name: str, split: str, timed_ms: float | None, opcodes: str = "64 (HGMMA: 32; UTMALDG: 32)",
              **metrics: float):
    row = _ncu_row("gemm", opcodes, **metrics)
    return _credit({"workload": name, "split": split, "runs": 4, "profiled_at": 2, "launches": 1}, [row],
                   ["wgmma", "tma"], WORK, timed_ms), row


def test_credit_needs_every_workload_and_names_the_one_that_withheld_it():
    """A kernel that takes its wgmma path only at the visible shape: the visible workload earns
    credit, a held-out one does not, so the candidate does not; the note names the held-out
    workload by number, never by size."""
    honest = {HGMMA: WORK.flops, TMA: WORK.read_bytes, DUR: 0.76e6}
    vis, vrow = _credited("M8192", "visible", 0.753, **honest)
    good, grow = _credited("M4096", "visible", 0.753, **honest)
    simt, srow = _credited("M70", "held_out", 0.753 * 60, "9 (FFMA: 9)", **{FFMA: WORK.flops / 2, LDG: 30 * WORK.read_bytes,
                                                               DUR: 0.753 * 60 * 1e6})
    assert vis.carries == {"wgmma": True, "tma": True}
    assert simt.executed == {"wgmma": False, "tma": False} and not any(simt.carries.values())
    ex = combine(["wgmma", "tma"], [vis, good, simt], profiled={"M8192": [vrow], "M4096": [grow], "M70": [srow]})
    assert ex.status == "ok" and ex.carries == {"wgmma": False, "tma": False}
    assert ex.executed == {"wgmma": False, "tma": False}
    assert ex.notes["wgmma"].startswith("held-out workload #1") and "70" not in ex.notes["wgmma"]
    assert [w.workload for w in ex.workloads] == ["M8192", "M4096", "M70"]
    assert ex.metrics["kernel_ms"] == pytest.approx(0.76)  # the first visible workload's figures
    both = combine(["wgmma", "tma"], [vis, good], profiled={"M8192": [vrow], "M4096": [grow]})
    assert both.carries == {"wgmma": True, "tma": True} and both.shares["wgmma"] == pytest.approx(1.0)


def test_the_tie_is_two_sided():
    """Credit is withdrawn when the profiled run is slower than the timed runs (the timed path is
    another, faster one) and when it is faster (the timed runs took a slower path)."""
    base = {HGMMA: WORK.flops, TMA: WORK.read_bytes}
    ok, _ = _credited("M8192", "visible", 0.753, **base, **{DUR: 0.76e6})
    assert ok.carries["wgmma"] and ok.timed_ms == 0.753
    slower, _ = _credited("M8192", "visible", 0.76 / (SAME_RUN_RATIO + 0.05), **base, **{DUR: 0.76e6})
    assert not slower.carries["wgmma"] and "not the one whose instructions were counted" in slower.notes["wgmma"]
    faster, _ = _credited("M8192", "visible", 0.76 * 50, **base, **{DUR: 0.76e6})  # timed on a generic path
    assert not faster.carries["wgmma"] and "slower path" in faster.notes["wgmma"]
    untimed, _ = _credited("M8192", "visible", None, **base, **{DUR: 0.76e6})
    assert untimed.carries["wgmma"]  # not timed: no speed claimed, nothing to tie


def test_no_credited_workload_is_skipped_with_the_reason():
    ex = combine(["wgmma"], [_unprofiled({"workload": "M8192", "reason": "input_modified", "detail": "input 'A'"})])
    assert ex.status == "skipped" and "input_modified" in ex.reason


# ---------------------------------------------------------------- the process, with a stand-in for ncu

@pytest.fixture
def fake_ncu(tmp_path, monkeypatch):
    """`ncu` on PATH is tests/fixtures/ncu/fake_ncu.py (no GPU here)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ncu").symlink_to(Path(__file__).resolve().parent / "fixtures" / "ncu" / "fake_ncu.py")
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    return monkeypatch


def _gemm_requests():
    import secrets

    from tasks import get_task

    task = get_task("gemm_n7168_k5120")
    manifest = Solution.from_dir(Path(__file__).resolve().parents[1] / "tasks" / task.name / "expert").manifest
    reqs = [{"cubin": b"", "manifest": manifest.model_dump(mode="json"), "task": task.model_dump(mode="json"),
             "workload": w.model_dump(mode="json"), "seeds": [1, 2], "time": False, "credit_seed": secrets.randbits(62)}
            for w in task.workloads]
    works = [TaskWork(flops=task.flop_count(task.axis_values(w)), read_bytes=task.input_bytes(task.axis_values(w)))
             for w in task.workloads]
    return task, reqs, works


def test_credit_process_hands_over_after_the_timed_runs_and_attributes_rows(fake_ncu):
    """The process starts first and waits; the requests reach it over stdin; each workload's rows
    are its own; at the visible shape only, the held-out workloads withhold the credit."""
    from tools.ncu import CreditProcess

    task, reqs, works = _gemm_requests()
    env = dict(__import__("os").environ)
    p = CreditProcess(["wgmma", "tma"], env)
    assert p.proc is not None and p.proc.poll() is None  # started, waiting for the hand-over
    ex = p.finish(reqs, "0", works, timed_ms={r["workload"]["name"]: 0.001 for r in reqs})
    assert ex.status == "ok" and ex.carries == {"wgmma": True, "tma": True}, (ex.reason, ex.notes)
    assert [w.workload for w in ex.workloads] == [w.name for w in task.workloads]
    assert set(ex.phase_s) >= {"runs", "import", "worker_credit_runs"}

    fake_ncu.setenv("FAKE_NCU_WGMMA_M", "8192")
    ex = CreditProcess(["wgmma", "tma"], dict(__import__("os").environ)).finish(reqs, "0", works)
    assert ex.status == "ok" and ex.carries["wgmma"] is False
    assert ex.workloads[0].carries["wgmma"] is True and ex.notes["wgmma"].startswith("held-out workload #1")


def test_what_the_profiled_process_wrote_with_held_out_workloads_in_it_is_not_told(fake_ncu):
    """The Nsight Compute process runs every credited workload, held-out ones too; where it dies,
    the check's reason quotes its last lines, where a kernel's debug printf lands ("rows 70":
    held-out M70). A model and a client read what failed, not those lines."""
    from agent.feedback import redact_held_out
    from agent.feedback_catalogue import ev
    from tools.ncu import CreditProcess
    from tools.results import WorkloadResult

    task, reqs, works = _gemm_requests()
    fake_ncu.setenv("FAKE_NCU_CRASH", "1")
    ex = CreditProcess(["wgmma", "tma"], dict(__import__("os").environ)).finish(reqs, "0", works)
    assert ex.status == "skipped" and "rows 70" in ex.reason and not ex.workloads
    e = ev([WorkloadResult(workload=w.name, split=w.split, axes=task.axis_values(w), status="passed")
            for w in task.workloads], executed=ex)
    told = redact_held_out(e).executed.reason
    assert told.startswith("the profiled process failed") and "rows" not in told


def test_credit_process_without_ncu_or_requests_is_skipped(fake_ncu, monkeypatch):
    from tools.ncu import CreditProcess

    _, reqs, works = _gemm_requests()
    p = CreditProcess(["wgmma"], dict(__import__("os").environ))
    ex = p.finish([], "0", [])
    assert ex.status == "skipped" and "nothing to profile" in ex.reason and p.proc is None
    monkeypatch.setenv("PATH", "/nonexistent")
    ex = CreditProcess(["wgmma"], {}).finish(reqs, "0", works)
    assert ex.status == "skipped" and "not on PATH" in ex.reason


def test_a_manifest_error_runs_no_profiler(fake_ncu, tmp_path):
    """Nothing is handed to the profiler when no workload ran to a verdict of its own (before,
    ncu ran anyway and reported torch's FillFunctor)."""
    import json
    import sys

    from test_evaluator_cpu import ROOT
    from tools.evaluator import Evaluator

    mode, mark = tmp_path / "mode", tmp_path / "mark"
    mode.write_text("pass")
    fake_ncu.setenv("PTXBENCH_FAKE_WORKER_MODE", str(mode))
    fake_ncu.setenv("FAKE_NCU_MARK", str(mark))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "kernel.cu").write_text((FIXTURES / "good" / "kernel.cu").read_text())
    manifest = json.loads((FIXTURES / "good" / "launch.json").read_text())
    manifest["launches"][0]["grid"] = ["no_such_axis"]
    (bad / "launch.json").write_text(json.dumps(manifest))
    task = small_gemm()  # requests wgmma and TMA on sm_90a, as the GEMM task does
    assert task.features_for("sm_90a")
    with Evaluator(gpus=[0], worker_cmd=[sys.executable, str(ROOT / "tests" / "fake_worker.py")], timeout_s=20,
                   cache_dir=tmp_path) as ev:
        r = ev.evaluate(Solution.from_dir(bad), task, "sm_90a", executed_check=True)
    assert r.workloads and all(w.status == "failed" for w in r.workloads), r.workloads
    assert r.executed.status == "skipped", r.executed
    assert not mark.exists()


def test_the_overwork_cap_allows_an_honest_kernels_padded_tiles():
    """The attention-backward expert at S=77 computes 128-row tiles: 2.76x the task's FLOPs,
    honest (H200, 2026-12-01). The cap is 2.5x the work in whole 128-row tiles, so it passes
    there, while 2.5x at a size with no padding still fails."""
    from tasks import get_task
    from tools.evaluator import _task_work
    from tools.credit import carries

    task = get_task("mha_bwd_d128")
    by = {w.name: _task_work(task, w) for w in task.workloads}
    s77, s4096 = by["S77"], by["S4096"]
    assert s77.padded_flops / s77.flops == pytest.approx((128 / 77) ** 2, rel=1e-3)
    metrics = lambda w, x: {"wgmma_flops": x * w.flops, "other_flops": 0.0}  # noqa: E731
    assert carries("wgmma", metrics(s77, 2.7634), s77)[0]
    assert not carries("wgmma", metrics(s4096, 2.7634), s4096)[0]
    assert not carries("wgmma", metrics(s77, 2.5 * 2.77), s77)[0]
