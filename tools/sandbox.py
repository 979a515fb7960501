"""Run NVRTC and ptxas on untrusted source in a confined child process.

A candidate's source is written by a model or an optimiser that tries every gap, so the
toolchain never runs in the calling process. `run_toolchain(job)` starts
`python -I -S -c <boot>` (a fresh interpreter that ignores PYTHON* variables and loads only
the standard library), in its own process group, with `scrubbed_env()`. In that child:

- resource limits (`Limits`): address space (RLIMIT_AS), CPU seconds per process, size
  of any file written, no core dumps; the parent kills the whole group at the wall-clock
  limit, so a compile bomb ends with a failed result naming the tool and the limit;
- NVRTC runs in a forked grandchild confined with Landlock (Linux >= 5.13, unprivileged)
  to reading the private header copy (tools/includes.py): no other file can be opened,
  nothing written or executed, no TCP. Where the kernel has no Landlock the compile still
  runs (`confinement: none`, logged once) and the include scan is the remaining guard;
  PTXBENCH_SANDBOX_STRICT=1 refuses to compile instead;
- ptxas runs on the PTX in a private work folder (PTX has no #include; ptxas reads only
  its input, and stats the files `.file` directives name, so every string it is given is
  cut to a bare name: `folder_free_strings`);
- output is capped: PTX larger than `ptx_bytes` fails ("PTX too large"), logs keep their
  head and tail, cubins are bounded.

The child answers with one JSON object on its stdout; stdout carries nothing else.
"""
from __future__ import annotations

import base64
import ctypes
import json
import logging
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

# ---------------------------------------------------------------- environment

# Variables a toolchain or worker process may need. Everything else (API keys, tokens,
# cloud credentials, the coding client's own variables) is dropped.
_ENV_NAMES = {"PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP", "USER", "LOGNAME",
              "CUDA_VISIBLE_DEVICES", "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "TERM"}
_ENV_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "PTXBENCH_", "PYTHON")
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|SIGNATURE|CERT", re.I)


def scrubbed_env(extra: dict[str, str] | None = None, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a process that handles untrusted input: an allowlist of
    toolchain variables (PATH, HOME, locale, CUDA_*/NVIDIA_* settings, PYTHONPATH,
    LD_LIBRARY_PATH, TMPDIR, ...), minus any whose name looks like a secret (*_KEY,
    *_TOKEN, *_SECRET, ...), plus `extra` (the caller's own, trusted)."""
    env = os.environ if base is None else base
    out = {k: v for k, v in env.items()
           if (k in _ENV_NAMES or k.startswith(_ENV_PREFIXES)) and not _SECRET_NAME.search(k)}
    out.update(extra or {})
    return out


# ---------------------------------------------------------------- limits

def _env_number(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


@dataclass(frozen=True)
class Limits:
    """What one compile may use. Defaults fit the expert kernels with a wide margin
    (they take ~1 s and < 1 GB); PTXBENCH_COMPILE_WALL_S / _MEMORY_GB override them."""

    wall_s: float = 60.0  # NVRTC + ptxas together, start to answer
    cpu_s: int = 60  # per process (the NVRTC grandchild, ptxas)
    memory_bytes: int = 4 << 30  # address space per process
    ptx_bytes: int = 64 << 20  # PTX NVRTC may produce
    cubin_bytes: int = 64 << 20
    log_bytes: int = 1 << 20  # NVRTC log / ptxas output kept (head and tail)

    @classmethod
    def default(cls) -> "Limits":
        wall = _env_number("PTXBENCH_COMPILE_WALL_S", cls.wall_s)
        mem = _env_number("PTXBENCH_COMPILE_MEMORY_GB", cls.memory_bytes / 2**30)
        return cls(wall_s=wall, cpu_s=int(max(1, wall)), memory_bytes=int(mem * 2**30))


# ---------------------------------------------------------------- the job and its outcome

@dataclass
class Job:
    """What the child does: NVRTC on `source` (when `nvrtc_options` is not None), or take
    `ptx` as given; then ptxas for `arch` (when `ptxas` is a path)."""

    source: str | None = None
    source_name: str = "kernel.cu"
    nvrtc_library: str | None = None  # path of libnvrtc.so (loaded with ctypes: a fast child start)
    nvrtc_options: list[str] | None = None
    headers: dict[str, str] = field(default_factory=dict)  # in-memory headers, by include name
    read_dirs: list[str] = field(default_factory=list)  # the only folders NVRTC may read
    strip_prefixes: list[str] = field(default_factory=list)  # paths removed from logs and .file
    ptx: str | None = None
    ptxas: str | None = None
    ptxas_args: list[str] = field(default_factory=list)


@dataclass
class Outcome:
    """The child's answer. `error` is set when a limit or a crash ended a tool (then
    `failed_tool` names it); a tool's own errors are in its log, not here."""

    ptx: str | None = None
    nvrtc_log: str = ""
    nvrtc_ok: bool = False
    ptxas_output: str | None = None
    ptxas_returncode: int | None = None  # ptxas's exit status (negative: the signal that ended it)
    cubin: bytes | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    failed_tool: str | None = None
    confinement: str | None = None  # where NVRTC ran: "landlock" or "none"
    peak_rss_bytes: int = 0  # largest resident set of NVRTC / ptxas
    # the tool could not run at all (not loadable, not executable, the sandbox not starting):
    # the harness's fault, never the source's (CompileResult.infra_error)
    infra: bool = False


def _gib(n: int) -> str:
    return f"{n / 2**30:g} GiB"


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MB"


# ---------------------------------------------------------------- parent side

_BOOT = "import sys; sys.path.insert(0, {root!r}); from tools.sandbox import _child_main; _child_main()"
_confinement_warned = False


def run_toolchain(job: Job, limits: Limits | None = None) -> Outcome:
    """Run `job` in a fresh confined child. Never raises for anything the source does."""
    limits = limits or Limits.default()
    root = str(Path(__file__).resolve().parent.parent)
    request = json.dumps({"job": asdict(job), "limits": asdict(limits)}).encode()
    with tempfile.TemporaryDirectory(prefix="ptxbench-compile-") as work:
        t0 = time.monotonic()
        # the child's stderr goes to a file: RLIMIT_FSIZE bounds it, a pipe would not
        with open(os.path.join(work, "stderr.txt"), "w+b") as errfile:
            try:
                # -I: no PYTHON* variables, no user site; -S: no site-packages (stdlib and ctypes suffice)
                proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _BOOT.format(root=root)], cwd=work,
                                        env=scrubbed_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=errfile, start_new_session=True)  # own group: killed whole
            except OSError as exc:
                return Outcome(error=f"the compile sandbox could not start: {exc}", failed_tool="sandbox", infra=True)
            try:
                out, _ = proc.communicate(request, timeout=limits.wall_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                proc.wait()
                tool = _last_phase(_tail(errfile))
                return Outcome(error=f"{tool} ran longer than {limits.wall_s:g} s (the compile time limit)",
                               failed_tool=tool, seconds={tool: round(time.monotonic() - t0, 3)})
            finally:
                _kill_group(proc)  # nothing of the group outlives the compile
            return _outcome(proc.returncode, out, _tail(errfile))


def _tail(f, n: int = 1 << 16) -> bytes:
    f.seek(0, os.SEEK_END)
    f.seek(max(0, f.tell() - n))
    return f.read()


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _last_phase(stderr: bytes) -> str:
    phases = re.findall(rb"^ptxbench-phase: (\w+)$", stderr, re.M)
    return phases[-1].decode() if phases else "nvrtc"


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _outcome(returncode: int, out: bytes, err: bytes) -> Outcome:
    try:
        data = json.loads(out)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        tool = _last_phase(err)
        how = f"was killed by {_signal_name(-returncode)}" if returncode < 0 else f"exited with {returncode}"
        tail = err.decode(errors="replace").strip().splitlines()[-3:]
        return Outcome(error=f"the compile sandbox {how} during {tool}: {' | '.join(tail)[:300]}", failed_tool=tool)
    cubin = data.pop("cubin", None)
    result = Outcome(**{k: v for k, v in data.items() if k in Outcome.__dataclass_fields__})
    result.cubin = base64.b64decode(cubin) if cubin else None
    global _confinement_warned
    if result.confinement == "none" and not _confinement_warned:
        _confinement_warned = True
        log.warning("compile sandbox: this kernel offers no Landlock; NVRTC runs without file-system "
                    "confinement (the include scan still applies)")
    return result


# ---------------------------------------------------------------- child side

def _child_main() -> None:
    """Entry of the child: read the request, set limits, run the tools, answer in JSON."""
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything a library prints goes to stderr, never into the answer
    request = json.loads(sys.stdin.read())
    job, limits = Job(**request["job"]), Limits(**request["limits"])
    _set_rlimits(limits)
    result = Outcome()
    ptx = job.ptx
    if job.nvrtc_options is not None:
        _phase("nvrtc")
        result = _nvrtc_confined(job, limits)
        ptx = result.ptx
    if ptx is not None and result.error is None and job.ptxas:
        _phase("ptxas")
        _ptxas(job, ptx, limits, result)
    result.peak_rss_bytes = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    answer = asdict(result)
    answer["cubin"] = base64.b64encode(result.cubin).decode() if result.cubin else None
    json.dump(answer, reply)
    reply.close()


def _phase(name: str) -> None:
    print(f"ptxbench-phase: {name}", file=sys.stderr, flush=True)


def _set_rlimits(limits: Limits) -> None:
    files = max(limits.ptx_bytes, limits.cubin_bytes) + limits.log_bytes + (1 << 20)
    # CPU: SIGXCPU at the soft limit names the cause; SIGKILL at the hard one if it is ignored
    for which, soft, hard in ((resource.RLIMIT_AS, limits.memory_bytes, limits.memory_bytes),
                              (resource.RLIMIT_CPU, limits.cpu_s, limits.cpu_s + 5),
                              (resource.RLIMIT_FSIZE, files, files), (resource.RLIMIT_CORE, 0, 0)):
        try:
            resource.setrlimit(which, (soft, hard))
        except (ValueError, OSError):  # a hard limit already lower: keep it
            pass


def cap_text(text: str, limit: int) -> str:
    """`text` if it fits in `limit` characters, else its head and tail with a marker
    between (errors tend to be at the end, the first problems at the start)."""
    if len(text) <= limit:
        return text
    head, tail = text[:limit * 3 // 4], text[-(limit // 4):]
    return f"{head}\n[... {len(text) - len(head) - len(tail)} characters left out ...]\n{tail}"


def _nvrtc_confined(job: Job, limits: Limits) -> Outcome:
    """Fork; the grandchild confines itself, runs NVRTC and writes JSON into a pipe."""
    try:
        lib = _load_nvrtc(job.nvrtc_library)  # before the fork and before confinement
    except OSError as exc:
        return Outcome(error=f"NVRTC could not be loaded: {exc}", failed_tool="nvrtc", infra=True)
    rfd, wfd = os.pipe()
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:  # grandchild
        os.close(rfd)
        try:
            out = _nvrtc_grandchild(lib, job, limits)
        except BaseException as exc:  # noqa: BLE001 - report, never hang the parent
            out = {"error": f"NVRTC could not run: {type(exc).__name__}: {exc}", "failed_tool": "nvrtc", "infra": True}
        with os.fdopen(wfd, "w") as w:
            json.dump(out, w)
        os._exit(0)
    os.close(wfd)
    with os.fdopen(rfd) as r:
        raw = r.read()
    _, status, rusage = os.wait4(pid, 0)
    seconds = {"nvrtc": round(time.monotonic() - t0, 4)}
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return Outcome(error=_signal_error("nvrtc", sig, limits, rusage.ru_maxrss * 1024), failed_tool="nvrtc",
                       seconds=seconds, infra=_died_on_its_own(sig, rusage.ru_maxrss * 1024, limits))
    try:
        out = json.loads(raw)
    except ValueError:
        return Outcome(error="nvrtc ended without an answer", failed_tool="nvrtc", seconds=seconds)
    return Outcome(seconds=seconds, **out)


# A tool that dies by a signal with its resident memory below this share of the memory limit
# did not die of the candidate's size: something outside killed it, or the tool itself broke.
_NEAR_MEMORY_LIMIT = 0.5


# Signals that come from outside a tool (a kill, the OOM killer, a hangup), as opposed to one it
# raises itself on the input it read (SIGSEGV, SIGABRT ...: a crash the source can steer clear of)
_KILLED_FROM_OUTSIDE = {signal.SIGKILL, signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGPIPE}


def _died_on_its_own(sig: int, peak_rss: int, limits: Limits) -> bool:
    """Whether a tool ended by `sig` died of the harness's trouble rather than the source's: killed
    from outside while far below the memory limit (so not for the source's size). Such a death is
    an infrastructure fault (Outcome.infra), never a verdict on the kernel. A limit the source can
    reach (CPU time, output size, memory) or a crash the tool raised on the source stays the
    source's: were it infra, a kernel that crashes ptxas would stop its run without a verdict,
    and every resume again."""
    return sig in _KILLED_FROM_OUTSIDE and peak_rss < _NEAR_MEMORY_LIMIT * limits.memory_bytes


def _signal_error(tool: str, sig: int, limits: Limits, peak_rss: int = 0) -> str:
    if sig == signal.SIGXCPU:
        return f"{tool} used more than {limits.cpu_s} s of CPU time (the compile CPU limit)"
    if sig == signal.SIGXFSZ:
        return f"{tool} wrote more than the output limit"
    if _died_on_its_own(sig, peak_rss, limits):
        return (f"{tool} was killed by {_signal_name(sig)} with {_mib(peak_rss)} in use, far below the memory limit "
                f"({_gib(limits.memory_bytes)}): something outside stopped it, the kernel was not judged")
    # allocation failures under RLIMIT_AS usually end as an abort or a segfault
    return f"{tool} crashed ({_signal_name(sig)}); it may have exceeded the memory limit ({_gib(limits.memory_bytes)})"


def _load_nvrtc(path: str | None) -> ctypes.CDLL:
    """libnvrtc through ctypes (importing cuda.bindings costs a child ~0.2 s), and its
    builtins library, which NVRTC otherwise dlopens at its first compile: after
    confinement only the header copy can be read."""
    lib = ctypes.CDLL(path or "libnvrtc.so", mode=ctypes.RTLD_GLOBAL)
    folder = Path(path).parent if path else None
    for p in sorted(folder.glob("libnvrtc-builtins.so*")) if folder else ():
        if ".alt." not in p.name:
            ctypes.CDLL(str(p), mode=ctypes.RTLD_GLOBAL)
    c_char_pp = ctypes.POINTER(ctypes.c_char_p)
    lib.nvrtcCreateProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_char_p,
                                       ctypes.c_int, c_char_pp, c_char_pp]
    lib.nvrtcCompileProgram.argtypes = [ctypes.c_void_p, ctypes.c_int, c_char_pp]
    for name in ("nvrtcGetPTXSize", "nvrtcGetProgramLogSize"):
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
    for name in ("nvrtcGetPTX", "nvrtcGetProgramLog"):
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib


def _strings(items: list[str]):
    return (ctypes.c_char_p * max(1, len(items)))(*[x.encode() for x in items])


_NVRTC_ERROR_COMPILATION = 6  # nvrtcResult: the one status that is a verdict on the source
_NVRTC_ERROR_OUT_OF_MEMORY = 1  # under RLIMIT_AS: the source outgrew the memory limit


def _nvrtc_grandchild(lib: ctypes.CDLL, job: Job, limits: Limits) -> dict:
    confinement = landlock_confine(job.read_dirs)
    if confinement == "none" and os.environ.get("PTXBENCH_SANDBOX_STRICT") == "1":
        return {"error": "this kernel offers no Landlock and PTXBENCH_SANDBOX_STRICT=1: not compiling",
                "failed_tool": "nvrtc"}
    prog = ctypes.c_void_p()
    err = lib.nvrtcCreateProgram(ctypes.byref(prog), job.source.encode(), job.source_name.encode(),
                                 len(job.headers), _strings(list(job.headers.values())), _strings(list(job.headers)))
    if err:  # NVRTC could not take the source in at all: its trouble, not the source's
        return {"error": f"nvrtcCreateProgram failed: {lib.nvrtcGetErrorString(err).decode()}", "failed_tool": "nvrtc",
                "confinement": confinement, "infra": True}
    try:
        opts = job.nvrtc_options or []
        result = lib.nvrtcCompileProgram(prog, len(opts), _strings(opts))
        text = _strip(cap_text(_read(lib.nvrtcGetProgramLogSize, lib.nvrtcGetProgramLog, prog), limits.log_bytes),
                      job.strip_prefixes)
        out = {"nvrtc_log": text or (lib.nvrtcGetErrorString(result).decode() if result else ""),
               "confinement": confinement}
        if "catastrophic error: out of memory" in text:
            out.update(error=f"nvrtc exceeded the memory limit ({_gib(limits.memory_bytes)})", failed_tool="nvrtc")
        if result == _NVRTC_ERROR_OUT_OF_MEMORY and "error" not in out:
            out.update(error=f"nvrtc exceeded the memory limit ({_gib(limits.memory_bytes)})", failed_tool="nvrtc")
        if result and result != _NVRTC_ERROR_COMPILATION and "error" not in out:
            # only NVRTC_ERROR_COMPILATION means "the compiler read the source and rejected it";
            # any other status (out of memory below our limit, internal error, a bad option of
            # ours) means it could not judge it
            out.update(error=f"NVRTC could not compile ({lib.nvrtcGetErrorString(result).decode()}): "
                             f"{cap_text(text.strip(), 300)}".rstrip(": "), failed_tool="nvrtc", infra=True)
        if result:
            return out
        size = ctypes.c_size_t()
        lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
        if size.value > limits.ptx_bytes:
            out.update(error=f"PTX too large: NVRTC produced {_mib(size.value)}, the limit is {_mib(limits.ptx_bytes)}",
                       failed_tool="nvrtc")
            return out
        ptx = _read(lib.nvrtcGetPTXSize, lib.nvrtcGetPTX, prog)
        out.update(ptx=_strip_file_paths(ptx, job.strip_prefixes), nvrtc_ok=True)
        return out
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _read(get_size, get, prog) -> str:
    size = ctypes.c_size_t()
    get_size(prog, ctypes.byref(size))
    buf = ctypes.create_string_buffer(size.value + 1)
    get(prog, buf)
    return buf.value.decode(errors="replace")


def _prefixes(prefixes: list[str]) -> list[str]:
    """Longest first, each ending in '/', plus the working folder NVRTC puts before the
    source name in `.file` directives."""
    out = {p.rstrip("/") + "/" for p in prefixes if p}
    out.add(os.getcwd().rstrip("/") + "/")
    return sorted(out, key=len, reverse=True)


def _strip(text: str, prefixes: list[str]) -> str:
    for p in _prefixes(prefixes):
        text = text.replace(p, "")
    return text


def _strip_file_paths(ptx: str, prefixes: list[str]) -> str:
    """`.file 1 "/tmp/.../kernel.cu"` -> `.file 1 "kernel.cu"`: no machine path in line info."""
    alternatives = "|".join(re.escape(p) for p in _prefixes(prefixes))
    return re.sub(rf'^(\s*\.file\s+\d+\s+")(?:{alternatives})', r"\1", ptx, flags=re.M)


# PTX tokens as ptxas lexes them: a // comment to the line's end, a /* */ comment, a string
# from " to " (no escapes; an unterminated one runs to the end, and ptxas refuses it).
_PTX_COMMENT_OR_STRING = re.compile(r'//[^\n]*|/\*.*?(?:\*/|\Z)|"[^"]*"?', re.S)


def folder_free_strings(ptx: str) -> str:
    """Every string literal of `ptx` (comments left alone) cut to what follows its last '/'.
    ptxas opens no file a PTX names (PTX has no #include), but it stats each `.file` path and
    writes the file's size and mtime into the cubin's line table: with no folder left, the only
    folder it can look in is its private work folder, which holds kernel.ptx alone."""
    def cut(m: re.Match) -> str:
        tok = m[0]
        if not tok.startswith('"'):
            return tok
        closed = len(tok) > 1 and tok.endswith('"')
        body = tok[1:-1] if closed else tok[1:]
        return '"' + body.rsplit("/", 1)[-1] + ('"' if closed else "")

    return _PTX_COMMENT_OR_STRING.sub(cut, ptx)


def _ptxas(job: Job, ptx: str, limits: Limits, result: Outcome) -> None:
    """PTX -> cubin in the work folder (the child's cwd), with relative names so messages
    say "kernel.ptx", and no folder in any string the PTX gives ptxas (folder_free_strings)."""
    Path("kernel.ptx").write_text(folder_free_strings(ptx))
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen([job.ptxas, *job.ptxas_args, "kernel.ptx", "-o", "kernel.cubin"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,  # one stream keeps the order
                                stdin=subprocess.DEVNULL)
    except OSError as exc:
        result.error, result.failed_tool, result.infra = f"ptxas could not run: {exc}", "ptxas", True
        return
    output = proc.stdout.read()
    proc.stdout.close()
    _, status, rusage = os.wait4(proc.pid, 0)  # wait4: ptxas's own peak memory, to tell a limit from a death
    proc.returncode = returncode = os.waitstatus_to_exitcode(status)
    result.seconds["ptxas"] = round(time.monotonic() - t0, 4)
    result.ptxas_output = cap_text(output.decode(errors="replace"), limits.log_bytes)
    result.ptxas_returncode = returncode
    if returncode < 0:
        peak = rusage.ru_maxrss * 1024
        result.error, result.failed_tool = _signal_error("ptxas", -returncode, limits, peak), "ptxas"
        result.infra = _died_on_its_own(-returncode, peak, limits)
        return
    cubin = Path("kernel.cubin")
    if returncode == 0 and cubin.exists():
        if cubin.stat().st_size > limits.cubin_bytes:
            result.error = f"cubin too large: {_mib(cubin.stat().st_size)}, the limit is {_mib(limits.cubin_bytes)}"
            result.failed_tool = "ptxas"
            return
        result.cubin = cubin.read_bytes()


# ---------------------------------------------------------------- Landlock

_SYS_LANDLOCK_CREATE_RULESET, _SYS_LANDLOCK_ADD_RULE, _SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
_PR_SET_NO_NEW_PRIVS = 38
_FS_READ_FILE, _FS_READ_DIR = 1 << 2, 1 << 3


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when there is none (or it is disabled)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        v = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    except (OSError, AttributeError):
        return 0
    return max(0, v)


def landlock_confine(read_dirs: list[str]) -> str:
    """Restrict this process (irreversibly, with its future children) to reading files
    under `read_dirs`: no other read, no write, no execute, no TCP, no signals to
    processes outside. Returns "landlock", or "none" where the kernel cannot."""
    abi = landlock_abi()
    if abi < 1:
        return "none"
    libc = ctypes.CDLL(None, use_errno=True)
    # every file-system right this ABI knows is handled (so denied unless a rule allows it)
    fs_bits = {1: 13, 2: 14, 3: 15, 4: 15}.get(abi, 16)
    attr = _RulesetAttr(handled_access_fs=(1 << fs_bits) - 1,
                        handled_access_net=3 if abi >= 4 else 0,  # bind and connect TCP
                        scoped=3 if abi >= 6 else 0)  # abstract unix sockets, signals
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        return "none"
    try:
        for d in read_dirs:
            fd = os.open(d, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = _PathBeneathAttr(allowed_access=_FS_READ_FILE | _FS_READ_DIR, parent_fd=fd)
                if libc.syscall(_SYS_LANDLOCK_ADD_RULE, ruleset, 1, ctypes.byref(rule), 0) != 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule({d})")
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or \
                libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return "landlock"
