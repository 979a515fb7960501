"""What makes a correctness check hard to fool (worker side, torch on the GPU).

- Every output and scratch buffer sits between two 64 KB guard regions filled with a
  canary byte; a changed guard byte is an out-of-bounds write.
- Outputs are poisoned before every run with a NaN of a payload no arithmetic produces
  (GPUs write the canonical NaN), so "still poison" means "never written"; on a secret half of
  the timed and counted runs they hold random bytes instead (fill_output_), so that no value
  an output holds before a run marks it "unset".
- Inputs are compared bit for bit, after the run, with the same inputs generated again from
  the run's seed (no device copy a kernel could rewrite).
- Outputs are compared in fp32 with the reference at the task's tolerance: elementwise, per
  row (each row's error against the row's own scale) and by relative L2 error of the whole
  output, where the task sets those; NaN never passes.
"""
from __future__ import annotations

import math
import os
import secrets
from dataclasses import dataclass

import torch

from tools.results import ElementSample, Mismatch

GUARD_BYTES = 64 * 1024
CANARY = 0xA5
_ALIGN = 256

TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
                "float8_e4m3fn": torch.float8_e4m3fn, "int32": torch.int32, "int64": torch.int64,
                "uint8": torch.uint8}
# Poison bit patterns, viewed through a same-width integer dtype. Float ones are quiet NaNs
# with a distinctive payload; fp8 e4m3fn has a single NaN (0x7F), so there "unwritten" and
# "wrote NaN" look alike (both fail).
_POISON = {torch.bfloat16: (torch.int16, 0x7FD5), torch.float16: (torch.int16, 0x7ED5),
           torch.float32: (torch.int32, 0x7FD55A5A), torch.float8_e4m3fn: (torch.uint8, 0x7F),
           torch.int32: (torch.int32, 0x5AA5A55A), torch.int64: (torch.int64, 0x5AA5A55A5AA5A55A),
           torch.uint8: (torch.uint8, 0xA5)}


class Guarded:
    """A tensor with canary-filled guard regions before and after it, in one allocation.

    The tensor starts 256-byte aligned (TMA needs 16); everything in the allocation that is
    not the tensor is guard."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device: str = "cuda"):
        self.nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        self.raw = torch.empty(2 * GUARD_BYTES + self.nbytes + 2 * _ALIGN, dtype=torch.uint8, device=device)
        self.start = GUARD_BYTES + (-(self.raw.data_ptr() + GUARD_BYTES)) % _ALIGN
        self.end = self.start + self.nbytes
        self.raw.fill_(CANARY)
        self.tensor = self.raw[self.start:self.end].view(dtype).view(shape)

    def data_ptr(self) -> int:
        return self.tensor.data_ptr()

    def reset_guards(self) -> None:
        self.raw[:self.start].fill_(CANARY)
        self.raw[self.end:].fill_(CANARY)

    def guard_damage(self) -> tuple[int, int]:
        """(bytes changed before, bytes changed after) the tensor."""
        return int((self.raw[:self.start] != CANARY).sum()), int((self.raw[self.end:] != CANARY).sum())


def _poison_bits(dtype: torch.dtype) -> tuple[torch.dtype, int]:
    view_dtype, bits = _POISON[dtype]
    width = 8 * torch.empty((), dtype=view_dtype).element_size()
    if view_dtype != torch.uint8 and bits >= 2 ** (width - 1):
        bits -= 2 ** width  # as the signed integer fill_ expects
    return view_dtype, bits


def poison_(t: torch.Tensor) -> None:
    view_dtype, bits = _poison_bits(t.dtype)
    t.view(view_dtype).fill_(bits)


def poison_mask(t: torch.Tensor) -> torch.Tensor:
    view_dtype, bits = _poison_bits(t.dtype)
    return t.view(view_dtype) == bits


# One generator per device for garbage_, seeded from os.urandom on first use in each process:
# not the global torch RNG (a seeded run would make it predictable) nor a request's seeds.
_GARBAGE_GENERATORS: dict[torch.device, torch.Generator] = {}
# A forked child must not replay its parent's bytes.
os.register_at_fork(after_in_child=_GARBAGE_GENERATORS.clear)


def _garbage_generator(device: torch.device) -> torch.Generator:
    generator = _GARBAGE_GENERATORS.get(device)
    if generator is None:
        generator = torch.Generator(device=device)
        generator.manual_seed(int.from_bytes(os.urandom(8), "little"))
        _GARBAGE_GENERATORS[device] = generator
    return generator


def garbage_(t: torch.Tensor) -> None:
    """Fill a zero=False scratch buffer with random bytes, new on every call, so a kernel that
    relies on it holding anything fails instead of passing by luck. Random, not a constant: a
    known fill is free initialisation (counters that count from 0x5A5A5A5A, `isnan(x)` as
    "unset" in a NaN-filled buffer) that saves the timed memset of a zero=true buffer; random
    bits cannot be told apart from data. (Outputs: fill_output_.)"""
    t.view(-1).view(torch.uint8).random_(0, 256, generator=_garbage_generator(t.device))


def fill_output_(t: torch.Tensor, secret: bool) -> bool:
    """Fill an output before a run; True where it was poisoned. `secret` (the timed and counted runs):
    the poison or random bytes (garbage_), by a coin from os.urandom per output and run. A poison a
    kernel can recognise is free initialisation: partial sums (split-K, atomics) stored where the output
    still reads NaN and added everywhere else need no zeroing of the output, which real use, where an
    output holds anything, does need. Such a kernel is wrong on about half of its timed runs. The seeded
    checks keep the poison (`secret` False), so that a kernel that leaves elements unwritten is told so
    by name (unwritten_output); on a timed run with random bytes such elements fail as values."""
    if secret and secrets.randbits(1):
        garbage_(t)
        return False
    poison_(t)
    return True


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))


def _words(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bits as a flat tensor: 8-byte words where its size and address allow (an eighth of
    the elements to compare and flag: the inputs are checked twice per judged run, gigabytes at long
    sequences), else bytes."""
    flat = t.reshape(-1).view(torch.uint8)
    if flat.numel() % 8 == 0 and flat.data_ptr() % 8 == 0:
        return flat.view(torch.int64)
    return flat


def _bits_differ(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A 0-d bool tensor: whether a and b differ in any bit (same_bits, without reading it back)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return torch.ones((), dtype=torch.bool, device=a.device)
    wa, wb = _words(a), _words(b)
    if wa.dtype != wb.dtype:  # one of them not 8-byte aligned: bytes both
        wa, wb = a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)
    return (wa != wb).any()


def changed(tensors: dict[str, torch.Tensor], fresh: dict[str, torch.Tensor]) -> list[str]:
    """The names of `tensors` that differ in any bit from the same name in `fresh` (one read back)."""
    names = [n for n in tensors if n in fresh]
    if not names:
        return []
    flags = torch.stack([_bits_differ(tensors[n], fresh[n]) for n in names]).tolist()
    return [n for n, f in zip(names, flags) if f]


@dataclass
class Scan:
    """The whole-tensor checks every judged run gets (tools.workspace.Workspace.verdict)."""
    guards: dict[str, tuple[int, int]]  # per guarded tensor: canary bytes changed before and after it
    changed: dict[str, bool]  # per input: differs from its regeneration in any bit
    unwritten: dict[str, int]  # per output: elements still the poison pattern
    nans: dict[str, int]  # per output: NaN elements (whole output, also when rows are sampled)


def scan(guarded: dict, inputs: dict[str, torch.Tensor], fresh: dict[str, torch.Tensor],
         outputs: dict[str, torch.Tensor]) -> Scan:
    """Guards, inputs against their regeneration `fresh`, poison and NaN in every output, all counted on
    the device and read back in one transfer: a host sync per check was ~10 ms of a judged run's host
    time on the H200 (about 40 syncs; issue 43), whatever the size. Every guard region is counted in one
    sum (all of them joined: a few hundred KB); only where that is not zero is each one counted apart,
    so the answer is the same as counting each, with two launches where that took two per region (a
    judged run's cost at short sequences is its launches, ~20 us each on the H200's host; issue 43)."""
    counts: list[torch.Tensor] = []  # int64 0-d: the guards' changed bytes, then each output's poison and NaN
    regions = [r for g in guarded.values() for r in (g.raw[:g.start], g.raw[g.end:])]
    if regions:
        counts.append((torch.cat(regions) != CANARY).sum())
    for t in outputs.values():
        counts.append(poison_mask(t).sum())
        counts.append(t.isnan().sum() if t.is_floating_point() else t.new_zeros((), dtype=torch.int64))
    flags = [_bits_differ(t, fresh[n]) for n, t in inputs.items()]  # bool 0-d
    parts = ([torch.stack(counts)] if counts else []) + ([torch.stack(flags).to(torch.int64)] if flags else [])
    if not parts:
        return Scan({}, {}, {}, {})
    device = parts[0].device
    it = iter(int(v) for v in torch.cat([p.to(device) for p in parts]).tolist())
    damaged = next(it) if regions else 0
    unwritten, nans = {}, {}
    for n in outputs:
        unwritten[n], nans[n] = next(it), next(it)
    changed = {n: bool(next(it)) for n in inputs}
    guards = {n: (g.guard_damage() if damaged else (0, 0)) for n, g in guarded.items()}
    return Scan(guards, changed, unwritten, nans)


def compare(name: str, got: torch.Tensor, expected: torch.Tensor, tol, scale: torch.Tensor | None = None) -> Mismatch:
    """Judge one output (see _compare)."""
    return _compare(name, got, expected, tol, scale)[0]


def _compare(name: str, got: torch.Tensor, expected: torch.Tensor, tol, scale: torch.Tensor | None = None
             ) -> tuple[Mismatch, torch.Tensor | None]:
    """(Mismatch, failing rows): judge one output against its fp32 reference under the task's Tolerance `tol`.

    Three rules, all of which must hold (NaN never passes):
    - Elementwise (the seed paper's rule): |got - expected| <= atol + rtol * s in fp32, where s
      is |expected|, or max(|expected|, scale) when the task judges against term scales
      (tasks.reference.term_scales).
    - Per row, where tol.rows names this output (schema.RowTolerance): the row's L2 error
      within rtol of the row's own scale (never below `floor` x a typical row's) plus atol.
      Where each element is a row (LSE), that bound is the elementwise rule for the output.
      This is what sees one wrong row or a few wrong elements among small values, which the
      elementwise atol hides and an aggregate bound dilutes.
    - Aggregate, where tol.rel_l2 names this output: ||got - expected||_2 / ||expected||_2,
      so a small bias, noise or a share of zeroed elements that each stay under atol fail.

    `got` and `expected` are whole outputs, or [rows, row_len] samples of them (tasks.sampled);
    for a sample, a typical row's scale is estimated from the rows drawn.

    Failing rows: a bool per row of the output as tasks.sampled.view_rows lays it out, True where
    a row has a failing element or fails its row bound; None when the output passed, or when its
    row bound's rows are not view_rows' rows (then no row-wise shortcut applies: judge_outputs)."""
    rtol, atol = tol.rtol, tol.atol
    bound = (getattr(tol, "rel_l2", None) or {}).get(name)
    row_tol = (getattr(tol, "rows", None) or {}).get(name)
    if tuple(got.shape) != tuple(expected.shape):
        return Mismatch(output=name, max_abs_err=math.inf, max_rel_err=math.inf, mismatch_frac=1.0, passed=False,
                        judged_against="ref" if scale is None else "terms"), None
    g, e = got.float(), expected.float()
    diff = (g - e).abs()
    s = e.abs() if scale is None else torch.maximum(e.abs(), scale.float())
    if row_tol is not None and row_tol.row == "element":  # each element is a row: its own bound replaces this rule
        rtol, atol = row_tol.rtol, element_atol(row_tol, s, scale)
    # an infinite reference bounds nothing (inf <= inf): only the same infinity passes there. A NaN
    # never passes: where got is NaN, diff is NaN (no bound holds) and got == expected is false.
    ok = ((diff <= atol + rtol * s) & torch.isfinite(e)) | (g == e)
    bad = ~ok
    finite = torch.isfinite(g) & torch.isfinite(e)
    fdiff = torch.where(finite, diff, 0.0)
    rel = fdiff / s.clamp_min(atol).clamp_min(1e-30)  # relative to max(s, atol), never to 0
    # every figure of the verdict computed on the device and read back in one transfer (a host sync
    # each was most of a judged run's cost at short sequences; issue 43), counts apart from values
    # so that each is stacked in its own dtype (a conversion per figure was a launch each)
    zero = g.new_zeros(())
    counts = [bad.sum(), (bad & finite).sum(), torch.isnan(g).sum()]
    values = [fdiff.max() if fdiff.numel() else zero, rel.max() if rel.numel() else zero,
              torch.where(finite, e, 0.0).norm(), fdiff.norm()]
    ratios = None
    if row_tol is not None and g.numel():
        ratios = row_ratios(fdiff, torch.where(finite, s, 0.0), row_tol, scale)
        counts += [(ratios > 1).sum(), ratios.reshape(-1).argmax()]
        values.append(ratios.max())
    read = torch.cat([torch.stack(counts).to(torch.float64), torch.stack(values).to(torch.float64)]).tolist()
    n_counts = len(counts)
    (n_bad, bad_finite, nan_count), (max_abs, max_rel, ref_norm, diff_norm) = read[:3], read[n_counts:n_counts + 4]
    n_bad, nan_count = int(n_bad), int(nan_count)
    if n_bad and not bad_finite:
        max_abs = max_rel = math.inf  # every failure is a NaN or an infinity
    rel_l2 = diff_norm / ref_norm if ref_norm > 0 else (0.0 if diff_norm == 0 else math.inf)
    first, gv, ev, samples = None, None, None, []
    if n_bad:
        flat = int(bad.reshape(-1).nonzero()[0])
        first = list(_unravel(flat, tuple(g.shape)))
        gv, ev = float(g.reshape(-1)[flat]), float(e.reshape(-1)[flat])
        samples = _failing_samples(bad, fdiff, g, e)
    row_ratio, bad_rows, worst_row = None, None, None
    if ratios is not None:
        bad_rows, worst, row_ratio = int(read[3]), int(read[4]), read[n_counts + 4]
        worst_row = list(_unravel(worst, tuple(ratios.shape)))
    passed = n_bad == 0 and (bound is None or rel_l2 <= bound) and not bad_rows
    mismatch = Mismatch(output=name, max_abs_err=max_abs, max_rel_err=max_rel,
                        mismatch_frac=n_bad / max(1, g.numel()), nan_count=nan_count,
                        first_mismatch=first, got=gv, expected=ev, rel_l2=rel_l2, rel_l2_bound=bound,
                        row_ratio=row_ratio, bad_rows=bad_rows, worst_row=worst_row, samples=samples, passed=passed,
                        judged_against="ref" if scale is None else "terms")
    failing = None
    if not passed and g.dim() >= 1 and g.numel():
        row_len = 1 if g.dim() == 3 else g.shape[-1]  # tasks.sampled.view_rows' rows
        failing = bad.reshape(-1, row_len).any(-1)
        if bad_rows:
            over = (ratios > 1).reshape(-1)
            failing = (failing | over) if over.numel() == failing.numel() else None
    return mismatch, failing


# judge_outputs: the term scale of a row computed on its own (tasks.sampled.rows_at) is taken this much
# below its value, so that it never exceeds what the whole-output computation (tasks.reference.term_scales)
# gives for that row. The two sum the same non-negative products in another order: they differ by
# about 1e-6 relative (tests/test_judge_outputs.py), a thousandth of this margin.
ROW_SCALE_MARGIN = 1e-3
# More failing rows than this and the whole output's term scales are computed instead. On the H200
# (scripts/bench_judge.py, attention backward at S=8192) cuDNN's answer fails against |ref| on 1,494
# rows, whose own term scales took 0.08 s (~50 us a row); the whole outputs' take 0.56 s.
ROW_SCALES_MAX_ROWS = 8192


def scale_only_loosens(tol, name: str) -> bool:
    """Whether compare() with any term scale passes whatever it passes with s = |ref| (scale None):
    the elementwise bound, each row's own scale and the typical row's all grow with s, and the
    aggregate bound does not read s. Not so for element rows with a `spread` (FP8 attention's LSE):
    their bound min(atol, spread_atol + spread * c_r) tightens with the term scale."""
    rows = (getattr(tol, "rows", None) or {}).get(name)
    return rows is None or not (rows.row == "element" and rows.spread)


def judge_outputs(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], tol,
                  term_scales=None, row_scales=None) -> list[Mismatch]:
    """Every output of `got` against its whole reference, with the verdict compare() gives with the
    task's term scales, computing those only where the verdict needs them.

    term_scales(): every output's term scale (tasks.reference.term_scales), or None to judge
    against |ref| alone. For attention it costs as much as the reference again, so:
    1. Each output is judged against |ref| first. One that passes there passes with any term scale
       (scale_only_loosens): that is its verdict. Outputs whose rows have a `spread` get the term
       scales up front instead (their bound is not monotone in the scale).
    2. Where some fail, row_scales({name: failing row indices}) (tasks.sampled.rows_at: the term
       scale of just those rows) gives their scale, taken ROW_SCALE_MARGIN low and |ref| on every
       other row: a scale at most the whole computation's everywhere, so a pass here is a pass
       there too.
    3. Otherwise (still failing, too many rows, no row scales, an aggregate bound broken) the term
       scales of the whole output are computed and judged with: the exact verdict, and the figures
       a failure reports."""
    names = list(got)
    if term_scales is None:
        return [compare(n, got[n], expected[n], tol) for n in names]
    if not all(scale_only_loosens(tol, n) for n in names):
        scales = term_scales() or {}
        return [compare(n, got[n], expected[n], tol, scales.get(n)) for n in names]
    plain = {n: _compare(n, got[n], expected[n], tol) for n in names}
    failing = [n for n in names if not plain[n][0].passed]
    if not failing:
        return [plain[n][0] for n in names]
    if row_scales is not None and _rows_may_pass(plain, failing):
        rows = {n: plain[n][1].nonzero().reshape(-1) for n in failing}
        if all(len(r) for r in rows.values()) and sum(len(r) for r in rows.values()) <= ROW_SCALES_MAX_ROWS:
            scales = row_scales(rows) or {}
            if all(scales.get(n) is not None for n in failing):
                partial = {n: _rows_judged(n, got[n], expected[n], tol, rows[n], scales[n]) for n in failing}
                if all(m.passed for m in partial.values()):
                    return [partial.get(n, plain[n][0]) for n in names]
    scales = term_scales() or {}
    return [compare(n, got[n], expected[n], tol, scales.get(n)) for n in names]


def _rows_may_pass(plain: dict, failing: list[str]) -> bool:
    """Every failing output's failure is row-wise (its rows known) and not the aggregate bound's,
    which no scale changes."""
    for n in failing:
        m, rows = plain[n]
        if rows is None or (m.rel_l2_bound is not None and (m.rel_l2 is None or m.rel_l2 > m.rel_l2_bound)):
            return False
    return True


def _rows_judged(name: str, got: torch.Tensor, expected: torch.Tensor, tol, rows: torch.Tensor,
                 row_scale: torch.Tensor) -> Mismatch:
    """compare() with the term scale on `rows` (less the margin) and |ref| everywhere else."""
    scale = torch.zeros_like(expected, dtype=torch.float32)  # max(|ref|, 0) = |ref|
    flat = scale.reshape(-1, 1) if scale.dim() == 3 else scale.reshape(-1, scale.shape[-1])
    flat[rows.to(flat.device)] = row_scale.to(flat.device, torch.float32).reshape(len(rows), -1) * (1 - ROW_SCALE_MARGIN)
    m = compare(name, got, expected, tol, scale)
    m.judged_against = "terms_rows"
    return m


SAMPLES = 4  # failing elements reported per output


def _failing_samples(bad: torch.Tensor, fdiff: torch.Tensor, g: torch.Tensor, e: torch.Tensor) -> list[ElementSample]:
    """The first failing element, the worst, and the rest spread evenly over the failing ones."""
    flat_bad = bad.reshape(-1).nonzero().reshape(-1)
    worst = int(flat_bad[int(fdiff.reshape(-1)[flat_bad].argmax())])
    n = len(flat_bad)  # positions in Python ints: float32 steps cannot name every index of a large output
    picks = [int(flat_bad[0]), worst] + [int(flat_bad[round(k * (n - 1) / (SAMPLES - 1))]) for k in range(SAMPLES)]
    out, gf, ef = [], g.reshape(-1), e.reshape(-1)
    for i in dict.fromkeys(picks):
        if len(out) == SAMPLES:
            break
        out.append(ElementSample(index=list(_unravel(i, tuple(g.shape))), got=float(gf[i]), expected=float(ef[i])))
    return out


def element_atol(row_tol, s: torch.Tensor, scale: torch.Tensor | None = None) -> float | torch.Tensor:
    """The absolute bound of each element of an output whose rows are single elements (LSE):
    atol (plus rtol's floor), or where the row tolerance has a `spread` and the output a term
    scale, each row's own min(atol, spread_atol + spread * scale) (schema.RowTolerance)."""
    floor = row_tol.rtol * row_tol.floor * float(s.square().mean().sqrt())
    if row_tol.spread and scale is not None:
        return torch.clamp(row_tol.spread_atol + row_tol.spread * scale.float(), max=row_tol.atol) + floor
    return row_tol.atol + floor


def row_ratios(diff: torch.Tensor, s: torch.Tensor, row_tol, scale: torch.Tensor | None = None) -> torch.Tensor:
    """Each row's L2 error over its allowance (schema.RowTolerance; > 1 fails), shaped as the
    output without its row dim ("last_dim") or as the output ("element"). `scale`: the output's
    term scale, which element rows with a `spread` are bounded by."""
    spread = row_tol.row == "element" and bool(row_tol.spread) and scale is not None
    if row_tol.row == "element":
        diff, s = diff.unsqueeze(-1), s.unsqueeze(-1)
    n = diff.shape[-1]
    err = diff.norm(dim=-1)
    own = s.norm(dim=-1)
    typical = s.square().mean().sqrt() * math.sqrt(n)  # a typical row's norm: rms over the output (on the device)
    absolute = (torch.clamp(row_tol.spread_atol + row_tol.spread * scale.float(), max=row_tol.atol) if spread
                else row_tol.atol * math.sqrt(n))
    allowed = row_tol.rtol * torch.maximum(own, row_tol.floor * typical) + absolute
    return err / allowed.clamp_min(1e-30)


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    idx = []
    for dim in reversed(shape):
        idx.append(flat % dim)
        flat //= dim
    return tuple(reversed(idx))
