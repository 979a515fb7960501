"""Audit 6 of the Fixit data: is each training example the problem the model was given, judged by
the definition it will be evaluated against?

- The chat a run sent (events.jsonl, `llm_request`) holds the system prompt of the run's prompt
  version, the task message with the docs of its context arm, and after each kernel the docs
  retrieved for its result with the feedback. An example drops none of it: it was rebuilt from
  the task alone, so a docs-arm example taught a fix written with documentation it never showed
  (helper headers, mistakes and their cures) and a model trained on it met another prompt than
  the one it is evaluated with.
- A run recorded under another definition of its task (agent.run.task_hash: workloads, held-out
  sizes, tolerance, reference) was judged against other workloads and another tolerance, and its
  prompt and feedback name that definition's visible sizes (perhaps today's held-out ones). Its
  "fixes" are not verified against the task the adapter is evaluated on: left out and counted.

Real `agent solve` runs (scripted replies, real NVRTC/ptxas, no GPU) and the real `agent fixit
build` CLI.
"""
from __future__ import annotations

import json
from pathlib import Path

from agent_loop_helpers import cpu_only  # noqa: F401  (autouse fixture)
from agent_loop_helpers import GEMM_TASK, agent_cli, broken_probe_reply, probe_reply, write_script

from agent.trajectory import read_events


def _real_run(tmp_path: Path, runs: Path, run_id: str, context: str = "docs") -> Path:
    """A real CPU run of the loop: a compile error in turn 1, fixed in turn 2."""
    model = write_script(tmp_path / f"{run_id}.json", [broken_probe_reply(), probe_reply()])
    p = agent_cli("solve", "--task", GEMM_TASK, "--model", model, "--max-turns", "2", "--context", context,
                  "--runs-dir", str(runs), "--run-id", run_id, "--quiet")
    assert p.returncode == 0, p.stderr
    return runs / run_id


def _build(runs: Path, out: Path) -> dict:
    p = agent_cli("fixit", "build", str(runs), "--out", str(out), "--split", "all", "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _rows(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (folder / "train.jsonl").read_text().splitlines()]


def test_an_example_holds_the_prompt_and_docs_the_model_was_sent(tmp_path):
    runs = tmp_path / "runs"
    run_dir = _real_run(tmp_path, runs, "docs")
    sent = {e["turn"]: e["messages"] for e in read_events(run_dir, "llm_request")}
    system, task_message = sent[1][0]["content"], sent[1][1]["content"]
    assert "## Reference material" in task_message  # the docs arm: the task message carries docs
    after_failed = sent[2][-1]  # what followed the broken kernel: its feedback (a misspelt type adds no docs:
    # turn-2+ docs follow the error's construct, issue 41), carried into the example as sent
    assert after_failed["role"] == "user" and "### Compile: failed" in after_failed["content"]

    card = _build(runs, tmp_path / "data")
    assert card["examples"] == 1
    (row,) = _rows(tmp_path / "data")
    msgs = row["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant"]
    assert msgs[0]["content"] == system
    user = msgs[1]["content"]
    # the task as the model was given it, docs included, then its kernel, then what it was told after it
    assert user.startswith(task_message.strip()), user[:300]
    assert after_failed["content"].strip() in user
    assert user.index("## Your previous attempt") < user.index(after_failed["content"].strip())
    assert "flaot d0" in user and "float d0 = 0.f" in msgs[2]["content"]


def test_a_none_arm_example_has_no_docs(tmp_path):
    runs = tmp_path / "runs"
    run_dir = _real_run(tmp_path, runs, "none", context="none")
    sent = {e["turn"]: e["messages"] for e in read_events(run_dir, "llm_request")}
    _build(runs, tmp_path / "data")
    (row,) = _rows(tmp_path / "data")
    user = row["messages"][1]["content"]
    assert "## Reference material" not in user
    assert user.startswith(sent[1][1]["content"].strip()) and sent[2][-1]["content"].strip() in user


def test_a_run_of_another_task_definition_gives_no_example(tmp_path):
    runs = tmp_path / "runs"
    _real_run(tmp_path, runs, "today", context="none")
    old = _real_run(tmp_path, runs, "old", context="none")
    before = _real_run(tmp_path, runs, "unhashed", context="none")
    config = json.loads((old / "config.json").read_text())
    config["task_hash"] = "0" * 64  # judged against another definition of the task
    (old / "config.json").write_text(json.dumps(config))
    config = json.loads((before / "config.json").read_text())
    config["task_hash"] = None  # recorded before runs held the hash: cannot tell, kept and counted
    (before / "config.json").write_text(json.dumps(config))

    card = _build(runs, tmp_path / "data")
    rows = _rows(tmp_path / "data")
    # (the two kept runs wrote the same kernels: one example, the other a near-duplicate)
    assert card["pairs_found"] == 2 and "old" not in {r["meta"]["run_id"] for r in rows} and len(rows) == 1
    assert card["runs"] == 2 and card["runs_left_out"] == {"other_task_definition": 1}
    assert card["runs_task_definition_unknown"] == 1
    assert card["failed_candidates_by_error"] == {"compile": 2}
    assert "other_task_definition" in (tmp_path / "data" / "data_card.md").read_text()


def test_the_shipped_before_after_sweep_asks_about_tasks_never_trained_on():
    """docs/examples/sweep_fixit.toml is how FIXIT.md benchmarks an adapter against its base model.
    Fixit data is built from the train split's tasks; a comparison on those tasks alone measures
    memorisation of the training trajectories' problems (FIXIT.md says so). It ran gemm, attn_fwd
    and attn_bwd only, all three train tasks: the sweep must hold held-out tasks too (the report
    shows them apart, per family and split)."""
    from agent.sweep import load_sweep_config
    from tasks.registry import select_tasks, task_split

    root = Path(__file__).resolve().parents[1]
    config = load_sweep_config(root / "docs" / "examples" / "sweep_fixit.toml")
    tasks = [t for spec in config.tasks for t in select_tasks(spec)]
    splits = {task_split(t) for t in tasks}
    assert "held_out_tasks" in splits, tasks
