"""The stress distribution every task's inputs are drawn from: N(0,1) + N(0,100)·Bernoulli(1e-3).

Its own module so that the family generators (tasks/families/fp8_gemm.py, tasks/families/gdn.py) and the
dispatcher that calls them (tasks/generators.py) all import it without importing each other.
"""
from __future__ import annotations

import torch

OUTLIER_PROB = 1e-3
OUTLIER_STD = 10.0  # N(0, 100)


def stress(shape: tuple[int, ...], gen: torch.Generator, device: str | torch.device) -> torch.Tensor:
    """fp32 samples of N(0,1) + N(0,100)·Bernoulli(1e-3).

    The outliers are added in one pass (x + 10·r·[outlier]): bit for bit what x += (r·10)·[outlier]
    gave (the mask is 0 or 1, so its product is exact either way; tests/test_stress.py), without
    the full-size temporary: every timed run's inputs are drawn twice (before the run and again for
    its judge), so this is a judged run's cost at long sequences (issue 43)."""
    x = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
    outlier = torch.rand(shape, generator=gen, device=device) < OUTLIER_PROB
    return x.addcmul_(torch.randn(shape, generator=gen, device=device, dtype=torch.float32), outlier, value=OUTLIER_STD)
