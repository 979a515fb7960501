"""The recorded replies of docs/examples/sweep_gpu_ray.toml are the shipped solutions as they are
now (docs/examples/recorded/build.py --check): a solution that changes cannot leave the example
sweep replaying an old kernel."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_recorded_replies_are_current():
    r = subprocess.run([sys.executable, str(ROOT / "docs" / "examples" / "recorded" / "build.py"), "--check"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
