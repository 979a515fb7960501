"""Sampled references: the exact fp32 answer for a random subset of an output, cheaply.

Every timed run of a candidate is judged (docs/METHODOLOGY.md), on inputs it has never
seen, so the judge must be cheap: a full attention reference costs more than the kernel.
For the op types below, a few random rows of each output are computed in fp32 from that
run's inputs, at a cost linear in the sequence length per row:

- gemm:    rows of C (C[m, :] = A[m, :] @ B^T).
- fp8_gemm: rows of D, from the drawn rows of A and all of B, dequantised (tasks/families/fp8_gemm.py).
- mha_fwd: query rows (b, h, i) of O and LSE.
- fp8_mha_fwd: the same, the rows' keys and values dequantised (X.float() * descale_x) after
  they are gathered, so no full fp32 copy of Q, K, V is made.
- mha_bwd: query rows of dQ and key rows (b, h, j) of dK and dV.

`sample(task, inputs, gen, rows)` returns, per output, the indices into the output
(flattened to [rows_total, row_len] as `view_rows` does), the expected fp32 rows and, for
tasks judged with tolerance.scale == "terms", the root-sum-square term scale of each
element (as tasks.reference.term_scales computes for the whole output). A task of another
op type has no sampler: the caller falls back to the full reference.

Which rows are drawn comes from a torch.Generator the caller seeds with a secret; the
kernel cannot know them.

How many rows: `rows_for(task)`, as many as stay cheap beside the kernel being judged (a
fault on a fraction f of an output's rows is missed by r sampled rows with probability at most
(1 - f)^r; docs/METHODOLOGY.md has the table). A GEMM row costs one row of A against all of B,
which is read once whatever r is: 1024 rows. An attention row gathers its head's keys and values
(fp32, S x D each; backward: five such per row), in chunks of 64 rows so that memory stays
bounded: 256 rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tasks.reference import _axes_from_shapes, _ieee_fp32, _widen
from tasks.schema import Task

SAMPLED_OP_TYPES = ("gemm", "fp8_gemm", "mha_fwd", "fp8_mha_fwd", "mha_bwd")
# Rows of each output judged on every timed run, per op type (module docstring); others: DEFAULT_ROWS.
SAMPLED_ROWS = {"gemm": 1024, "fp8_gemm": 1024, "mha_fwd": 256, "fp8_mha_fwd": 256, "mha_bwd": 256}
DEFAULT_ROWS = 64
CHUNK_ROWS = 64  # attention rows computed together (each gathers its head's S x D keys and values), at least
CHUNK_BYTES = 256 << 20  # ... and more while one gathered [rows, S, D] fp32 tensor stays within this (_chunk_rows)


@dataclass
class Sample:
    rows: torch.Tensor  # int64 row indices into view_rows(output)
    expected: torch.Tensor  # fp32 [len(rows), row_len]
    scale: torch.Tensor | None = None  # fp32, same shape, for tolerance.scale == "terms"


def has_sampler(task: Task) -> bool:
    return task.op_type in SAMPLED_OP_TYPES


def rows_for(task: Task) -> int:
    """How many rows of each output a timed run is judged on (module docstring)."""
    return SAMPLED_ROWS.get(task.op_type, DEFAULT_ROWS)


def view_rows(t: torch.Tensor) -> torch.Tensor:
    """An output as [rows, row_len]: its last dim is the row, except for 3-D LSE-like outputs
    [B, H, S], whose rows are single elements."""
    if t.dim() == 3:
        return t.reshape(-1, 1)
    return t.reshape(-1, t.shape[-1])


def sample(task: Task, inputs: dict[str, torch.Tensor], gen: torch.Generator, rows: int,
           terms: bool | None = None) -> dict[str, Sample]:
    """Expected values of `rows` random rows of every output (see the module docstring).
    `terms`: as rows_at."""
    return rows_at(task, inputs, draw_rows(task, inputs, gen, rows), terms)


def draw_rows(task: Task, inputs: dict[str, torch.Tensor], gen: torch.Generator, rows: int
              ) -> dict[str, torch.Tensor]:
    """`rows` random row indices (into view_rows) of every output; outputs computed from the same
    rows (O and LSE; dK and dV) share one index tensor."""
    if task.op_type not in SAMPLED_OP_TYPES:
        raise ValueError(f"no sampled reference for op type {task.op_type!r} (task {task.name})")
    if task.op_type in ("gemm", "fp8_gemm"):
        a = inputs["A"]
        return {"C" if task.op_type == "gemm" else "D": _pick(a.shape[0], rows, gen, a.device)}
    B, H, S, _ = inputs["Q"].shape
    if task.op_type in ("mha_fwd", "fp8_mha_fwd"):
        f = _pick(B * H * S, rows, gen, inputs["Q"].device)  # query rows (b*H + h) * S + i
        return {"O": f, "LSE": f}
    fq = _pick(B * H * S, rows, gen, inputs["Q"].device)
    fk = _pick(B * H * S, rows, gen, inputs["Q"].device)
    return {"dQ": fq, "dK": fk, "dV": fk}


def rows_at(task: Task, inputs: dict[str, torch.Tensor], rows: dict[str, torch.Tensor],
            terms: bool | None = None) -> dict[str, Sample]:
    """The fp32 reference (and, for tolerance.scale == "terms", the term scale) of the given rows of
    the named outputs: rows[name] are indices into view_rows(output). Outputs computed together
    (O and LSE; dK and dV) are computed once where they share one index tensor. What
    tools.correctness.judge_outputs asks for the rows that failed against |ref| alone.

    `terms`: False leaves the term scales out (Sample.scale None) where the caller computes them
    only for the rows whose verdict needs them (tools.workspace.lazy_sample_scales); the expected
    rows are the very same (the scales are computed after them, from the same gathered rows).
    None: the task's own (tolerance.scale == "terms")."""
    if task.op_type not in SAMPLED_OP_TYPES:
        raise ValueError(f"no sampled reference for op type {task.op_type!r} (task {task.name})")
    # attention gathers its rows' heads from the inputs as they are and widens only those (exactly):
    # widening every input whole first cost a copy of each at full size for every judged run. A GEMM
    # widens B whole (every row of C reads all of it) and only the drawn rows of A (_gemm).
    if task.op_type in ("mha_fwd", "mha_bwd"):
        x = dict(inputs)
    elif task.op_type == "gemm":
        x = {"A": inputs["A"], "B": _widen(inputs["B"])}
    else:
        x = {name: _widen(inputs[name]) for name in task.inputs}
    if terms is None:
        terms = task.tolerance.scale == "terms"
    terms = bool(terms) and task.tolerance.scale == "terms"
    out: dict[str, Sample] = {}
    with torch.no_grad(), _ieee_fp32():
        for name, idx in rows.items():
            if name in out:
                continue
            idx = idx.to(next(iter(inputs.values())).device)
            if task.op_type == "gemm":
                got = _gemm(x, idx, terms)
            elif task.op_type == "fp8_gemm":
                got = _fp8_gemm(inputs, idx, terms)
            else:
                sm_scale = float(task.scalar_values(_axes_from_shapes(task, inputs))["sm_scale"])
                causal = "causal" in task.tags
                if task.op_type == "mha_fwd":
                    got = _mha_fwd(x, idx, sm_scale, causal, terms)
                elif task.op_type == "fp8_mha_fwd":
                    got = _fp8_mha_fwd(inputs, idx, sm_scale, causal, terms)
                else:
                    got = _mha_bwd(x, idx, sm_scale, causal, terms, name)
            for other, smp in got.items():  # siblings drawn from the very same rows come along
                if other == name or (other in rows and rows[other] is rows[name]):
                    out[other] = smp
    return out


def _pick(n: int, k: int, gen: torch.Generator, device) -> torch.Tensor:
    """k distinct indices in [0, n) (all of them when k >= n)."""
    if k >= n:
        return torch.arange(n, device=device)
    return torch.randperm(n, generator=gen, device=gen.device)[:k].to(device)


def _gemm(x, m, terms) -> dict[str, Sample]:
    a, b = _widen(x["A"][m]), x["B"]  # the drawn rows of A, widened (exactly) after the gather
    c = a @ b.T
    scale = (a.square() @ b.square().T).sqrt_() if terms else None
    return {"C": Sample(m, c, scale)}


def _fp8_gemm(inputs, m, terms) -> dict[str, Sample]:
    from tasks.families.fp8_gemm import dequantize

    # Gather A's rows through a uint8 view (indexing kernels need not exist for fp8), then dequantise.
    a_rows = inputs["A"].view(torch.uint8)[m].view(inputs["A"].dtype)
    a, b = dequantize(a_rows, inputs["SF_A"][m]), dequantize(inputs["B"], inputs["SF_B"])
    d = a @ b.T
    scale = (a.square() @ b.square().T).sqrt_() if terms else None
    return {"D": Sample(m, d, scale)}


def _heads(x: dict[str, torch.Tensor], names) -> list[torch.Tensor]:
    B, H, S, D = x["Q"].shape
    return [x[n].reshape(B * H, S, D) for n in names]


def _mha_fwd(x, flat, sm_scale, causal, terms) -> dict[str, Sample]:
    q, k, v = _heads(x, ("Q", "K", "V"))
    BH, S, D = q.shape

    def rows_of(f: torch.Tensor) -> dict[str, Sample]:
        bh, i = f // S, f % S
        return _fwd_rows(f, i, q[bh, i].float(), k[bh].float(), v[bh].float(), sm_scale, causal, terms,
                         lse_scale=False)
    return _in_chunks(rows_of, flat, _chunk_rows(S, D))


def _fp8_mha_fwd(inputs, flat, sm_scale, causal, terms) -> dict[str, Sample]:
    # Gather through uint8 views (indexing kernels need not exist for fp8), then dequantise.
    q, k, v = (t.view(torch.uint8) for t in _heads(inputs, ("Q", "K", "V")))
    BH, S, D = q.shape

    def real(t: torch.Tensor, name: str) -> torch.Tensor:
        return t.view(torch.float8_e4m3fn).float() * inputs[f"descale_{name.lower()}"].float().reshape(())

    def rows_of(f: torch.Tensor) -> dict[str, Sample]:
        bh, i = f // S, f % S
        return _fwd_rows(f, i, real(q[bh, i], "Q"), real(k[bh], "K"), real(v[bh], "V"), sm_scale, causal, terms)
    return _in_chunks(rows_of, flat)


def _chunk_rows(S: int, D: int) -> int:
    """Attention rows computed together: CHUNK_ROWS, or more where their heads' gathered keys and
    values stay within CHUNK_BYTES (fp32): fewer, larger launches at short sequences, where a judged
    run's cost is launches, not bytes."""
    return max(CHUNK_ROWS, CHUNK_BYTES // (4 * S * D))


def _in_chunks(rows_of, flat: torch.Tensor, chunk: int = CHUNK_ROWS) -> dict[str, Sample]:
    """rows_of(indices) over `chunk` indices at a time, the Samples joined (bounded memory)."""
    parts = [rows_of(flat[c:c + chunk]) for c in range(0, len(flat), chunk)]
    return {name: Sample(torch.cat([p[name].rows for p in parts]), torch.cat([p[name].expected for p in parts]),
                         None if parts[0][name].scale is None else torch.cat([p[name].scale for p in parts]))
            for name in parts[0]}


def _fwd_rows(flat, i, q, k, v, sm_scale, causal, terms, lse_scale: bool = True) -> dict[str, Sample]:
    """O and LSE of the query rows q [r, D] against their heads' keys k and values v [r, S, D]."""
    S = k.shape[1]
    scores = torch.einsum("rd,rsd->rs", q, k) * sm_scale
    if causal:
        scores.masked_fill_(torch.arange(S, device=q.device)[None, :] > i[:, None], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    p = torch.exp(scores - lse[:, None])
    o = torch.einsum("rs,rsd->rd", p, v)
    o_scale = torch.einsum("rs,rsd->rd", p.square(), v.square()).sqrt_() if terms else None
    # FP8 attention's LSE term scale, as tasks.reference.term_scales (bf16 attention's LSE has none)
    c = p.square().sum(dim=-1, keepdim=True).sqrt_() if terms and lse_scale else None
    return {"O": Sample(flat, o, o_scale), "LSE": Sample(flat, lse[:, None], c)}


def _mha_bwd(x, flat, sm_scale, causal, terms, name) -> dict[str, Sample]:
    """dQ's query rows `flat` (name "dQ"), or dK's and dV's key rows `flat` (name "dK" or "dV"). Each
    head tensor a chunk needs is gathered once and widened (exactly) once."""
    q, k, v, o, do = _heads(x, ("Q", "K", "V", "O", "dO"))
    BH, S, D = q.shape
    lse = x["LSE"].float().reshape(BH, S)
    pos = torch.arange(S, device=q.device)

    def query_rows(f: torch.Tensor) -> dict[str, Sample]:
        # dQ[i] = sm_scale * sum_j dS[i, j] K[j], over the query rows drawn
        bh, i = f // S, f % S
        kh, vh = k[bh].float(), v[bh].float()
        qi, doi = q[bh, i].float(), do[bh, i].float()
        p = torch.exp(torch.einsum("rd,rsd->rs", qi, kh) * sm_scale - lse[bh, i][:, None])
        if causal:
            p = p.masked_fill(pos[None, :] > i[:, None], 0.0)
        delta = (doi * o[bh, i].float()).sum(-1, keepdim=True)
        ds = p * (torch.einsum("rd,rsd->rs", doi, vh) - delta)
        dq = torch.einsum("rs,rsd->rd", ds, kh) * sm_scale
        dq_scale = torch.einsum("rs,rsd->rd", ds.square(), kh.square_()).sqrt_() * sm_scale if terms else None
        return {"dQ": Sample(f, dq, dq_scale)}

    def key_rows(f: torch.Tensor) -> dict[str, Sample]:
        # dV[j] = sum_i P[i, j] dO[i] and dK[j] = sm_scale * sum_i dS[i, j] Q[i], over the key rows drawn
        bh, j = f // S, f % S
        qh, doh = q[bh].float(), do[bh].float()
        pt = torch.exp(torch.einsum("rd,rsd->rs", k[bh, j].float(), qh) * sm_scale - lse[bh])  # [r, i]
        if causal:
            pt = pt.masked_fill(pos[None, :] < j[:, None], 0.0)  # query i sees key j only when j <= i
        delta_all = (doh * o[bh].float()).sum(-1)  # [r, S]
        dst = pt * (torch.einsum("rd,rsd->rs", v[bh, j].float(), doh) - delta_all)
        dv = torch.einsum("rs,rsd->rd", pt, doh)
        dk = torch.einsum("rs,rsd->rd", dst, qh) * sm_scale
        dv_scale = dk_scale = None
        if terms:
            dv_scale = torch.einsum("rs,rsd->rd", pt.square(), doh.square_()).sqrt_()
            dk_scale = torch.einsum("rs,rsd->rd", dst.square(), qh.square_()).sqrt_() * sm_scale
        return {"dK": Sample(f, dk, dk_scale), "dV": Sample(f, dv, dv_scale)}

    chunk = _chunk_rows(S, D)
    return _in_chunks(query_rows, flat, chunk) if name == "dQ" else _in_chunks(key_rows, flat, chunk)
