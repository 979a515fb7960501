"""scripts/gpu_suite.sh's PART=1..4, one device call each, together run every GPU test file once:
a GPU test added to the project but to no part would never run on the device."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _parts() -> dict[str, list[str]]:
    script = (ROOT / "scripts" / "gpu_suite.sh").read_text()
    return {n: body.split() for n, body in re.findall(r'^\s*(\d)\) GPU_TESTS="([^"]*)"', script, re.M | re.S)}


def test_every_gpu_test_file_is_in_exactly_one_part():
    parts = _parts()
    assert sorted(parts) == ["1", "2", "3", "4"]
    listed = [f for files in parts.values() for f in files]
    gpu_files = sorted(str(p.relative_to(ROOT)) for p in [*ROOT.glob("tests/*.py"), *ROOT.glob("tests/gpu/test_*.py")]
                       if re.search(r"^(pytestmark = |@)pytest\.mark\.gpu", p.read_text(), re.M))
    assert sorted(listed) == gpu_files, (sorted(set(gpu_files) - set(listed)), sorted(set(listed) - set(gpu_files)))
    assert all((ROOT / f).is_file() for f in listed)
