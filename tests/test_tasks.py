"""Tasks: definitions, aliases, Definition JSON loading, input generators, fp32 references
(checked against float64 math and float64 autograd), the tolerance criterion (checked with
emulated FlashAttention-style kernels, right and wrong), what a model is told, `agent tasks`."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
import typer
from typer.testing import CliRunner

from tasks import ALIASES, TASKS, UnknownTask, get_task, list_tasks, missing_workloads_reason
from tasks.describe import example_manifest, render_task
from tasks.families.gemm import gemm_task
from tasks.generators import generate_inputs
from tasks.stress import OUTLIER_PROB
from tasks.reference import reference_function, run_reference, term_scales
from tasks.schema import Task
from tools.launch import NOMINAL_LIMITS, plan_launches
from tools.solution import LaunchManifest

SEED_TASKS = {"gemm_n7168_k5120", "mha_fwd_d128", "mha_fwd_d128_causal", "mha_bwd_d128", "mha_bwd_d128_causal"}
VARIANTS = {"mha_fwd_d64", "mha_fwd_d96", "mha_fwd_d256", "mha_bwd_d64", "mha_bwd_d96", "mha_bwd_d256"}
# PTXBench's other problems in these families (tests/test_task_set.py): a few for the statement checks
PTXBENCH_MORE = {"mha_fwd_d64_causal", "mha_fwd_d256_causal", "mha_bwd_d96_causal", "gemm_n128_k2048",
                 "gemm_n256_k7168", "gemm_n34816_k5120"}


def small(task: Task, B: int = 1, H: int = 3) -> Task:
    """A copy of an attention task with few heads, for CPU."""
    task = task.model_copy(deep=True)
    task.axes["B"].value, task.axes["H"].value = B, H
    return task


def causal_keep(S: int) -> torch.Tensor:
    return torch.ones(S, S, dtype=torch.bool).tril()


# ------------------------------------------------------------------ registry

def test_seed_tasks_variants_and_aliases():
    # the GEMM and bf16-attention families; the other families have their own tests (e.g. tests/test_gdn.py)
    assert SEED_TASKS | VARIANTS <= set(TASKS)
    assert ALIASES.items() >= {"gemm": "gemm_n7168_k5120", "attn_fwd": "mha_fwd_d128",
                               "attn_fwd_causal": "mha_fwd_d128_causal", "attn_bwd": "mha_bwd_d128",
                               "attn_bwd_causal": "mha_bwd_d128_causal"}.items()
    for alias, name in ALIASES.items():
        assert get_task(alias).name == name
    for t in list_tasks():
        if t.name not in SEED_TASKS | VARIANTS:
            continue
        assert t.requested_features == {"sm_90a": ["wgmma", "tma"], "sm_100a": ["tcgen05_mma", "tmem", "tma"]}
        assert len(t.workloads_for("visible")) == 1 and t.workloads_for("held_out")
    for name in VARIANTS:
        t = get_task(name)
        assert "held_out_variant" in t.tags and t.family == name[:8] + "d128" and "causal" not in name
    seeds = [t.name for t in list_tasks(include_variants=False)]
    assert SEED_TASKS <= set(seeds) and not VARIANTS & set(seeds)
    assert "held_out_variant" in list_tasks()[-1].tags  # seed tasks first


def test_seed_shapes_flops_and_baselines():
    g = get_task("gemm")
    assert g.axis_values({"M": 8192}) == {"M": 8192, "N": 7168, "K": 5120}
    assert g.flop_count({"M": 8192, "N": 7168, "K": 5120}) == 2 * 8192 * 7168 * 5120
    assert g.shape("A", g.axis_values({"M": 70})) == (70, 5120) and g.baseline == "cublas"
    held = [w.axes["M"] for w in g.workloads_for("held_out")]
    assert set(held) == {4096, 1024, 8000, 70} and g.workloads_for("visible")[0].axes == {"M": 8192}
    f, fc = get_task("attn_fwd"), get_task("attn_fwd_causal")
    axes = f.axis_values({"S": 4096})
    assert axes == {"B": 4, "H": 48, "S": 4096, "D": 128}
    assert f.flop_count(axes) == 4 * 4 * 48 * 4096**2 * 128 == 2 * fc.flop_count(axes)
    assert get_task("attn_bwd").flop_count(axes) == 2.5 * f.flop_count(axes)
    assert get_task("attn_bwd_causal").flop_count(axes) == 2.5 * fc.flop_count(axes)
    assert f.scalar_values(axes)["sm_scale"] == pytest.approx(1 / math.sqrt(128))
    assert f.shape("LSE", axes) == (4, 48, 4096) and f.outputs["LSE"].dtype == "float32"
    assert (f.baseline, get_task("attn_bwd").baseline) == ("sdpa_fwd", "sdpa_bwd")
    held = {w.axes["S"] for w in f.workloads_for("held_out")}
    assert any(s % 128 for s in held) and min(held) < 128 and max(held) > 4096
    assert get_task("mha_bwd_d64").shape("dQ", {"B": 4, "H": 48, "S": 1024, "D": 64}) == (4, 48, 1024, 64)


def test_get_task_returns_a_copy():
    t = get_task("gemm")
    t.workloads.clear()
    assert get_task("gemm").workloads


def test_unknown_task_suggests_close_names():
    with pytest.raises(UnknownTask) as exc:
        get_task("atn_fwd")
    msg = str(exc.value)
    assert "\n" not in msg and "attn_fwd" in msg and isinstance(exc.value, ValueError)
    with pytest.raises(UnknownTask, match="known: gemm"):
        get_task("zzzzzz")
    with pytest.raises(UnknownTask, match="does not exist"):
        get_task("/nonexistent/definition.json")


# ------------------------------------------------------------------ FlashInfer-Bench Definition JSON

PLAIN_GEMM = {  # a FlashInfer-Bench Definition: no ptxbench extensions
    "name": "gemm_n64_k48", "description": "C = A @ B.T", "op_type": "gemm", "tags": ["status:reference"],
    "axes": {"M": {"type": "var"}, "N": {"type": "const", "value": 64}, "K": {"type": "const", "value": 48}},
    "inputs": {"A": {"shape": ["M", "K"], "dtype": "bfloat16"}, "B": {"shape": ["N", "K"], "dtype": "bfloat16"}},
    "outputs": {"C": {"shape": ["M", "N"], "dtype": "bfloat16"}},
    "reference": "import torch\n\ndef run(A, B):\n    C = torch.matmul(A, B.T)\n    return C",
}


def test_plain_definition_loads_with_defaults(tmp_path):
    path = tmp_path / "gemm_n64_k48.json"
    path.write_text(json.dumps(PLAIN_GEMM))
    t = get_task(str(path))
    assert t.name == "gemm_n64_k48" and t.workloads == [] and t.requested_features == {}
    assert (t.tolerance.rtol, t.tolerance.atol, t.tolerance.scale, t.baseline) == (1e-2, 1e-2, "ref", "none")
    reason = missing_workloads_reason(t, "visible")
    assert "defines no workloads" in reason and "M" in reason
    # it still runs: the generator and the foreign reference (which computes in fp32 from widened inputs)
    x = generate_inputs(t, {"M": 5}, seed=1)
    out = run_reference(t, x)
    assert out["C"].dtype == torch.float32
    torch.testing.assert_close(out["C"].double(), x["A"].double() @ x["B"].double().T, rtol=1e-5, atol=1e-5)


def test_definition_scalars_and_workloads(tmp_path):
    d = {
        "name": "toy_attention", "op_type": "toy",
        "axes": {"S": {"type": "var"}, "head_dim": {"type": "const", "value": 64}},
        "inputs": {"q": {"shape": ["S", "head_dim"], "dtype": "bfloat16"},
                   "sm_scale": {"shape": None, "dtype": "float32", "description": "softmax scale"}},
        "outputs": {"o": {"shape": ["S", "head_dim"], "dtype": "bfloat16"}},
        "reference": ["import torch", "def run(q, sm_scale):", "    return q * sm_scale"],
        "workloads": [{"axes": {"S": 7}}, {"workload": {"uuid": "w-1", "axes": {"S": 9}}, "split": "held_out"}],
    }
    path = tmp_path / "toy.json"
    path.write_text(json.dumps(d))
    t = get_task(path)
    assert t.scalars == {"sm_scale": "1/sqrt(head_dim)"} and list(t.inputs) == ["q"]
    assert [(w.name, w.axes, w.split) for w in t.workloads] == [("S7", {"S": 7}, "visible"),
                                                                ("w-1", {"S": 9}, "held_out")]
    x = generate_inputs(t, {"S": 7}, seed=0)
    torch.testing.assert_close(run_reference(t, x)["o"], x["q"].float() / 8)

    d["inputs"]["alpha"] = {"shape": None, "dtype": "float32"}
    path.write_text(json.dumps(d))
    with pytest.raises(UnknownTask, match="scalar input 'alpha' has no value"):
        get_task(path)
    d["scalars"] = {"alpha": "2.0"}
    path.write_text(json.dumps(d))
    assert get_task(path).scalars["alpha"] == "2.0"
    path.write_text("{not json")
    with pytest.raises(UnknownTask, match="not a readable JSON"):
        get_task(path)
    path.write_text(json.dumps({"name": "x"}))
    with pytest.raises(UnknownTask, match="not a valid Definition"):
        get_task(path)


def test_own_task_round_trips_through_json(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(get_task("attn_bwd_causal").model_dump_json())
    assert get_task(path) == get_task("attn_bwd_causal")


# ------------------------------------------------------------------ generators

def test_stress_distribution_and_seeding():
    t = gemm_task(n=1024, k=1024)
    x = generate_inputs(t, {"M": 2048}, seed=7)
    a = torch.cat([x["A"].float().flatten(), x["B"].float().flatten()])  # 3M samples
    assert x["A"].dtype == torch.bfloat16 and x["A"].shape == (2048, 1024) and x["A"].is_contiguous()
    # |x| > 5 is almost only outliers: P = 1e-3 * P(|N(0, 100)| > 5) + P(|N(0, 1)| > 5)
    expected = OUTLIER_PROB * math.erfc(5 / (10 * math.sqrt(2))) + math.erfc(5 / math.sqrt(2))
    assert abs((a.abs() > 5).float().mean().item() / expected - 1) < 0.1
    assert a.std().item() == pytest.approx(math.sqrt(1 + 100 * OUTLIER_PROB), rel=0.02)
    assert abs(a.mean().item()) < 0.01 and a.abs().max().item() > 30  # outliers reach far
    again = generate_inputs(t, {"M": 2048}, seed=7)
    other = generate_inputs(t, {"M": 2048}, seed=8)
    assert torch.equal(x["A"], again["A"]) and torch.equal(x["B"], again["B"])
    assert not torch.equal(x["A"], other["A"]) and not torch.equal(x["A"], x["B"][:, :1024].repeat(2, 1))


def test_backward_inputs_are_consistent_with_the_forward():
    t = small(get_task("attn_bwd_causal"))
    x = generate_inputs(t, {"S": 33}, seed=3)
    assert set(x) == {"Q", "K", "V", "O", "dO", "LSE"} and x["LSE"].dtype == torch.float32
    fwd = run_reference(small(get_task("attn_fwd_causal")), {n: x[n] for n in "QKV"})
    assert torch.equal(x["O"], fwd["O"].to(torch.bfloat16)) and torch.equal(x["LSE"], fwd["LSE"])
    assert not torch.equal(x["dO"], x["Q"])
    with pytest.raises(ValueError, match="unknown input generator"):
        generate_inputs(t.model_copy(update={"generator": "uniform"}), {"S": 8}, seed=0)


# ------------------------------------------------------------------ references vs float64

def _attention64(q, k, v, scale, causal):
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(~causal_keep(s.shape[-1]), float("-inf"))
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


def test_gemm_reference_matches_float64():
    t = gemm_task(n=80, k=72)
    x = generate_inputs(t, {"M": 13}, seed=2)
    out = run_reference(t, x)
    assert set(out) == {"C"} and out["C"].dtype == torch.float32 and out["C"].shape == (13, 80)
    torch.testing.assert_close(out["C"].double(), x["A"].double() @ x["B"].double().T, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("name", ["mha_fwd_d128", "mha_fwd_d128_causal", "mha_fwd_d64", "mha_fwd_d96",
                                  "mha_fwd_d256"])
def test_forward_reference_matches_float64(name):
    t = small(get_task(name))
    x = generate_inputs(t, {"S": 37}, seed=5)
    out = run_reference(t, x)
    o64, lse64 = _attention64(*(x[n].double() for n in "QKV"), 1 / math.sqrt(t.axes["D"].value), "causal" in name)
    assert out["O"].dtype == out["LSE"].dtype == torch.float32
    torch.testing.assert_close(out["O"].double(), o64, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out["LSE"].double(), lse64, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("name", ["mha_bwd_d128", "mha_bwd_d128_causal", "mha_bwd_d96", "mha_bwd_d256"])
def test_backward_reference_matches_float64_autograd(name):
    t = small(get_task(name))
    x = generate_inputs(t, {"S": 29}, seed=11)
    causal = "causal" in name
    scale = 1 / math.sqrt(t.axes["D"].value)
    q, k, v = (x[n].double().requires_grad_(True) for n in "QKV")
    o64, lse64 = _attention64(q, k, v, scale, causal)
    dq, dk, dv = torch.autograd.grad(o64, (q, k, v), x["dO"].double())
    # Give the reference the exact O and LSE so that only its own (fp32) arithmetic is measured.
    out = run_reference(t, {**x, "O": o64.detach(), "LSE": lse64.detach()})
    for got, want in ((out["dQ"], dq), (out["dK"], dk), (out["dV"], dv)):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["mha_fwd_d128_causal", "mha_bwd_d128_causal"])
def test_reference_chunking_over_heads(name):
    """At S=8192 the references process a few heads at a time; force that at small S and compare."""
    t = small(get_task(name), B=2, H=3)
    x = generate_inputs(t, {"S": 16}, seed=4)
    whole = run_reference(t, x)
    chunked = t.model_copy(update={"reference": t.reference.replace("2**28 // (S * S)", "2**9 // (S * S)")})
    assert chunked.reference != t.reference
    assert "step = max(1, 2**9 // (S * S))" in chunked.reference  # 2 heads per chunk, 3 chunks
    for n, value in run_reference(chunked, x).items():
        torch.testing.assert_close(value, whole[n], rtol=1e-6, atol=1e-6)


def test_reference_is_compiled_once_and_checked():
    t = get_task("gemm")
    assert reference_function(t) is reference_function(get_task("gemm"))
    bad = gemm_task(n=8, k=8).model_copy(update={"reference": "def run(A, B):\n    return {'D': A}\n"})
    with pytest.raises(Exception, match="returned no C"):
        run_reference(bad, generate_inputs(bad, {"M": 2}, seed=0))


# ------------------------------------------------------------------ tolerance: right and wrong FA-style kernels

def _bf16(t):
    return t.to(torch.bfloat16).float()


def _flash_forward(x, scale, causal):
    """What a FlashAttention-style kernel computes: P rounded to bf16 before P @ V, O rounded once."""
    q, k, v = (x[n].float() for n in "QKV")
    s = q @ k.transpose(-1, -2) * scale
    if causal:
        s = s.masked_fill(~causal_keep(s.shape[-1]), float("-inf"))
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - m)
    l = p.sum(-1, keepdim=True)
    return {"O": _bf16((_bf16(p) @ v) / l), "LSE": (m + torch.log(l)).squeeze(-1)}


def _flash_backward(x, scale, causal, fault=None):
    """A FlashAttention-style backward: P and dS rounded to bf16 before the products; `fault`
    makes it wrong in a way a real kernel can be."""
    q, k, v, o, do = (x[n].float() for n in ("Q", "K", "V", "O", "dO"))
    p = torch.exp(q @ k.transpose(-1, -2) * scale - x["LSE"][..., None])
    S = p.shape[-1]
    if causal:
        p = p.masked_fill(~causal_keep(S), 0.0)
    if fault == "drop_last_16_keys":
        p[..., S - 16:] = 0.0
    delta = (do * o).sum(-1, keepdim=True) * (1.02 if fault == "delta_off_2pct" else 1.0)
    ds = p * (do @ v.transpose(-1, -2) - delta)
    round_ds = (lambda t: (t * 64).to(torch.float8_e4m3fn).float() / 64) if fault == "ds_in_fp8" else _bf16
    ds = round_ds(ds)
    return {"dQ": _bf16(ds @ k * scale), "dK": _bf16(ds.transpose(-1, -2) @ q * scale),
            "dV": _bf16(_bf16(p).transpose(-1, -2) @ do)}


def _worst_ratio(task, got, ref, scales):
    """max over elements of |got - ref| / (atol + rtol * scale), per output (<= 1 passes)."""
    tol = task.tolerance
    out = {}
    for n in got:
        scale = torch.maximum(ref[n].abs(), scales[n]) if n in scales else ref[n].abs()
        out[n] = ((got[n] - ref[n]).abs() / (tol.atol + tol.rtol * scale)).max().item()
    return out


@pytest.mark.parametrize("name", ["mha_fwd_d128", "mha_fwd_d128_causal", "mha_bwd_d128", "mha_bwd_d64",
                                  "mha_bwd_d128_causal"])
def test_flash_style_kernels_pass_with_margin(name):
    t = small(get_task(name), H=4)
    assert t.tolerance.scale == "terms" and t.tolerance.rtol == t.tolerance.atol == 1e-2
    scale = 1 / math.sqrt(t.axes["D"].value)
    for seed in (1, 2):
        x = generate_inputs(t, {"S": 512}, seed=seed)
        ref, scales = run_reference(t, x), term_scales(t, x)
        flash = _flash_forward if "fwd" in name else _flash_backward
        worst = _worst_ratio(t, flash(x, scale, "causal" in name), ref, scales)
        assert max(worst.values()) < 0.8, worst


@pytest.mark.parametrize("fault", ["ds_in_fp8", "drop_last_16_keys", "delta_off_2pct"])
def test_wrong_flash_style_backward_fails(fault):
    t = small(get_task("attn_bwd"), H=4)
    x = generate_inputs(t, {"S": 500}, seed=1)
    worst = _worst_ratio(t, _flash_backward(x, 1 / math.sqrt(128), False, fault), run_reference(t, x),
                         term_scales(t, x))
    assert max(worst.values()) > 5, worst


def test_term_scales_are_root_sum_squares():
    g = gemm_task(n=6, k=5)
    x = generate_inputs(g, {"M": 4}, seed=0)
    a, b = x["A"].double(), x["B"].double()
    rss = ((a[:, None, :] * b[None, :, :]) ** 2).sum(-1).sqrt()
    torch.testing.assert_close(term_scales(g, x)["C"].double(), rss, rtol=1e-5, atol=1e-6)

    t = small(get_task("attn_bwd_causal"), H=1)
    x = generate_inputs(t, {"S": 7}, seed=0)
    q, k, v, o, do = (x[n].double()[0, 0] for n in ("Q", "K", "V", "O", "dO"))
    scale = 1 / math.sqrt(128)
    p = torch.exp(q @ k.T * scale - x["LSE"].double()[0, 0][:, None]) * causal_keep(7)
    ds = p * (do @ v.T - (do * o).sum(-1, keepdim=True))
    want = {"dV": (p[:, :, None] * do[:, None, :]).pow(2).sum(0).sqrt(),  # dV[j] = sum_i P[i,j] dO[i]
            "dQ": (ds[:, :, None] * k[None, :, :] * scale).pow(2).sum(1).sqrt(),
            "dK": (ds[:, :, None] * q[:, None, :] * scale).pow(2).sum(0).sqrt()}
    got = term_scales(t, x)
    for n, w in want.items():
        torch.testing.assert_close(got[n][0, 0].double(), w, rtol=1e-4, atol=1e-6)
    from tasks.describe import _TERM_OUTPUTS  # what the model is told has an rss scale

    for task in (g, t, small(get_task("attn_fwd"))):
        inputs = generate_inputs(task, {"M": 3} if task.op_type == "gemm" else {"S": 5}, 0)
        assert tuple(term_scales(task, inputs)) == _TERM_OUTPUTS[task.op_type]


# ------------------------------------------------------------------ what a model is told

@pytest.mark.parametrize("name", sorted(SEED_TASKS | VARIANTS | PTXBENCH_MORE))
def test_render_task_shows_visible_workloads_only(name):
    t = get_task(name)
    for arch in ("sm_90a", "sm_100a"):
        for lang in ("cuda", "ptx"):
            text = render_task(t, arch, lang)
            assert t.reference.strip() in text
            for w in t.workloads_for("visible"):
                assert w.name in text and all(f"{k}={v}" in text for k, v in w.axes.items())
            for w in t.workloads_for("held_out"):
                assert w.name not in text
                for k, v in w.axes.items():
                    assert f"{k}={v}" not in text and f"{k} = {v}" not in text and f", {v}," not in text
            for f in t.features_for(arch):
                assert f"`{f}`" in text
            assert ("wgmma" in text) == (arch == "sm_90a")
            rule = "0.01 + 0.01 * max(|ref|, rss)" if t.tolerance.scale == "terms" else "0.01 + 0.01 * |ref|"
            assert rule in text
            assert ("```ptx``` block" in text) == (lang == "ptx") == (".version 8.7" in text)
            for scalar, value in t.scalar_values(t.axis_values(t.workloads[0])).items():
                assert f"`{scalar}` = " in text and f"{value:.9g}" in text


@pytest.mark.parametrize("name", sorted(SEED_TASKS | VARIANTS | PTXBENCH_MORE))
def test_example_manifests_are_valid_for_every_workload(name):
    t = get_task(name)
    for arch in ("sm_90a", "sm_100a"):
        manifest = LaunchManifest.model_validate(example_manifest(t, arch))
        for w in t.workloads:
            plan_launches(manifest, t, t.axis_values(w), NOMINAL_LIMITS[arch])  # raises ManifestError if not
        assert json.loads(render_task(t, arch).split("```json\n")[-1].split("```")[0]) == example_manifest(t, arch)


def test_render_rejects_unknown_language():
    with pytest.raises(ValueError, match="language"):
        render_task(get_task("gemm"), "sm_90a", "triton")


# ------------------------------------------------------------------ agent tasks

def _cli() -> typer.Typer:
    from agent.commands import tasks as tasks_command

    app = typer.Typer()
    app.command("noop")(lambda: None)  # two commands, so typer keeps "tasks" as a subcommand
    tasks_command.register(app)
    return app


def test_agent_tasks_json():
    from tasks.schema import OP_FAMILIES

    r = CliRunner().invoke(_cli(), ["tasks", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    assert sorted(row["name"] for row in rows) == sorted(t.name for t in list_tasks())
    families = [row["op_family"] for row in rows]  # grouped: each family's tasks together, in OP_FAMILIES order
    assert families == sorted(families, key=list(dict.fromkeys(OP_FAMILIES.values())).index)
    gemm = rows[0]
    assert gemm["op_type"] == "gemm" and gemm["aliases"] == ["gemm"]
    assert gemm["workloads"] == {"visible": 1, "held_out": 4}
    assert gemm["requested_features"]["sm_100a"] == ["tcgen05_mma", "tmem", "tma"]


def test_agent_tasks_show_and_errors():
    from agent.commands.common import CliError

    r = CliRunner().invoke(_cli(), ["tasks", "show", "attn_fwd_causal", "--arch", "sm_100a", "--lang", "ptx"])
    assert r.exit_code == 0 and r.output == render_task(get_task("attn_fwd_causal"), "sm_100a", "ptx")
    r = CliRunner().invoke(_cli(), ["tasks", "show", "atn_fwd"])
    assert isinstance(r.exception, CliError) and "did you mean attn_fwd" in str(r.exception)
    r = CliRunner().invoke(_cli(), ["tasks", "show", "gemm", "--arch", "sm_80"])
    assert isinstance(r.exception, CliError) and "unknown arch" in str(r.exception)
    r = CliRunner().invoke(_cli(), ["tasks"])
    assert r.exit_code == 0 and "mha_bwd_d128_causal" in r.output


def test_agent_tasks_entry_point():
    p = subprocess.run([sys.executable, "-m", "agent.cli", "tasks", "show", "nosuchtask"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and "unknown task 'nosuchtask'" in p.stderr and "Traceback" not in p.stderr


# ------------------------------------------------------------------ baselines (plumbing; the libraries run on the GPU)

def test_baselines_list_and_refuse_cpu_tensors():
    from tasks.families.baselines import BaselineUnavailable, list_backends, make_baseline

    assert list_backends(get_task("gemm")) == ["cublas"]
    assert list_backends(get_task("attn_bwd")) == ["sdpa:cudnn", "sdpa:flash", "sdpa:efficient"]
    t = small(get_task("attn_fwd"))
    x = generate_inputs(t, {"S": 8}, seed=0)
    with pytest.raises(BaselineUnavailable, match="CUDA"):
        make_baseline(t, x)
    with pytest.raises(BaselineUnavailable, match="does not apply"):
        make_baseline(t, x, "cublas")


@pytest.mark.parametrize("name", ["attn_fwd_causal", "attn_bwd", "attn_bwd_causal"])
def test_sdpa_baseline_plumbing_with_the_math_backend(name, monkeypatch):
    """The same code path as the GPU backends, with PyTorch's CPU (math) backend, in fp32 (in bf16
    the math backend rounds the scores to bf16 before the softmax and fails the tolerance, as it
    should). The library's backward uses its own, unrounded O: so does the reference here."""
    from tasks.families import baselines

    monkeypatch.setitem(baselines.SDPA_BACKENDS, "sdpa:math", "MATH")
    t = small(get_task(name))
    x = {n: v.float() for n, v in generate_inputs(t, {"S": 40}, seed=2).items()}
    if t.baseline == "sdpa_bwd":
        x["O"] = run_reference(small(get_task(t.generator.split(":")[1])), x)["O"]
    make = baselines._sdpa_forward if t.baseline == "sdpa_fwd" else baselines._sdpa_backward
    b = make("sdpa:math", x, 1 / math.sqrt(128), "causal" in t.tags)
    out, again = b.run(), b.run()  # retain_graph: it can run again and again
    ref, scales = run_reference(t, x), term_scales(t, x)
    assert set(out) == ({"O"} if t.baseline == "sdpa_fwd" else {"dQ", "dK", "dV"})
    assert max(_worst_ratio(t, {n: v.float() for n, v in out.items()}, ref, scales).values()) < 1
    for n in out:
        assert torch.equal(out[n], again[n])


def test_cublas_baseline_plumbing():
    from tasks.families import baselines

    t = gemm_task(n=24, k=16)
    x = generate_inputs(t, {"M": 9}, seed=0)
    c = baselines._cublas(x).run()["C"]
    assert c.dtype == torch.bfloat16 and max(_worst_ratio(t, {"C": c.float()}, run_reference(t, x), {}).values()) < 1
