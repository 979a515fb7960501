"""Re-record the shipped example run (runs/examples/attn_bwd_human) through today's loop.

The same replies (the recorded `llm_response` texts, in turn order) are handed to the loop again
through the `human` model, exactly as the run was first made (its README), with the recorded
settings, on CPU (CUDA_VISIBLE_DEVICES='' so the recorded "no GPU" reason reads the same on any
machine). The new run replaces the example's recorded files (config.json, events.jsonl,
summary.json, candidates/); README.md stays. tests/test_example_drift.py fails when the example's
prompts drift from what the loop renders: run this after a change to the prompts, the task
statement, the docs or the feedback, and commit the result.

    PYTHONPATH=$PWD python scripts/rerecord_example.py [--check]

--check only says whether the example is current (exit 1 if not), writing nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "runs" / "examples" / "attn_bwd_human"
RECORDED = ("config.json", "events.jsonl", "summary.json", "candidates")


def recorded_replies(example: Path = EXAMPLE) -> list[str]:
    """The example's replies, one per turn, in turn order (sample 0: the example has one a turn)."""
    events = [json.loads(line) for line in (example / "events.jsonl").read_text().splitlines() if line.strip()]
    replies = {e["turn"]: e["text"] for e in events if e["type"] == "llm_response" and e.get("sample", 0) == 0}
    return [replies[t] for t in sorted(replies)]


def record(out_root: Path, example: Path = EXAMPLE) -> Path:
    """Run the loop on the example's replies into out_root/<run id>; returns that folder."""
    config = json.loads((example / "config.json").read_text())
    replies = out_root / "replies"
    replies.mkdir(parents=True)
    for turn, text in enumerate(recorded_replies(example), 1):
        (replies / f"{turn:02d}.md").write_text(text)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PTXBENCH_HUMAN_REPLY_FILE": str(replies),
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    # the command the README gives (relative runs dir: config.json records it as typed)
    command = ["agent", "solve", "--task", config.get("task_requested") or config["task"], "--model", "human",
               "--max-turns", str(config["budget"]["max_turns"]), "--context", config["context"],
               "--require", config.get("require", "on"), "--runs-dir", "runs/examples", "--run-id", config["run_id"]]
    runs = out_root / "runs" / "examples"
    runs.mkdir(parents=True)
    proc = subprocess.run([sys.executable, "-m", "agent.cli", *command[1:], "--quiet"], cwd=out_root, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"rerecord: the loop failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    run = runs / config["run_id"]
    (run / "checkpoint.sqlite").unlink(missing_ok=True)  # LangGraph's resume state: binary, not needed to replay
    fixed = json.loads((run / "config.json").read_text())
    fixed["command"] = command  # as typed from the repository root, not this script's temporary folder
    (run / "config.json").write_text(json.dumps(fixed, indent=2) + "\n")
    return run


def requests(run: Path) -> list[list[dict]]:
    """The chat each turn sent (llm_request messages), in order."""
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines() if line.strip()]
    return [e["messages"] for e in events if e["type"] == "llm_request"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only compare the prompts; write nothing")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ptxbench-rerecord-") as tmp:
        run = record(Path(tmp))
        same = requests(run) == requests(EXAMPLE)
        if args.check:
            print("the example's prompts are current" if same else
                  "the example's prompts differ from what the loop renders: run scripts/rerecord_example.py")
            return 0 if same else 1
        for name in RECORDED:
            target = EXAMPLE / name
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
            (shutil.copytree if (run / name).is_dir() else shutil.copy2)(run / name, target)
    print(f"re-recorded {EXAMPLE.relative_to(REPO)} ({'prompts unchanged' if same else 'prompts updated'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
