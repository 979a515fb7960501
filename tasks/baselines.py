"""Library baselines a candidate's speed is measured against (GPU only; importable anywhere).

- cublas: `torch.matmul(A, B.T)` on bf16 tensors (cuBLAS; the transposed view is free).
- sdpa:cudnn / sdpa:flash / sdpa:efficient: PyTorch's scaled-dot-product-attention backends.
  cuDNN is the fastest on Hopper (FACTS.md) and the default; its backward is called
  directly (no autograd host work in the timed region).

Every baseline reads the task's input tensors it was made with: the worker copies fresh
inputs into those same tensors before each paired run, so the library and the candidate
always run on the same data.

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
    prepare: Callable[[], None] = lambda: None  # untimed set-up before each run (after fresh inputs are loaded)
    inputs_as_given: bool = True  # False: derives some inputs itself (autograd backward: its own forward's O)


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
    """The library's backward on the task's own inputs (the worker loads fresh ones into the
    same tensors before every run). cuDNN: its backward op is called directly with Q, K, V,
    O, dO and LSE, so the timed region holds one library launch and no autograd host work.
    Other backends go through autograd: prepare() re-runs their forward on the fresh Q, K, V
    (not timed) and run() times the backward alone."""
    if backend == "sdpa:cudnn":
        return _cudnn_backward(inputs, scale, causal)
    import torch.nn.functional as F

    state: dict = {}

    def prepare() -> None:
        q, k, v = (inputs[n].detach().requires_grad_(True) for n in ("Q", "K", "V"))
        with _sdpa_context(backend), torch.enable_grad():
            state.update(q=q, k=k, v=v, out=F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale))

    prepare()
    # retain_graph: run() may be called again without a prepare() in between (e.g. to read outputs)
    torch.autograd.grad(state["out"], (state["q"], state["k"], state["v"]), inputs["dO"], retain_graph=True)

    def run() -> dict[str, torch.Tensor]:
        dq, dk, dv = torch.autograd.grad(state["out"], (state["q"], state["k"], state["v"]), inputs["dO"],
                                         retain_graph=True)
        return {"dQ": dq, "dK": dk, "dV": dv}

    return Baseline(backend, run, f"autograd backward of F.scaled_dot_product_attention ({SDPA_BACKENDS[backend]}); "
                                  "its forward re-run untimed before each run", prepare, inputs_as_given=False)


def _cudnn_backward(inputs: dict[str, torch.Tensor], scale: float, causal: bool) -> Baseline:
    """cuDNN's attention backward called directly on the task's tensors. Its forward runs once
    here, only for the bookkeeping tensors the backward op takes (sequence offsets, the LSE's
    shape, the dropout RNG state, unused at p=0); the result is checked against autograd on
    the same inputs, so a signature that changed between PyTorch releases refuses here."""
    q, k, v, o, d_out, lse = (inputs[n] for n in ("Q", "K", "V", "O", "dO", "LSE"))
    aten = torch.ops.aten
    try:
        fwd = aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False, scale=scale)
    except (RuntimeError, AttributeError) as exc:
        raise BaselineUnavailable(f"sdpa:cudnn forward refused: {str(exc).splitlines()[0][:200]}") from None
    _out, lse_lib, cum_q, cum_k, max_q, max_k, seed, offset = fwd[:8]
    lse_view = lse.view(lse_lib.shape) if lse.numel() == lse_lib.numel() else None
    if lse_view is None:
        raise BaselineUnavailable(f"sdpa:cudnn keeps its LSE as {tuple(lse_lib.shape)}, the task's is {tuple(lse.shape)}")

    def run() -> dict[str, torch.Tensor]:
        dq, dk, dv = aten._scaled_dot_product_cudnn_attention_backward(
            d_out, q, k, v, o, lse_view, seed, offset, None, cum_q, cum_k, max_q, max_k, 0.0, causal, scale=scale)
        return {"dQ": dq, "dK": dk, "dV": dv}

    try:
        got = run()
    except (RuntimeError, TypeError) as exc:
        raise BaselineUnavailable(f"sdpa:cudnn backward refused: {str(exc).splitlines()[0][:200]}") from None
    ref = _sdpa_backward("sdpa:flash", inputs, scale, causal).run() if _flash_ok(q) else None
    if ref is not None:
        for name in ("dQ", "dK", "dV"):
            err = float((got[name].float() - ref[name].float()).norm() / ref[name].float().norm().clamp_min(1e-30))
            if not err < 0.05:
                raise BaselineUnavailable(f"sdpa:cudnn direct backward disagrees with autograd on {name} "
                                          f"(relative L2 {err:.3g}); not used")
    return Baseline("sdpa:cudnn", run, "aten._scaled_dot_product_cudnn_attention_backward on the task's Q, K, V, O, "
                                       "dO, LSE (one cuDNN launch, no autograd)")


def _flash_ok(q: torch.Tensor) -> bool:
    return q.is_cuda and q.shape[-1] <= 256


def first_available(task: Task, inputs: dict[str, torch.Tensor]) -> Baseline:
    """The first backend of list_backends(task) that runs these inputs; BaselineUnavailable lists why none did."""
    reasons = []
    for backend in list_backends(task):
        try:
            return make_baseline(task, inputs, backend)
        except BaselineUnavailable as exc:
            reasons.append(str(exc))
    raise BaselineUnavailable("; ".join(reasons) or f"task {task.name} has no library baseline")
