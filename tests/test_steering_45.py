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
