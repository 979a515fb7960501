"""Manifest expressions (tools/expressions.py) by value: every operator and function computes what
a launch needs, and every refusal is a ValueError that names its reason. (The fuzz tests in
test_manifest_fuzz.py prove "ValueError and nothing else" over random text; the bounds are pinned
in test_mutation_gaps.py.) Fast enough to be the module's mutation-testing suite."""
from __future__ import annotations

import pytest

from tools.expressions import evaluate, names_in

ENV = {"M": 8192, "N": 7168, "K": 5120, "num_sms": 132, "half": 0.5}


@pytest.mark.parametrize("expr, value", [
    ("cdiv(M, 128) * cdiv(N, 256)", 64 * 28),
    ("ceil_div(1000, 128)", 8), ("cdiv(1024, 128)", 8), ("cdiv(1, 128)", 1), ("cdiv(0, 128)", 0),
    ("cdiv(-5, 2)", -2), ("cdiv(7.9, 2)", 4),  # int() of each argument first: 7 / 2 rounded up
    ("round_up(1000, 128)", 1024), ("round_up(1024, 128)", 1024), ("round_up(1, 64)", 64),
    ("min(num_sms, cdiv(M, 128) * (N // 256))", 132), ("max(1, 2)", 2), ("min(3, 1, 2)", 1),
    ("max(" + ", ".join(map(str, range(16))) + ")", 15),
    ("sqrt(16)", 4.0), ("log2(1024)", 10.0), ("int(7.9)", 7), ("float(3)", 3.0),
    ("M + N", 15360), ("M - N", 1024), ("M * 2", 16384), ("M / 4096", 2.0), ("M // 3", 2730),
    ("M % 1000", 192), ("2 ** 10", 1024), ("1 << 10", 1024), ("1024 >> 3", 128), ("-M", -8192), ("+M", 8192),
    ("half * 4", 2.0), ("2 ** -1", 0.5), ("(-8) ** 2", 64), ("4.0 ** 0.5", 2.0), ("(-2.0) ** 3", -8.0),
    ("M < N", 0), ("M > N", 1), ("M <= 8192", 1), ("M >= 8193", 0), ("M == 8192", 1), ("M != 8192", 0),
    ("128 if M > 4096 else 64", 128), ("128 if M < 4096 else 64", 64),
    ("1 << 64", 2**64), ("18446744073709551616", 2**64), ("-(2 ** 64)", -(2**64)),
])
def test_values(expr, value):
    got = evaluate(expr, ENV)
    assert got == value and type(got) is type(value), (expr, got)


def test_numbers_pass_through_and_are_checked():
    assert evaluate(128, {}) == 128 and evaluate(0.5, {}) == 0.5
    assert evaluate("  M  ", ENV) == 8192  # surrounding blanks are fine
    assert type(evaluate("M > 1", ENV)) is int  # a comparison is 0 or 1, never a bool
    for bad, why in [(True, "expected a number"), (None, "expected a number"), ([1], "expected a number"),
                     (2**65, "integer overflow"), (float("inf"), "non-finite"), (float("nan"), "non-finite")]:
        with pytest.raises(ValueError, match=why):
            evaluate(bad, {})


def _refusal(expr, env=ENV) -> str:
    with pytest.raises(ValueError) as info:
        evaluate(expr, env)
    return str(info.value)


@pytest.mark.parametrize("expr, why", [
    ("M / 0", "division by zero in 'M / 0'"), ("M // 0", "division by zero"), ("M % 0", "division by zero"),
    ("M / (N - N)", "division by zero"), ("cdiv(M, 0)", "division by zero in 'cdiv(M, 0)'"),
    ("ceil_div(M, 0.5)", "division by zero"), ("round_up(M, 0)", "division by zero"), ("0 ** -1", "division by zero"),
    ("1.5 << 2", "shift of a non-integer in '1.5 << 2'"), ("2 << 1.5", "shift of a non-integer"),
    ("1 << 65", "shift count 65 in '1 << 65' is outside 0..64"), ("1 << -1", "shift count -1"),
    ("1 >> 65", "shift count 65"),
    ("cdiv(M)", "cdiv() takes 2 arguments, got 1 in 'cdiv(M)'"), ("min(M)", "min() takes 2 to 16 arguments, got 1"),
    ("max(" + ", ".join(["1"] * 17) + ")", "max() takes 2 to 16 arguments, got 17"),
    ("sqrt(1, 2)", "sqrt() takes 1 arguments, got 2"),
    ("sqrt(-1)", "sqrt() failed in 'sqrt(-1)': math domain error"), ("log2(0)", "log2() failed"),
    ("int(1e308 * 10)", "non-finite"), ("int(float(2 ** 64) * 2.0 ** 960)", "non-finite"),
    ("unknown + 1", "unknown name 'unknown' in 'unknown + 1' (known: K, M, N, half, num_sms)"),
    ("M.real", "unsupported construct Attribute"), ("min(a=1, b=2)", "unsupported construct Call"),
    ("print(M)", "unsupported construct Call"), ("1 < M < 2", "unsupported construct Compare"),
    ("not M", "unsupported construct UnaryOp"), ("M & 1", "unsupported construct BinOp"),
    ("'M'", "constant 'M' in"), ("True", "constant True in"), ("None", "constant None in"),
    ("(-8.0) ** 0.5", "(-8.0)**0.5 in '(-8.0) ** 0.5' is not a real number"),
    ("2.0 ** 2000", "cannot evaluate '2.0 ** 2000': OverflowError"),
    ("1e308 * 10", "'1e308 * 10' produces a non-finite value (inf)"),
    ("cdiv(M,", "cannot parse expression 'cdiv(M,'"), ("M +", "cannot parse"), ("a\x00b", "cannot parse"),
    ("min(1, " * 45 + "1" + ")" * 45, "nested too deeply (more than 40 levels)"),
    ("-" * 60 + "1", "nested too deeply"),
])
def test_refusals_name_their_reason(expr, why):
    assert why in _refusal(expr), (expr, _refusal(expr))


def test_unknown_name_without_any_known():
    assert "(known: none)" in _refusal("M", {})


def test_long_text_is_refused_and_quoted_short():
    long = "M + " * 300 + "1"
    message = _refusal(long)
    assert f"is {len(long.strip())} characters long; at most 1000 are allowed" in message
    assert "'M + M + " in message and "...'" in message and len(message) < 200
    # an evaluation error of a long (but allowed) expression quotes it cut at 80 characters
    expr = "max(" + ", ".join(["num_sms"] * 12) + ") + nope"
    message = _refusal(expr)
    assert repr(expr[:77] + "...") in message and "unknown name 'nope'" in message
    assert repr("M" * 80) in _refusal("M" * 80, {}) and repr("M" * 77 + "...") in _refusal("M" * 81, {})


def test_a_value_does_not_depend_on_how_long_the_host_takes(monkeypatch):
    # A host that stalls mid-evaluation (another thread holding the GIL, a descheduled process):
    # every clock jumps a minute each time it is read. A legal expression keeps its value, so the
    # launch plan is the same in the static check, the worker and a credit process; a clock read
    # here would make a correct kernel's workload a manifest_error by host load.
    import time

    ticks = iter(range(0, 10**9, 60))
    for clock in ("perf_counter", "monotonic", "time", "process_time"):
        monkeypatch.setattr(time, clock, lambda: float(next(ticks)))
    for ns in ("perf_counter_ns", "monotonic_ns", "time_ns", "process_time_ns"):
        monkeypatch.setattr(time, ns, lambda: next(ticks) * 10**9)
    big = " + ".join(["cdiv(M, 128) * num_sms"] * 30)  # 300 nodes, within every limit
    assert evaluate(big, ENV) == 30 * 64 * 132
    assert evaluate("min(num_sms, cdiv(M, 128) * (N // 256))", ENV) == 132


def test_names_in():
    assert names_in("cdiv(M, 128) * min(num_sms, N)") == {"M", "num_sms", "N"}
    assert names_in("max(1, 2)") == set()  # function names are not axes
    assert names_in(128) == set() and names_in(True) == set() and names_in("cdiv(M,") == set()


# ---------------------------------------------------------------- the limits at their edges
def test_limits_hold_at_their_edges():
    # depth: an expression of depth 40 is allowed, 41 is not (each unary minus is one level)
    assert evaluate("-" * 39 + "1", {}) == -1
    assert "'" + "-" * 40 + "1' is nested too deeply" in _refusal("-" * 40 + "1")
    # nodes: 400 are allowed (a flat list: Expression, List, its load context and 397 elements), 401 are not
    assert "unsupported construct List" in _refusal("[" + ",".join(["1"] * 397) + "]")
    assert "is too large (more than 400 syntax nodes)" in _refusal("[" + ",".join(["1"] * 398) + "]")
    # characters: 1000 are allowed, 1001 are not
    assert evaluate("1." + "0" * 998, {}) == 1.0
    assert "1001 characters long" in _refusal("1." + "0" * 999)
    # shift counts 0 and 64 are allowed
    assert evaluate("5 << 0", {}) == 5 and evaluate("5 >> 0", {}) == 5 and evaluate("1 << 64", {}) == 2**64
    # a float power of a base in [0, 1) is real
    assert evaluate("0.0 ** 0.5", {}) == 0.0 and evaluate("0.25 ** 0.5", {}) == 0.5 and evaluate("0 ** 0", {}) == 1


def test_names_bound_to_non_numbers():
    assert evaluate("flag + 1", {"flag": True}) == 2
    got = evaluate("flag", {"flag": True})
    assert got == 1 and type(got) is int  # a bool is a number 0 or 1
    assert "'s' produces a str, not a real number" in _refusal("s", {"s": "text"})
    assert "'s * 2' produces a list, not a real number" in _refusal("s * 2", {"s": [1]})


def test_messages_quote_what_was_refused():
    assert "got bool True" in _refusal(True) and "got NoneType None" in _refusal(None)
    assert "got list [1, 2]" in _refusal([1, 2])
    assert "integer overflow in 36893488147419103232:" in _refusal(2**65)
    assert "inf produces a non-finite value" in _refusal(float("inf"))
    exactly_80 = "x + " + "M" * 76
    assert f"unknown name 'x' in {exactly_80!r}" in _refusal(exactly_80, {})
    wide = "[" + ",".join(["1"] * 420) + "]"
    assert f"expression {wide[:77] + '...'!r} is too large" in _refusal(wide)
