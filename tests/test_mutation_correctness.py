"""The judge's arithmetic (tools/correctness.py) pinned to hand-computed values, on CPU tensors:
the guards, the poison, and `compare`'s three rules at their edges. Fast enough to run once per
mutant (scripts/mutation.sh); tests/test_evaluator_cpu.py runs the same code inside the worker.
Values are chosen exactly representable, so every bound is checked at equality and one step past."""
from __future__ import annotations

import math

import pytest
import torch

from tasks.schema import RowTolerance, Tolerance
from tools import correctness as C
from tools.correctness import CANARY, GUARD_BYTES, Guarded, compare, poison_, poison_mask

NAN, INF = float("nan"), float("inf")


# --- guards -----------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,dtype,size", [((3, 5), torch.float32, 4), ((7,), torch.bfloat16, 2),
                                              ((2, 3), torch.uint8, 1)])
def test_guarded_layout(shape, dtype, size):
    g = Guarded(shape, dtype, device="cpu")
    assert g.nbytes == math.prod(shape) * size
    assert g.tensor.shape == shape and g.tensor.dtype == dtype and g.data_ptr() == g.tensor.data_ptr()
    assert g.data_ptr() % 256 == 0 and g.end - g.start == g.nbytes
    assert g.raw.numel() == 2 * GUARD_BYTES + g.nbytes + 2 * 256  # one allocation: guards, tensor, alignment slack
    assert GUARD_BYTES <= g.start < GUARD_BYTES + 256 and g.raw.numel() - g.end >= GUARD_BYTES
    assert g.data_ptr() == g.raw.data_ptr() + g.start
    assert bool((g.raw == CANARY).all()) and g.guard_damage() == (0, 0)


@pytest.mark.parametrize("misalign", [64, 128, 192, 0])
def test_the_tensor_is_aligned_whatever_the_allocation(monkeypatch, misalign):
    """An allocation that starts `misalign` bytes past a 256-byte boundary (glibc's large chunks
    start 16-64 bytes into a page): the tensor still starts on a boundary, inside the guards."""
    real = torch.empty

    def empty(size, *, dtype, device=None):
        if not isinstance(size, int):
            return real(size, dtype=dtype, device=device)
        buf = real(size + 512, dtype=dtype, device=device)
        off = (misalign - buf.data_ptr()) % 256
        return buf[off:off + size]

    monkeypatch.setattr(torch, "empty", empty)
    g = Guarded((3,), torch.float32, device="cpu")
    assert g.raw.data_ptr() % 256 == misalign
    assert g.data_ptr() % 256 == 0 and g.start == GUARD_BYTES + (256 - misalign) % 256
    assert g.raw.numel() - g.end >= GUARD_BYTES


@pytest.mark.parametrize("guard", [100, 1000])
def test_the_tensor_is_aligned_whatever_the_guard_size(monkeypatch, guard):
    """The alignment is counted from the allocation's address past the guard, not from the guard size
    alone (64 KiB, a multiple of 256, hides the sign of the guard's term)."""
    monkeypatch.setattr(C, "GUARD_BYTES", guard)
    g = Guarded((3,), torch.float32, device="cpu")
    assert g.data_ptr() % 256 == 0 and guard <= g.start < guard + 256 and g.raw.numel() - g.end >= guard


def test_guarded_allocates_on_the_device_it_is_given():
    g = Guarded((4,), torch.float32, device="meta")  # a device that is not the default one
    assert g.raw.device.type == "meta" and g.tensor.device.type == "meta"


def test_guard_damage_counts_each_side_and_reset_restores_only_the_guards():
    g = Guarded((4,), torch.float32, device="cpu")
    g.tensor.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert g.guard_damage() == (0, 0)
    g.raw[0] = 0
    g.raw[g.start - 1] = 1
    g.raw[g.end] = 2
    g.raw[g.end + 1] = 3
    g.raw[-1] = 4
    assert g.guard_damage() == (2, 3)
    g.reset_guards()
    assert g.guard_damage() == (0, 0) and int(g.raw[0]) == CANARY and int(g.raw[-1]) == CANARY
    assert g.tensor.tolist() == [1.0, 2.0, 3.0, 4.0]


# --- poison and garbage -----------------------------------------------------------------------

POISON_BITS = {torch.bfloat16: 0x7FD5, torch.float16: 0x7ED5, torch.float32: 0x7FD55A5A, torch.float8_e4m3fn: 0x7F,
               torch.int32: 0x5AA5A55A, torch.int64: 0x5AA5A55A5AA5A55A, torch.uint8: 0xA5}


@pytest.mark.parametrize("dtype", list(POISON_BITS), ids=str)
def test_poison_is_a_fixed_bit_pattern(dtype):
    t = torch.zeros(5, dtype=dtype)
    assert not poison_mask(t).any()
    poison_(t)
    assert poison_mask(t).tolist() == [True] * 5
    width = t.element_size()
    raw = t.view(torch.uint8).reshape(5, width)[0].tolist()
    assert int.from_bytes(bytes(raw), "little") == POISON_BITS[dtype]
    if dtype.is_floating_point:
        assert bool(torch.isnan(t.float()).all())
    t[2] = 0
    assert poison_mask(t).tolist() == [True, True, False, True, True]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_arithmetic_nan_is_not_poison(dtype):
    assert not poison_mask(torch.full((3,), NAN, dtype=dtype)).any()
    assert not poison_mask(torch.zeros(3, dtype=dtype) / 0).any()


def test_poison_with_the_sign_bit_set(monkeypatch):
    """A pattern with the top bit set is filled through the signed view (as fill_ wants) and
    still reads back as that pattern."""
    monkeypatch.setitem(C._POISON, torch.float16, (torch.int16, 0xFED5))
    monkeypatch.setitem(C._POISON, torch.float32, (torch.int32, 0xFFD55A5A))
    assert C._poison_bits(torch.float16) == (torch.int16, 0xFED5 - 0x10000)
    assert C._poison_bits(torch.float32) == (torch.int32, 0xFFD55A5A - 2 ** 32)
    assert C._poison_bits(torch.uint8) == (torch.uint8, 0xA5)  # an unsigned view takes it as is
    assert C._poison_bits(torch.bfloat16) == (torch.int16, 0x7FD5)
    t = torch.zeros(2, dtype=torch.float16)
    poison_(t)
    assert t.view(torch.uint8).tolist() == [0xD5, 0xFE] * 2 and poison_mask(t).all()


@pytest.mark.parametrize("dtype", list(C.TORCH_DTYPES.values()), ids=str)
def test_garbage_is_random_bytes_new_on_every_fill(dtype):
    """A zero=false buffer holds nothing a kernel could count from or test for as "unset": no
    constant byte (0x5A5A5A5A counters), not NaN (isnan as a sentinel), and other bytes each run."""
    t = torch.zeros(64 * 1024 // torch.empty((), dtype=dtype).element_size(), dtype=dtype)
    C.garbage_(t)
    first = t.clone()
    assert len(torch.unique(first.view(torch.uint8))) == 256  # every byte value, 0 too (64 KiB: all but surely)
    if dtype.is_floating_point:
        assert not torch.isnan(first.float()).all()
    C.garbage_(t)
    assert not C.same_bits(t, first)


def test_an_output_is_poisoned_for_the_checks_and_by_a_secret_coin_for_the_timed_runs():
    """fill_output_: the seeded checks (secret False) always poison (the unwritten_output diagnosis);
    the timed and counted runs (secret True) poison or fill with random bytes, each about half the time,
    so the poison marks no element "unset" a kernel could rely on. The return value says which."""
    t = torch.zeros(4096, dtype=torch.bfloat16)
    assert all(C.fill_output_(t, secret=False) and poison_mask(t).all() for _ in range(64))
    kinds = []
    for _ in range(1024):  # a fair coin lands outside 3/8-5/8 with chance below 1e-15; a 1-in-4 coin inside, never
        poisoned = C.fill_output_(t, secret=True)
        assert bool(poison_mask(t).all()) == poisoned  # random bytes: the pattern by chance, never
        kinds.append(poisoned)
    assert 384 <= sum(kinds) <= 640, sum(kinds)


def test_garbage_does_not_follow_the_global_seed():
    """Its generator is its own, seeded from os.urandom: a run that seeds torch (every seeded
    input generation does) cannot make the fill predictable."""
    fills = []
    with torch.random.fork_rng(devices=[]):
        for _ in range(2):
            torch.manual_seed(0)
            t = torch.empty(4096, dtype=torch.uint8)
            C.garbage_(t)
            fills.append(t)
    assert not torch.equal(*fills)


def test_same_bits():
    a = torch.tensor([1.0, -0.0, NAN])
    assert C.same_bits(a, a.clone()) and C.same_bits(a.reshape(3, 1), a)
    assert not C.same_bits(a, torch.tensor([1.0, 0.0, NAN]))  # -0.0 and 0.0 differ in their bits
    assert not C.same_bits(a, torch.tensor([1.0, -0.0, 2.0]))
    assert C.same_bits(torch.tensor([1], dtype=torch.int32), torch.tensor([1, 0, 0, 0], dtype=torch.uint8))


# --- compare ----------------------------------------------------------------------------------

def t(*xs):
    return torch.tensor(xs, dtype=torch.float32)


TOL = Tolerance(rtol=0.25, atol=0.5)  # element bound: 0.5 + 0.25 |ref|


def test_equal_outputs_pass_with_zero_errors():
    m = compare("O", t(1, -2, 3), t(1, -2, 3), TOL)
    assert m.model_dump() == {
        "output": "O", "max_abs_err": 0.0, "max_rel_err": 0.0, "mismatch_frac": 0.0, "nan_count": 0,
        "first_mismatch": None, "got": None, "expected": None, "rel_l2": 0.0, "rel_l2_bound": None,
        "row_ratio": None, "bad_rows": None, "worst_row": None, "samples": [], "passed": True,
        "judged_against": "ref"}


def test_the_elementwise_bound_holds_at_equality():
    # ref 2: allowed 0.5 + 0.5 = 1.0
    assert compare("O", t(3.0), t(2.0), TOL).passed
    assert compare("O", t(1.0), t(2.0), TOL).passed
    m = compare("O", t(3.0625), t(2.0), TOL)
    assert not m.passed and m.max_abs_err == 1.0625 and m.first_mismatch == [0]
    assert (m.got, m.expected) == (3.0625, 2.0)
    assert m.max_rel_err == 1.0625 / 2.0 and m.mismatch_frac == 1.0
    # ref 0: only atol; the relative error divides by max(|ref|, atol)
    assert compare("O", t(0.5), t(0.0), TOL).passed
    m = compare("O", t(0.75), t(0.0), TOL)
    assert not m.passed and m.max_rel_err == 0.75 / 0.5
    # rtol scales with |ref|, not with ref's sign
    assert compare("O", t(-3.0), t(-2.0), TOL).passed
    assert not compare("O", t(-3.0625), t(-2.0), TOL).passed


def test_tiny_atol_still_divides_safely():
    m = compare("O", t(1.0), t(0.0), Tolerance(rtol=0.0, atol=0.0))
    assert not m.passed and m.max_rel_err == pytest.approx(1e30, rel=1e-6) and m.max_abs_err == 1.0


def test_the_term_scale_loosens_only_where_it_exceeds_the_reference():
    e, got = t(0.001, 4.0), t(0.5625, 4.0)  # |0.5615| over 0.5 + 0.25 * 0.001
    assert not compare("O", got, e, TOL).passed
    assert compare("O", got, e, TOL, scale=t(0.25, 0.0)).passed  # 0.5 + 0.25 * 0.25 = 0.5625
    assert not compare("O", got, e, TOL, scale=t(0.2, 0.0)).passed
    # a scale below |ref| changes nothing
    assert compare("O", t(6.0), t(4.0), Tolerance(rtol=0.375, atol=0.5), scale=t(0.0)).passed
    assert not compare("O", t(6.125), t(4.0), Tolerance(rtol=0.375, atol=0.5), scale=t(1.0)).passed
    m = compare("O", t(1.0), t(0.0), TOL, scale=t(4.0))
    assert m.passed and m.max_rel_err == 0.25  # relative to the scale


def test_nan_never_passes_and_equal_infinities_do():
    m = compare("O", t(NAN, 1.0), t(NAN, 1.0), Tolerance(rtol=1, atol=1))
    assert not m.passed and m.nan_count == 1 and m.first_mismatch == [0]
    assert m.max_abs_err == math.inf and m.max_rel_err == math.inf  # every failure is a NaN
    assert m.samples[0].index == [0] and math.isnan(m.samples[0].got)
    assert compare("O", t(INF, -INF, 1.0), t(INF, -INF, 1.0), TOL).passed
    m = compare("O", t(-INF, 1.0), t(INF, 1.0), TOL)
    assert not m.passed and m.nan_count == 0 and m.max_abs_err == math.inf
    # an infinite reference admits no finite value (|got - inf| <= inf would)
    m = compare("O", t(0.0, 1.0), t(INF, 1.0), TOL)
    assert not m.passed and m.first_mismatch == [0] and m.max_abs_err == math.inf
    m = compare("O", t(INF, 5.0), t(1.0, 1.0), TOL)  # one infinite and one finite failure: the finite one counts
    assert not m.passed and m.max_abs_err == 4.0 and m.max_rel_err == 4.0
    m = compare("O", t(NAN, 1.0), t(1.0, 1.0), Tolerance(rtol=1e9, atol=1e9))
    assert not m.passed and m.mismatch_frac == 0.5 and m.rel_l2 == 0.0  # NaN is left out of the norms


def test_a_shape_mismatch_fails_outright():
    m = compare("O", torch.zeros(3), torch.zeros(4), Tolerance(rtol=1, atol=1))
    assert m.model_dump() == {
        "output": "O", "max_abs_err": math.inf, "max_rel_err": math.inf, "mismatch_frac": 1.0, "nan_count": 0,
        "first_mismatch": None, "got": None, "expected": None, "rel_l2": None, "rel_l2_bound": None,
        "row_ratio": None, "bad_rows": None, "worst_row": None, "samples": [], "passed": False,
        "judged_against": "ref"}
    assert not compare("O", torch.zeros(2, 3), torch.zeros(3, 2), Tolerance(rtol=1, atol=1)).passed


def test_first_mismatch_is_a_multi_index_and_frac_counts_elements():
    e = torch.zeros(2, 3, 4)
    g = e.clone()
    g[1, 2, 3] = 9.0
    g[1, 0, 1] = 2.0
    g[0, 1, 1] = 0.25  # within atol
    m = compare("O", g, e, TOL)
    assert m.first_mismatch == [1, 0, 1] and (m.got, m.expected) == (2.0, 0.0)
    assert m.mismatch_frac == 2 / 24 and m.max_abs_err == 9.0
    assert [s.index for s in m.samples] == [[1, 0, 1], [1, 2, 3]]


def test_the_aggregate_bound():
    e, g = t(3.0, 4.0), t(3.0, 4.5)  # ||diff|| 0.5 / ||ref|| 5
    m = compare("O", g, e, Tolerance(rtol=1, atol=1, rel_l2={"O": 0.1}))
    assert m.passed and m.rel_l2 == 0.1 and m.rel_l2_bound == 0.1
    m = compare("O", g, e, Tolerance(rtol=1, atol=1, rel_l2={"O": 0.0999}))
    assert not m.passed and m.mismatch_frac == 0.0 and m.rel_l2_bound == 0.0999
    m = compare("O", g, e, Tolerance(rtol=1, atol=1, rel_l2={"other": 0.0}))
    assert m.passed and m.rel_l2_bound is None
    # a zero reference: any difference is an infinite relative error
    assert compare("O", t(0.0, 0.0), t(0.0, 0.0), TOL).rel_l2 == 0.0
    assert compare("O", t(0.0, 0.25), t(0.0, 0.0), TOL).rel_l2 == math.inf
    # infinities are left out of both norms
    assert compare("O", t(INF, 3.0, 4.5), t(INF, 3.0, 4.0), TOL).rel_l2 == 0.1


def test_a_per_row_bound_fails_one_wrong_row():
    """rows [4, 4]: each row 4 wide. A row's allowance: rtol * max(||ref_row||, floor * typical)
    + atol * sqrt(4), typical = rms(|ref|) * sqrt(4)."""
    e = torch.tensor([[3.0, 4.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [6.0, 8.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    rows = RowTolerance(rtol=0.1, floor=0.0, atol=0.0)
    tol = Tolerance(rtol=1, atol=1, rows={"O": rows})
    assert C.row_ratios(torch.zeros(4, 4), e.abs(), rows).tolist() == [0.0] * 4
    g = e.clone()
    g[2, 0] += 1.0  # row 2: err 1, allowance 0.1 * 10
    m = compare("O", g, e, tol)
    assert m.passed and m.row_ratio == 1.0 and m.bad_rows == 0 and m.worst_row == [2]
    g[0, 1] += 0.75  # row 0: err 0.75 over 0.5
    m = compare("O", g, e, tol)
    assert not m.passed and m.bad_rows == 1 and m.worst_row == [0] and m.row_ratio == 1.5 and m.mismatch_frac == 0
    assert compare("O", g, e, Tolerance(rtol=1, atol=1, rows={"LSE": rows})).row_ratio is None


def test_row_allowance_floor_and_atol():
    # rms(|ref|) over the 8 elements = sqrt((9 + 16 + 36 + 64) / 8) = sqrt(125 / 8); typical = that * 2
    e = torch.tensor([[3.0, 4.0, 0.0, 0.0], [6.0, 8.0, 0.0, 0.0]])
    typical = math.sqrt(125 / 8) * 2
    rows = RowTolerance(rtol=0.5, floor=1.0, atol=0.25)
    allowed = [0.5 * max(5.0, typical) + 0.25 * 2, 0.5 * max(10.0, typical) + 0.25 * 2]
    diff = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 3.0, 4.0]])
    got = C.row_ratios(diff, e.abs(), rows)
    assert got.tolist() == pytest.approx([1.0 / allowed[0], 5.0 / allowed[1]], rel=1e-6)
    assert typical > 5.0  # the floor lifts the small row, not the large one
    # nothing allowed at all: the ratio is the error over 1e-30
    zero = C.row_ratios(torch.tensor([[1.0, 0.0]]), torch.zeros(1, 2), RowTolerance())
    assert zero.tolist() == [pytest.approx(1e30)]


def test_element_rows_replace_the_elementwise_rule():
    """LSE-like: each element is a row, bound rtol * max(|ref|, floor * rms) + atol."""
    e = t(1.0, 2.0, 0.0, 0.0)  # rms = sqrt(5 / 4)
    rms = math.sqrt(5 / 4)
    rows = RowTolerance(rtol=0.0, floor=0.0, atol=0.125, row="element")
    tol = Tolerance(rtol=0.0, atol=0.0, rows={"LSE": rows})  # elementwise alone would fail any error
    m = compare("LSE", e + t(0.125, -0.125, 0.0, 0.125), e, tol)
    assert m.passed and m.row_ratio == 1.0 and m.worst_row == [0] and m.bad_rows == 0
    m = compare("LSE", e + t(0.0, 0.0, 0.25, 0.0), e, tol)
    assert not m.passed and m.bad_rows == 1 and m.worst_row == [2] and m.row_ratio == 2.0 and m.mismatch_frac == 0.25
    # the floor: atol + rtol * floor * rms for the elementwise part, max(|ref|, floor * rms) for the row
    rows = RowTolerance(rtol=0.5, floor=2.0, atol=0.0, row="element")
    tol = Tolerance(rtol=0.0, atol=0.0, rows={"LSE": rows})
    edge = 0.5 * 2.0 * rms
    assert compare("LSE", e + t(0.0, 0.0, edge * 0.999, 0.0), e, tol).passed
    assert not compare("LSE", e + t(0.0, 0.0, edge * 1.001, 0.0), e, tol).passed
    m = compare("LSE", e + t(0.0, 0.0, edge * 0.5, 0.0), e, tol)
    assert m.row_ratio == pytest.approx(0.5, rel=1e-6)


def test_an_empty_output_passes():
    m = compare("O", torch.zeros(0), torch.zeros(0), TOL)
    assert m.passed and m.max_abs_err == 0.0 and m.max_rel_err == 0.0 and m.mismatch_frac == 0.0
    rows = Tolerance(rtol=1, atol=1, rows={"O": RowTolerance(rtol=0.1)})
    m = compare("O", torch.zeros(0, 4), torch.zeros(0, 4), rows)
    assert m.passed and m.row_ratio is None


def test_failing_samples_first_worst_and_spread():
    e = torch.zeros(20)
    g = e.clone()
    for i, v in ((3, 1.0), (5, 1.0), (8, 7.0), (11, 1.0), (14, 1.0), (19, 1.0)):
        g[i] = v
    m = compare("O", g, e, Tolerance(rtol=0, atol=0.5))
    # first 3, worst 8, then the spread over the 6 failing: positions 0, 2 (round(5/3)), 3, 5 -> 3, 8, 11, 19
    assert [(s.index, s.got, s.expected) for s in m.samples] == [([3], 1.0, 0.0), ([8], 7.0, 0.0),
                                                                 ([11], 1.0, 0.0), ([19], 1.0, 0.0)]
    one = compare("O", t(0.0, 2.0), t(0.0, 0.0), Tolerance(rtol=0, atol=0.5)).samples
    assert [s.index for s in one] == [[1]]
    two = compare("O", t(2.0, 0.0, 3.0), t(0.0, 0.0, 0.0), Tolerance(rtol=0, atol=0.5)).samples
    assert [s.index for s in two] == [[0], [2]]
    assert C.SAMPLES == 4


def test_unravel():
    assert C._unravel(0, (2, 3, 4)) == (0, 0, 0)
    assert C._unravel(23, (2, 3, 4)) == (1, 2, 3)
    assert C._unravel(13, (2, 3, 4)) == (1, 0, 1)
    assert C._unravel(5, (7,)) == (5,)
    assert C._unravel(0, ()) == ()


def test_at_most_four_samples_first_and_worst_first():
    # failing 0..6, worst 5: the spread (positions 0, 2, 4, 6) adds 2 and 4, then stops at four
    g = t(1.0, 1.0, 1.0, 1.0, 1.0, 9.0, 1.0, 0.0)
    m = compare("O", g, torch.zeros(8), Tolerance(rtol=0, atol=0.5))
    assert [s.index for s in m.samples] == [[0], [5], [2], [4]]


def test_poison_at_the_sign_bit_exactly(monkeypatch):
    monkeypatch.setitem(C._POISON, torch.float16, (torch.int16, 0x8000))
    assert C._poison_bits(torch.float16) == (torch.int16, -0x8000)
    t16 = torch.zeros(1, dtype=torch.float16)
    poison_(t16)
    assert t16.view(torch.uint8).tolist() == [0x00, 0x80]


def test_a_small_reference_norm_is_still_a_ratio():
    m = compare("O", t(0.75), t(0.5), Tolerance(rtol=1, atol=1))
    assert m.rel_l2 == 0.5


def test_a_tolerance_without_rows_or_aggregate_bounds():
    """Any object with rtol and atol is a tolerance (rel_l2 and rows are optional)."""
    from types import SimpleNamespace

    m = compare("O", t(3.0, 4.5), t(3.0, 4.0), SimpleNamespace(rtol=0.25, atol=0.5))
    assert m.passed and m.rel_l2_bound is None and m.row_ratio is None and m.rel_l2 == 0.1


def _row_ratios_by_hand(diff, s, rtol, floor, atol):
    """Each row of the last dim, in plain Python."""
    rows_d, rows_s = diff.reshape(-1, diff.shape[-1]).tolist(), s.reshape(-1, s.shape[-1]).tolist()
    n = len(rows_d[0])
    flat = [x for r in rows_s for x in r]
    typical = math.sqrt(sum(x * x for x in flat) / len(flat)) * math.sqrt(n)
    out = []
    for d, r in zip(rows_d, rows_s):
        own = math.sqrt(sum(x * x for x in r))
        out.append(math.sqrt(sum(x * x for x in d)) / (rtol * max(own, floor * typical) + atol * math.sqrt(n)))
    return out


def test_row_ratios_of_a_3d_output_and_of_2d_element_rows():
    g = torch.Generator().manual_seed(1)
    e, diff = torch.randn(2, 3, 5, generator=g), torch.rand(2, 3, 5, generator=g) * 0.1
    rows = RowTolerance(rtol=0.1, floor=0.5, atol=0.01)
    got = C.row_ratios(diff, e.abs(), rows)
    assert got.shape == (2, 3)
    assert got.reshape(-1).tolist() == pytest.approx(_row_ratios_by_hand(diff, e.abs(), 0.1, 0.5, 0.01), rel=1e-5)
    # element rows of a [B, S] output (LSE): each element its own row of length 1
    lse, dl = torch.randn(3, 4, generator=g), torch.rand(3, 4, generator=g) * 0.1
    el = RowTolerance(rtol=0.1, floor=0.5, atol=0.01, row="element")
    got = C.row_ratios(dl, lse.abs(), el)
    assert got.shape == (3, 4)
    want = _row_ratios_by_hand(dl.reshape(-1, 1), lse.abs().reshape(-1, 1), 0.1, 0.5, 0.01)
    assert got.reshape(-1).tolist() == pytest.approx(want, rel=1e-5)


# ---------------------------------------------------------------- pass 5: what the judge grew since pass 1
LSE_ROWS = RowTolerance(atol=0.12, row="element", spread=0.25, spread_atol=0.005)  # FP8 attention's LSE (2026-12)


def test_a_spread_row_is_held_to_its_own_rounding_and_never_past_atol():
    """Element rows with a `spread` (FP8 attention's LSE): each row's bound is min(atol, spread_atol +
    spread * c_r) with c_r its term scale; without a term scale, atol alone. A flat row (c_r small) is
    held to its small rounding, a row one key carries (c_r = 1) to atol at most."""
    s = torch.ones(3)
    c = torch.tensor([0.01, 0.2, 1.0])
    assert C.element_atol(LSE_ROWS, s) == 0.12
    # rtol's floor adds to either bound (rtol x floor x rms(s)): 0.1 x 2 x 1 here
    withr = LSE_ROWS.model_copy(update={"rtol": 0.1, "floor": 2.0})
    torch.testing.assert_close(C.element_atol(withr, s, torch.tensor([0.01, 1.0])), torch.tensor([0.2075, 0.32]))
    assert C.element_atol(withr, s) == pytest.approx(0.32)
    torch.testing.assert_close(C.element_atol(LSE_ROWS, s, c), torch.tensor([0.0075, 0.055, 0.12]))
    diff = torch.tensor([0.01, 0.05, 0.1])
    # ratios: err / allowance, row by row (rtol 0: the allowance is the absolute part alone)
    torch.testing.assert_close(C.row_ratios(diff, s, LSE_ROWS, c), torch.tensor([0.01 / 0.0075, 0.05 / 0.055, 0.1 / 0.12]))
    torch.testing.assert_close(C.row_ratios(diff, s, LSE_ROWS), diff / 0.12)  # no term scale: atol alone
    plain = LSE_ROWS.model_copy(update={"spread": 0.0})  # no spread: atol alone, whatever the scale
    torch.testing.assert_close(C.row_ratios(diff, s, plain, c), diff / 0.12)
    last = LSE_ROWS.model_copy(update={"row": "last_dim"})  # a spread means nothing on last_dim rows
    assert C.row_ratios(diff[None, :], s[None, :], last, c[None, :]).shape == (1,)
    assert not C.scale_only_loosens(Tolerance(rows={"LSE": LSE_ROWS}), "LSE")
    assert C.scale_only_loosens(Tolerance(rows={"LSE": plain}), "LSE")
    assert C.scale_only_loosens(Tolerance(rows={"O": last}), "O") and C.scale_only_loosens(Tolerance(), "LSE")


def test_a_spread_row_is_judged_on_its_term_scale_which_may_fail_what_atol_passes():
    """An LSE off by 0.05 on a flat row (c_r = 0.01: bound 0.0075) fails, though atol (0.12) would pass
    it; judge_outputs computes the term scales up front for such an output (its bound is not monotone
    in the scale) and the verdict is compare()'s with them."""
    tol = Tolerance(rows={"LSE": LSE_ROWS})
    expected = {"LSE": torch.tensor([[1.0], [2.0], [3.0]]), "O": torch.ones(3, 4)}
    got = {"LSE": expected["LSE"] + torch.tensor([[0.0], [0.05], [0.0]]), "O": expected["O"].clone()}
    scales = {"LSE": torch.tensor([[1.0], [0.01], [1.0]]), "O": torch.ones(3, 4)}
    asked = []
    out = C.judge_outputs(got, expected, tol, term_scales=lambda: asked.append(1) or scales)
    assert asked == [1] and [m.output for m in out] == ["LSE", "O"]
    assert not out[0].passed and out[1].passed
    assert out[0].judged_against == "terms" and out[0] == compare("LSE", got["LSE"], expected["LSE"], tol, scales["LSE"])
    assert compare("LSE", got["LSE"], expected["LSE"], tol).passed  # against atol alone it would pass


def test_without_term_scales_each_output_gets_compares_verdict_against_ref():
    tol = Tolerance(rtol=0.0, atol=0.1)
    expected = {"C": torch.zeros(2, 2), "D": torch.ones(3)}
    got = {"C": torch.tensor([[0.0, 0.5], [0.0, 0.0]]), "D": torch.ones(3)}
    out = C.judge_outputs(got, expected, tol)
    assert out == [compare("C", got["C"], expected["C"], tol), compare("D", got["D"], expected["D"], tol)]
    assert [m.output for m in out] == ["C", "D"] and not out[0].passed and out[1].passed
    assert out[0].judged_against == "ref" and out[0].first_mismatch == [0, 1]


def test_a_tensor_differs_in_any_bit_shape_or_dtype():
    """The inputs' check (changed, scan): a bit flipped, a -0.0 for 0.0 (equal values, other bits), a
    reshaped or retyped tensor are all changed; only names in both are compared; none: nothing."""
    a = torch.tensor([0.0, 1.0, 2.0])
    assert C.changed({"A": a.clone()}, {"A": a}) == []
    assert C.changed({"A": torch.tensor([-0.0, 1.0, 2.0])}, {"A": a}) == ["A"]
    assert C.changed({"A": a.reshape(3, 1)}, {"A": a}) == ["A"]
    assert C.changed({"A": a.to(torch.float64)}, {"A": a}) == ["A"]
    assert C.changed({"A": a.to(torch.int32).view(torch.float32)}, {"A": a}) == ["A"]  # same shape and dtype, other bits
    assert C.changed({"A": a.clone(), "B": a}, {"A": a}) == [] and C.changed({}, {"A": a}) == []
    assert C.changed({"A": a.clone(), "B": a + 1}, {"B": a, "A": a}) == ["B"]


def test_a_scan_of_nothing_is_empty_and_each_check_lands_on_its_own_name():
    assert C.scan({}, {}, {}, {}) == C.Scan({}, {}, {}, {})
    out = torch.zeros(4)
    poison_(out[:2])
    out[3] = float("nan")
    got = C.scan({}, {"A": torch.ones(2), "B": torch.ones(2)}, {"A": torch.ones(2), "B": torch.zeros(2)},
                 {"C": out, "I": torch.zeros(2, dtype=torch.int32)})
    # (the float poison is itself a NaN pattern: the unwritten elements count among the NaNs too)
    assert got == C.Scan({}, {"A": False, "B": True}, {"C": 2, "I": 0}, {"C": 3, "I": 0})


@pytest.mark.parametrize("shape,at", [((4, 8), [(1, 3), (2, 5)]), ((2, 3, 4), [(0, 1, 2), (1, 0, 3)])])
def test_failing_rows_judged_on_their_own_scale_never_pass_what_the_whole_scale_fails(shape, at):
    """judge_outputs' middle step: the rows that failed against |ref| get their own term scale
    (row_scales), taken ROW_SCALE_MARGIN low, so that scale is at most the whole computation's even
    where the two computations round differently. Here the rows' computation reads 1.0 and the whole
    one 1 - margin/2 (as far apart as their rounding may put them): an error between the two bounds
    fails the rows' check and then the whole one, never passing on the rows' higher figure."""
    m = C.ROW_SCALE_MARGIN
    assert m == 1e-3
    tol = Tolerance(rtol=0.01, atol=0.0, scale="terms")
    # (a 3-D output's rows are single elements, as tasks.sampled.view_rows reads LSE [B, H, S])
    row_len = 1 if len(shape) == 3 else shape[-1]
    expected = {"C": torch.zeros(shape)}
    got = {"C": torch.zeros(shape)}
    for i in at:
        got["C"][i] = 0.01 * (1 - m / 4)  # above 0.01 x the whole scale, below 0.01 x 1.0
    asked = []

    def row_scales(rows):
        asked.append({n: r.tolist() for n, r in rows.items()})
        return {"C": torch.ones(len(rows["C"]), row_len)}

    whole = {"C": torch.full(shape, 1 - m / 2)}
    out = C.judge_outputs(got, expected, tol, term_scales=lambda: whole, row_scales=row_scales)
    flat_rows = sorted(int(torch.tensor(i) @ torch.tensor(torch.zeros(shape).stride())) // row_len for i in at)
    assert asked == [{"C": flat_rows}]  # the two failing rows, asked together
    assert not out[0].passed and out[0].judged_against == "terms"  # the whole scales' verdict
    # and where the error is within the rows' own (margin-low) bound, that pass is the verdict
    for i in at:
        got["C"][i] = 0.01 * (1 - 2 * m)
    out = C.judge_outputs(got, expected, tol, term_scales=lambda: whole, row_scales=row_scales)
    assert out[0].passed and out[0].judged_against == "terms_rows"


def test_a_shape_mismatch_says_which_scale_it_was_judged_against():
    tol = Tolerance()
    m = compare("C", torch.zeros(2, 2), torch.zeros(3), tol, scale=torch.ones(3))
    assert not m.passed and m.judged_against == "terms" and m.max_abs_err == math.inf
    assert compare("C", torch.zeros(2, 2), torch.zeros(3), tol).judged_against == "ref"


# ---------------------------------------------------------------- pass 8b: the judge's cost paths and row shortcut
def test_words_only_where_size_and_address_allow():
    """_words: 8-byte words (an eighth of the elements to compare) where the bytes are a multiple of 8
    at an 8-byte address, else bytes, never a word at an unaligned address."""
    buf = torch.zeros(64, dtype=torch.uint8)
    for at in (0, 8, 16):
        w = C._words(buf[at:at + 16])
        assert w.dtype == torch.int64 and w.numel() == 2, at
    assert C._words(torch.zeros(3, dtype=torch.float32)).dtype == torch.uint8  # 12 bytes
    for at in (1, 4, 9):
        w = C._words(buf[at:at + 16])
        assert w.dtype == torch.uint8 and w.numel() == 16, at
    assert C._words(torch.zeros(0)).numel() == 0


def test_a_shape_change_differs_as_a_bool_on_the_tensors_device():
    """_bits_differ's early answer is what the bit comparison gives: a 0-d bool on the tensors' device
    (scan stacks it with the other flags there, without a transfer)."""
    flag = C._bits_differ(torch.zeros(2, device="meta"), torch.zeros(3, device="meta"))
    assert flag.dtype == torch.bool and flag.shape == () and flag.device.type == "meta"


def test_a_spread_row_fails_elementwise_and_by_row_on_its_term_scale():
    """compare() with a term scale for FP8 attention's LSE: the elementwise rule and the row ratio both
    read the spread bound (0.0075 on the flat row), not atol (0.12)."""
    tol = Tolerance(rows={"LSE": LSE_ROWS})
    e = torch.tensor([[1.0], [2.0], [3.0]])
    m = compare("LSE", e + torch.tensor([[0.0], [0.05], [0.0]]), e, tol, torch.tensor([[1.0], [0.01], [1.0]]))
    assert not m.passed and m.mismatch_frac == pytest.approx(1 / 3) and m.first_mismatch == [1, 0]
    assert m.bad_rows == 1 and m.worst_row == [1, 0] and m.row_ratio == pytest.approx(0.05 / 0.0075, rel=1e-4)


def test_an_infinite_reference_element_does_not_widen_its_rows_allowance():
    """A row's own scale leaves out elements whose reference is not finite (they pass only as the same
    infinity): [inf, 3, 4, 0] has scale 5, allowance 0.5, and an error of 0.505 fails it."""
    rows = RowTolerance(rtol=0.1, floor=0.0, atol=0.0)
    e = torch.tensor([[INF, 3.0, 4.0, 0.0]])
    g = torch.tensor([[INF, 3.0, 4.505, 0.0]])
    m = compare("O", g, e, Tolerance(rtol=1, atol=1, rows={"O": rows}))
    assert not m.passed and m.bad_rows == 1 and m.row_ratio == pytest.approx(1.01, rel=1e-4)


def test_failing_rows_are_none_on_a_pass_and_where_rows_are_not_view_rows():
    """_compare's second answer: None for a pass, a 0-d output, or a row bound over last-dim rows of a
    3-D output (view_rows reads its elements as rows); else each view row's failure, elementwise or by
    its row bound."""
    assert C._compare("O", t(1.0, 2.0), t(1.0, 2.0), TOL)[1] is None
    assert C._compare("O", torch.tensor([[1.0, 2.0]]), torch.tensor([[1.0, 2.0]]), TOL)[1] is None
    m, failing = C._compare("O", torch.tensor(3.0), torch.tensor(1.0), TOL)
    assert not m.passed and failing is None
    rows = Tolerance(rtol=1, atol=1, rows={"O": RowTolerance(rtol=0.1, floor=0.0, atol=0.0)})
    e = torch.ones(2, 2, 4)
    g = e.clone()
    g[1, 0, 2] = 1.5  # row (1, 0) over its row bound, every element within rtol 1
    m, failing = C._compare("O", g, e, rows)
    assert not m.passed and m.bad_rows == 1 and m.mismatch_frac == 0 and failing is None


ROWS = Tolerance(rtol=1, atol=1, rows={"O": RowTolerance(rtol=0.1, floor=0.0, atol=0.0)})  # rows [3, 4]: allowance 0.5


def _judged(got, expected, tol, row_scale=10.0):
    """judge_outputs with both scale sources: (verdicts, rows asked, whole term scales asked)."""
    asked, whole = [], []

    def row_scales(rows):
        asked.append({n: r.tolist() for n, r in rows.items()})
        return {n: torch.full((len(r), expected[n].shape[-1]), row_scale) for n, r in rows.items()}

    out = C.judge_outputs(got, expected, tol, term_scales=lambda: whole.append(1) or {}, row_scales=row_scales)
    return out, asked, whole


def test_only_rows_over_their_bound_are_asked_for_their_own_scale():
    """A row at its bound (ratio 1) passes and is not asked about; one over it (1.5) with every element
    within the elementwise rule is; its own scale clears it, and that is the verdict."""
    e = torch.tensor([[3.0, 4.0, 0.0, 0.0]] * 3)
    g = e.clone()
    g[0, 2] = 0.5  # ratio 1.0
    g[1, 2] = 0.75  # ratio 1.5
    m, failing = C._compare("O", g, e, ROWS)
    assert m.bad_rows == 1 and m.mismatch_frac == 0 and failing.tolist() == [False, True, False]
    out, asked, whole = _judged({"O": g}, {"O": e}, ROWS)
    assert asked == [{"O": [1]}] and whole == []
    assert out[0].passed and out[0].judged_against == "terms_rows"


def test_a_failing_scalar_output_gets_the_whole_term_scales():
    out, asked, whole = _judged({"s": torch.tensor(3.0)}, {"s": torch.tensor(1.0)}, TOL)
    assert asked == [] and whole == [1] and not out[0].passed and out[0].judged_against == "ref"


def test_a_one_dim_output_is_one_row():
    e = torch.zeros(8)
    g = e.clone()
    g[3] = 1.0
    out, asked, whole = _judged({"O": g}, {"O": e}, Tolerance(rtol=0.25, atol=0.0), row_scale=8.0)
    assert asked == [{"O": [0]}] and whole == [] and out[0].passed and out[0].judged_against == "terms_rows"


def test_an_aggregate_bound_met_at_equality_leaves_the_rows_to_their_scale():
    """||diff|| / ||ref|| = 0.5 / 5 = 0.1 meets a bound of 0.1: the element over rtol x |ref| (0.5 over
    0.4) may still pass on its row's scale, so the rows are asked."""
    tol = Tolerance(rtol=0.1, atol=0.0, rel_l2={"O": 0.1})
    out, asked, whole = _judged({"O": torch.tensor([[3.0, 4.5]])}, {"O": torch.tensor([[3.0, 4.0]])}, tol)
    assert asked == [{"O": [0]}] and whole == [] and out[0].passed and out[0].rel_l2 == 0.1


def test_more_failing_rows_than_the_cap_get_the_whole_term_scales(monkeypatch):
    monkeypatch.setattr(C, "ROW_SCALES_MAX_ROWS", 2)
    e = torch.zeros(4, 2)
    for n_bad, row_scales_asked in ((2, True), (3, False)):
        g = e.clone()
        g[:n_bad, 0] = 1.0
        out, asked, whole = _judged({"O": g}, {"O": e}, Tolerance(rtol=0.25, atol=0.0), row_scale=8.0)
        assert bool(asked) == row_scales_asked and whole == ([] if row_scales_asked else [1]), n_bad


def test_a_tolerance_without_rows_loosens_with_any_scale():
    from types import SimpleNamespace

    tol = SimpleNamespace(rtol=0.25, atol=0.0)
    assert C.scale_only_loosens(tol, "O")
    out, asked, whole = _judged({"O": torch.tensor([[1.0, 0.0]])}, {"O": torch.zeros(1, 2)}, tol, row_scale=8.0)
    assert asked == [{"O": [0]}] and out[0].passed


def test_a_scan_of_outputs_alone_or_inputs_alone():
    out = torch.zeros(3)
    poison_(out[1:])
    assert C.scan({}, {}, {}, {"C": out}) == C.Scan({}, {}, {"C": 2}, {"C": 2})
    assert C.scan({}, {"A": torch.ones(2)}, {"A": torch.zeros(2)}, {}) == C.Scan({}, {"A": True}, {}, {})


def test_a_scan_counts_exactly_past_float32s_integers():
    """Counts stay int64 on the way back: 2**24 + 1 unwritten bytes of an integer output (whose NaN
    count is a zero of its own) read back as that, not as float32's 2**24."""
    big = torch.empty(2 ** 24 + 1, dtype=torch.uint8)
    poison_(big)
    assert C.scan({}, {}, {}, {"I": big}).unwritten == {"I": 2 ** 24 + 1}


def test_a_scan_counts_guards_apart_only_where_their_sum_is_not_zero(monkeypatch):
    """Every guard region summed at once; the per-tensor count (two launches a region: issue 43) only
    once something changed."""
    calls = []
    real = Guarded.guard_damage
    monkeypatch.setattr(Guarded, "guard_damage", lambda self: calls.append(1) or real(self))
    g = {n: Guarded((4,), torch.float32, device="cpu") for n in ("A", "B")}
    assert C.scan(g, {}, {}, {}).guards == {"A": (0, 0), "B": (0, 0)} and calls == []
    g["B"].raw[0] = 0
    assert C.scan(g, {}, {}, {}).guards == {"A": (0, 0), "B": (1, 0)} and calls == [1, 1]


def test_one_garbage_generator_per_device_and_a_forked_child_draws_its_own():
    """The generator is seeded once per process and device; a forked child (a worker) must not
    replay its parent's stream, which it would with the parent's generator copied into it."""
    import os

    cpu = torch.device("cpu")
    assert C._garbage_generator(cpu) is C._garbage_generator(cpu)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next fill, to the parent
        t = torch.empty(64, dtype=torch.uint8)
        C.garbage_(t)
        os.write(write, bytes(t.tolist()))
        os._exit(0)
    os.close(write)
    child = os.read(read, 64)
    os.close(read)
    assert os.waitpid(pid, 0)[1] == 0 and len(child) == 64
    t = torch.empty(64, dtype=torch.uint8)
    C.garbage_(t)
    assert bytes(t.tolist()) != child
