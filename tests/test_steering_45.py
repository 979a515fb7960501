"""Issue 45's steering check, through the real `agent` CLI in a subprocess: a toolchain that is
present but cannot run is an infrastructure fault (exit 3, no verdict, no feedback), bad
output folders and absurd numbers fail before any work (exit 2), a non-text scripted reply
is bad input, and a finished replay is reported as finished."""
from __future__ import annotations

import json
import os
import stat
import time

import pytest
from agent_loop_helpers import cpu_only  # noqa: F401  (autouse fixture)
from agent_loop_helpers import GEMM_TASK, REPO, agent_cli, broken_probe_reply, events, probe_reply, write_script

EXPERT = REPO / "tasks" / GEMM_TASK / "expert"


def fake_tool(folder, name: str, body: str) -> str:
    """An executable shell script standing in for a tool that is present but broken."""
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


BROKEN_PTXAS = {
    # what a ptxas whose shared library is gone prints, and the loader's exit status
    "no shared library": "echo 'ptxas: error while loading shared libraries: libnvptxcompiler.so.13: cannot open "
                         "shared object file: No such file or directory' >&2\nexit 127\n",
    "killed by a signal": "kill -9 $$\n",
}


def exit_code_2(p, *words: str) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    message = " ".join(p.stderr.split())
    assert message.startswith("error:") and "Traceback" not in p.stderr, p.stderr
    for w in words:
        assert w in message, (w, message)
    return message


# ---- 1. a toolchain that cannot run is never the model's fault --------------------------------
@pytest.mark.parametrize("how", sorted(BROKEN_PTXAS))
def test_a_broken_ptxas_stops_the_run_as_infrastructure(tmp_path, how):
    ptxas = fake_tool(tmp_path, "ptxas", BROKEN_PTXAS[how])
    model = write_script(tmp_path / "s.json", [probe_reply()])
    runs = tmp_path / "runs"
    p = agent_cli("solve", "--task", GEMM_TASK, "--model", model, "--max-turns", "2", "--context", "none",
                  "--runs-dir", str(runs), "--run-id", "r", env={"PTXBENCH_PTXAS": ptxas})
    assert p.returncode == 3, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    run = runs / "r"
    assert not events(run, "feedback"), "the model was told about the toolchain's fault"
    for e in events(run, "compile"):
        assert e["result"]["infra_error"], e  # no verdict: the candidate is not charged a compile_error
    assert events(run, "infra_error")
    assert not list(run.glob("candidates/*/eval.json")), "a verdict was recorded"


@pytest.mark.parametrize("how", sorted(BROKEN_PTXAS))
def test_check_and_eval_say_infrastructure_with_the_tools_words(tmp_path, how):
    ptxas = fake_tool(tmp_path, "ptxas", BROKEN_PTXAS[how])
    for verb in ("check", "eval"):
        p = agent_cli(verb, str(EXPERT), "--task", GEMM_TASK, env={"PTXBENCH_PTXAS": ptxas})
        assert p.returncode == 3, (verb, p.returncode, p.stdout[-2000:], p.stderr[-2000:])
        said = " ".join((p.stdout + p.stderr).split())
        assert "infrastructure" in said, said
        assert ("error while loading shared libraries" if how == "no shared library" else "SIGKILL") in said, said


def test_a_real_ptxas_rejection_is_still_the_kernels(tmp_path):
    """The other side of the rule: ptxas that ran and named an error is a compile_error."""
    from tools.compile import compile_source
    r = compile_source(".version 8.0\n.target sm_90a\nnot an instruction;\n", "ptx", "sm_90a")
    assert r.status == "failed" and r.infra_error is None and "syntax error" in r.error


def test_a_broken_sanitizer_or_disassembler_gives_no_verdict(tmp_path, monkeypatch):
    """The same rule for the other tools a verdict rests on: a compute-sanitizer or a SASS
    disassembler that cannot run is the harness's fault (infra_error), never "passed" or "failed"."""
    from tools import ncu, sass
    from tools.compile import compile_source
    from tools.toolchain import find_toolchain
    fake_tool(tmp_path, "compute-sanitizer", BROKEN_PTXAS["no shared library"].replace("ptxas", "compute-sanitizer"))
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    s = ncu.sanitize_check({}, ["k"], dict(os.environ), timeout_s=30)
    assert s.status == "skipped" and "error while loading shared libraries" in s.infra_error
    compiled = compile_source('extern "C" __global__ void k(int* p) { p[0] = 1; }\n', "cuda", "sm_90a")
    assert compiled.ok
    for tool in ("cuobjdump", "nvdisasm"):
        monkeypatch.setenv(f"PTXBENCH_{tool.upper()}", fake_tool(tmp_path, tool, "kill -9 $$\n"))
    find_toolchain.cache_clear()
    try:
        insp = sass.inspect(compiled)
    finally:
        find_toolchain.cache_clear()  # the next caller finds the real tools again
    assert insp.status == "skipped" and insp.infra_error, insp


# ---- 3. output folders are checked before any work ---------------------------------------------
def test_an_output_folder_that_cannot_be_written_fails_before_any_work(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("not a folder\n")
    model = write_script(tmp_path / "s.json", [probe_reply()])
    solve = ("solve", "--task", GEMM_TASK, "--model", model, "--max-turns", "1", "--context", "none")
    for runs in (afile, afile / "sub", "/proc/ptxbench", tmp_path / ("x" * 300)):
        exit_code_2(agent_cli(*solve, "--runs-dir", str(runs)), "--runs-dir")
    exit_code_2(agent_cli("replay", str(REPO / "runs" / "examples" / "attn_bwd_human"), "--through-graph",
                          "--runs-dir", str(afile)), "--runs-dir", "is a file")
    sweep = tmp_path / "s.toml"
    sweep.write_text(f'name = "s"\nmodels = [{{spec = "{model}", name = "m"}}]\ntasks = ["gemm"]\n'
                     'contexts = ["none"]\nexecuted_check = false\ncheck_models = false\n[budget]\nmax_turns = 1\n')
    exit_code_2(agent_cli("sweep", str(sweep), "--runs-dir", str(afile)), "--runs-dir", "is a file")
    for bad_id in ("a\nb", "tab\there", "x" * 300):
        exit_code_2(agent_cli(*solve, "--runs-dir", str(tmp_path / "runs"), "--run-id", bad_id), "--run-id")
    assert not (tmp_path / "runs").exists() and afile.read_text() == "not a folder\n"


def test_bench_out_that_cannot_be_written_fails_within_seconds(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    for out in (afile / "rows.json", "/proc/self/ptxbench.json", tmp_path / ("y" * 300) / "rows.json"):
        start = time.monotonic()
        exit_code_2(agent_cli("bench", "--task", GEMM_TASK, "--out", str(out)), "--out")
        assert time.monotonic() - start < 30  # today's bench judged every solution, then crashed


# ---- 4. bounds on numbers ---------------------------------------------------------------------
@pytest.mark.parametrize("line, words", [
    ("replicas = 1e8", ("replicas", "at most")),
    ("replicas = 4000\ntasks = [\"gemm\", \"attn_fwd\", \"attn_bwd\"]", ("grid has 12,000 runs",)),
    ("concurrency = 1000000", ("concurrency", "at most")),
    ("turn_limits = [0, 4]", ("turn_limits", "at least 1")),
])
def test_an_absurd_sweep_fails_before_it_is_built(tmp_path, line, words):
    model = write_script(tmp_path / "s.json", [probe_reply()])
    tasks = "" if "tasks" in line else 'tasks = ["gemm"]\n'
    (tmp_path / "s.toml").write_text(f'name = "s"\nmodels = [{{spec = "{model}", name = "m"}}]\n{tasks}{line}\n'
                                     'contexts = ["none"]\nexecuted_check = false\n')
    for dry in ((), ("--dry-run",)):
        start = time.monotonic()
        message = exit_code_2(agent_cli("sweep", str(tmp_path / "s.toml"), "--runs-dir", str(tmp_path / "runs"), *dry),
                              *words)
        assert "Input should" not in message  # the user's words, not pydantic's
        assert time.monotonic() - start < 60
    assert not (tmp_path / "runs").exists()


def test_a_sweep_refuses_an_absurd_concurrency_flag(tmp_path):
    model = write_script(tmp_path / "s.json", [probe_reply()])
    (tmp_path / "s.toml").write_text(f'name = "s"\nmodels = [{{spec = "{model}", name = "m"}}]\ntasks = ["gemm"]\n'
                                     'contexts = ["none"]\nexecuted_check = false\n')
    exit_code_2(agent_cli("sweep", str(tmp_path / "s.toml"), "--runs-dir", str(tmp_path / "runs"),
                          "--concurrency", "1000000"), "concurrency", "at most 256")
    assert not (tmp_path / "runs").exists()
