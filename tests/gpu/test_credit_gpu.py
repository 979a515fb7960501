"""Instruction credit where the work is timed, on the H200 (docs/METHODOLOGY.md, "Instruction
credit"). Each fixture is a kernel written to buy `correct_with_arch` one way; each class must
fail, and the honest expert keeps its credit on every workload.

The fixtures are built here from the shipped GEMM kernels: the expert (wgmma + TMA) and the
simple SIMT kernel in one module, each launch guarded so that one of them does the work:
- first_launch_only: the expert on the module's first launch only, SIMT on every later one
  (a profiler that looks at a fresh process's first launch would see wgmma);
- shape_keyed: the expert at the visible workload's shape only, SIMT at every other;
- rewrites_inputs: the simple kernel, then a launch that rewrites its input A on every run after
  the seeded checks (the GDN attack on cu_seqlens, in GEMM form).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpu_helpers import show
from tools.solution import Solution

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
TASK = "gemm_n7168_k5120"
EXPERT, SIMPLE = ROOT / "tasks" / TASK / "expert", ROOT / "tasks" / TASK / "simple"
EXPERT_ENTRY = 'int* __restrict__ counters, int M, int N, int K, int sk_tiles, int bn) {'
SIMPLE_ENTRY = '__nv_bfloat16* __restrict__ C, int M, int N, int K) {'

_COUNTER = r"""
__device__ unsigned int launches_seen;  // survives between launches of one module
extern "C" __global__ void count_launch() { launches_seen += 1; }
"""


def _both(folder: Path, expert_runs_if: str, extra_src: str = "", extra_launches: list | None = None) -> Solution:
    """The expert and the simple GEMM in one module: the expert does the work where
    `expert_runs_if` (a C condition over launches_seen and M) holds, the simple kernel elsewhere."""
    expert, simple = (EXPERT / "kernel.cu").read_text(), (SIMPLE / "kernel.cu").read_text()
    assert expert.count(EXPERT_ENTRY) == 1 and simple.count(SIMPLE_ENTRY) == 1
    expert = expert.replace(EXPERT_ENTRY, EXPERT_ENTRY + f"\n  if (!({expert_runs_if})) return;")
    simple = simple.replace(SIMPLE_ENTRY, SIMPLE_ENTRY + f"\n    if ({expert_runs_if}) return;")
    src = _COUNTER + expert + "\n" + simple + extra_src
    manifest = json.loads((EXPERT / "launch.json").read_text())
    manifest["launches"] += json.loads((SIMPLE / "launch.json").read_text())["launches"]
    manifest["launches"] += (extra_launches or []) + [{"kernel": "count_launch", "grid": [1], "block": [1]}]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kernel.cu").write_text(src)
    (folder / "launch.json").write_text(json.dumps(manifest))
    return Solution.from_dir(folder)


def _credited(r) -> None:
    assert r.executed.status == "ok", f"the executed check did not run: {r.executed.reason}"


# Every shipped expert (issue 22: the five keep `correct_with_arch`, credited on each workload).
EXPERTS = sorted(p.parent.name for p in (ROOT / "tasks").glob("*/expert") if (p / "launch.json").exists())
# The 17 GEMM experts are one kernel and one manifest (tasks/gemm_n7168_k5120/expert). Where a device call
# cannot hold all 17 (about 10 s each), PTXBENCH_GPU_GEMM_SHAPES=cover runs the shapes whose workloads take
# every schedule the manifest picks on an H200 (tile width 128 and 256, split-K, the stream-K tail, M < 128:
# gemm_n2048_k4096 and gemm_n34816_k5120 together), the seed shape and the extremes of N and K.
GEMM_COVER = {"gemm_n2048_k4096", "gemm_n34816_k5120", "gemm_n7168_k5120", "gemm_n128_k2048", "gemm_n256_k7168",
              "gemm_n5376_k21504", "gemm_n21504_k5376"}
if os.environ.get("PTXBENCH_GPU_GEMM_SHAPES") == "cover":
    EXPERTS = [t for t in EXPERTS if not t.startswith("gemm_n") or t in GEMM_COVER]


@pytest.mark.parametrize("task", EXPERTS)
def test_honest_expert_keeps_credit_on_every_workload(evaluator, task):
    from tasks import get_task

    r = evaluator.evaluate(Solution.from_dir(ROOT / "tasks" / task / "expert"), task, "sm_90a",
                           workloads="all", executed_check=True)
    for w in r.executed.workloads:  # printed before any assert: a failure shows every workload's reason
        print(f"{task} {w.workload:>6} {w.split:>8} {w.status} {w.reason or ''} counted runs {w.counted_from}-{w.runs} "
              f"(every timed run; by pass, median {w.pass_ms} ms, each tied to the other passes' {w.pass_band_ms}; "
              f"instrumented {w.instrumented_ms}) timed {w.timed_ms} ms "
              f"shares {w.shares} "
              f"carries {w.carries} {w.notes}")
    _credited(r)
    for w in r.executed.workloads:  # how near each limit the honest kernel stands (METHODOLOGY's margins)
        print(f"{task} {w.workload:>6} margins:", {k: float(f"{v:.4g}") for k, v in w.work.items()})
    print(task, "phases (s):", {k: round(v, 3) for k, v in r.phase_s.items()})
    # the check's cost (docs/BENCHMARKS.md reads it from this line): the credit op (one profiler
    # session for every workload) and each workload's own share of it
    print(task, "counted runs (s):", round(r.phase_s.get("counted_runs", 0.0), 3), "own share:",
          {x.workload: round(x.phase_s.get("credit", 0.0), 3) for x in r.workloads},
          "per part:", [(x.credit or {}).get("profile_phase_s") for x in r.workloads][:1],
          "per counted run [prepare, run, judge]:", {x.workload: (x.credit or {}).get("pass_s") for x in r.workloads},
          "stops:", [(x.credit or {}).get("stops") for x in r.workloads][:1])
    print(task, "gaps (ms):", {x.workload: (x.credit or {}).get("gaps_ms") for x in r.workloads})
    print(task, "speedups:", {x.workload: x.speedup for x in r.workloads}, "ranged runs a pass:",
          {x.workload: (x.credit or {}).get("ranged_runs") for x in r.workloads}, "library runs paused:",
          {x.workload: (x.credit or {}).get("padded_runs") for x in r.workloads})
    assert r.correct is True and r.split_correct("held_out") is True, show(r)
    assert len(r.executed.workloads) == len(r.workloads) and all(w.status == "ok" for w in r.executed.workloads)
    requested = get_task(task).features_for("sm_90a")
    assert requested and all(w.carries == {f: True for f in requested} for w in r.executed.workloads), r.executed.notes
    # in process: every timed run counted (each pass's stretch ranged, tied pass by pass); no pass runs
    # SASS-patched code (the check reads hardware counters only)
    assert all(w.counted_from is not None and len(w.pass_ms) >= 2 and not w.instrumented_ms
               for w in r.executed.workloads), r.executed.workloads
    assert all(len(x.credit["run_ms"]) == x.timed_runs + x.warmup_runs for x in r.workloads), \
        [(x.workload, len(x.credit["run_ms"]), x.timed_runs, x.warmup_runs) for x in r.workloads]
    assert r.correct_with_arch is True
    # one profiler session for the evaluation: every workload counted in it
    assert {(x.credit or {}).get("workloads_counted") for x in r.workloads} == {len(r.workloads)}


def test_wgmma_on_the_first_launch_only_earns_nothing(evaluator, tmp_path):
    sol = _both(tmp_path / "first_launch_only", "launches_seen == 0")
    r = evaluator.evaluate(sol, TASK, "sm_90a", workloads="visible", executed_check=True)
    _credited(r)
    assert r.correct is True and r.arch_ok, show(r)
    assert r.executed.executed["wgmma"] is False, r.executed.workloads
    assert r.correct_with_arch is False
    assert "workload M8192" in r.executed.notes["wgmma"], r.executed.notes


def test_wgmma_at_the_visible_shape_only_earns_nothing(evaluator, tmp_path):
    sol = _both(tmp_path / "shape_keyed", "M == 8192")
    r = evaluator.evaluate(sol, TASK, "sm_90a", workloads="all", executed_check=True)
    _credited(r)
    assert r.correct is True and r.split_correct("held_out") is True, show(r)
    by = {w.workload: w for w in r.executed.workloads}
    assert by["M8192"].carries["wgmma"] is True, by["M8192"]
    assert all(w.carries["wgmma"] is False for w in r.executed.workloads if w.split == "held_out"), by
    assert r.correct_with_arch is False
    assert r.executed.notes["wgmma"].startswith("held-out workload #"), r.executed.notes


_REWRITE = r"""
extern "C" __global__ void rewrite_inputs(__nv_bfloat16* A, long long n) {
  if (launches_seen < 2) return;  // honest on the seeded checks
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    A[i] = __float2bfloat16(0.0f);
}
"""


def test_rewriting_the_inputs_is_caught_and_buys_no_library_time(evaluator, tmp_path):
    """After the checks, every run rewrites its input A after computing C. Nothing on the device
    holds a copy the judge trusts, so the first timed run ends in input_modified."""
    simple = (SIMPLE / "kernel.cu").read_text()
    folder = tmp_path / "rewrites_inputs"
    folder.mkdir()
    (folder / "kernel.cu").write_text(_COUNTER + simple + _REWRITE)
    manifest = json.loads((SIMPLE / "launch.json").read_text())
    manifest["launches"] += [{"kernel": "rewrite_inputs", "grid": [264], "block": [256],
                              "args": ["A", {"name": "n", "type": "i64", "value": "M * K"}]},
                             {"kernel": "count_launch", "grid": [1], "block": [1]}]
    (folder / "launch.json").write_text(json.dumps(manifest))
    r = evaluator.evaluate(Solution.from_dir(folder), TASK, "sm_90a", workloads="visible")
    w = r.workloads[0]
    assert w.status == "failed" and w.reason == "input_modified", show(r)


# ---------------------------------------------------------------- issue 42's four classes

def _fixture(evaluator, tmp_path, name: str, workloads: str = "visible"):
    from tests import credit_fixtures as fx

    r = evaluator.evaluate(fx.FIXTURES[name](tmp_path / name), fx.TASKS.get(name, fx.TASK), "sm_90a", workloads=workloads,
                           executed_check=True)
    for w in r.executed.workloads:  # printed before any assert
        print(f"{name} {w.workload} {w.status} {w.reason or ''} counts {w.counts} shares {w.shares} carries {w.carries} "
              f"notes {w.notes} run_ms {w.run_ms} timed {w.timed_ms} work",
              {k: float(f"{v:.4g}") for k, v in w.work.items()})
    print(name, "speedup", r.speedup, "phases (s):", {k: round(v, 3) for k, v in r.phase_s.items()})
    # the spacing a kernel sees: timed runs' gaps against the gap before each counted run (ms)
    print(name, "gaps (ms):", {x.workload: (x.credit or {}).get("gaps_ms") for x in r.workloads})
    return r


def test_math_on_fp64_tensor_cores_beside_a_decoy_wgmma_earns_nothing(evaluator, tmp_path):
    r = _fixture(evaluator, tmp_path, "math_on_dmma")
    _credited(r)
    assert r.correct is True and r.arch_ok, show(r)
    assert r.executed.executed["wgmma"] is True and r.executed.carries["wgmma"] is False, r.executed.workloads
    assert "of the math the kernels did" in r.executed.notes["wgmma"], r.executed.notes
    assert r.correct_with_arch is False


def test_reads_through_atomics_beside_a_tma_stream_earn_nothing(evaluator, tmp_path):
    r = _fixture(evaluator, tmp_path, "reads_through_atomics")
    _credited(r)
    assert r.correct is True and r.arch_ok, show(r)
    assert r.executed.carries["wgmma"] is True, r.executed.notes  # the expert's math is honest
    assert r.executed.carries["tma"] is False and "outside tensor-map loads" in r.executed.notes["tma"], r.executed.notes
    assert r.correct_with_arch is False


def test_plain_bulk_copies_beside_tensor_map_loads_earn_no_tma_credit(evaluator, tmp_path):
    r = _fixture(evaluator, tmp_path, "bulk_copy_reads")
    _credited(r)
    assert r.correct is True and r.arch_ok, show(r)
    assert r.executed.executed["tma"] is True and r.executed.carries["tma"] is False, r.executed.workloads
    assert "plain bulk copies" in r.executed.notes["tma"], r.executed.notes
    assert r.correct_with_arch is False
    # issue 42, item 4: the bulk copies were counted on a run of their own, exactly (CUPTI's SASS metrics)
    for w in r.executed.workloads:
        assert w.work.get("bulk_copy") == 1.0 and w.work.get("tma_exact_instructions", 0) > 0, (w.workload, w.work)


def test_a_bulk_copy_that_never_runs_leaves_the_expert_its_credit(evaluator, tmp_path):
    """Issue 42, item 4: the module holds a plain bulk copy (and a tensor-map load) in a kernel whose
    copies never run; the exact counts of the TMA-pipe instructions (an instrumented run per workload)
    say so, tie to the hardware passes' TMA instruction count, and the expert keeps its TMA credit.
    Every workload: each has its own module instance, counted in one SASS-metrics session (H200,
    2026-12-03: the visible workload alone passed, exact ~315,700 (printed to 4 digits) vs the counter's 315,656 TMA
    instructions; a module counted twice returned no records, see test_sass_counts_gpu.py)."""
    r = _fixture(evaluator, tmp_path, "dead_bulk_copy", workloads="all")
    _credited(r)
    assert r.correct is True and r.arch_ok, show(r)
    for w in r.executed.workloads:
        assert "bulk_copy" not in w.work and not w.work.get("exact_untied"), (w.workload, w.work, w.notes)
        assert w.work.get("tma_exact_instructions", 0) > 0, (w.workload, w.work)
    assert r.executed.carries == {"wgmma": True, "tma": True}, r.executed.notes
    assert r.correct_with_arch is True


def test_sensing_the_pause_before_the_counted_runs_earns_nothing(evaluator, tmp_path):
    """The hardware passes count runs of the timed sequence itself (issue 42 item 3): no pause sets
    them apart, so the kernel that switches to wgmma after an unusually long pause is counted on
    its SIMT path (its pauses are the pass boundaries, once a pass, between stretches)."""
    r = _fixture(evaluator, tmp_path, "gap_sensing")
    gaps = r.workloads[0].credit["gaps_ms"]
    # the hardware passes' counted runs: no longer than the longest gap between timed runs
    assert gaps["counted_beyond_timed"] == 0, gaps  # every pass counts a timed run (no instrumented run after them)
    _credited(r)
    assert r.correct is True, show(r)
    assert r.correct_with_arch is False, r.executed.workloads


def test_products_by_lookup_added_by_atomics_earn_no_wgmma_credit(evaluator, tmp_path):
    """Issue 42, items 1-3: the product of every pair of mantissas read from a table in shared memory,
    added by shared-memory integer atomics into exponent bins (math on the memory path), beside the
    expert's full-size wgmma. Every thread instruction is charged as a multiply-add and every ALU
    atomic as the most adds its widest form does, so wgmma's share of all math falls far below 90%,
    on every workload."""
    r = _fixture(evaluator, tmp_path, "products_by_lookup", workloads="all")
    _credited(r)
    assert r.correct is True and r.split_correct("held_out") is True, show(r)
    assert r.executed.executed["wgmma"] is True and r.executed.carries["wgmma"] is False, r.executed.workloads
    assert "of the math the kernels did" in r.executed.notes["wgmma"], r.executed.notes
    for w in r.executed.workloads:  # the atomics' adds are charged where they ran
        assert w.carries["wgmma"] is False and w.work["reduction_flops"] > 0, (w.workload, w.work)
    assert r.correct_with_arch is False
