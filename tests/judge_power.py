"""Honest and wrong outputs for every task family: the catalogue the judge is proven against.

Shared by the CPU test (tests/test_judge_power.py, reduced sizes) and the GPU test
(tests/gpu/test_judge_power_gpu.py, full size): plain torch functions of the task's inputs,
on whatever device the inputs live on.

Honest variants are what a good kernel may compute: fp32 throughout, P (and dS) rounded to
bf16 before the tensor-core products, the row sum taken from the rounded P, scaled FP8 P on
the FP8 tasks, exact block-scaled FP8 GEMM with a ~14-bit in-block accumulator, GDN's chunked
form with bf16 tensor-core operands and an fp32 state; every output rounded to its dtype.
Every one of them must pass the judge.

Wrong variants must all fail. Per task: an ignored input, a dropped or shifted causal mask, a
wrong scale, lower precision than the task allows, a shortcut that buys speed (a cheap exp, key
blocks or decays skipped where they look negligible); per output: a zeroed row, a stale row (the
same row computed from other inputs), a row copied from another position (each at the one of 8
random rows where it changes most), and 1, 16 or 256 elements multiplied by 1.5 or replaced by a
value from another position of the same output.
Corrupted elements are drawn among the elements whose |value| is at least their row's RMS, or
the row floor's share of the output's RMS where that is larger (twice that on FP8 attention, see
MATERIAL) (for outputs whose rows are single
elements, LSE: at least the output's median |value|): a change far below a good kernel's own
error in that row is no fault any judge can see.
"""
from __future__ import annotations

import inspect
import math
from typing import Callable, Collection, Iterator

import torch
import torch.nn.functional as F

from tasks.schema import Task

Outputs = dict[str, torch.Tensor]
E4M3 = torch.float8_e4m3fn
ELEMENT_COUNTS = (1, 16, 256)
GDN_OPS = ("gdn_decode", "gdn_prefill", "gdn_mtp")
# The honest variants furthest from the reference, per op type: on workloads where the catalogue
# does not run, these alone are judged (the others err less by construction).
LEAST_PRECISE = {"gemm": ("split_k4_fp32",), "fp8_gemm": ("block_acc14bit",), "mha_fwd": ("p_bf16_rowsum_rounded",),
                 "fp8_mha_fwd": ("p_e4m3_x256_rowsum_rounded",), "mha_bwd": ("p_ds_bf16",),
                 "gdn_decode": ("fp32_recurrence",), "gdn_prefill": ("chunked_bf16_mma_fp32_state",),
                 "gdn_mtp": ("tf32_mma",)}
# Corrupted elements are at least this many times their row's RMS. FP8 attention's honest error
# (P in e4m3) is ~3% of a row's norm, as much as x1.5 on one element of typical size in a row of
# 128: no judge can tell those apart, so there the catalogue corrupts elements twice the row's RMS.
MATERIAL = {"fp8_mha_fwd": 2.0}


def bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).float()


def e4m3(t: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """t rounded to e4m3 after multiplying by `scale` (and divided back)."""
    return (t * scale).clamp(-448, 448).to(E4M3).float() / scale


def as_written(task: Task, out: Outputs) -> Outputs:
    """Outputs rounded to the dtypes a kernel writes them in, as fp32."""
    dt = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}
    return {n: out[n].to(dt[task.outputs[n].dtype]).float() for n in task.outputs}


# ---------------------------------------------------------------------------------------------
# GEMM and FP8 GEMM

def gemm(x: dict, operand: Callable = lambda t: t, k_keep: int | None = None, split_k: int = 1,
         k_drop: tuple[int, int] | None = None, bf16_running_sum: int = 0) -> Outputs:
    """C = A Bᵀ in fp32 over the first `k_keep` K (all), in `split_k` partial sums; `k_drop`: a K
    range [start, end) left out; `bf16_running_sum`: K steps of that width whose running sum is
    kept in bf16 between steps (a kernel that accumulates in bf16 instead of fp32)."""
    a, b = operand(x["A"].float()), operand(x["B"].float())
    if k_drop is not None:
        keep = torch.ones(a.shape[1], dtype=torch.bool, device=a.device)
        keep[k_drop[0]:k_drop[1]] = False
        a, b = a[:, keep], b[:, keep]
    K = a.shape[1] if k_keep is None else k_keep
    if bf16_running_sum:
        c = torch.zeros(a.shape[0], b.shape[0], device=a.device)
        for k0 in range(0, K, bf16_running_sum):
            c = bf16(c + a[:, k0:min(K, k0 + bf16_running_sum)] @ b[:, k0:min(K, k0 + bf16_running_sum)].T)
        return {"C": c}
    step = -(-K // split_k)
    c = sum(a[:, k0:min(K, k0 + step)] @ b[:, k0:min(K, k0 + step)].T for k0 in range(0, K, step))
    return {"C": c}


def gemm_truncating(x: dict, step: int = 16, bits: int = 24) -> Outputs:
    """An emulated tensor core's fp32 accumulation (an honest kernel, the least precise one): per
    K step of `step` (one bf16 wgmma's K), the running sum and the step's exact products are
    aligned to the largest of them and cut to `bits` bits below its leading bit (truncation, not
    rounding: published measurements of NVIDIA tensor cores), summed, and the sum cut to fp32's
    24 bits toward zero. Its error grows with the terms, not with |C|: what the GEMM tasks' term
    scale is for. fp64 [M, N, step] per step: for CPU sizes (tests/test_judge_power_gemm.py runs it
    at every shape's full K); at full size on the GPU the library (cuBLAS) is the real one."""
    a, b = x["A"].double(), x["B"].double()
    c = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float64, device=a.device)
    for k0 in range(0, a.shape[1], step):
        c = _truncating_step(c, a[:, None, k0:k0 + step] * b[None, :, k0:k0 + step], bits, 24)
    return {"C": c.float()}


def _ulp(m: torch.Tensor, keep: int) -> torch.Tensor:
    """2^(e - keep) with 2^(e-1) <= m < 2^e: the weight of the last of `keep` bits below m's leading bit."""
    return torch.exp2(torch.floor(torch.log2(m.clamp_min(1e-300))) + 1 - keep)


def _truncating_step(acc: torch.Tensor, products: torch.Tensor, bits: int, sum_bits: int) -> torch.Tensor:
    """One tensor-core step: the accumulator and the step's products ([..., step]) aligned to the
    largest and cut to `bits` bits below its leading bit, summed, the sum cut to `sum_bits`."""
    terms = torch.cat([acc[..., None], products], dim=-1)
    u = _ulp(terms.abs().amax(-1, keepdim=True), bits)
    total = (torch.trunc(terms / u) * u).sum(-1)
    u = _ulp(total.abs(), sum_bits)
    return torch.trunc(total / u) * u


def fp8_gemm_truncating(x: dict, promote: bool = True, bits: int = 14, step: int = 32) -> Outputs:
    """Hopper's fp8 wgmma as DeepSeek-V3 describes it: per K32 step the accumulator and the products
    aligned to the largest and cut to ~14 bits. `promote` (DeepGEMM, honest): each 128-wide K block's
    sum leaves the tensor core, is scaled by SF_A * SF_B and added in fp32. Without it (a kernel that
    saves the promotion: the accumulator rescaled in place, every K in the tensor core) the 14-bit
    cut applies to the running sum of all K: DeepSeek measured ~2% error at K=4096. fp64
    [M, N, step] per step: CPU sizes."""
    a, b = x["A"].double(), x["B"].double()
    sa, sb = x["SF_A"].double(), x["SF_B"].double()
    nb = torch.arange(b.shape[0], device=a.device) // 128
    out = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float64, device=a.device)
    acc = torch.zeros_like(out)
    for kb in range(a.shape[1] // 128):
        scale = sa[:, kb, None] * sb[nb, kb][None, :]
        for k0 in range(kb * 128, kb * 128 + 128, step):
            products = a[:, None, k0:k0 + step] * b[None, :, k0:k0 + step]
            acc = _truncating_step(acc, products if promote else products * scale[..., None], bits, bits)
        if promote:
            out = (out + acc * scale).float().double()
            acc = torch.zeros_like(out)
    return {"D": (out if promote else acc).float()}


def _per_tensor_e4m3(t: torch.Tensor) -> torch.Tensor:
    return e4m3(t, 448.0 / float(t.abs().max()))


def _per_row_e4m3(t: torch.Tensor) -> torch.Tensor:
    """t rounded to e4m3 with one scale per row (last dim): the best a cheap FP8 quantisation does."""
    amax = t.abs().amax(-1, keepdim=True).clamp_min(1e-30)
    return e4m3(t * (448.0 / amax)) * (amax / 448.0)


def exp_linear_mantissa(t: torch.Tensor) -> torch.Tensor:
    """e^t as 2^floor(y) * (1 + frac(y)), y = t / ln 2 (Schraudolph's exponential: the mantissa
    linear in y, an integer add and a shift): up to 6.1% too large, as cheap as an exp gets."""
    y = t / math.log(2)
    whole = torch.floor(y)
    return torch.where(torch.isneginf(t), torch.zeros_like(t), torch.exp2(whole) * (1 + y - whole))


def _round_mantissa(t: torch.Tensor, bits: int) -> torch.Tensor:
    mant, exp = torch.frexp(t)
    return torch.ldexp(torch.round(mant * 2.0 ** (bits + 1)) / 2.0 ** (bits + 1), exp)


def fp8_gemm(x: dict, acc_bits: int | None = None, sf_a: str = "given", sf_b: str = "given",
             drop_last_block: bool = False, bf16_accumulator: bool = False) -> Outputs:
    """A block-scaled kernel: fp32 partial sum per 128-wide K block (optionally rounded to
    `acc_bits` mantissa bits: Hopper's fp8 wgmma accumulates with ~14 bits inside a block),
    scaled by SF_A * SF_B and added in fp32 (or in bf16: `bf16_accumulator`)."""
    a, b = x["A"].float(), x["B"].float()
    sa, sb = x["SF_A"].float(), x["SF_B"].float()
    nb = torch.arange(b.shape[0], device=a.device) // 128
    if sf_b == "neighbour":  # the next 128 rows' block scale
        nb = (nb + 1) % sb.shape[0]
    kblocks = a.shape[1] // 128
    out = torch.zeros(a.shape[0], b.shape[0], device=a.device)
    for kb in range(kblocks - (1 if drop_last_block else 0)):
        cols = slice(kb * 128, (kb + 1) * 128)
        partial = a[:, cols] @ b[:, cols].T
        if acc_bits is not None:
            partial = _round_mantissa(partial, acc_bits)
        scale_a = torch.ones_like(sa[:, 0]) if sf_a == "ignored" else sa[:, kb]
        out = out + partial * (scale_a[:, None] * sb[nb, kb][None, :])
        if bf16_accumulator:
            out = bf16(out)
    return {"D": out}


# ---------------------------------------------------------------------------------------------
# Attention forward (bf16 and FP8) and backward

def _heads_step(S: int) -> int:
    return max(1, 2 ** 27 // (S * S))  # at most 512 MiB per S x S fp32 matrix


def _keep(S: int, device, shift: int) -> torch.Tensor:
    """Causal keep-mask, top-left aligned, with the diagonal moved by `shift` keys."""
    i = torch.arange(S, device=device)
    return i[None, :] <= i[:, None] + shift


def _dequantised(x: dict, name: str) -> torch.Tensor:
    t = x[name].float()
    key = f"descale_{name.lower()}"
    return t * x[key].float().reshape(()) if key in x else t


def attention_forward(x: dict, sm_scale: float, causal: bool, p_round: Callable = lambda t: t,
                      l_from_rounded: bool = False, mask_shift: int = 0, drop_mask: bool = False,
                      drop_keys: int = 0, score_scale: float = 1.0, ignore_descale_v: bool = False,
                      lse_out: Callable = lambda t: t, qk_round: Callable = lambda t: t,
                      exp: Callable = torch.exp, skip_blocks_below: float | None = None) -> Outputs:
    """A FlashAttention-style forward: row max and exp in fp32, P = exp(s - m) rounded by
    `p_round` before P @ V, the row sum l from P (or from the rounded P), O = (P @ V) / l.
    Shortcuts a fast kernel might take: Q and K rounded by `qk_round` before Q K^T, another `exp`,
    and `skip_blocks_below`: blocks of 64 keys whose largest score is more than that below the
    row's max left out (their P taken as 0)."""
    B, H, S, D = x["Q"].shape
    q, k = (qk_round(_dequantised(x, n).reshape(B * H, S, D)) for n in ("Q", "K"))
    v = (x["V"].float() if ignore_descale_v else _dequantised(x, "V")).reshape(B * H, S, D)
    O = torch.empty(B * H, S, D, device=q.device)
    LSE = torch.empty(B * H, S, device=q.device)
    keep = _keep(S, q.device, mask_shift) if causal and not drop_mask else None
    if drop_keys:
        kept = torch.arange(S, device=q.device) < S - drop_keys
        keep = kept[None, :] if keep is None else keep & kept[None, :]
    step = _heads_step(S)
    for h in range(0, B * H, step):
        c = slice(h, h + step)
        s = torch.matmul(q[c], k[c].transpose(1, 2)) * (sm_scale * score_scale)
        if keep is not None:
            s.masked_fill_(~keep, float("-inf"))
        m = s.amax(-1, keepdim=True)
        m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        p = exp(s - m)
        if skip_blocks_below is not None:
            blocks = F.pad(s, (0, -S % 64), value=float("-inf")).unflatten(-1, (-1, 64)).amax(-1)
            far = (blocks < m - skip_blocks_below).repeat_interleave(64, dim=-1)[..., :S]
            p.masked_fill_(far, 0.0)
        del s
        pr = p_round(p)
        l = (pr if l_from_rounded else p).sum(-1, keepdim=True)
        O[c] = torch.matmul(pr, v[c]) / l
        LSE[c] = (m + torch.log(l)).squeeze(-1)
    return {"O": O.reshape(B, H, S, D), "LSE": lse_out(LSE.reshape(B, H, S))}


def attention_backward(x: dict, sm_scale: float, causal: bool, p_round: Callable = lambda t: t,
                       ds_round: Callable = lambda t: t, mask_shift: int = 0, drop_mask: bool = False,
                       drop_keys: int = 0, delta_from_o: bool = True, grad_scale: float | None = None) -> Outputs:
    """A FlashAttention-2-style backward: P recomputed from LSE, P and dS rounded before the products."""
    B, H, S, D = x["Q"].shape
    q, k, v, o, do = (x[n].float().reshape(B * H, S, D) for n in ("Q", "K", "V", "O", "dO"))
    lse = x["LSE"].float().reshape(B * H, S, 1)
    out = {n: torch.empty(B * H, S, D, device=q.device) for n in ("dQ", "dK", "dV")}
    keep = _keep(S, q.device, mask_shift) if causal and not drop_mask else None
    if drop_keys:
        kept = torch.arange(S, device=q.device) < S - drop_keys
        keep = kept[None, :] if keep is None else keep & kept[None, :]
    g = sm_scale if grad_scale is None else grad_scale
    step = _heads_step(S)
    for h in range(0, B * H, step):
        c = slice(h, h + step)
        p = torch.exp(torch.matmul(q[c], k[c].transpose(1, 2)) * sm_scale - lse[c])
        if keep is not None:
            p.masked_fill_(~keep, 0.0)
        delta = (do[c] * o[c]).sum(-1, keepdim=True) if delta_from_o else torch.zeros_like(lse[c])
        ds = ds_round(p * (torch.matmul(do[c], v[c].transpose(1, 2)) - delta))
        out["dV"][c] = torch.matmul(p_round(p).transpose(1, 2), do[c])
        del p
        out["dQ"][c] = torch.matmul(ds, k[c]) * g
        out["dK"][c] = torch.matmul(ds.transpose(1, 2), q[c]) * g
    return {n: t.reshape(B, H, S, D) for n, t in out.items()}


# ---------------------------------------------------------------------------------------------
# Gated DeltaNet: the token recurrence with options, and the chunked form

def _gates(x: dict, dt_bias: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    bias = x["dt_bias"].float() if dt_bias else torch.zeros_like(x["dt_bias"].float())
    g = torch.exp(-torch.exp(x["A_log"].float()) * F.softplus(x["a"].float() + bias))
    return g, torch.sigmoid(x["b"].float())


def _sequences(x: dict, ignore_indices: bool = False) -> tuple[dict, torch.Tensor, list[int], Callable]:
    """Any GDN task's inputs as packed sequences: (tokens [T, heads, ...] of q, k, v, a, b; the
    initial state of each sequence; sequence bounds; a function that shapes the outputs back)."""
    names = ("q", "k", "v", "a", "b")
    if "cu_seqlens" in x:  # prefill: already packed
        return {n: x[n] for n in names}, x["state"], [int(t) for t in x["cu_seqlens"].tolist()], lambda o, s: (o, s)
    B, T = x["q"].shape[:2]  # decode (T = 1) and MTP: sequence b is tokens b*T .. b*T + T
    tokens = {n: x[n].reshape(B * T, *x[n].shape[2:]) for n in names}
    if "initial_state" in x:  # MTP: each sequence's state gathered from the pool
        idx = torch.arange(B, device=x["q"].device) if ignore_indices else x["initial_state_indices"].long()
        state = x["initial_state"][idx]
    else:
        state = x["state"]
    return tokens, state, list(range(0, B * T + 1, T)), lambda o, s: (o.reshape(B, T, *o.shape[1:]), s)


def gdn_recurrence(x: dict, scale: float, state_round: Callable = lambda t: t, mma: Callable = lambda t: t,
                   zero_state: bool = False, one_sequence: bool = False, dt_bias: bool = True,
                   gate_after: bool = False, ignore_indices: bool = False,
                   decay: Callable = lambda g: g) -> Outputs:
    """The references' token-by-token recurrence for decode, prefill and MTP, with options: the
    state rounded after every token (`state_round`), the state and q/k rounded as MMA operands
    for S k and S q (`mma`: tf32 for an MTP kernel on tensor cores), and faults (`decay`: a
    shortcut on the decays g)."""
    tok, S0, bounds, shape_back = _sequences(x, ignore_indices)
    g, beta = _gates({**x, "a": tok["a"], "b": tok["b"]}, dt_bias)
    g = decay(g)
    HV, HQ = tok["v"].shape[1], tok["q"].shape[1]
    qh, kh = (tok[n].float().repeat_interleave(HV // HQ, dim=1) for n in ("q", "k"))
    vh = tok["v"].float()
    S = S0.float().clone()
    if zero_state:
        S.zero_()
    if one_sequence:  # cu_seqlens ignored: one sequence over all tokens, from state[0]
        bounds = [0, bounds[-1]]
    starts, ends = bounds[:-1], bounds[1:]
    out = torch.zeros(qh.shape[0], HV, vh.shape[2], device=qh.device)
    live = None
    for i in range(max(e - s for s, e in zip(starts, ends))):
        now = [m for m in range(len(starts)) if starts[m] + i < ends[m]]
        if now != live:
            live = now
            n = torch.tensor(live, device=qh.device)
            t = torch.tensor([starts[m] + i for m in live], device=qh.device)
        Sn = S[n]
        if not gate_after:
            Sn = Sn * g[t][:, :, None, None]
        delta = beta[t][:, :, None] * (vh[t] - torch.einsum("nhvk,nhk->nhv", mma(Sn), mma(kh[t])))
        Sn = Sn + delta[:, :, :, None] * kh[t][:, :, None, :]
        if gate_after:
            Sn = Sn * g[t][:, :, None, None]
        Sn = state_round(Sn)
        out[t] = scale * torch.einsum("nhvk,nhk->nhv", mma(Sn), mma(qh[t]))
        S[n] = Sn
        t = t + 1
    if one_sequence:
        S = S[:1].expand_as(S0).clone()  # every sequence's final state is the one long sequence's
    o, s = shape_back(out, S)
    return {"output": o, "new_state": s}


def tf32(t: torch.Tensor) -> torch.Tensor:
    """t rounded to tf32 (10 explicit mantissa bits), as a tensor core reads fp32 operands."""
    return _round_mantissa(t, 10)


def gdn_chunked(x: dict, scale: float, mma: Callable = lambda t: t, chunk: int = 64) -> Outputs:
    """The chunked form (WY representation, 64-token chunks) a tensor-core prefill kernel runs,
    all value heads of a sequence at once; `mma` rounds what the kernel feeds its MMAs (the state
    read, W, U, the masked Q K^T, the decayed K). State and arithmetic otherwise fp32."""
    q, k, v = x["q"], x["k"], x["v"]
    HV, HQ = v.shape[1], q.shape[1]
    qh, kh = (t.float().repeat_interleave(HV // HQ, dim=1).transpose(0, 1) for t in (q, k))  # [HV, T, K]
    vh = v.float().transpose(0, 1)  # [HV, T, V]
    g, beta = _gates(x)
    logg, beta = torch.log(g).transpose(0, 1), beta.transpose(0, 1)  # [HV, T]
    bounds = [int(t) for t in x["cu_seqlens"].tolist()]
    out = torch.zeros(HV, q.shape[0], v.shape[2], device=q.device)
    new_state = torch.empty_like(x["state"], dtype=torch.float32)
    for n in range(len(bounds) - 1):
        S = x["state"][n].float().clone()  # [HV, V, K]
        for c0 in range(bounds[n], bounds[n + 1], chunk):
            c = slice(c0, min(bounds[n + 1], c0 + chunk))
            Q, Kc, Vc, b = qh[:, c], kh[:, c], vh[:, c], beta[:, c]
            gamma = logg[:, c].cumsum(-1)  # [HV, n]
            L = Q.shape[1]
            lower = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
            diff = gamma[:, :, None] - gamma[:, None, :]
            M = torch.where(lower, torch.exp(torch.where(lower, diff, torch.zeros_like(diff))), torch.zeros_like(diff))
            A = (b[:, :, None] * M * (Kc @ Kc.transpose(1, 2))).tril(-1)
            eye = torch.eye(L, device=q.device).expand_as(A)
            Gam = torch.exp(gamma)
            W = mma(torch.linalg.solve_triangular(eye + A, (b * Gam)[:, :, None] * Kc, upper=False, unitriangular=True))
            S_in = mma(S)
            U = mma(torch.linalg.solve_triangular(eye + A, b[:, :, None] * Vc, upper=False, unitriangular=True)
                    - W @ S_in.transpose(1, 2))
            out[:, c] = scale * (Gam[:, :, None] * (Q @ S_in.transpose(1, 2)) + mma(M * (Q @ Kc.transpose(1, 2))) @ U)
            S = Gam[:, -1, None, None] * S + U.transpose(1, 2) @ mma(torch.exp(gamma[:, -1:] - gamma)[:, :, None] * Kc)
        new_state[n] = S
    return {"output": out.transpose(0, 1).contiguous(), "new_state": new_state}


# ---------------------------------------------------------------------------------------------
# The catalogue per task

def _scalar(task: Task, x: dict, name: str) -> float:
    from tasks.reference import _axes_from_shapes

    return float(task.scalar_values(_axes_from_shapes(task, x))[name])


def honest_variants(task: Task, x: dict) -> dict[str, Callable[[], Outputs]]:
    """What a good kernel may compute (each a thunk: computed when judged, one at a time)."""
    op, causal = task.op_type, "causal" in task.tags
    if op == "gemm":
        return {"fp32_accumulate": lambda: gemm(x), "split_k4_fp32": lambda: gemm(x, split_k=4)}
    if op == "fp8_gemm":
        return {"block_fp32": lambda: fp8_gemm(x), "block_acc14bit": lambda: fp8_gemm(x, acc_bits=13)}
    if op in ("mha_fwd", "fp8_mha_fwd"):
        sm = _scalar(task, x, "sm_scale")
        variants = {"fp32": lambda: attention_forward(x, sm, causal),
                    "p_bf16": lambda: attention_forward(x, sm, causal, p_round=bf16),
                    "p_bf16_rowsum_rounded": lambda: attention_forward(x, sm, causal, p_round=bf16,
                                                                       l_from_rounded=True)}
        if op == "fp8_mha_fwd":  # FlashAttention-3: P * 256 rounded to e4m3 for the e4m3 P @ V
            variants["p_e4m3_x256"] = lambda: attention_forward(x, sm, causal, p_round=lambda p: e4m3(p, 256.0))
            variants["p_e4m3_x256_rowsum_rounded"] = lambda: attention_forward(
                x, sm, causal, p_round=lambda p: e4m3(p, 256.0), l_from_rounded=True)
        return variants
    if op == "mha_bwd":
        sm = _scalar(task, x, "sm_scale")
        return {"fp32": lambda: attention_backward(x, sm, causal),
                "p_ds_bf16": lambda: attention_backward(x, sm, causal, p_round=bf16, ds_round=bf16)}
    if op in GDN_OPS:
        sc = _scalar(task, x, "scale")
        variants = {"fp32_recurrence": lambda: gdn_recurrence(x, sc)}
        if op == "gdn_prefill":
            variants["chunked_fp32"] = lambda: gdn_chunked(x, sc)
            variants["chunked_bf16_mma_fp32_state"] = lambda: gdn_chunked(x, sc, mma=bf16)
        if op == "gdn_mtp":  # the artifact asks for tensor cores on the fp32 state: tf32 operands
            variants["tf32_mma"] = lambda: gdn_recurrence(x, sc, mma=tf32)
        return variants
    raise ValueError(f"no catalogue for op type {op!r}")


def computed_faults(task: Task, x: dict) -> dict[str, Callable[[], Outputs]]:
    """Kernels that compute the wrong thing: ignored input, mask, scale, precision."""
    op, causal = task.op_type, "causal" in task.tags
    if op == "gemm":
        K = x["A"].shape[1]
        mid = K // 2 // 16 * 16
        # (the term scale loosens near-zero elements: a K slice of 16 left out errs ~sqrt(16/K) of
        # rss everywhere, 2.7% at K=21504; bf16 kept between K tiles instead of fp32)
        return {"ignored_input:last_64_of_K": lambda: gemm(x, k_keep=K - 64),
                "ignored_input:one_K_slice_of_16": lambda: gemm(x, k_drop=(mid, mid + 16)),
                "wrong_scale:x1.02": lambda: {"C": gemm(x)["C"] * 1.02},
                "low_precision:operands_e4m3": lambda: gemm(x, operand=_per_tensor_e4m3),
                "low_precision:bf16_running_sum_per_K64": lambda: gemm(x, bf16_running_sum=64)}
    if op == "fp8_gemm":
        return {"ignored_input:SF_A": lambda: fp8_gemm(x, sf_a="ignored"),
                "ignored_input:last_k_block": lambda: fp8_gemm(x, drop_last_block=True),
                "wrong_scale:SF_B_of_next_block": lambda: fp8_gemm(x, sf_b="neighbour"),
                "low_precision:bf16_accumulator": lambda: fp8_gemm(x, bf16_accumulator=True)}
    if op in ("mha_fwd", "fp8_mha_fwd"):
        sm = _scalar(task, x, "sm_scale")
        p_kernel = bf16 if op == "mha_fwd" else (lambda p: e4m3(p, 256.0))  # the honest kernel's P, as the shortcuts keep it
        faults = {"ignored_input:last_16_keys": lambda: attention_forward(x, sm, causal, drop_keys=16),
                  "wrong_scale:scores_x1.01": lambda: attention_forward(x, sm, causal, score_scale=1.01),
                  "wrong_scale:lse_log2": lambda: attention_forward(x, sm, causal, lse_out=lambda t: t / math.log(2)),
                  # shortcuts that buy speed: a linear-mantissa exp; key blocks far below the row's max skipped
                  # (e^-3 a key: fine where one key dominates, not where many share the rest; at -4 a no-op on
                  # some inputs of 77-96 keys)
                  "low_precision:exp_linear_mantissa": lambda: attention_forward(
                      x, sm, causal, p_round=p_kernel, l_from_rounded=True, exp=exp_linear_mantissa),
                  "skipped:key_blocks_below_max-3": lambda: attention_forward(
                      x, sm, causal, p_round=p_kernel, skip_blocks_below=3.0)}
        if op == "mha_fwd":
            faults["low_precision:p_e4m3_x256"] = lambda: attention_forward(x, sm, causal,
                                                                             p_round=lambda p: e4m3(p, 256.0))
            # (not on the FP8 tasks: a row sum of the e4m3 P, which they allow, errs as much as a bf16 LSE)
            faults["low_precision:lse_bf16"] = lambda: attention_forward(x, sm, causal, lse_out=bf16)
            # FP8 tensor cores for Q K^T on a bf16 task (twice the rate): even one scale per row errs ~3% a score
            faults["low_precision:qk_e4m3_per_row"] = lambda: attention_forward(x, sm, causal, p_round=bf16,
                                                                                 qk_round=_per_row_e4m3)
        else:
            faults["ignored_input:descale_v"] = lambda: attention_forward(x, sm, causal, ignore_descale_v=True)
            faults["low_precision:p_e4m3_unscaled"] = lambda: attention_forward(x, sm, causal, p_round=e4m3)
        if causal:
            faults["mask:dropped"] = lambda: attention_forward(x, sm, causal, drop_mask=True)
            faults["mask:shifted_by_1"] = lambda: attention_forward(x, sm, causal, mask_shift=1)
        return faults
    if op == "mha_bwd":
        sm = _scalar(task, x, "sm_scale")
        faults = {"ignored_input:O_(Delta=0)": lambda: attention_backward(x, sm, causal, delta_from_o=False),
                  "ignored_input:last_16_keys": lambda: attention_backward(x, sm, causal, drop_keys=16),
                  "wrong_scale:dQ_dK_x1.02": lambda: attention_backward(x, sm, causal, grad_scale=sm * 1.02),
                  "low_precision:ds_e4m3": lambda: attention_backward(x, sm, causal, p_round=bf16,
                                                                      ds_round=lambda t: e4m3(t, 64.0)),
                  "low_precision:p_e4m3_x256_for_dV": lambda: attention_backward(
                      x, sm, causal, p_round=lambda p: e4m3(p, 256.0), ds_round=bf16)}
        if causal:
            faults["mask:dropped"] = lambda: attention_backward(x, sm, causal, drop_mask=True)
            faults["mask:shifted_by_1"] = lambda: attention_backward(x, sm, causal, mask_shift=1)
        return faults
    if op in GDN_OPS:
        sc = _scalar(task, x, "scale")
        faults = {"ignored_input:state": lambda: gdn_recurrence(x, sc, zero_state=True),
                  "ignored_input:dt_bias": lambda: gdn_recurrence(x, sc, dt_bias=False),
                  "wrong_scale:output_x1.02": lambda: {**(r := gdn_recurrence(x, sc)), "output": r["output"] * 1.02},
                  "wrong_order:decay_after_update": lambda: gdn_recurrence(x, sc, gate_after=True),
                  # a decay above 0.99 taken as 1 (the multiply skipped): wrong by up to 1% of the state a token
                  "skipped:decay_above_0.99": lambda: gdn_recurrence(
                      x, sc, decay=lambda g: torch.where(g > 0.99, torch.ones_like(g), g))}
        if op == "gdn_mtp":  # no state comes back, and 4 tokens of a bf16 state stay near bf16 output rounding
            faults["low_precision:mma_operands_e4m3"] = lambda: gdn_recurrence(x, sc, mma=e4m3)
        else:
            faults["low_precision:state_bf16_per_token"] = lambda: gdn_recurrence(x, sc, state_round=bf16)
        if op == "gdn_prefill":
            faults["ignored_input:cu_seqlens"] = lambda: gdn_recurrence(x, sc, one_sequence=True)
        if op == "gdn_mtp":
            faults["ignored_input:initial_state_indices"] = lambda: gdn_recurrence(x, sc, ignore_indices=True)
        return faults
    raise ValueError(f"no catalogue for op type {op!r}")


def rows_of(task: Task, name: str, t: torch.Tensor) -> torch.Tensor:
    """The output as [rows, row_len], rows as the judge sees them (Tolerance.rows, else the last dim)."""
    spec = task.tolerance.rows.get(name)
    return t.reshape(-1, 1) if spec is not None and spec.row == "element" else t.reshape(-1, t.shape[-1])


def corrupted(task: Task, good: Outputs, stale: Outputs, gen: torch.Generator) -> Iterator[tuple[str, Outputs]]:
    """Row and element faults applied to an otherwise perfect output (the reference as written),
    made one at a time (a full-size output is gigabytes)."""
    for name, t in good.items():
        rows = rows_of(task, name, t)
        n_rows, row_len = rows.shape

        def with_rows(fn) -> Outputs:
            r = rows.clone()
            fn(r)
            return {**good, name: r.reshape(t.shape)}

        # Rows drawn at random, each fault at the candidate where it changes most: zeroing a row of
        # zeros or copying an equal row is no fault (causal LSE rows at one position differ little).
        cand = torch.randint(0, n_rows, (8,), generator=gen, device=gen.device).to(rows.device)
        old_rows = rows_of(task, name, stale[name])
        zero_at = int(cand[rows[cand].norm(dim=-1).argmax()])
        stale_at = int(cand[(old_rows[cand] - rows[cand]).norm(dim=-1).argmax()])
        pick = int(cand[0])
        other = int(cand[1:][(rows[cand[1:]] - rows[pick]).norm(dim=-1).argmax()])
        yield f"{name}:zeroed_row", with_rows(lambda r: r[zero_at].zero_())
        yield f"{name}:stale_row", with_rows(lambda r: r[stale_at].copy_(old_rows[stale_at]))
        yield f"{name}:row_from_another", with_rows(lambda r: r[pick].copy_(rows[other]))
        flat = t.reshape(-1)
        mag = flat.abs()
        if row_len > 1:  # elements at least as large as their row's RMS, or the judge's floor for a row
            spec = task.tolerance.rows.get(name)
            floor = (spec.floor if spec else 0.0) * float(rows.square().mean().sqrt())
            rms = rows.square().mean(dim=-1, keepdim=True).sqrt().clamp_min(floor)
            material = (rows.abs() >= MATERIAL.get(task.op_type, 1.0) * rms).reshape(-1)
        else:
            material = mag >= mag.median()
        large = material.nonzero().squeeze(1)
        for count in ELEMENT_COUNTS:
            if count > large.numel() // 4:
                continue
            picks = torch.randint(0, large.numel(), (2 * count,), generator=gen, device=gen.device).unique()
            where = large[picks[torch.randperm(picks.numel(), generator=gen)[:count]].to(large.device)]
            src = torch.randint(0, flat.numel(), (count, 8), generator=gen, device=gen.device).to(flat.device)
            best = (flat[src] - flat[where][:, None]).abs().argmax(dim=1)  # the candidate differing most
            moved = flat[src.gather(1, best[:, None]).squeeze(1)]
            for kind, value in (("x1.5", flat[where] * 1.5), ("from_another_position", moved)):
                f = flat.clone()
                f[where] = value
                yield f"{name}:{count}_elements_{kind}", {**good, name: f.reshape(t.shape)}
        if task.op_type == "gemm":
            # The element nearest zero, given a typical value of another position: judged on the scale of
            # its terms (scale "terms"), a near-zero element's bound is ~1% of rss, not atol; a value
            # of the output's typical size is still ~100x that.
            near_zero = int(mag.argmin())
            f = flat.clone()
            f[near_zero] = flat[large[0]]
            yield f"{name}:1_near_zero_element_from_another_position", {**good, name: f.reshape(t.shape)}


def sparse_resolution(task: Task, expected: Outputs, good: Outputs, stale: Outputs,
                      scales: dict | None = None) -> dict[str, dict[str, tuple[float, int, int]]]:
    """The one-row faults an optimiser would choose (issue 42, item 6): per output and per fault
    (zeroed, stale: the row computed from other inputs), every row tried, the smallest per-row
    margin (the row's error over its allowance, tools.correctness.row_ratios; <= 1 passes), how
    many rows pass that fault and how many rows there are. The catalogue above draws its rows at
    random; this says where the per-row rule cannot see one wrong row at all. `good`: the
    reference as written (its own margins are the rounding's)."""
    from tools.correctness import row_ratios

    out: dict[str, dict[str, tuple[float, int, int]]] = {}
    for name, e in expected.items():
        spec = task.tolerance.rows.get(name)
        if spec is None:
            continue
        e = e.float()
        s = e.abs() if not scales or name not in scales else torch.maximum(e.abs(), scales[name].float())
        out[name] = {}
        for fault, got in (("zeroed_row", torch.zeros_like(e)), ("stale_row", stale[name].float()),
                           ("as_written", good[name].float())):
            r = row_ratios((got - e).abs(), s, spec, (scales or {}).get(name)).reshape(-1)
            out[name][fault] = (float(r.min()) if fault != "as_written" else float(r.max()),
                                int((r <= 1).sum()), r.numel())
    return out


# ---------------------------------------------------------------------------------------------
# Running the catalogue through the evaluator's own judge

class Verdicts:
    """Each variant's verdict and, per output, its error as a share of the bound ("margin": the
    largest of the elementwise, per-row and aggregate ratios; > 1 fails)."""

    def __init__(self, task: Task, workload: str):
        self.task, self.workload = task, workload
        self.rows: list[tuple[str, str, bool, dict[str, float], str]] = []  # (kind, variant, passed, margins, why)
        self.sparse: dict[str, dict[str, tuple[float, int, int]]] = {}  # sparse_resolution, where the catalogue ran

    def add(self, kind: str, variant: str, passed: bool, margins: dict[str, float], why: str) -> None:
        self.rows.append((kind, variant, passed, margins, why))

    def honest_failed(self) -> list[str]:
        return [f"{k} {v}: {why}" for k, v, p, _, why in self.rows
                if k in ("honest", "honest_sampled", "library") and not p]

    def wrong_passed(self) -> list[str]:
        return [f"{k} {v} (margins {_fmt(m)})" for k, v, p, m, _ in self.rows if k.startswith("wrong") and p]

    def worst_honest(self) -> dict[str, tuple[float, str]]:
        """Per output, the largest margin of any honest variant (and which)."""
        worst: dict[str, tuple[float, str]] = {}
        for k, v, _, margins, _ in self.rows:
            if k in ("honest", "library"):
                for out, m in margins.items():
                    if m > worst.get(out, (-1.0, ""))[0]:
                        worst[out] = (m, v)
        return worst


def _fmt(margins: dict[str, float]) -> str:
    return ", ".join(f"{o} {m:.3g}" for o, m in margins.items())


def elementwise_tolerance(tol, name: str, s: torch.Tensor, scale: torch.Tensor | None = None):
    """(atol, rtol) of the judge's elementwise rule for output `name` (tools.correctness.compare):
    the task's, or where each element is a row (LSE) that row's own bound (a tensor where the row
    tolerance has a `spread`). Kept the same as the judge's by test_judge_power.py: a margin above
    1 exactly where a verdict failed."""
    from tools.correctness import element_atol

    row_tol = (getattr(tol, "rows", None) or {}).get(name)
    if row_tol is not None and row_tol.row == "element":
        return element_atol(row_tol, s, scale), row_tol.rtol
    return tol.atol, tol.rtol


def margins_of(task: Task, mismatches, got: Outputs, expected: Outputs, scales: dict | None) -> dict[str, float]:
    tol, out = task.tolerance, {}
    for m in mismatches:
        n = m.output
        s = expected[n].abs() if not scales or n not in scales else torch.maximum(expected[n].abs(), scales[n])
        atol, rtol = elementwise_tolerance(tol, n, s, (scales or {}).get(n))  # the judge's own rule (LSE: per element)
        elementwise = float(((got[n].float() - expected[n]).abs() / (atol + rtol * s)).max())
        aggregate = (m.rel_l2 or 0.0) / m.rel_l2_bound if m.rel_l2_bound else 0.0
        out[n] = max(elementwise, aggregate, m.row_ratio or 0.0)
    return out


class Judge:
    """The evaluator's judge for one workload: a Workspace (tools/workspace.py) holding the inputs,
    outputs written into its guarded output tensors, then `Workspace.verdict` with the reference
    and term scales exactly as the worker computes them."""

    def __init__(self, task: Task, x: dict, device: str):
        from types import SimpleNamespace

        from tasks.reference import run_reference
        from tools.workspace import Workspace, term_scales

        specs = {**task.inputs, **task.outputs}
        plan = SimpleNamespace(tensors={n: (specs[n].dtype, tuple(x[n].shape) if n in x else None) for n in specs},
                               buffers=[])
        self.expected = run_reference(task, x)
        for n in task.outputs:
            plan.tensors[n] = (task.outputs[n].dtype, tuple(self.expected[n].shape))
        self.task, self.x, self.device = task, x, device
        self.ws = Workspace(task, plan, device)
        self.ws.load_inputs(x)
        self.scales = term_scales(task, x)
        # "inputs unchanged" is judged against the inputs as generated (the worker regenerates them from the seed)
        self.inputs_arg = {"inputs": x} if "inputs" in inspect.signature(Workspace.verdict).parameters else {}

    def verdict(self, outputs: Outputs, samples=None) -> tuple[bool, str, dict[str, float]]:
        for n, t in self.ws.outputs.items():
            t.copy_(outputs[n].to(t.dtype))
        reason, detail, mismatches = self.ws.verdict(None if samples else self.expected, self.task.tolerance,
                                                     self.scales, samples=samples, **self.inputs_arg)
        if samples or not mismatches:
            return reason is None, f"{reason}: {detail}", {}
        written = {n: t.float() for n, t in self.ws.outputs.items()}
        return reason is None, f"{reason}: {detail}", margins_of(self.task, mismatches, written, self.expected,
                                                                  self.scales)

    def values(self, outputs: Outputs) -> tuple[bool, str, dict[str, float]]:
        """Only the values rule of `Workspace.verdict` (the same `compare` per output), for outputs
        whose every element was written and finite: what a corrupted row or element can fail."""
        from tools.correctness import compare

        got = as_written(self.task, outputs)
        mismatches = [compare(n, got[n], self.expected[n], self.task.tolerance, (self.scales or {}).get(n))
                      for n in self.task.outputs]
        bad = [m.describe() for m in mismatches if not m.passed]
        return not bad, "; ".join(bad), margins_of(self.task, mismatches, got, self.expected, self.scales)

    def sampled(self, gen: torch.Generator, rows: int):
        from tasks.sampled import has_sampler, sample

        return sample(self.task, self.x, gen, rows) if has_sampler(self.task) else None


def run_catalogue(task: Task, axes: dict[str, int], device: str, seed: int = 1, workload: str = "",
                  library_hook: Callable[[Task, "Judge", Verdicts], None] | None = None, wrong: bool = True,
                  sampled_rows: int | None = None, computed: bool = True) -> Verdicts:
    """The library backends (library_hook), every honest variant and, with `wrong`, every wrong
    variant of the catalogue for one workload, judged whole; where the task has a sampler, the
    honest ones are judged on sampled rows too (as every timed run is: no false alarm there
    either). Without `wrong` only the least precise honest variants run (LEAST_PRECISE); without
    `computed` the wrong variants are the row and element faults alone (cheap on every workload)."""
    from tasks.generators import generate_inputs

    x = generate_inputs(task, axes, seed=seed, device=device)
    judge = Judge(task, x, device)
    result = Verdicts(task, workload)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    from tasks.sampled import rows_for

    samples = judge.sampled(torch.Generator(device=device).manual_seed(seed), sampled_rows or rows_for(task))

    def judged(kind: str, name: str, make: Callable[[], Outputs], on_samples: bool) -> None:
        out = as_written(task, make())
        passed, why, margins = judge.verdict(out)
        result.add(kind, name, passed, margins, why)
        if on_samples and samples is not None:
            ok, why, _ = judge.verdict(out, samples)
            result.add(kind + "_sampled", name, ok, {}, why)
        del out

    if library_hook is not None:
        library_hook(task, judge, result)
    for name, make in honest_variants(task, x).items():
        if (wrong and computed) or name in LEAST_PRECISE.get(task.op_type, (name,)):
            judged("honest", name, make, True)
    if wrong:
        # (sampled rows need not see a fault of a few rows)
        for name, make in computed_faults(task, x).items() if computed else ():
            judged("wrong", name, make, False)
        good = as_written(task, judge.expected)
        stale = as_written(task, run_reference_of(task, axes, seed + 1, device))
        for name, out in corrupted(task, good, stale, gen):
            passed, why, margins = judge.values(out)
            result.add("wrong", name, passed, margins, why)
        result.sparse = sparse_resolution(task, judge.expected, good, stale, judge.scales)
    return result


def run_reference_of(task: Task, axes: dict[str, int], seed: int, device: str) -> Outputs:
    from tasks.generators import generate_inputs
    from tasks.reference import run_reference

    return run_reference(task, generate_inputs(task, axes, seed=seed, device=device))


# ---------------------------------------------------------------------------------------------
# Whole tasks: the library on every workload, honest variants, the catalogue (GPU test)

def library_verdicts(task: Task, judge: Judge, verdicts: Verdicts) -> None:
    """Every library backend the evaluator may time (tasks.families.baselines.list_backends), made as the
    worker makes it (make_baseline on the workspace's own input tensors), run once and judged by
    the values rule a candidate's outputs face (`compare` per output). A backend that cannot be
    made here is noted, not judged."""
    from tasks.families.baselines import BaselineUnavailable, list_backends, make_baseline

    for backend in list_backends(task):
        judge.ws.load_inputs(judge.x)  # a library may update an input in place (a state): each starts afresh
        try:
            base = make_baseline(task, judge.ws.inputs, backend)
            base.prepare()
            got = base.run()
            if judge.device != "cpu":
                torch.cuda.synchronize()
        except BaselineUnavailable as exc:
            verdicts.add("unavailable", f"library:{backend}", True, {}, str(exc)[:200])
            continue
        except Exception as exc:  # noqa: BLE001 - the worker refuses such a backend too (never timed)
            verdicts.add("unavailable", f"library:{backend}", True, {}, f"{type(exc).__name__}: {str(exc)[:200]}")
            continue
        out, missing = {}, []
        for n, ref in judge.expected.items():
            t = got.get(n)
            if t is None:  # e.g. a public SDPA forward without LSE: judged on what it returns
                missing.append(n)
                t = ref
            out[n] = t.reshape(ref.shape) if t.numel() == ref.numel() else t
        # the values rule only: the library's inputs-unchanged, poison and guards are not the question here
        passed, why, margins = judge.values(out)
        note = f"{base.detail}" + (f"; returns no {', '.join(missing)}" if missing else "")
        # A backend that derives some inputs itself (autograd's backward recomputes O and LSE) answers
        # a slightly different question: reported with its margins, never counted as failing.
        kind = "library" if getattr(base, "inputs_as_given", True) else "library_own_inputs"
        # A backend that says it computes below the task's precision (Baseline.below_task: cuDNN's FP8
        # attention writes O in e4m3 on Hopper) is a timing reference: its verdict is recorded apart,
        # never counted as an honest pass or failure; the GPU test checks what it claims.
        if getattr(base, "below_task", ""):
            kind, note = "library_below_task", f"{note}; below the task's precision: {base.below_task}"
        verdicts.add(kind, f"library:{backend}", passed, margins, (why + "; " + note) if not passed else note)
    judge.ws.load_inputs(judge.x)


def judge_task(task: Task, device: str, workloads: list[tuple[str, dict[str, int]]],
               catalogue_at: str | Collection[str], library: bool = True, seed: int = 7) -> list[Verdicts]:
    """For each workload: the library backends and every honest variant; at `catalogue_at` (a
    workload name, or several) also every wrong variant (the whole catalogue)."""
    at = {catalogue_at} if isinstance(catalogue_at, str) else set(catalogue_at)
    out = []
    for name, axes in workloads:
        full = name in at
        v = run_catalogue(task, axes, device, seed=seed, workload=name, wrong=full,
                          library_hook=library_verdicts if library else None)
        out.append(v)
        if device != "cpu":
            torch.cuda.empty_cache()
    return out


def sparse_table(results: list[Verdicts]) -> str:
    """One line per task, workload and output where the catalogue ran: for a zeroed and a stale row
    chosen among all rows, the smallest margin and how many rows pass it (issue 42, item 6); and
    the reference as written, the largest margin (rounding alone)."""
    lines = [f"{'task':38s} {'workload':12s} {'output':10s} zeroed: least margin, rows passing | stale: same | as written"]
    for v in results:
        for out, f in v.sparse.items():
            z, st, w = f["zeroed_row"], f["stale_row"], f["as_written"]
            lines.append(f"{v.task.name:38s} {v.workload:12s} {out:10s} {z[0]:8.3g} {z[1]:>6d}/{z[2]:<8d} | "
                         f"{st[0]:8.3g} {st[1]:>6d}/{st[2]:<8d} | {w[0]:.3g}")
    return "\n".join(lines)


def margins_table(results: list[Verdicts]) -> str:
    """One line per task and output: the worst honest margin (which variant, which workload), the
    library's worst margin, and the smallest margin by which a wrong variant failed."""
    lines = [f"{'task':38s} {'output':10s} {'honest worst (variant @ workload)':54s} {'library worst':24s} "
             f"{'wrong: least fail':30s}"]
    by_task: dict[str, list[Verdicts]] = {}
    for v in results:
        by_task.setdefault(v.task.name, []).append(v)
    for name, vs in by_task.items():
        for out in vs[0].task.outputs:
            honest, lib, wrong = (0.0, "-"), (0.0, "-"), (math.inf, "-")
            for v in vs:
                for kind, variant, passed, margins, _ in v.rows:
                    m = margins.get(out)
                    if m is None:
                        continue
                    if kind == "honest" and m > honest[0]:
                        honest = (m, f"{variant} @ {v.workload}")
                    if kind == "library" and m > lib[0]:
                        lib = (m, f"{variant.split(':', 1)[1]} @ {v.workload}")
                    # the weakest catch by this output: its own corruptions, and computed faults it fails
                    own = variant.split(":")[0] == out or (variant.split(":")[0] in _COMPUTED and m > 1)
                    if kind == "wrong" and own and m < wrong[0]:
                        wrong = (m, variant)
            lines.append(f"{name:38s} {out:10s} {honest[0]:6.3f} {honest[1]:47s} {lib[0]:6.3f} {lib[1]:17s} "
                         f"{wrong[0]:7.3g} {wrong[1]}")
    return "\n".join(lines)


_COMPUTED = ("ignored_input", "wrong_scale", "low_precision", "mask", "wrong_order", "skipped")
