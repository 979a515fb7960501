"""The stress distribution (tasks/stress.py) draws, bit for bit, what its former three-pass form drew:
the outliers added in one pass change no input of any seed (every seeded check and every recorded
figure keeps its inputs). On the GPU: tests/gpu/test_stress_gpu.py."""
from __future__ import annotations

import pytest
import torch

from tasks.stress import OUTLIER_PROB, OUTLIER_STD, stress


def former(shape, gen: torch.Generator, device) -> torch.Tensor:
    x = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
    outlier = torch.rand(shape, generator=gen, device=device) < OUTLIER_PROB
    x += torch.randn(shape, generator=gen, device=device, dtype=torch.float32).mul_(OUTLIER_STD) * outlier
    return x


def same_as_former(shape, seed: int, device: str = "cpu") -> None:
    a = stress(shape, torch.Generator(device=device).manual_seed(seed), device)
    b = former(shape, torch.Generator(device=device).manual_seed(seed), device)
    assert torch.equal(a.view(torch.int32), b.view(torch.int32)), (shape, seed, int((a != b).sum()))
    assert (a.abs() > 5).any()  # outliers were drawn (std 10): the one-pass add was exercised


@pytest.mark.parametrize("seed", [0, 1, 7, 2**31 - 1])
@pytest.mark.parametrize("shape", [(4096, 513), (2, 3, 77, 128)])
def test_stress_draws_what_its_former_form_drew(shape, seed):
    same_as_former(shape, seed)
