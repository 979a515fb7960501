"""Input generators: fresh, seeded inputs for one workload of a task.

The stress distribution (DESIGN.md): every float element is N(0, 1), plus, with
probability 1e-3, an outlier drawn from N(0, 100) (std 10). Outliers catch kernels that
lose precision on large values or that only work on tame data; fresh seeds per check stop
a kernel from memorising its answers.

Tensors are made directly on the requested device from a torch.Generator seeded by the
caller, so full-size CUDA workloads take milliseconds. Draws are reproducible for a given
(seed, device), not across devices.
"""
from __future__ import annotations

import torch

from tasks.schema import Task
from tasks.stress import stress

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
           "float8_e4m3fn": torch.float8_e4m3fn}


def generate_inputs(task: Task, axes: dict[str, int], seed: int, device: str | torch.device = "cpu",
                    fast: bool = False) -> dict[str, torch.Tensor]:
    """Every input tensor of `task` for the given axis values (var axes at least), contiguous, in
    its declared dtype. The generator is the task's `generator` field: "stress",
    "stress_with_forward:<task>" (attention backward: O and LSE come from that forward task's
    reference on the same Q, K, V), "fp8_block_scaled" (tasks.families.fp8_gemm.generate_block_scaled_inputs)
    or "gdn" (tasks.families.gdn.generate_gdn_inputs).

    fast: for the timed runs, which need fresh inputs every run. Derived inputs (O and LSE)
    come from a bf16 tensor-core forward instead of the fp32 reference: they are still the
    forward of these Q, K, V to bf16 accuracy, and the backward's reference takes O and LSE as
    given, so the judging is exact for whatever was generated."""
    axes = task.axis_values(axes)
    kind, _, argument = task.generator.partition(":")
    if kind == "stress":
        return _stress_inputs(task, axes, seed, device)
    if kind == "stress_with_forward":
        return _stress_with_forward(task, axes, seed, device, argument, fast)
    if kind == "stress_fp8_per_tensor":  # e4m3 inputs with amax-based per-tensor descales (tasks/families/fp8_attention.py)
        return _stress_fp8_per_tensor(task, axes, seed, device)
    if kind == "fp8_block_scaled":  # e4m3 inputs with 1x128 / 128x128 block scales (tasks/families/fp8_gemm.py)
        from tasks.families.fp8_gemm import generate_block_scaled_inputs

        return generate_block_scaled_inputs(task, axes, _generator(seed, device), device)
    if kind == "gdn":  # Gated DeltaNet: normalised q/k, realistic gates, packed sequences (tasks/families/gdn.py)
        from tasks.families.gdn import generate_gdn_inputs

        return generate_gdn_inputs(task, axes, _generator(seed, device), device)
    raise ValueError(f"task {task.name}: unknown input generator {task.generator!r} "
                     "(known: stress, stress_with_forward:<forward task>, gdn, stress_fp8_per_tensor, "
                     "fp8_block_scaled)")


def _generator(seed: int, device: str | torch.device) -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    return gen


def _stress_inputs(task: Task, axes: dict[str, int], seed: int, device) -> dict[str, torch.Tensor]:
    gen = _generator(seed, device)
    out = {}
    for name, spec in task.inputs.items():
        if spec.dtype not in _DTYPES:
            raise ValueError(f"task {task.name}: the stress generator makes floating-point inputs only; "
                             f"input {name!r} is {spec.dtype} and needs a task-specific generator")
        out[name] = stress(task.shape(name, axes), gen, device).to(_DTYPES[spec.dtype])
    return out


E4M3_MAX = 448.0  # largest finite float8_e4m3fn


def _stress_fp8_per_tensor(task: Task, axes: dict[str, int], seed: int, device) -> dict[str, torch.Tensor]:
    """Each float8_e4m3fn input X quantised, as a real FP8 pipeline (and PTXBench) does, from
    stress values in bf16 with one scale per tensor: scale = 448 / amax(|x|), X = x * scale
    in e4m3, and the float32 input `descale_<x>` (every dim 1) = amax / 448, so that
    X.float() * descale_x ~ x. The outliers set amax, so ordinary values land in e4m3's normal
    range. Other float inputs are plain stress values."""
    gen = _generator(seed, device)
    out: dict[str, torch.Tensor] = {}
    for name, spec in task.inputs.items():
        if name.startswith("descale_"):
            continue
        x = stress(task.shape(name, axes), gen, device).to(torch.bfloat16).float()
        if spec.dtype != "float8_e4m3fn":
            out[name] = x.to(_DTYPES[spec.dtype])
            continue
        descale_name = f"descale_{name.lower()}"
        if descale_name not in task.inputs:
            raise ValueError(f"task {task.name}: fp8 input {name!r} has no {descale_name!r} input")
        amax = x.abs().amax().clamp_min(1e-12)
        out[name] = (x * (E4M3_MAX / amax)).clamp_(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        out[descale_name] = (amax / E4M3_MAX).reshape(task.shape(descale_name, axes)).float().contiguous()
    return out


def _stress_with_forward(task: Task, axes: dict[str, int], seed: int, device, forward_name: str,
                         fast: bool = False) -> dict[str, torch.Tensor]:
    from tasks.reference import run_reference
    from tasks.registry import get_task

    forward = get_task(forward_name)
    if set(forward.axes) == set(task.axes):  # same axes by name: a resized copy of the task resizes both
        forward.axes = task.axes
    out = _stress_inputs(task, axes, seed, device)
    shared = {name: out[name] for name in forward.inputs}  # Q, K, V
    if fast and forward.op_type == "mha_fwd" and {"O", "LSE"} <= set(task.inputs):
        sm_scale = float(forward.scalar_values(forward.axis_values(axes))["sm_scale"])
        results = _bf16_attention_forward(shared["Q"], shared["K"], shared["V"], sm_scale, "causal" in forward.tags)
    else:
        results = run_reference(forward, shared)
    for name, value in results.items():  # O, LSE: consistent with Q, K, V, as a real forward wrote them
        if name in task.inputs:
            out[name] = value.to(_DTYPES[task.inputs[name].dtype]).contiguous()
    return out


@torch.no_grad()
def _bf16_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float, causal: bool
                            ) -> dict[str, torch.Tensor]:
    """O and LSE (natural log) of attention with bf16 matmuls: fast enough to make fresh backward
    inputs for every timed run and again for its judge. On a GPU, one flash-attention forward
    (it writes LSE; 0.3 s a generation at B=4, H=48, S=8192 with the S x S scores in fp32, below);
    elsewhere, and where that kernel does not take these shapes, a few heads at a time."""
    if q.is_cuda and q.dtype in (torch.bfloat16, torch.float16):
        try:
            o, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False,
                                                                          scale=sm_scale)[:2]
            return {"O": o.float(), "LSE": lse[..., :q.shape[2]].float()}  # (some kernels pad LSE's S)
        except RuntimeError:  # e.g. a head dim the flash kernel does not build
            pass
    from tasks.reference import _SCORES_PER_CHUNK  # the references' memory budget for S x S fp32 scores

    B, H, S, D = q.shape
    qh, kh, vh = (t.reshape(B * H, S, D) for t in (q, k, v))
    o = torch.empty(B * H, S, D, dtype=torch.float32, device=q.device)
    lse = torch.empty(B * H, S, dtype=torch.float32, device=q.device)
    keep = torch.ones(S, S, dtype=torch.bool, device=q.device).tril() if causal else None
    step = max(1, _SCORES_PER_CHUNK // (S * S))
    for h in range(0, B * H, step):
        c = slice(h, h + step)
        scores = torch.matmul(qh[c], kh[c].transpose(1, 2)).float().mul_(sm_scale)
        if causal:
            scores.masked_fill_(~keep, float("-inf"))
        row = torch.logsumexp(scores, dim=-1)
        o[c] = torch.matmul(torch.exp(scores - row[..., None]).to(v.dtype), vh[c]).float()
        lse[c] = row
    return {"O": o.reshape(B, H, S, D), "LSE": lse.reshape(B, H, S)}
