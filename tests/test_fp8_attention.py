"""FP8 attention forward with LSE (tasks/families/fp8_attention.py) on CPU: the definition as PTXBench
has it, the generator's e4m3 quantisation, the fp32 reference against independent float64
math, the sampled rows, the worker's Workspace with e4m3 inputs, and the tolerance against
emulated FlashAttention-3-style kernels (right ones pass, wrong ones fail)."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tasks import ALIASES, TASKS, get_task
from tasks.families.baselines import list_backends
from tasks.describe import example_manifest, render_task
from tasks.generators import generate_inputs
from tasks.reference import run_reference, term_scales
from tasks.sampled import has_sampler, sample, view_rows
from tasks.schema import Task
from tools.correctness import compare

NAMES = ["fp8_mha_with_lse_d128", "fp8_mha_with_lse_d128_causal", "fp8_mha_with_lse_d64", "fp8_mha_with_lse_d96",
         "fp8_mha_with_lse_d256"]
E4M3 = torch.float8_e4m3fn
TASKS_DIR = Path(__file__).resolve().parents[1] / "tasks"


def small(name: str, B: int = 1, H: int = 2) -> Task:
    task = get_task(name).model_copy(deep=True)
    task.axes["B"].value, task.axes["H"].value = B, H
    return task


def test_registered_as_ptxbench_defines_them():
    assert ALIASES["fp8_attn_fwd"] == "fp8_mha_with_lse_d128"
    assert ALIASES["fp8_attn_fwd_causal"] == "fp8_mha_with_lse_d128_causal"
    for name in NAMES:
        t = TASKS[name]
        assert t.op_type == "fp8_mha_fwd" and t.generator == "stress_fp8_per_tensor" and t.baseline == "sdpa_fp8_fwd"
        assert [a for a, ax in t.axes.items() if ax.type == "var"] == ["L"]
        assert (t.axes["B"].value, t.axes["H"].value, t.axes["one"].value) == (4, 48, 1)
        assert {n: (s.dtype, s.shape) for n, s in t.inputs.items()} == {
            **{n: ("float8_e4m3fn", ["B", "H", "L", "D"]) for n in ("Q", "K", "V")},
            **{f"descale_{n}": ("float32", ["one"] * 4) for n in "qkv"}}
        assert (t.outputs["O"].dtype, t.outputs["LSE"].dtype, t.outputs["LSE"].shape) == \
            ("bfloat16", "float32", ["B", "H", "L"])
        assert t.features_for("sm_90a") == ["wgmma", "tma"]
        assert t.tolerance.scale == "terms" and has_sampler(t)
        assert list_backends(t) == ["cudnn_fp8", "cudnn_bf16_on_dequantised"]
        variant = name not in ALIASES.values()
        assert ("held_out_variant" in t.tags) == variant and (t.family == "fp8_mha_with_lse_d128") == variant
        assert ("causal" in t.tags) == name.endswith("_causal")
        assert t.workloads_for("held_out") and t.workloads_for("visible")[0].axes == {"L": 4096}
    assert TASKS["fp8_mha_with_lse_d128"].flop_count({"B": 4, "H": 48, "L": 4096, "D": 128}) == 4 * 4 * 48 * 4096**2 * 128


def test_generator_quantises_per_tensor_with_amax_descales():
    task = small("fp8_mha_with_lse_d64")
    x = generate_inputs(task, {"L": 300}, seed=11)
    assert x["Q"].dtype == E4M3 and x["Q"].shape == (1, 2, 300, 64) and x["descale_q"].shape == (1, 1, 1, 1)
    for n in "QKV":
        raw = x[n].float()
        assert raw.abs().max().item() == 448.0  # the amax element lands on e4m3's largest value
        d = x[f"descale_{n.lower()}"].item()
        assert 0.01 < d < 0.2  # amax of ~38k stress values (outliers of std 10) over 448
        assert 0.6 < (raw * d).std().item() < 3  # dequantised: the stress distribution again
    again = generate_inputs(task, {"L": 300}, seed=11)
    assert all(torch.equal(x[n].view(torch.uint8) if x[n].dtype == E4M3 else x[n], again[n].view(torch.uint8)
                           if again[n].dtype == E4M3 else again[n]) for n in x)


def _float64_attention(x: dict, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Independent float64 math: dequantise, scores, softmax, weighted sum."""
    q, k, v = (x[n].to(torch.float64) * float(x[f"descale_{n.lower()}"]) for n in "QKV")
    L, D = q.shape[-2:]
    s = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(D)
    if causal:
        s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    m = s.amax(-1, keepdim=True)
    e = torch.exp(s - m)
    return torch.einsum("bhij,bhjd->bhid", e / e.sum(-1, keepdim=True), v), (m + e.sum(-1, keepdim=True).log())[..., 0]


@pytest.mark.parametrize("name,L", [("fp8_mha_with_lse_d64", 77), ("fp8_mha_with_lse_d128_causal", 130),
                                    ("fp8_mha_with_lse_d96", 64)])
def test_reference_matches_float64(name, L):
    task = small(name)
    x = generate_inputs(task, {"L": L}, seed=5)
    got = run_reference(task, x)
    o64, lse64 = _float64_attention(x, "causal" in task.tags)
    torch.testing.assert_close(got["O"].double(), o64, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got["LSE"].double(), lse64, rtol=1e-6, atol=1e-6)


def test_sampled_rows_match_the_full_reference():
    task = small("fp8_mha_with_lse_d128_causal", H=3)
    x = generate_inputs(task, {"L": 77}, seed=3)
    full, scales = run_reference(task, x), term_scales(task, x)
    samples = sample(task, x, torch.Generator().manual_seed(1), rows=9)
    assert set(samples) == {"O", "LSE"}
    for out, smp in samples.items():
        assert len(set(smp.rows.tolist())) == 9
        torch.testing.assert_close(smp.expected, view_rows(full[out])[smp.rows], rtol=2e-5, atol=2e-5)
        # O's term scale and LSE's (FP8 attention judges its LSE on one too: sqrt of the sum of p^2 over
        # the row, tasks.reference.term_scales), each on exactly the sampled rows
        assert set(scales) == {"O", "LSE"}
        torch.testing.assert_close(smp.scale, view_rows(scales[out])[smp.rows], rtol=2e-5, atol=2e-5)


def test_workspace_carries_e4m3_inputs():
    """The worker's Workspace (guards, inputs judged against a regeneration, poison, verdict) with e4m3 inputs, on CPU."""
    from tools.launch import NOMINAL_LIMITS, plan_launches
    from tools.solution import Solution
    from tools.workspace import Workspace

    task = small("fp8_mha_with_lse_d64")
    axes = task.axis_values({"L": 77})
    plan = plan_launches(Solution.from_dir(TASKS_DIR / "fp8_mha_with_lse_d64" / "simple").manifest, task, axes,
                         NOMINAL_LIMITS["sm_90a"])
    ws = Workspace(task, plan, "cpu")
    fresh = generate_inputs(task, axes, seed=2)
    ws.load_inputs(fresh)
    ws.reset()
    ref = run_reference(task, fresh)
    reason, detail, _ = ws.verdict(ref, task.tolerance, term_scales(task, fresh), inputs=fresh)
    assert reason == "unwritten_output", detail
    ws.outputs["O"].copy_(ref["O"])
    ws.outputs["LSE"].copy_(ref["LSE"])
    assert ws.verdict(ref, task.tolerance, term_scales(task, fresh), inputs=fresh)[0] is None
    smp = sample(task, fresh, torch.Generator().manual_seed(0), rows=16)
    assert ws.verdict(None, task.tolerance, inputs=fresh, samples=smp)[0] is None
    ws.inputs["V"].view(torch.uint8)[0, 0, 0, 0] ^= 1  # a kernel that wrote to an e4m3 input
    assert ws.verdict(ref, task.tolerance, term_scales(task, fresh), inputs=fresh)[0] == "input_modified"


def _emulated_kernel(x: dict, causal: bool, p_scale: float = 256.0, drop_descale_v: bool = False,
                     mask_shift: int = 0, drop_keys: int = 0) -> dict[str, torch.Tensor]:
    """A FlashAttention-3-style FP8 kernel in torch: exact e4m3 products summed in fp32, online
    softmax over 128-key blocks, P * p_scale rounded to e4m3 for P @ V, O rounded to bf16."""
    q8, k8, v8 = (x[n].float() for n in "QKV")
    dq, dk, dv = (float(x[f"descale_{n}"]) for n in "qkv")
    B, H, L, D = q8.shape
    n_keys = L - drop_keys
    m = torch.full((B, H, L), float("-inf"))
    l, acc = torch.zeros(B, H, L), torch.zeros(B, H, L, D)
    rows = torch.arange(L)[:, None]
    for j0 in range(0, n_keys, 128):
        j1 = min(n_keys, j0 + 128)
        s = (q8 @ k8[:, :, j0:j1].transpose(-1, -2)) * (dq * dk / math.sqrt(D))
        if causal:
            s = s.masked_fill(torch.arange(j0, j1)[None, :] > rows + mask_shift, float("-inf"))
        m_new = torch.maximum(m, s.amax(-1))
        safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        alpha, p = torch.exp(m - safe), torch.exp(s - safe[..., None])
        l = l * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + (p * p_scale).to(E4M3).float() @ v8[:, :, j0:j1]
        m = m_new
    o = acc / (l[..., None] * p_scale) * (1.0 if drop_descale_v else dv)
    return {"O": o.to(torch.bfloat16).float(), "LSE": m + torch.log(l)}


@pytest.mark.parametrize("causal", [False, True])
def test_tolerance_passes_fp8_kernels_and_fails_wrong_ones(causal):
    task = small("fp8_mha_with_lse_d128_causal" if causal else "fp8_mha_with_lse_d128", H=2)
    x = generate_inputs(task, {"L": 512}, seed=9)
    ref, scales = run_reference(task, x), term_scales(task, x)

    def verdict(out: dict) -> bool:
        return all(compare(n, out[n], ref[n], task.tolerance, scales.get(n)).passed for n in ("O", "LSE"))

    assert verdict(_emulated_kernel(x, causal))
    assert not verdict(_emulated_kernel(x, causal, drop_descale_v=True))
    assert not verdict(_emulated_kernel(x, causal, drop_keys=16))
    if causal:
        assert not verdict(_emulated_kernel(x, causal, mask_shift=1))


def test_task_text_and_example_manifest():
    task = get_task("fp8_attn_fwd")
    text = render_task(task, "sm_90a")
    # (how e4m3 operands reach the tensor cores, K-major V, is the docs' to teach: issue 41)
    for needle in ("float8_e4m3fn", "descale_v", "448/amax", "cuDNN's FP8 attention", "e4m3 rounding"):
        assert needle in text, needle
    manifest = example_manifest(task, "sm_90a")
    from tools.launch import NOMINAL_LIMITS, plan_launches
    from tools.solution import LaunchManifest

    for w in task.workloads:  # the example plans for every workload, ragged L included (Vt's rounded stride)
        plan_launches(LaunchManifest.model_validate(manifest), task, task.axis_values(w), NOMINAL_LIMITS["sm_90a"])
