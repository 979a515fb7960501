"""scripts/probe_range_cost.py's command line (the probe itself needs an H200: /work/gpuq's cost8 call).
Bad input is one line and exit 2 with nothing written, before any GPU is looked for."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("args", [["--sets", "one,bogus"], ["--sets", "full@x"], ["--n", "8"], ["--busy-ms", "0"]])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args):
    out = tmp_path / "probe.json"
    got = subprocess.run([sys.executable, str(ROOT / "scripts" / "probe_range_cost.py"), *args, "--json", str(out)],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert got.returncode == 2, got
    assert len(got.stderr.strip().splitlines()) == 1 and got.stderr.startswith("probe_range_cost:"), got.stderr
    assert not out.exists()
