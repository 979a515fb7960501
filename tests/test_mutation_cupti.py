"""tools/cupti.py without a GPU, the parts tests/test_cupti_user_replay.py leaves out (found by
mutation testing, issue 46): the host half on the real library (GH100: configuration, errors, the
metrics it knows) and its decoder (`_Host.evaluate`: counter data -> one value per metric, in the
order asked); the constructor's device calls (chip, counter availability, context); the kernel-
replay profile (`profile(run)`, auto range: every launch a range); and the SASS metrics API
(`SassCounter`: configuration, one collect, the flushed per-instruction records decoded to
SassRecord). Where CUPTI needs a GPU its calls go to stand-ins that check what they are given as
CUPTI would read it (struct fields, pointers, sizes) and answer as the H200 did."""
from __future__ import annotations

import ctypes as C

import pytest
from test_cupti_user_replay import (CONFIGURE, DATA_INIT, DATA_INFO, DECODE_FN, DISABLE, ENABLE, RANGE_INFO,
                                    SET_CONFIG, START, STOP, one_range, setup, values)

from tools import credit, cupti
from tools.cupti import CuptiError, Launch, RangeProfiler, SassRecord

GMMA, TMA = credit.GMMA_METRIC, credit.TMA_INST_METRIC
REAL_CALL = cupti._call


@pytest.fixture(scope="module", autouse=True)
def _library():
    try:
        cupti.library()
    except CuptiError as exc:
        pytest.fail(f"libcupti is a dev dependency (nvidia-cuda-cupti): {exc}")


# ---------------------------------------------------------------------------------------------
# The host half, real (GH100)
# ---------------------------------------------------------------------------------------------

def test_the_host_configures_every_metric_in_order_and_closes_once():
    """Three metrics in one configuration image; the passes CUPTI plans for them (hardware counters
    only: one pass); the names kept for evaluation in the order asked; closed once (a second close
    is a no-op, not a double free)."""
    metrics = [GMMA, TMA, credit.TMA_BYTES_METRIC]
    host = cupti._Host("GH100", None, metrics)
    try:
        assert host.metrics == metrics and host.obj
        assert [host._names[i].decode() for i in range(len(metrics))] == metrics
        assert len(host.config) > 0 and any(host.config) and host.passes == 1
    finally:
        host.close()
    assert host.obj is None
    host.close()
    # the SASS-patched counters need a pass of their own
    assert cupti.passes("GH100", [GMMA, "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"]) == 2
    # the credit's metrics: 26 hardware counters in 4 passes (the counted branch dropped the SASS-patched
    # pass: its code could be sensed by a kernel and ran 2.6-49x slower; docs/METHODOLOGY.md; the bound
    # that needs no list traded the four per-pipe thread counters for one of every pipe, issue 42)
    assert len(credit.credit_metrics()) == 26 and not any(map(cupti.is_sass_patched, credit.credit_metrics()))
    assert cupti.passes("GH100", list(credit.credit_metrics())) == 4


@pytest.mark.parametrize("chip,metric,error", [
    ("GH100", "no_such_metric.sum", "cuptiProfilerHostConfigAddMetrics failed: CUPTI error 1 "
                                    "(CUPTI_ERROR_INVALID_PARAMETER)"),
    ("XX999", GMMA, "cuptiProfilerHostInitialize failed: CUPTI error 46 (CUPTI_ERROR_INVALID_CHIP_NAME)"),
])
def test_a_call_cupti_refuses_is_one_error_naming_the_call_and_cuptis_reason(chip, metric, error):
    with pytest.raises(CuptiError) as info:
        cupti.passes(chip, [metric])
    assert str(info.value) == error


def test_the_metrics_cupti_knows_on_gh100_with_their_descriptions():
    """The base metrics the credit rules name (without `.sum`) exist on GH100, with CUPTI's words."""
    known = cupti.base_metrics("GH100")
    assert len(known) > 1000
    assert known["smsp__inst_executed_pipe_tensor_op_gmma"] == (
        "# of warp instructions executed by tensor pipe (HGMMA/QGMMA/IGMMA/BGMMA ops)")
    assert known["sm__inst_executed_pipe_tma"] == "# of warp instructions executed by tma pipe"
    for metric in credit.credit_metrics():
        assert metric.removesuffix(".sum") in known, metric


def test_base_metrics_frees_its_host_even_when_a_call_fails(monkeypatch):
    real, calls = cupti._call, []

    def call(fn, params):
        calls.append(fn)
        if fn == "cuptiProfilerHostGetBaseMetrics":
            raise CuptiError("stand-in")
        return real(fn, params)

    monkeypatch.setattr(cupti, "_call", call)
    with pytest.raises(CuptiError, match="stand-in"):
        cupti.base_metrics("GH100")
    assert calls == ["cuptiProfilerHostInitialize", "cuptiProfilerHostGetBaseMetrics", "cuptiProfilerHostDeinitialize"]


def test_evaluate_decodes_one_range_into_each_metric_in_the_order_asked(monkeypatch):
    """The decoder: CUPTI is handed the host, the whole counter data image, the range and the
    metric names, and writes one double per name; each value lands on its own metric."""
    metrics = [GMMA, TMA, credit.TMA_BYTES_METRIC]
    host = cupti._Host("GH100", None, metrics)
    data = (C.c_uint8 * 96)()
    real, seen = cupti._call, []

    def call(fn, params):
        if fn != "cuptiProfilerHostEvaluateToGpuValues":
            return real(fn, params)
        assert params.pHostObject == host.obj
        assert C.addressof(params.pCounterDataImage.contents) == C.addressof(data)
        assert params.counterDataImageSize == 96 and params.numMetrics == 3
        names = [params.ppMetricNames[i].decode() for i in range(params.numMetrics)]
        seen.append((params.rangeIndex, names))
        for i in range(params.numMetrics):
            params.pMetricValues[i] = 1000.0 * params.rangeIndex + i + 0.5

    monkeypatch.setattr(cupti, "_call", call)
    try:
        assert host.evaluate(data, 2) == {GMMA: 2000.5, TMA: 2001.5, credit.TMA_BYTES_METRIC: 2002.5}
        assert host.evaluate(data, 0) == {GMMA: 0.5, TMA: 1.5, credit.TMA_BYTES_METRIC: 2.5}
        assert seen == [(2, metrics), (0, metrics)]
    finally:
        monkeypatch.setattr(cupti, "_call", real)
        host.close()


def test_evaluate_on_counter_data_no_gpu_wrote_is_cuptis_error():
    """An image no profiler session wrote (here: zeros) is refused by the real library, never read
    as counts."""
    host = cupti._Host("GH100", None, [GMMA])
    try:
        with pytest.raises(CuptiError, match="cuptiProfilerHostEvaluateToGpuValues failed: CUPTI error 1"):
            host.evaluate((C.c_uint8 * 4096)(), 0)
    finally:
        host.close()


def test_names_are_a_c_array_of_the_metrics_bytes():
    names = cupti._names([GMMA, TMA])
    assert len(names) == 2 and [names[0], names[1]] == [GMMA.encode(), TMA.encode()]


def test_is_sass_patched_reads_the_name_not_a_prefix():
    """Nsight's SASS-patched counters carry `__sass_` after the unit (smsp__, sm__); a counter named
    `sass` otherwise is not patched."""
    assert cupti.is_sass_patched("sm__sass_data_bytes_mem_global_op_ldgsts.sum")
    assert not cupti.is_sass_patched("sass_inst.sum") and not cupti.is_sass_patched("smsp__sassy.sum")
    assert not cupti.is_sass_patched("smsp__inst_executed_pipe_sass.sum")


# ---------------------------------------------------------------------------------------------
# RangeProfiler's constructor: the device calls (stand-ins) around the real host
# ---------------------------------------------------------------------------------------------

class Device:
    """CUPTI's device calls as the constructor makes them on an H200: the chip name for the device
    index asked, then the counter availability image (size first, then the image into the buffer
    sized for it)."""

    def __init__(self, chip: bytes | None = b"GH100", size: int = 16):
        self.chip, self.size, self.calls, self.hosts = chip, size, [], []

    def __call__(self, fn, params):
        if fn.startswith("cuptiProfilerHost"):  # the host half: the real library's
            return REAL_CALL(fn, params)
        assert isinstance(params, C.Structure), f"{fn} given {params!r}, not its params struct"
        self.calls.append(fn)
        if fn == "cuptiDeviceGetChipName":
            self.device = params.deviceIndex
            params.pChipName = self.chip
        elif fn == "cuptiProfilerGetCounterAvailability":
            assert params.ctx == 0x1234
            if not params.pCounterAvailabilityImage:
                params.counterAvailabilityImageSize = self.size
            else:
                assert params.counterAvailabilityImageSize == self.size
                for i in range(self.size):
                    params.pCounterAvailabilityImage[i] = i + 1
        elif fn.startswith("cuptiRangeProfiler"):
            raise AssertionError(f"{fn} in the constructor: the profiler is enabled per call")


@pytest.fixture
def device(monkeypatch):
    from cuda.bindings import driver as d

    dev = Device()
    monkeypatch.setattr(cupti, "_call", dev)
    monkeypatch.setattr(d, "cuCtxGetCurrent", lambda: (0, 0x1234))
    real = cupti._Host
    host = lambda chip, image, metrics: (dev.hosts.append((chip, bytes(image) if image is not None else None,  # noqa: E731
                                                           list(metrics))), real("GH100", None, metrics))[1]
    monkeypatch.setattr(cupti, "_Host", host)
    return dev


def test_the_constructor_reads_the_chip_and_the_counter_availability_of_the_device_asked(device):
    prof = RangeProfiler([GMMA, TMA], device_index=3)
    try:
        assert device.calls == ["cuptiProfilerInitialize", "cuptiDeviceGetChipName",
                                "cuptiProfilerGetCounterAvailability", "cuptiProfilerGetCounterAvailability"]
        assert device.device == 3 and prof.chip == "GH100" and prof.ctx == 0x1234
        assert device.hosts == [("GH100", bytes(range(1, 17)), [GMMA, TMA])]
        assert prof.metrics == [GMMA, TMA] and prof.passes == 1 and prof.instrumented_passes == ()
        # kernel replay and not kept enabled unless asked; nothing enabled yet; nothing profiled yet
        assert (prof.replay, prof.keep_enabled, prof._obj, prof._data, prof._names, prof.last_phase_s) == (
            "kernel", False, None, None, {}, {})
    finally:
        prof.close()
    kept = RangeProfiler([GMMA], keep_enabled=True, replay="user")
    assert (kept.replay, kept.keep_enabled) == ("user", True)
    kept.close()
    assert device.device == 0  # the default device


def test_a_chip_cupti_does_not_name_reads_as_unknown(device, monkeypatch):
    device.chip = None
    monkeypatch.setattr(cupti, "_Host", lambda chip, image, metrics: type("H", (), {
        "passes": 1, "chip": chip, "close": lambda self: None})())
    prof = RangeProfiler([GMMA])
    assert prof.chip == "?" and prof.host.chip == "?"


@pytest.mark.parametrize("answer", [(1, 0x1234), (0, 0)])
def test_without_a_current_context_there_is_nothing_to_profile(device, monkeypatch, answer):
    from cuda.bindings import driver as d

    monkeypatch.setattr(d, "cuCtxGetCurrent", lambda: answer)
    with pytest.raises(CuptiError, match="^no current CUDA context to profile$"):
        RangeProfiler([GMMA])
    assert device.calls == ["cuptiProfilerInitialize"] and device.hosts == []


# ---------------------------------------------------------------------------------------------
# profile(run): kernel replay, every launch a range (auto range)
# ---------------------------------------------------------------------------------------------

def kernel_replay(monkeypatch, **kw):
    """A kernel-replay profiler on the stand-in CUPTI: one Start..Stop, CUPTI replaying each launch
    for every pass itself (so the one Stop reports every pass submitted)."""
    return setup(monkeypatch, passes=1, replay="kernel", **kw)


def launch(fake, *names):
    """What `run()` does under auto range: each kernel launch becomes a range CUPTI names."""
    return lambda: fake.ranges.extend(names)


def test_profile_configures_auto_range_kernel_replay_runs_once_and_decodes_every_launch(monkeypatch):
    prof, fake = kernel_replay(monkeypatch)
    out = prof.profile(launch(fake, "a", "b"))
    assert out == [Launch("a", values("a")), Launch("b", values("b"))]
    assert fake.calls == [ENABLE, *CONFIGURE, START, STOP, DECODE_FN, DATA_INFO, RANGE_INFO, RANGE_INFO, DISABLE]
    assert fake.set_configs == [{"configSize": 24, "range": cupti.AUTO_RANGE, "replayMode": cupti.KERNEL_REPLAY,
                                 "maxRangesPerPass": cupti.MAX_RANGES, "numNestingLevels": 1, "minNestingLevel": 1,
                                 "passIndex": 0, "targetNestingLevel": 1}]
    assert prof.host.evaluated == [0, 1] and prof._obj is None and fake.enabled is None
    assert set(prof.last_phase_s) == {"setup", "runs", "decode", "disable"}
    assert all(v >= 0 for v in prof.last_phase_s.values())


def test_a_kept_profiler_stays_enabled_and_starts_afresh_once_when_refused(monkeypatch):
    """keep_enabled: the profiler object survives the call; the next call's configuration on it,
    refused by CUPTI, is retried once on a fresh enable (never looped on)."""
    prof, fake = kernel_replay(monkeypatch, fail=lambda fn, p: fn == DATA_INIT and fake.configured)
    prof.keep_enabled = True
    assert prof.profile(launch(fake, "gemm")) == [Launch("gemm", values("gemm"))]
    assert prof._obj is not None and fake.enabled == prof._obj and DISABLE not in fake.calls
    first = prof._obj
    fake.calls.clear()
    assert prof.profile(launch(fake, "a")) == [Launch("a", values("a"))]
    assert fake.calls == [DATA_INIT, DISABLE, ENABLE, *CONFIGURE, START, STOP, DECODE_FN, DATA_INFO, RANGE_INFO]
    assert prof._obj not in (None, first)
    prof.close()
    assert prof._obj is None and fake.enabled is None


def test_a_kept_profiler_refused_twice_is_the_error_and_disabled(monkeypatch):
    prof, fake = kernel_replay(monkeypatch, fail=lambda fn, p: fn == DATA_INIT and fake.count[DATA_INIT] > 1)
    prof.keep_enabled = True
    prof.profile(launch(fake, "gemm"))
    with pytest.raises(CuptiError, match=DATA_INIT):
        prof.profile(launch(fake, "gemm"))
    assert fake.count[ENABLE] == 2 and fake.enabled is None and prof._obj is None


def test_a_configuration_refused_is_retried_once_on_a_fresh_enable_and_an_enable_refused_never(monkeypatch):
    prof, fake = kernel_replay(monkeypatch, fail=lambda fn, p: fn == SET_CONFIG)
    ran = []
    with pytest.raises(CuptiError, match=SET_CONFIG):
        prof.profile(lambda: ran.append(1))
    assert fake.calls == [ENABLE, *CONFIGURE, DISABLE, ENABLE, *CONFIGURE, DISABLE] and ran == []
    assert prof.last_phase_s == {} and prof._obj is None
    prof, fake = kernel_replay(monkeypatch, fail=lambda fn, p: fn == ENABLE)
    with pytest.raises(CuptiError, match=ENABLE):
        prof.profile(lambda: ran.append(1))
    assert fake.calls == [ENABLE] and ran == []


@pytest.mark.parametrize("keep", [False, True])
def test_the_runs_own_error_is_the_verdict_and_the_profiler_is_disabled(monkeypatch, keep):
    """A run that faults: its error, not CUPTI's failing Stop; the profiler disabled even if kept."""
    prof, fake = kernel_replay(monkeypatch, fail=lambda fn, p: fn == STOP)
    prof.keep_enabled = keep

    def run():
        fake.ranges.append("gemm")
        raise RuntimeError("illegal address")

    with pytest.raises(RuntimeError, match="illegal address"):
        prof.profile(run)
    assert fake.calls == [ENABLE, *CONFIGURE, START, STOP, DISABLE]
    assert prof._obj is None and fake.enabled is None and prof.last_phase_s == {} and prof.host.evaluated == []


def test_a_stop_cupti_refuses_after_a_good_run_is_the_error(monkeypatch):
    prof, fake = kernel_replay(monkeypatch, fail=lambda fn, p: fn == STOP)
    prof.keep_enabled = True
    with pytest.raises(CuptiError, match=STOP):
        prof.profile(launch(fake, "gemm"))
    assert fake.calls[-2:] == [STOP, DISABLE] and prof._obj is None and prof.host.evaluated == []


def test_profile_with_dropped_ranges_is_an_error(monkeypatch):
    prof, fake = kernel_replay(monkeypatch, dropped=1)
    with pytest.raises(CuptiError, match=r"^1 ranges were dropped \(more than 64\?\)$"):
        prof.profile(launch(fake, "gemm"))
    assert prof._obj is None


def test_close_disables_and_frees_the_host(monkeypatch):
    prof, fake = kernel_replay(monkeypatch)
    closed = []
    prof.host.close = lambda: closed.append(1)
    prof.keep_enabled = True
    prof.profile(launch(fake, "gemm"))
    prof.close()
    assert fake.calls[-1] == DISABLE and closed == [1] and prof._obj is None
    prof.close()  # twice: nothing left to disable
    assert fake.count[DISABLE] == 1 and closed == [1, 1]


# ---------------------------------------------------------------------------------------------
# SassCounter: per-instruction records
# ---------------------------------------------------------------------------------------------

class SassCupti:
    """The SASS metrics API as SassCounter drives it, on an H200: metric ids for names, one
    configuration, and per collect the records of the instructions patched. `records`: per record
    (function name or None, pc offset, crc, [(metric id, value), ...] one per instance)."""

    IDS = {"smsp__sass_inst_executed": 0x51, "smsp__sass_thread_inst_executed": 0x77}

    def __init__(self, records=(), dropped: int = 0, fail=lambda fn: False, device: int = 2, chip: bytes | None = b"GH100"):
        self.records, self.dropped, self.fail, self.device, self.chip = list(records), dropped, fail, device, chip
        self.calls: list[str] = []
        self.enabled = False
        self.configs: list[list[tuple[int, int]]] = []

    def __call__(self, fn, params):
        self.calls.append(fn)
        assert isinstance(params, C.Structure), f"{fn} given {params!r}, not its params struct"
        if self.fail(fn):
            raise CuptiError(f"{fn} failed: stand-in")
        if fn == "cuptiDeviceGetChipName":
            assert params.deviceIndex == self.device
            params.pChipName = self.chip
        elif fn == "cuptiSassMetricsGetProperties":
            assert params.pChipName == (self.chip or b"?")
            params.metric.metricId = self.IDS[params.pMetricName.decode()]
        elif fn == "cuptiSassMetricsSetConfig":
            assert params.deviceIndex == self.device
            self.configs.append([(params.pConfigs[i].metricId, params.pConfigs[i].outputGranularity)
                                 for i in range(params.numOfMetricConfig)])
        elif fn == "cuptiSassMetricsEnable":
            assert params.ctx == 0x1234 and params.enableLazyPatching == 1 and not self.enabled
            self.enabled = True
        elif fn == "cuptiSassMetricsGetDataProperties":
            assert self.enabled and params.ctx == 0x1234
            params.numOfPatchedInstructionRecords = len(self.records)
            params.numOfInstances = len(self.records[0][3]) if self.records else 0
        elif fn == "cuptiSassMetricsFlushData":
            assert self.enabled and params.ctx == 0x1234
            assert params.numOfPatchedInstructionRecords == len(self.records)
            for i, (function, pc, crc, instances) in enumerate(self.records):
                rec = params.pMetricsData[i]
                assert rec.structSize == C.sizeof(cupti.SassData)
                rec.functionName, rec.pcOffset, rec.cubinCrc = function, pc, crc
                assert params.numOfInstances == len(instances)
                for j, (metric, value) in enumerate(instances):
                    rec.pInstanceValues[j].metricId, rec.pInstanceValues[j].value = metric, value
        elif fn == "cuptiSassMetricsDisable":
            assert params.ctx == 0x1234
            self.enabled = False
            params.numOfDroppedRecords = self.dropped
        elif fn == "cuptiSassMetricsUnsetConfig":
            assert params.deviceIndex == self.device
            self.configs.append([])


@pytest.fixture
def sass(monkeypatch):
    from cuda.bindings import driver as d

    def make(**kw):
        fake = SassCupti(**kw)
        monkeypatch.setattr(cupti, "_call", fake)
        return fake

    monkeypatch.setattr(d, "cuCtxGetCurrent", lambda: (0, 0x1234))
    return make


def test_the_counter_is_configured_once_for_every_metric_per_gpu(sass):
    fake = sass()
    counter = cupti.SassCounter(("smsp__sass_inst_executed", "smsp__sass_thread_inst_executed"), device_index=2)
    assert counter.chip == "GH100" and counter.ctx == 0x1234 and counter.device_index == 2
    assert counter.ids == {0x51: "smsp__sass_inst_executed", 0x77: "smsp__sass_thread_inst_executed"}
    assert fake.configs == [[(0x51, cupti.GRANULARITY_GPU), (0x77, cupti.GRANULARITY_GPU)]] and counter.dropped == 0
    assert fake.calls == ["cuptiProfilerInitialize", "cuptiDeviceGetChipName", "cuptiSassMetricsGetProperties",
                          "cuptiSassMetricsGetProperties", "cuptiSassMetricsSetConfig"]
    counter.close()
    assert fake.configs[-1] == [] and fake.calls[-1] == "cuptiSassMetricsUnsetConfig"
    assert cupti.GRANULARITY_GPU == 0  # one value per instruction for the whole GPU


def test_collect_decodes_each_instructions_record(sass):
    """Two metrics, two instances per record (as SMs report them): each record's values summed per
    metric name, an id not asked for ignored, the function name and pc offset kept."""
    records = [(b"gemm", 0x40, 7, [(0x51, 30), (0x51, 10)]),
               (b"gemm", 0x80, 7, [(0x77, 320), (0x51, 5)]),
               (None, 0x10, 9, [(0x99, 1), (0x51, 2)])]
    fake = sass(records=records)
    counter = cupti.SassCounter(("smsp__sass_inst_executed", "smsp__sass_thread_inst_executed"), device_index=2)
    ran = []
    out = counter.collect(lambda: ran.append(fake.enabled))
    assert ran == [True] and not fake.enabled  # the run inside, disabled after
    assert out == [SassRecord("gemm", 0x40, {"smsp__sass_inst_executed": 40}, 7),
                   SassRecord("gemm", 0x80, {"smsp__sass_thread_inst_executed": 320, "smsp__sass_inst_executed": 5}, 7),
                   SassRecord("?", 0x10, {"smsp__sass_inst_executed": 2}, 9)]
    assert fake.calls[-4:] == ["cuptiSassMetricsEnable", "cuptiSassMetricsGetDataProperties",
                               "cuptiSassMetricsFlushData", "cuptiSassMetricsDisable"]


def test_three_instances_per_record_land_on_their_own_record(sass):
    records = [(b"k", 16 * i, 0, [(0x51, 100 * i + j) for j in range(3)]) for i in range(4)]
    sass(records=records)
    counter = cupti.SassCounter(device_index=2)
    out = counter.collect(lambda: None)
    assert [(x.pc_offset, x.values) for x in out] == [
        (16 * i, {"smsp__sass_inst_executed": 300 * i + 3}) for i in range(4)]


def test_no_patched_instruction_is_no_record_and_no_flush(sass):
    fake = sass()
    counter = cupti.SassCounter(device_index=2)
    assert counter.collect(lambda: None) == []
    assert "cuptiSassMetricsFlushData" not in fake.calls and fake.calls[-1] == "cuptiSassMetricsDisable"


def test_dropped_records_are_an_error_never_partial_counts(sass):
    fake = sass(records=[(b"k", 0, 0, [(0x51, 1)])], dropped=3)
    counter = cupti.SassCounter(device_index=2)
    with pytest.raises(CuptiError, match="^CUPTI dropped 3 SASS metric records$"):
        counter.collect(lambda: None)
    assert counter.dropped == 3 and not fake.enabled


def test_the_runs_own_error_is_the_verdict_and_the_api_disabled(sass):
    fake = sass(fail=lambda fn: fn == "cuptiSassMetricsDisable")
    counter = cupti.SassCounter(device_index=2)
    with pytest.raises(TimeoutError, match="hang"):
        counter.collect(lambda: (_ for _ in ()).throw(TimeoutError("hang")))
    assert fake.calls[-1] == "cuptiSassMetricsDisable"
    # after a good run, CUPTI refusing Disable is the error
    fake.enabled = False
    with pytest.raises(CuptiError, match="cuptiSassMetricsDisable"):
        counter.collect(lambda: None)


def test_a_counter_needs_a_context_and_close_never_raises(sass, monkeypatch):
    from cuda.bindings import driver as d

    fake = sass(fail=lambda fn: fn == "cuptiSassMetricsUnsetConfig")
    counter = cupti.SassCounter(device_index=2)
    counter.close()
    assert fake.calls[-1] == "cuptiSassMetricsUnsetConfig"
    for answer in ((1, 0x1234), (0, 0)):
        monkeypatch.setattr(d, "cuCtxGetCurrent", lambda a=answer: a)
        with pytest.raises(CuptiError, match="^no current CUDA context to count$"):
            cupti.SassCounter(device_index=2)


def test_a_counter_on_the_default_device_and_a_chip_cupti_does_not_name(sass):
    sass(device=0, chip=None)
    counter = cupti.SassCounter()
    assert counter.device_index == 0 and counter.chip == "?"
    assert list(counter.ids.values()) == [cupti.SASS_INST_EXECUTED]


def test_a_function_name_that_is_not_utf8_is_kept_readable(sass):
    sass(records=[(b"\xffgemm", 0x40, 1, [(0x51, 3)])])
    out = cupti.SassCounter(device_index=2).collect(lambda: None)
    assert out == [SassRecord("\ufffdgemm", 0x40, {"smsp__sass_inst_executed": 3}, 1)]


# ---------------------------------------------------------------------------------------------
# What the host half hands CUPTI, and what CUPTI hands back that is odd
# ---------------------------------------------------------------------------------------------

def test_the_host_hands_cupti_the_counter_availability_and_the_config_images_size(monkeypatch):
    """A profiler on a GPU configures against what the device can count (its availability image,
    which only a GPU can write: here a stand-in buffer, taken out again before the real library
    sees it), and the pass count is read from the whole config image."""
    seen = {}

    def call(fn, params):
        if fn == "cuptiProfilerHostInitialize":
            seen["image"] = C.cast(params.pCounterAvailabilityImage, C.c_void_p).value
            seen["type"] = params.profilerType
            params.pCounterAvailabilityImage = None
        if fn == "cuptiProfilerHostGetNumOfPasses":
            seen["size"] = params.configImageSize
            seen["config"] = C.addressof(params.pConfigImage.contents)
        return REAL_CALL(fn, params)

    monkeypatch.setattr(cupti, "_call", call)
    image = (C.c_uint8 * 16)()
    host = cupti._Host("GH100", image, [GMMA])
    try:
        assert seen == {"image": C.addressof(image), "type": cupti.RANGE_PROFILER, "size": len(host.config),
                        "config": C.addressof(host.config)}
    finally:
        host.close()
    host = cupti._Host("GH100", None, [GMMA])
    host.close()
    assert seen["image"] is None


def test_metric_descriptions_cupti_leaves_empty_or_not_utf8_are_still_read(monkeypatch):
    def call(fn, params):
        REAL_CALL(fn, params)
        if fn == "cuptiProfilerHostGetMetricProperties":
            if params.pMetricName == b"sm__inst_executed_pipe_tma":
                params.pDescription = None
            elif params.pMetricName == b"smsp__inst_executed_pipe_tensor_op_gmma":
                params.pDescription = b"gmma \xff"
        if fn == "cuptiProfilerHostGetBaseMetrics":
            assert params.metricType == 0  # CUPTI_METRIC_TYPE_COUNTER: counters, not ratios or throughputs

    monkeypatch.setattr(cupti, "_call", call)
    known = cupti.base_metrics("GH100")
    assert known["sm__inst_executed_pipe_tma"] == "" and known["smsp__inst_executed_pipe_tensor_op_gmma"] == "gmma \ufffd"


def test_each_replay_mode_says_which_profiler_its_call_needs(monkeypatch):
    user, _ = setup(monkeypatch)
    with pytest.raises(CuptiError) as info:
        user.profile(lambda: None)
    assert str(info.value) == "profile(run) needs a RangeProfiler built with replay='kernel'"
    kernel, _ = kernel_replay(monkeypatch)
    with pytest.raises(CuptiError) as info:
        kernel.profile_passes(lambda i, ranged: None, "gemm")
    assert str(info.value) == "profile_passes needs a RangeProfiler built with replay='user'"


def test_a_disable_cupti_refuses_after_the_counts_were_read_loses_nothing(monkeypatch):
    """The counts are read; CUPTI failing to disable afterwards (or on close) is not the run's
    error and costs no verdict."""
    prof, fake = kernel_replay(monkeypatch, fail=lambda fn, p: fn == DISABLE)
    assert prof.profile(launch(fake, "gemm")) == [Launch("gemm", values("gemm"))]
    prof.close()
    user, fake = setup(monkeypatch, fail=lambda fn, p: fn == DISABLE)
    assert user.profile_passes(one_range([]), "gemm") == [Launch("gemm", values("gemm"))]
    assert fake.calls[-1] == DISABLE


@pytest.mark.parametrize("mode", ["kernel", "user"])
def test_the_phases_of_a_profile_add_up_to_its_wall_time(monkeypatch, mode):
    import time

    if mode == "kernel":
        prof, fake = kernel_replay(monkeypatch)
        t0 = time.perf_counter()
        prof.profile(launch(fake, "gemm"))
    else:
        prof, fake = setup(monkeypatch)

        def run_pass(i, ranged):
            with ranged():
                pass

        t0 = time.perf_counter()
        prof.profile_passes(run_pass, "gemm")
    wall = time.perf_counter() - t0
    phases = prof.last_phase_s
    assert all(0 <= v <= wall for v in phases.values()), phases
    parts = sum(v for k, v in phases.items() if k != "total")
    assert parts <= wall and (mode == "kernel" or parts <= phases["total"] <= wall)


def test_a_host_that_fails_to_close_does_not_hide_why_the_profiler_was_refused(device, monkeypatch):
    def host(chip, image, metrics):
        def close():
            raise CuptiError("cuptiProfilerHostDeinitialize failed")
        return type("H", (), {"passes": 40, "close": staticmethod(close)})()

    monkeypatch.setattr(cupti, "_Host", host)
    with pytest.raises(CuptiError, match=r"^the metrics need 40 passes \(at most 32\)$"):
        RangeProfiler([GMMA])


# ---------------------------------------------------------------------------------------------
# opcode_counts, fast (tests/test_sass_counts.py reads the sites from a real cubin's SASS)
# ---------------------------------------------------------------------------------------------

def test_opcode_counts_sum_each_sites_records_per_opcode():
    """Records of one instruction from several SMs are summed; an opcode at two sites is summed;
    another metric's values and other functions' records are not counted; a site given as a string
    offset (as JSON keys arrive) is the same site; a site never recorded is named, hex, and counts 0."""
    records = [SassRecord("gemm", 0x40, {cupti.SASS_INST_EXECUTED: 3, "smsp__sass_thread_inst_executed": 96}),
               SassRecord("gemm", 0x40, {cupti.SASS_INST_EXECUTED: 2}),
               SassRecord("gemm", 0x80, {cupti.SASS_INST_EXECUTED: 7}),
               SassRecord("gemm", 0xC0, {"smsp__sass_thread_inst_executed": 32}),
               SassRecord("other", 0x40, {cupti.SASS_INST_EXECUTED: 100})]
    sites = {"gemm": {0x40: "UTMALDG.2D", "128": "UTMALDG.2D", 0xC0: "UBLKCP.S.G", 0x100: "UBLKCP.S.G"}}
    assert cupti.opcode_counts(records, sites) == ({"UTMALDG.2D": 12, "UBLKCP.S.G": 0}, ["gemm+0x100"])
    assert cupti.opcode_counts(records, sites, "smsp__sass_thread_inst_executed") == (
        {"UTMALDG.2D": 96, "UBLKCP.S.G": 32}, ["gemm+0x100"])
    assert cupti.opcode_counts([], {}) == ({}, [])
    assert cupti.opcode_counts([], {"k": {16: "UBLKCP.S.G"}}) == ({"UBLKCP.S.G": 0}, ["k+0x10"])


def test_closing_a_kept_profiler_that_cupti_refuses_to_disable_does_not_raise(monkeypatch):
    prof, fake = kernel_replay(monkeypatch, fail=lambda fn, p: fn == DISABLE)
    prof.keep_enabled = True
    prof.profile(launch(fake, "gemm"))
    assert prof._obj is not None
    prof.close()  # the worker is shutting down: nothing left to protect
    assert prof._obj is None and fake.calls[-1] == DISABLE
