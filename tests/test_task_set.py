"""Every PTXBench problem as a task (issue 27): the 16 more GEMM shapes with their M workloads,
the causal head-dimension variants (attention forward and backward, FP8 attention), GDN MTP;
their references against float64 math, the shared simple solutions, task groups
(`gemm:*`, `attention:causal`, `ptxbench:all`) and the train / held_out_tasks split.
All of it cheap on CPU: small batch and head counts, a few hundred ms in all."""
from __future__ import annotations

import math
import os
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tasks import TASKS, UnknownTask, get_task, select_many, select_tasks, task_split
from tasks.families.baselines import list_backends
from tasks.families.gemm import GEMM_REFERENCE, GEMM_SHAPES
from tasks.generators import generate_inputs
from tasks.reference import run_reference
from tasks.registry import HELD_OUT_TASKS
from tasks.schema import Task
from tools.correctness import compare

ROOT = Path(__file__).resolve().parents[1] / "tasks"

NEW_GEMM = [f"gemm_n{n}_k{k}" for n, k in GEMM_SHAPES]
NEW_CAUSAL = ["mha_fwd_d64_causal", "mha_fwd_d96_causal", "mha_fwd_d256_causal", "mha_bwd_d64_causal",
              "mha_bwd_d96_causal", "fp8_mha_with_lse_d64_causal", "fp8_mha_with_lse_d96_causal",
              "fp8_mha_with_lse_d256_causal"]
MTP = ["gdn_mtp_qk4_v8_d128_k_last", "gdn_mtp_qk8_v16_d128_k_last"]


def small(name: str, **consts: int) -> Task:
    """A copy of a task with some const axes made small, for CPU."""
    task = get_task(name)
    for axis, value in consts.items():
        task.axes[axis].value = value
    return task


# ------------------------------------------------------------------ the problem set

def test_every_ptxbench_problem_is_a_task():
    assert len(NEW_GEMM) == 16 and set(NEW_GEMM + NEW_CAUSAL + MTP) <= set(TASKS)
    assert len(TASKS) == 21 + 16 + 8 + 2
    # PTXBench's problem set, by name (its fp8 GEMM and the four fp8/bf16 attention head dims included)
    for d in (64, 96, 128, 256):
        assert {f"mha_fwd_d{d}", f"mha_fwd_d{d}_causal", f"fp8_mha_with_lse_d{d}",
                f"fp8_mha_with_lse_d{d}_causal"} <= set(TASKS)
    for d in (64, 96, 128):
        assert {f"mha_bwd_d{d}", f"mha_bwd_d{d}_causal"} <= set(TASKS)
    for stage in ("decode", "prefill", "mtp"):
        assert {f"gdn_{stage}_qk4_v8_d128_k_last", f"gdn_{stage}_qk8_v16_d128_k_last"} <= set(TASKS)


def test_gemm_shapes_carry_ptxbench_m_workloads():
    assert GEMM_SHAPES[(128, 2048)] == (93, 289, 492, 952, 8828) and GEMM_SHAPES[(256, 7168)] == (80, 901)
    for (n, k), ms in GEMM_SHAPES.items():
        t = get_task(f"gemm_n{n}_k{k}")
        assert t.axis_values({"M": 1}) == {"M": 1, "N": n, "K": k} and t.reference == GEMM_REFERENCE
        assert (t.op_type, t.baseline, t.flops, t.family) == ("gemm", "cublas", "2*M*N*K", "gemm_n7168_k5120")
        assert [w.axes["M"] for w in t.workloads_for("visible")] == [max(ms)]  # PTXBench's problem file's M
        assert sorted(w.axes["M"] for w in t.workloads_for("held_out")) == sorted(ms)[:-1]
        assert t.tolerance == get_task("gemm").tolerance and t.requested_features == get_task("gemm").requested_features
    seed = get_task("gemm")  # unchanged
    assert [w.axes["M"] for w in seed.workloads] == [8192, 4096, 1024, 8000, 70] and "seed" in seed.tags


def test_causal_variants_are_held_out_variants_of_the_causal_seeds():
    for name in NEW_CAUSAL:
        t = get_task(name)
        assert {"causal", "held_out_variant"} <= set(t.tags)
        seed = re.sub(r"_d\d+_causal$", "_d128_causal", name)
        assert t.family == seed and seed in TASKS and t.op_type == TASKS[seed].op_type
        assert t.flops == TASKS[seed].flops and t.baseline == TASKS[seed].baseline
        if t.op_type == "mha_bwd":  # O and LSE come from the forward task of the same variant
            assert t.generator == f"stress_with_forward:{name.replace('bwd', 'fwd')}"


def _attention64(q, k, v, scale, causal):
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-1], s.shape[-1], dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


@pytest.mark.parametrize("name", [n for n in NEW_CAUSAL if n.startswith("mha_fwd")])
def test_causal_forward_references_match_float64(name):
    t = small(name, B=1, H=2)
    x = generate_inputs(t, {"S": 37}, seed=5)
    out = run_reference(t, x)
    o64, lse64 = _attention64(*(x[n].double() for n in "QKV"), 1 / math.sqrt(t.axes["D"].value), True)
    # fp32 against float64 on stress inputs (scores in the hundreds): the summation order, which
    # the CPU's matmul picks by the buffers' alignment, moves O by up to ~7e-5 from run to run
    # (seen 2 in 15 runs at 1e-5); a wrong mask or scale moves it by O(1)
    torch.testing.assert_close(out["O"].double(), o64, rtol=1e-4, atol=2e-4)
    torch.testing.assert_close(out["LSE"].double(), lse64, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("name", [n for n in NEW_CAUSAL if n.startswith("mha_bwd")])
def test_causal_backward_references_match_float64_autograd(name):
    t = small(name, B=1, H=2)
    x = generate_inputs(t, {"S": 29}, seed=11)
    q, k, v = (x[n].double().requires_grad_(True) for n in "QKV")
    o64, lse64 = _attention64(q, k, v, 1 / math.sqrt(t.axes["D"].value), True)
    grads = torch.autograd.grad(o64, (q, k, v), x["dO"].double())
    out = run_reference(t, {**x, "O": o64.detach(), "LSE": lse64.detach()})
    for got, want in zip((out["dQ"], out["dK"], out["dV"]), grads):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", [n for n in NEW_CAUSAL if n.startswith("fp8")])
def test_causal_fp8_references_match_float64(name):
    t = small(name, B=1, H=2)
    x = generate_inputs(t, {"L": 41}, seed=3)
    out = run_reference(t, x)
    q, k, v = (x[n].double() * x[f"descale_{n.lower()}"].double().reshape(()) for n in "QKV")
    o64, lse64 = _attention64(q, k, v, 1 / math.sqrt(t.axes["D"].value), True)
    torch.testing.assert_close(out["O"].double(), o64, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out["LSE"].double(), lse64, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------ GDN MTP

def _mtp64(x, scale):
    """FlashInfer-Bench's gdn_mtp reference, in float64: per sequence, its pool slot transposed to
    [value head, K, V], then per token and head old_state = g S; old_v = k old_state;
    new_v = beta v + (1 - beta) old_v; S = old_state - k old_v^T + k new_v^T; o = scale q S."""
    B, T, HQ, _ = x["q"].shape
    HV = x["v"].shape[2]
    g = torch.exp(-torch.exp(x["A_log"].double()) * F.softplus(x["a"].double() + x["dt_bias"].double()))
    beta = torch.sigmoid(x["b"].double())
    out = torch.zeros(B, T, HV, x["v"].shape[3], dtype=torch.float64)
    heads = torch.arange(HV) // (HV // HQ)  # the query/key head of each value head
    for n in range(B):
        state = x["initial_state"][int(x["initial_state_indices"][n])].double().transpose(-1, -2)  # [HV, K, V]
        for t in range(T):
            q, k, v = x["q"][n, t, heads].double(), x["k"][n, t, heads].double(), x["v"][n, t].double()
            gt, bt = g[n, t, :, None], beta[n, t, :, None]
            old_state = gt[..., None] * state
            old_v = torch.einsum("hk,hkv->hv", k, old_state)
            new_v = bt * v + (1 - bt) * old_v
            state = old_state - torch.einsum("hk,hv->hkv", k, old_v) + torch.einsum("hk,hv->hkv", k, new_v)
            out[n, t] = scale * torch.einsum("hk,hkv->hv", q, state)
    return out


def _mtp_inputs(name: str, batch: int = 2, pool: int = 5, seed: int = 7):
    t = get_task(name)
    axes = t.axis_values({"batch_size": batch, "pool_size": pool})
    return t, axes, generate_inputs(t, axes, seed=seed)


def test_mtp_definition():
    for name in MTP:
        t = get_task(name)
        assert t.op_type == "gdn_mtp" and t.op_family == "Gated DeltaNet" and t.generator == "gdn"
        assert t.axes["seq_len"].value == 4 and [a for a, ax in t.axes.items() if ax.type == "var"] == \
            ["batch_size", "pool_size"]
        assert t.inputs["initial_state"].shape == ["pool_size", "num_v_heads", "head_size", "head_size"]
        assert (t.inputs["initial_state"].dtype, t.inputs["initial_state_indices"].dtype) == ("float32", "int32")
        assert list(t.outputs) == ["output"] and t.outputs["output"].dtype == "bfloat16"
        assert t.features_for("sm_90a") == ["wgmma", "tma"] and list_backends(t) == ["fla:fused_recurrent"]
        assert {w.axes["batch_size"] for w in t.workloads} >= {1, 4, 8, 16, 32, 48}
        assert all(w.axes["pool_size"] >= w.axes["batch_size"] for w in t.workloads)
    t = get_task("gdn_mtp")
    assert t.name == MTP[0]
    # Bytes count the batch's pool slots only: one slot of 8 heads x 64 KB, not the 49 of the pool.
    axes = t.axis_values({"batch_size": 1, "pool_size": 49})
    slot = 8 * 128 * 128 * 4
    assert slot < t.input_bytes(axes) < slot * 1.05 and t.flop_count(axes) == 4 * 8 * 4 * 128 * 128


@pytest.mark.parametrize("name", MTP)
def test_mtp_reference_matches_float64(name):
    t, axes, x = _mtp_inputs(name)
    pool = x["initial_state"].clone()
    out = run_reference(t, x)
    assert out["output"].dtype == torch.float32 and torch.equal(x["initial_state"], pool)  # the pool is read only
    torch.testing.assert_close(out["output"].double(), _mtp64(x, t.scalar_values(axes)["scale"]), rtol=1e-4, atol=1e-5)


def test_mtp_is_decode_step_by_step_from_the_pool_slot():
    mtp, axes, x = _mtp_inputs(MTP[0], batch=2, pool=5)
    decode = get_task("gdn_decode_qk4_v8_d128_k_last")
    state = x["initial_state"][x["initial_state_indices"].long()]
    outs = []
    for t in range(axes["seq_len"]):
        step = {n: x[n][:, t:t + 1] for n in ("q", "k", "v", "a", "b")}
        got = run_reference(decode, {**step, "state": state, "A_log": x["A_log"], "dt_bias": x["dt_bias"]})
        outs.append(got["output"])
        state = got["new_state"]
    torch.testing.assert_close(run_reference(mtp, x)["output"], torch.cat(outs, dim=1), rtol=1e-6, atol=1e-6)


def test_mtp_generator_draws_distinct_slots_of_the_pool():
    t, axes, x = _mtp_inputs(MTP[0], batch=6, pool=9)
    idx = x["initial_state_indices"]
    assert idx.dtype == torch.int32 and len(set(idx.tolist())) == 6 and 0 <= int(idx.min()) and int(idx.max()) < 9
    draws = {tuple(generate_inputs(t, axes, seed=s)["initial_state_indices"].tolist()) for s in range(3)}
    assert len(draws) > 1  # fresh per draw: no kernel can hard-wire the routing
    assert torch.allclose(x["q"].float().norm(dim=-1), torch.ones(1), atol=1e-2)


def test_mtp_tolerance_accepts_bf16_output_and_rejects_wrong_kernels():
    t, axes, x = _mtp_inputs(MTP[0], batch=4, pool=9)
    ref = run_reference(t, x)["output"]
    assert compare("output", ref.to(torch.bfloat16).float(), ref, t.tolerance).passed
    # slot n instead of the slot initial_state_indices[n] names
    wrong = run_reference(t, {**x, "initial_state_indices": torch.arange(4, dtype=torch.int32)})["output"]
    assert not compare("output", wrong, ref, t.tolerance).passed
    # the state committed between verification calls (run twice from the updated state): a second run's
    # outputs are not the first's -- here emulated by skipping the first token's update
    skip = {**x, "b": x["b"].clone()}
    skip["b"][:, 0] = -30.0  # beta ~ 0: the first token writes nothing
    assert not compare("output", run_reference(t, skip)["output"], ref, t.tolerance).passed


# ------------------------------------------------------------------ simple solutions, shared

def test_new_tasks_share_their_family_simple_kernels():
    seed_gemm = (ROOT / "gemm_n7168_k5120" / "simple").resolve()
    for name in NEW_GEMM:  # one SIMT GEMM reads M, N, K from its arguments: linked, not copied
        assert (ROOT / name / "simple").is_symlink() and (ROOT / name / "simple").resolve() == seed_gemm
    for kind in ("decode", "prefill", "mtp"):  # head counts are arguments: qk8_v16 links to qk4_v8's folder
        qk4, qk8 = (ROOT / f"gdn_{kind}_{heads}_d128_k_last" / "simple" for heads in ("qk4_v8", "qk8_v16"))
        assert qk8.is_symlink() and qk8.resolve() == qk4.resolve()
        assert "num_q_heads" in (qk4 / "launch.json").read_text()
    for name in NEW_CAUSAL:  # head dim and mask are template arguments: the non-causal source, its causal kernels
        base = ROOT / name.removesuffix("_causal") / "simple"
        mine = ROOT / name / "simple"
        assert (mine / "kernel.cu").resolve() == (base / "kernel.cu").resolve()
        # every kernel's causal instance, but Delta's (rowsum(dO * O) knows no mask)
        causal = re.sub(r'"kernel": "(?!attn_bwd_delta)(\w+)"', r'"kernel": "\1_causal"', (base / "launch.json").read_text())
        assert (mine / "launch.json").read_text() == causal
    assert not [p for p in ROOT.glob("*/simple") if os.path.islink(p) and not p.exists()]  # no dangling link


# ------------------------------------------------------------------ groups and splits

def test_task_groups():
    assert select_tasks("gemm:*") == ["gemm_n7168_k5120"] + NEW_GEMM == select_tasks("gemm:all")
    causal = select_tasks("attention:causal")
    assert set(causal) == {"mha_fwd_d128_causal", "mha_bwd_d128_causal", *[n for n in NEW_CAUSAL if n.startswith("mha")]}
    assert select_tasks("ptxbench:all") == list(TASKS)
    assert set(select_tasks("fp8_attention:causal")) == {"fp8_mha_with_lse_d128_causal",
                                                         *[n for n in NEW_CAUSAL if n.startswith("fp8")]}
    assert select_tasks("gdn:mtp") == MTP and select_tasks("attn_fwd") == ["mha_fwd_d128"]
    assert select_many(["gemm:seed", "gemm", "attention_bwd:causal"]) == ["gemm_n7168_k5120", "mha_bwd_d128_causal",
                                                                          "mha_bwd_d64_causal", "mha_bwd_d96_causal"]
    with pytest.raises(UnknownTask, match="families are gemm"):
        select_tasks("gemmm:*")
    with pytest.raises(UnknownTask, match="selects no task; selectors"):
        select_tasks("gemm:causal")


def test_splits_hold_out_whole_tasks():
    held = set(select_tasks("ptxbench:held_out_tasks"))
    assert held == set(HELD_OUT_TASKS) and held | set(select_tasks("ptxbench:train")) == set(TASKS)
    assert {n for n in TASKS if "_d96" in n} <= held  # every d96 task
    assert set(NEW_CAUSAL) <= held  # the causal head-dimension variants
    assert 3 <= len(held & set(NEW_GEMM)) < len(NEW_GEMM)  # some GEMM shapes, not all
    assert not {n for n, t in TASKS.items() if "seed" in t.tags} & held  # seed tasks train
    assert task_split("gdn_mtp_qk8_v16_d128_k_last") == "held_out_tasks" and task_split("gemm") == "train"


# ------------------------------------------------------------------ groups in sweeps, reports and Fixit

def test_sweep_over_gemm_group_gives_a_family_report(tmp_path):
    """A scripted model answering every GEMM shape with prose only (cheap: nothing to compile): one run
    per shape, and the report pools them into one GEMM row, and one per split."""
    from agent_loop_helpers import NO_CODE, write_script

    from agent.report import write_report
    from agent.sweep import SweepConfig, expand, run_sweep

    model = write_script(tmp_path / "prose.json", [NO_CODE])
    cfg = SweepConfig(name="fam", models=[{"spec": model, "name": "prose"}], tasks=["gemm:*"], contexts=["none"],
                      replicas=1, budget={"max_turns": 1}, runs_dir=str(tmp_path / "runs"), concurrency=4)
    assert [r.task for r in expand(cfg)] == select_tasks("gemm:*")
    result = run_sweep(cfg)
    assert (result.total, result.failed) == (17, 0)
    report = write_report([tmp_path / "runs"], tmp_path / "report", [1])
    (gemm,) = report.families
    assert gemm.key[1] == "GEMM" and gemm.runs == 17
    assert (gemm.metrics["compiled"].n, gemm.metrics["fast_1"].successes, gemm.metrics["fast_1"].n) == (17, 0, 17)
    assert {r.key[1]: r.runs for r in report.splits} == {"GEMM / held_out_tasks": 5, "GEMM / train": 12}
    md = report.files["md"].read_text()
    assert "## Per task family, turn limit 1" in md and "| family |" in md and "GEMM / held_out_tasks" in md
    assert report.files["families_csv"].exists()
    held = write_report([tmp_path / "runs"], tmp_path / "held", [1], tasks=["ptxbench:held_out_tasks"])
    assert held.runs == 5 and {r.key[1] for r in held.rows} == {n for n in select_tasks("gemm:*") if n in HELD_OUT_TASKS}


def test_fixit_build_split_train_leaves_held_out_tasks_out(tmp_path):
    from trajectory_fixtures import eval_result, kernel, reply_for, write_run

    from agent.fixit.build import BuildOptions, build

    def sample(kind, tag, task):
        s = kernel(tag)
        return (s, eval_result(kind, task=task), reply_for(s, f"Reasoning for {tag}."))

    for name, task in (("a", "gemm_n5120_k5120"), ("b", "gemm_n4096_k4096")):  # a train task, a held-out one
        write_run(tmp_path / "runs", name, [[sample("compile", name + "1", task)], [sample("unverified", name + "2", task)]],
                  task=task, evaluation="skipped: no GPU")
    both = build([tmp_path / "runs"], tmp_path / "all", BuildOptions())
    train = build([tmp_path / "runs"], tmp_path / "train", BuildOptions(split="train"))
    assert set(both.card["by_task"]) == {"gemm_n5120_k5120", "gemm_n4096_k4096"}
    assert set(train.card["by_task"]) == {"gemm_n5120_k5120"} and train.card["options"]["split"] == "train"
