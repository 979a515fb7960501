"""Manifests written by an adversary: parsing and launch planning never raise anything but
their own one-line errors, and never hang.

The property (hypothesis): for any JSON text, `parse_manifest` returns a LaunchManifest or
raises SolutionError; for any manifest it returns, `plan_launches` on a real task returns a
Plan or raises ManifestError. Each example must finish well under a second. Fixed cases
pin the classes found by hand: huge powers, power towers, long sums, deep nesting,
non-finite floats, out-of-range scalar arguments.
"""
from __future__ import annotations

import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tasks import get_task
from tools.expressions import evaluate
from tools.launch import NOMINAL_LIMITS, ManifestError, Plan, plan_launches
from tools.solution import SolutionError, parse_manifest

TASK = get_task("gemm")
AXES = TASK.axis_values(TASK.workloads[0])
LIMITS = NOMINAL_LIMITS["sm_90a"]
KNOWN = ["M", "N", "K", "num_sms"]
PER_EXAMPLE_S = 1.0

# ---------------------------------------------------------------- expressions from a grammar

_leaf = st.one_of(
    st.integers(-2**70, 2**70).map(str),
    st.sampled_from(["0", "1", "2", "9", "128", "10**400", "1e400", "1e-400", "0.5", "-0.0", "nan", "inf",
                     "True", "None", "'s'", "\"x\"", "1j", "[1]", "M.bit_length()", "__import__('os')"]),
    st.sampled_from(KNOWN + ["MM", "sm_scale", "x", "_", "lambda"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)
_BINOPS = ["+", "-", "*", "/", "//", "%", "**", "<<", ">>", "<", "<=", "==", "!=", ">", ">=", "and", "&", "|", "^"]
_FUNCS = ["cdiv", "ceil_div", "round_up", "min", "max", "sqrt", "log2", "int", "float", "abs", "pow", "eval"]


def _extend(children):
    return st.one_of(
        st.tuples(children, st.sampled_from(_BINOPS), children).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(st.sampled_from(["-", "+", "~", "not "]), children).map(lambda t: f"{t[0]}{t[1]}"),
        st.tuples(st.sampled_from(_FUNCS), st.lists(children, max_size=4)).map(lambda t: f"{t[0]}({', '.join(t[1])})"),
        st.tuples(children, children, children).map(lambda t: f"({t[0]} if {t[1]} else {t[2]})"),
    )


_grammar = st.recursive(_leaf, _extend, max_leaves=40)
_pathological = st.one_of(
    st.integers(1, 8).map(lambda k: "**".join(["9"] * (k + 1))),  # power towers
    st.integers(1, 70_000).map(lambda n: "+".join(["1"] * n)),  # long sums
    st.integers(1, 5_000).map(lambda n: "(" * n + "1" + ")" * n),  # deep parentheses
    st.integers(1, 5_000).map(lambda n: "-" * n + "1"),  # deep unary chains
    st.integers(1, 3_000).map(lambda n: "max(1, " * n + "1" + ")" * n),  # deep calls
    st.integers(0, 200).map(lambda n: f"2**{n}"),
    st.integers(0, 200).map(lambda n: f"1 << {n}"),
    st.integers(1, 5_000).map(lambda n: "9" * n),  # long literals
)
expressions = st.one_of(_grammar, _pathological)

# ---------------------------------------------------------------- manifests

# Benign expressions (known names, small numbers) so that some manifests plan, mixed with
# the hostile grammar above so that every field also sees every kind of attack.
_benign = st.recursive(
    st.one_of(st.integers(1, 512).map(str), st.sampled_from(KNOWN)),
    lambda c: st.one_of(
        st.tuples(c, st.sampled_from(["+", "*", "//"]), c).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(st.sampled_from(["cdiv", "min", "max"]), c, c).map(lambda t: f"{t[0]}({t[1]}, {t[2]})")),
    max_leaves=6)
_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**80, 2**80), st.floats(), st.text(max_size=20))
_any_json = st.recursive(_json_leaf, lambda c: st.one_of(st.lists(c, max_size=4),
                                                         st.dictionaries(st.text(max_size=8), c, max_size=4)),
                         max_leaves=20)
# a value where the schema wants a number: mostly expressions, sometimes anything at all
_value = st.one_of(_benign, _benign, st.integers(1, 256), expressions, st.integers(-2**80, 2**80), st.floats(),
                   st.booleans(), _any_json)


def _dims(lo: int, hi: int):
    return st.lists(_value, min_size=lo, max_size=hi)


_arg = st.one_of(
    st.sampled_from(["A", "B", "C", "M", "N", "K", "num_sms", "tmA", "buf", "nope", "bn", "tiles"]),
    st.fixed_dictionaries({"type": st.sampled_from(["i32", "u32", "i64", "u64", "f32", "f64"]), "value": _value}),
    _any_json,
)
_buffer = st.fixed_dictionaries({"name": st.sampled_from(["buf", "buf", "A", "tmA"]),
                                 "dtype": st.sampled_from(["float32", "int32", "uint8", "complex64"]),
                                 "shape": _dims(1, 4)}, optional={"zero": st.booleans()})
_tensor_map = st.fixed_dictionaries(
    {"name": st.sampled_from(["tmA", "tmA", "tmB", "buf"]), "tensor": st.sampled_from(["A", "B", "C", "buf", "Q"]),
     "box": _dims(1, 5)},
    optional={"view": _dims(1, 5), "swizzle": st.sampled_from(["none", "128B", "256B"]),
              "element_strides": st.lists(st.integers(-3, 12), max_size=4)})
_launch = st.fixed_dictionaries(
    {"kernel": st.sampled_from(["k", "gemm", ""]), "grid": _dims(1, 3), "block": _dims(1, 3)},
    optional={"cluster": _dims(1, 3), "shared_bytes": _value, "args": st.lists(_arg, max_size=5),
              "when": st.one_of(_value, st.sampled_from(["M > 64", "M <= 64", "0", "bn > 128"]))})
# named sizes: plausible ones (used by the benign expressions below), clashing ones, non-words, anything
_let = st.dictionaries(st.sampled_from(["bn", "tiles", "M", "cdiv", "A", "buf", "x y", "", "bn2"]),
                       st.one_of(_value, st.sampled_from(["128 if M <= 64 else 256", "cdiv(M, bn)", "bn2 + 1"])),
                       max_size=3)
_plausible = st.fixed_dictionaries({"launches": st.lists(_launch, min_size=1, max_size=2)},
                                   optional={"buffers": st.lists(_buffer, max_size=2),
                                             "tensor_maps": st.lists(_tensor_map, max_size=2), "let": _let})
manifests = st.one_of(_plausible, _plausible, _plausible, _any_json,
                      st.dictionaries(st.sampled_from(["launches", "buffers", "tensor_maps", "let", "x"]), _any_json))


def _check(text: str) -> None:
    t0 = time.perf_counter()
    try:
        manifest = parse_manifest(text)
    except SolutionError:
        return
    try:
        assert isinstance(plan_launches(manifest, TASK, AXES, LIMITS), Plan)
    except ManifestError as exc:
        assert exc.reason in ("manifest_error", "launch_error") and "\n" not in str(exc)
    assert time.perf_counter() - t0 < PER_EXAMPLE_S


@settings(max_examples=300, deadline=2000, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(manifests)
def test_any_manifest_plans_or_fails_with_a_manifest_error(data):
    _check(json.dumps(data))  # NaN and Infinity become JSON's non-standard tokens, which json.loads reads


@settings(max_examples=400, deadline=2000, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(expressions, st.sampled_from(["grid", "block", "shared_bytes", "i32", "u64", "f32", "shape"]))
def test_any_expression_in_any_field(expr, field):
    launch = {"kernel": "k", "grid": [1], "block": [32], "args": []}
    manifest = {"launches": [launch]}
    if field in ("grid", "block"):
        launch[field] = [expr]
    elif field == "shared_bytes":
        launch["shared_bytes"] = expr
    elif field == "shape":
        manifest["buffers"] = [{"name": "buf", "dtype": "float32", "shape": [expr]}]
    else:
        launch["args"] = [{"type": field, "value": expr}]
    _check(json.dumps(manifest))


@settings(max_examples=300, deadline=1000, derandomize=True, database=None)
@given(expressions)
def test_evaluate_raises_only_value_error(expr):
    t0 = time.perf_counter()
    try:
        v = evaluate(expr, {"M": 8192, "N": 7168, "K": 5120, "num_sms": 132})
        assert isinstance(v, (int, float)) and not isinstance(v, bool)
    except ValueError:
        pass
    assert time.perf_counter() - t0 < PER_EXAMPLE_S


# ---------------------------------------------------------------- the classes found by hand

def _plan_error(launch_extra: dict | None = None, buffers: list | None = None) -> str:
    launch = {"kernel": "k", "grid": [1], "block": [32], **(launch_extra or {})}
    manifest = parse_manifest(json.dumps({"launches": [launch], "buffers": buffers or []}))
    with pytest.raises(ManifestError) as exc:
        plan_launches(manifest, TASK, AXES, LIMITS)
    return str(exc.value)


@pytest.mark.parametrize("extra,field,needle", [
    ({"args": [{"type": "f32", "value": "10**400"}]}, "args[0]", "overflow"),
    ({"args": [{"type": "f32", "value": "1e39"}]}, "args[0]", "does not fit in f32"),
    ({"args": [{"type": "f32", "value": "1e400"}]}, "args[0]", "non-finite"),
    ({"args": [{"type": "i32", "value": "2**31"}]}, "args[0]", "outside the i32 range"),
    ({"args": [{"type": "u32", "value": "-1"}]}, "args[0]", "outside the u32 range"),
    ({"args": [{"type": "u64", "value": "2**64"}]}, "args[0]", "outside the u64 range"),
    ({"args": [{"type": "i64", "value": "0.5"}]}, "args[0]", "not an integer"),
    ({"grid": ["9**9**9"]}, "grid[0]", "overflow"),
    ({"grid": ["+".join(["1"] * 20_000)]}, "grid[0]", "characters long"),
    ({"grid": ["-" * 500 + "1"]}, "grid[0]", "nested too deeply"),
    ({"grid": ["(" * 300 + "1" + ")" * 300]}, "grid[0]", "cannot parse"),
    ({"block": ["1 << 100"]}, "block[0]", "shift count"),
    ({"shared_bytes": "sqrt(-1)"}, "shared_bytes", "sqrt"),
    ({"grid": ["__import__('os').getpid()"]}, "grid[0]", "unsupported"),
])
def test_hand_found_manifest_classes_are_manifest_errors(extra, field, needle):
    t0 = time.perf_counter()
    msg = _plan_error(extra)
    assert f"launches[0] ('k').{field}" in msg and needle in msg and "\n" not in msg and len(msg) < 600
    assert time.perf_counter() - t0 < PER_EXAMPLE_S


def test_a_50000_term_sum_is_a_value_error_not_a_recursion_error():
    with pytest.raises(ValueError, match="characters long"):
        evaluate("+".join(["1"] * 50_000), {})


@pytest.mark.parametrize("shape,needle", [(["-4"], "at least 1"), (["2**40", "2**20"], "GiB"), ([0], "at least 1")])
def test_bad_buffer_shapes_name_the_field(shape, needle):
    msg = _plan_error(buffers=[{"name": "buf", "dtype": "float32", "shape": shape}])
    assert "buffers[0] ('buf')" in msg and needle in msg


@pytest.mark.parametrize("text,needle", [("[" * 100_000, "nested too deeply"), ("{" + " " * 200_000 + "}", "at most")])
def test_hostile_json_text_is_a_solution_error(text, needle):
    with pytest.raises(SolutionError, match=needle):
        parse_manifest(text)
