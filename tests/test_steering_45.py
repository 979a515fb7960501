"""Issue 45's steering check, through the real `agent` CLI in a subprocess: a toolchain that is
present but cannot run is an infrastructure fault (exit 3, no verdict, no feedback), bad
output folders and absurd numbers fail before any work (exit 2), a non-text scripted reply
is bad input, and a finished replay is reported as finished."""
from __future__ import annotations

import json
import os
import re
import stat
import time

import pytest
from agent_loop_helpers import cpu_only  # noqa: F401  (autouse fixture)
from agent_loop_helpers import (GEMM_TASK, PROVIDER_FAILS, REPO, agent_cli, broken_probe_reply, events, probe_reply,
                                write_script)

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
    said = " ".join(p.stdout.split())
    assert "nothing was judged" in said and "compiled" not in said.split("best:", 1)[1], said  # no verdict in words
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
        assert "infrastructure" in said and "not judged" in said, said
        assert not re.search(r"compiled?: no\b", said) and "verdict:" not in said, said
        assert ("error while loading shared libraries" if how == "no shared library" else "SIGKILL") in said, said


def test_a_sweep_and_the_bench_on_a_broken_ptxas_exit_3(tmp_path):
    """Today's sweep said "1 succeeded" (exit 0) and the bench showed the shipped expert as not compiling."""
    ptxas = fake_tool(tmp_path, "ptxas", BROKEN_PTXAS["no shared library"])
    model = write_script(tmp_path / "s.json", [probe_reply()])
    (tmp_path / "s.toml").write_text(f'name = "s"\nmodels = [{{spec = "{model}", name = "m"}}]\ntasks = ["gemm"]\n'
                                     'contexts = ["none"]\nexecuted_check = false\ncheck_models = false\n'
                                     '[budget]\nmax_turns = 1\n')
    p = agent_cli("sweep", str(tmp_path / "s.toml"), "--runs-dir", str(tmp_path / "runs"),
                  env={"PTXBENCH_PTXAS": ptxas})
    assert p.returncode == 3 and "infrastructure error" in p.stderr, (p.returncode, p.stderr[-2000:])
    p = agent_cli("bench", "--task", GEMM_TASK, "--no-executed", env={"PTXBENCH_PTXAS": ptxas})
    assert p.returncode == 3 and "infrastructure error" in p.stderr, (p.returncode, p.stderr[-2000:])
    # the expert's row: not judged (the cell may fold), never "no" / "did not compile"
    assert "judged" in p.stdout and not re.search(r"│ (no|yes) ", p.stdout), p.stdout
    assert "did not compile" not in p.stdout, p.stdout


def test_a_real_ptxas_rejection_or_crash_is_still_the_kernels(tmp_path, monkeypatch):
    """The other side of the rule: ptxas that ran and named an error is a compile_error, and so is a
    crash ptxas raises itself on the input (SIGSEGV): the kernel can steer clear of it; were it infra,
    such a kernel would stop its run without a verdict at every resume."""
    from tools.compile import compile_source
    from tools.toolchain import find_toolchain
    r = compile_source(".version 8.0\n.target sm_90a\nnot an instruction;\n", "ptx", "sm_90a")
    assert r.status == "failed" and r.infra_error is None and "syntax error" in r.error
    monkeypatch.setenv("PTXBENCH_PTXAS", fake_tool(tmp_path, "ptxas", "kill -SEGV $$\n"))
    find_toolchain.cache_clear()
    try:
        r = compile_source(".version 8.0\n.target sm_90a\n", "ptx", "sm_90a")
    finally:
        find_toolchain.cache_clear()
    assert r.status == "failed" and r.infra_error is None and "SIGSEGV" in r.error, r


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
    message = exit_code_2(agent_cli("report", str(REPO / "runs" / "examples" / "attn_bwd_human"), "--out",
                                    str(afile / "report")), "--out", "is a file")
    assert "Errno" not in message
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


# ---- 5. bad reply files are bad input ----------------------------------------------------------
@pytest.mark.parametrize("content, words", [
    (json.dumps({"replies": [{"text": 7}]}), ("reply 1", "not text")),
    (json.dumps({"replies": ["fine", [1, 2]]}), ("reply 2", "is list")),
    ("not json at all", ("not valid JSON",)),
    (bytes(range(256)) * 4, ("not UTF-8",)),
])
def test_a_bad_scripted_file_is_bad_input(tmp_path, content, words):
    script = tmp_path / "script.json"
    script.write_bytes(content if isinstance(content, bytes) else content.encode())
    runs = tmp_path / "runs"
    p = agent_cli("solve", "--task", GEMM_TASK, "--model", f"scripted:{script}", "--max-turns", "2",
                  "--context", "none", "--runs-dir", str(runs))
    exit_code_2(p, str(script), *words)
    assert not runs.exists() or not any(runs.iterdir()), "a run was written"


def test_an_empty_reply_folder_or_a_truncated_replay_is_bad_input(tmp_path):
    (tmp_path / "replies").mkdir()
    runs = tmp_path / "runs"
    base = ("solve", "--task", GEMM_TASK, "--max-turns", "2", "--context", "none", "--runs-dir", str(runs))
    exit_code_2(agent_cli(*base, "--model", "human", "--human-reply-file", str(tmp_path / "replies")),
                "replies", "no reply files")
    recording = tmp_path / "recording"
    recording.mkdir()
    (recording / "events.jsonl").write_text("")  # cut before its first model response
    exit_code_2(agent_cli(*base, "--model", f"replay:{recording}"), "events.jsonl", "no recorded model response")
    assert not runs.exists() or not any(runs.iterdir())


# ---- 6. finished is finished --------------------------------------------------------------------
def test_the_readme_main_job_is_reported_finished_at_every_turn_limit(tmp_path):
    """README's main job replays the shipped example's 2 replies (default turn budget): the run ends
    with replay_end after 2 turns. Its report counts it at turn limits 4 and 8, with what it reached
    by turn 2 (compiled, arch in the SASS), not as 'unfinished'."""
    p = agent_cli("solve", "--task", "attn_bwd", "--model", "replay:runs/examples/attn_bwd_human",
                  "--runs-dir", str(tmp_path / "runs"), "--run-id", "main", "--quiet")
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])
    p = agent_cli("report", str(tmp_path / "runs" / "main"), "--out", str(tmp_path / "report"))
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])
    rows = list(__import__("csv").DictReader((tmp_path / "report" / "report.csv").open()))
    by_limit = {int(r["turn_limit"]): r for r in rows}
    assert sorted(by_limit) == [1, 4, 8], by_limit.keys()
    for limit in (4, 8):
        row = by_limit[limit]
        assert (row["runs"], row["unfinished"]) == ("1", "0"), row
        assert float(row["compiled"]) == 1.0 and float(row["arch_sass"]) == 1.0, row  # its turn-2 success
    assert float(by_limit[1]["arch_sass"]) == 0.0  # turn 1 had no wgmma: what it did there stays
    assert "0 (+1 unfinished)" not in (tmp_path / "report" / "report.md").read_text()


def test_a_script_that_runs_out_ends_like_a_replay(tmp_path):
    """A scripted model's replies are all it will ever say: when they run out the run ends there, as a
    replay does (script_end, finished, exit 0, no "the model failed"); a resume changes nothing, and
    the report counts it at every turn limit with what it reached, never as unfinished."""
    model = write_script(tmp_path / "s.json", [broken_probe_reply(), probe_reply()])
    runs = tmp_path / "runs"
    p = agent_cli("solve", "--task", GEMM_TASK, "--model", model, "--max-turns", "8", "--context", "none",
                  "--runs-dir", str(runs), "--run-id", "r")
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])
    assert "the model failed" not in p.stderr and "error:" not in p.stderr, p.stderr
    assert "finished, stopped by script_end" in " ".join(p.stdout.split()), p.stdout
    summary = json.loads((runs / "r" / "summary.json").read_text())
    assert (summary["status"], summary["stop_reason"], summary["turns"]) == ("finished", "script_end", 2)
    n_events = len(events(runs / "r"))
    assert agent_cli("solve", "--resume", str(runs / "r"), "--quiet").returncode == 0
    assert len(events(runs / "r")) == n_events  # ended for good: nothing asked again
    p = agent_cli("report", str(runs), "--out", str(tmp_path / "report"))
    assert p.returncode == 0, p.stderr[-2000:]
    rows = {int(r["turn_limit"]): r for r in __import__("csv").DictReader((tmp_path / "report" / "report.csv").open())}
    assert (rows[1]["arch_sass"], rows[4]["arch_sass"], rows[8]["arch_sass"]) == ("0.0", "1.0", "1.0"), rows
    assert all(r["unfinished"] == "0" for r in rows.values()), rows


def test_an_empty_script_is_bad_input(tmp_path):
    """Its end is a natural end now: an empty script would "finish" a run of no turns."""
    script = tmp_path / "s.json"
    script.write_text('{"replies": []}')
    runs = tmp_path / "runs"
    exit_code_2(agent_cli("solve", "--task", GEMM_TASK, "--model", f"scripted:{script}", "--context", "none",
                          "--runs-dir", str(runs)), str(script), "holds no replies")
    assert not runs.exists() or not any(runs.iterdir())


# ---- 2. a recording whose config.json cannot be read is refused ----------------------------------
def test_a_replay_whose_config_cannot_be_read_is_refused(tmp_path):
    import shutil
    recording = shutil.copytree(REPO / "runs" / "examples" / "attn_bwd_human", tmp_path / "rec")
    (recording / "config.json").write_text("{not json")
    runs = tmp_path / "runs"
    exit_code_2(agent_cli("solve", "--task", GEMM_TASK, "--model", f"replay:{recording}", "--max-turns", "1",
                          "--context", "none", "--runs-dir", str(runs)), "config.json")
    (tmp_path / "s.toml").write_text(f'name = "s"\nmodels = [{{spec = "replay:{recording}", name = "rep"}}]\n'
                                     'tasks = ["gemm"]\ncontexts = ["none"]\nexecuted_check = false\n'
                                     'check_models = false\n[budget]\nmax_turns = 1\n')
    exit_code_2(agent_cli("sweep", str(tmp_path / "s.toml"), "--runs-dir", str(runs)), "config.json", "rep")
    assert not runs.exists() or not any(runs.rglob("events.jsonl")), "a run was judged on another task"


# ---- 7. exit codes as documented -----------------------------------------------------------------
@pytest.mark.parametrize("manifest", [
    '{"launches": [{"kernel": "gemm_simt", "grid": [1]}]}',  # a schema error (was exit 2)
    '{"launches": [',  # not JSON (was exit 2)
])
def test_every_manifest_error_is_the_kernels_exit_1(tmp_path, manifest):
    import shutil
    folder = shutil.copytree(REPO / "tasks" / GEMM_TASK / "simple", tmp_path / "sol")
    (folder / "launch.json").write_text(manifest)
    for args in (("eval", str(folder), "--task", "gemm"), ("check", str(folder), "--task", "gemm")):
        p = agent_cli(*args)
        assert p.returncode == 1, (args, p.returncode, p.stderr)
        assert "launch.json" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_a_closed_output_pipe_exits_quietly():
    """`agent knowledge search wgmma | head -c 10`: the reader leaves early; no traceback, status 0
    (rich's answer to a broken pipe was exit 1)."""
    import subprocess
    import sys
    p = subprocess.run(f"{sys.executable} -m agent.cli knowledge search wgmma | head -c 10", shell=True, cwd=REPO,
                       capture_output=True, text=True, errors="replace", env={**os.environ, "PYTHONPATH": str(REPO)},
                       executable="/bin/bash")
    assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr and "Exception ignored" not in p.stderr, p.stderr
    p = subprocess.run(f"set -o pipefail; {sys.executable} -m agent.cli knowledge search wgmma | head -c 10 >/dev/null",
                       shell=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, executable="/bin/bash",
                       capture_output=True, text=True)
    assert p.returncode == 0, (p.returncode, p.stderr)


GPU_SCRIPTS = ["bench_harness.py", "bench_baselines.py", "bench_credit.py", "timing_study.py", "calibrate_tolerance.py",
               "probe_device.py", "probe_cupti.py", "probe_user_replay.py", "bench_estimator.py"]


@pytest.mark.parametrize("script", ["gpu_suite.sh", "ray_gpu_sweep.sh", *GPU_SCRIPTS])
def test_a_gpu_script_without_a_gpu_says_so_and_fails(script, tmp_path):
    """The README's GPU scripts on a machine without one (here: every GPU hidden): one line that says
    it needs an NVIDIA GPU, exit 3; never the suite's "54 skipped ... exit status 0" or a traceback."""
    import subprocess
    import sys
    cmd = ["bash", str(REPO / "scripts" / script)] if script.endswith(".sh") else [sys.executable,
                                                                                     str(REPO / "scripts" / script)]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OUT": str(tmp_path / "out")}
    p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 3, (script, p.returncode, p.stdout[-1000:], p.stderr[-1000:])
    assert "needs an NVIDIA GPU" in p.stderr and "Traceback" not in p.stderr and len(p.stderr.splitlines()) == 1
    assert not (tmp_path / "out").exists()


# ---- 8. words a user reads ---------------------------------------------------------------------
def test_help_uses_command_line_words_not_python_types():
    for verb in (("fixit", "build"), ("report",), ("eval",), ("check",), ("sweep",), ("solve",), ("bench",),
                 ("replay",)):
        p = agent_cli(*verb, "--help")
        assert p.returncode == 0, (verb, p.stderr)
        usage = p.stdout.split("\n\n")[0]
        assert "{" not in usage, (verb, usage)
        assert not re.search(r"<(str|int|float|path|bool|list\[[^\]]*\])>", p.stdout), (verb, p.stdout)
    assert "Usage: python -m agent.cli fixit build [OPTIONS] RUNS..." in agent_cli("fixit", "build", "--help").stdout


VERBS = [("doctor",), ("check",), ("inspect",), ("eval",), ("solve",), ("graph",), ("replay",), ("sweep",),
         ("report",), ("bench",), ("show",), ("serve",), ("tasks",), ("tasks", "show"), ("knowledge",),
         ("knowledge", "search"), ("knowledge", "list"), ("fixit",), ("fixit", "build"), ("fixit", "train"), ()]


def test_help_at_80_columns_folds_between_phrases():
    """click folded at hyphens ("[default: no-retry-" / "failed]", "half-" / "finished"), between
    "[default:" and its value, and cut a group's command summaries short ("exit..."): at 80
    columns every line fits, and each is folded between words and whole notes."""
    for verb in VERBS:
        p = agent_cli(*verb, "--help", env={"COLUMNS": "80"})
        assert p.returncode == 0, (verb, p.stderr)
        for line in p.stdout.splitlines():
            assert len(line) <= 80, (verb, line)
            assert not re.search(r"\w-$", line), (verb, line)  # a hyphenated word cut in two
            assert not re.search(r"\[(default|required)[^\]]*$", line), (verb, line)  # a note cut in two
            assert not (line.endswith("...") and not line.startswith("Usage:")), (verb, line)  # a summary cut short
    text = " ".join(agent_cli("sweep", "--help", env={"COLUMNS": "80"}).stdout.split())
    assert "[default: no-retry-failed]" in text and "half-finished" in text
    assert "(default: time-task-model-random)" in agent_cli("solve", "--help", env={"COLUMNS": "80"}).stdout
    top = agent_cli("--help", env={"COLUMNS": "80"}).stdout
    assert "exit 3 if" in top and "kernels cannot be compiled." in top  # doctor's summary whole, folded


def test_every_manifest_schema_error_is_in_our_words(tmp_path):
    """Every field of a full manifest broken every way (wrong type, too long, missing ...) through
    the real loader: the message names the place and what it must be, never pydantic's phrasing
    ("Field required", "Input should be ..."). One of them through `agent check` as a user meets it."""
    import copy

    from tools.solution import ManifestError, parse_manifest
    full = {"buffers": [{"name": "b", "dtype": "float32", "shape": ["M"], "zero": True}],
            "tensor_maps": [{"name": "t", "tensor": "A", "view": ["M", "K"], "box": [64, 16], "element_strides": [1, 1],
                             "swizzle": "128B", "l2_promotion": "none", "oob_fill": "zero"}],
            "launches": [{"kernel": "k", "grid": [1], "block": [128], "cluster": [1], "shared_bytes": 0,
                          "args": ["A", {"type": "f32", "value": "1"}]}]}
    parse_manifest(json.dumps(full))

    def places(o, at=()):
        yield at
        for k, v in (o.items() if isinstance(o, dict) else enumerate(o) if isinstance(o, list) else ()):
            yield from places(v, (*at, k))

    def broken(at, value=None, drop=False):
        data = copy.deepcopy(full)
        if not at:
            return value
        parent = data
        for k in at[:-1]:
            parent = parent[k]
        if drop:
            del parent[at[-1]]
        else:
            parent[at[-1]] = value
        return data

    messages = set()
    for at in places(full):
        manifests = [broken(at, v) for v in (None, 1.5, True, "x", [], {}, [1], ["x"] * 5, "z" * 300, [[1]])]
        manifests += [broken(at, drop=True)] if at else []
        for data in manifests:
            try:
                parse_manifest(json.dumps(data), where="launch.json")
            except ManifestError as exc:
                messages.add(str(exc))
    assert len(messages) > 50, len(messages)
    for m in messages:
        assert m.startswith("launch.json: ") and len(m.splitlines()) == 1, m
        for pydantic_words in ("Input should", "Field required", "should have", "Value error", "valid dictionary",
                               "instance of", ".str:", ".int:", "by_name", "by_value"):
            assert pydantic_words not in m, m
    assert "launch.json: launches.0.grid.0: must be text or a whole number" in messages
    assert "launch.json: launches.0.kernel: is required" in messages
    assert "launch.json: launches: must have at least 1 entry" in messages
    import shutil
    folder = shutil.copytree(REPO / "tasks" / GEMM_TASK / "simple", tmp_path / "sol")
    (folder / "launch.json").write_text('{"launches": [{"grid": [1.5], "block": [128]}]}')
    p = agent_cli("check", str(folder), "--task", "gemm")
    said = " ".join(p.stderr.split())
    assert p.returncode == 1 and "launches.0.kernel: is required" in said, said
    assert "launches.0.grid.0: must be text or a whole number" in said and "Input should" not in said, said
    (tmp_path / "def.json").write_text('{"name": 5, "axes": []}')  # a task Definition: the same words
    p = agent_cli("tasks", "show", str(tmp_path / "def.json"))
    said = " ".join(p.stderr.split())
    assert p.returncode == 2 and "name: must be text" in said and "op_type: is required" in said, said
    assert "Input should" not in said and "Field required" not in said, said


def test_eval_names_the_manifest_s_missing_kernel_and_a_skipped_profile(tmp_path):
    import shutil
    folder = shutil.copytree(REPO / "tasks" / GEMM_TASK / "simple", tmp_path / "sol")
    manifest = json.loads((folder / "launch.json").read_text())
    manifest["launches"][0]["kernel"] = "nosuchkernel"
    (folder / "launch.json").write_text(json.dumps(manifest))
    p = agent_cli("eval", str(folder), "--task", "gemm")
    result = " ".join(p.stdout.split()).split("result: ", 1)[-1]
    assert p.returncode == 1 and "launch.json launches no kernel of the compiled module" in result, p.stdout
    assert "nosuchkernel" in result and "missing from the SASS" not in result, result
    p = agent_cli("eval", str(REPO / "tasks" / GEMM_TASK / "simple"), "--task", "gemm", "--profile")
    assert "profile: skipped" in " ".join(p.stdout.split()), p.stdout


@pytest.fixture(scope="module")
def replayed_run(tmp_path_factory):
    """README's main job's run (the shipped example's 2 replies replayed), made once."""
    root = tmp_path_factory.mktemp("mainjob")
    p = agent_cli("solve", "--task", "attn_bwd", "--model", "replay:runs/examples/attn_bwd_human",
                  "--runs-dir", str(root / "runs"), "--run-id", "main", "--quiet")
    assert p.returncode == 0, p.stderr[-2000:]
    return root / "runs" / "main"


def test_fixit_numbers_are_bounded_and_a_data_set_is_not_replaced_unasked(replayed_run, tmp_path):
    exit_code_2(agent_cli("fixit", "train", str(tmp_path), "--base-model", str(tmp_path), "--lr", "nan"), "--lr")
    exit_code_2(agent_cli("fixit", "build", str(replayed_run), "--out", str(tmp_path / "d0"), "--max-chars", "-1"),
                "--max-chars")
    assert not (tmp_path / "d0").exists()
    out = tmp_path / "data"
    assert agent_cli("fixit", "build", str(replayed_run), "--out", str(out)).returncode == 0
    card = (out / "data_card.md").read_text()
    assert "{" not in card.split("- format:")[0] and "None" not in card, card  # words, not Python's repr
    before = (out / "train.jsonl").read_bytes()
    exit_code_2(agent_cli("fixit", "build", str(replayed_run), "--out", str(out)), "already holds a data set",
                "--overwrite")
    assert (out / "train.jsonl").read_bytes() == before
    assert agent_cli("fixit", "build", str(replayed_run), "--out", str(out), "--overwrite").returncode == 0


def test_the_example_run_s_recipe_works_as_printed(tmp_path):
    """runs/examples/attn_bwd_human/README.md's recipe, run as printed from the repository root
    (its /tmp/ paths moved under the test's folder, `agent` as `python -m agent.cli`)."""
    import subprocess
    import sys
    text = (REPO / "runs" / "examples" / "attn_bwd_human" / "README.md").read_text()
    script = re.search(r"^```sh\n(.*?)^```$", text, re.S | re.M)[1]  # fences inside it are not at a line start
    script = script.replace("/tmp/", f"{tmp_path}/").replace("agent solve", f"{sys.executable} -m agent.cli solve")
    p = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=REPO, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=600)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])
    run = tmp_path / "example-runs" / "attn_bwd_human"
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["status"], summary["turns"]) == ("finished", 2) and not (run / "checkpoint.sqlite").exists()


def test_the_readme_s_blackwell_check_works_as_printed():
    """README's check row names the Blackwell variant as `expert_sm100a --task gemm --arch sm_100a`
    beside the Hopper command: the folder is the Hopper command's sibling, and it passes."""
    row = next(line for line in (REPO / "README.md").read_text().splitlines() if "`agent check tasks/" in line)
    hopper = re.search(r"`agent check (\S+) --task", row)[1]
    folder, *flags = re.search(r"Blackwell: `([^`]+)`", row)[1].split()
    p = agent_cli("check", str(REPO / hopper / ".." / folder), *flags)
    assert p.returncode == 0, (row, p.stdout[-2000:], p.stderr[-2000:])
    assert "sm_100a" in p.stdout


def test_an_interrupted_run_says_interrupted_once(monkeypatch):
    """`run X: interrupted, stopped by interrupted` said it twice: a stop reason that is the status is said once."""
    import io

    from rich.console import Console

    from agent.commands import common
    from agent.commands import solve as solve_cmd
    from agent.trajectory import RunSummary
    example = REPO / "runs" / "examples" / "attn_bwd_human"
    summary = RunSummary.model_validate_json((example / "summary.json").read_text()).model_copy(
        update={"status": "interrupted", "stop_reason": "interrupted", "stop_detail": None})
    buffer = io.StringIO()
    monkeypatch.setattr(common, "console", Console(file=buffer, width=80))  # wrap_items prints there
    monkeypatch.setattr(solve_cmd, "console", common.console)
    monkeypatch.setattr(solve_cmd, "err_console", Console(file=io.StringIO()))
    solve_cmd.print_summary(summary, example)
    first = buffer.getvalue().splitlines()[0]
    assert "interrupted" in first and first.count("interrupted") == 1, first


def test_the_live_token_counter_goes_on_across_a_resume(tmp_path):
    """The progress lines' token total after a resume counts the turns before it (it restarted at 0)."""
    reply = {"text": probe_reply(), "usage": {"prompt_tokens": 1000, "completion_tokens": 10}}
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"replies": [reply, PROVIDER_FAILS]}))  # turn 2: the provider fails, resumable
    runs = tmp_path / "runs"
    p = agent_cli("solve", "--task", GEMM_TASK, "--model", f"scripted:{script}", "--max-turns", "2",
                  "--context", "none", "--runs-dir", str(runs), "--run-id", "r")
    assert "| 1010 tokens" in " ".join(p.stderr.split()), p.stderr
    script.write_text(json.dumps({"replies": [reply, PROVIDER_FAILS, reply]}))  # the script goes on where it stopped
    p = agent_cli("solve", "--resume", str(runs / "r"))
    said = " ".join(p.stderr.split())
    assert "turn 2/2" in said and "| 2020 tokens" in said, p.stderr


def test_replay_says_not_recorded_not_none(tmp_path):
    import shutil

    run = tmp_path / "old_run"  # a run recorded before config.json kept the rules version
    shutil.copytree(REPO / "runs" / "examples" / "attn_bwd_human", run)
    config = json.loads((run / "config.json").read_text())
    config.get("tool_versions", {}).pop("rules", None)
    (run / "config.json").write_text(json.dumps(config))
    p = agent_cli("replay", str(run))
    assert p.returncode in (0, 1) and "None" not in p.stdout, p.stdout
    assert "rules not recorded ->" in p.stdout
