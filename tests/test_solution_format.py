"""The solution format (docs/SOLUTION_FORMAT.md): manifest parsing and validation errors
that name the field, manifest expressions, reply extraction, folders on disk, and
`agent eval` on a CPU machine."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.expressions import evaluate, names_in
from tools.solution import Solution, SolutionError, extract_solution, parse_manifest

ROOT = Path(__file__).resolve().parents[1]
GOOD = ROOT / "tests" / "fixtures" / "adversarial" / "good"

MANIFEST = {"buffers": [{"name": "ws", "dtype": "float32", "shape": ["M", 4]}],
            "tensor_maps": [{"name": "tmA", "tensor": "A", "box": [128, 64], "swizzle": "128B"}],
            "launches": [{"kernel": "k", "grid": ["cdiv(M, 128)"], "block": [128], "cluster": [2],
                          "shared_bytes": "64 * 1024", "args": ["tmA", "ws", {"type": "f32", "value": "sm_scale"}]}]}


def test_manifest_roundtrip(tmp_path):
    m = parse_manifest(json.dumps(MANIFEST))
    assert m.launches[0].args[2].type == "f32" and m.tensor_maps[0].swizzle == "128B"
    sol = Solution(language="cuda", source="__global__ void k() {}", manifest=m)
    back = Solution.from_dir(sol.to_dir(tmp_path / "s"))
    assert back.manifest == m and back.language == "cuda" and (tmp_path / "s" / "kernel.cu").exists()


@pytest.mark.parametrize("change, needle", [
    (lambda m: m["launches"].clear(), "launches: must have at least 1 entry"),
    (lambda m: m["launches"][0].update(grid=[1, 2, 3, 4]), "launches.0.grid"),
    (lambda m: m["launches"][0].pop("kernel"), "launches.0.kernel: is required"),
    (lambda m: m["buffers"][0].update(dtype="float64"), "buffers.0.dtype"),
    (lambda m: m["tensor_maps"][0].update(box=[1, 2, 3, 4, 5, 6]), "TMA supports 1 to 5 dims"),
    (lambda m: m["tensor_maps"][0].update(view=["M"]), "box has 2 dims but view has 1"),
    (lambda m: m["tensor_maps"][0].update(name="ws"), "name 'ws' is declared twice"),
    (lambda m: m["launches"][0]["args"].append({"type": "f16", "value": 1}), "launches.0.args.3"),
])
def test_manifest_errors_name_the_field(change, needle):
    m = json.loads(json.dumps(MANIFEST))
    change(m)
    with pytest.raises(SolutionError) as err:
        parse_manifest(json.dumps(m), where="launch.json")
    assert needle in str(err.value) and str(err.value).startswith("launch.json: ") and "\n" not in str(err.value)


def test_bad_json_says_where():
    with pytest.raises(SolutionError, match=r"launch.json: invalid JSON at line 2 column 1"):
        parse_manifest('{"launches": [\n}', where="launch.json")


def test_from_dir_errors(tmp_path):
    with pytest.raises(SolutionError, match="not a solution folder"):
        Solution.from_dir(tmp_path / "missing")
    (tmp_path / "kernel.cu").write_text("__global__ void k() {}")
    with pytest.raises(SolutionError, match="launch.json is missing"):
        Solution.from_dir(tmp_path)
    (tmp_path / "kernel.ptx").write_text(".version 8.0")
    with pytest.raises(SolutionError, match="exactly one of kernel.cu, kernel.ptx; found 2"):
        Solution.from_dir(tmp_path)


@pytest.mark.parametrize("expr, value", [
    ("cdiv(M, 128) * cdiv(N, 256)", 64 * 28), ("min(num_sms, cdiv(M, 128))", 64), ("M // 3 % 7", 8192 // 3 % 7),
    ("1 / sqrt(K) * 1.4426950408889634", 5120 ** -0.5 * 1.4426950408889634), ("round_up(70, 64)", 128),
    ("128 if M > 4096 else 64", 128), (256, 256), ("max(1, M - 9000)", 1),
])
def test_expressions(expr, value):
    env = {"M": 8192, "N": 7168, "K": 5120, "num_sms": 132}
    assert evaluate(expr, env) == pytest.approx(value)


@pytest.mark.parametrize("expr, needle", [
    ("MM * 2", "unknown name 'MM'"), ("__import__('os')", "unsupported construct"), ("M / 0", "division by zero"),
    ("cdiv(M,", "cannot parse"), ("[M]", "unsupported construct"),
])
def test_expression_errors(expr, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        evaluate(expr, {"M": 1})
    assert names_in("cdiv(M, BM) + num_sms") == {"M", "BM", "num_sms"}


def test_extract_solution_from_a_reply():
    reply = ("Here is a draft:\n```cuda\n__global__ void old() {}\n```\nBetter:\n```cuda\n"
             "extern \"C\" __global__ void k(float* x) {}\n```\nand the manifest\n```json\n"
             + json.dumps({"launches": [{"kernel": "k", "grid": [1], "block": [32], "args": ["C"]}]}) + "\n```\n")
    sol = extract_solution(reply)
    assert sol.language == "cuda" and "void k(" in sol.source and sol.manifest.launches[0].kernel == "k"
    ptx = extract_solution("```ptx\n.version 8.0\n.target sm_90a\n```\n```json\n{\"launches\": "
                           "[{\"kernel\": \"k\", \"grid\": [1], \"block\": [1]}]}\n```")
    assert ptx.language == "ptx"
    with pytest.raises(SolutionError, match="no fenced code block"):
        extract_solution("just prose")
    with pytest.raises(SolutionError, match="no launch manifest"):
        extract_solution("```cuda\n__global__ void k() {}\n```")
    with pytest.raises(SolutionError, match=r"json manifest block \(line 4\): launches.0.block"):
        extract_solution("```cuda\nx\n```\n```json\n{\"launches\": [{\"kernel\": \"k\", \"grid\": [1], \"block\": []}]}\n```")


# ---------------------------------------------------------------- `agent eval` on a CPU machine

def _agent(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], capture_output=True, text=True, env=env,
                          cwd=str(ROOT), timeout=300)


def test_agent_eval_on_cpu_says_what_was_skipped():
    p = _agent("eval", str(GOOD), "--task", "gemm")
    assert p.returncode == 1, p.stderr  # a SIMT kernel: gemm's requested wgmma and tma are missing (exit 1: failed)
    assert "requested features missing from the SASS: wgmma, tma" in " ".join(p.stdout.split())
    assert "compile: yes" in p.stdout and "correctness and timing were skipped" in p.stdout
    assert "CUDA_VISIBLE_DEVICES" in p.stdout and "correct not checked" in p.stdout
    p = _agent("eval", str(GOOD), "--task", "gemm", "--workloads", "all", "--json")
    data = json.loads(p.stdout)
    assert data["run_status"] == "skipped" and data["verdicts"]["correct"] is None and len(data["workloads"]) == 5
    assert "ptx" not in data["compile"]


@pytest.mark.parametrize("args, needle", [
    (["eval", "/no/such/dir", "--task", "gemm"], "not a solution folder"),
    (["eval", str(GOOD), "--task", "gemmm"], "unknown task 'gemmm'"),
    (["eval", str(GOOD), "--task", "gemm", "--arch", "sm_80"], "unknown arch 'sm_80'"),
    (["eval", str(GOOD), "--task", "gemm", "--workloads", "some"], "--workloads must be one of"),
])
def test_agent_eval_bad_input_is_one_line(args, needle):
    p = _agent(*args)
    assert p.returncode == 2 and needle in " ".join(p.stderr.split()) and "Traceback" not in p.stderr


def test_agent_eval_bad_manifest(tmp_path):
    (tmp_path / "kernel.cu").write_text((GOOD / "kernel.cu").read_text())
    (tmp_path / "launch.json").write_text('{"launches": [{"kernel": "gemm_simt", "grid": [1]}]}')
    p = _agent("eval", str(tmp_path), "--task", "gemm")
    # the manifest is the kernel's: a wrong one fails the check (exit 1), it is not bad input (issue 45)
    assert p.returncode == 1 and "launches.0.block: is required" in " ".join(p.stderr.split())
