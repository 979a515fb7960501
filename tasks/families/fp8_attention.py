"""FP8 (e4m3) attention forward with LSE: PTXBench's `fp8_mha_with_lse_d{64,96,128,256}[_causal]`.

The definition follows PTXBench's (zhang677/PTXBench, packages/mini-ptx-agent/fib_runtime/
multiturn/fp8-mha-with-lse-problems, prepared by its prepare_fp8_mha.py) name for name:

- axes B=4, H=48, D fixed, L (sequence length, queries and keys alike) varies, and a const axis
  `one`=1 that shapes the scale factors;
- inputs Q, K, V: float8_e4m3fn [B, H, L, D], row-major (D contiguous), each quantised with ONE
  per-tensor scale; descale_q, descale_k, descale_v: float32 [1, 1, 1, 1], so that the real
  value of Q is Q.float() * descale_q (likewise K, V). Not per head;
- S = Q @ K^T * descale_q * descale_k * sm_scale with sm_scale = 1/sqrt(D); O = softmax(S) @ V
  * descale_v; LSE = logsumexp of each query row of S, natural log, fp32 [B, H, L];
- causal is top-left aligned (query i attends to keys j <= i).

One deliberate difference: O is bfloat16 here, where PTXBench writes O as e4m3 with cuDNN's
output scale pinned to 1.0. Attention outputs are averages (median |O| about 0.04 on these
inputs), so an unscaled e4m3 O sits largely in e4m3's subnormal range and its own rounding
(2^-4 relative, 2^-10 absolute below 2^-6) is larger than any error a kernel makes: a judge
of such an O cannot tell a careful kernel from a sloppy one. A bf16 O (as the issue asks)
keeps the output's rounding (2^-9) below the kernel's own error.

Inputs (tasks.generators, "stress_fp8_per_tensor", as PTXBench makes them): the stress
distribution N(0,1) + N(0,100)*Bernoulli(1e-3) in bf16, then per tensor amax -> scale =
448/amax, X = (x * scale) cast to e4m3, descale = amax/448 (about 0.06-0.1: the outliers set
amax, so ordinary values use e4m3's normal range and outliers its top).

What the layout implies for Hopper (knowledge/docs/sm_90a/fp8_attention.md): wgmma with e4m3
operands reads both A and B K-major from shared memory (the transpose bits exist only for 16-bit
types). Q @ K^T is natural: Q rows and K rows are both D-contiguous (K-major for a reduction
over D). P @ V reduces over keys, but V is stored key-major with D contiguous, the wrong way:
V must be transposed (in shared memory after the TMA load, or into a scratch copy [B*H, D, L']
by a first kernel, with L' rounded up so that TMA's 16-byte stride rule holds) before it can be
the B operand. P must become e4m3 too, and P in [0, 1] unscaled falls into e4m3's subnormals:
scale it (exp2 of s - max + 8, i.e. P * 256, undone in the final division) as FlashAttention-3
does.

Tolerance (emulated on CPU with tests' inputs, 1x8x2048x128, causal and not, float64 truth;
tests/test_fp8_attention.py keeps the emulation): a FlashAttention-3-style kernel (exact fp8
products accumulated in fp32, online softmax over 128-key blocks, P*256 rounded to e4m3 for
the P @ V wgmma, O rounded to bf16) needs rtol 0.03-0.057 on max(|ref|, rss) with atol 1e-2,
and has relative L2 error 0.006-0.012 on O and 4e-8 on LSE. With P in bf16 instead: 0.003 and
0.0018. So: rtol 0.1, atol 1e-2 against max(|ref|, rss) (scale="terms", rss as for mha_fwd,
over the dequantised values), rel_l2 0.025 on O (twice the worst emulated correct kernel) and
3e-3 on LSE (cuDNN's FP8 attention measures 1.0e-4-1.2e-4 on the H200, 2026-11-30, about what a
row sum of the e4m3 P gives: tests/judge_power.py; a wrong normaliser, e.g. a missing descale, is off
by 1e-2 or more), plus per-row bounds (ROWS_O, ROWS_LSE below). Emulated wrong kernels fail: V's descale
left out (rel_l2 9.5), the causal mask one key off (666x the bound), the last 16 keys dropped
(2.2x elementwise, rel_l2 0.056), and P rounded to e4m3 without the 256 scale (1.2x: the
tolerance asks for the scaling, as the knowledge doc explains).
"""
from __future__ import annotations

from tasks.families.gemm import REQUESTED_FEATURES
from tasks.schema import Axis, RowTolerance, Task, TensorSpec, Tolerance, Workload

BATCH, HEADS = 4, 48
SEED_HEAD_DIM = 128
VISIBLE_L = 4096
HELD_OUT_L = (1024, 3000, 8192, 77)  # as the bf16 attention tasks: small, ragged, large, below one tile
VARIANT_HELD_OUT_L = (1024, 3000)
E4M3_MAX = 448.0
RTOL = 0.1
# O's aggregate bound: twice the worst emulated correct kernel (module docstring). cuDNN's FP8 attention fails
# it on Hopper (0.026-0.029) because it writes O in e4m3, below the task's bf16 (e4m3 rounding of the exact
# O alone: 0.022-0.0265): the library is labelled below the task (tasks/families/baselines.py, below_task) and
# kept as the timing reference; the bound is not loosened for it.
REL_L2_O = 0.025
# cuDNN's FP8 attention measures 1.0e-4-1.2e-4 on the H200 (2026-11-30); a row sum of the e4m3 P (below)
# emulates at 1.9e-4 (L=4096) to 1.3e-3 (L=77): 3e-3. The per-row LSE bound is the tighter rule.
REL_L2_LSE = 3e-3
# Per row (docs/METHODOLOGY.md, "The judge's power"): each query row of O within 0.07 of its own
# scale (P * 256 in e4m3: <= 0.031 emulated at L=4096); each row's LSE within 0.12 nats. A kernel may
# sum the row's normaliser from the e4m3 P it multiplies V with (consistent with its O; this matches
# cuDNN's measured LSE error): each p then errs by up to 2^-4. Measured at full size on the H200
# (2026-12-01, tests/gpu/test_judge_power_gpu.py): that emulation's worst row 0.079 nats (L=77,
# causal d128), cuDNN's FP8 attention 0.098 nats (L=4096); 0.05 failed both. The wrong variants
# nearest the bound (an LSE from the last 16 keys ignored, 0.075 nats) fail on O at >= 3x its bound.
ROWS_O = RowTolerance(rtol=0.07, floor=0.3)
# Each row's LSE is also held to its own rounding (issue 42, item 6): min(0.12, 0.005 + 0.25 c_r) nats,
# c_r = sqrt(sum_j p_j^2) over the row's softmax (schema.RowTolerance.spread). The e4m3 row-sum emulation
# errs by at most 0.087 c_r on the CPU (L=640; 0.060 c_r at L=77 causal; its per-p rounding is
# within 2^-4, about 0.03 c_r per standard deviation), so 0.25 leaves ~1.5x over the tail of a
# million rows; a row's LSE from other inputs (a "plausible" value) passed 0.12 flat on 665 of
# 1,280 rows at L=640 and passes this on about 126 (those within a row's own rounding).
ROWS_LSE = RowTolerance(atol=0.12, row="element", spread=0.25, spread_atol=0.005)

_REFERENCE = '''\
import torch

CAUSAL = {causal}  # when True, query i attends to keys j <= i (top-left aligned)


@torch.no_grad()
def run(Q, K, V, descale_q, descale_k, descale_v, sm_scale):
    """Dequantise (X.float() * descale_x, one scale per tensor), then attention in fp32:
    O = softmax(sm_scale * q @ k^T) @ v and LSE = natural-log logsumexp of each row's scaled
    (masked) scores. Results stay fp32 (the harness compares in fp32); a few heads at a time
    so that the L x L scores fit in memory."""
    B, H, L, D = Q.shape
    dq, dk, dv = (d.float().reshape(()) for d in (descale_q, descale_k, descale_v))
    q8, k8, v8 = (t.reshape(B * H, L, D) for t in (Q, K, V))
    O = torch.empty(B * H, L, D, dtype=torch.float32, device=Q.device)
    LSE = torch.empty(B * H, L, dtype=torch.float32, device=Q.device)
    keep = torch.ones(L, L, dtype=torch.bool, device=Q.device).tril() if CAUSAL else None
    step = max(1, 2**28 // (L * L))  # heads per chunk: at most 1 GiB of fp32 scores
    for h in range(0, B * H, step):
        c = slice(h, h + step)
        q, k, v = q8[c].float() * dq, k8[c].float() * dk, v8[c].float() * dv
        scores = torch.matmul(q, k.transpose(1, 2)) * sm_scale
        if CAUSAL:
            scores.masked_fill_(~keep, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        O[c] = torch.matmul(torch.exp(scores - lse[..., None]), v)
        LSE[c] = lse
    return {{"O": O.reshape(B, H, L, D), "LSE": LSE.reshape(B, H, L)}}
'''


def _axes(head_dim: int) -> dict[str, Axis]:
    return {
        "B": Axis(type="const", value=BATCH, description="batch size"),
        "H": Axis(type="const", value=HEADS, description="attention heads (queries and keys/values alike)"),
        "L": Axis(type="var", description="sequence length; queries and keys/values share it"),
        "D": Axis(type="const", value=head_dim, description="head dimension"),
        "one": Axis(type="const", value=1, description="size of every dim of a per-tensor scale factor"),
    }


def _fp8(what: str, descale: str) -> TensorSpec:
    return TensorSpec(shape=["B", "H", "L", "D"], dtype="float8_e4m3fn",
                      description=f"{what}, e4m3, row-major (D contiguous); real value = element * {descale}")


def _descale(of: str) -> TensorSpec:
    return TensorSpec(shape=["one", "one", "one", "one"], dtype="float32",
                      description=f"per-tensor descale of {of} (amax/448 of the values {of} was quantised from)")


def _workloads(visible: int, held_out: tuple[int, ...]) -> list[Workload]:
    return [Workload(name=f"L{visible}", axes={"L": visible}, split="visible")] + [
        Workload(name=f"L{s}", axes={"L": s}, split="held_out") for s in held_out]


def fp8_forward_task(head_dim: int = SEED_HEAD_DIM, causal: bool = False) -> Task:
    seed = head_dim == SEED_HEAD_DIM
    mask = "causal (query i attends to keys j <= i)" if causal else "non-causal"
    return Task(
        name=f"fp8_mha_with_lse_d{head_dim}" + ("_causal" if causal else ""),
        description=(f"FP8 (e4m3) multi-head attention forward, {mask}, with per-tensor descales: "
                     "S = (Q @ K^T) * descale_q * descale_k * sm_scale, O = softmax(S) @ V * descale_v in bf16, "
                     f"and the natural-log LSE of each row of S in fp32; B={BATCH}, H={HEADS}, D={head_dim}, L varies. "
                     "PTXBench's fp8_mha_with_lse definition, except that O is bf16 (PTXBench: e4m3 with scale 1)."),
        # How e4m3 operands reach the tensor cores (operand majorness, scaling P) is what the docs teach:
        # the none arm must not get it here (issue 41).
        request_note="The matrix products (Q @ K^T and P @ V) are to run on the requested e4m3 tensor-core "
                     "instructions.",
        op_type="fp8_mha_fwd",
        axes=_axes(head_dim),
        inputs={"Q": _fp8("queries", "descale_q"), "K": _fp8("keys", "descale_k"), "V": _fp8("values", "descale_v"),
                "descale_q": _descale("Q"), "descale_k": _descale("K"), "descale_v": _descale("V")},
        outputs={"O": TensorSpec(shape=["B", "H", "L", "D"], dtype="bfloat16",
                                 description="attention output (dequantised units), row-major (D contiguous)"),
                 "LSE": TensorSpec(shape=["B", "H", "L"], dtype="float32",
                                   description="natural-log logsumexp of the scaled (masked) scores of each query row")},
        reference=_REFERENCE.format(causal=causal),
        workloads=_workloads(VISIBLE_L, HELD_OUT_L if seed else VARIANT_HELD_OUT_L),
        # Calibrated by emulation, see the module docstring: P rounded to e4m3 (scaled) costs a
        # FlashAttention-3-style kernel up to ~0.06 of max(|ref|, rss) on the worst element.
        tolerance=Tolerance(rtol=RTOL, atol=1e-2, scale="terms", rel_l2={"O": REL_L2_O, "LSE": REL_L2_LSE},
                            rows={"O": ROWS_O, "LSE": ROWS_LSE}),
        flops="2*B*H*L*L*D" if causal else "4*B*H*L*L*D",
        scalars={"sm_scale": "1/sqrt(D)"},
        requested_features=REQUESTED_FEATURES,
        baseline="sdpa_fp8_fwd",
        generator="stress_fp8_per_tensor",
        family="" if seed else f"fp8_mha_with_lse_d{SEED_HEAD_DIM}" + ("_causal" if causal else ""),
        tags=(["seed"] if seed else ["held_out_variant"]) + (["causal"] if causal else []) + ["fp8"],
    )
