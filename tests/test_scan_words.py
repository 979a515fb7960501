"""The whole-tensor checks every judged run gets (tools.correctness.scan, changed) compare inputs as
8-byte words where they can: a flipped bit anywhere is still found, in tensors whose size or address
does not allow words (bytes then) as in those that do, and guard damage is counted per tensor as before."""
from __future__ import annotations

import pytest
import torch

from tools.correctness import CANARY, Guarded, _bits_differ, changed, scan


@pytest.mark.parametrize("make", [lambda: torch.randn(4, 8).bfloat16(),  # 64 bytes: words
                                  lambda: torch.randn(3, 5).bfloat16(),  # 30 bytes: bytes
                                  lambda: torch.randn(64).bfloat16()[1:9],  # 16 bytes at an odd address: bytes
                                  lambda: torch.randn(2, 3, 4)])  # fp32, 96 bytes: words
def test_every_flipped_bit_is_found(make):
    a = make()
    assert not bool(_bits_differ(a, a.clone()))
    for byte in range(a.numel() * a.element_size()):
        for bit in (0, 7):
            b = a.clone()
            b.reshape(-1).view(torch.uint8)[byte] ^= 1 << bit
            assert bool(_bits_differ(a, b)), (byte, bit)
            assert changed({"x": b}, {"x": a}) == ["x"]


def test_a_shape_or_dtype_change_differs():
    a = torch.zeros(4, 8)
    assert bool(_bits_differ(a, a.reshape(8, 4))) and bool(_bits_differ(a, a.double()))


def test_scan_counts_guard_damage_per_tensor_and_side():
    g = {n: Guarded((5, 7), torch.bfloat16, "cpu") for n in ("A", "B", "C")}
    for t in g.values():
        t.tensor.zero_()
    inputs = {"A": g["A"].tensor, "B": g["B"].tensor}
    fresh = {n: t.clone() for n, t in inputs.items()}
    clean = scan(g, inputs, fresh, {"C": g["C"].tensor})
    assert clean.guards == {"A": (0, 0), "B": (0, 0), "C": (0, 0)} and clean.changed == {"A": False, "B": False}
    g["B"].raw[g["B"].start - 1] = CANARY ^ 1
    g["C"].raw[g["C"].end] = CANARY ^ 2
    g["C"].raw[g["C"].end + 5] = CANARY ^ 4
    fresh["A"].view(torch.int16)[2, 3] ^= 1
    found = scan(g, inputs, fresh, {"C": g["C"].tensor})
    assert found.guards == {"A": (0, 0), "B": (1, 0), "C": (0, 2)}
    assert found.changed == {"A": True, "B": False}
