"""Run one of scripts/*.py as a user would, for the tests of its command line: a probe or window
script that needs a GPU must refuse bad input before it looks for one, in one line, exit 2, writing
nothing (so a device call cannot end in a typo)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_script(name: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / name), *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


def assert_refused(name: str, args: list[str], out: Path, says: str = "") -> None:
    """Exit 2, one line on stderr (prefixed with the script's name, and holding `says`), `out` not written."""
    got = run_script(name, *args)
    assert got.returncode == 2, got
    lines = got.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(Path(name).stem + ":") and says in lines[0], got.stderr
    assert not out.exists()
