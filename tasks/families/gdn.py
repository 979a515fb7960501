"""Gated DeltaNet (GDN) tasks: one decode step and chunked prefill, k-last state.

Matched definitions: FlashInfer-Bench's (flashinfer-trace `definitions/gdn/`), as PTXBench
imports them (zhang677/PTXBench, packages/mini-ptx-agent/fib_runtime/multiturn/gdn-problems):
`gdn_decode_qk4_v8_d128_k_last`, `gdn_prefill_qk4_v8_d128_k_last` and the qk8_v16 pair. Names,
axes, dtypes, layouts and outputs are theirs: q/k/v bf16, the recurrent state fp32 in k-last
layout [.., num_v_heads, V, K] (K contiguous), the raw gate inputs (A_log, a, dt_bias, b), the
scalar `scale` (1/sqrt(head_size)), and two outputs: `output` (bf16) and the final state
`new_state` (fp32, same layout). The definitions mark `state` optional; here it is always given.

The recurrence, per value head h (query/key head h // (num_v_heads // num_q_heads), as the
definitions' repeat_interleave does) and per token t, with S the [V, K] state:

    g    = exp(-exp(A_log[h]) * softplus(a[t, h] + dt_bias[h]))     decay in (0, 1]
    beta = sigmoid(b[t, h])                                          write strength in (0, 1)
    S    = g * S                                                     decay first
    S    = S + beta * (v_t - S k_t) k_t^T                            delta rule (rank-1 update)
    o_t  = scale * S q_t                                             read with the updated state

This equals the definitions' `old_state - k^T old_v + k^T new_v` form with
new_v = beta * v + (1 - beta) * old_v. q and k are taken as given (the definitions do not
normalise them; the model l2-normalises them before this op, and so does our generator).

MTP (multi-token prediction, speculative verification: `gdn_mtp_qk{4,8}_v{8,16}_d128_k_last`, as
FlashInfer-Bench defines them) runs seq_len = 4 draft tokens of each sequence through the same
recurrence, starting from a state gathered out of a pool: sequence n starts from
initial_state[initial_state_indices[n]] ([pool_size, value head, V, K], k-last). Its output is every
token's o. The definition's second output, `final_state`, is `initial_state.clone()`: a verification
step does not commit its state (the draft may be rejected), so the pool comes back unchanged. Here that
output is left out and the pool is an input the harness checks unchanged: asking for it would time a
25-50 MB copy of a pool of which a batch reads only its own slots (one deliberate difference, as
fp8_attention's bf16 O). Without the state write-back, the rank-1 updates fold into T x T corrections
(S_t q_t is a combination of S_0 q_t and S_0 k_j, j <= t), so the matrix work is S_0 times the 2T
columns [k_1..k_T, q_1..q_T]: 4 * K * V FLOPs per token and head, the count used; the artifact asks for
tensor cores there (wgmma / tcgen05, e.g. tf32 on the fp32 state) and TMA for the state.

Prefill packs sequences: tokens [total_seq_len, ...], sequence n spans
cu_seqlens[n] .. cu_seqlens[n+1] and starts from state[n]. Its outputs are every token's o and
each sequence's final state.

Requested instructions. Decode is one token: per (batch, value head) it reads a 64 KB fp32
state, does three matrix-vector products and writes 64 KB back, so it is memory-bound and has no
matrix-matrix product for a tensor core; what is architecture-specific is how the state moves:
`tma` (bulk tensor copies of state tiles into shared memory, completing on an mbarrier), and
on the checker's terms TMA must carry at least half of the input bytes (the state is ~99% of
them). Prefill runs the chunked form (chunks of 64 tokens: the WY representation of the
chunk's rank-1 updates, then chunk-level products S K^T, Q S, Q K^T, K^T U), which is
matrix-matrix work: `wgmma` for those products and `tma` for the q/k/v chunks on sm_90a;
`tcgen05_mma`, `tmem` and `tma` on sm_100a.

FLOPs counted: 6 * K * V per token and value head (S k, the rank-1 update, S q: the
recurrence's own arithmetic; gates and the decay are lower order). A chunked kernel does more
(the intra-chunk triangular work), so its wgmma FLOPs exceed this count when it carries the work.

Tolerance (both outputs judged with the seed paper's elementwise |out-ref| <= 1e-2 + 1e-2|ref|,
plus a relative-L2 bound per output, which is what has teeth here: o ~ scale * |S q| is only
~0.01-0.05 and state elements ~0.2-1). Decode needs no reduced precision anywhere (matrix-vector
products in fp32, the state stays fp32): a correct kernel errs only by the bf16 rounding of
`output` (rel-L2 ~1.1e-3) and fp32 summation order on `new_state` (~1e-7): bounds 5e-3 and
1e-4. Decaying after the update instead of before gives rel-L2 1.1e-2 (output) and 1.3e-2
(new_state) at batch 16 (CPU, tests/test_gdn.py). Prefill with tensor cores rounds chunk
operands to bf16 (the state fed to the MMA, the WY intermediates W and U, the masked Q K^T): a
float64 emulation of such a chunked kernel (64-token chunks, 600 tokens) errs by rel-L2
2.7e-3-2.8e-3 on output and 1.8e-3-2.3e-3 on the state (max abs 1.2e-3 and 2.4e-3, under
atol), while decaying after the update errs by 0.09-0.5 and 0.15-0.8: bounds 1e-2 for both.
On the H200 (2026-11-30, tests/gpu/test_gdn_gpu.py) fla's chunked kernel errs by rel-L2
1.7e-3-2.9e-3 on output and 0.5e-3-2.1e-3 on new_state, but its worst state element over an
8192-token batch is off by 0.0266 (one element of 7.5 million, |expected| 0.035): the seed's
elementwise atol of 1e-2 would fail the library itself, so prefill's atol is 5e-2 and the
relative-L2 bound (3.5x fla's worst) does the judging.

Baseline: flash-linear-attention (`fla-core`): fused_recurrent_gated_delta_rule for decode,
and for prefill the faster of chunk_gated_delta_rule and the fused recurrent kernel; both
called with the gate, sigmoid and the k-last layout fused in (tasks/families/baselines.py).
"""
from __future__ import annotations

import math

import torch

from tasks.schema import Axis, RowTolerance, Task, TensorSpec, Tolerance, Workload

HEAD_SIZE = 128
CHUNK = 64  # the chunk length of the chunked algorithm (FlashInfer's and fla's prefill kernels)
VARIANTS = ((4, 8), (8, 16))  # (num_q_heads = num_k_heads, num_v_heads): Qwen3-Next at TP=4 and TP=2
DECODE_FEATURES = {"sm_90a": ["tma"], "sm_100a": ["tma"]}
PREFILL_FEATURES = {"sm_90a": ["wgmma", "tma"], "sm_100a": ["tcgen05_mma", "tmem", "tma"]}
FLOPS_PER_TOKEN_HEAD = "6*head_size*head_size"
# Per-row bounds (docs/METHODOLOGY.md, "The judge's power"): a row is one token's output for one value
# head, or one row S[v, :] of a state. Many output rows are smaller than the elementwise atol (o ~ 0.01-0.05),
# so only a bound against each row's own scale sees one of them zeroed or a few elements wrong. Honest
# emulations (CPU, tests/judge_power.py): decode/MTP output 2e-3 (bf16 rounding), decode state ~0 (fp32);
# prefill with bf16 tensor-core operands and an fp32 state 6.8e-3-7.4e-3 (output) and 3.9e-3-4.4e-3 (state)
# on T959_N4 and T3271_N2, where a state kept in bf16 per token errs by 1.6e-2-1.8e-2 (fails by 1.3-1.8x).
ROWS_OUTPUT = RowTolerance(rtol=1e-2, floor=0.3)
ROWS_DECODE_STATE = RowTolerance(rtol=2e-3, floor=0.3)
# Prefill rows have no floor (issue 42, item 6): with a floor of 0.3 of a typical row, a row whose gate and beta
# wiped the state to below 0.36% of a typical row's norm could be zeroed and pass (H200: one zeroed output row on
# 2 of 3 qk8 workloads, one wrong state row on qk4). Output rows are held to the norm of max(|o|, rss), the rss of
# the products scale * S_t[v,k] q_t[k] (tasks.reference.term_scales): a small row has small terms, and so small
# rounding; state rows to their own norm. Honest (CPU, T401_N4 qk8): output 0.45, state 0.35 of the bound, as
# with the floor; a zeroed output row fails by 4.7x or more, a zeroed or stale state row by 80x.
# Output rows stay at 1.2e-2 (2026-12-04): judged as candidates are, against the term scales, fla's chunked kernel
# (the library) errs by at most 0.72 of it on every prefill workload at full size (H200). A test that judged fla
# against |o| alone saw 1.03x (T8192_N51) and 2.75x (T3271_N2) and had it loosened to 2e-2 for a day:
# docs/METHODOLOGY.md, "Output rows: judged against the term scales, 1.2e-2".
ROWS_PREFILL_OUTPUT = RowTolerance(rtol=1.2e-2, floor=0.0)
ROWS_PREFILL_STATE = RowTolerance(rtol=1.2e-2, floor=0.0)

# Decode batch sizes: PTXBench's six (1, 4, 8, 16, 32, 64) plus one that is no power of two.
DECODE_VISIBLE = (64, 8)  # the first visible workload is the one tools profile: the larger
DECODE_HELD_OUT = (1, 4, 16, 32, 100)
# Prefill (total_seq_len, num_seqs): PTXBench's six token/sequence counts (its 8192-token row
# packs 57 sequences for qk4_v8, 51 for qk8_v16), plus 1000 tokens in 3 sequences held out.
# Every length is cut at random (fixed per workload) so chunks end mid-sequence.
PREFILL_VISIBLE = ((8192, None), (959, 4))
PREFILL_HELD_OUT = ((6, 1), (32, 2), (401, 4), (3271, 2), (1000, 3))
PREFILL_MAX_SEQS = {(4, 8): 57, (8, 16): 51}
# MTP (batch_size, pool_size): PTXBench's batch sizes (1, 4, 8, 16, 32, 48; pool 49 in all of them),
# plus a batch that is no power of two drawn from a larger pool, held out.
MTP_SEQ_LEN = 4
MTP_VISIBLE = ((48, 49), (8, 49))
MTP_HELD_OUT = ((1, 49), (4, 49), (16, 49), (32, 49), (37, 200))
MTP_FEATURES = PREFILL_FEATURES  # PTXBench's: TMA and tensor-core MMA (see the module docstring)
MTP_FLOPS_PER_TOKEN_HEAD = "4*head_size*head_size"  # S_0 k_t and S_0 q_t: no state write-back

_GATE_TEXT = ("g = exp(-exp(A_log) * softplus(a + dt_bias)) (softplus(x) = log(1 + e^x), x for x > 20), "
              "beta = sigmoid(b)")

DECODE_REFERENCE = '''\
import torch
import torch.nn.functional as F


@torch.no_grad()
def run(q, k, v, state, A_log, a, dt_bias, b, scale):
    """One Gated DeltaNet decode step per (batch, value head), fp32 math from the bf16 inputs.
    state / new_state are k-last: [batch, value head, V, K], K contiguous.
    Value head h reads query/key head h // (num_v_heads // num_q_heads)."""
    B, _, HQ, K = q.shape
    HV = v.shape[2]
    qh = q[:, 0].float().repeat_interleave(HV // HQ, dim=1)  # [B, HV, K]
    kh = k[:, 0].float().repeat_interleave(HV // HQ, dim=1)  # [B, HV, K]
    vh = v[:, 0].float()                                      # [B, HV, V]
    g = torch.exp(-torch.exp(A_log.float()) * F.softplus(a[:, 0].float() + dt_bias.float()))  # [B, HV]
    beta = torch.sigmoid(b[:, 0].float())                                                   # [B, HV]

    S = state.float() * g[:, :, None, None]                   # decay first
    old = torch.einsum("bhvk,bhk->bhv", S, kh)                # what the state recalls for k: S k
    delta = beta[:, :, None] * (vh - old)                     # delta rule: move S k toward v
    S = S + delta[:, :, :, None] * kh[:, :, None, :]          # rank-1 update: S += delta k^T
    out = scale * torch.einsum("bhvk,bhk->bhv", S, qh)        # read with the updated state
    return {"output": out[:, None], "new_state": S}
'''

PREFILL_REFERENCE = '''\
import torch
import torch.nn.functional as F


@torch.no_grad()
def run(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale):
    """Gated DeltaNet over packed sequences, token by token (the plain recurrence). Sequence n is tokens cu_seqlens[n] .. cu_seqlens[n+1]
    and starts from state[n]; state / new_state are k-last: [seq, value head, V, K], K contiguous.
    Value head h reads query/key head h // (num_v_heads // num_q_heads). fp32 math from the bf16
    inputs; all sequences step together (step i handles token i of every sequence that long)."""
    T, HQ, K = q.shape
    HV = v.shape[1]
    qh = q.float().repeat_interleave(HV // HQ, dim=1)         # [T, HV, K]
    kh = k.float().repeat_interleave(HV // HQ, dim=1)         # [T, HV, K]
    vh = v.float()                                            # [T, HV, V]
    g = torch.exp(-torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float()))  # [T, HV]
    beta = torch.sigmoid(b.float())                                                   # [T, HV]

    bounds = [int(x) for x in cu_seqlens.tolist()]
    starts, ends = bounds[:-1], bounds[1:]
    S = state.float().clone()                                 # [N, HV, V, K]
    out = torch.zeros(T, HV, v.shape[2], dtype=torch.float32, device=q.device)
    live = None
    for i in range(max([e - s for s, e in zip(starts, ends)], default=0)):
        now = [m for m in range(len(starts)) if starts[m] + i < ends[m]]  # sequences with a token i
        if now != live:  # (index tensors rebuilt only when a sequence has ended)
            live = now
            n = torch.tensor(live, device=q.device)
            t = torch.tensor([starts[m] + i for m in live], device=q.device)  # token i of each of them
        Sn = S[n] * g[t][:, :, None, None]                    # decay first
        old = torch.einsum("nhvk,nhk->nhv", Sn, kh[t])        # S k
        delta = beta[t][:, :, None] * (vh[t] - old)           # delta rule
        Sn = Sn + delta[:, :, :, None] * kh[t][:, :, None, :] # S += delta k^T
        out[t] = scale * torch.einsum("nhvk,nhk->nhv", Sn, qh[t])
        S[n] = Sn
        t = t + 1
    return {"output": out, "new_state": S}
'''


MTP_REFERENCE = '''\
import torch
import torch.nn.functional as F


@torch.no_grad()
def run(q, k, v, initial_state, initial_state_indices, A_log, a, dt_bias, b, scale):
    """seq_len tokens of each sequence through the Gated DeltaNet recurrence (speculative
    verification): sequence n starts from initial_state[initial_state_indices[n]], a k-last
    [value head, V, K] slot of the pool, and every token's output is read with the state updated
    by that token. The pool itself is not updated (the state is never committed). Value head h
    reads query/key head h // (num_v_heads // num_q_heads). fp32 math from the bf16 inputs."""
    B, T, HQ, K = q.shape
    HV = v.shape[2]
    qh = q.float().repeat_interleave(HV // HQ, dim=2)        # [B, T, HV, K]
    kh = k.float().repeat_interleave(HV // HQ, dim=2)        # [B, T, HV, K]
    vh = v.float()                                           # [B, T, HV, V]
    g = torch.exp(-torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float()))  # [B, T, HV]
    beta = torch.sigmoid(b.float())                                                   # [B, T, HV]

    S = initial_state[initial_state_indices.long()].float()  # [B, HV, V, K]: a copy, the pool stays
    out = torch.empty(B, T, HV, v.shape[3], dtype=torch.float32, device=q.device)
    for t in range(T):
        S = S * g[:, t, :, None, None]                            # decay first
        old = torch.einsum("bhvk,bhk->bhv", S, kh[:, t])          # S k
        delta = beta[:, t, :, None] * (vh[:, t] - old)            # delta rule
        S = S + delta[:, :, :, None] * kh[:, t, :, None, :]       # S += delta k^T
        out[:, t] = scale * torch.einsum("bhvk,bhk->bhv", S, qh[:, t])
    return {"output": out}
'''


def _head_axes(hq: int, hv: int) -> dict[str, Axis]:
    return {
        "num_q_heads": Axis(type="const", value=hq, description="query heads"),
        "num_k_heads": Axis(type="const", value=hq, description="key heads (= query heads)"),
        "num_v_heads": Axis(type="const", value=hv, description="value heads: state, gates and outputs are per value "
                                                                "head; value head h uses query/key head "
                                                                f"h // {hv // hq}"),
        "head_size": Axis(type="const", value=HEAD_SIZE, description="K = V = head size"),
    }


def _gate_inputs(tokens: list[str]) -> dict[str, TensorSpec]:
    return {
        "A_log": TensorSpec(shape=["num_v_heads"], dtype="float32", description="log decay rate per value head"),
        "a": TensorSpec(shape=[*tokens, "num_v_heads"], dtype="bfloat16",
                        description="decay input: g = exp(-exp(A_log) * softplus(a + dt_bias))"),
        "dt_bias": TensorSpec(shape=["num_v_heads"], dtype="float32", description="added to a before softplus"),
        "b": TensorSpec(shape=[*tokens, "num_v_heads"], dtype="bfloat16", description="update-gate input: beta = sigmoid(b)"),
    }


def _state(rows: str, what: str) -> TensorSpec:
    return TensorSpec(shape=[rows, "num_v_heads", "head_size", "head_size"], dtype="float32",
                      description=f"{what}, k-last: [{rows}, value head, V, K] (K contiguous): S[v, k]")


def _name(stage: str, hq: int, hv: int) -> str:
    return f"gdn_{stage}_qk{hq}_v{hv}_d{HEAD_SIZE}_k_last"


def gdn_decode_task(hq: int = 4, hv: int = 8) -> Task:
    seed = (hq, hv) == VARIANTS[0]
    return Task(
        name=_name("decode", hq, hv),
        description=(f"Gated DeltaNet decode (one token per sequence) with {hq} query/key heads and {hv} value heads, "
                     f"head size {HEAD_SIZE}, fp32 recurrent state in k-last layout [batch, value head, V, K]. "
                     "Per (sequence, value head): decay the state by g, apply the delta rule with the token's k, v "
                     "and beta, then read it with q; return the token's output and the updated state. "
                     f"{_GATE_TEXT}. The op is memory-bound (64 KB of fp32 state read and written per head, three "
                     "matrix-vector products). Besides the elementwise rule, the relative L2 error must stay within 5e-3 on output and 1e-4 on "
                     "new_state (keep the state and its arithmetic in fp32). The batch size varies. Matches "
                     "FlashInfer-Bench's definition of the same name."),
        op_type="gdn_decode",
        axes={"batch_size": Axis(type="var", description="sequences decoded together"),
              "seq_len": Axis(type="const", value=1, description="one token per sequence"),
              **_head_axes(hq, hv)},
        inputs={
            "q": TensorSpec(shape=["batch_size", "seq_len", "num_q_heads", "head_size"], dtype="bfloat16",
                            description="queries (l2-normalised by the model)"),
            "k": TensorSpec(shape=["batch_size", "seq_len", "num_k_heads", "head_size"], dtype="bfloat16",
                            description="keys (l2-normalised by the model)"),
            "v": TensorSpec(shape=["batch_size", "seq_len", "num_v_heads", "head_size"], dtype="bfloat16",
                            description="values"),
            "state": _state("batch_size", "recurrent state before this token"),
            **_gate_inputs(["batch_size", "seq_len"]),
        },
        outputs={
            "output": TensorSpec(shape=["batch_size", "seq_len", "num_v_heads", "head_size"], dtype="bfloat16",
                                 description="scale * S q with the updated state"),
            "new_state": _state("batch_size", "state after this token"),
        },
        reference=DECODE_REFERENCE,
        workloads=[Workload(name=f"B{n}", axes={"batch_size": n}, split="visible") for n in DECODE_VISIBLE]
        + [Workload(name=f"B{n}", axes={"batch_size": n}, split="held_out") for n in DECODE_HELD_OUT],
        tolerance=Tolerance(rtol=1e-2, atol=1e-2, rel_l2={"output": 5e-3, "new_state": 1e-4},
                            rows={"output": ROWS_OUTPUT, "new_state": ROWS_DECODE_STATE}),
        flops=f"batch_size*num_v_heads*{FLOPS_PER_TOKEN_HEAD}",
        scalars={"scale": "1/sqrt(head_size)"},
        requested_features=DECODE_FEATURES,
        request_note="The requested instruction is to bring in the state (TMA loads).",
        baseline="fla_gdn",
        generator="gdn",
        tags=["gdn", "decode", "k_last"] + ([] if seed else ["head_variant"]),
    )


def gdn_prefill_task(hq: int = 4, hv: int = 8) -> Task:
    seed = (hq, hv) == VARIANTS[0]
    workloads = []
    for split, sizes in (("visible", PREFILL_VISIBLE), ("held_out", PREFILL_HELD_OUT)):
        for total, seqs in sizes:
            seqs = seqs or PREFILL_MAX_SEQS[(hq, hv)]
            workloads.append(Workload(name=f"T{total}_N{seqs}", split=split,
                                      axes={"total_seq_len": total, "num_seqs": seqs, "len_cu_seqlens": seqs + 1}))
    return Task(
        name=_name("prefill", hq, hv),
        description=(f"Gated DeltaNet prefill over packed variable-length sequences with {hq} query/key heads and "
                     f"{hv} value heads, head size {HEAD_SIZE}, fp32 recurrent state in k-last layout "
                     "[sequence, value head, V, K]. Sequence n is tokens cu_seqlens[n] .. cu_seqlens[n+1] and starts "
                     "from state[n]; per token and value head: decay the state by g, apply the delta rule with the "
                     "token's k, v and beta, then read it with q. Return every token's output and each sequence's "
                     f"final state. {_GATE_TEXT}. Sequence lengths are arbitrary. Besides the elementwise rule, the "
                     "relative L2 error must stay within 1e-2 on output and on new_state (elementwise atol is 5e-2, "
                     "set for tensor-core arithmetic on the state). Matches FlashInfer-Bench's definition of the same "
                     "name."),
        request_note="The requested instructions are to carry the products of the state with the tokens "
                     "(tensor-core MMA) and the loads of the tokens (TMA).",
        op_type="gdn_prefill",
        axes={"total_seq_len": Axis(type="var", description="tokens of all sequences together"),
              "num_seqs": Axis(type="var", description="packed sequences"),
              **_head_axes(hq, hv),
              "len_cu_seqlens": Axis(type="var", description="num_seqs + 1")},
        inputs={
            "q": TensorSpec(shape=["total_seq_len", "num_q_heads", "head_size"], dtype="bfloat16",
                            description="queries (l2-normalised by the model)"),
            "k": TensorSpec(shape=["total_seq_len", "num_k_heads", "head_size"], dtype="bfloat16",
                            description="keys (l2-normalised by the model)"),
            "v": TensorSpec(shape=["total_seq_len", "num_v_heads", "head_size"], dtype="bfloat16", description="values"),
            "state": _state("num_seqs", "initial state of each sequence"),
            **_gate_inputs(["total_seq_len"]),
            "cu_seqlens": TensorSpec(shape=["len_cu_seqlens"], dtype="int64",
                                     description="sequence boundaries: 0 = cu_seqlens[0] < ... < cu_seqlens[num_seqs] "
                                                 "= total_seq_len"),
        },
        outputs={
            "output": TensorSpec(shape=["total_seq_len", "num_v_heads", "head_size"], dtype="bfloat16",
                                 description="scale * S q per token, with the state updated by that token"),
            "new_state": _state("num_seqs", "final state of each sequence"),
        },
        reference=PREFILL_REFERENCE,
        workloads=workloads,
        tolerance=Tolerance(rtol=1e-2, atol=5e-2, scale="terms", rel_l2={"output": 1e-2, "new_state": 1e-2},
                            rows={"output": ROWS_PREFILL_OUTPUT, "new_state": ROWS_PREFILL_STATE}),
        flops=f"total_seq_len*num_v_heads*{FLOPS_PER_TOKEN_HEAD}",
        scalars={"scale": "1/sqrt(head_size)"},
        requested_features=PREFILL_FEATURES,
        baseline="fla_gdn",
        generator="gdn",
        tags=["gdn", "prefill", "k_last"] + ([] if seed else ["head_variant"]),
    )


def gdn_mtp_task(hq: int = 4, hv: int = 8) -> Task:
    seed = (hq, hv) == VARIANTS[0]
    tokens = ["batch_size", "seq_len"]
    workloads = [Workload(name=f"B{n}_P{pool}", axes={"batch_size": n, "pool_size": pool}, split=split)
                 for split, sizes in (("visible", MTP_VISIBLE), ("held_out", MTP_HELD_OUT)) for n, pool in sizes]
    return Task(
        name=_name("mtp", hq, hv),
        description=(f"Gated DeltaNet multi-token prediction (speculative verification) with {hq} query/key heads and "
                     f"{hv} value heads, head size {HEAD_SIZE}: seq_len={MTP_SEQ_LEN} draft tokens per sequence, "
                     "starting from a state gathered out of a pool: sequence n starts from "
                     "initial_state[initial_state_indices[n]] (fp32, k-last [pool slot, value head, V, K]). Per token "
                     "and value head: decay the state by g, apply the delta rule with the token's k, v and beta, then "
                     f"read it with q; return every token's output. {_GATE_TEXT}. The pool is not updated (a "
                     "verification step does not commit its state; the harness checks that initial_state is "
                     "unchanged). Besides the elementwise rule, the relative L2 error of output must stay "
                     "within 5e-3. The batch size and the pool size vary. FlashInfer-Bench's definition of the same "
                     "name, without its final_state output (a copy of the unchanged pool)."),
        op_type="gdn_mtp",
        axes={"batch_size": Axis(type="var", description="sequences verified together"),
              "seq_len": Axis(type="const", value=MTP_SEQ_LEN, description="draft tokens per sequence"),
              **_head_axes(hq, hv),
              "pool_size": Axis(type="var", description="state slots in the pool (at least batch_size)")},
        inputs={
            "q": TensorSpec(shape=[*tokens, "num_q_heads", "head_size"], dtype="bfloat16",
                            description="queries (l2-normalised by the model)"),
            "k": TensorSpec(shape=[*tokens, "num_k_heads", "head_size"], dtype="bfloat16",
                            description="keys (l2-normalised by the model)"),
            "v": TensorSpec(shape=[*tokens, "num_v_heads", "head_size"], dtype="bfloat16", description="values"),
            "initial_state": TensorSpec(
                shape=["pool_size", "num_v_heads", "head_size", "head_size"], dtype="float32", rows_read="batch_size",
                description="the state pool, k-last: [slot, value head, V, K] (K contiguous): S[v, k]; read only"),
            "initial_state_indices": TensorSpec(shape=["batch_size"], dtype="int32",
                                                description="pool slot of each sequence's state (distinct slots)"),
            **_gate_inputs(tokens),
        },
        outputs={"output": TensorSpec(shape=[*tokens, "num_v_heads", "head_size"], dtype="bfloat16",
                                      description="scale * S q per token, with the state updated by that token")},
        reference=MTP_REFERENCE,
        workloads=workloads,
        tolerance=Tolerance(rtol=1e-2, atol=1e-2, rel_l2={"output": 5e-3}, rows={"output": ROWS_OUTPUT}),
        flops=f"batch_size*seq_len*num_v_heads*{MTP_FLOPS_PER_TOKEN_HEAD}",
        scalars={"scale": "1/sqrt(head_size)"},
        requested_features=MTP_FEATURES,
        request_note="The requested instructions are to carry the state's loads (TMA) and its products with the "
                     "tokens' k and q (tensor-core MMA).",
        baseline="fla_gdn",
        generator="gdn",
        tags=["gdn", "mtp", "k_last"] + ([] if seed else ["head_variant"]),
    )


def gdn_tasks() -> list[Task]:
    return [build(hq, hv) for hq, hv in VARIANTS for build in (gdn_decode_task, gdn_prefill_task, gdn_mtp_task)]


# ---------------------------------------------------------------------------------------------
# Inputs: what the model feeds this op.

def cu_seqlens_for(total: int, num_seqs: int) -> torch.Tensor:
    """Sequence boundaries for a workload, int64 on the CPU: num_seqs lengths >= 1 summing to
    total, cut at random points that depend only on (total, num_seqs). Fixed per workload so
    that timed runs compare like with like (the longest sequence sets a sequential kernel's
    time) and a library can prepare its chunk index once; the values in the tokens are fresh."""
    if not 1 <= num_seqs <= total:
        raise ValueError(f"cannot cut {total} tokens into {num_seqs} non-empty sequences")
    gen = torch.Generator().manual_seed(1_000_003 * total + num_seqs)
    cuts = (torch.randperm(total - 1, generator=gen, device="cpu")[:num_seqs - 1] + 1).sort().values
    return torch.cat([torch.zeros(1, dtype=torch.int64, device="cpu"), cuts.to(torch.int64),
                      torch.tensor([total], dtype=torch.int64, device="cpu")])


def generate_gdn_inputs(task: Task, axes: dict[str, int], gen: torch.Generator, device) -> dict[str, torch.Tensor]:
    """GDN inputs as the model produces them (called by tasks.generators for generator "gdn"):
    - q, k: the stress distribution, then l2-normalised per head (as the model does before the
      op; with |k| = 1 and beta < 1 each update is a contraction, so the state neither explodes
      nor vanishes over thousands of tokens).
    - v and state: the stress distribution (N(0,1), rare N(0,100) outliers).
    - A_log = log(U(1, 16)) and dt_bias = softplus^-1(dt), dt log-uniform in [1e-3, 0.1]
      (Mamba2/GDN's initialisation ranges); a, b ~ N(0, 1) without outliers: g is then near 1
      for most tokens (median ~0.97), below 0.3 for a few percent (fast-forgetting heads, the
      odd near-reset), and beta in ~(0.02, 0.98), the range trained models run in. Gate
      outliers would only saturate g to 0 or beta to 0/1, which tests nothing the values do not.
    - cu_seqlens: cu_seqlens_for(total_seq_len, num_seqs).
    - initial_state (MTP's pool): as state; initial_state_indices: batch_size distinct random slots."""
    from tasks.stress import stress

    out: dict[str, torch.Tensor] = {}
    hv = axes["num_v_heads"]
    for name, spec in task.inputs.items():
        shape = task.shape(name, axes)
        if name in ("q", "k"):
            x = stress(shape, gen, device)
            out[name] = (x / x.norm(dim=-1, keepdim=True).clamp_min(1e-6)).to(torch.bfloat16)
        elif name in ("v", "state", "initial_state"):
            out[name] = stress(shape, gen, device).to(torch.float32 if spec.dtype == "float32" else torch.bfloat16)
        elif name == "A_log":
            out[name] = torch.log(1 + 15 * torch.rand(hv, generator=gen, device=device, dtype=torch.float32))
        elif name == "dt_bias":
            u = torch.rand(hv, generator=gen, device=device, dtype=torch.float32)
            dt = torch.exp(math.log(1e-3) + (math.log(0.1) - math.log(1e-3)) * u)
            out[name] = dt + torch.log(-torch.expm1(-dt))  # softplus(dt_bias) = dt
        elif name in ("a", "b"):
            out[name] = torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(torch.bfloat16)
        elif name == "initial_state_indices":  # distinct slots, fresh per draw (as PTXBench draws them)
            perm = torch.randperm(axes["pool_size"], generator=gen, device=device)
            out[name] = perm[:axes["batch_size"]].to(torch.int32)
        elif name == "cu_seqlens":
            out[name] = cu_seqlens_for(axes["total_seq_len"], axes["num_seqs"]).to(device)
        else:
            raise ValueError(f"task {task.name}: the gdn generator does not know input {name!r}")
    return out


# ---------------------------------------------------------------------------------------------
# The judge's prefill reference: PREFILL_REFERENCE's recurrence in 64-token chunks, in float64

JUDGE_CHUNK = 64
_TERMS_ELEMENTS = 1 << 25  # the per-token states one group of (sequence, head) pairs holds at once (256 MiB of fp64)
_LOG_G_MIN = -1e4  # log g where g is 0 in fp32 (a full reset): exp of it is 0 in fp64, differences stay finite


def prefill_chunked(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, *, terms: bool = False):
    """PREFILL_REFERENCE's results (its `run` with the same arguments), computed chunk by chunk.

    The spec steps token by token: ~8 small launches a token, 0.2-1.1 s a judged run at full size on the
    H200 (the longest sequence sets it), and the judge computes it, and the output's term scales by a
    second such loop, on every timed run (prefill has no row sampler). Here every sequence and value
    head steps together through 64-token chunks, in float64, from the same fp32 gates (g and beta as
    the spec computes them). Within a chunk, with Γ_t the product of the chunk's decays up to t and
    R[t, i] = Γ_t / Γ_i (i <= t), the state after token t is
        S_t = Γ_t S_0 + sum_{i<=t} R[t, i] w_i k_i^T,
    where the w_i solve the unit lower-triangular system
        w_t + sum_{i<t} β_t R[t, i] (k_t·k_i) w_i = β_t (v_t - Γ_t S_0 k_t)
    (the delta rule's w_t = β_t (v_t - g_t S_{t-1} k_t), unrolled); o_t = scale S_t q_t. Ratios come from
    differences of cumulative log-decays, never from dividing two products, so a decay that underflows
    (g = 0: a reset) cuts the chunk exactly. Float64 all through: the recurrence in exact arithmetic up to
    ~1e-12, against the spec's own fp32 rounding (~1e-6 relative on these inputs; tests/test_gdn_judge_reference.py
    holds both to an fp64 token-by-token loop). Padding past a sequence's end is g = 1, β = 0, k = q = 0:
    an identity step.

    Returns {"output", "new_state"} (fp32, as the spec's); with `terms`, {"output": the output's term
    scales} instead: |scale| sqrt(sum_k (S_t[v, k] q_t[k])^2) per token and value head (tasks.reference.term_scales)."""
    import torch.nn.functional as F

    T, HQ, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    dev, f64, C = q.device, torch.float64, JUDGE_CHUNK
    g = torch.exp(-torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float()))  # [T, HV], as the spec
    beta = torch.sigmoid(b.float())
    bounds = [int(x) for x in cu_seqlens.tolist()]
    starts, lens = bounds[:-1], [e - s for s, e in zip(bounds[:-1], bounds[1:])]
    N, longest = len(starts), max(lens, default=0)
    out = torch.zeros(T, HV, V, dtype=torch.float32, device=dev)
    S = state.to(f64).reshape(N * HV, V, K).clone()
    if longest <= 0:
        return {"output": out} if terms else {"output": out, "new_state": S.float().reshape(state.shape)}

    Lp = -(-longest // C) * C
    j = torch.arange(Lp, device=dev)
    live = j[None, :] < torch.tensor(lens, device=dev)[:, None]                            # [N, Lp]
    at = torch.where(live, torch.tensor(starts, device=dev)[:, None] + j[None, :], T)      # T: the padding row

    def rows(x: torch.Tensor) -> torch.Tensor:
        """[T, HV, ...] -> [T + 1, HV, ...] float64, a zero row last (padding: k = q = v = 0, log g = 0, β = 0)."""
        return torch.cat([x.to(f64), torch.zeros_like(x[:1], dtype=f64)])

    tokens = {"q": rows(q.repeat_interleave(HV // HQ, dim=1)), "k": rows(k.repeat_interleave(HV // HQ, dim=1)),
              "v": rows(v), "log_g": rows(torch.log(g.double()).clamp_min(_LOG_G_MIN)), "beta": rows(beta)}
    lower = torch.ones(C, C, dtype=torch.bool, device=dev).tril()
    strict = lower.clone().fill_diagonal_(False)
    for c0 in range(0, Lp, C):
        idx, keep = at[:, c0:c0 + C], live[:, c0:c0 + C]                                     # [N, C]
        Qc, Kc, Vc, lg, Bc = (x[idx].transpose(1, 2).reshape(N * HV, C, *x.shape[2:]) for x in tokens.values())
        cum = lg.cumsum(-1)                                                                 # log Γ_t
        gam = cum.exp()
        R = torch.where(lower, cum[:, :, None] - cum[:, None, :], -math.inf).exp()          # Γ_t / Γ_i, i <= t
        A = torch.where(strict, Bc[:, :, None] * R * (Kc @ Kc.mT), 0.0)
        rhs = Bc[:, :, None] * (Vc - gam[:, :, None] * (Kc @ S.mT))                         # S_0 k_t as rows
        W = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True)           # [P, C, V]
        if terms:
            res = _chunk_terms(S, gam, R, W, Kc, Qc, scale)
        else:
            res = scale * (gam[:, :, None] * (Qc @ S.mT) + (R * (Qc @ Kc.mT)) @ W)
        out[idx[keep]] = res.reshape(N, HV, C, V).transpose(1, 2)[keep].float()
        S = gam[:, -1, None, None] * S + (R[:, -1, :, None] * W).mT @ Kc                    # the state after the chunk
    return {"output": out} if terms else {"output": out, "new_state": S.float().reshape(state.shape)}


def _chunk_terms(S, gam, R, W, Kc, Qc, scale) -> torch.Tensor:
    """|scale| sqrt(sum_k (S_t[v, k] q_t[k])^2) for every token t of a chunk: the states S_t materialised,
    a group of (sequence, head) pairs at a time ([P, C, V], float64)."""
    P, C, V = W.shape
    per = max(1, _TERMS_ELEMENTS // (C * V * S.shape[-1]))
    out = torch.empty(P, C, V, dtype=S.dtype, device=S.device)
    for p in range(0, P, per):
        s = slice(p, p + per)
        St = gam[s, :, None, None] * S[s, None] + (R[s, :, :, None] * W[s, None]).mT @ Kc[s, None]  # [p, C, V, K]
        out[s] = abs(scale) * (St.square() @ Qc[s].square()[..., None]).squeeze(-1).sqrt()
    return out
