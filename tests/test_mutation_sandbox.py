"""The compile sandbox's parent-side decisions (tools/sandbox.py), each on its own, fast enough to
run once per mutant (scripts/mutation.sh): which variables a toolchain child may see, the limits
read from the environment, how a child's answer (or its death) becomes an Outcome and a message,
and how machine paths are cut from logs and PTX.

The child itself (rlimits, the NVRTC grandchild under Landlock, ptxas) runs in `python -I -S`,
where mutmut's trampolines cannot be imported, so mutmut cannot reach it; tests/test_sandbox.py
attacks it with the real NVRTC and ptxas."""
from __future__ import annotations

import base64
import io
import json
import logging
import os
import signal

import pytest

from tools import sandbox as S
from tools.sandbox import Limits, Outcome, cap_text, folder_free_strings, scrubbed_env


# --- environment ------------------------------------------------------------------------------

def test_scrubbed_env_allowlist_prefixes_and_secret_names():
    kept = {name: "v" for name in ("PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP", "USER", "LOGNAME",
                                   "CUDA_VISIBLE_DEVICES", "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "TERM")}
    kept |= {"LC_ALL": "C", "CUDA_HOME": "/c", "NVIDIA_DRIVER_CAPABILITIES": "x", "PTXBENCH_COMPILE_WALL_S": "9",
             "PYTHONHASHSEED": "0"}
    dropped = {"OPENAI_API_KEY": "s", "my_token": "s", "AWS_SECRET_ACCESS_KEY": "s", "DB_PASSWORD": "s",
               "GOOGLE_APPLICATION_CREDENTIALS": "s", "CUDA_AUTH": "s", "PTXBENCH_COOKIE": "s", "LC_SESSION": "s",
               "PYTHON_PRIVATE": "s", "NVIDIA_SIGNATURE": "s", "CUDA_CERT": "s", "SHELL": "/bin/sh", "XLC_ALL": "x",
               "XPATH": "x", "MYCUDA_HOME": "x", "EDITOR": "vi", "DISPLAY": ":0"}
    assert scrubbed_env(base={**kept, **dropped}) == kept
    # the caller's extras are trusted, and override
    assert scrubbed_env({"PATH": "/p", "MY_KEY": "k"}, base={"PATH": "/usr/bin", "HOME": "/h"}) == {
        "PATH": "/p", "HOME": "/h", "MY_KEY": "k"}
    assert scrubbed_env(base={}) == {}


def test_scrubbed_env_reads_the_process_environment_by_default(monkeypatch):
    monkeypatch.setenv("PTXBENCH_PROBE", "1")
    monkeypatch.setenv("PROBE_API_KEY", "s")
    env = scrubbed_env()
    assert env["PTXBENCH_PROBE"] == "1" and "PROBE_API_KEY" not in env and env["PATH"] == os.environ["PATH"]


# --- limits -----------------------------------------------------------------------------------

def test_limits_defaults():
    lim = Limits()
    assert (lim.wall_s, lim.cpu_s, lim.memory_bytes, lim.ptx_bytes, lim.cubin_bytes, lim.log_bytes) == (
        60.0, 60, 4 << 30, 64 << 20, 64 << 20, 1 << 20)


def test_limits_from_the_environment(monkeypatch):
    monkeypatch.delenv("PTXBENCH_COMPILE_WALL_S", raising=False)
    monkeypatch.delenv("PTXBENCH_COMPILE_MEMORY_GB", raising=False)
    assert Limits.default() == Limits()
    monkeypatch.setenv("PTXBENCH_COMPILE_WALL_S", "12.5")
    monkeypatch.setenv("PTXBENCH_COMPILE_MEMORY_GB", "1.5")
    assert Limits.default() == Limits(wall_s=12.5, cpu_s=12, memory_bytes=3 << 29)
    monkeypatch.setenv("PTXBENCH_COMPILE_WALL_S", "0.25")  # the CPU limit never goes below a second
    assert Limits.default().cpu_s == 1 and Limits.default().wall_s == 0.25
    monkeypatch.setenv("PTXBENCH_COMPILE_WALL_S", "a minute")  # unreadable: the default
    monkeypatch.setenv("PTXBENCH_COMPILE_MEMORY_GB", "")
    assert Limits.default() == Limits()


def test_env_number(monkeypatch):
    monkeypatch.delenv("PTXBENCH_PROBE_N", raising=False)
    assert S._env_number("PTXBENCH_PROBE_N", 7.0) == 7.0
    monkeypatch.setenv("PTXBENCH_PROBE_N", "3")
    assert S._env_number("PTXBENCH_PROBE_N", 7.0) == 3.0
    monkeypatch.setenv("PTXBENCH_PROBE_N", "x")
    assert S._env_number("PTXBENCH_PROBE_N", 7.0) == 7.0


# --- the child's answer -----------------------------------------------------------------------

def test_last_phase():
    assert S._last_phase(b"") == "nvrtc"
    assert S._last_phase(b"ptxbench-phase: nvrtc\nnoise\nptxbench-phase: ptxas\ntrailing\n") == "ptxas"
    assert S._last_phase(b"ptxbench-phase: nvrtc\n") == "nvrtc"
    assert S._last_phase(b"  ptxbench-phase: ptxas\nxptxbench-phase: ptxas\n") == "nvrtc"  # only whole lines
    assert S._last_phase(b"ptxbench-phase: ptxas now\n") == "nvrtc"


def test_signal_names():
    assert S._signal_name(9) == "SIGKILL" and S._signal_name(int(signal.SIGSEGV)) == "SIGSEGV"
    assert S._signal_name(999) == "signal 999"


def test_signal_errors_name_the_limit():
    lim = Limits(cpu_s=7, memory_bytes=3 << 29)
    assert S._signal_error("nvrtc", signal.SIGXCPU, lim) == "nvrtc used more than 7 s of CPU time (the compile CPU limit)"
    assert S._signal_error("ptxas", signal.SIGXFSZ, lim) == "ptxas wrote more than the output limit"
    assert S._signal_error("ptxas", signal.SIGSEGV, lim) == (
        "ptxas crashed (SIGSEGV); it may have exceeded the memory limit (1.5 GiB)")
    assert S._signal_error("nvrtc", signal.SIGABRT, Limits()) == (
        "nvrtc crashed (SIGABRT); it may have exceeded the memory limit (4 GiB)")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_tool_killed_from_outside_far_below_the_memory_limit_is_not_the_kernels_doing(sig):
    """A kill from outside (the OOM killer of the host, a person) while the tool used less than half
    the memory limit says so with the figures: the kernel was not judged (tools.sandbox marks it infra).
    At half the limit or more the source may have driven it there: a crash near the limit, the source's."""
    lim = Limits(cpu_s=7, memory_bytes=3 << 29)
    name = signal.Signals(sig).name
    assert S._signal_error("ptxas", sig, lim, 100 << 20) == (
        f"ptxas was killed by {name} with 100.0 MB in use, far below the memory limit (1.5 GiB): "
        "something outside stopped it, the kernel was not judged")
    assert S._signal_error("ptxas", sig, lim, (3 << 29) // 2 - 1).startswith(f"ptxas was killed by {name} with 768.0 MB")
    assert S._signal_error("ptxas", sig, lim, (3 << 29) // 2) == (
        f"ptxas crashed ({name}); it may have exceeded the memory limit (1.5 GiB)")
    # a crash the tool raised itself (SIGSEGV, SIGABRT) is the source's at any size
    assert "crashed (SIGSEGV)" in S._signal_error("ptxas", signal.SIGSEGV, lim, 1 << 20)


def test_sizes_in_words():
    assert S._gib(4 << 30) == "4 GiB" and S._gib(3 << 29) == "1.5 GiB"
    assert S._mib(1 << 20) == "1.0 MB" and S._mib(1468006) == "1.4 MB" and S._mib(0) == "0.0 MB"


def test_an_answer_becomes_an_outcome(monkeypatch):
    monkeypatch.setattr(S, "_confinement_warned", True)
    answer = {"ptx": ".version 8.0", "nvrtc_log": "ok", "nvrtc_ok": True, "ptxas_output": "", "seconds": {"nvrtc": 0.5},
              "confinement": "landlock", "peak_rss_bytes": 123, "cubin": base64.b64encode(b"\x7fELF").decode(),
              "something_newer": 1}
    out = S._outcome(0, json.dumps(answer).encode(), b"ptxbench-phase: ptxas\n")
    assert out == Outcome(ptx=".version 8.0", nvrtc_log="ok", nvrtc_ok=True, ptxas_output="", cubin=b"\x7fELF",
                          seconds={"nvrtc": 0.5}, confinement="landlock", peak_rss_bytes=123)
    assert S._outcome(0, json.dumps({"cubin": None, "error": "x"}).encode(), b"") == Outcome(error="x")
    assert S._outcome(0, json.dumps({"cubin": ""}).encode(), b"").cubin is None


def test_no_answer_names_the_phase_and_how_the_child_ended():
    err = b"ptxbench-phase: nvrtc\nptxbench-phase: ptxas\nline a\nline b\nline c\nline d\n"
    out = S._outcome(-9, b"", err)
    assert out == Outcome(error="the compile sandbox was killed by SIGKILL during ptxas: line b | line c | line d",
                          failed_tool="ptxas")
    out = S._outcome(1, b"not json", b"Traceback\nImportError: x\n")
    assert out.error == "the compile sandbox exited with 1 during nvrtc: Traceback | ImportError: x"
    assert out.failed_tool == "nvrtc" and not out.infra
    assert S._outcome(0, b"[1, 2]", b"").error == "the compile sandbox exited with 0 during nvrtc: "
    long = S._outcome(2, b"", ("x" * 400).encode())
    assert long.error == "the compile sandbox exited with 2 during nvrtc: " + "x" * 300


def test_no_landlock_is_logged_once(monkeypatch, caplog):
    monkeypatch.setattr(S, "_confinement_warned", False)
    answer = json.dumps({"confinement": "none"}).encode()
    with caplog.at_level(logging.WARNING, logger="tools.sandbox"):
        assert S._outcome(0, answer, b"").confinement == "none"
        S._outcome(0, answer, b"")
        S._outcome(0, json.dumps({"confinement": "landlock"}).encode(), b"")
    assert [r.getMessage() for r in caplog.records] == [
        "compile sandbox: this kernel offers no Landlock; NVRTC runs without file-system confinement "
        "(the include scan still applies)"]
    assert S._confinement_warned is True
    monkeypatch.setattr(S, "_confinement_warned", False)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tools.sandbox"):
        S._outcome(0, json.dumps({"confinement": "landlock"}).encode(), b"")
    assert caplog.records == [] and S._confinement_warned is False


def test_tail_reads_the_last_bytes():
    f = io.BytesIO(b"0123456789")
    assert S._tail(f, 4) == b"6789" and S._tail(f, 100) == b"0123456789"
    f = io.BytesIO(b"x" * (1 << 16) + b"end")
    assert S._tail(f) == b"x" * ((1 << 16) - 3) + b"end"


# --- logs and paths ---------------------------------------------------------------------------

def test_cap_text_keeps_three_quarters_head_and_a_quarter_tail():
    assert cap_text("abcd", 4) == "abcd" and cap_text("", 0) == ""
    text = "".join(chr(ord("a") + i % 26) for i in range(100))
    capped = cap_text(text, 40)
    assert capped == f"{text[:30]}\n[... 60 characters left out ...]\n{text[-10:]}"
    assert cap_text(text[:41], 40) == f"{text[:30]}\n[... 1 characters left out ...]\n{text[31:41]}"


def test_prefixes_longest_first_with_the_working_folder(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    here = str(tmp_path) + "/"
    assert S._prefixes(["/a", "/a/b/", "", "/a"]) == sorted({"/a/b/", "/a/", here}, key=len, reverse=True)
    assert S._prefixes([]) == [here]
    assert S._strip(f"/a/b/x.h and /a/y.h and {here}kernel.cu and /ab/z", ["/a", "/a/b"]) == \
        "x.h and y.h and kernel.cu and /ab/z"


def test_file_directives_lose_their_folders(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    ptx = (f'.file 1 "{tmp_path}/kernel.cu"\n  .file\t2 "/inc/ptxbench/h.cuh"\n'
           '.file 3 "/other/x.h"\n// .file 4 "/inc/y.h"\nmov.u32 %r1, 1; // "/inc/z.h"\n')
    assert S._strip_file_paths(ptx, ["/inc"]) == (
        '.file 1 "kernel.cu"\n  .file\t2 "ptxbench/h.cuh"\n.file 3 "/other/x.h"\n// .file 4 "/inc/y.h"\n'
        'mov.u32 %r1, 1; // "/inc/z.h"\n')


def test_folder_free_strings():
    ptx = ('.file 1 "/etc/passwd"\n.file 2 "a/b/c.cu" // "/keep/comment"\n/* "/also/kept" */\n'
           '.file 3 "plain"\n.file 4 "/dir/"\n.file 5 "/unterminated/name')
    assert folder_free_strings(ptx) == ('.file 1 "passwd"\n.file 2 "c.cu" // "/keep/comment"\n/* "/also/kept" */\n'
                                        '.file 3 "plain"\n.file 4 ""\n.file 5 "name')
    assert folder_free_strings('"') == '"' and folder_free_strings('""') == '""'
    assert folder_free_strings('/* open "/x/y" comment') == '/* open "/x/y" comment'
    assert folder_free_strings('"a/b"/* c */"d/e"') == '"b"/* c */"e"'


@pytest.mark.parametrize("sig", [signal.SIGXCPU, signal.SIGXFSZ])
def test_limit_signals_differ_from_a_crash(sig):
    assert "crashed" not in S._signal_error("nvrtc", sig, Limits())


def test_a_dead_childs_stderr_need_not_be_utf8():
    out = S._outcome(-6, b"", b"ptxbench-phase: nvrtc\n\xff\xfe bad bytes\n")
    assert out.error == ("the compile sandbox was killed by SIGABRT during nvrtc: ptxbench-phase: nvrtc | "
                         "\ufffd\ufffd bad bytes")


def test_longer_prefixes_are_cut_first(monkeypatch, tmp_path):
    here = tmp_path / "work folder "  # a name ending in a blank keeps it
    here.mkdir()
    monkeypatch.chdir(here)
    assert S._prefixes(["/z", "/a/b/c", "/opt/CUDAX/"]) == [f"{here}/", "/opt/CUDAX/", "/a/b/c/", "/z/"]
    assert S._strip("/a/b/c/x.h /a/y.h", ["/a", "/a/b/c"]) == "x.h y.h"
    assert S._strip(f"{here}/kernel.cu", []) == "kernel.cu"
    ex = tmp_path / "EX"
    ex.mkdir()
    monkeypatch.chdir(ex)
    assert S._prefixes([]) == [f"{ex}/"]


def test_an_unterminated_string_keeps_its_text():
    assert folder_free_strings('.file 1 "abc') == '.file 1 "abc'
    assert folder_free_strings('.file 1 "a/b/c.cu"') == '.file 1 "c.cu"'
