"""The stream gate: each side's timed work is issued while a kernel holds the stream, so the
events time GPU work, not the host issuing it (tools/timing.py). On CPU: the gate's PTX
assembles with the real ptxas for every architecture we target, and the timing loop holds,
issues, releases in that order and stops gating a side whose run waits for the GPU every time. The
GPU side (a host delay inside run() is not timed; a synchronising run does not hang) is
tests/gpu/test_timing_gate_gpu.py."""
from __future__ import annotations

import random
import shutil
import subprocess
import time

import pytest

from tools import timing
from tools.timing import GATE_PTX, Hold, PairedTimes, Side, measure, paired


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_gate_ptx_assembles(tmp_path, arch):
    if shutil.which("ptxas") is None:
        pytest.skip("ptxas not on PATH")
    src = tmp_path / "gate.ptx"
    src.write_text(GATE_PTX)
    out = subprocess.run(["ptxas", f"-arch={arch}", str(src), "-o", str(tmp_path / "gate.cubin")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "gate.cubin").stat().st_size > 0


class _Event:
    def __init__(self, log):
        self.log = log

    def record(self):
        self.log.append("event")

    def elapsed_time(self, other) -> float:
        return 1.0


class _Gate:
    """Records holds and releases (the GPU side is tests/gpu/test_timing_gate_gpu.py)."""

    def __init__(self, log):
        self.log, self.count = log, 0

    def hold(self) -> Hold:
        self.count += 1
        self.log.append("hold")
        return Hold(self.count, self.count)

    def release(self, hold: Hold) -> None:
        self.log.append(f"release {hold.token}")


class _State:
    class flusher:  # noqa: N801 - stands in for tools.worker.State.flusher
        @staticmethod
        def flush():
            pass

    def __init__(self, gate):
        self.gate = gate

    def event(self):
        return _Event(self.gate.log)

    def wait(self, limit_s):
        pass


def _side(name, gate, host_s=0.0):
    def run():
        time.sleep(host_s)  # host_s >= the gate's limit: this run waited for the GPU, as a synchronising call does
        gate.log.append(f"run {name}")
    return Side(name, run)


@pytest.fixture
def short_limit(monkeypatch):
    monkeypatch.setattr(timing, "GATE_LIMIT_S", 0.02)
    return 0.02


def test_each_run_is_issued_behind_its_own_gate():
    log: list[str] = []
    gate = _Gate(log)
    state = _State(gate)
    times = paired(_side("candidate", gate), _side("baseline:lib", gate), state, random.Random(0),
                   lambda i, n: None, lambda i, n: None)
    assert isinstance(times, PairedTimes) and times.ungated == ()
    runs = [i for i, x in enumerate(log) if x.startswith("run")]
    assert len(runs) == 2 * (times.warmup + len(times.candidate_ms))
    for k, i in enumerate(runs):  # hold, start event, run, end event, release of that same ticket
        assert log[i - 2:i + 3] == ["hold", "event", log[i], "event", f"release {k + 1}"]


def test_a_side_that_waits_for_the_gpu_is_timed_ungated_from_then_on(short_limit):
    """A library whose run() synchronises waits for its own gate until the gate's limit; after
    two such runs in a row its runs are issued without a gate, and the result says so."""
    log: list[str] = []
    gate = _Gate(log)
    cand, base = _side("candidate", gate), _side("baseline:lib", gate, host_s=short_limit)
    times = paired(cand, base, _State(gate), random.Random(1), lambda i, n: None, lambda i, n: None)
    assert times.ungated == ("baseline:lib",)
    assert cand.gated and not base.gated
    holds_before_runs = [log[i - 2] == "hold" for i, x in enumerate(log) if x == "run baseline:lib"]
    assert holds_before_runs[:2] == [True, True] and not any(holds_before_runs[2:])
    assert all(log[i - 2] == "hold" for i, x in enumerate(log) if x == "run candidate")


def test_one_slow_first_call_does_not_ungate(short_limit):
    """A first call that compiles (Triton, a cuDNN plan) is slow on the host once: still gated."""
    log: list[str] = []
    gate = _Gate(log)
    calls = []

    def run():
        time.sleep(short_limit if not calls else 0.0)
        calls.append(1)

    side = Side("baseline:lib", run)
    measure(side, _State(gate), 4, 1.0)
    assert side.gated and side.stalls == 0 and log.count("hold") == 4


def test_measure_ungates_too(short_limit):
    log: list[str] = []
    gate = _Gate(log)
    side = _side("baseline:lib", gate, host_s=short_limit)
    assert measure(side, _State(gate), 3, 1.0) == [1.0, 1.0, 1.0]
    assert not side.gated and log.count("hold") == 2


def test_states_without_a_gate_time_as_before():
    """A stand-in State without `gate` (CPU tests, scripts/timing_study.py stand-ins) times ungated."""
    log: list[str] = []

    class NoGate(_State):
        def __init__(self):
            self.log = log

        def event(self):
            return _Event(log)

    side = Side("candidate", lambda: log.append("run"))
    assert measure(side, NoGate(), 2, 1.0) == [1.0, 1.0]
    assert log == ["event", "run", "event"] * 2
