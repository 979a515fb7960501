"""FP8 GEMM, NT layout, DeepSeek-V3 / DeepGEMM "1D2D" block scaling (PTXBench's fp8 GEMM family).

The definition matches PTXBench's `fp8_gemm_nt_1d2d_n4096_k7168`
(zhang677/PTXBench, packages/mini-ptx-agent/fib_runtime/multiturn/fp8-gemm-nt-problems/
scripts/prepare_fp8_gemm_nt_1d2d.py): the same name, axes (`m` var; `n`, `k`, `num_nblock`,
`num_kblock` const), tensor names, dtypes, shapes and row-major layouts:

    A    [m, k]                     float8_e4m3fn  K-major
    SF_A [m, num_kblock]            float32        one scale per (row of A, 128-wide K block)
    B    [n, k]                     float8_e4m3fn  K-major
    SF_B [num_nblock, num_kblock]   float32        one scale per 128x128 block of B
    D    [m, n]                     bfloat16       D[i,j] = sum_kb SF_A[i,kb] SF_B[j/128,kb] sum_{k in kb} A[i,k] B[j,k]

Two deliberate differences, both about how it is judged, not what is computed: op_type is
"fp8_gemm" (PTXBench says "gemm"; here op_type selects the term scales and the sampled
reference, and those of a bf16 GEMM would read the wrong tensors), and the reference is fp32
math on the dequantised inputs instead of a call into DeepGEMM (which is not installed here,
and a reference must be exact, not another kernel). PTXBench times M=4096 only; the held-out
M values here add a large one, one that is not a multiple of 128 (or 64, or 16) and one
smaller than a tile.

Inputs (generate_block_scaled_inputs): the stress values of DESIGN.md, times a magnitude of
2^U(-3, 3) per scale block, quantised as DeepGEMM's per_token_cast_to_fp8 /
per_block_cast_to_fp8 do: scale = amax(block) / 448, X = x / scale in e4m3. So every block
uses the whole e4m3 range (its largest element is +-448; small ones land in e4m3's subnormals),
and scales differ by up to ~64x from block to block: a kernel that applies a neighbouring
block's scale, or one scale per row, is wrong by far more than the tolerance.

Tolerance: the seed paper's 1e-2, against max(|ref|, rss) (rss: root-sum-square of the
dequantised products summed into the element, tasks.reference.term_scales), and a relative L2
bound of 5e-3 on D. Why: the inputs are exact in fp32 and so is every product (e4m3 x e4m3
has 8 significant bits), so the only errors of a correct kernel are its accumulation and the
bf16 rounding of D (2^-9 relative, ~1.1e-3 in relative L2). Hopper's fp8 wgmma adds its
products into a reduced-precision accumulator (DeepSeek-V3 reports about 14 bits, hence
DeepGEMM's promotion to fp32 every 128 K, which the per-K-block scales force here anyway);
that error scales with the magnitude of the terms, not with |D|, so where D cancels far below
rss a correct tensor-core kernel could exceed 1e-2 * |ref|: at full size D is ~N(0, 730^2)
with a median rss of ~660, and 8% of its elements have |D| < rss / 10 (0.1% have |D| < 1,
where atol alone would be the bound). Emulated on CPU (tests/test_fp8_gemm.py), a correct
kernel (fp32 or 10-13-bit block sums, D rounded to bf16) stays at 0.39-0.41 of the elementwise
bound and 1.6e-3 relative L2 (the bf16 rounding of D); kernels with misapplied scales (the
neighbouring N block's, SF_B transposed, K block 0's scale of A everywhere) exceed it
1500-4300x, one K block left out 160x (at k=1024). To be calibrated on the H200:
tests/gpu/test_fp8_gemm_gpu.py prints both figures for cuBLASLt, Triton and the simple solution.
"""
from __future__ import annotations

import math

from tasks.families.gemm import REQUESTED_FEATURES
from tasks.schema import Axis, RowTolerance, Task, TensorSpec, Tolerance, Workload

SCALE_BLOCK = 128  # DeepGEMM's gran_k (the only granularity it supports on SM90), also the N block of B
E4M3_MAX = 448.0  # largest finite float8_e4m3fn
MAGNITUDE_LOG2 = 3.0  # each scale block's values are multiplied by 2^U(-3, 3)
VISIBLE_M = 4096  # PTXBench's M list
HELD_OUT_M = (8192, 1024, 3000, 70)  # 3000: not a multiple of 128/64/16; 70: smaller than one tile

FP8_GEMM_REFERENCE = '''\
import torch

BLOCK = 128  # scale granularity: along K for A and B, and along N for B


@torch.no_grad()
def run(A, SF_A, B, SF_B):
    """D = (A * SF_A) @ (B * SF_B)^T, each scale expanded over its block:
    A[i, k] is scaled by SF_A[i, k // 128] and B[j, k] by SF_B[j // 128, k // 128].
    fp32 math from the e4m3 inputs; the result stays fp32 (the harness compares in fp32)."""
    M, K = A.shape
    N = B.shape[0]
    a = A.float() * SF_A.repeat_interleave(BLOCK, dim=1)[:, :K]
    b = B.float() * SF_B.repeat_interleave(BLOCK, dim=0)[:N].repeat_interleave(BLOCK, dim=1)[:, :K]
    return {"D": a @ b.T}
'''


def fp8_gemm_task(n: int = 4096, k: int = 7168) -> Task:
    if n % SCALE_BLOCK or k % SCALE_BLOCK:
        raise ValueError(f"n and k must be multiples of {SCALE_BLOCK} (as in DeepGEMM), got n={n}, k={k}")
    return Task(
        name=f"fp8_gemm_nt_1d2d_n{n}_k{k}",
        description=(f"FP8 GEMM with DeepSeek-V3 block scaling (DeepGEMM's 1D2D recipe): D = (A*SF_A) @ (B*SF_B)^T "
                     f"with A [m,k] and B [n,k] in float8_e4m3fn (both K-major), one fp32 scale per (row of A, "
                     f"128-wide K block) and one per 128x128 block of B, fp32 accumulation and a bf16 output. "
                     f"n={n} and k={k} are fixed, m (the number of tokens) varies."),
        op_type="fp8_gemm",
        axes={
            "m": Axis(type="var", description="rows of A and D (tokens)"),
            "n": Axis(type="const", value=n, description="rows of B, columns of D"),
            "k": Axis(type="const", value=k, description="reduction dimension"),
            "num_nblock": Axis(type="const", value=n // SCALE_BLOCK, description="n / 128: scale blocks along n"),
            "num_kblock": Axis(type="const", value=k // SCALE_BLOCK, description="k / 128: scale blocks along k"),
        },
        inputs={
            "A": TensorSpec(shape=["m", "k"], dtype="float8_e4m3fn", description="row-major, k contiguous"),
            "SF_A": TensorSpec(shape=["m", "num_kblock"], dtype="float32",
                               description="scale of A[i, 128*kb : 128*kb+128] at [i, kb]; row-major (kb contiguous)"),
            "B": TensorSpec(shape=["n", "k"], dtype="float8_e4m3fn",
                            description="row-major, k contiguous (so D = A·Bᵀ reads both operands K-major)"),
            "SF_B": TensorSpec(shape=["num_nblock", "num_kblock"], dtype="float32",
                               description="scale of the 128x128 block B[128*nb :, 128*kb :] at [nb, kb]; row-major"),
        },
        outputs={"D": TensorSpec(shape=["m", "n"], dtype="bfloat16", description="row-major, n contiguous")},
        reference=FP8_GEMM_REFERENCE,
        workloads=[Workload(name=f"M{VISIBLE_M}", axes={"m": VISIBLE_M}, split="visible")] + [
            Workload(name=f"M{m}", axes={"m": m}, split="held_out") for m in HELD_OUT_M],
        tolerance=Tolerance(rtol=1e-2, atol=1e-2, scale="terms", rel_l2={"D": 5e-3},  # see the module docstring
                            rows={"D": RowTolerance(rtol=1e-2, floor=0.3)}),  # honest ~1.6e-3 per row
        flops="2*m*n*k",
        requested_features=REQUESTED_FEATURES,
        baseline="fp8_block_gemm",
        generator="fp8_block_scaled",
        tags=["seed", "fp8"],  # a row of the seed artifact (PTXBench)
    )


# ----------------------------------------------------------------------------------------
# Inputs and dequantisation (torch imported where used: the registry imports this module)

def _scale_name(name: str) -> str:
    return f"SF_{name}"


def scale_blocks(shape: tuple[int, ...], scale_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Block extent per dim: 1 where the scale has the tensor's size there, else SCALE_BLOCK."""
    if len(shape) != len(scale_shape):
        raise ValueError(f"scale rank {len(scale_shape)} differs from the tensor's {len(shape)}")
    blocks = tuple(1 if s == n else SCALE_BLOCK for n, s in zip(shape, scale_shape))
    for n, s, b in zip(shape, scale_shape, blocks):
        if s != math.ceil(n / b):
            raise ValueError(f"scale shape {scale_shape} does not tile {shape} in blocks of 1 or {SCALE_BLOCK}")
    return blocks


def expand_scales(scale, blocks: tuple[int, ...], shape: tuple[int, ...]):
    """The scale of every element: each scale repeated over its block, cut to `shape`."""
    for dim, b in enumerate(blocks):
        if b > 1:
            scale = scale.repeat_interleave(b, dim=dim)
    return scale[tuple(slice(0, n) for n in shape)]


def dequantize(x, scale):
    """x.float() times the scale of its block (fp32)."""
    blocks = scale_blocks(tuple(x.shape), tuple(scale.shape))
    return x.float() * expand_scales(scale.float(), blocks, tuple(x.shape))


def _block_amax(x, blocks: tuple[int, ...]):
    import torch.nn.functional as F

    pad = []
    for n, b in zip(reversed(x.shape), reversed(blocks)):
        pad += [0, (-n) % b]
    xp = F.pad(x, pad)  # zeros never raise an amax of |x|
    split = [d for n, b in zip(xp.shape, blocks) for d in (n // b, b)]
    return xp.reshape(split).amax(dim=tuple(range(1, 2 * len(blocks), 2)))


def generate_block_scaled_inputs(task: Task, axes: dict[str, int], gen, device) -> dict:
    """Every float8_e4m3fn input X and its float32 scale input SF_X (module docstring): stress
    values times 2^U(-3, 3) per block, quantised with scale = amax(block) / 448."""
    import torch

    from tasks.stress import stress

    out: dict[str, torch.Tensor] = {}
    for name, spec in task.inputs.items():
        if spec.dtype != "float8_e4m3fn":
            continue
        sf_name = _scale_name(name)
        if sf_name not in task.inputs:
            raise ValueError(f"task {task.name}: fp8 input {name!r} has no scale input {sf_name!r}")
        shape, sf_shape = task.shape(name, axes), task.shape(sf_name, axes)
        blocks = scale_blocks(shape, sf_shape)
        x = stress(shape, gen, device)
        u = torch.rand(sf_shape, generator=gen, device=device, dtype=torch.float32)
        magnitude = torch.exp2((u * 2 - 1) * MAGNITUDE_LOG2)
        x *= expand_scales(magnitude, blocks, shape)
        sf = _block_amax(x.abs(), blocks).clamp_min_(1e-4) / E4M3_MAX
        q = (x / expand_scales(sf, blocks, shape)).clamp_(-E4M3_MAX, E4M3_MAX)
        out[name], out[sf_name] = q.to(torch.float8_e4m3fn).contiguous(), sf.float().contiguous()
    missing = [n for n in task.inputs if n not in out]
    if missing:
        raise ValueError(f"task {task.name}: the fp8_block_scaled generator makes e4m3 inputs and their SF_ scales "
                         f"only; {', '.join(missing)} would need another generator")
    return out
