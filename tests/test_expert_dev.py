"""scripts/expert_dev.py, the experts' variant harness, imports and its table is well formed: every
family with variants names a task that ships an expert, and every variant is (compile-time knobs,
launch overrides). (A merge once left its FP8 table unclosed: the script did not even parse.)"""
from __future__ import annotations

import importlib.util
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
