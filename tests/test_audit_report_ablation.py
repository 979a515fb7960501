"""The context ablation as the report shows it: its arms side by side must differ in the context
alone. Runs of the `none` arm and of the `docs` arm made under other settings (another GPU, another
temperature: two sweeps, one per arm) were shown in one row each side by side, as if the docs made
the difference. Real run folders (TrajectoryWriter), the real report."""
from __future__ import annotations

import json
from pathlib import Path

from trajectory_fixtures import eval_result, kernel, reply_for, write_run

from agent.report import load_runs, summarise


def _c(kind: str, tag: str, speedup: float | None = None):
    s = kernel(tag)
    return (s, eval_result(kind, speedup=speedup), reply_for(s, f"attempt {tag}"))


def _edit(run_dir: Path, **changes) -> None:
    path = run_dir / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _rows(root: Path) -> dict[tuple[str, str], int]:
    return {(r.key[0], r.key[3]): r.runs for r in summarise(load_runs([root]), [1])}


def test_arms_made_under_other_settings_are_not_shown_as_one_comparison(tmp_path):
    root = tmp_path / "runs"
    for k in range(2):
        _edit(write_run(root / "sweep_none", f"m/gemm/none/r{k}", [[_c("compile", f"n{k}")]], context="none"),
              gpu="NVIDIA H100 80GB HBM3")
        _edit(write_run(root / "sweep_docs", f"m/gemm/docs/r{k}", [[_c("correct", f"d{k}", 1.2)]], context="docs"),
              gpu="NVIDIA H200")
    rows = _rows(root)
    assert len({model for model, _ in rows}) == 2, rows  # each arm's row names its GPU
    assert all("gpu=" in model for model, _ in rows), rows


def test_arms_that_differ_only_in_their_context_stay_one_comparison(tmp_path):
    """The docs version (and the context budgets) belong to the arms that send docs: the none arm
    has none, which is no difference."""
    root = tmp_path / "runs"
    for k in range(2):
        _edit(write_run(root / "s", f"m/gemm/none/r{k}", [[_c("compile", f"n{k}")]], context="none"),
              context_tokens=2000, knowledge_version=None)
        _edit(write_run(root / "s", f"m/gemm/docs/r{k}", [[_c("correct", f"d{k}", 1.2)]], context="docs"),
              context_tokens=6000, knowledge_version="abc123")
    rows = _rows(root)
    assert rows == {("scripted:weak", "none"): 2, ("scripted:weak", "docs"): 2}, rows


def test_two_docs_versions_within_the_docs_arms_still_split(tmp_path):
    root = tmp_path / "runs"
    _edit(write_run(root / "a", "m/gemm/docs/r0", [[_c("correct", "a", 1.2)]], context="docs"), knowledge_version="v1")
    _edit(write_run(root / "b", "m/gemm/full/r0", [[_c("correct", "b", 1.2)]], context="full"), knowledge_version="v2")
    _edit(write_run(root / "c", "m/gemm/none/r0", [[_c("compile", "c")]], context="none"), knowledge_version="v3")
    rows = _rows(root)
    assert set(rows) == {("scripted:weak (docs=v1)", "docs"), ("scripted:weak (docs=v2)", "full"),
                         ("scripted:weak", "none")}, rows  # v1 / v2 apart; none, with no docs, beside both
