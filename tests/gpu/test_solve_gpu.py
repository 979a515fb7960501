"""The flagship loop on the GPU, as a user runs it: `agent solve` replaying the shipped run
(runs/examples/attn_bwd_human: a SIMT kernel, then the expert wgmma + TMA one) with the
profile feedback on (issue 16's done-when). Turn 1's kernel is correct, so the feedback that
becomes turn 2's prompt carries the Nsight Compute profile block, and the run folder keeps it.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
PROFILE_HEADER = "### Profile (Nsight Compute"


def _solve(tmp_path: Path, profile: str) -> tuple[Path, list[dict]]:
    """(Without the profile the block is absent: tests/test_profile.py, on the CPU.)"""
    p = subprocess.run([sys.executable, "-m", "agent.cli", "solve", "--task", "attn_bwd", "--model",
                        f"replay:{REPO / 'runs/examples/attn_bwd_human'}", "--profile-feedback", profile,
                        "--max-turns", "2", "--runs-dir", str(tmp_path), "--json", "--quiet"],
                       cwd=REPO, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    run = next(d for d in tmp_path.iterdir() if d.is_dir())
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    return run, events


def test_profile_block_reaches_the_turn_2_prompt(tmp_path):
    run, events = _solve(tmp_path / "on", "on")
    feedback = [e for e in events if e.get("type") == "feedback" and e.get("turn") == 1]
    assert feedback, "no feedback after turn 1"
    text = feedback[0]["text"]
    assert PROFILE_HEADER in text, text[-2000:]
    assert "tensor pipe" in text and "stalls:" in text  # the SIMT kernel's figures, from this run's ncu pass
    summary = json.loads((run / "summary.json").read_text())
    assert summary.get("profile_feedback") is True
    print(text[text.index(PROFILE_HEADER):][:1500])

