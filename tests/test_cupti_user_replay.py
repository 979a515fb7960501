"""tools.cupti.RangeProfiler's user replay (`profile_passes`), without a GPU: its calls into CUPTI
go to a stand-in for the range profiler (tools.cupti._call patched) that plays CUPTI's state
(enabled, configured, started, ranges pushed, passes submitted) as the H200 showed it, and fails
where a test says so. What is checked is the control flow the executed check relies on: one
configuration holding every metric, set once per call; exactly the passes it planned, one run of
the caller's per pass, in order; what each Stop returned recorded, and counts evaluated only once
the last Stop reported every pass submitted; the profiler enabled for the call only and always
disabled; the run's own error, never CUPTI's, as the verdict. The constructor is checked with the
real host half (GH100). What the counters read on a GPU is tests/gpu/test_cupti_counters_gpu.py's."""
from __future__ import annotations

import ctypes as C
import time
from collections import Counter

import pytest

from tools import credit, cupti
from tools.cupti import CuptiError, Launch, RangeProfiler
from tools.timing import KernelTimeout

HW = [credit.GMMA_METRIC, credit.TMA_INST_METRIC]  # hardware counters
SASS = ["smsp__sass_thread_inst_executed_op_ffma_pred_on.sum", "sm__sass_data_bytes_mem_global_op_ldgsts.sum"]
METRICS = HW + SASS
NAMES = ["gemm", "a", "b"]  # range names the tests push; the value read for a range encodes its name and metric
CONFIG_SIZE = 24  # the stand-in host's config image
DATA_SIZE = 32  # the counter data image the stand-in CUPTI asks for
START, PUSH, POP, STOP = ("cuptiRangeProfilerStart", "cuptiRangeProfilerPushRange", "cuptiRangeProfilerPopRange",
                          "cuptiRangeProfilerStop")
ENABLE, DISABLE, SET_CONFIG = "cuptiRangeProfilerEnable", "cuptiRangeProfilerDisable", "cuptiRangeProfilerSetConfig"
DATA_SIZE_FN, DATA_INIT = "cuptiRangeProfilerGetCounterDataSize", "cuptiRangeProfilerCounterDataImageInitialize"
DECODE_FN, DATA_INFO = "cuptiRangeProfilerDecodeData", "cuptiRangeProfilerGetCounterDataInfo"
RANGE_INFO = "cuptiRangeProfilerCounterDataGetRangeInfo"
CONFIGURE = [DATA_SIZE_FN, DATA_INIT, SET_CONFIG]
DECODE = [DECODE_FN, DATA_INFO]
PER_PASS = [START, PUSH, POP, STOP]
CONTEXT = 0x1  # the CUDA context the stand-in profiler is built on
H200_TWO_PASSES = [[1, 1, 0], [0, 1, 1]]  # what Stop returned for a 2-pass configuration (H200, 2026-12-02)


class FakeCupti:
    """The range profiler's device half as tools.cupti._call drives it. `needs`: the passes CUPTI
    asks for (default the host's plan). Stop returns what the H200's did: the next pass index,
    nesting level 1, not all submitted; after the pass that completes `needs`, pass index 0 (it
    wraps) and all submitted 1. `stops`: what each Stop returns instead, where a test says.
    `fail(fn, params)`: whether this call fails (CuptiError, as _call raises it; `count` already
    includes it)."""

    def __init__(self, host: FakeHost, needs: int | None = None, stops: list[list[int]] | None = None,
                 fail=None, dropped: int = 0):
        self.host, self.needs, self.stops = host, needs or host.passes, stops
        self.fail = fail or (lambda fn, params: False)
        self.dropped = dropped
        self.calls: list[str] = []
        self.count: Counter[str] = Counter()
        self.enabled: int | None = None
        self.configured = self.started = self.decoded = self.submitted = False
        self.data_size: int | None = None  # the counter data image initialized on this enable: its size
        self.data: int | None = None  # and its address
        self.collecting = 0  # the pass being collected
        self.next_pass = 0  # the pass index the last Stop returned
        self.ranges: list[str] = []  # range names, in first-push order
        self.name_at: list[tuple[str, int]] = []  # each PushRange's name and the address it was given at
        self.set_configs: list[dict[str, int]] = []
        self.objects = 0x100

    def __call__(self, fn: str, params) -> None:
        self.calls.append(fn)
        self.count[fn] += 1
        # what CUPTI reads before it can fail: its params struct, and the object or image it names
        assert isinstance(params, C.Structure), f"{fn} given {params!r}, not its params struct"
        if fn in (DATA_INFO, RANGE_INFO):  # read the counter data image: the one initialized
            assert C.addressof(params.pCounterDataImage.contents) == self.data, f"{fn}: not the counter data"
            assert params.counterDataImageSize == DATA_SIZE, f"{fn}: not the counter data's size"
        elif fn != ENABLE:
            assert params.pRangeProfilerObject == self.enabled and self.enabled is not None, f"{fn} while not enabled"
        else:
            assert params.ctx == CONTEXT, "enabled on another context"
        if self.fail(fn, params):
            raise CuptiError(f"{fn} failed: CUPTI error 1 (stand-in)")
        if fn == ENABLE:
            assert self.enabled is None, "enabled twice"
            self.objects += 1
            params.pRangeProfilerObject = self.enabled = self.objects
        elif fn == DISABLE:
            self.enabled, self.data_size, self.data, self.started = None, None, None, False
            self.configured = self.decoded = self.submitted = False
        elif fn == DATA_SIZE_FN:
            assert params.numMetrics == len(self.host.metrics) and params.maxNumOfRanges == cupti.MAX_RANGES
            assert params.maxNumRangeTreeNodes == cupti.MAX_RANGES
            assert [params.pMetricNames[i].decode() for i in range(params.numMetrics)] == self.host.metrics
            params.counterDataSize = DATA_SIZE
        elif fn == DATA_INIT:
            assert params.counterDataSize == DATA_SIZE and not self.configured
            self.data_size, self.data = DATA_SIZE, C.addressof(params.pCounterData.contents)
        elif fn == SET_CONFIG:
            assert self.data_size == params.counterDataImageSize == DATA_SIZE, "counter data not initialized"
            assert C.addressof(params.pCounterDataImage.contents) == self.data, "not the counter data initialized"
            assert not self.started, "configured inside a pass"
            assert not self.configured, "configured twice on one enable"
            assert C.addressof(params.pConfig.contents) == C.addressof(self.host.config), "not the host's config"
            self.configured, self.next_pass, self.ranges = True, params.passIndex, []
            self.set_configs.append({k: getattr(params, k) for k in (
                "configSize", "range", "replayMode", "maxRangesPerPass", "numNestingLevels", "minNestingLevel",
                "passIndex", "targetNestingLevel")})
        elif fn == START:
            assert self.configured and not self.started
            self.started, self.collecting = True, self.next_pass
        elif fn == PUSH:
            assert self.started
            name = params.pRangeName.decode()
            if name not in self.ranges:
                self.ranges.append(name)
            # CUPTI may keep the pointer (to match the range in later passes): remember it as C would
            self.name_at.append((name, C.c_void_p.from_buffer(params, type(params).pRangeName.offset).value))
        elif fn == POP:
            assert self.started
        elif fn == STOP:
            assert self.started
            self.started = False
            done = self.collecting + 1 >= self.needs
            self.next_pass = 0 if done else self.collecting + 1
            said = [self.next_pass, 1, int(done)]
            if self.stops is not None:
                said = self.stops[self.count[STOP] - 1]
            params.passIndex, params.targetNestingLevel, params.isAllPassSubmitted = said
            self.submitted = bool(said[2])
        elif fn == DECODE_FN:
            assert not self.started
            churn = [bytes(len(n) + k % 3) for k in range(3000) for n, _ in self.name_at[:1]]  # reuse freed blocks
            for n, at in self.name_at:  # every pointer CUPTI was given still holds its name
                assert C.string_at(at) == n.encode(), f"the range name {n!r} CUPTI was given was freed"
            del churn
            self.decoded = True
            params.numOfRangeDropped = self.dropped
        elif fn == DATA_INFO:
            assert self.decoded and params.counterDataImageSize == DATA_SIZE
            params.numTotalRanges = len(self.ranges)
        elif fn == RANGE_INFO:
            assert self.decoded and params.rangeDelimiter == b"/"
            params.rangeName = self.ranges[params.rangeIndex].encode()

    def passes_of(self) -> list[list[str]]:
        """The calls between each Start and its Stop, one list per pass."""
        out, cur = [], None
        for fn in self.calls:
            if fn == START:
                cur = []
            elif fn == STOP and cur is not None:
                out.append(cur)
                cur = None
            elif cur is not None:
                cur.append(fn)
        return out


class FakeHost:
    """tools.cupti._Host: its metrics, planned passes and config image; evaluate reads the range's
    name, and only from counter data CUPTI decoded after every pass was submitted."""

    def __init__(self, metrics: list[str], passes: int):
        self.metrics, self.passes = list(metrics), passes
        self.config = (C.c_uint8 * CONFIG_SIZE)()
        self._names = cupti._names(self.metrics)
        self.fake: FakeCupti | None = None
        self.evaluated: list[int] = []

    def evaluate(self, data, index: int) -> dict[str, float]:
        assert len(data) == DATA_SIZE and C.addressof(data) == self.fake.data, "not the counter data"
        assert self.fake.decoded and self.fake.submitted, "partial counts evaluated"
        self.evaluated.append(index)
        return {m: value(self.fake.ranges[index], m) for m in self.metrics}

    def close(self) -> None:
        pass


def value(name: str, metric: str) -> float:
    return float(100 * NAMES.index(name) + METRICS.index(metric))


def values(name: str) -> dict[str, float]:
    return {m: value(name, m) for m in METRICS}


def setup(monkeypatch, passes: int = 3, replay: str = "user", **kw) -> tuple[RangeProfiler, FakeCupti]:
    """A RangeProfiler as __init__ leaves it for METRICS in `passes` passes, on a stand-in CUPTI,
    with no GPU."""
    host = FakeHost(METRICS, passes)
    fake = host.fake = FakeCupti(host, **kw)
    monkeypatch.setattr(cupti, "_call", fake)
    prof = RangeProfiler.__new__(RangeProfiler)
    prof.keep_enabled, prof.replay, prof.ctx, prof._obj, prof._data = False, replay, CONTEXT, None, None
    prof._names = {}
    prof.chip, prof.metrics, prof.host, prof.passes = "GH100", list(METRICS), host, passes
    prof.instrumented_passes = (passes - 1,)
    prof.last_phase_s = {}
    return prof, fake


def one_range(seen: list[int]):
    def run_pass(i, ranged):
        seen.append(i)
        with ranged():
            pass
    return run_pass


# ---------------------------------------------------------------- the pass loop

@pytest.mark.parametrize("passes,stops", [(2, H200_TWO_PASSES), (3, [[1, 1, 0], [2, 1, 0], [0, 1, 1]]),
                                          (6, [[1, 1, 0], [2, 1, 0], [3, 1, 0], [4, 1, 0], [5, 1, 0], [0, 1, 1]])])
def test_one_set_config_then_start_push_pop_stop_per_pass(monkeypatch, passes, stops):
    """Enabled once, its counter data sized and initialized, ONE SetConfig (user range, user
    replay, pass 0, nesting level 1) for every metric, then one Start/Push/Pop/Stop per pass with
    the caller's run inside (i = 0 .. passes-1), then decode; disabled at the end. What each Stop
    returned is kept (the H200's: the pass index advancing, wrapping to 0 with all submitted)."""
    prof, fake = setup(monkeypatch, passes=passes)
    seen: list[int] = []
    launches = prof.profile_passes(one_range(seen), "gemm")
    assert seen == list(range(passes))
    assert fake.calls == [ENABLE, *CONFIGURE, *PER_PASS * passes, *DECODE, RANGE_INFO, DISABLE]
    assert fake.set_configs == [{"configSize": CONFIG_SIZE, "range": cupti.USER_RANGE, "replayMode": cupti.USER_REPLAY,
                                 "maxRangesPerPass": cupti.MAX_RANGES, "numNestingLevels": 1, "minNestingLevel": 1,
                                 "passIndex": 0, "targetNestingLevel": 1}]
    assert prof.last_stops == stops
    assert launches == [Launch("gemm", values("gemm"))] and prof.host.evaluated == [0]
    assert prof._obj is None and fake.enabled is None  # enabled for this call only
    assert set(prof.last_phase_s) == {"setup", "runs", "decode", "disable", "total"}


def test_the_run_is_made_between_push_and_pop_and_prepared_outside(monkeypatch):
    """run_pass starts after Start (its preparation is outside the range), its launches come
    after Push, and its wait after Pop, before Stop."""
    prof, fake = setup(monkeypatch)
    marks = []

    def run_pass(i, ranged):
        marks.append(("prepare", i, fake.calls[-1]))
        with ranged():
            marks.append(("run", i, fake.calls[-1]))
        marks.append(("wait", i, fake.calls[-1]))

    prof.profile_passes(run_pass, "gemm")
    assert marks == [(what, i, last) for i in range(3) for what, last in
                     (("prepare", START), ("run", PUSH), ("wait", POP))]


@pytest.mark.parametrize("needs", [3, 1])
def test_exactly_the_planned_passes_run_while_cupti_reports_every_pass_submitted(monkeypatch, needs):
    """The planned passes, never looped on nor cut short where a Stop reports every pass
    submitted early: the instrumented pass stays the last one planned."""
    prof, fake = setup(monkeypatch, needs=needs)
    seen: list[int] = []
    launches = prof.profile_passes(one_range(seen), "gemm")
    assert seen == [0, 1, 2] and fake.count[START] == fake.count[STOP] == 3 and fake.count[SET_CONFIG] == 1
    assert prof.last_stops == {3: [[1, 1, 0], [2, 1, 0], [0, 1, 1]], 1: [[0, 1, 1]] * 3}[needs]
    assert launches == [Launch("gemm", values("gemm"))]


@pytest.mark.parametrize("needs,stops", [
    (4, None),  # CUPTI wanted a fourth pass
    (2, [[1, 1, 0], [1, 1, 0]]),  # the H200's pass index, without all submitted
    (3, [[1, 1, 0], [0, 1, 1], [1, 1, 0]]),  # all submitted on a pass, not on the last
])
def test_a_last_stop_without_every_pass_submitted_is_an_error(monkeypatch, needs, stops):
    """The last Stop must report every pass submitted: else CuptiError after the planned passes,
    nothing decoded or evaluated (no partial counts), and the profiler still disabled."""
    prof, fake = setup(monkeypatch, passes=len(stops) if stops else 3, needs=needs, stops=stops)
    seen: list[int] = []
    with pytest.raises(CuptiError, match="did not report every pass submitted") as info:
        prof.profile_passes(one_range(seen), "gemm")
    planned = prof.passes
    assert seen == list(range(planned)) and fake.count[STOP] == planned
    assert prof.last_stops == (stops or [[1, 1, 0], [2, 1, 0], [3, 1, 0]]) and str(prof.last_stops) in str(info.value)
    assert fake.calls == [ENABLE, *CONFIGURE, *PER_PASS * planned, DISABLE] and prof.host.evaluated == []
    assert prof._obj is None and fake.enabled is None and "total" in prof.last_phase_s


def test_the_h200s_two_pass_stops_are_accepted(monkeypatch):
    """Exactly what Stop returned on the H200 for two passes: [1, 1, 0], then [0, 1, 1]."""
    prof, fake = setup(monkeypatch, passes=2, stops=H200_TWO_PASSES)
    assert prof.profile_passes(one_range([]), "gemm") == [Launch("gemm", values("gemm"))]
    assert prof.last_stops == H200_TWO_PASSES


def test_values_are_kept_apart_per_range_name(monkeypatch):
    """Several ranges per pass are kept apart by name, each with every metric."""
    prof, fake = setup(monkeypatch)

    def run_pass(i, ranged):
        with ranged("a"):
            pass
        with ranged():
            pass

    launches = prof.profile_passes(run_pass, "gemm")
    assert launches == [Launch("a", values("a")), Launch("gemm", values("gemm"))]
    assert fake.passes_of() == [[PUSH, POP, PUSH, POP]] * 3 and fake.count[RANGE_INFO] == 2


def test_the_profiler_is_enabled_per_call(monkeypatch):
    """Enable, counter data size and image, and SetConfig once per call; disabled after each."""
    prof, fake = setup(monkeypatch)
    for k in (1, 2):
        assert prof.profile_passes(one_range([]), "gemm") == [Launch("gemm", values("gemm"))]
        assert prof._obj is None and fake.enabled is None
        assert all(fake.count[fn] == k for fn in [ENABLE, DISABLE, *CONFIGURE])


def test_kept_enabled_the_next_call_configures_the_same_object_and_close_disables_it(monkeypatch):
    """keep_enabled (the experiment of tools.cupti.KEEP_ENABLED_ENV): no Disable after a whole profile, the
    next call configures the object the first enabled (CUPTI's restart, scripts/probe_range_cost.py's
    `restart`: a second configuration on an enabled object), close() disables it; a failed profile is
    never kept."""
    prof, fake = setup(monkeypatch)
    prof.keep_enabled = True
    reconfigured = []

    def call(fn, params, plain=fake.__call__):
        if fn == DATA_INIT and fake.decoded:  # the stand-in's one configuration per enable, lifted after a decode
            reconfigured.append(fake.enabled)
            fake.configured = fake.decoded = fake.submitted = False
        return plain(fn, params)

    monkeypatch.setattr(cupti, "_call", call)
    for k in (1, 2):
        assert prof.profile_passes(one_range([]), "gemm") == [Launch("gemm", values("gemm"))]
        assert fake.count[ENABLE] == 1 and fake.count[DISABLE] == 0 and fake.count[SET_CONFIG] == k
    assert reconfigured == [fake.enabled]
    prof.close()
    assert fake.count[DISABLE] == 1 and fake.enabled is None

    prof, fake = setup(monkeypatch, fail=lambda fn, params: fn == STOP and fake.count[STOP] == 2)
    prof.keep_enabled = True
    with pytest.raises(CuptiError):
        prof.profile_passes(one_range([]), "gemm")
    assert fake.count[DISABLE] == 1 and fake.enabled is None


def test_each_pass_records_the_host_seconds_of_its_start_and_its_stop(monkeypatch):
    """Each pass's Start and Stop (`last_pass_s`, [start, stop] seconds per pass, in order): the
    boundaries between stretches of counted runs, charged as the check's `pass_boundaries` cost
    (tools.counted). Here CUPTI takes 20 ms for each; nothing else is inside either figure."""
    slow = {START: 0.02, STOP: 0.02}
    prof, fake = setup(monkeypatch, fail=lambda fn, params: time.sleep(slow.get(fn, 0.0)) or False)
    prof.profile_passes(one_range([]), "gemm")
    assert len(prof.last_pass_s) == 3
    for start, stop in prof.last_pass_s:
        assert 0.02 <= start < 5.0 and 0.02 <= stop < 5.0, prof.last_pass_s  # (a loaded host: far below an uptime)


# ---------------------------------------------------------------- errors

@pytest.mark.parametrize("where", ["inside", "after"])
def test_the_runs_error_propagates_and_the_profiler_is_disabled(monkeypatch, where):
    """A run that hangs (inside its range, or in its wait after it): the hang is the verdict.
    CUPTI then failing to pop the range or stop the pass (a stuck GPU) is suppressed, and the
    profiler is still disabled."""
    broken = {POP, STOP} if where == "inside" else {STOP}
    prof, fake = setup(monkeypatch, fail=lambda fn, params: fn in broken and fake.count[START] == 2)
    seen: list[int] = []

    def run_pass(i, ranged):
        seen.append(i)
        with ranged():
            if where == "inside" and i == 1:
                raise KernelTimeout("the GPU did not finish within 5 s")
        if i == 1:
            raise KernelTimeout("the GPU did not finish within 5 s")

    with pytest.raises(KernelTimeout):
        prof.profile_passes(run_pass, "gemm")
    assert seen == [0, 1] and fake.count[STOP] == 2 and fake.count[POP] == 2  # the failing ones tried
    assert fake.calls == [ENABLE, *CONFIGURE, *PER_PASS, *PER_PASS, DISABLE]
    assert prof._obj is None and fake.enabled is None and prof.last_stops == [[1, 1, 0]]  # pass 0's only
    assert prof.host.evaluated == [] and "total" in prof.last_phase_s
    # the failed pass's Start is timed, its Stop (CUPTI's clean-up after the error) is not a boundary
    assert len(prof.last_pass_s) == 2 and prof.last_pass_s[1][1] == 0.0 and prof.last_pass_s[0][1] >= 0.0


def test_a_run_error_with_cupti_working_is_not_wrapped(monkeypatch):
    prof, fake = setup(monkeypatch)

    def run_pass(i, ranged):
        with ranged():
            raise ValueError("the judge's verdict")

    with pytest.raises(ValueError, match="the judge's verdict"):
        prof.profile_passes(run_pass, "gemm")
    assert fake.calls == [ENABLE, *CONFIGURE, *PER_PASS, DISABLE]


def test_a_pass_that_pushes_no_range_is_an_error_after_its_stop(monkeypatch):
    prof, fake = setup(monkeypatch)

    def run_pass(i, ranged):
        if i == 0:
            with ranged():
                pass

    with pytest.raises(CuptiError, match="pass 1 counted nothing"):
        prof.profile_passes(run_pass, "gemm")
    assert fake.calls == [ENABLE, *CONFIGURE, *PER_PASS, START, STOP, DISABLE] and prof._obj is None
    assert prof.last_stops == [[1, 1, 0], [2, 1, 0]] and prof.host.evaluated == []


def test_dropped_ranges_are_an_error(monkeypatch):
    prof, fake = setup(monkeypatch, dropped=2)
    with pytest.raises(CuptiError, match="2 ranges were dropped"):
        prof.profile_passes(one_range([]), "gemm")
    assert fake.calls[-2:] == [DECODE_FN, DISABLE] and prof.host.evaluated == []


@pytest.mark.parametrize("fn,nth,runs", [
    (ENABLE, 1, 0), (DATA_SIZE_FN, 1, 0), (DATA_INIT, 1, 0), (SET_CONFIG, 1, 0), (START, 2, 1), (PUSH, 3, 3),
    (STOP, 3, 3), (DECODE_FN, 1, 3), (DATA_INFO, 1, 3), (RANGE_INFO, 1, 3),
])
def test_a_cupti_call_that_fails_is_the_error_and_the_profiler_is_disabled(monkeypatch, fn, nth, runs):
    """CUPTI failing anywhere (no run error): its CuptiError, nothing evaluated, never retried, and
    the profiler disabled wherever it was enabled."""
    prof, fake = setup(monkeypatch, fail=lambda name, params: name == fn and fake.count[name] == nth)
    seen: list[int] = []
    with pytest.raises(CuptiError, match=fn):
        prof.profile_passes(one_range(seen), "gemm")
    assert len(seen) == runs and fake.count[fn] == nth and prof.host.evaluated == []
    assert fake.count[ENABLE] == 1 and fake.count[DISABLE] == (fn != ENABLE)
    assert fake.enabled is None and prof._obj is None and "total" in prof.last_phase_s


# ---------------------------------------------------------------- the two replay modes

def test_each_replay_mode_refuses_the_others_call(monkeypatch):
    user, fake = setup(monkeypatch)
    ran = []
    with pytest.raises(CuptiError, match="replay='kernel'"):
        user.profile(lambda: ran.append(1))
    kernel, fake_k = setup(monkeypatch, replay="kernel")
    with pytest.raises(CuptiError, match="replay='user'"):
        kernel.profile_passes(one_range(ran), "gemm")
    assert ran == [] and fake.calls == [] and fake_k.calls == []


# ---------------------------------------------------------------- the configuration

def test_is_sass_patched():
    assert all(cupti.is_sass_patched(m) for m in SASS)
    assert not any(cupti.is_sass_patched(m) for m in [*HW, *credit.TENSOR_INST_METRICS, credit.TMA_BYTES_METRIC,
                                                      *credit.HGMMA_OPS_METRICS, credit.DMMA_OPS_METRIC,
                                                      credit.FP8_OPS_METRIC, credit.DURATION_METRIC,
                                                      credit.TEX_INST_METRIC])
    # the check reads hardware counters only (every pass counts a timed run; issue 42 item 7's cost)
    assert sum(map(cupti.is_sass_patched, credit.credit_metrics())) == 0


@pytest.fixture
def gh100(monkeypatch):
    """RangeProfiler's constructor with no GPU: the driver's context and CUPTI's device calls stood
    in for, the host half real (GH100, no counter availability image). Yields the hosts built."""
    from cuda.bindings import driver as d

    try:
        cupti.library()
    except CuptiError as exc:
        pytest.fail(f"libcupti is a dev dependency (nvidia-cuda-cupti): {exc}")
    real, made = cupti._call, []

    def call(fn, params):
        if fn.startswith("cuptiProfilerHost"):
            return real(fn, params)
        if fn == "cuptiDeviceGetChipName":
            params.pChipName = b"GH100"
        return None

    def host(chip, image, metrics, _host=cupti._Host):
        made.append(_host(chip, None, metrics))
        return made[-1]

    monkeypatch.setattr(cupti, "_call", call)
    monkeypatch.setattr(d, "cuCtxGetCurrent", lambda: (0, 0x1))
    monkeypatch.setattr(cupti, "_Host", host)
    yield made


def _with_sass() -> list[str]:
    return [*credit.credit_metrics(), *SASS]


@pytest.mark.parametrize("metrics,passes,instrumented", [
    (lambda: list(credit.credit_metrics()), 4, ()),
    (_with_sass, 5, (4,)),
])
@pytest.mark.parametrize("replay", ["user", "kernel"])
def test_one_configuration_holds_every_metric_the_sass_patched_pass_last(gh100, metrics, passes, instrumented,
                                                                         replay):
    """RangeProfiler(metrics) on GH100: one host with every metric, in order; its passes; and the
    last pass instrumented where any metric is SASS-patched, none otherwise."""
    metrics = metrics()
    prof = RangeProfiler(metrics, replay=replay)
    try:
        assert prof.chip == "GH100" and prof.metrics == metrics and prof.replay == replay
        assert gh100 == [prof.host] and prof.host.metrics == metrics and len(prof.host.config) > 0
        assert prof.passes == prof.host.passes == passes == cupti.passes("GH100", metrics)
        assert prof.instrumented_passes == instrumented
    finally:
        prof.close()
    assert prof.host.obj is None


def test_a_configuration_of_too_many_passes_is_refused_and_its_host_closed(gh100, monkeypatch):
    monkeypatch.setattr(cupti, "MAX_PASSES", 3)
    with pytest.raises(CuptiError, match=r"need 4 passes \(at most 3\)"):
        RangeProfiler(list(credit.credit_metrics()), replay="user")
    assert len(gh100) == 1 and gh100[0].obj is None
    monkeypatch.setattr(cupti, "MAX_PASSES", 4)
    RangeProfiler(list(credit.credit_metrics()), replay="user").close()  # at the limit: accepted


def test_an_unknown_replay_mode_is_refused(gh100):
    with pytest.raises(ValueError, match="replay must be"):
        RangeProfiler(list(HW), replay="auto")
    assert gh100 == []
