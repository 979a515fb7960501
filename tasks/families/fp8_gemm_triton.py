"""A Triton kernel for the block-scaled FP8 GEMM (tasks/families/fp8_gemm.py): the library baseline used
where cuBLASLt's block-scaled `torch._scaled_mm` refuses (tasks/families/baselines.py). GPU only: this
module imports triton, so import it only where a GPU baseline is being made.

Per output tile, K advances one 128-wide scale block at a time: the tensor cores compute that
block's e4m3 partial product in fp32 (tl.dot), which is then multiplied by SF_A of the tile's
rows and SF_B of its columns' 128-block and added to an fp32 accumulator, exactly the order of
PTXBench's pseudo-code (the scales multiplied together first).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

SCALE_BLOCK = 128


@triton.jit
def _fp8_block_scaled_gemm(a_ptr, sa_ptr, b_ptr, sb_ptr, d_ptr, M, N, K, num_kblock,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           GROUP_M: tl.constexpr):
    # Tiles ordered in groups of GROUP_M rows of tiles, so that consecutive programs share B in L2.
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok, col_ok = rows < M, cols < N
    a_tile = a_ptr + rows[:, None].to(tl.int64) * K + ks[None, :]
    b_tile = b_ptr + cols[:, None].to(tl.int64) * K + ks[None, :]
    sa_row = sa_ptr + rows.to(tl.int64) * num_kblock
    sb_col = sb_ptr + (cols // BLOCK_K) * num_kblock  # BLOCK_K == 128: the N block of B's scales too

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, num_kblock):  # K is a multiple of 128: no K mask
        a = tl.load(a_tile, mask=row_ok[:, None], other=0.0)
        b = tl.load(b_tile, mask=col_ok[:, None], other=0.0)
        sa = tl.load(sa_row + kb, mask=row_ok, other=0.0)
        sb = tl.load(sb_col + kb, mask=col_ok, other=0.0)
        partial = tl.dot(a, tl.trans(b))  # fp32 accumulate of the e4m3 products of this 128-wide K block
        acc += partial * (sa[:, None] * sb[None, :])
        a_tile += BLOCK_K
        b_tile += BLOCK_K
    d_tile = d_ptr + rows[:, None].to(tl.int64) * N + cols[None, :]
    tl.store(d_tile, acc.to(tl.bfloat16), mask=row_ok[:, None] & col_ok[None, :])


def fp8_block_scaled_gemm(a: torch.Tensor, sf_a: torch.Tensor, b: torch.Tensor, sf_b: torch.Tensor,
                          d: torch.Tensor) -> torch.Tensor:
    """D = (A * SF_A) @ (B * SF_B)^T into the bf16 `d`, for contiguous A [M, K], SF_A [M, K/128],
    B [N, K], SF_B [N/128, K/128] (K a multiple of 128)."""
    M, K = a.shape
    N = b.shape[0]
    if K % SCALE_BLOCK:
        raise ValueError(f"K must be a multiple of {SCALE_BLOCK}, got {K}")
    block_m = 128 if M > 64 else 64  # a small M wastes less of a 64-row tile
    grid = (triton.cdiv(M, block_m) * triton.cdiv(N, 128),)
    _fp8_block_scaled_gemm[grid](a, sf_a, b, sf_b, d, M, N, K, K // SCALE_BLOCK,
                                 BLOCK_M=block_m, BLOCK_N=128, BLOCK_K=SCALE_BLOCK, GROUP_M=8,
                                 num_warps=8 if block_m == 128 else 4, num_stages=3)
    return d
