"""The launch plan (tools/launch.py, `plan_launches`): which launches run for a workload and with
what grid, block, cluster, shared memory and arguments; the `let` sizes, buffers and tensor maps; and
every check against the device, at its boundary. Pure Python on real tasks, a small made-up device so
that each limit is reached with small numbers. What is planned here is what the worker launches and
times: a plan that drifts (a launch dropped, a limit off by one, an argument in the wrong kind) is a
wrong timing or a garbage read, so the messages are pinned whole (a manifest author reads them)."""
from __future__ import annotations

import pytest

from tasks import get_task
from tools.launch import (ArgPlan, BufferPlan, DeviceLimits, LaunchPlan, ManifestError, Plan, TensorMapPlan,
                          check_param_sizes, plan_launches)
from tools.solution import LaunchManifest

GEMM = get_task("gemm")  # M varies; N 7168, K 5120; A [M, K], B [N, K], C [M, N] in bf16
MHA = get_task("mha_fwd_d64")  # a task with a scalar: sm_scale
SMALL = DeviceLimits(num_sms=7, max_smem_per_block=1000, max_threads_per_block=256, max_block=(256, 4, 2),
                     max_grid=(100, 10, 5), max_cluster=4)
WHERE = "launches[0] ('k')"


def _manifest(launch: dict | None = None, **rest) -> LaunchManifest:
    return LaunchManifest.model_validate({"launches": [{"kernel": "k", "grid": [1], "block": [32], **(launch or {})}],
                                          **rest})


def _plan(launch: dict | None = None, task=GEMM, axes: dict | None = None, limits: DeviceLimits = SMALL,
          **rest) -> Plan:
    return plan_launches(_manifest(launch, **rest), task, axes or {"M": 64}, limits)


def _error(launch: dict | None = None, **kw) -> tuple[str, str]:
    with pytest.raises(ManifestError) as exc:
        _plan(launch, **kw)
    return exc.value.reason, str(exc.value)


# ---------------------------------------------------------------- the plan's own figures

def test_a_manifest_error_is_a_manifest_error_unless_said_otherwise():
    assert ManifestError("x").reason == "manifest_error" and str(ManifestError("x")) == "x"
    assert ManifestError("y", "launch_error").reason == "launch_error"


@pytest.mark.parametrize("dtype, nbytes", [("bfloat16", 2), ("float16", 2), ("float32", 4), ("float8_e4m3fn", 1),
                                           ("int32", 4), ("int64", 8), ("uint8", 1)])
def test_a_buffer_holds_its_elements_times_their_size(dtype, nbytes):
    assert BufferPlan("b", dtype, (3, 5), True).nbytes == 15 * nbytes


@pytest.mark.parametrize("kind, nbytes", [("pointer", 8), ("tensor_map", 128), ("i32", 4), ("u32", 4), ("i64", 8),
                                          ("u64", 8), ("f32", 4)])
def test_an_argument_is_passed_in_its_kinds_bytes(kind, nbytes):
    assert ArgPlan(kind, "a").nbytes == nbytes


def test_kernel_names_are_each_launched_kernel_once_in_launch_order():
    launches = [LaunchPlan(i, k, (1, 1, 1), (1, 1, 1), None, 0, []) for i, k in enumerate(["b", "a", "b", "c"])]
    assert Plan(launches=launches).kernel_names == ["b", "a", "c"]


# ---------------------------------------------------------------- the manifest's args against the kernel's

def _launch(*args: ArgPlan) -> LaunchPlan:
    return LaunchPlan(0, "k", (1, 1, 1), (1, 1, 1), None, 0, list(args))


def _param_error(lp: LaunchPlan, sizes: list[int | None]) -> str:
    with pytest.raises(ManifestError) as exc:
        check_param_sizes(lp, sizes, WHERE)
    assert exc.value.reason == "launch_error"
    return str(exc.value)


def test_parameters_of_the_right_sizes_or_of_unknown_size_pass():
    lp = _launch(ArgPlan("pointer", "A"), ArgPlan("tensor_map", "tm"), ArgPlan("i32", "M", 4), ArgPlan("f32", "s", 1.0))
    check_param_sizes(lp, [8, 128, 4, 4], WHERE)
    check_param_sizes(lp, [None, None, None, None], WHERE)  # a size the PTX or driver does not give


def test_a_missing_or_extra_argument_is_a_launch_error_with_both_counts():
    lp = _launch(ArgPlan("pointer", "A"), ArgPlan("i32", "M", 4))
    assert _param_error(lp, [8]) == f"{WHERE}.args: kernel takes 1 parameters, the manifest gives 2"
    assert _param_error(lp, [8, 4, 4]) == f"{WHERE}.args: kernel takes 3 parameters, the manifest gives 2"


def test_a_misplaced_argument_names_its_index_and_both_sizes():
    lp = _launch(ArgPlan("pointer", "A"), ArgPlan("pointer", "B"), ArgPlan("u32", "n", 3))
    assert _param_error(lp, [8, 4, 4]) == (f"{WHERE}.args[1] 'B' is passed as pointer (8 bytes) but kernel "
                                           "parameter 1 is 4 bytes")
    assert _param_error(lp, [8, None, 8]).endswith("args[2] 'n' is passed as u32 (4 bytes) but kernel parameter 2 "
                                                   "is 8 bytes")  # the i64 hint is for i32 only


def test_an_int_where_the_kernel_takes_a_64_bit_integer_says_how_to_give_it():
    lp = _launch(ArgPlan("i32", "K", 5120))
    assert _param_error(lp, [8]) == (f"{WHERE}.args[0] 'K' is passed as i32 (4 bytes) but kernel parameter 0 is 8 bytes"
                                     ' (give it as {"type": "i64", "value": "K"})')
    assert "give it" not in _param_error(lp, [2])


# ---------------------------------------------------------------- grid, block, cluster, shared memory

def test_the_grid_block_and_cluster_are_padded_to_three_dims_and_the_device_is_the_one_asked():
    (lp,) = _plan({"grid": ["num_sms", "8 / 2"], "block": [2, 3], "cluster": ["M // 64", 4], "shared_bytes": "1000"}).launches
    assert (lp.index, lp.kernel, lp.grid, lp.block, lp.cluster, lp.shared_bytes) == (0, "k", (7, 4, 1), (2, 3, 1),
                                                                                   (1, 4, 1), 1000)
    assert all(type(v) is int for v in lp.grid + lp.block + lp.cluster)  # 8 / 2 is 4.0: a driver needs an int
    (lp,) = _plan().launches
    assert lp.cluster is None and lp.shared_bytes == 0 and lp.args == []


@pytest.mark.parametrize("grid", [[100, 10, 5], [1, 10], [1, 1, 5]])
def test_a_grid_at_the_device_limit_is_planned(grid):
    assert _plan({"grid": grid}).launches[0].grid == tuple(grid + [1] * (3 - len(grid)))


@pytest.mark.parametrize("grid, d, g, m", [([101], 0, 101, 100), ([1, 11], 1, 11, 10), ([1, 1, 6], 2, 6, 5)])
def test_a_grid_over_the_device_limit_names_its_dim(grid, d, g, m):
    assert _error({"grid": grid}) == ("launch_error", f"{WHERE}.grid[{d}] = {g} exceeds the device limit {m}")


@pytest.mark.parametrize("block", [[256], [64, 4], [128, 1, 2], [32, 4, 2]])
def test_a_block_within_every_limit_is_planned(block):
    assert _plan({"block": block}).launches[0].block == tuple(block + [1] * (3 - len(block)))


@pytest.mark.parametrize("block", [[257], [1, 5], [1, 1, 3], [128, 2, 2]])  # a dim over its limit; too many threads
def test_a_block_over_a_limit_is_a_launch_error_with_the_limits(block):
    shown = block + [1] * (3 - len(block))
    assert _error({"block": block}) == ("launch_error", f"{WHERE}.block = {shown}: at most 256 threads and "
                                                        "[256, 4, 2] per dim")


def test_shared_memory_from_none_up_to_the_device_limit():
    assert _plan({"shared_bytes": 0}).launches[0].shared_bytes == 0
    assert _plan({"shared_bytes": "999 + 1"}).launches[0].shared_bytes == 1000
    assert _error({"shared_bytes": 1001}) == ("launch_error", f"{WHERE}.shared_bytes = 1001 exceeds the device's "
                                                              "1000 bytes of shared memory per block")
    assert _error({"shared_bytes": -1}) == ("manifest_error", f"{WHERE}.shared_bytes: -1 = -1, must be at least 0")


def test_a_cluster_of_the_device_limit_that_divides_the_grid_is_planned():
    assert _plan({"grid": [4, 2, 2], "cluster": [1, 2, 2]}).launches[0].cluster == (1, 2, 2)
    assert _plan({"grid": [4, 3], "cluster": [4]}).launches[0].cluster == (4, 1, 1)


def test_a_cluster_over_the_device_limit_is_a_launch_error():
    assert _error({"grid": [10], "cluster": [5]}) == ("launch_error", f"{WHERE}.cluster = [5, 1, 1]: at most 4 "
                                                                      "blocks per cluster")


@pytest.mark.parametrize("grid, cluster, d", [([3], [2], 0), ([2, 3], [1, 2], 1), ([1, 1, 3], [1, 1, 2], 2)])
def test_a_cluster_that_does_not_divide_the_grid_names_the_dim(grid, cluster, d):
    full_g, full_c = grid + [1] * (3 - len(grid)), cluster + [1] * (3 - len(cluster))
    assert _error({"grid": grid, "cluster": cluster}) == (
        "launch_error", f"{WHERE}.cluster[{d}] = {full_c[d]} does not divide grid[{d}] = {full_g[d]}")


@pytest.mark.parametrize("field, value, message", [
    ("grid", [1, 0], "grid[1]: 0 = 0, must be at least 1"),
    ("grid", [1, "7 / 2"], "grid[1]: '7 / 2' = 3.5 is not an integer"),
    ("block", [1, 1, "M // 0"], "block[2]: "),
    ("cluster", [0], "cluster[0]: 0 = 0, must be at least 1"),
    ("shared_bytes", "1 / 3", "shared_bytes: '1 / 3' = 0.3333333333333333 is not an integer"),
])
def test_a_size_that_is_not_a_positive_integer_names_its_field_and_dim(field, value, message):
    reason, text = _error({field: value})
    assert reason == "manifest_error" and text.startswith(f"{WHERE}.{message}")


# ---------------------------------------------------------------- arguments

def test_each_named_argument_is_passed_in_its_own_kind():
    plan = _plan({"args": ["Q", "ws", "tmQ", "S", "num_sms", "tiles", "sm_scale"]}, task=MHA,
                 axes={"B": 2, "H": 3, "S": 256}, let={"tiles": "cdiv(S, 128) * num_sms"},
                 buffers=[{"name": "ws", "dtype": "float32", "shape": ["S"]}],
                 tensor_maps=[{"name": "tmQ", "tensor": "Q", "view": ["B * H * S", "D"], "box": [64, 64]}])
    got = [(a.kind, a.name, a.value) for a in plan.launches[0].args]
    assert got == [("pointer", "Q", None), ("pointer", "ws", None), ("tensor_map", "tmQ", None), ("i32", "S", 256),
                   ("i32", "num_sms", 7), ("i32", "tiles", 14), ("f32", "sm_scale", 0.125)]
    assert [type(a.value) for a in plan.launches[0].args[3:]] == [int, int, int, float]


def test_a_constant_axis_is_an_argument_too():
    args = _plan({"args": ["N", "K"]}).launches[0].args
    assert [(a.kind, a.value) for a in args] == [("i32", 7168), ("i32", 5120)]


def test_an_axis_or_let_passed_by_name_beyond_int32_is_named_not_wrapped():
    # ctypes.c_int32 wraps 2**31 to -2**31 silently: the kernel would read a negative size
    assert _error({"args": ["M"]}, axes={"M": 2**31}) == (
        "manifest_error", f"{WHERE}.args[0]: 'M' = {2**31} is outside the i32 range {-2**31}..{2**31 - 1}")
    assert _error({"args": ["t"]}, let={"t": "-M - 1"}, axes={"M": 2**31}) == (
        "manifest_error", f"{WHERE}.args[0]: 't' = {-2**31 - 1} is outside the i32 range {-2**31}..{2**31 - 1}")
    (a,) = _plan({"args": ["M"]}, axes={"M": 2**31 - 1}).launches[0].args
    assert (a.kind, a.name, a.value) == ("i32", "M", 2**31 - 1)


def test_an_unknown_argument_lists_every_name_the_launch_could_use_in_order():
    reason, text = _error({"args": ["Q", "x"]}, task=MHA, axes={"B": 2, "H": 3, "S": 256}, let={"t": 2, "u": 3},
                          buffers=[{"name": "ws", "dtype": "float32", "shape": [16]}],
                          tensor_maps=[{"name": "zmap", "tensor": "ws", "box": [16]},
                                       {"name": "amap", "tensor": "ws", "box": [8]}])
    assert (reason, text) == ("manifest_error", f"{WHERE}.args[1]: unknown name 'x' (known: Q, K, V, O, LSE, ws, amap, "
                                                "zmap, B, H, S, D, sm_scale, num_sms, t, u)")


@pytest.mark.parametrize("type_, value, planned", [
    ("f32", "3.4028234663852886e38", 3.4028234663852886e38), ("f32", "-3.4028234663852886e38", -3.4028234663852886e38),
    ("f32", 2, 2.0), ("i32", "8 / 2", 4), ("i32", 2**31 - 1, 2**31 - 1), ("i32", -2**31, -2**31),
    ("u32", 0, 0), ("u32", 2**32 - 1, 2**32 - 1), ("i64", 2**63 - 1, 2**63 - 1), ("i64", -2**63, -2**63),
    ("u64", 2**64 - 1, 2**64 - 1),
])
def test_a_by_value_argument_at_the_ends_of_its_type_is_passed_as_that_type(type_, value, planned):
    (a,) = _plan({"args": [{"type": type_, "value": value}]}).launches[0].args
    assert (a.kind, a.name, a.value, type(a.value)) == (type_, str(value), planned, type(planned))


def test_a_by_value_argument_that_cannot_be_evaluated_names_its_place():
    assert _error({"args": ["A", {"type": "i32", "value": "MM"}]}) == (
        "manifest_error", f"{WHERE}.args[1]: unknown name 'MM' in 'MM' (known: K, M, N, num_sms)")


def test_a_named_by_value_argument_keeps_its_name():
    (a,) = _plan({"args": [{"name": "tiles", "type": "u32", "value": "M // 16"}]}).launches[0].args
    assert (a.kind, a.name, a.value) == ("u32", "tiles", 4)


@pytest.mark.parametrize("type_, value, message", [
    ("f32", "1e39", "'1e39' = 1e+39 does not fit in f32 (|v| <= 3.40282e+38)"),
    ("f32", "-1e39", "'-1e39' = -1e+39 does not fit in f32 (|v| <= 3.40282e+38)"),
    ("i32", "5 / 2", "'5 / 2' = 2.5 is not an integer (i32)"),
    ("i32", 2**31, f"{2**31} = {2**31} is outside the i32 range {-2**31}..{2**31 - 1}"),
    ("i32", -2**31 - 1, f"{-2**31 - 1} = {-2**31 - 1} is outside the i32 range {-2**31}..{2**31 - 1}"),
    ("u32", -1, f"-1 = -1 is outside the u32 range 0..{2**32 - 1}"),
    ("u64", 2**64, f"{2**64} = {2**64} is outside the u64 range 0..{2**64 - 1}"),
])
def test_a_by_value_argument_that_does_not_fit_its_type_is_named(type_, value, message):
    assert _error({"args": ["A", {"type": type_, "value": value}]}) == ("manifest_error", f"{WHERE}.args[1]: {message}")


# ---------------------------------------------------------------- buffers and tensors

def test_the_tasks_tensors_and_the_buffers_are_planned_with_their_shapes():
    plan = _plan(buffers=[{"name": "ws", "dtype": "float32", "shape": ["M", "N // 7168 * 4"], "zero": False},
                          {"name": "sem", "dtype": "int32", "shape": ["num_sms"]}])
    assert plan.buffers == [BufferPlan("ws", "float32", (64, 4), False), BufferPlan("sem", "int32", (7,), True)]
    assert plan.tensors == {"A": ("bfloat16", (64, 5120)), "B": ("bfloat16", (7168, 5120)),
                            "C": ("bfloat16", (64, 7168)), "ws": ("float32", (64, 4)), "sem": ("int32", (7,))}


def test_64_gib_of_scratch_in_one_buffer_or_in_all_is_planned_and_one_byte_more_is_not():
    assert _plan(buffers=[{"name": "w", "dtype": "uint8", "shape": [2**36]}]).buffers[0].nbytes == 2**36
    assert _error(buffers=[{"name": "v", "dtype": "uint8", "shape": [2**36 + 1]}]) == (
        "manifest_error", "buffers[0] ('v'): 64.0 GiB is more than the 64 GiB allowed")
    # the limit is on all the scratch: 64 GiB in two buffers is planned, one byte more is not
    halves = [{"name": "a", "dtype": "uint8", "shape": [2**35]}, {"name": "b", "dtype": "float32", "shape": [2**33]}]
    assert sum(b.nbytes for b in _plan(buffers=halves).buffers) == 2**36
    assert _error(buffers=[*halves, {"name": "c", "dtype": "uint8", "shape": [1]}]) == (
        "manifest_error", "buffers[2] ('c'): 0.0 GiB (64.0 GiB with the buffers before it) is more than the 64 GiB "
                          "allowed")


def test_a_buffer_named_as_a_tensor_or_with_a_bad_size_is_named():
    assert _error(buffers=[{"name": "w", "dtype": "uint8", "shape": [4]},
                           {"name": "C", "dtype": "uint8", "shape": [4]}]) == (
        "manifest_error", "buffers[1] ('C'): name clashes with the task's tensor 'C'")
    assert _error(buffers=[{"name": "w", "dtype": "uint8", "shape": [4, "M - 64"]}]) == (
        "manifest_error", "buffers[0] ('w').shape[1]: 'M - 64' = 0, must be at least 1")


# ---------------------------------------------------------------- tensor maps

def _tmap(**fields) -> dict:
    return {"name": "t", "tensor": "A", "box": [64, 64], **fields}


def test_a_tensor_map_carries_every_field_to_the_plan():
    plan = _plan(tensor_maps=[_tmap(box=[256, 16], swizzle="32B", l2_promotion="128B", oob_fill="nan",
                                    element_strides=[1, 8]),
                              {"name": "u", "tensor": "A", "view": ["M * 40", 128], "box": [2, 64]}])
    assert plan.tensor_maps == [
        TensorMapPlan("t", "A", "bfloat16", (64, 5120), (256, 16), (1, 8), "32B", "128B", "nan"),
        TensorMapPlan("u", "A", "bfloat16", (2560, 128), (2, 64), (1, 1), "none", "none", "zero")]


def test_a_tensor_map_on_a_buffer_takes_the_buffers_dtype_and_shape():
    (tm,) = _plan(buffers=[{"name": "ws", "dtype": "float32", "shape": ["M", 4]}],
                  tensor_maps=[{"name": "t", "tensor": "ws", "box": [8, 4]}]).tensor_maps
    assert (tm.dtype, tm.view, tm.box) == ("float32", (64, 4), (8, 4))  # 4 x 4 B: 16 bytes, enough


@pytest.mark.parametrize("swizzle, inner", [("32B", 16), ("64B", 32), ("128B", 64), ("none", 256)])
def test_a_swizzle_span_may_be_filled_exactly(swizzle, inner):
    assert _plan(tensor_maps=[_tmap(box=[1, inner], swizzle=swizzle)]).tensor_maps[0].box == (1, inner)


@pytest.mark.parametrize("swizzle, span", [("32B", 32), ("64B", 64), ("128B", 128)])
def test_a_box_wider_than_its_swizzle_span_is_refused(swizzle, span):
    inner = span // 2 + 8  # in three dims: the innermost is the last, not the second
    assert _error(tensor_maps=[_tmap(view=[64, 40, 128], box=[1, 8, inner], swizzle=swizzle)]) == (
        "manifest_error", f"tensor_maps[0] ('t'): swizzle {swizzle} needs the innermost box dim to span at most "
                          f"{span} bytes, {inner} x 2 B = {inner * 2} B")


@pytest.mark.parametrize("fields, message", [
    ({"name": "C"}, "tensor_maps[0] ('C'): name clashes with tensor 'C'"),
    ({"tensor": "Z"}, "tensor_maps[0] ('t').tensor: unknown tensor 'Z' (known: A, B, C)"),
    ({"box": [64]}, "tensor_maps[0] ('t').box: 1 dims but the tensor has 2 (give a view)"),
    ({"view": ["M", 5120, 2], "box": [1, 64, 2]},
     "tensor_maps[0] ('t').view: [64, 5120, 2] has 655360 elements, 'A' [64, 5120] has 327680"),
    ({"box": [257, 64]}, "tensor_maps[0] ('t').box: [257, 64]: TMA boxes have at most 256 elements per dim"),
    ({"box": [1, 257]}, "tensor_maps[0] ('t').box: [1, 257]: TMA boxes have at most 256 elements per dim"),
    ({"box": [64, 4]}, "tensor_maps[0] ('t').box: innermost box dim 4 x 2 B is not a multiple of 16 bytes"),
    ({"view": [64, 40, 128], "box": [1, 8, 4]},
     "tensor_maps[0] ('t').box: innermost box dim 4 x 2 B is not a multiple of 16 bytes"),
    ({"view": [2048, 16, 10], "box": [1, 1, 8]},
     "tensor_maps[0] ('t').view: the stride of dim 1 is 20 bytes, TMA needs a multiple of 16"),
    ({"view": [1024, 20, 16], "box": [1, 1, 8]},  # dim 1: 32 B; dim 0: 640 B; the innermost has no stride
     None),
    ({"element_strides": [0, 1]}, "tensor_maps[0] ('t').element_strides: each must be 1..8"),
    ({"element_strides": [1, 9]}, "tensor_maps[0] ('t').element_strides: each must be 1..8"),
    ({"view": ["M", "K / 0"]}, "tensor_maps[0] ('t').view[1]: "),
    ({"box": [64, "0"]}, "tensor_maps[0] ('t').box[1]: '0' = 0, must be at least 1"),
])
def test_a_tensor_map_the_hardware_cannot_use_is_named(fields, message):
    if message is None:
        assert _plan(tensor_maps=[_tmap(**fields)]).tensor_maps[0].view == tuple(fields["view"])
        return
    reason, text = _error(tensor_maps=[_tmap(**fields)])
    assert reason == "manifest_error" and text.startswith(message) and (text == message or message.endswith(": "))


# ---------------------------------------------------------------- let and when

def test_let_values_reach_every_field_and_chain_in_order():
    plan = _plan({"grid": ["tiles"], "block": ["threads"], "shared_bytes": "smem", "args": ["tiles"]},
                 let={"threads": "2 * 64", "tiles": "cdiv(M, threads)", "smem": "threads * 4", "rows": "M + tiles"},
                 buffers=[{"name": "ws", "dtype": "float32", "shape": ["rows"]}],
                 tensor_maps=[{"name": "t", "tensor": "ws", "box": ["threads // 32 * 4"]}])
    (lp,) = plan.launches
    assert (lp.grid, lp.block, lp.shared_bytes, lp.args[0].value) == ((1, 1, 1), (128, 1, 1), 512, 1)
    assert plan.buffers[0].shape == (65,) and plan.tensor_maps[0].box == (16,)


@pytest.mark.parametrize("name", ["S", "D", "sm_scale", "num_sms", "cdiv", "O"])  # axis, constant axis, scalar,
def test_a_let_name_that_is_taken_is_refused(name):  # the device's, a function, a tensor
    assert _error(task=MHA, axes={"B": 2, "H": 3, "S": 256}, let={"ok": 1, name: 2}) == (
        "manifest_error", f"let.{name}: {name!r} is already an axis, scalar, function or tensor name")


def test_a_let_that_cannot_be_evaluated_names_itself():
    assert _error(let={"a": 1, "b": "a / 0"})[1].startswith("let.b: ")


def test_a_launch_runs_where_its_when_is_true_and_keeps_its_manifest_index():
    m = LaunchManifest.model_validate({"let": {"small": "M <= 128"}, "launches": [
        {"kernel": "split", "when": "small", "grid": [1], "block": [32]},
        {"kernel": "never", "when": 0, "grid": [0], "block": [32]},  # not evaluated where it does not run
        {"kernel": "tiled", "when": "M > 128", "grid": [2], "block": [32]},
        {"kernel": "always", "grid": [3], "block": [32]}]})
    small, big = (plan_launches(m, GEMM, {"M": M}, SMALL) for M in (64, 256))
    assert [(lp.index, lp.kernel) for lp in small.launches] == [(0, "split"), (3, "always")]
    assert [(lp.index, lp.kernel, lp.grid) for lp in big.launches] == [(2, "tiled", (2, 1, 1)), (3, "always", (3, 1, 1))]


def test_a_when_that_cannot_be_evaluated_or_is_never_true_is_named():
    assert _error({"when": "MM"})[1].startswith(f"{WHERE}.when: ")
    assert _error({"when": "M > 64"}) == ("manifest_error", "launches: every launch's `when` is false for this "
                                                            "workload (M=64, N=7168, K=5120): nothing would run")
