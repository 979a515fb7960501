"""Physical ceilings: no kernel computes or moves data faster than the hardware can.

A measured throughput above a ceiling means the kernel did not do the task's work on the
timed run (it skipped it, or did it somewhere the clock did not see), so the verdict is
`implausible` and no speedup is credited. Figures are the vendors' dense (no sparsity)
datasheet peaks, which no real kernel reaches (measured on the H200: cuBLAS 730 TFLOP/s of
989, copy 4.22 TB/s of 4.8); MARGIN absorbs clock boost and timer granularity only.

| GPU | bf16/fp16 dense TFLOP/s | fp8 dense TFLOP/s | HBM TB/s |
|---|---|---|---|
| H100 SXM | 989 | 1979 | 3.35 |
| H100 PCIe | 756 | 1513 | 2.0 |
| H100 NVL | 835 | 1670 | 3.9 |
| H200 (SXM) | 989 | 1979 | 4.8 |
| H200 NVL | 835 | 1670 | 4.8 |
| B200 | 2250 | 4500 | 8.0 |

The PCIe and NVL boards run the same chip at a lower power limit (the H100 PCIe on slower HBM2e), and
report their board in the name ("NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200 NVL"): held to the
SXM's figures, a memory-bound kernel on an H100 PCIe could skip 40% of its compulsory traffic unseen and
every T_SOL there would be too short. (NVIDIA's datasheets give the sparse figures: halved, rounded down.)
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Ceiling:
    tflops_16: float  # dense bf16/fp16 tensor-core peak
    tflops_8: float  # dense fp8 tensor-core peak
    hbm_tbps: float

    def tensor_tflops(self, fp8: bool) -> float:
        """The dense tensor peak a task's arithmetic runs against."""
        return self.tflops_8 if fp8 else self.tflops_16


CEILINGS = {"H100": Ceiling(989.0, 1979.0, 3.35), "H100 PCIe": Ceiling(756.0, 1513.0, 2.0),
            "H100 NVL": Ceiling(835.0, 1670.0, 3.9), "H200": Ceiling(989.0, 1979.0, 4.8),
            "H200 NVL": Ceiling(835.0, 1670.0, 4.8), "B200": Ceiling(2250.0, 4500.0, 8.0)}
_BOARDS = ("PCIe", "NVL")  # the lower-power boards of a chip, by the word the driver's name carries
MARGIN = 1.05


def ceiling_for(gpu_name: str | None) -> Ceiling | None:
    """The ceiling of a GPU by its reported name ("NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"),
    or None."""
    name = (gpu_name or "").upper()
    for key in ("H200", "B200", "H100"):  # H200 before H100: neither name contains the other, but be explicit
        if key in name:
            # a board without a row of its own keeps the chip's: higher than its own, still an upper bound
            board = next((f"{key} {b}" for b in _BOARDS if b.upper() in name.split() and f"{key} {b}" in CEILINGS), key)
            return CEILINGS[board]
    return None


def computes_in_fp8(task) -> bool:
    """A task with an fp8 input is held to the fp8 tensor peak (implausibility, roofline, profile)."""
    return any(spec.dtype.startswith("float8") for spec in task.inputs.values())


def implausible(gpu_name: str | None, task, axes: dict[str, int], median_ms: float) -> str | None:
    """Which ceiling a kernel taking `median_ms` on this task and workload breaks, or None.
    An unknown GPU has no ceiling here (say so in results rather than guess)."""
    ceiling = ceiling_for(gpu_name)
    if ceiling is None or median_ms <= 0:
        return None
    seconds = median_ms * 1e-3
    fp8 = computes_in_fp8(task)
    peak = ceiling.tensor_tflops(fp8)
    tflops = task.flop_count(axes) / seconds / 1e12
    if tflops > peak * MARGIN:
        return (f"{tflops:.0f} TFLOP/s at {median_ms:.4g} ms is above the {gpu_name} dense "
                f"{'fp8' if fp8 else 'bf16'} tensor peak of {peak:.0f} TFLOP/s: the timed runs cannot have done "
                "the task's arithmetic")
    tbps = task.min_bytes(axes) / seconds / 1e12
    if tbps > ceiling.hbm_tbps * MARGIN:
        return (f"{tbps:.2f} TB/s at {median_ms:.4g} ms is above the {gpu_name} memory bandwidth of "
                f"{ceiling.hbm_tbps} TB/s for the {task.min_bytes(axes) / 1e6:.0f} MB every run must read and "
                "write (L2 is flushed before each run)")
    return None
