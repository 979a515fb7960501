"""Task definitions: the FlashInfer-Bench Definition shape, extended for ptxbench.

A Definition (name, description, op_type, axes const/var, inputs, outputs, reference)
is what the ecosystem speaks. ptxbench adds what a benchmark verdict needs: concrete
workloads (visible or held out), a seeded input generator, tolerance, FLOP and byte
counts, the requested architecture features per arch, and the library to time against.

This module imports only pydantic: the GPU worker and the CPU tools both load it.
"""
from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field

Arch = Literal["sm_90a", "sm_100a"]
ARCHES: tuple[str, ...] = ("sm_90a", "sm_100a")
DType = Literal["bfloat16", "float16", "float32", "float8_e4m3fn", "int32", "int64"]

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1, "int32": 4, "int64": 8}


class Axis(BaseModel):
    type: Literal["const", "var"]
    value: int | None = None  # set for const axes
    description: str = ""


class TensorSpec(BaseModel):
    shape: list[str]  # axis names, outermost first; layout is row-major contiguous
    dtype: DType
    description: str = ""
    # An input a run reads only in part (a state pool indexed by slot): how many of its outermost
    # rows one run reads, over the axes. The byte counts (what TMA must carry, the memory floor
    # behind `implausible`) count those rows only. None: the whole tensor.
    rows_read: str | None = None


class Workload(BaseModel):
    """Concrete values for the var axes. held_out workloads are never shown to a model."""

    name: str
    axes: dict[str, int]
    split: Literal["visible", "held_out"] = "visible"


class RowTolerance(BaseModel):
    """A bound on every row of one output: ||out_r - ref_r||_2 <= rtol * max(||s_r||_2, floor *
    sqrt(n) * rms(s)) + atol * sqrt(n), with n the row's length and s the elementwise scale
    (|ref|, or max(|ref|, rss) for scale "terms"). A row is the output's last dim ("last_dim":
    a GEMM row, an attention query's O, a GDN token's output or state row) or a single element
    ("element": LSE, whose error is additive: exp(dLSE) - 1 is the normaliser's relative error).
    Unlike an aggregate bound it cannot be diluted by the rest of the output: one wrong row fails.
    For "element" rows this bound replaces the task's elementwise rtol/atol on that output.

    `spread` (element rows with a term scale, LSE): each row's bound is its own rounding's,
    min(atol, spread_atol + spread * c_r), with c_r the output's term scale for that row. For LSE
    c_r = sqrt(sum_j p_j^2) over the row's softmax p (the rss of the normaliser's terms relative
    to their sum: 1 where one key carries the row, 1/sqrt(n) over n equal keys): rounding each p
    by a relative eps moves LSE by about eps * c_r, so a flat row, whose LSE another input's row
    nearly matches, is held to its own small rounding and `atol` stays the most any row may err."""
    rtol: float = 0.0
    floor: float = 0.0  # a row's scale is at least floor x a typical row's (rms over the output)
    atol: float = 0.0  # absolute part, in the output's units (LSE: nats)
    row: Literal["last_dim", "element"] = "last_dim"
    spread: float = 0.0  # element rows: the bound per unit of the row's term scale (0: atol alone)
    spread_atol: float = 0.0  # element rows with spread: the part no row's bound goes below


class Tolerance(BaseModel):
    # Element passes if |out - ref| <= atol + rtol * scale (ref in fp32 from the same inputs), where
    # scale is |ref| ("ref"), or max(|ref|, rss) ("terms"): rss is the root-sum-square of the
    # products summed into that element (tasks.reference.term_scales). "terms" only loosens elements
    # whose value cancels below the rounding noise every bf16 tensor-core kernel has (attention
    # backward on stress inputs; see tasks/families/attention.py).
    rtol: float = 1e-2
    atol: float = 1e-2
    scale: Literal["ref", "terms"] = "ref"
    # Aggregate bound per output: ||out - ref||_2 / ||ref||_2 <= rel_l2[name]. The elementwise
    # rule alone lets a bias, noise or zeroed elements below atol pass where outputs are small
    # (attention: median |element| 0.017-0.029); calibration in docs/METHODOLOGY.md.
    rel_l2: dict[str, float] = Field(default_factory=dict)
    # Per-row bound per output (RowTolerance): catches one wrong row or a few wrong elements that
    # an aggregate bound dilutes and an atol hides (calibration in docs/METHODOLOGY.md).
    rows: dict[str, RowTolerance] = Field(default_factory=dict)


# The benchmark's task families by op type, in the order `agent tasks` lists them.
OP_FAMILIES: dict[str, str] = {
    "gemm": "GEMM", "fp8_gemm": "FP8 GEMM (block-scaled)", "mha_fwd": "attention forward",
    "mha_bwd": "attention backward", "fp8_mha_fwd": "FP8 attention forward", "gdn_decode": "Gated DeltaNet",
    "gdn_prefill": "Gated DeltaNet", "gdn_mtp": "Gated DeltaNet",
}


class Task(BaseModel):
    # --- FlashInfer-Bench Definition fields ---
    name: str
    description: str = ""
    op_type: str
    axes: dict[str, Axis]
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    reference: str  # Python source defining `run(**inputs) -> dict | tensor | tuple` (PyTorch)
    # --- ptxbench extensions ---
    workloads: list[Workload] = Field(default_factory=list)
    tolerance: Tolerance = Field(default_factory=Tolerance)
    flops: str = "0"  # expression over axes, e.g. "2*M*N*K"
    scalars: dict[str, str] = Field(default_factory=dict)  # e.g. {"sm_scale": "1/sqrt(D)"}
    requested_features: dict[str, list[str]] = Field(default_factory=dict)  # arch -> features
    # What the request means for this task beyond the feature list (which part of the work the
    # requested instructions are to carry). Stated only where the instructions are asked for
    # (--require on, tasks.describe); the description itself never names them.
    request_note: str = ""
    baseline: Literal["cublas", "sdpa_fwd", "sdpa_bwd", "fla_gdn", "sdpa_fp8_fwd", "fp8_block_gemm", "none"] = "none"
    generator: str = "stress"  # name of an input generator in tasks.generators
    family: str = ""  # seed task this is a variant of (e.g. "mha_bwd_d128"), for reports
    tags: list[str] = Field(default_factory=list)

    def axis_values(self, workload: Workload | dict[str, int]) -> dict[str, int]:
        """All axis values (const and var) for one workload; raises ValueError if any is missing."""
        given = workload.axes if isinstance(workload, Workload) else dict(workload)
        values: dict[str, int] = {}
        for name, axis in self.axes.items():
            if axis.type == "const":
                values[name] = int(axis.value)  # type: ignore[arg-type]
            elif name in given:
                values[name] = int(given[name])
            else:
                raise ValueError(f"workload gives no value for var axis {name!r} of task {self.name}")
        return values

    def shape(self, tensor: str, axes: dict[str, int]) -> tuple[int, ...]:
        spec = self.inputs.get(tensor) or self.outputs[tensor]
        return tuple(int(axes[a]) if a in axes else int(a) for a in spec.shape)

    def flop_count(self, axes: dict[str, int]) -> float:
        return float(eval(self.flops, {"__builtins__": {}, "sqrt": math.sqrt}, dict(axes)))

    def tensor_bytes(self, names, axes: dict[str, int]) -> int:
        specs = {**self.inputs, **self.outputs}
        total = 0
        for n in names:
            shape = self.shape(n, axes)
            if specs[n].rows_read is not None:  # only these outermost rows are read
                rows = int(eval(specs[n].rows_read, {"__builtins__": {}}, dict(axes)))
                shape = (min(rows, shape[0]), *shape[1:])
            total += math.prod(shape) * DTYPE_BYTES[specs[n].dtype]
        return total

    def input_bytes(self, axes: dict[str, int]) -> int:
        """Every input read once: what TMA must carry at least half of to carry the work."""
        return self.tensor_bytes(self.inputs, axes)

    def min_bytes(self, axes: dict[str, int]) -> int:
        """Each input read once and each output written once: the memory-traffic floor."""
        return self.tensor_bytes([*self.inputs, *self.outputs], axes)

    def scalar_values(self, axes: dict[str, int]) -> dict[str, float]:
        env = {"__builtins__": {}, "sqrt": math.sqrt, "log2": math.log2, "e": math.e}
        return {k: float(eval(v, env, dict(axes))) for k, v in self.scalars.items()}

    def workloads_for(self, which: Literal["visible", "held_out", "all"] = "all") -> list[Workload]:
        return [w for w in self.workloads if which == "all" or w.split == which]

    @property
    def op_family(self) -> str:
        """The family this task belongs to (OP_FAMILIES), for listings and reports."""
        return OP_FAMILIES.get(self.op_type, self.op_type)

    def features_for(self, arch: str) -> list[str]:
        return list(self.requested_features.get(arch, []))
