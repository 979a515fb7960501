"""The manifest's `let` (named sizes, evaluated in order per workload) and a launch's `when`
(the launch runs only where it is true): one manifest picks its kernel per shape, as a library's
heuristics do (a split-K kernel where M is small), and writes a tile choice once. Planned on a real
task; the static check on a module compiled for real (NVRTC, ptxas)."""
from __future__ import annotations

import json

import pytest

from tasks import get_task
from tools.compile import compile_solution
from tools.evaluator import static_check
from tools.launch import NOMINAL_LIMITS, ManifestError, plan_launches
from tools.solution import MAX_LETS, Solution, SolutionError, parse_manifest

TASK = get_task("gemm_n7168_k5120")  # M varies: 8192 (visible) down to 70 (held out); N 7168, K 5120
LIMITS = NOMINAL_LIMITS["sm_90a"]

SPLIT_OR_TILED = {
    "let": {"bn": "128 if M <= 128 else 256", "tiles": "cdiv(M, 128) * cdiv(N, bn)",
            "splits": "max(1, min(8, num_sms // tiles))"},
    "buffers": [{"name": "partial", "dtype": "float32", "shape": ["splits", "M", "N"]}],
    "tensor_maps": [{"name": "tmB", "tensor": "B", "box": ["bn", 64]}],
    "launches": [
        {"kernel": "gemm_split_k", "when": "M <= 128", "grid": ["tiles", "splits"], "block": [128],
         "args": ["A", "tmB", "partial", "M", "splits"]},
        {"kernel": "gemm_reduce", "when": "M <= 128", "grid": ["cdiv(M * N, 256)"], "block": [256],
         "args": ["partial", "C", "M", "splits"]},
        {"kernel": "gemm_tiled", "when": "M > 128", "grid": ["min(num_sms, tiles)"], "block": [384],
         "args": ["A", "tmB", "C", "M", {"type": "u32", "value": "tiles"}, "bn"]},
    ],
}


def _plan(manifest: dict, M: int):
    return plan_launches(parse_manifest(json.dumps(manifest)), TASK, {"M": M}, LIMITS)


def _error(manifest: dict, M: int = 8192) -> str:
    with pytest.raises(ManifestError) as exc:
        _plan(manifest, M)
    assert exc.value.reason == "manifest_error" and "\n" not in str(exc.value)
    return str(exc.value)


def test_let_values_chain_in_order_into_every_field():
    big = _plan(SPLIT_OR_TILED, 8192)
    (lp,) = big.launches
    tiles = (8192 // 128) * (7168 // 256)  # 1792, bn = 256
    assert (lp.index, lp.kernel, lp.grid) == (2, "gemm_tiled", (132, 1, 1))
    assert [(a.kind, a.name, a.value) for a in lp.args[-2:]] == [("u32", "tiles", tiles), ("i32", "bn", 256)]
    assert big.tensor_maps[0].box == (256, 64)
    assert big.buffers[0].shape == (1, 8192, 7168)  # 132 // 1792 = 0 -> max(1, ...) = 1 split


def test_when_picks_the_launches_per_workload_and_keeps_their_manifest_index():
    small = _plan(SPLIT_OR_TILED, 70)
    assert [(lp.index, lp.kernel) for lp in small.launches] == [(0, "gemm_split_k"), (1, "gemm_reduce")]
    tiles = 1 * (7168 // 128)  # bn = 128 at M = 70: 56 tiles, 132 // 56 = 2 splits
    assert small.launches[0].grid == (tiles, 2, 1) and small.buffers[0].shape == (2, 70, 7168)
    assert small.tensor_maps[0].box == (128, 64)
    assert small.kernel_names == ["gemm_split_k", "gemm_reduce"]


@pytest.mark.parametrize("let, needle", [
    ({"M": "1"}, "let.M: 'M' is already an axis, scalar, function or tensor name"),
    ({"num_sms": "1"}, "let.num_sms: 'num_sms' is already"),
    ({"cdiv": "1"}, "let.cdiv: 'cdiv' is already"),
    ({"A": "1"}, "let.A: 'A' is already"),
    ({"a": "b + 1", "b": "2"}, "let.a: unknown name 'b'"),  # in order: a later name is not yet known
    ({"a": "M / 0"}, "let.a: "),
])
def test_a_let_that_would_mean_two_things_or_cannot_be_evaluated_names_itself(let, needle):
    assert needle in _error({**SPLIT_OR_TILED, "let": {**let, **SPLIT_OR_TILED["let"]}})


@pytest.mark.parametrize("let, needle", [
    ({"x y": "1"}, "`let` name 'x y' is not a word"),
    ({"9x": "1"}, "is not a word"),
    ({f"v{i}": "1" for i in range(MAX_LETS + 1)}, f"at most {MAX_LETS}"),
    ({"partial": "1"}, "`let` name 'partial' is also a buffer or tensor map"),
    ({"tmB": "1"}, "is also a buffer or tensor map"),
])
def test_let_names_are_checked_when_the_manifest_is_read(let, needle):
    with pytest.raises(SolutionError, match=needle):
        parse_manifest(json.dumps({**SPLIT_OR_TILED, "let": let}))


def test_a_let_passed_by_name_must_be_an_integer():
    m = json.loads(json.dumps(SPLIT_OR_TILED))
    m["let"]["half"] = "bn / 3"
    m["launches"][2]["args"][-1] = "half"
    assert "launches[2] ('gemm_tiled').args[5]: 'half' = 85.33" in _error(m)
    m["launches"][2]["args"][-1] = {"type": "f32", "value": "half"}  # typed, it may be any number
    assert _plan(m, 8192).launches[0].args[-1].value == pytest.approx(256 / 3)


def test_every_launch_false_for_a_workload_is_a_manifest_error_naming_the_shape():
    m = json.loads(json.dumps(SPLIT_OR_TILED))
    m["launches"] = m["launches"][:2]  # the split-K pair alone: nothing runs at M = 8192
    assert isinstance(_plan(m, 70).launches, list)
    assert _error(m, 8192) == ("launches: every launch's `when` is false for this workload "
                               "(M=8192, N=7168, K=5120): nothing would run")
    m["launches"][0]["when"] = "MM > 1"
    assert _error(m, 70).startswith("launches[0] ('gemm_split_k').when: ")


def test_a_skipped_launch_is_not_evaluated_for_that_workload():
    """Its sizes need not make sense where it does not run (a split count of 0 at large M)."""
    m = json.loads(json.dumps(SPLIT_OR_TILED))
    m["launches"][0]["grid"] = ["tiles", "num_sms // tiles"]  # 0 at M = 8192: refused only where it runs
    assert [lp.kernel for lp in _plan(m, 8192).launches] == ["gemm_tiled"]
    assert _plan(m, 70).launches[0].grid == (56, 2, 1)


KERNELS = r"""
extern "C" __global__ void gemm_split_k(const void* A, const void* tmB, float* partial, int M, int splits) {}
extern "C" __global__ void gemm_reduce(const float* partial, void* C, int M, int splits) {}
extern "C" __global__ void gemm_tiled(const void* A, const void* tmB, void* C, int M, unsigned tiles, int bn) {}
"""


def test_the_static_check_names_a_missing_kernel_even_in_a_launch_this_workload_skips():
    manifest = json.loads(json.dumps(SPLIT_OR_TILED))
    for lc in manifest["launches"]:  # tensor maps are passed by value: a pointer here is a mismatch;
        lc["args"] = [a for a in lc["args"] if a != "tmB"]  # keep the compiled signatures' shapes simple
    src = KERNELS.replace("const void* tmB, ", "")
    sol = Solution(language="cuda", source=src, manifest=parse_manifest(json.dumps(manifest)))
    comp = compile_solution(sol, "sm_90a")
    assert comp.status == "ok", comp.error
    for M in (70, 8192):
        assert static_check(sol, comp, TASK, TASK.axis_values({"M": M}), LIMITS) is None
    bad = Solution(language="cuda", source=src.replace("gemm_reduce", "gemm_reduce_v2"), manifest=sol.manifest)
    comp = compile_solution(bad, "sm_90a")
    err = static_check(bad, comp, TASK, TASK.axis_values({"M": 8192}), LIMITS)  # launch 1 does not run here
    assert err is not None and str(err).startswith("launches[1].kernel: 'gemm_reduce' is not in the compiled module")


def test_a_buffers_zero_can_be_an_expression_per_workload():
    """`zero` as an expression: a schedule that never reads its counters (here: the split-K path
    reduces elsewhere) asks for no memset there, and gets garbage instead; true and false stay as they were."""
    m = json.loads(json.dumps(SPLIT_OR_TILED))
    m["buffers"] += [{"name": "counters", "dtype": "int32", "shape": ["tiles"], "zero": "M > 128"},
                     {"name": "flags", "dtype": "int32", "shape": [4], "zero": False},
                     {"name": "sems", "dtype": "int32", "shape": [4]}]
    for M, counted in [(8192, True), (70, False)]:
        zero = {b.name: b.zero for b in _plan(m, M).buffers}
        assert zero == {"partial": True, "counters": counted, "flags": False, "sems": True}, M
        assert all(type(z) is bool for z in zero.values())


def test_a_bad_zero_expression_is_a_manifest_error_naming_the_buffer():
    m = json.loads(json.dumps(SPLIT_OR_TILED))
    m["buffers"].append({"name": "counters", "dtype": "int32", "shape": [4], "zero": "nonesuch > 1"})
    msg = _error(m)
    assert "buffers[1] ('counters').zero" in msg and "nonesuch" in msg
