"""agent report, audited for results it could corrupt or lose: runs counted twice, runs of
different models or settings pooled into one row, runs silently not found, and runs the model's
provider stopped counted as the model's failures. Real run folders (TrajectoryWriter), the real CLI."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from trajectory_fixtures import GEMM, eval_result, kernel, reply_for, write_run

from agent.report import load_runs, summarise, write_report

REPO = Path(__file__).resolve().parents[1]


def _c(kind: str, tag: str, speedup: float | None = None):
    s = kernel(tag)
    return (s, eval_result(kind, speedup=speedup), reply_for(s, f"attempt {tag}"))


def _edit(run_dir: Path, name: str, **changes) -> None:
    """Change fields of a run's config.json or summary.json on disk, as an older or other run recorded them."""
    path = run_dir / name
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _report(*paths: Path, out: Path, limits: str = "1,2") -> dict:
    proc = subprocess.run([sys.executable, "-m", "agent.cli", "report", *map(str, paths), "--out", str(out),
                           "--turn-limits", limits, "--json"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_run_given_twice_is_counted_once(tmp_path, monkeypatch):
    """`agent report runs/demo /abs/runs/demo`: the same three runs, not six replicas."""
    root = tmp_path / "runs" / "demo"
    for k in range(3):
        write_run(root, f"m/gemm/docs/r{k}", [[_c("correct", f"a{k}", 1.0 + k)]])
    monkeypatch.chdir(tmp_path)
    rows = summarise(load_runs([Path("runs/demo"), root.resolve()]), [1])
    assert [r.runs for r in rows] == [3]
    data = _report(root, tmp_path / "runs" / ".." / "runs" / "demo", out=tmp_path / "rep", limits="1")
    assert data["runs"] == 3 and [r["runs"] for r in data["rows"]] == [3]


def test_a_copied_run_is_refused_not_counted_twice(tmp_path):
    """Old runs moved aside (as a changed model's refusal suggests) and the new ones, reported from
    their parent: one run id in two folders is one run, never two replicas."""
    write_run(tmp_path / "runs" / "demo", "m/gemm/docs/r0", [[_c("correct", "a0", 1.5)]])
    write_run(tmp_path / "runs" / "old", "m/gemm/docs/r0", [[_c("compile", "b0")]])
    proc = subprocess.run([sys.executable, "-m", "agent.cli", "report", str(tmp_path / "runs"), "--out",
                           str(tmp_path / "rep")], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 2 and "m/gemm/docs/r0 is in two folders" in proc.stderr, proc.stderr


def test_runs_under_a_folder_named_candidates_are_found(tmp_path):
    """A sweep (or model) named `candidates` is a run folder like any other; only a run's own
    candidates/ folder is skipped. Reported from their parent, its runs were silently left out."""
    write_run(tmp_path / "runs" / "candidates", "m/gemm/docs/r0", [[_c("correct", "a0", 1.2)]])
    write_run(tmp_path / "runs" / "other", "m/gemm/docs/r1", [[_c("compile", "b0")]])
    data = _report(tmp_path / "runs", out=tmp_path / "rep", limits="1")
    assert data["runs"] == 2
    [row] = data["rows"]
    assert (row["runs"], row["cwa"], row["cwa_n"]) == (2, 0.5, 2)


def test_two_models_under_one_name_stay_two_rows(tmp_path):
    """Two sweeps each call their model `main`, one gpt-4o, the other claude: the report showed one
    `main` row pooling both models' runs."""
    a = write_run(tmp_path / "runs" / "sweep_a", "main/gemm/docs/r0", [[_c("correct", "a0", 1.5)]],
                  model="openai/gpt-4o")
    b = write_run(tmp_path / "runs" / "sweep_b", "main/gemm/docs/r0-b", [[_c("compile", "b0")]],
                  model="anthropic/claude-sonnet")
    for d in (a, b):
        _edit(d, "config.json", model_name="main")
    data = _report(tmp_path / "runs", out=tmp_path / "rep", limits="1")
    by_model = {r["model"]: r for r in data["rows"]}
    assert len(by_model) == 2, list(by_model)
    gpt = next(r for m, r in by_model.items() if "gpt-4o" in m)
    claude = next(r for m, r in by_model.items() if "claude" in m)
    assert (gpt["runs"], gpt["cwa"], claude["runs"], claude["cwa"]) == (1, 1.0, 1, 0.0)
    assert all(m.startswith("main") for m in by_model)


def test_runs_of_another_language_or_sample_count_are_not_pooled(tmp_path):
    """Same model and cell, one sweep in CUDA and one in raw PTX (a setting no column names):
    the report pooled them as replicas of one cell."""
    a = write_run(tmp_path / "runs" / "cuda", "m/gemm/docs/r0", [[_c("correct", "a0", 1.5)]])
    b = write_run(tmp_path / "runs" / "ptx", "m/gemm/docs/r0-ptx", [[_c("compile", "b0")]])
    _edit(b, "config.json", lang="ptx")
    rows = summarise(load_runs([tmp_path / "runs"]), [1])
    assert sorted((r.key[0], r.runs) for r in rows) == [("scripted:weak (lang=cuda)", 1), ("scripted:weak (lang=ptx)", 1)]
    # runs of one setting keep the plain label
    assert [r.key[0] for r in summarise(load_runs([a.parent]), [1])] == ["scripted:weak"]


def test_a_run_the_provider_stopped_counts_only_up_to_its_turns(tmp_path):
    """r1's provider failed for good on turn 2 (stop_reason model_error, status finished; agent.run.resume
    retries that turn). At turn limit 1 it is a measured run; at turn limit 2 it has no turn 2, so it is
    unfinished, not a run that failed to improve."""
    root = tmp_path / "runs" / "demo"
    write_run(root, "m/gemm/docs/r0", [[_c("compile", "a0")], [_c("correct", "a1", 1.2)]])
    r1 = write_run(root, "m/gemm/docs/r1", [[_c("compile", "b0")], [_c("compile", "b1")]])
    summary = json.loads((r1 / "summary.json").read_text())
    _edit(r1, "summary.json", stop_reason="model_error", stop_detail="server_error: 503 after 6 retries",
          turns=1, per_turn=summary["per_turn"][:1])
    report = write_report([root], tmp_path / "rep", [1, 2])
    at = {r.turn_limit: r for r in report.rows}
    assert (at[1].runs, at[1].unfinished, at[1].metrics["compiled"].n) == (2, 0, 2)
    assert (at[2].runs, at[2].unfinished) == (1, 1)
    assert (at[2].metrics["cwa"].successes, at[2].metrics["cwa"].n) == (1, 1)  # 1/1, not 1/2
    assert report.unfinished == 1
    # a run stopped before any turn (a bad key) is measured nowhere
    _edit(r1, "summary.json", turns=0, per_turn=[])
    rows = {r.turn_limit: r for r in summarise(load_runs([root]), [1, 2])}
    assert (rows[1].runs, rows[1].unfinished, rows[1].metrics["compiled"].n) == (1, 1, 1)


def test_a_family_row_does_not_pool_two_settings_either(tmp_path):
    """Sweep A ran one GEMM shape in CUDA, sweep B another GEMM shape in PTX: no per-task cell is
    shared, but the GEMM family row pooled them as one experiment."""
    write_run(tmp_path / "runs" / "a", "m/gemm/docs/r0", [[_c("correct", "a0", 1.5)]])
    b = write_run(tmp_path / "runs" / "b", "m/gemm2/docs/r0", [[_c("compile", "b0")]], task="gemm_n2048_k4096")
    _edit(b, "config.json", lang="ptx")
    report = write_report([tmp_path / "runs"], tmp_path / "rep", [1])
    assert sorted((r.key[0], r.runs) for r in report.families) == [
        ("scripted:weak (lang=cuda)", 1), ("scripted:weak (lang=ptx)", 1)]


def test_the_fast_p_plot_counts_as_the_tables_do(tmp_path):
    """A correct-with-arch kernel without a speedup (untimed; a Definition task has no library
    baseline) is n/a for fast_p at p > 0 in the tables; the plot drew it as a run that never beat
    the library (0 at every p > 0)."""
    from agent.report import FAST_P, fast_p_curve, run_metrics

    root = tmp_path / "runs" / "demo"
    write_run(root, "m/gemm/docs/r0", [[_c("correct", "a0", None)]])  # correct with arch, untimed
    write_run(root, "m/gemm/docs/r1", [[_c("correct", "b0", 1.3)]])
    write_run(root, "m/gemm/docs/r2", [[_c("numerical", "c0")]])
    runs = load_runs([root])
    [row] = summarise(runs, [1])
    curve = fast_p_curve([run_metrics(r.summary, 1) for r in runs], FAST_P)
    assert curve == [row.metrics[f"fast_{p:g}"].rate for p in FAST_P] == [2 / 3, 0.5, 0.5, 0.5]

