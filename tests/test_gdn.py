"""Gated DeltaNet tasks on CPU: registry and definition shape, the references against an
independent float64 implementation (FlashInfer-Bench's formulation, state transposed to
[K, V] and back), the chunked form the knowledge doc teaches, the generator's ranges, and
that the tolerance rejects a wrong gate order. GPU checks: tests/gpu/test_gdn_gpu.py."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tasks import get_task
from tasks.families.baselines import list_backends
from tasks.describe import example_manifest, render_task
from tasks.families.gdn import CHUNK, cu_seqlens_for
from tasks.generators import generate_inputs
from tasks.reference import run_reference
from tools.correctness import compare
from tools.launch import NOMINAL_LIMITS, plan_launches
from tools.solution import LaunchManifest

NAMES = ["gdn_decode_qk4_v8_d128_k_last", "gdn_prefill_qk4_v8_d128_k_last",
         "gdn_decode_qk8_v16_d128_k_last", "gdn_prefill_qk8_v16_d128_k_last"]


def _gates64(x):
    g = torch.exp(-torch.exp(x["A_log"].double()) * F.softplus(x["a"].double() + x["dt_bias"].double()))
    return g, torch.sigmoid(x["b"].double())


def _step64(S_kv, q, k, v, g, beta, scale):
    """FlashInfer-Bench's decode step in float64 on one head's [K, V] state."""
    old_state = g * S_kv
    old_v = k @ old_state
    new_v = beta * v + (1 - beta) * old_v
    S_kv = old_state - torch.outer(k, old_v) + torch.outer(k, new_v)
    return S_kv, scale * (q @ S_kv)


def decode64(x, scale):
    B, _, HQ, _ = x["q"].shape
    HV = x["v"].shape[2]
    g, beta = _gates64(x)
    out = torch.zeros(B, 1, HV, x["v"].shape[3], dtype=torch.float64)
    new = torch.zeros_like(x["state"], dtype=torch.float64)
    for n in range(B):
        for h in range(HV):
            hq = h // (HV // HQ)
            S_kv = x["state"][n, h].double().T  # k-last [V, K] -> [K, V]
            S_kv, o = _step64(S_kv, x["q"][n, 0, hq].double(), x["k"][n, 0, hq].double(), x["v"][n, 0, h].double(),
                              g[n, 0, h], beta[n, 0, h], scale)
            out[n, 0, h], new[n, h] = o, S_kv.T
    return {"output": out, "new_state": new}


def prefill64(x, scale):
    T, HQ, _ = x["q"].shape
    HV = x["v"].shape[1]
    g, beta = _gates64(x)
    cu = x["cu_seqlens"].tolist()
    out = torch.zeros(T, HV, x["v"].shape[2], dtype=torch.float64)
    new = torch.zeros_like(x["state"], dtype=torch.float64)
    for n in range(len(cu) - 1):
        for h in range(HV):
            hq = h // (HV // HQ)
            S_kv = x["state"][n, h].double().T
            for t in range(cu[n], cu[n + 1]):
                S_kv, out[t, h] = _step64(S_kv, x["q"][t, hq].double(), x["k"][t, hq].double(), x["v"][t, h].double(),
                                          g[t, h], beta[t, h], scale)
            new[n, h] = S_kv.T
    return {"output": out, "new_state": new}


def chunked64(q, k, v, g, beta, S0, scale, C, mma=lambda t: t):
    """The knowledge doc's chunked form for one head and one sequence, float64: q, k [T, K],
    v [T, V], g, beta [T], S0 [V, K] (k-last). Returns (outputs [T, V], final state [V, K]).
    `mma` rounds what a tensor-core kernel feeds its MMAs (S0, W, U, masked Q K^T, scaled K)."""
    S, outs = S0.clone(), []
    for c0 in range(0, q.shape[0], C):
        Q, Kc, Vc, b = q[c0:c0 + C], k[c0:c0 + C], v[c0:c0 + C], beta[c0:c0 + C]
        gamma = torch.log(g[c0:c0 + C]).cumsum(0)
        n = Q.shape[0]
        lower = torch.ones(n, n, dtype=torch.bool).tril()
        diff = gamma[:, None] - gamma[None, :]
        M = torch.where(lower, torch.exp(torch.where(lower, diff, torch.zeros_like(diff))), torch.zeros_like(diff))
        A = (b[:, None] * M * (Kc @ Kc.T)).tril(-1)
        Tinv = torch.linalg.inv(torch.eye(n, dtype=torch.float64) + A)
        Gam = torch.exp(gamma)
        W = mma(Tinv @ ((b * Gam)[:, None] * Kc))
        S_in = mma(S)
        U = mma(Tinv @ (b[:, None] * Vc) - W @ S_in.T)
        outs.append(scale * (Gam[:, None] * (Q @ S_in.T) + mma(M * (Q @ Kc.T)) @ U))
        S = Gam[-1] * S + U.T @ mma(torch.exp(gamma[-1] - gamma)[:, None] * Kc)
    return torch.cat(outs), S


def _small_prefill(name: str, total: int = 23, seqs: int = 3) -> tuple:
    task = get_task(name)
    axes = task.axis_values({"total_seq_len": total, "num_seqs": seqs, "len_cu_seqlens": seqs + 1})
    return task, axes, generate_inputs(task, axes, seed=7)


# ------------------------------------------------------------------ registry and definition

def test_registry_aliases_and_shape():
    for name in NAMES:
        task = get_task(name)
        assert task.op_family == "Gated DeltaNet" and task.baseline == "fla_gdn" and task.generator == "gdn"
        assert task.op_type == ("gdn_decode" if "decode" in name else "gdn_prefill")
        assert set(task.outputs) == {"output", "new_state"}
        assert task.inputs["state"].dtype == task.outputs["new_state"].dtype == "float32"
        assert task.scalars == {"scale": "1/sqrt(head_size)"}
        assert task.workloads_for("visible") and task.workloads_for("held_out")
    assert get_task("gdn_decode").name == NAMES[0] and get_task("gdn_prefill").name == NAMES[1]
    assert get_task(NAMES[2]).axes["num_v_heads"].value == 16
    prefill = get_task("gdn_prefill")
    assert prefill.features_for("sm_90a") == ["wgmma", "tma"] and get_task("gdn_decode").features_for("sm_90a") == ["tma"]
    held = prefill.workloads_for("held_out")
    assert any(w.axes["total_seq_len"] % CHUNK for w in held)  # a length no chunk size divides
    for w in prefill.workloads:
        assert w.axes["len_cu_seqlens"] == w.axes["num_seqs"] + 1
    assert {w.axes["batch_size"] for w in get_task("gdn_decode").workloads} >= {1, 4, 8, 16, 32, 64}
    assert list_backends(get_task("gdn_decode")) == ["fla:fused_recurrent"]
    assert list_backends(prefill) == ["fla:chunk", "fla:fused_recurrent"]


def test_flops_and_bytes():
    task = get_task("gdn_decode")
    axes = task.axis_values({"batch_size": 64})
    assert task.flop_count(axes) == 64 * 8 * 6 * 128 * 128
    state = 64 * 8 * 128 * 128 * 4
    assert 2 * state < task.min_bytes(axes) < 2 * state * 1.01  # the state read and written dominates


# ------------------------------------------------------------------ references

@pytest.mark.parametrize("name", [NAMES[0], NAMES[2]])
def test_decode_reference_matches_float64(name):
    task = get_task(name)
    axes = task.axis_values({"batch_size": 3})
    x = generate_inputs(task, axes, seed=3)
    got, want = run_reference(task, x), decode64(x, 1 / math.sqrt(128))
    for out in task.outputs:
        err = (got[out].double() - want[out]).abs().max() / want[out].abs().max()
        assert err < 1e-5, (out, float(err))


@pytest.mark.parametrize("name", [NAMES[1], NAMES[3]])
def test_prefill_reference_matches_float64(name):
    task, axes, x = _small_prefill(name)
    got, want = run_reference(task, x), prefill64(x, 1 / math.sqrt(128))
    for out in task.outputs:
        err = (got[out].double() - want[out]).abs().max() / want[out].abs().max()
        assert err < 1e-5, (out, float(err))


def test_chunked_form_equals_recurrence():
    """The doc's chunked formulas (chunks of 4 over 11 tokens: a partial last chunk) give the
    sequential recurrence's outputs and final state, including under strong decay."""
    task, axes, x = _small_prefill(NAMES[1], total=11, seqs=1)
    g, beta = _gates64(x)
    g = g.clone()
    g[3, 0] = 1e-30  # a near-total reset inside a chunk: exp(γ_i - γ_j) must be formed as a difference
    S_kv = x["state"][0, 0].double().T
    outs = []
    for t in range(11):
        S_kv, o = _step64(S_kv, x["q"][t, 0].double(), x["k"][t, 0].double(), x["v"][t, 0].double(), g[t, 0],
                          beta[t, 0], 0.125)
        outs.append(o)
    o, S = chunked64(x["q"][:, 0].double(), x["k"][:, 0].double(), x["v"][:, 0].double(), g[:, 0], beta[:, 0],
                     x["state"][0, 0].double(), 0.125, C=4)
    assert torch.allclose(o, torch.stack(outs), rtol=1e-9, atol=1e-10)
    assert torch.allclose(S, S_kv.T, rtol=1e-9, atol=1e-10)


# ------------------------------------------------------------------ inputs

def test_generator_ranges_and_boundaries():
    task = get_task("gdn_prefill")
    w = next(w for w in task.workloads if w.name == "T8192_N57")
    axes = task.axis_values(w)
    x = generate_inputs(task, axes, seed=1)
    for name in ("q", "k"):
        norms = x[name].float().norm(dim=-1)
        assert torch.allclose(norms, torch.ones_like(norms), atol=1e-2)
    g, beta = _gates64(x)
    # per head the decay rate is fixed: most g near 1 (long memory), some heads forget fast
    assert 0.0 < float(g.min()) and float(g.max()) <= 1.0 and 0.8 < float(g.median()) < 0.995
    assert float((g < 0.05).double().mean()) < 0.01
    assert 0.005 < float(beta.min()) and float(beta.max()) < 0.995
    cu = x["cu_seqlens"]
    lens = cu[1:] - cu[:-1]
    assert cu.dtype == torch.int64 and int(cu[0]) == 0 and int(cu[-1]) == 8192 and bool((lens > 0).all())
    assert bool((lens % CHUNK != 0).any())
    assert torch.equal(cu, generate_inputs(task, axes, seed=2)["cu_seqlens"])  # fixed per workload
    assert not torch.equal(x["v"], generate_inputs(task, axes, seed=2)["v"])  # values fresh per seed
    assert torch.equal(x["v"], generate_inputs(task, axes, seed=1)["v"])
    with pytest.raises(ValueError):
        cu_seqlens_for(3, 4)


def test_state_neither_explodes_nor_vanishes():
    """Over 400 tokens the state settles to a steady size: unit keys and beta < 1 make every
    update a contraction, fresh values keep it from dying out."""
    task, axes, x = _small_prefill(NAMES[1], total=400, seqs=1)
    x["state"] = x["state"][:, :2].contiguous()  # two heads keep this cheap
    x["v"], x["a"], x["b"] = x["v"][:, :2].contiguous(), x["a"][:, :2].contiguous(), x["b"][:, :2].contiguous()
    x["A_log"], x["dt_bias"] = x["A_log"][:2].contiguous(), x["dt_bias"][:2].contiguous()
    x["q"], x["k"] = x["q"][:, :1].contiguous(), x["k"][:, :1].contiguous()
    out = prefill64(x, 1 / math.sqrt(128))
    rms = out["new_state"].pow(2).mean().sqrt()
    assert 0.02 < float(rms) < 5.0, float(rms)
    assert out["output"][-50:].abs().mean() > 1e-3


# ------------------------------------------------------------------ tolerance

def _gate_after_update(x, scale):
    """Wrong: the decay applied after the delta-rule update, with the recall from the undecayed state."""
    g, beta = _gates64(x)
    HQ, HV = x["q"].shape[-2], x["v"].shape[-2]
    out, new = torch.zeros(x["v"].shape, dtype=torch.float64), torch.zeros(x["state"].shape, dtype=torch.float64)
    for n in range(x["state"].shape[0]):
        for h in range(HV):
            S = x["state"][n, h].double()
            k, q, v = x["k"][n, 0, h // (HV // HQ)].double(), x["q"][n, 0, h // (HV // HQ)].double(), x["v"][n, 0, h].double()
            S = g[n, 0, h] * (S + torch.outer(beta[n, 0, h] * (v - S @ k), k))
            out[n, 0, h], new[n, h] = scale * (S @ q), S
    return {"output": out, "new_state": new}


def test_tolerance_rejects_gate_after_update_and_accepts_bf16_output():
    task = get_task("gdn_decode")
    x = generate_inputs(task, task.axis_values({"batch_size": 4}), seed=5)
    ref = run_reference(task, x)
    wrong = _gate_after_update(x, 1 / math.sqrt(128))
    assert not compare("new_state", wrong["new_state"].float(), ref["new_state"], task.tolerance).passed
    right = decode64(x, 1 / math.sqrt(128))
    for out in task.outputs:  # float64 truth, output rounded to bf16 as a kernel writes it
        got = right[out].to(torch.bfloat16 if out == "output" else torch.float32)
        assert compare(out, got, ref[out], task.tolerance).passed, out


def test_prefill_tolerance_admits_a_bf16_chunked_kernel_and_rejects_decay_after_update():
    """The calibration behind the prefill bounds (tasks/families/gdn.py): a tensor-core kernel's bf16
    operands stay well inside them, the wrong gate order lands far outside."""
    task, axes, x = _small_prefill(NAMES[1], total=300, seqs=1)
    g, beta = _gates64(x)
    scale = 1 / math.sqrt(128)
    bf16 = lambda t: t.to(torch.bfloat16).double()  # noqa: E731
    for h in (0, 5):
        hq = h // 2
        q, k, v, S0 = x["q"][:, hq].double(), x["k"][:, hq].double(), x["v"][:, h].double(), x["state"][0, h].double()
        S, truth, Sw, wrong = S0.T.clone(), [], S0.clone(), []
        for t in range(300):
            S, o = _step64(S, q[t], k[t], v[t], g[t, h], beta[t, h], scale)
            truth.append(o)
            Sw = g[t, h] * (Sw + torch.outer(beta[t, h] * (v[t] - Sw @ k[t]), k[t]))
            wrong.append(scale * (Sw @ q[t]))
        o, S_end = chunked64(q, k, v, g[:, h], beta[:, h], S0, scale, C=CHUNK, mma=bf16)
        ref = {"output": torch.stack(truth).float(), "new_state": S.T.float()}
        assert compare("output", bf16(o).float(), ref["output"], task.tolerance).passed
        assert compare("new_state", S_end.float(), ref["new_state"], task.tolerance).passed
        assert not compare("output", torch.stack(wrong).float(), ref["output"], task.tolerance).passed
        assert not compare("new_state", Sw.float(), ref["new_state"], task.tolerance).passed


# ------------------------------------------------------------------ what a model is shown

@pytest.mark.parametrize("name", NAMES)
def test_describe_and_example_manifest(name):
    task = get_task(name)
    text = render_task(task, "sm_90a")
    assert "l2-normalised" in text and "k-last" in text and "flash-linear-attention" in text
    assert all(f"`{w.name}`" not in text for w in task.workloads_for("held_out"))
    for arch in ("sm_90a", "sm_100a"):
        manifest = LaunchManifest.model_validate(example_manifest(task, arch))
        for w in task.workloads:
            plan_launches(manifest, task, task.axis_values(w), NOMINAL_LIMITS[arch])
