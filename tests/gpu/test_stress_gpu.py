"""tests/test_stress.py on the GPU: the one-pass outliers draw the former form's inputs bit for bit
with CUDA's generator and kernels, at a full attention size."""
from __future__ import annotations

import pytest
import torch

from tests.test_stress import same_as_former

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]


@pytest.mark.parametrize("seed", [0, 12345])
def test_stress_draws_what_its_former_form_drew_on_the_gpu(seed):
    same_as_former((4, 48, 4096, 128), seed, "cuda")
