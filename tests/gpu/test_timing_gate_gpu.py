"""The stream gate on a GPU (tools/timing.py StreamGate): host time spent inside a side's
run() is not timed, and a run() that synchronises with the GPU neither hangs nor stalls every
run (the gate gives up twice, then the side is issued ungated), and a kernel that writes the
gate's words cannot open a later gate."""
from __future__ import annotations

import random
import time

import pytest

from tools.timing import GATE_LIMIT_S, GATE_SLOTS, Side, measure, paired

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def state():
    from tools.worker import State

    s = State()
    assert s.gate is not None, s.gate_error
    return s


@pytest.fixture
def x():
    import torch

    return torch.zeros(1, device="cuda")


def test_host_time_inside_run_is_not_timed(state, x):
    def run():  # a library's wrapper that takes the host 5 ms before its microsecond of GPU work
        time.sleep(0.005)
        x.add_(1)

    gated = Side("slow wrapper", run)
    assert max(measure(gated, state, 5, 30.0)) < 1.0
    assert gated.gated
    ungated = Side("slow wrapper, ungated", run, gated=False)
    assert min(measure(ungated, state, 5, 30.0)) > 4.0  # what the events saw before the gate


def test_a_synchronising_run_is_ungated_after_two_stalls(state, x):
    import torch

    def run():
        x.add_(1)
        torch.cuda.synchronize()  # waits for its own gate until the gate's limit

    side = Side("synchronising library", run)
    t0 = time.perf_counter()
    measure(side, state, 3, 30.0)
    assert not side.gated
    assert time.perf_counter() - t0 < 2 * GATE_LIMIT_S + 2.0
    t0 = time.perf_counter()
    measure(side, state, 5, 30.0)
    assert time.perf_counter() - t0 < GATE_LIMIT_S  # no more stalls
    assert x.item() == 8.0


def test_a_kernel_writing_the_gate_words_cannot_open_the_next_gate(state, x):
    """The cache-replay attacker's cousin: a candidate that overwrites every gate word from the
    GPU (here a memset on the stream, right behind its own gate) to get the baseline's slow
    host wrapper timed. The next gate waits for its own fresh token, so it still holds."""
    from cuda.bindings import driver as d

    gate = state.gate
    words = gate._dev, 8 * GATE_SLOTS

    def attacker():
        assert d.cuMemsetD8Async(words[0], 0xFF, words[1], d.CUstream(0))[0] == d.CUresult.CUDA_SUCCESS

    def slow_wrapper():
        time.sleep(0.005)
        x.add_(1)

    attack, baseline = Side("candidate", attacker), Side("baseline", slow_wrapper)
    times = paired(attack, baseline, state, random.Random(0), lambda i, n: None, lambda i, n: None, budget_s=0.2)
    assert max(times.baseline_ms) < 1.0, times.baseline_ms
    assert attack.gated and baseline.gated and times.ungated == ()
