"""Multi-head attention tasks, forward and backward, non-causal and causal (the seed paper's).

Layout: Q, K, V, O and their gradients are [B, H, S, D] bf16, row-major (D contiguous);
LSE is [B, H, S] fp32, the natural-log logsumexp of the scaled (and masked) scores of each
query row. B=4, H=48 and D are fixed by the definition, S varies: S=4096 is visible, the
held-out S values check a small, a ragged (not a multiple of 128, 64 or 16), a large and a
smaller-than-one-tile sequence. The d64/d96 tasks are held-out head-dimension variants.

Causal means top-left aligned: query i attends to keys j <= i (queries and keys have the
same length S here). The causal tasks at d64/d96/d256 are held-out variants of the causal
seed tasks (PTXBench's mha_with_lse_d*_causal and mha_bwd_d*_causal problems, same B, H, S).

The reference sources below are what a model is shown and what the harness runs. They
compute in fp32 from the (bf16) inputs and process a few heads at a time, because the
S×S scores of all 192 heads at S=8192 would need 51 GB in fp32.
"""
from __future__ import annotations

from tasks.families.gemm import REQUESTED_FEATURES
from tasks.schema import Axis, RowTolerance, Task, TensorSpec, Tolerance, Workload

BATCH, HEADS = 4, 48
SEED_HEAD_DIM = 128
VISIBLE_S = 4096
HELD_OUT_S = (1024, 3000, 8192, 77)  # 3000: not a multiple of 128/64/16; 77: less than one tile
VARIANT_HELD_OUT_S = (1024, 3000)
# ||out - ref|| / ||ref|| at most this (calibrated with scripts/calibrate_tolerance.py on the H200)
REL_L2 = 5e-3
# LSE: 5e-4 (was 1e-4) admits a kernel that sums the row's normaliser from its bf16-rounded P (emulated
# 8e-5 at S=77); the per-row LSE bound below is the tighter rule (cuDNN measures 1.1e-7)
REL_L2_LSE = 5e-4
# Per row (docs/METHODOLOGY.md, "The judge's power"): each query row of O within 1e-2 of its own
# scale (honest kernels <= 3e-3: P in bf16, the row sum from the rounded P), each gradient row
# within 2e-2 (P and dS in bf16: <= 5e-3); each row's LSE within 5e-3 nats, i.e. its softmax
# normaliser within 0.5% (any rounding of P to bf16 moves it by at most 2^-9 = 0.2%).
ROWS_O = RowTolerance(rtol=1e-2, floor=0.3)
ROWS_GRAD = RowTolerance(rtol=2e-2, floor=0.3)
ROWS_LSE = RowTolerance(atol=5e-3, row="element")

_FORWARD_REFERENCE = '''\
import torch

CAUSAL = {causal}  # when True, query i attends to keys j <= i (top-left aligned)


@torch.no_grad()
def run(Q, K, V, sm_scale):
    """O = softmax(sm_scale * Q @ K^T) @ V per (batch, head), and LSE = logsumexp of the
    scaled (masked) scores per query row, natural log. fp32 math from the bf16 inputs;
    results stay fp32 (the harness compares in fp32). A few heads at a time so that the
    S x S scores fit in memory."""
    B, H, S, D = Q.shape
    q, k, v = (t.float().reshape(B * H, S, D) for t in (Q, K, V))
    O = torch.empty(B * H, S, D, dtype=torch.float32, device=Q.device)
    LSE = torch.empty(B * H, S, dtype=torch.float32, device=Q.device)
    keep = torch.ones(S, S, dtype=torch.bool, device=Q.device).tril() if CAUSAL else None
    step = max(1, 2**28 // (S * S))  # heads per chunk: at most 1 GiB of fp32 scores
    for h in range(0, B * H, step):
        scores = torch.matmul(q[h:h + step], k[h:h + step].transpose(1, 2)) * sm_scale
        if CAUSAL:
            scores.masked_fill_(~keep, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        O[h:h + step] = torch.matmul(torch.exp(scores - lse[..., None]), v[h:h + step])
        LSE[h:h + step] = lse
    return {{"O": O.reshape(B, H, S, D), "LSE": LSE.reshape(B, H, S)}}
'''

_BACKWARD_REFERENCE = '''\
import torch

CAUSAL = {causal}  # when True, query i attends to keys j <= i (top-left aligned)


@torch.no_grad()
def run(Q, K, V, O, dO, LSE, sm_scale):
    """Gradients of O = softmax(sm_scale * Q @ K^T) @ V for the upstream gradient dO, given
    the forward's O and LSE (natural log):
        P = exp(sm_scale * Q @ K^T - LSE)      (0 where masked)
        dV = P^T @ dO;   dP = dO @ V^T;   Delta = rowsum(dO * O)
        dS = P * (dP - Delta);   dQ = sm_scale * dS @ K;   dK = sm_scale * dS^T @ Q
    Delta uses the given (bf16) O: where one key dominates a row, dP - Delta nearly cancels,
    and an O recomputed in higher precision would give a visibly different dS there.
    fp32 math from the bf16 inputs; results stay fp32 (the harness compares in fp32).
    A few heads at a time so that the S x S matrices fit in memory."""
    B, H, S, D = Q.shape
    q, k, v, o, do = (t.float().reshape(B * H, S, D) for t in (Q, K, V, O, dO))
    lse = LSE.float().reshape(B * H, S, 1)
    dQ, dK, dV = (torch.empty(B * H, S, D, dtype=torch.float32, device=Q.device) for _ in range(3))
    keep = torch.ones(S, S, dtype=torch.bool, device=Q.device).tril() if CAUSAL else None
    step = max(1, 2**28 // (S * S))  # heads per chunk: at most 1 GiB per S x S matrix
    for h in range(0, B * H, step):
        c = slice(h, h + step)
        p = torch.exp(torch.matmul(q[c], k[c].transpose(1, 2)) * sm_scale - lse[c])
        if CAUSAL:
            p.masked_fill_(~keep, 0.0)
        dV[c] = torch.matmul(p.transpose(1, 2), do[c])
        delta = (do[c] * o[c]).sum(dim=-1, keepdim=True)
        ds = torch.matmul(do[c], v[c].transpose(1, 2)).sub_(delta).mul_(p)  # dS = P * (dP - Delta)
        dQ[c] = torch.matmul(ds, k[c]) * sm_scale
        dK[c] = torch.matmul(ds.transpose(1, 2), q[c]) * sm_scale
    return {{"dQ": dQ.reshape(B, H, S, D), "dK": dK.reshape(B, H, S, D), "dV": dV.reshape(B, H, S, D)}}
'''


def _axes(head_dim: int) -> dict[str, Axis]:
    return {
        "B": Axis(type="const", value=BATCH, description="batch size"),
        "H": Axis(type="const", value=HEADS, description="attention heads (queries and keys/values alike)"),
        "S": Axis(type="var", description="sequence length (queries and keys alike)"),
        "D": Axis(type="const", value=head_dim, description="head dimension"),
    }


def _bhsd(what: str) -> TensorSpec:
    return TensorSpec(shape=["B", "H", "S", "D"], dtype="bfloat16", description=f"{what}, row-major (D contiguous)")


def _lse_spec() -> TensorSpec:
    return TensorSpec(shape=["B", "H", "S"], dtype="float32",
                      description="natural-log logsumexp of the scaled (masked) scores of each query row")


def _workloads(visible: int, held_out: tuple[int, ...]) -> list[Workload]:
    return [Workload(name=f"S{visible}", axes={"S": visible}, split="visible")] + [
        Workload(name=f"S{s}", axes={"S": s}, split="held_out") for s in held_out]


def _suffix(head_dim: int, causal: bool) -> str:
    return f"d{head_dim}" + ("_causal" if causal else "")


def forward_task(head_dim: int = SEED_HEAD_DIM, causal: bool = False) -> Task:
    seed = head_dim == SEED_HEAD_DIM
    mask = "causal (query i attends to keys j <= i)" if causal else "non-causal"
    return Task(
        name=f"mha_fwd_{_suffix(head_dim, causal)}",
        description=(f"Multi-head attention forward, {mask}: O = softmax(sm_scale * Q @ K^T) @ V and the "
                     f"natural-log LSE of each query row's scaled scores; B={BATCH}, H={HEADS}, D={head_dim}, "
                     "S varies."),
        op_type="mha_fwd",
        axes=_axes(head_dim),
        inputs={"Q": _bhsd("queries"), "K": _bhsd("keys"), "V": _bhsd("values")},
        outputs={"O": _bhsd("attention output"), "LSE": _lse_spec()},
        reference=_FORWARD_REFERENCE.format(causal=causal),
        workloads=_workloads(VISIBLE_S, HELD_OUT_S if seed else VARIANT_HELD_OUT_S),
        # The seed paper's 1e-2, against max(|ref|, rss) for the reason given at backward_task: a
        # FlashAttention-style kernel rounds P to bf16 before P @ V, an error of ~2^-9 * rss, which
        # exceeds 1e-2 * |O| only where an element of O cancels (outlier values of opposite sign).
        # LSE has no such terms: it is judged against |ref|. Aggregate bounds (calibrated on the H200,
        # docs/METHODOLOGY.md): every shipped kernel and cuDNN stay under 1.6e-3 on O and 1.1e-7 on
        # LSE; a bias, noise or zeroed elements that pass 1e-2 elementwise land at 0.009-0.05.
        tolerance=Tolerance(rtol=1e-2, atol=1e-2, scale="terms", rel_l2={"O": REL_L2, "LSE": REL_L2_LSE},
                            rows={"O": ROWS_O, "LSE": ROWS_LSE}),
        flops="2*B*H*S*S*D" if causal else "4*B*H*S*S*D",
        scalars={"sm_scale": "1/sqrt(D)"},
        requested_features=REQUESTED_FEATURES,
        baseline="sdpa_fwd",
        generator="stress",
        family="" if seed else f"mha_fwd_{_suffix(SEED_HEAD_DIM, causal)}",
        tags=(["seed"] if seed else ["held_out_variant"]) + (["causal"] if causal else []),
    )


def backward_task(head_dim: int = SEED_HEAD_DIM, causal: bool = False) -> Task:
    seed = head_dim == SEED_HEAD_DIM
    mask = "causal (query i attends to keys j <= i)" if causal else "non-causal"
    forward = f"mha_fwd_{_suffix(head_dim, causal)}"
    return Task(
        name=f"mha_bwd_{_suffix(head_dim, causal)}",
        description=(f"Multi-head attention backward, {mask}: given Q, K, V, the forward's O and LSE and the "
                     f"upstream gradient dO, compute dQ, dK, dV; B={BATCH}, H={HEADS}, D={head_dim}, S varies."),
        op_type="mha_bwd",
        axes=_axes(head_dim),
        inputs={"Q": _bhsd("queries"), "K": _bhsd("keys"), "V": _bhsd("values"),
                "O": _bhsd(f"the forward output ({forward}) for these Q, K, V"),
                "dO": _bhsd("upstream gradient of O"),
                "LSE": _lse_spec()},
        outputs={"dQ": _bhsd("gradient of Q"), "dK": _bhsd("gradient of K"), "dV": _bhsd("gradient of V")},
        reference=_BACKWARD_REFERENCE.format(causal=causal),
        workloads=_workloads(VISIBLE_S, HELD_OUT_S if seed else VARIANT_HELD_OUT_S),
        # The seed paper's 1e-2, measured against max(|ref|, rss) instead of |ref| (scale="terms";
        # rss = root-sum-square of the products summed into the element, tasks.reference.term_scales).
        # Why: FlashAttention-style kernels round P and dS to bf16 before the tensor-core products,
        # an error of ~2^-9 * rss per element. On the stress inputs (std-10 outliers) many gradient
        # elements cancel to far below rss, and there a correct kernel of that kind exceeds
        # 1e-2 + 1e-2 * |ref| (emulated on CPU: max ratio 1.1-1.5 at only 4M elements per output,
        # growing with size), while against rss it stays near 0.6. Kernels that are really wrong still
        # fail by 8-150x: dS in fp8, 16 keys dropped, Delta off by 2% (tests/test_tasks.py).
        # The reference itself is fp32 from the very same bf16 inputs (O and LSE included), never
        # rounded, so the only error measured is the kernel's. Aggregate bound as for the forward:
        # correct kernels and cuDNN 1.7e-3-2.4e-3, wrong variants 0.007-0.11 (docs/METHODOLOGY.md).
        tolerance=Tolerance(rtol=1e-2, atol=1e-2, scale="terms", rel_l2={n: REL_L2 for n in ("dQ", "dK", "dV")},
                            rows={n: ROWS_GRAD for n in ("dQ", "dK", "dV")}),
        flops="5*B*H*S*S*D" if causal else "10*B*H*S*S*D",  # 2.5x the forward
        scalars={"sm_scale": "1/sqrt(D)"},
        requested_features=REQUESTED_FEATURES,
        baseline="sdpa_bwd",
        # Q, K, V, dO drawn from the stress distribution; O and LSE are the forward task's
        # reference outputs for those Q, K, V (O rounded to bf16 as a real forward would write it).
        generator=f"stress_with_forward:{forward}",
        family="" if seed else f"mha_bwd_{_suffix(SEED_HEAD_DIM, causal)}",
        tags=(["seed"] if seed else ["held_out_variant"]) + (["causal"] if causal else []),
    )
