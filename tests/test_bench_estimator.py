"""scripts/bench_estimator.py --analyse (CPU): on a two-mode series (the second run of a pair slower,
as at the H200's power cap) the order-block estimator gives the same value for every window, the
median of per-pair ratios moves with the window's parity; bad input is one line and exit 2."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bench_estimator.py"


def _run(*args: str):
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""})


def test_the_analysis_separates_the_order_effect(tmp_path):
    pairs = tmp_path / "pairs.jsonl.txt"
    with pairs.open("w") as f:
        for i in range(40):  # r = 0.95, every second run 15% slower
            first = i % 2 == 0
            f.write(json.dumps({"block": "bwd8192", "i": i, "cand_first": first, "cand_ms": 29.0 * (1 if first else 1.15),
                                "lib_ms": 0.95 * 29.0 * (1.15 if first else 1)}) + "\n")
    p = _run("--analyse", str(pairs))
    assert p.returncode == 0 and "bwd8192" in p.stdout, p.stderr
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_estimator import analyse

    row = analyse(pairs, 10)[0]
    assert round(row["median_first"], 4) == 1.0925 and round(row["median_second"], 4) == 0.8261  # r*1.15, r/1.15
    assert abs(row["abba"]["mean"] - 0.95) < 1e-12 and row["abba"]["cv"] < 1e-12  # every window the same
    assert max(abs(v / 0.95 - 1) for v in row["old"]["values"]) > 0.14  # odd windows: a mode
    assert row["old"]["cv"] > 0.03 and row["old"]["coverage"] > 0.9 and row["abba"]["coverage"] == 1.0


def test_bad_input_is_one_line_and_exit_2_and_no_gpu_exit_3(tmp_path):
    p = _run("--analyse", str(tmp_path / "missing.txt"))
    assert p.returncode == 2 and len(p.stderr.splitlines()) == 1 and not p.stdout
    p = _run("--blocks", "nope", "--out", str(tmp_path / "o"))
    assert p.returncode == 2 and "unknown block" in p.stderr and not (tmp_path / "o").exists()
    p = _run("--out", str(tmp_path / "o"))  # here, without a GPU: the measurement says so (exit 3), writes nothing
    assert p.returncode == 3 and "needs an NVIDIA GPU" in p.stderr and not (tmp_path / "o").exists()
