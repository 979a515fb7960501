"""Hardware counters read in-process, through CUPTI's range profiler (CUDA 12.6+).

The executed check needs a few counters (wgmma instructions and FLOPs, TMA bytes, other math
and reads) of the candidate's runs: they must be the evaluation's own runs, in the worker that
times them, so the kernel cannot tell them from timed ones. Nsight Compute can only watch a
whole process from outside (a second process with its own start-up: 6-12 s per evaluation on the
H200); CUPTI's range profiler reads the same counters inside the worker, around one launch.
NVIDIA's `cupti-python` (13.0-13.4) has no bindings for the range profiler, so this module binds
the few C entry points it needs with ctypes, from the struct layouts of cupti_range_profiler.h,
cupti_profiler_host.h, cupti_profiler_target.h and cupti_target.h (CUPTI 13.0).

    profiler = RangeProfiler(metrics, replay="user")    # after the CUDA context exists
    launches = profiler.profile_passes(run_pass, "gemm") # run_pass(i, ranged) once per pass
    # -> [Launch(range name, {metric: value}), ...], every metric, each read on its own pass

User range + user replay (what the executed check uses): each pass is a run of the caller's
own, on fresh inputs, with the counted launches inside `ranged()`; nothing is replayed or
restored, so a pass costs one run and about 40 ms of CUPTI's start and stop. All metrics are in
one configuration: CUPTI schedules the SASS-patched metrics (`is_sass_patched`) on a pass of
their own, the last (H200, 2026-12-02: passes 1-5 of the six-pass set ran the plain kernel,
within 1% of its timed median; pass 6 ran instrumented code, 2.6-49x slower). A second
configuration on the same enable (hardware counters, then the SASS-patched ones) is not an
option: its pass never completed and its metrics read NaN (H200, 2026-12-02).

Auto range + kernel replay (`profile(run)`, kept for the probe and the counters test): every
launch is a range; CUPTI replays each kernel per pass, restoring the memory it may write.
The host half (metric names, config image, number of passes, evaluating the counter data)
needs no GPU: `passes("GH100", metrics)` runs on any machine that has the library.
"""
from __future__ import annotations

import contextlib
import ctypes as C
import ctypes.util
import glob
import os
import sys
import time
from dataclasses import dataclass, field

P, SIZE, U8P = C.c_void_p, C.c_size_t, C.POINTER(C.c_uint8)
AUTO_RANGE, USER_RANGE = 1, 2  # CUpti_ProfilerRange
KERNEL_REPLAY, USER_REPLAY = 2, 3  # CUpti_ProfilerReplayMode
MAX_PASSES = 32  # a configuration that asks for more is refused, never looped on
RANGE_PROFILER = 0  # CUpti_ProfilerType
MAX_RANGES = 64  # kernel launches one profiled run may make (a manifest has a handful); profile_passes may ask for more
# An experiment, off unless this is "1" in the worker's environment (scripts/probe_credit_cost.py sets it): the
# executed check's profiler kept enabled between evaluations, so only a worker's first evaluation pays CUPTI's first
# Start (~0.28 s of the GEMM expert's 1.5 s of counted runs, H200). Untested there since a kept-enabled profiler
# under kernel replay crashed a worker (2026-12-02); not for evaluations that take exact counts (the SASS metrics
# API beside an enabled range profiler is unmeasured).
KEEP_ENABLED_ENV = "PTXBENCH_CUPTI_KEEP_ENABLED"


class CuptiError(RuntimeError):
    """A CUPTI call failed: the executed check reports it as `skipped`, with this message."""


def _struct(name: str, fields: list[tuple[str, object]]) -> type[C.Structure]:
    """A params struct: structSize and pPriv, then `fields`. Its `size` is CUPTI's
    CUPTI_PROFILER_STRUCT_SIZE (the end of the last field, not sizeof with tail padding)."""
    cls = type(name, (C.Structure,), {"_fields_": [("structSize", SIZE), ("pPriv", P), *fields]})
    last_name, last_type = cls._fields_[-1]
    cls.size = getattr(cls, last_name).offset + C.sizeof(last_type)
    return cls


Init = _struct("Init", [])
ChipName = _struct("ChipName", [("deviceIndex", SIZE), ("pChipName", C.c_char_p)])
Availability = _struct("Availability", [("ctx", P), ("counterAvailabilityImageSize", SIZE),
                                        ("pCounterAvailabilityImage", U8P)])
HostInit = _struct("HostInit", [("profilerType", C.c_int), ("pChipName", C.c_char_p),
                                ("pCounterAvailabilityImage", U8P), ("pHostObject", P)])
HostObject = _struct("HostObject", [("pHostObject", P)])
AddMetrics = _struct("AddMetrics", [("pHostObject", P), ("ppMetricNames", C.POINTER(C.c_char_p)),
                                    ("numMetrics", SIZE)])
ConfigSize = _struct("ConfigSize", [("pHostObject", P), ("configImageSize", SIZE)])
ConfigImage = _struct("ConfigImage", [("pHostObject", P), ("configImageSize", SIZE), ("pConfigImage", U8P)])
NumPasses = _struct("NumPasses", [("configImageSize", SIZE), ("pConfigImage", U8P), ("numOfPasses", SIZE)])
Evaluate = _struct("Evaluate", [("pHostObject", P), ("pCounterDataImage", U8P), ("counterDataImageSize", SIZE),
                                ("rangeIndex", SIZE), ("ppMetricNames", C.POINTER(C.c_char_p)), ("numMetrics", SIZE),
                                ("pMetricValues", C.POINTER(C.c_double))])
Enable = _struct("Enable", [("ctx", P), ("pRangeProfilerObject", P)])
RPObject = _struct("RPObject", [("pRangeProfilerObject", P)])
Stop = _struct("Stop", [("pRangeProfilerObject", P), ("passIndex", SIZE), ("targetNestingLevel", SIZE),
                        ("isAllPassSubmitted", C.c_uint8)])
SetConfig = _struct("SetConfig", [("pRangeProfilerObject", P), ("configSize", SIZE), ("pConfig", U8P),
                                  ("counterDataImageSize", SIZE), ("pCounterDataImage", U8P), ("range", C.c_int),
                                  ("replayMode", C.c_int), ("maxRangesPerPass", SIZE), ("numNestingLevels", C.c_uint16),
                                  ("minNestingLevel", C.c_uint16), ("passIndex", SIZE),
                                  ("targetNestingLevel", C.c_uint16)])
PushRange = _struct("PushRange", [("pRangeProfilerObject", P), ("pRangeName", C.c_char_p)])
Decode = _struct("Decode", [("pRangeProfilerObject", P), ("numOfRangeDropped", SIZE)])
CounterDataSize = _struct("CounterDataSize", [("pRangeProfilerObject", P), ("pMetricNames", C.POINTER(C.c_char_p)),
                                              ("numMetrics", SIZE), ("maxNumOfRanges", SIZE),
                                              ("maxNumRangeTreeNodes", C.c_uint32), ("counterDataSize", SIZE)])
CounterDataInit = _struct("CounterDataInit", [("pRangeProfilerObject", P), ("counterDataSize", SIZE),
                                              ("pCounterData", U8P)])
CounterDataInfo = _struct("CounterDataInfo", [("pCounterDataImage", U8P), ("counterDataImageSize", SIZE),
                                              ("numTotalRanges", SIZE)])
BaseMetrics = _struct("BaseMetrics", [("pHostObject", P), ("metricType", C.c_int), ("ppMetricNames", C.POINTER(C.c_char_p)),
                                      ("numMetrics", SIZE)])
MetricProperties = _struct("MetricProperties", [("pHostObject", P), ("pMetricName", C.c_char_p),
                                                ("pDescription", C.c_char_p), ("pHwUnit", C.c_char_p),
                                                ("pDimUnit", C.c_char_p), ("metricType", C.c_int)])
RangeInfo = _struct("RangeInfo", [("pCounterDataImage", U8P), ("counterDataImageSize", SIZE), ("rangeIndex", SIZE),
                                  ("rangeDelimiter", C.c_char_p), ("rangeName", C.c_char_p)])


def _candidates() -> list[str]:
    """Where libcupti may be: PTXBENCH_CUPTI_LIB, the CUDA wheels beside torch (nvidia/cu13,
    nvidia/cuda_cupti), the CUDA toolkit, then the loader's search path."""
    out = [os.environ.get("PTXBENCH_CUPTI_LIB", "")]
    for base in sys.path:
        out += sorted(glob.glob(os.path.join(base, "nvidia", "cu1[3-9]", "lib", "libcupti.so*")))
        out += sorted(glob.glob(os.path.join(base, "nvidia", "cuda_cupti", "lib", "libcupti.so*")))
    for home in (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"):
        out += sorted(glob.glob(os.path.join(home, "extras", "CUPTI", "lib64", "libcupti.so*"))) if home else []
    found = ctypes.util.find_library("cupti")
    return [p for p in out if p] + ([found] if found else [])


_LIB: C.CDLL | None = None


def library() -> C.CDLL:
    """libcupti with a range profiler (CUDA 12.6+), loaded once; CuptiError says why not."""
    global _LIB
    if _LIB is None:
        tried = []
        for path in dict.fromkeys(_candidates()):
            try:
                lib = C.CDLL(path)
            except OSError as exc:
                tried.append(f"{path}: {exc}")
                continue
            if hasattr(lib, "cuptiRangeProfilerEnable") and hasattr(lib, "cuptiProfilerHostInitialize"):
                _LIB = lib
                break
            tried.append(f"{path}: no range profiler (CUPTI older than 12.6)")
        if _LIB is None:
            raise CuptiError("no libcupti with a range profiler found" + (f" ({'; '.join(tried)})" if tried else ""))
    return _LIB


def _call(fn: str, params: C.Structure) -> None:
    params.structSize = type(params).size
    rc = getattr(library(), fn)(C.byref(params))
    if rc != 0:
        text = C.c_char_p()
        library().cuptiGetResultString(rc, C.byref(text))
        raise CuptiError(f"{fn} failed: CUPTI error {rc} ({(text.value or b'?').decode()})")


def _names(metrics: list[str]):
    return (C.c_char_p * len(metrics))(*[m.encode() for m in metrics])


class _Host:
    """The host half: metric names -> config image; counter data -> values. No GPU needed."""

    def __init__(self, chip: str, availability: C.Array | None, metrics: list[str]):
        self.metrics = list(metrics)
        init = HostInit(profilerType=RANGE_PROFILER, pChipName=chip.encode(),
                        pCounterAvailabilityImage=C.cast(availability, U8P) if availability is not None else None)
        _call("cuptiProfilerHostInitialize", init)
        self.obj = init.pHostObject
        self._names = _names(self.metrics)
        _call("cuptiProfilerHostConfigAddMetrics", AddMetrics(pHostObject=self.obj, ppMetricNames=self._names,
                                                              numMetrics=len(self.metrics)))
        size = ConfigSize(pHostObject=self.obj)
        _call("cuptiProfilerHostGetConfigImageSize", size)
        self.config = (C.c_uint8 * size.configImageSize)()
        _call("cuptiProfilerHostGetConfigImage", ConfigImage(pHostObject=self.obj, configImageSize=len(self.config),
                                                             pConfigImage=self.config))
        passes = NumPasses(configImageSize=len(self.config), pConfigImage=self.config)
        _call("cuptiProfilerHostGetNumOfPasses", passes)
        self.passes = int(passes.numOfPasses)

    def evaluate(self, data: C.Array, index: int) -> dict[str, float]:
        values = (C.c_double * len(self.metrics))()
        _call("cuptiProfilerHostEvaluateToGpuValues", Evaluate(
            pHostObject=self.obj, pCounterDataImage=data, counterDataImageSize=len(data), rangeIndex=index,
            ppMetricNames=self._names, numMetrics=len(self.metrics), pMetricValues=values))
        return dict(zip(self.metrics, values))

    def close(self) -> None:
        if self.obj:
            _call("cuptiProfilerHostDeinitialize", HostObject(pHostObject=self.obj))
            self.obj = None


def is_sass_patched(metric: str) -> bool:
    """Metrics Nsight's tools collect by patching the kernel's SASS (smsp__sass_*, sm__sass_*):
    their pass runs instrumented code, slower than the kernel that is timed."""
    return "__sass_" in metric


def base_metrics(chip: str) -> dict[str, str]:
    """Every counter-type base metric CUPTI knows on `chip` (e.g. "GH100"), with its description:
    the names a credit rule may ask for (add `.sum`). Runs without a GPU."""
    init = HostInit(profilerType=RANGE_PROFILER, pChipName=chip.encode())
    _call("cuptiProfilerHostInitialize", init)
    try:
        found = BaseMetrics(pHostObject=init.pHostObject, metricType=0)  # CUPTI_METRIC_TYPE_COUNTER
        _call("cuptiProfilerHostGetBaseMetrics", found)
        out = {}
        for i in range(found.numMetrics):
            name = found.ppMetricNames[i]
            props = MetricProperties(pHostObject=init.pHostObject, pMetricName=name)
            _call("cuptiProfilerHostGetMetricProperties", props)
            out[name.decode()] = (props.pDescription or b"").decode(errors="replace")
        return out
    finally:
        _call("cuptiProfilerHostDeinitialize", HostObject(pHostObject=init.pHostObject))


def passes(chip: str, metrics: list[str]) -> int:
    """Passes CUPTI needs to collect `metrics` on `chip` (e.g. "GH100"); CuptiError for a
    metric the chip does not have. Runs without a GPU."""
    host = _Host(chip, None, metrics)
    try:
        return host.passes
    finally:
        host.close()


@dataclass
class Launch:
    """One profiled kernel launch: its name (as CUPTI names the range) and its metric values."""

    name: str
    metrics: dict[str, float] = field(default_factory=dict)


class RangeProfiler:
    """The range profiler on the current CUDA context, configured for `metrics`. Build it once
    per worker (0.7 s the first time in a process, 0.08 s after, on the H200).

    replay="user" (the executed check): `profile_passes`, one run of the caller's per pass, the
    SASS-patched pass last. Enabled per call: the first start after enabling costs
    about 0.22 s, each pass about 0.04 s beside its run (docs/BENCHMARKS.md). The profiler is
    not left enabled between calls: runs made under an enabled profiler were 0.6% slower and
    a kept-enabled profiler crashed the worker under kernel replay (H200, 2026-12-02); keeping it
    enabled under user replay is an experiment (`keep_enabled`, KEEP_ENABLED_ENV), off by default.
    replay="kernel": `profile(run)`, CUPTI's kernel replay of every launch (about 0.25 s fixed,
    plus a replay of every launch per pass with the context's memory saved and restored)."""

    def __init__(self, metrics: list[str], device_index: int = 0, keep_enabled: bool = False,
                 replay: str = "kernel"):
        from cuda.bindings import driver as d

        if replay not in ("kernel", "user"):
            raise ValueError(f"replay must be 'kernel' or 'user', not {replay!r}")
        self.keep_enabled, self.replay = keep_enabled, replay
        self._obj, self._data = None, None
        self._names: dict[str, bytes] = {}  # range names as CUPTI was given them (see _ranged)
        self._capacity = MAX_RANGES  # ranges the counter data image holds (and a pass may push): set per profile
        _call("cuptiProfilerInitialize", Init())
        err, ctx = d.cuCtxGetCurrent()
        if int(err) != 0 or not int(ctx):
            raise CuptiError("no current CUDA context to profile")
        self.ctx = int(ctx)
        chip = ChipName(deviceIndex=device_index)
        _call("cuptiDeviceGetChipName", chip)
        self.chip = (chip.pChipName or b"?").decode()
        avail = Availability(ctx=self.ctx)
        _call("cuptiProfilerGetCounterAvailability", avail)
        image = (C.c_uint8 * avail.counterAvailabilityImageSize)()
        avail.pCounterAvailabilityImage = C.cast(image, U8P)
        _call("cuptiProfilerGetCounterAvailability", avail)
        self.metrics = list(metrics)
        self.host = _Host(self.chip, image, self.metrics)
        self.passes = self.host.passes
        if self.passes > MAX_PASSES:
            with contextlib.suppress(CuptiError):
                self.host.close()
            raise CuptiError(f"the metrics need {self.passes} passes (at most {MAX_PASSES})")
        # The passes (0-based, in the order profile_passes runs them) that run SASS-patched code:
        # the last one, where any metric needs patching (see the module's docstring). Were CUPTI to
        # order them otherwise, an instrumented run would be tied and fail the tie: credit withheld,
        # never granted (tests/gpu/test_credit_gpu.py's honest experts would show it).
        self.instrumented_passes = (self.passes - 1,) if any(is_sass_patched(m) for m in self.metrics) else ()
        self.last_phase_s: dict[str, float] = {}
        self.last_pass_s: list[list[float]] = []  # profile_passes: host seconds of each pass's Start and Stop

    def _enable(self):
        """The range profiler object and its counter data image. `keep_enabled` keeps them across
        profiles (the first start after enabling is most of a profile's fixed cost: 0.25 of 0.3 s on
        the H200), but then every later launch, the timed ones included, runs under an enabled
        profiler; the worker does not (docs/BENCHMARKS.md)."""
        cap = getattr(self, "_capacity", MAX_RANGES)
        if self._obj is not None and getattr(self, "_data_ranges", cap) != cap:
            self._disable()  # (kept enabled with another capacity: the image is sized anew)
        if self._obj is None:
            enable = Enable(ctx=self.ctx)
            _call("cuptiRangeProfilerEnable", enable)
            self._obj = enable.pRangeProfilerObject
            size = CounterDataSize(pRangeProfilerObject=self._obj, pMetricNames=self.host._names,
                                   numMetrics=len(self.metrics), maxNumOfRanges=cap, maxNumRangeTreeNodes=cap)
            _call("cuptiRangeProfilerGetCounterDataSize", size)
            self._data = (C.c_uint8 * size.counterDataSize)()
            self._data_ranges = cap
        return self._obj, self._data

    def _disable(self) -> None:
        if self._obj is not None:
            obj, self._obj = self._obj, None
            _call("cuptiRangeProfilerDisable", RPObject(pRangeProfilerObject=obj))

    def _configure(self, range_mode: int = AUTO_RANGE, replay_mode: int = KERNEL_REPLAY):
        """Enabled, the counter data image cleared, and configured: one SetConfig for all passes
        (NVIDIA's range_profiling sample; Stop then walks the passes itself)."""
        obj, data = self._enable()
        _call("cuptiRangeProfilerCounterDataImageInitialize", CounterDataInit(
            pRangeProfilerObject=obj, counterDataSize=len(data), pCounterData=data))
        _call("cuptiRangeProfilerSetConfig", SetConfig(
            pRangeProfilerObject=obj, configSize=len(self.host.config), pConfig=self.host.config,
            counterDataImageSize=len(data), pCounterDataImage=data, range=range_mode, replayMode=replay_mode,
            maxRangesPerPass=getattr(self, "_capacity", MAX_RANGES), numNestingLevels=1, minNestingLevel=1, passIndex=0, targetNestingLevel=1))
        return obj, data

    def _ranges(self, obj, data: C.Array) -> list[tuple[str, dict[str, float]]]:
        """Decode what the passes collected: (range name, metric values) per range, in order."""
        decode = Decode(pRangeProfilerObject=obj)
        _call("cuptiRangeProfilerDecodeData", decode)
        if decode.numOfRangeDropped:
            raise CuptiError(f"{decode.numOfRangeDropped} ranges were dropped (more than {getattr(self, '_capacity', MAX_RANGES)}?)")
        info = CounterDataInfo(pCounterDataImage=data, counterDataImageSize=len(data))
        _call("cuptiRangeProfilerGetCounterDataInfo", info)
        out = []
        for r in range(info.numTotalRanges):
            ri = RangeInfo(pCounterDataImage=data, counterDataImageSize=len(data), rangeIndex=r, rangeDelimiter=b"/")
            _call("cuptiRangeProfilerCounterDataGetRangeInfo", ri)
            out.append(((ri.rangeName or b"?").decode(errors="replace"), self.host.evaluate(data, r)))
        return out

    def profile(self, run) -> list[Launch]:
        """Call `run()` (it launches kernels and waits for them) with every launch profiled;
        the launches in order, each with its metric values."""
        if self.replay != "kernel":
            raise CuptiError("profile(run) needs a RangeProfiler built with replay='kernel'")
        clock = time.perf_counter
        t0 = clock()
        done = False
        try:
            try:
                obj, data = self._configure()
            except CuptiError:
                if self._obj is None:
                    raise
                self._disable()  # a kept profiler that refuses a new configuration: start afresh once
                obj, data = self._configure()
            t1 = clock()
            _call("cuptiRangeProfilerStart", RPObject(pRangeProfilerObject=obj))
            try:
                run()
            except BaseException:  # the run's own error (a hang, a fault) is the verdict: never masked by CUPTI's
                with contextlib.suppress(CuptiError):
                    _call("cuptiRangeProfilerStop", Stop(pRangeProfilerObject=obj))
                raise
            _call("cuptiRangeProfilerStop", Stop(pRangeProfilerObject=obj))
            t2 = clock()
            out = [Launch(name, values) for name, values in self._ranges(obj, data)]
            t3 = clock()
            done = True
            return out
        finally:
            if not (done and self.keep_enabled):
                with contextlib.suppress(CuptiError):
                    self._disable()
            if done:  # where each part of the last profile went (seconds)
                self.last_phase_s = {"setup": t1 - t0, "runs": t2 - t1, "decode": t3 - t2, "disable": clock() - t3}

    @contextlib.contextmanager
    def _ranged(self, obj, default: str, seen: list[str]):
        """`with ranged(label=None):` the launches inside are one range, named label or `default`."""
        # CUPTI may keep the name's pointer to match the range across passes: the bytes live as
        # long as this profiler does, never a temporary that the next allocation reuses
        name = self._names.setdefault(default, default.encode())
        _call("cuptiRangeProfilerPushRange", PushRange(pRangeProfilerObject=obj, pRangeName=name))
        seen.append(default)
        ok = False
        try:
            yield
            ok = True
        finally:
            if ok:
                _call("cuptiRangeProfilerPopRange", RPObject(pRangeProfilerObject=obj))
            else:  # the run's own error is the verdict: never masked by CUPTI's
                with contextlib.suppress(CuptiError):
                    _call("cuptiRangeProfilerPopRange", RPObject(pRangeProfilerObject=obj))

    def profile_passes(self, run_pass, name: str, max_ranges: int | None = None) -> list[Launch]:
        """User replay: call `run_pass(i, ranged)` once per pass (i = 0 .. passes-1;
        `instrumented_passes` run SASS-patched code). run_pass prepares its run (fresh inputs)
        outside the range, then makes the launches to count inside `with ranged():` (or
        `ranged(label)`: several ranges per pass are kept apart by name) and waits for them.
        Returns one Launch per range name, with every metric. The profiler is enabled for this
        call only. CUPTI must report every pass submitted after the last one (`last_stops`: what
        each Stop returned), else CuptiError: no partial counts are ever evaluated. `max_ranges`: the
        most ranges a pass pushes (the counter data image holds that many; default MAX_RANGES): where
        every timed run of a workload is a range of its own (tools.counted), a pass holds dozens.
        `keep_enabled` (an experiment, KEEP_ENABLED_ENV): the profiler stays enabled after a whole profile, so
        the next call's first Start costs what a later configuration's does (issue 42, item 7's lever)."""
        if self.replay != "user":
            raise CuptiError("profile_passes needs a RangeProfiler built with replay='user'")
        clock = time.perf_counter
        t0 = clock()
        phase: dict[str, float] = {}
        self.last_stops: list[list[int]] = []  # per pass: (pass index, nesting level, all passes submitted)
        self.last_pass_s: list[list[float]] = []  # per pass: host seconds of CUPTI's Start and of its Stop
        self._capacity = max(1, int(max_ranges or MAX_RANGES))
        try:
            obj, data = self._configure(USER_RANGE, USER_REPLAY)
            t1 = clock()
            for i in range(self.passes):  # NVIDIA's range_profiling sample: one SetConfig, Start..Stop per pass
                ts = clock()
                _call("cuptiRangeProfilerStart", RPObject(pRangeProfilerObject=obj))
                self.last_pass_s.append([clock() - ts, 0.0])
                seen: list[str] = []
                try:
                    run_pass(i, lambda label=None: self._ranged(obj, label or name, seen))
                except BaseException:  # the run's error (a hang, a fault) is the verdict
                    with contextlib.suppress(CuptiError):
                        _call("cuptiRangeProfilerStop", Stop(pRangeProfilerObject=obj))
                    raise
                stop = Stop(pRangeProfilerObject=obj)
                ts = clock()
                _call("cuptiRangeProfilerStop", stop)
                self.last_pass_s[-1][1] = clock() - ts
                self.last_stops.append([int(stop.passIndex), int(stop.targetNestingLevel),
                                        int(stop.isAllPassSubmitted)])
                if not seen:
                    raise CuptiError(f"pass {i} counted nothing: run_pass made no range")
            if not self.last_stops[-1][2]:
                raise CuptiError(f"CUPTI did not report every pass submitted after its {self.passes} passes "
                                 f"(Stop returned {self.last_stops})")
            t2 = clock()
            values: dict[str, dict[str, float]] = {}
            for label, metrics in self._ranges(obj, data):  # a range name repeated (several per pass) is one
                values.setdefault(label, {}).update(metrics)
            phase = {"setup": t1 - t0, "runs": t2 - t1, "decode": clock() - t2}
            return [Launch(label, m) for label, m in values.items()]
        finally:
            t3 = clock()
            if not (self.keep_enabled and phase):  # kept only after a whole profile (the next one's Start is cheap)
                with contextlib.suppress(CuptiError):
                    self._disable()
            self.last_phase_s = {**phase, "disable": clock() - t3, "total": clock() - t0}

    def close(self) -> None:
        with contextlib.suppress(CuptiError):
            self._disable()
        self.host.close()


# ---------------------------------------------------------------------------------------------
# Per-instruction counts: CUPTI's SASS metrics API (cupti_sass_metrics.h, CUDA 12.4+)
#
# The range profiler's SASS-patched metrics count by instruction class, and some classes lump two
# things a credit rule must keep apart: smsp__sass_inst_executed_op_tma_ld counts UTMALDG (tensor-map
# loads) and UBLKCP.S.G (plain bulk copies) alike, and no hardware counter splits them (GH100, CUPTI's
# host API). The SASS metrics API patches every instruction and reports a value per program counter
# (function, pc offset); the module's own SASS (cuobjdump) names the opcode at each offset, so each
# opcode's executions are exact (`opcode_counts`). Like the patched pass, it runs instrumented code.

SASS_INST_EXECUTED = "smsp__sass_inst_executed"  # warp-level executions of each instruction
GRANULARITY_GPU = 0  # CUpti_SassMetrics_OutputGranularity: one value per instruction for the whole GPU


class SassMetricDetails(C.Structure):
    _fields_ = [("metricId", C.c_uint64), ("pMetricName", C.c_char_p), ("pMetricDescription", C.c_char_p)]


class SassMetricConfig(C.Structure):
    _fields_ = [("metricId", C.c_uint64), ("outputGranularity", C.c_uint8)]


class SassInstanceValue(C.Structure):
    _fields_ = [("metricId", C.c_uint64), ("value", C.c_uint64)]


class SassData(C.Structure):  # one instruction's record (its structSize is sizeof, as NVIDIA's samples set it)
    _fields_ = [("structSize", SIZE), ("pPriv", P), ("cubinCrc", C.c_uint32), ("functionIndex", C.c_uint32),
                ("functionName", C.c_char_p), ("pcOffset", C.c_uint32),
                ("pInstanceValues", C.POINTER(SassInstanceValue))]


SassNumMetrics = _struct("SassNumMetrics", [("pChipName", C.c_char_p), ("numOfMetrics", SIZE)])
SassGetMetrics = _struct("SassGetMetrics", [("pChipName", C.c_char_p), ("numOfMetrics", SIZE),
                                            ("pMetricsList", C.POINTER(SassMetricDetails))])
SassProperties = _struct("SassProperties", [("pChipName", C.c_char_p), ("pMetricName", C.c_char_p),
                                            ("metric", SassMetricDetails)])
SassSetConfig = _struct("SassSetConfig", [("numOfMetricConfig", SIZE), ("pConfigs", C.POINTER(SassMetricConfig)),
                                          ("deviceIndex", C.c_uint32)])
SassUnsetConfig = _struct("SassUnsetConfig", [("deviceIndex", C.c_uint32)])
SassEnable = _struct("SassEnable", [("ctx", P), ("enableLazyPatching", C.c_uint8)])
SassDisable = _struct("SassDisable", [("ctx", P), ("numOfDroppedRecords", SIZE)])
SassDataProperties = _struct("SassDataProperties", [("ctx", P), ("numOfPatchedInstructionRecords", SIZE),
                                                    ("numOfInstances", SIZE)])
SassFlush = _struct("SassFlush", [("ctx", P), ("numOfPatchedInstructionRecords", SIZE), ("numOfInstances", SIZE),
                                  ("pMetricsData", C.POINTER(SassData))])
# cupti_sass_metrics.h sizes this one to numOfInstances (CUPTI_PROFILER_STRUCT_SIZE), not to pMetricsData
SassFlush.size = SassFlush.numOfInstances.offset + C.sizeof(SIZE)


@dataclass(frozen=True)
class SassRecord:
    """One instruction's counts: where it is (function, pc offset in that function) and each
    metric's value summed over the instances CUPTI reported."""

    function: str
    pc_offset: int
    values: dict[str, int]
    cubin_crc: int = 0


def sass_metric_names(chip: str) -> dict[str, str]:
    """The SASS metrics API's metrics on `chip` (name -> description). Needs the driver: CUPTI
    answers NOT_INITIALIZED without one."""
    n = SassNumMetrics(pChipName=chip.encode())
    _call("cuptiSassMetricsGetNumOfMetrics", n)
    found = (SassMetricDetails * n.numOfMetrics)()
    _call("cuptiSassMetricsGetMetrics", SassGetMetrics(pChipName=chip.encode(), numOfMetrics=n.numOfMetrics,
                                                       pMetricsList=found))
    return {m.pMetricName.decode(): (m.pMetricDescription or b"").decode(errors="replace") for m in found}


class SassCounter:
    """Per-instruction counts of `metrics` over the launches `run()` makes (`collect`), on the
    current CUDA context. Patching is lazy (each function at its first launch inside the call), and
    the API is enabled for the call only: launches outside it run unpatched code."""

    def __init__(self, metrics: tuple[str, ...] = (SASS_INST_EXECUTED,), device_index: int = 0):
        from cuda.bindings import driver as d

        _call("cuptiProfilerInitialize", Init())
        err, ctx = d.cuCtxGetCurrent()
        if int(err) != 0 or not int(ctx):
            raise CuptiError("no current CUDA context to count")
        self.ctx, self.device_index = int(ctx), device_index
        chip = ChipName(deviceIndex=device_index)
        _call("cuptiDeviceGetChipName", chip)
        self.chip = (chip.pChipName or b"?").decode()
        self.ids: dict[int, str] = {}
        for name in metrics:
            props = SassProperties(pChipName=self.chip.encode(), pMetricName=name.encode())
            _call("cuptiSassMetricsGetProperties", props)
            self.ids[int(props.metric.metricId)] = name
        self._configs = (SassMetricConfig * len(self.ids))(
            *[SassMetricConfig(metricId=i, outputGranularity=GRANULARITY_GPU) for i in self.ids])
        self.dropped = 0
        # Set once for the device and kept (close() unsets it): a second SetConfig, even after
        # Disable and UnsetConfig, failed with CUPTI_ERROR_OUT_OF_MEMORY on the H200 (2026-12-03)
        _call("cuptiSassMetricsSetConfig", SassSetConfig(numOfMetricConfig=len(self._configs), pConfigs=self._configs,
                                                         deviceIndex=self.device_index))

    def collect(self, run) -> list[SassRecord]:
        """Call `run()` (it launches kernels and waits for them) with SASS metrics on; the records of
        every instruction patched in the call. CuptiError where CUPTI refuses or drops records: no
        partial counts are returned."""
        _call("cuptiSassMetricsEnable", SassEnable(ctx=self.ctx, enableLazyPatching=1))
        records: list[SassRecord] = []
        ok = False
        try:
            run()
            props = SassDataProperties(ctx=self.ctx)
            _call("cuptiSassMetricsGetDataProperties", props)
            n, k = int(props.numOfPatchedInstructionRecords), int(props.numOfInstances)
            if n:
                values = (SassInstanceValue * (n * k))()
                data = (SassData * n)()
                for i in range(n):
                    data[i].structSize = C.sizeof(SassData)
                    data[i].pInstanceValues = C.cast(C.byref(values, i * k * C.sizeof(SassInstanceValue)),
                                                     C.POINTER(SassInstanceValue))
                _call("cuptiSassMetricsFlushData", SassFlush(ctx=self.ctx, numOfPatchedInstructionRecords=n,
                                                             numOfInstances=k, pMetricsData=data))
                for i in range(n):
                    sums: dict[str, int] = {}
                    for j in range(k):
                        v = values[i * k + j]
                        name = self.ids.get(int(v.metricId))
                        if name is not None:
                            sums[name] = sums.get(name, 0) + int(v.value)
                    records.append(SassRecord((data[i].functionName or b"?").decode(errors="replace"),
                                              int(data[i].pcOffset), sums, int(data[i].cubinCrc)))
            ok = True
        finally:
            disable = SassDisable(ctx=self.ctx)
            if ok:
                _call("cuptiSassMetricsDisable", disable)
            else:  # the run's own error (a hang, a fault) is the verdict: never masked by CUPTI's
                with contextlib.suppress(CuptiError):
                    _call("cuptiSassMetricsDisable", disable)
            self.dropped = int(disable.numOfDroppedRecords)
        if self.dropped:
            raise CuptiError(f"CUPTI dropped {self.dropped} SASS metric records")
        return records

    def close(self) -> None:
        with contextlib.suppress(CuptiError):
            _call("cuptiSassMetricsUnsetConfig", SassUnsetConfig(deviceIndex=self.device_index))


def opcode_counts(records: list[SassRecord], sites: dict[str, dict[int, str]], metric: str = SASS_INST_EXECUTED
                  ) -> tuple[dict[str, int], list[str]]:
    """Executions per full opcode (e.g. "UTMALDG.2D", "UBLKCP.S.G") of the instructions at `sites`
    (function -> pc offset -> full opcode, from the module's own SASS: tools.results.KernelSass.tma_sites,
    or every instruction of tools.sass.parse_sass), from per-instruction records. Every site's opcode is
    in the counts (0 where it never ran). Returns (counts, missing): a site CUPTI returned no record for
    (its function was not patched, or named otherwise) is named in `missing`: its executions are not
    known, and a caller refuses what they might have been, never takes them as none."""
    seen: dict[tuple[str, int], int] = {}
    for r in records:
        key = (r.function, r.pc_offset)
        seen[key] = seen.get(key, 0) + r.values.get(metric, 0)
    counts: dict[str, int] = {}
    missing: list[str] = []
    for function, at in sites.items():
        for offset, op in at.items():
            n = seen.get((function, int(offset)))
            if n is None:
                missing.append(f"{function}+0x{int(offset):x}")
            counts[op] = counts.get(op, 0) + (n or 0)
    return counts, missing
