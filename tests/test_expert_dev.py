"""scripts/expert_dev.py, the experts' variant harness, imports and its table is well formed: every
family with variants names a task that ships an expert, and every variant is (compile-time knobs,
launch overrides). (A merge once left its FP8 table unclosed: the script did not even parse.)"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_variant_table_is_well_formed():
    spec = importlib.util.spec_from_file_location("expert_dev", ROOT / "scripts" / "expert_dev.py")
    dev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dev)
    assert {"gemm", "fp8_gemm_nt_1d2d_n4096_k7168", "mha_bwd_d128", "gdn_decode_qk4_v8_d128_k_last"} <= set(dev.VARIANTS)
    for family, variants in dev.VARIANTS.items():
        task = "gemm_n7168_k5120" if family == "gemm" else family
        assert (ROOT / "tasks" / task / "expert" / "launch.json").exists(), family
        assert variants, family
        for name, (knobs, launch) in variants.items():
            assert isinstance(knobs, dict) and isinstance(launch, dict), (family, name)
            assert all(isinstance(v, int) for v in knobs.values()), (family, name, knobs)


def test_every_backward_variant_is_a_valid_solution_for_both_masks(tmp_path):
    """The backward's variants (knobs plus manifest overrides) make solution folders whose manifests
    parse, for the causal task too (its folder shares the kernel and has its own manifest); the
    fused-dQ variant launches the pre and main kernels only, main taking dQ and the block counters."""
    from tools.solution import Solution

    spec = importlib.util.spec_from_file_location("expert_dev", ROOT / "scripts" / "expert_dev.py")
    dev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dev)
    for task in ("mha_bwd_d128", "mha_bwd_d128_causal"):
        for name in dev.VARIANTS[task]:
            sol = dev.variant(task, name, tmp_path / task)
            assert isinstance(sol, Solution) and sol.manifest.launches, (task, name)
        fused = dev.variant(task, "fuse", tmp_path / f"{task}-fuse").manifest
        assert [launch.kernel for launch in fused.launches] == [
            "attn_bwd_pre_sm90", "attn_bwd_main_causal_sm90" if task.endswith("causal") else "attn_bwd_main_sm90"]
        assert fused.launches[1].args[-2:] == ["dQ", "dQcnt"]
        assert "dQcnt" in [b.name for b in fused.buffers]
        # v6 (DQ_HEADCONV + DQ_DIRECT, shipped): two launches; main takes dQ, one counter per head and `conv`
        # (it converts dQ, or stores it directly where a head has one key block), and no scratch buffer is a
        # zeroed one: a zeroed buffer costs every timed run a memset (the pre kernel writes Delta's and LSE2's
        # padding and the counters). v5: the dQ launch for heads of one key block, Delta and LSE2 zeroed.
        # v4 (and every variant measured on it): no counters, the dQ launch converts every head.
        shipped = dev.variant(task, "shipped", tmp_path / f"{task}-shipped").manifest
        v5 = dev.variant(task, "v5", tmp_path / f"{task}-v5").manifest
        v4 = dev.variant(task, "v4", tmp_path / f"{task}-v4").manifest
        assert [launch.kernel for launch in shipped.launches][0] == "attn_bwd_pre_sm90" and len(shipped.launches) == 2
        assert shipped.launches[1].args[-3:-1] == ["dQ", "dQcnt"] and shipped.launches[1].args[-1].name == "conv"
        assert shipped.launches[0].args[-2] == "dQcnt" and shipped.launches[0].args[-1].name == "conv"
        assert not [b.name for b in shipped.buffers if b.zero]
        assert [launch.kernel for launch in v5.launches][-1] == "attn_bwd_dq_sm90" and v5.launches[0].args[-1] == "dQcnt"
        assert sorted(b.name for b in v5.buffers if b.zero) == ["Delta", "LSE2"]
        assert v5.launches[2].args[2].value == "B * H * S * D // 4 if cdiv(S, 128) == 1 else 0"
        assert v4.launches[0].args[-1].name == "Spad"
        assert "dQcnt" not in [b.name for b in v4.buffers] and v4.launches[1].args[-1] == "sm_scale"
        assert v4.launches[2].grid == ["min(cdiv(B * H * S * D // 4, 256), num_sms * 16)"]


def test_an_argument_list_override_replaces_the_main_launchs_arguments(tmp_path):
    """A variant that gives the main launch's whole argument list (the FP8 GEMM's split-K variants: grid
    and `splits` change together) gets exactly that list; it was once matched by name against the
    list and silently dropped, so those variants ran a grid with the shipped split count."""
    spec = importlib.util.spec_from_file_location("expert_dev", ROOT / "scripts" / "expert_dev.py")
    dev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dev)
    task = "fp8_gemm_nt_1d2d_n4096_k7168"
    for name, (_, over) in dev.VARIANTS[task].items():
        if isinstance(over.get("args"), list):
            dev.variant(task, name, tmp_path)
            written = json.loads((tmp_path / name / "launch.json").read_text())["launches"]
            main = max(written, key=lambda launch: launch.get("shared_bytes", 0) if isinstance(launch.get("shared_bytes", 0), int) else 0)
            assert main["args"] == over["args"], name


def test_the_shipped_attention_backward_expert_compiles_without_serialized_wgmma_or_spills():
    """Real ptxas on the shipped backward expert (both main kernels): every wgmma asynchronous (no
    C7515/C7512 serialization), no spills. The kernel's schedule depends on ptxas accepting it: a
    zeroing mov of an accumulator that is in flight across the loop's back-edge (DK_CARRY) or one
    more live array makes ptxas serialize every wgmma, which only a GPU timing would otherwise show."""
    from tools.evaluator import Evaluator
    from tools.solution import Solution

    comp, insp = Evaluator.compile_and_inspect(Solution.from_dir(ROOT / "tasks" / "mha_bwd_d128" / "expert"), "sm_90a")
    assert comp.status == "ok", comp.error
    for kernel in ("attn_bwd_main_sm90", "attn_bwd_main_causal_sm90"):
        k = comp.kernels[kernel]
        assert (k.spill_stores, k.spill_loads) == (0, 0), (kernel, k)
    assert not [d.message for d in comp.diagnostics if d.code in ("C7515", "C7512", "C7514", "C7508")]
    assert insp.status == "ok" and not insp.flags.get("wgmma_serialized"), insp.flags


def test_the_backward_variants_the_notes_pair_against_still_compile():
    """v5 and v4 (the kernels shipped before, which every timing of a new version is paired against, and which
    the precision comparisons run) are knob settings of today's kernel.cu: a new knob whose code names a
    parameter only some settings declare once broke them all (`conv` without DQ_HEADCONV: a lost GPU window)."""
    from tools.evaluator import Evaluator

    spec = importlib.util.spec_from_file_location("expert_dev", ROOT / "scripts" / "expert_dev.py")
    dev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dev)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for name in ("v5", "v4"):
            comp, _ = Evaluator.compile_and_inspect(dev.variant("mha_bwd_d128", name, Path(tmp)), "sm_90a")
            assert comp.status == "ok", (name, comp.error)


def test_every_gdn_decode_variant_plans_one_launch_per_workload(tmp_path):
    """The GDN decode expert picks one of two entry points per workload (`when`, gdn8). A variant that names a
    kernel is one launch on every workload (its `when` and the other entry's launch dropped), so the ring and tile
    variants measured before still run alone; the threshold variants (`let` overrides) keep both launches and
    still run exactly one per workload; the first expert's variants keep their build (TILE_MIN_BLOCKS 0)."""
    from tasks import get_task
    from tools.launch import NOMINAL_LIMITS, plan_launches

    spec = importlib.util.spec_from_file_location("expert_dev", ROOT / "scripts" / "expert_dev.py")
    dev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dev)
    limits = NOMINAL_LIMITS["sm_90a"]
    for task_name in ("gdn_decode_qk4_v8_d128_k_last", "gdn_decode_qk8_v16_d128_k_last"):
        task = get_task(task_name)
        for name, (knobs, over) in dev.VARIANTS[task_name].items():
            manifest = dev.variant(task_name, name, tmp_path / task_name).manifest
            if "kernel" in over:
                assert [launch.kernel for launch in manifest.launches] == [over["kernel"]], name
                assert over["kernel"] == "gdn_decode_ring" or knobs.get("TILE_MIN_BLOCKS") == 0, name
            else:
                assert [launch.kernel for launch in manifest.launches] == ["gdn_decode_tma", "gdn_decode_ring"], name
            ran = set()
            for w in task.workloads:
                (launch,) = plan_launches(manifest, task, task.axis_values(w), limits).launches
                ran.add(launch.kernel)
            if name == "one_b8":  # B1-B8 on the one-tile entry, B16 up on the ring
                assert ran == {"gdn_decode_tma", "gdn_decode_ring"}, name
