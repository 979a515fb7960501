"""The profile block and the roofline on the H200 (issue 16, item 5), through the evaluator.

Asked for (`profile=True`), a Nsight Compute process collects tools.profile.PROFILE_METRICS
beside the in-process executed check; the evaluator fills `res.executed.profile` (a
tools.profile.Profile) and calls
tools.roofline.apply_roofline. Figures measured on 2026-11-30 with a probe of that pass
(docs/BENCHMARKS.md, "Profile in the executed check's ncu pass") set the expectations.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tasks import get_task
from tools.evaluator import Evaluator
from tools.profile import Profile, render, tokens
from tools.results import EvalResult
from tools.solution import Solution

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory):
    cache = Path(os.environ.get("PTXBENCH_GPU_LOGS") or tmp_path_factory.mktemp("cache"))
    with Evaluator(timeout_s=300, cache_dir=cache) as ev:
        yield ev


def _evaluate(evaluator, task: str, solution: str) -> EvalResult:
    sol = Solution.from_dir(ROOT / "tasks" / task / solution)
    return evaluator.evaluate(sol, get_task(task), "sm_90a", workloads="visible", executed_check=True, time=True,
                              profile=True)


def _profile(r: EvalResult) -> Profile:
    # The H200 has ncu and counter access: a check that says `skipped` here is a failure, not a skip.
    assert r.executed.status == "ok", f"the executed check's ncu pass did not run: {r.executed.reason}"
    p = r.executed.profile
    assert isinstance(p, Profile) and p.status == "ok", r.executed.model_dump(exclude={"kernel_metrics"})
    return p


def _record(name: str, r: EvalResult, p: Profile) -> None:
    """Token cost of the block and wall time of the combined ncu pass, for docs/BENCHMARKS.md."""
    logs = os.environ.get("PTXBENCH_GPU_LOGS")
    line = {"case": name, "tokens": tokens(render(p)), "executed_s": r.phase_s.get("executed"),
            "block": render(p)}
    print(json.dumps(line))
    if logs:
        with open(Path(logs) / "profile_gpu.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")


def test_expert_gemm_keeps_the_tensor_pipe_busy_and_the_simt_gemm_does_not(evaluator):
    expert, simple = _evaluate(evaluator, "gemm_n7168_k5120", "expert"), _evaluate(evaluator, "gemm_n7168_k5120",
                                                                                     "simple")
    pe, ps = _profile(expert), _profile(simple)
    _record("gemm expert", expert, pe)
    _record("gemm simple", simple, ps)
    # probe: 97% against 1%
    e, s = pe.kernels[0], ps.kernels[0]
    assert e.tensor_pipe_pct is not None and s.tensor_pipe_pct is not None
    assert e.tensor_pipe_pct > 80 and s.tensor_pipe_pct < 10 and e.tensor_pipe_pct > 8 * max(s.tensor_pipe_pct, 1)
    assert e.tflops and e.tflops_pct and 50 < e.tflops_pct < 100  # wgmma's FLOPs, under the dense peak
    assert s.tflops is None or s.tflops < 0.1 * e.tflops
    assert e.registers and e.occupancy_limiter and e.stalls
    assert tokens(render(pe)) < 150
    # the roofline: GEMM at this size is compute-bound; the expert runs near the library
    w = expert.workloads[0]
    assert w.roofline_bound == "compute" and w.sol_ms and w.sol_ms < w.timing.median_ms
    assert w.sol_score is not None and 0.3 < w.sol_score < 0.7 and expert.sol_score == pytest.approx(w.sol_score)
    assert simple.sol_score is not None and simple.sol_score < 0.1


def test_simt_attention_backward_waits_on_shared_memory(evaluator):
    """The SIMT backward stages K/V (and Q/dO) tiles in shared memory and does scalar FMAs on
    them: its warps wait on shared-memory loads (short scoreboard), not on DRAM; the tensor pipe
    idles. Probe: short scoreboard 46-48% in both main kernels, tensor pipe 0-1%."""
    r = _evaluate(evaluator, "mha_bwd_d128", "simple")
    p = _profile(r)
    _record("attn bwd simple", r, p)
    main = [k for k in p.kernels if (k.time_share or 0) > 0.2]
    assert main, p.kernels
    for k in main:
        assert k.stalls and k.stalls[0][0] == "short scoreboard", (k.name, k.stalls)
        assert k.tensor_pipe_pct is not None and k.tensor_pipe_pct < 5
    assert sum(k.time_share or 0 for k in p.kernels) == pytest.approx(1.0)
    assert tokens(render(p)) < 250


def test_expert_attention_backward_block_fits_the_budget(evaluator):
    r = _evaluate(evaluator, "mha_bwd_d128", "expert")
    p = _profile(r)
    _record("attn bwd expert", r, p)
    assert len(p.kernels) == len(Solution.from_dir(ROOT / "tasks/mha_bwd_d128/expert").manifest.launches)
    top = p.kernels[0]
    assert top.tensor_pipe_pct and top.tensor_pipe_pct > 30 and top.tflops and top.tflops > 300
    assert tokens(render(p)) < 250
