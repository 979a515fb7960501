"""Memcheck in the loop (issue 26, item 6), on the GPU, as a user runs it: `agent solve` with a
scripted model whose first kernel writes out of bounds. The visible workload fails (an illegal
address, or the guard after C damaged), so the loop runs compute-sanitizer memcheck on the
candidate and its first reports reach the feedback that becomes turn 2's prompt.

    pytest -m gpu tests/gpu/test_memcheck_feedback_gpu.py -s
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
MEMCHECK_HEADER = "### Memory check (compute-sanitizer memcheck"

# Thread 0 writes just past C's end (into the evaluator's guard region); thread 1 writes a
# terabyte past it (no allocation there: an illegal address, and memcheck's "Invalid
# __global__ write"). Nothing writes C itself.
OOB_KERNEL = r"""#include <cuda_bf16.h>
extern "C" __global__ void gemm_oob(__nv_bfloat16* C, int M, int N) {
    size_t end = (size_t)M * N;
    if (threadIdx.x == 0) C[end + 8] = __float2bfloat16(1.0f);
    if (threadIdx.x == 1) C[end + ((size_t)1 << 39)] = __float2bfloat16(2.0f);
}
"""
OOB_MANIFEST = {"launches": [{"kernel": "gemm_oob", "grid": [1], "block": [32], "args": ["C", "M", "N"]}]}


def _reply(source: str, manifest: dict) -> str:
    return f"Writes past the end.\n\n```cuda\n{source}```\n\n```json\n{json.dumps(manifest, indent=2)}\n```\n"


def test_out_of_bounds_write_gets_memcheck_lines_in_its_feedback(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"replies": [_reply(OOB_KERNEL, OOB_MANIFEST), "no code this time"]}))
    runs = tmp_path / "runs"
    p = subprocess.run([sys.executable, "-m", "agent.cli", "solve", "--task", "gemm", "--model", f"scripted:{script}",
                        "--context", "none", "--max-turns", "2", "--no-executed", "--runs-dir", str(runs),
                        "--run-id", "oob", "--json", "--quiet"],
                       cwd=REPO, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    run = runs / "oob"
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    [cand] = [e for e in events if e["type"] == "candidate" and e["turn"] == 1]
    assert cand["outcome"] == "run_failed", cand
    [mc] = [e for e in events if e["type"] == "memcheck"]
    print("memcheck event:", json.dumps(mc, indent=1)[:2000])
    assert mc["status"] == "failed" and mc["errors"], mc
    assert any("Invalid __global__ write" in e or "out of bounds" in e.lower() for e in mc["errors"]), mc
    ev = json.loads((run / "candidates" / "1-0" / "eval.json").read_text())
    assert ev["sanitize"]["status"] == "failed"
    [fb] = [e for e in events if e["type"] == "feedback" and e["turn"] == 1]
    text = fb["text"]
    print(text)
    assert MEMCHECK_HEADER in text and mc["errors"][0] in text
    # and it is what the model reads on turn 2
    [req2] = [e for e in events if e["type"] == "llm_request" and e["turn"] == 2]
    assert mc["errors"][0] in req2["messages"][-1]["content"]
