"""The GEMM task: C = A·Bᵀ in bf16 with fp32 accumulation (the seed paper's GEMM).

N and K are fixed by the definition (a Qwen3-14B qkv projection, as in FlashInfer-Bench's
gemm_n7168_k5120); M varies. The visible workload is M=8192; the held-out ones check other
M values, including one that is not a multiple of any tile (8000) and a tiny one (70).
"""
from __future__ import annotations

from tasks.schema import Axis, Task, TensorSpec, Tolerance, Workload

# Same for every task of the benchmark: the instructions the architecture-specific track asks for.
REQUESTED_FEATURES = {"sm_90a": ["wgmma", "tma"], "sm_100a": ["tcgen05_mma", "tmem", "tma"]}

GEMM_REFERENCE = '''\
import torch


@torch.no_grad()
def run(A, B):
    """C = A @ B.T. The harness compares in fp32: this reference computes in fp32 from the
    bf16 inputs and is not rounded to bf16 (a correct kernel accumulates in fp32 and rounds once)."""
    C = torch.matmul(A.float(), B.float().T)
    return {"C": C}
'''


def gemm_task(n: int = 7168, k: int = 5120) -> Task:
    return Task(
        name=f"gemm_n{n}_k{k}",
        description=(f"General matrix multiply C = A @ B.T with bf16 inputs, fp32 accumulation and a bf16 output; "
                     f"N={n} and K={k} are fixed, M (the number of tokens) varies."),
        op_type="gemm",
        axes={
            "M": Axis(type="var", description="rows of A and C (tokens)"),
            "N": Axis(type="const", value=n, description="rows of B, columns of C"),
            "K": Axis(type="const", value=k, description="reduction dimension"),
        },
        inputs={
            "A": TensorSpec(shape=["M", "K"], dtype="bfloat16", description="row-major, K contiguous"),
            "B": TensorSpec(shape=["N", "K"], dtype="bfloat16",
                            description="row-major, K contiguous (so C = A·Bᵀ reads both operands K-major)"),
        },
        outputs={"C": TensorSpec(shape=["M", "N"], dtype="bfloat16", description="row-major, N contiguous")},
        reference=GEMM_REFERENCE,
        workloads=[
            Workload(name="M8192", axes={"M": 8192}, split="visible"),
            Workload(name="M4096", axes={"M": 4096}, split="held_out"),
            Workload(name="M1024", axes={"M": 1024}, split="held_out"),
            Workload(name="M8000", axes={"M": 8000}, split="held_out"),  # not a multiple of 128 (or 64)
            Workload(name="M70", axes={"M": 70}, split="held_out"),  # smaller than one tile
        ],
        # The seed paper's tolerance. bf16 output rounding is 2^-9 relative; fp32 accumulation in any
        # order over K=5120 stays far below 1e-2 of the result's scale.
        # rel-L2: the SIMT and expert kernels measure 1.7e-3 (bf16 rounding of C) on the H200
        tolerance=Tolerance(rtol=1e-2, atol=1e-2, rel_l2={"C": 5e-3}),
        flops="2*M*N*K",
        requested_features=REQUESTED_FEATURES,
        baseline="cublas",
        generator="stress",
        tags=["seed"],
    )
