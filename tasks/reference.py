"""Run a task's reference: the Python source in `Task.reference`, exactly the text a model is shown,
or, for one of ptxbench's own reference texts that has one (`judge_equivalent`), a faster computation
of the same results that tests hold to the text (GDN prefill: the recurrence in chunks, in float64).

Results are fp32. The evaluator compares every output in fp32 against them, so a reference
must not round to the output dtype: ptxbench's own references compute in fp32 from the
bf16 inputs. For the same reason 16-bit float inputs are handed to the reference already
widened to fp32 (exactly), so that a foreign FlashInfer-Bench reference written as plain
`torch.matmul(A, B.T)` computes in fp32 too. fp32 matmuls run in full IEEE fp32 (TF32 off).
"""
from __future__ import annotations

import contextlib
import hashlib
import inspect
from typing import Callable

import torch

from tasks.schema import Task

_COMPILED: dict[str, Callable] = {}
# Attention's term scales (and the timed runs' bf16 forward, tasks/generators.py) hold this many scores at
# once (1 GiB of fp32): at S=8192, 4 heads at a time.
_SCORES_PER_CHUNK = 2**28


class BrokenReference(RuntimeError):
    """The task's reference source is broken (does not define run, returns the wrong outputs)."""


def reference_function(task: Task) -> Callable:
    """The `run` function of the task's reference source, compiled once per distinct source."""
    key = hashlib.sha256(task.reference.encode()).hexdigest()
    if key not in _COMPILED:
        namespace: dict = {"__name__": f"ptxbench_reference_{task.name}"}
        try:
            exec(compile(task.reference, f"<reference of {task.name}>", "exec"), namespace)  # noqa: S102
        except Exception as exc:  # noqa: BLE001 - report any failure of the task's own code
            raise BrokenReference(f"reference of {task.name} does not load: {type(exc).__name__}: {exc}") from exc
        if not callable(namespace.get("run")):
            raise BrokenReference(f"reference of {task.name} defines no run(...) function")
        _COMPILED[key] = namespace["run"]
    return _COMPILED[key]


@contextlib.contextmanager
def _ieee_fp32():
    """No TF32 in the reference's fp32 matmuls, whatever the process set before."""
    old_matmul = torch.backends.cuda.matmul.allow_tf32
    old_cudnn = torch.backends.cudnn.allow_tf32
    old_precision = torch.get_float32_matmul_precision()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_matmul
        torch.backends.cudnn.allow_tf32 = old_cudnn
        torch.set_float32_matmul_precision(old_precision)


def judge_equivalent(task: Task) -> Callable | None:
    """The faster computation of `task`'s reference results (a function with the text's `run` signature),
    where its reference is the very text that computation was written and tested for, matched by hash: a
    task that edits the text, or a foreign task of the same op type, runs its own text (None here)."""
    from tasks.families.gdn import PREFILL_REFERENCE, prefill_chunked

    equivalents = {hashlib.sha256(PREFILL_REFERENCE.encode()).hexdigest(): prefill_chunked}
    return equivalents.get(hashlib.sha256(task.reference.encode()).hexdigest())


def run_reference(task: Task, inputs: dict[str, torch.Tensor], text: bool = False) -> dict[str, torch.Tensor]:
    """Every output of the task, in fp32, on the inputs' device.

    `inputs` holds the task's input tensors (any extra entries are ignored); the task's
    scalars (e.g. sm_scale) are computed from the input shapes and passed by name. The reference's
    judge equivalent runs where it has one, unless `text` (the text itself: what the tests compare it with).
    """
    run = (not text and judge_equivalent(task)) or reference_function(task)
    axes = _axes_from_shapes(task, inputs)
    scalars = task.scalar_values(axes)
    args = {name: _widen(inputs[name]) for name in task.inputs}
    params = inspect.signature(run).parameters
    takes_any = any(p.kind == p.VAR_KEYWORD for p in params.values())
    kwargs = {k: v for k, v in {**args, **scalars}.items() if takes_any or k in params}
    with torch.no_grad(), _ieee_fp32():
        result = run(**kwargs)
    return _as_outputs(task, result, axes)


def _widen(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t


def _axes_from_shapes(task: Task, inputs: dict[str, torch.Tensor]) -> dict[str, int]:
    """Axis values read off the input shapes (checked against the task's const axes)."""
    axes: dict[str, int] = {n: int(a.value) for n, a in task.axes.items() if a.type == "const"}
    for name, spec in task.inputs.items():
        if name not in inputs:
            raise ValueError(f"input {name!r} of task {task.name} is missing")
        shape = tuple(inputs[name].shape)
        if len(shape) != len(spec.shape):
            raise ValueError(f"input {name!r} of task {task.name} has rank {len(shape)}, expected {len(spec.shape)}")
        for axis, size in zip(spec.shape, shape):
            if axes.setdefault(axis, size) != size:
                raise ValueError(f"input {name!r} of task {task.name}: axis {axis} is {size}, expected {axes[axis]}")
    return axes


def _as_outputs(task: Task, result, axes: dict[str, int]) -> dict[str, torch.Tensor]:
    names = list(task.outputs)
    if isinstance(result, torch.Tensor):
        result = (result,)
    if isinstance(result, dict):
        missing = [n for n in names if n not in result]
        if missing:
            raise BrokenReference(f"reference of {task.name} returned no {', '.join(missing)}")
        values = [result[n] for n in names]
    elif isinstance(result, (tuple, list)) and len(result) == len(names):
        values = list(result)
    else:
        raise BrokenReference(f"reference of {task.name} must return a dict, a tensor or a tuple of "
                             f"{len(names)} tensors ({', '.join(names)})")
    out = {}
    for name, value in zip(names, values):
        expected = task.shape(name, axes)
        if tuple(value.shape) != expected:
            raise BrokenReference(f"reference of {task.name}: output {name} has shape {tuple(value.shape)}, "
                                 f"expected {expected}")
        out[name] = value.float()
    return out


def term_scales(task: Task, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per output element, the root-sum-square (rss) of the products that are summed into it, fp32.

    A kernel that rounds each product's factor to bf16 (as tensor-core kernels do with P and dS
    in attention) errs by about 2^-9 * rss on an element, whatever the element's own value: where
    the sum cancels (|ref| << rss) that exceeds rtol * |ref|. Tasks with tolerance.scale == "terms"
    are judged against max(|ref|, rss). Known for op types gemm, mha_fwd, fp8_mha_fwd and mha_bwd. FP8
    attention's LSE has one of its own: sqrt(sum_j p_j^2) over the row's softmax (the rss of the
    normaliser's terms over their sum), which its row tolerance's `spread` reads (schema.RowTolerance);
    bf16 attention's LSE has none (its scale is |ref|).
    """
    axes = _axes_from_shapes(task, inputs)
    x = {name: _widen(inputs[name]) for name in task.inputs}
    with torch.no_grad(), _ieee_fp32():
        if task.op_type == "gemm":
            return {"C": torch.matmul(x["A"].square(), x["B"].square().T).sqrt_()}
        if task.op_type in ("mha_fwd", "mha_bwd"):
            sm_scale = task.scalar_values(axes)["sm_scale"]
            out = _attention_term_scales(task.op_type, x, sm_scale, "causal" in task.tags)
            out.pop("LSE", None)  # bf16 LSE rows are bounded flat (no spread): |ref| is their scale
            return out
        if task.op_type == "fp8_mha_fwd":  # as mha_fwd, over the dequantised Q, K, V (tasks/families/fp8_attention.py)
            sm_scale = task.scalar_values(axes)["sm_scale"]
            return _attention_term_scales("mha_fwd", dequantised(inputs, ("Q", "K", "V")), sm_scale,
                                          "causal" in task.tags)
        if task.op_type == "fp8_gemm":  # as gemm, over the block-dequantised A and B (tasks/families/fp8_gemm.py)
            from tasks.families.fp8_gemm import dequantize

            a, b = dequantize(inputs["A"], inputs["SF_A"]), dequantize(inputs["B"], inputs["SF_B"])
            return {"D": torch.matmul(a.square(), b.square().T).sqrt_()}
        # GDN prefill: the rss of the products summed into o_t[v], scale * S_t[v, k] q_t[k], with S_t the state
        # after token t, stepped as the judge's reference steps it. A row of o is small where its gate and beta
        # wiped the state (its terms are small too, and a kernel's rounding of them), never by cancellation of
        # large terms on these inputs: so each output row is held to its own terms, with no floor that lets a
        # near-zero row be zeroed (issue 42, item 6).
        if task.op_type == "gdn_prefill":
            from tasks.families.gdn import prefill_chunked

            args = {n: x[n] for n in ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b", "cu_seqlens")}
            return prefill_chunked(**args, scale=task.scalar_values(axes)["scale"], terms=True)
    raise BrokenReference(f"no term scales are known for op type {task.op_type!r} (task {task.name}); "
                          "use tolerance.scale = \"ref\"")


def dequantised(inputs: dict[str, torch.Tensor], names) -> dict[str, torch.Tensor]:
    """fp32 real values of per-tensor-scaled fp8 inputs: X.float() * descale_x (one scale per tensor)."""
    return {n: inputs[n].float() * inputs[f"descale_{n.lower()}"].float().reshape(()) for n in names}


def _attention_term_scales(op_type: str, x: dict[str, torch.Tensor], sm_scale: float, causal: bool
                           ) -> dict[str, torch.Tensor]:
    B, H, S, D = x["Q"].shape
    q, k, v = (x[n].float().reshape(B * H, S, D) for n in ("Q", "K", "V"))
    keep = torch.ones(S, S, dtype=torch.bool, device=q.device).tril() if causal else None
    names = ("O",) if op_type == "mha_fwd" else ("dQ", "dK", "dV")
    out = {n: torch.empty(B * H, S, D, dtype=torch.float32, device=q.device) for n in names}
    if op_type == "mha_fwd":  # LSE's: sqrt(sum_j p_j^2), the rss of its normaliser's terms over their sum
        out["LSE"] = torch.empty(B * H, S, dtype=torch.float32, device=q.device)
    if op_type == "mha_bwd":
        o, do = (x[n].float().reshape(B * H, S, D) for n in ("O", "dO"))
        lse = x["LSE"].float().reshape(B * H, S, 1)
    step = max(1, _SCORES_PER_CHUNK // (S * S))
    for h in range(0, B * H, step):
        c = slice(h, h + step)
        scores = torch.matmul(q[c], k[c].transpose(1, 2)) * sm_scale
        if causal:
            scores.masked_fill_(~keep, float("-inf"))
        if op_type == "mha_fwd":  # O[i] = sum_j P[i,j] V[j]
            p = torch.softmax(scores, dim=-1)
            p.square_()
            out["LSE"][c] = p.sum(dim=-1).sqrt_()
            out["O"][c] = torch.matmul(p, v[c].square()).sqrt_()
            continue
        p = torch.exp(scores - lse[c])  # exp(-inf) = 0 where masked
        out["dV"][c] = torch.matmul(p.square().transpose(1, 2), do[c].square()).sqrt_()  # dV[j] = sum_i P[i,j] dO[i]
        delta = (do[c] * o[c]).sum(dim=-1, keepdim=True)
        ds2 = torch.matmul(do[c], v[c].transpose(1, 2)).sub_(delta).mul_(p).square_()  # dS^2
        out["dQ"][c] = torch.matmul(ds2, k[c].square()).sqrt_() * sm_scale  # dQ[i] = sm_scale sum_j dS[i,j] K[j]
        out["dK"][c] = torch.matmul(ds2.transpose(1, 2), q[c].square()).sqrt_() * sm_scale
    return {n: t.reshape(B, H, S, D) if t.dim() == 3 else t.reshape(B, H, S) for n, t in out.items()}
