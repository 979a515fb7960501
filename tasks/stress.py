"""The stress distribution every task's inputs are drawn from: N(0,1) + N(0,100)·Bernoulli(1e-3).

Its own module so that the family generators (tasks/families/fp8_gemm.py, tasks/families/gdn.py) and the
dispatcher that calls them (tasks/generators.py) all import it without importing each other.
"""
from __future__ import annotations

import torch

OUTLIER_PROB = 1e-3
OUTLIER_STD = 10.0  # N(0, 100)


def stress(shape: tuple[int, ...], gen: torch.Generator, device: str | torch.device) -> torch.Tensor:
    """fp32 samples of N(0,1) + N(0,100)·Bernoulli(1e-3)."""
    x = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
    outlier = torch.rand(shape, generator=gen, device=device, dtype=torch.float32) < OUTLIER_PROB
    x += torch.randn(shape, generator=gen, device=device, dtype=torch.float32).mul_(OUTLIER_STD) * outlier
    return x
