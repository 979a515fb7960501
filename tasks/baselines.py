"""Library baselines a candidate's speed is measured against (GPU only; importable anywhere).

- cublas: `torch.matmul(A, B.T)` on bf16 tensors (cuBLAS; the transposed view is free).
- sdpa:cudnn / sdpa:flash / sdpa:efficient: PyTorch's scaled-dot-product-attention backends.
  cuDNN is the fastest on Hopper (FACTS.md) and the default.

`make_baseline(task, inputs, backend)` does all setup (forward graphs, output allocation)
up front and returns a Baseline whose `run()` launches only the library work being timed,
so the evaluator can time it exactly like a candidate (same worker, interleaved rounds).
Nothing here touches CUDA at import time.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from tasks.schema import Task

SDPA_BACKENDS = {"sdpa:cudnn": "CUDNN_ATTENTION", "sdpa:flash": "FLASH_ATTENTION",
                 "sdpa:efficient": "EFFICIENT_ATTENTION"}


class BaselineUnavailable(RuntimeError):
    """This backend cannot run these inputs here (no GPU, unsupported shape, library refused)."""


@dataclass
class Baseline:
    name: str  # "cublas", "sdpa:cudnn", ...
    run: Callable[[], dict[str, torch.Tensor]]  # launches the timed library work; returns the task's outputs
    detail: str  # what exactly is timed, one line (reports, methodology)


def list_backends(task: Task) -> list[str]:
    """Backends for the task's baseline, best-expected first (the first is the default)."""
    if task.baseline == "cublas":
        return ["cublas"]
    if task.baseline in ("sdpa_fwd", "sdpa_bwd"):
        return list(SDPA_BACKENDS)
    return []


def make_baseline(task: Task, inputs: dict[str, torch.Tensor], backend: str | None = None) -> Baseline:
    """A ready-to-time library baseline for these (CUDA) inputs; raises BaselineUnavailable."""
    backends = list_backends(task)
    if not backends:
        raise BaselineUnavailable(f"task {task.name} has no library baseline")
    backend = backend or backends[0]
    if backend not in backends:
        raise BaselineUnavailable(f"backend {backend!r} does not apply to task {task.name} "
                                  f"(choose from {', '.join(backends)})")
    if not all(t.is_cuda for t in inputs.values()):
        raise BaselineUnavailable("library baselines run on CUDA tensors only")
    if backend == "cublas":
        return _cublas(inputs)
    scale = task.scalar_values(task.axis_values(_var_axes(task, inputs)))["sm_scale"]
    causal = "causal" in task.tags
    try:
        if task.baseline == "sdpa_fwd":
            return _sdpa_forward(backend, inputs, scale, causal)
        return _sdpa_backward(backend, inputs, scale, causal)
    except BaselineUnavailable:
        raise
    except RuntimeError as exc:  # the backend refused these shapes/dtypes or this GPU
        raise BaselineUnavailable(f"{backend} cannot run {task.name}: {str(exc).splitlines()[0][:200]}") from None


def _var_axes(task: Task, inputs: dict[str, torch.Tensor]) -> dict[str, int]:
    axes = {}
    for name, spec in task.inputs.items():
        for axis, size in zip(spec.shape, inputs[name].shape):
            axes[axis] = int(size)
    return axes


def _cublas(inputs: dict[str, torch.Tensor]) -> Baseline:
    a, b = inputs["A"], inputs["B"]
    c = torch.empty(a.shape[0], b.shape[0], dtype=a.dtype, device=a.device)

    def run() -> dict[str, torch.Tensor]:
        torch.matmul(a, b.T, out=c)  # bf16 in/out, fp32 accumulation; out= keeps allocation out of the timing
        return {"C": c}

    return Baseline("cublas", run, "torch.matmul(A, B.T, out=C) in bf16 (cuBLAS)")


def _sdpa_context(backend: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[backend])])


def _sdpa_forward(backend: str, inputs: dict[str, torch.Tensor], scale: float, causal: bool) -> Baseline:
    import torch.nn.functional as F

    q, k, v = inputs["Q"], inputs["K"], inputs["V"]
    # The task also asks for LSE. PyTorch's public SDPA does not return it, and in inference
    # mode a backend may skip writing it; that saves one fp32 per query row, a negligible part
    # of the work, and only ever favours the library (the speedup is if anything understated).
    with _sdpa_context(backend), torch.no_grad():
        F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)  # fails here if unsupported

    def run() -> dict[str, torch.Tensor]:
        with _sdpa_context(backend), torch.no_grad():
            return {"O": F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)}

    return Baseline(backend, run, f"F.scaled_dot_product_attention forward under sdpa_kernel({SDPA_BACKENDS[backend]})")


def _sdpa_backward(backend: str, inputs: dict[str, torch.Tensor], scale: float, causal: bool) -> Baseline:
    import torch.nn.functional as F

    # Time the backward only. The forward runs once here, with the backend pinned, and its
    # autograd graph is kept (retain_graph) so every timed call is exactly one launch of that
    # backend's backward op (which recomputes P from Q, K and the saved LSE, like a candidate).
    # torch.autograd.grad returns fresh gradients instead of accumulating into .grad, so no
    # extra add kernels run. Calling the private aten backward ops directly would save only
    # host overhead, and their signatures change between PyTorch releases.
    q, k, v = (inputs[n].detach().clone().requires_grad_(True) for n in ("Q", "K", "V"))
    d_out = inputs["dO"]
    with _sdpa_context(backend), torch.enable_grad():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    torch.autograd.grad(out, (q, k, v), d_out, retain_graph=True)  # fails here if unsupported

    def run() -> dict[str, torch.Tensor]:
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), d_out, retain_graph=True)
        return {"dQ": dq, "dK": dk, "dV": dv}

    return Baseline(backend, run, f"autograd backward of F.scaled_dot_product_attention "
                                  f"({SDPA_BACKENDS[backend]}), forward excluded")


def first_available(task: Task, inputs: dict[str, torch.Tensor]) -> Baseline:
    """The first backend of list_backends(task) that runs these inputs; BaselineUnavailable lists why none did."""
    reasons = []
    for backend in list_backends(task):
        try:
            return make_baseline(task, inputs, backend)
        except BaselineUnavailable as exc:
            reasons.append(str(exc))
    raise BaselineUnavailable("; ".join(reasons) or f"task {task.name} has no library baseline")
