"""The stream gate on a GPU (tools/timing.py StreamGate): host time spent inside a side's
run() is not timed, and a run() that synchronises with the GPU neither hangs nor stalls every
run (the gate gives up once, then the side is issued ungated)."""
from __future__ import annotations

import time

import pytest

from tools.timing import GATE_LIMIT_S, Side, measure

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


def test_a_synchronising_run_is_ungated_after_one_stall(state, x):
    import torch

    def run():
        x.add_(1)
        torch.cuda.synchronize()  # waits for its own gate until the gate's limit

    side = Side("synchronising library", run)
    t0 = time.perf_counter()
    measure(side, state, 2, 30.0)
    assert not side.gated
    assert time.perf_counter() - t0 < 2 * GATE_LIMIT_S + 2.0
    t0 = time.perf_counter()
    measure(side, state, 5, 30.0)
    assert time.perf_counter() - t0 < GATE_LIMIT_S  # no more stalls
    assert x.item() == 7.0
