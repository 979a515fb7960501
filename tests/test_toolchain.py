"""Toolchain discovery with the real tools of this machine."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tools import toolchain
from tools.compile import compile_source, isa_check
from tools.toolchain import ToolchainError, find_toolchain


@pytest.fixture
def fresh(monkeypatch):
    """Rediscover with this test's environment, and again afterwards for the next test."""
    for var in ("PTXBENCH_PTXAS", "PTXBENCH_CUOBJDUMP", "PTXBENCH_NVDISASM", "PTXBENCH_CUDA_BIN"):
        monkeypatch.delenv(var, raising=False)
    find_toolchain.cache_clear()
    yield monkeypatch
    find_toolchain.cache_clear()


def test_finds_a_consistent_set(fresh):
    tc = find_toolchain()
    for tool in tc.tools():
        assert tool.path, f"{tool.name}: {tool.reason}"
        assert tool.version and tool.found_via
    assert tc.ptxas.release >= tc.nvrtc.release  # an older ptxas rejects newer NVRTC PTX
    assert (Path(tc.include_dir) / "cuda_bf16.h").is_file()
    assert set(tc.versions()) == {"nvrtc", "ptxas", "cuobjdump", "nvdisasm"}


def test_isa_check_compiles_and_assembles(fresh):
    check = isa_check(find_toolchain())
    assert check.ok, check.detail
    assert float(check.ptx_version) >= 8.6  # sm_100a needs PTX ISA 8.6 or later
    assert "sm_100a" in check.detail


def test_override_wins_and_a_bad_override_says_so(fresh, tmp_path):
    real = find_toolchain().ptxas.path
    wrapper = tmp_path / "my-ptxas"
    wrapper.write_text(f'#!/bin/sh\nexec "{real}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    fresh.setenv("PTXBENCH_PTXAS", str(wrapper))
    find_toolchain.cache_clear()
    tc = find_toolchain()
    assert tc.ptxas.path == str(wrapper) and tc.ptxas.found_via == "PTXBENCH_PTXAS" and tc.ptxas.version

    fresh.setenv("PTXBENCH_PTXAS", str(tmp_path / "missing"))
    find_toolchain.cache_clear()
    tc = find_toolchain()
    assert tc.ptxas.path is None and "PTXBENCH_PTXAS" in tc.ptxas.reason
    with pytest.raises(ToolchainError, match="ptxas not found"):
        tc.require("ptxas")
    r = compile_source('extern "C" __global__ void k() {}', "cuda", "sm_90a")
    assert r.status == "failed" and "PTXBENCH_PTXAS" in r.error and "\n" not in r.error


def test_cuda_bin_folder_override(fresh, tmp_path):
    fresh.setenv("PTXBENCH_CUDA_BIN", str(tmp_path))
    find_toolchain.cache_clear()
    tc = find_toolchain()
    assert all(t.path is None and "PTXBENCH_CUDA_BIN" in t.reason for t in (tc.ptxas, tc.cuobjdump, tc.nvdisasm))
    assert tc.nvrtc.path  # NVRTC is a library, not looked up there


def test_missing_everywhere_explains_how_to_fix(fresh, tmp_path):
    fresh.setenv("PATH", str(tmp_path))
    fresh.delenv("CUDA_HOME", raising=False)
    fresh.setattr(toolchain, "_candidates", lambda name: [])
    tc = find_toolchain()
    assert tc.cuobjdump.path is None and "PTXBENCH_CUOBJDUMP" in tc.cuobjdump.reason
