"""Audit 6: the local executor on a machine with GPUs of two kinds (nvidia-smi stood in for by a script:
this machine has no GPU).

A sweep's runs record one GPU (the evaluator's first worker's: config.gpu, what `agent report` files
verdicts and speedups under), while each evaluation goes to whichever GPU worker is free. On a machine
with an H100 beside a display card, or beside an H200, a run's candidates were judged on both (on the
display card an sm_90a cubin cannot even load: the model's candidate would fail there). The local
executor now keeps the GPUs of one kind, the first that runs one of the sweep's arches, and says which
it leaves idle.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from agent.executors import LocalExecutor, make_executor
from agent.sweep import SweepConfig

SMI = """#!/bin/sh
case "$*" in
  *name*) printf '0, GPU-aaa, NVIDIA GeForce RTX 4090, 8.9\\n1, GPU-bbb, NVIDIA H100 80GB HBM3, 9.0\\n2, GPU-ccc, NVIDIA H200, 9.0\\n3, GPU-ddd, NVIDIA H100 80GB HBM3, 9.0\\n' ;;
  *) printf '0, GPU-aaa\\n1, GPU-bbb\\n2, GPU-ccc\\n3, GPU-ddd\\n' ;;
esac
"""


def _fake_smi(tmp_path: Path, monkeypatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(SMI)
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def _devices(ex: LocalExecutor) -> list[str]:
    return [w.device for w in ex._evaluator._workers]


def test_a_local_sweep_is_judged_on_gpus_of_one_kind(tmp_path, monkeypatch):
    _fake_smi(tmp_path, monkeypatch)
    cfg = SweepConfig(name="x", models=["openai/a"], tasks=["gemm"], arches=["sm_90a"], contexts=["none"])
    ex = make_executor(cfg)
    try:
        # the two H100s: the first GPU that runs sm_90a is an H100; the RTX and the H200 are left idle
        assert _devices(ex) == ["1", "3"], ex.describe()
        assert "NVIDIA GeForce RTX 4090" in ex.describe() and "NVIDIA H200" in ex.describe(), ex.describe()
        assert "idle" in ex.describe()
    finally:
        ex.close()


def test_gpus_of_one_kind_are_all_used(tmp_path, monkeypatch):
    _fake_smi(tmp_path, monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    ex = LocalExecutor(arches=["sm_90a"])
    try:
        assert _devices(ex) == ["1", "3"] and "idle" not in ex.describe(), ex.describe()
    finally:
        ex.close()
