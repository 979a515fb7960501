"""The report's tables (agent/report.py), exactly, on run records built here: which runs are measured
at a turn limit, which folders are runs, which runs are told apart by a label, which replicas are
one sample, the cells and their rows (per task, per family, per split, with the tasks a row lacks
named), each table cell's text, the CSV's fields, the notes under the tables, the plots' series and
the fast_p curve. Fast, for mutation runs (tests/test_mutation_report.py is the numbers;
tests/test_report.py and test_audit_report_*.py the whole report with its files and plots)."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from agent import report
from agent.published import PublishedRow
from agent.report import CellRow, Proportion, RunMetrics, RunRecord
from agent.trajectory import Budget, CandidateRecord, RunConfig, RunSummary, TurnRecord, Verdicts

GEMM, GEMM2, ATTN = "gemm_n7168_k5120", "gemm_n4096_k4096", "mha_fwd_d64"
HELD = "fp8_mha_with_lse_d96"  # a held-out task (tasks.registry.HELD_OUT_TASKS)
OK = dict(compiled=True, arch_sass=True, arch_executed=True, correct=True, correct_held_out=True)


def cand(turn: int = 1, outcome: str = "correct_with_arch", sample: int = 0, **verdicts) -> CandidateRecord:
    return CandidateRecord(turn=turn, sample=sample, path=f"candidates/{turn}-{sample}", outcome=outcome,
                           verdicts=Verdicts(**verdicts))


def record(run_id: str = "r0", *cands: CandidateRecord, task: str = GEMM, status: str = "finished",
           stop_reason: str | None = "max_turns", turns: int | None = None, folder: Path | None = None,
           summary: bool = True, **config) -> RunRecord:
    config.setdefault("model", "m")
    cfg = RunConfig(run_id=run_id, task=task, **config)
    done = turns if turns is not None else max((c.turn for c in cands), default=0)
    s = RunSummary(run_id=run_id, task=task, arch=cfg.arch, model=cfg.model, status=status, stop_reason=stop_reason,
                   turns=done, per_turn=[TurnRecord(turn=t, candidates=[c for c in cands if c.turn == t])
                                         for t in sorted({c.turn for c in cands})])
    return RunRecord(folder or Path(f"/nonexistent/{run_id}"), cfg, s if summary else None)


def write(folder: Path, rec: RunRecord) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(rec.config.model_dump_json())
    if rec.summary is not None:
        (folder / "summary.json").write_text(rec.summary.model_dump_json())
    return folder


def metrics(**values) -> RunMetrics:
    base = dict(compiled=True, arch_sass=True, correct=True, correct_held_out=True, cwa=True, cwa_executed=True)
    return RunMetrics({**base, **values}, None)


# ---------------------------------------------------------------------------------------------- measured
def test_which_runs_are_measured_at_a_turn_limit():
    assert not record(summary=False).finished and not record(summary=False).measured_at(1)
    assert not record(summary=False).out_of_replies_past(9)
    assert not record(status="failed").finished and not record(status="interrupted").measured_at(1)
    capped = record(budget=Budget(max_turns=4))
    assert capped.finished and capped.measured_at(4) and not capped.measured_at(5)
    assert record(budget=Budget(max_turns=4), stop_reason="max_cost").measured_at(8)  # another cap: it failed there
    provider = record("a", cand(1), cand(2), stop_reason="model_error")
    assert provider.measured_at(2) and not provider.measured_at(3)
    replies = record("a", cand(1), cand(2), stop_reason="replay_end")
    assert replies.measured_at(8) and not replies.out_of_replies_past(2) and replies.out_of_replies_past(3)
    assert record("a", cand(1), stop_reason="script_end").out_of_replies_past(2)
    assert not record("a", cand(1), stop_reason="max_turns").out_of_replies_past(2)


def test_each_run_left_out_says_why_and_the_cell_counts_it_there():
    """A run the metrics leave out is no failure of the model, and no silent gap either: its cell
    counts it by its reason, in the table's runs column and the CSV."""
    why = {"ok": record("a", cand(1)), "not started": record("b", summary=False),
           "no summary": record("c", summary=False), "interrupted": record("d", status="interrupted",
                                                                          stop_reason="interrupted"),
           "infrastructure error": record("e", status="failed", stop_reason="infra_error"),
           "ptxbench error": record("f", status="failed", stop_reason="error"),
           "running or killed": record("g", cand(1), status="running", stop_reason=None),
           "provider failed": record("h", stop_reason="model_error", turns=0),
           "fewer turns": record("i", cand(1), budget=Budget(max_turns=1)),
           "cost unknown": record("j", cand(1), stop_reason="max_cost")}
    why["not started"].started = False
    priced = record("k", cand(1), stop_reason="max_cost")  # the cap spent: the model's failure past it
    why["cost unknown"].summary.usage.cost_usd = None  # a call came back without a price
    assert priced.left_out(2) is None and why["cost unknown"].left_out(1) is None
    assert {w: r.left_out(2) for w, r in why.items()} == {**{w: w for w in why}, "ok": None}
    assert all(r.measured_at(2) == (w == "ok") for w, r in why.items())
    assert why["fewer turns"].left_out(1) is None and why["provider failed"].left_out(1) == "provider failed"
    [row] = report.summarise(list(why.values()), [2])
    assert (row.runs, row.unfinished) == (1, 9)
    assert row.left_out == {w: 1 for w in sorted(why) if w != "ok"}
    runs_column = report._table([row])[1][0][8]
    assert runs_column == ("1 (+9 unfinished: 1 cost unknown, 1 fewer turns, 1 infrastructure error, 1 interrupted, "
                           "1 no summary, 1 not started, 1 provider failed, 1 ptxbench error, 1 running or killed)")
    assert report.csv_rows([row])[0]["unfinished_why"] == runs_column.split(": ", 1)[1][:-1]


# ---------------------------------------------------------------------------------------------- folders
def test_run_folders_are_found_once_and_never_inside_a_runs_candidates(tmp_path):
    sweep = tmp_path / "sweep"
    r0 = write(sweep / "m" / "r0", record("a"))
    r1 = write(sweep / "m" / "r1", record("b"))
    write(r0 / "candidates" / "1-0", record("inner"))  # a candidate's own config: no run
    named = write(sweep / "candidates" / "r2", record("c"))  # a model named candidates: a run
    (tmp_path / "file").write_text("x")
    found = report.find_run_dirs([sweep, r0, str(r0), r0 / ".." / "r0", tmp_path / "file", tmp_path / "none"])
    assert found == sorted([r0, r1, named])
    assert report.find_run_dirs([r0]) == [r0]
    assert report.find_run_dirs([sweep / "candidates"]) == [named]  # given as the top: its own runs count
    below = write(r1 / "sub", record("below"))  # a run folder given directly is that run alone
    assert report.find_run_dirs([r1]) == [r1] and below in report.find_run_dirs([sweep])
    deep = write(r0 / "candidates" / "1-0" / "sub" / "x", record("deep"))  # only what lies below the folder given
    assert report.find_run_dirs([r0 / "candidates" / "1-0" / "sub"]) == [deep]


def test_loading_refuses_a_run_in_two_folders_and_leaves_teacher_runs_out(tmp_path):
    write(tmp_path / "a" / "r0", record("x"))
    write(tmp_path / "b" / "r0", record("x"))
    with pytest.raises(ValueError, match=r"run x is in two folders, .*a/r0 and .*b/r0: report one of them"):
        report.load_runs([tmp_path])
    write(tmp_path / "c" / "r0", record("t", repair_run=True))
    write(tmp_path / "d" / "r0", record("y", lang="ptx"))
    runs = report.load_runs([tmp_path / "b", tmp_path / "c", tmp_path / "d"])
    assert [r.config.run_id for r in runs] == ["x", "y"]
    assert [r.label for r in runs] == ["m (lang=cuda)", "m (lang=ptx)"]  # distinguished on loading
    assert runs[0].summary is not None and runs[0].run_dir == tmp_path / "b" / "r0"


# ---------------------------------------------------------------------------------------------- labels
def test_the_settings_a_run_is_told_apart_by():
    c = record(model="scripted:/x/y/weak.json", strategy="evolve", population=6, temperature=0.5, gpu="H200",
               gpu_from_turn=3, template_hash="abcdef0123456789", knowledge_version="k" * 20,
               budget=Budget(max_turns=8, max_tokens=1000, max_cost=2.5), samples=2, executed_check=True,
               api_base="http://h", context_tokens=100, context_turn_tokens=50, memcheck=False).config
    s = report._settings(c)
    assert s == {"spec": "scripted:weak.json", "api_base": "http://h", "lang": "cuda", "samples": 2, "population": 6,
                 "temperature": 0.5, "executed_check": True, "context_tokens": 100, "context_turn_tokens": 50,
                 "memcheck": False, "prompts": "v1:abcdef012345", "docs": "k" * 12, "gpu": "H200 from turn 3",
                 "toolchain": "unknown", "budget": "max_tokens=1000, max_cost=2.5"}
    plain = report._settings(record(context="none", gpu="H200").config)
    assert (plain["population"], plain["prompts"], plain["docs"], plain["gpu"], plain["budget"]) == (
        None, "v1:unknown", None, "H200", "no caps")
    assert report._settings(record(context="none", hints=["tma"]).config)["docs"] == "unknown"
    assert report._settings(record().config)["docs"] == "unknown"
    versions = {"nvrtc": "12.8", "ptxas": "12.9", "torch": "2.7", "rules": "4"}
    assert report._toolchain(record(tool_versions=versions).config) == "nvrtc 12.8, ptxas 12.9, rules 4"
    assert report._toolchain(record(tool_versions=versions, gpu="H200").config) == (
        "nvrtc 12.8, ptxas 12.9, torch 2.7, rules 4")


def test_distinguish_labels_runs_of_one_cell_that_differ_in_a_setting_no_column_names():
    a, b = record("a", lang="cuda"), record("b", lang="ptx")
    other_task, other_arm = record("c", task=GEMM2, lang="cuda"), record("d", context="none", lang="cuda")
    report.distinguish([a, b, other_task, other_arm])
    assert (a.label, b.label, other_task.label, other_arm.label) == (
        "m (lang=cuda)", "m (lang=ptx)", "m (lang=cuda)", "m (lang=cuda)")
    a.label = "stale"
    same = record("e")
    report.distinguish([a, same])  # the same settings (the task, the arms aside): no labels, old ones dropped
    assert a.label is None and same.label is None
    lone = record("h")
    assert report.distinguish([lone]) == [lone] and lone.label is None
    groups = [record("p", model="p"), record("q1", model="q", lang="cuda"), record("q2", model="q", lang="ptx")]
    report.distinguish(groups)  # a cell whose runs agree, then one whose runs differ
    assert [r.label for r in groups] == [None, "q (lang=cuda)", "q (lang=ptx)"]
    two = [record("f", model_name="x"), record("g", model_name="x", temperature=0.0, api_base="http://h")]
    report.distinguish(two)
    assert [r.label for r in two] == ["x (api_base=None, temperature=None)", "x (api_base=http://h, temperature=0.0)"]


def test_the_docs_arms_settings_are_no_difference_for_the_none_arm():
    docs_a, docs_b = record("a", context_tokens=100), record("b", context_tokens=200)
    none = record("c", context="none", context_tokens=999)
    report.distinguish([docs_a, docs_b, none])
    assert (docs_a.label, docs_b.label, none.label) == ("m (context_tokens=100)", "m (context_tokens=200)", None)
    alone = [record("d", context_tokens=100), record("e", context="none", context_tokens=5)]
    report.distinguish(alone)
    assert [r.label for r in alone] == [None, None]
    mixed = [record("f", lang="ptx", context_tokens=1), record("g", context="none", context_tokens=2)]
    report.distinguish(mixed)
    assert [r.label for r in mixed] == ["m (lang=ptx)", "m (lang=cuda)"]


def test_features_and_task_definitions_are_compared_within_a_task_only():
    runs = [record("a", requested_features=["wgmma", "tma"]), record("b", requested_features=[]),
            record("c", task=GEMM2, requested_features=["wgmma"])]
    report.distinguish(runs)
    assert [r.label for r in runs] == ["m (features=tma+wgmma)", "m (features=none)", "m (features=wgmma)"]
    across = [record("a", requested_features=["tma"]), record("b", task=GEMM2, requested_features=["wgmma"])]
    report.distinguish(across)
    assert [r.label for r in across] == [None, None]
    hashed = [record("a", task_hash="0123456789abcdef"), record("b")]
    report.distinguish(hashed)
    assert [r.label for r in hashed] == ["m (task_def=0123456789ab)", "m (task_def=unknown)"]


def test_model_labels_params_and_cell_keys():
    assert report.model_label("scripted:/a/b/weak.json") == "scripted:weak"
    assert report.model_label("replay:runs/x/r0") == "replay:r0" and report.model_label("openai/gpt") == "openai/gpt"
    assert report.model_label("scripted:weak.json") == "scripted:weak"
    assert report.params_label({}) == ""
    assert report.params_label({"b": 1, "a": "x", "t": {"y": [1, 2]}}) == ' [a="x", b=1, t={"y":[1,2]}]'
    r = record(model="scripted:/p/weak.json", model_params={"effort": "high"}, context="docs", hints=["tma", "ws"],
               strategy="evolve", profile_feedback=True, history="latest", require="off", arch="sm_100a")
    assert report.arm(r.config) == "docs+hint:tma+hint:ws"
    assert report.run_label(r) == 'scripted:weak [effort="high"]'
    assert report.cell_key(r) == ('scripted:weak [effort="high"]', GEMM, "sm_100a", "docs+hint:tma+hint:ws", "evolve",
                                  "on", "latest", "off")
    assert report.cell_key(record())[5:] == ("off", "full", "on")
    assert report.run_label(record(model_name="named")) == "named"
    r.label = "given"
    assert report.run_label(r) == "given"
    assert report.family_key(record(task=ATTN))[:2] == ("m", "attention forward")
    assert report.split_key(record(task=HELD))[:3] == ("m", "FP8 attention forward / held_out_tasks", "sm_90a")
    assert report.split_key(record())[1:] == ("GEMM / train", "sm_90a", "docs", "linear", "off", "full", "on")
    runs = [record("b", task=GEMM2), record("a"), record("c", task=GEMM2)]
    cells = report.group_cells(runs)
    assert list(cells) == sorted(cells) and [len(v) for v in cells.values()] == [2, 1]
    assert [r.config.run_id for r in cells[report.cell_key(runs[0])]] == ["b", "c"]


# ---------------------------------------------------------------------------------------------- samples
def _replies(folder: Path, *texts: str | None) -> None:
    for k, text in enumerate(texts, 1):
        d = folder / "candidates" / f"{k}-0"
        d.mkdir(parents=True, exist_ok=True)
        if text is not None:
            (d / "reply.md").write_text(text)


def test_replicas_that_got_the_same_replies_are_one_sample(tmp_path):
    def greedy(name, texts, **kw):
        folder = tmp_path / name
        _replies(folder, *texts)
        cands = [cand(t, **OK, speedup=kw.pop("speedup", 2.0)) for t in range(1, len(texts) + 1)]
        return record(name, *cands, folder=folder, **{"model": "scripted:s.json", **kw})

    same = [greedy("a", ["x", "y"]), greedy("b", ["x", "y"], speedup=8.0), greedy("c", ["x", "z"])]
    assert len(report.cell_samples(same, 2)) == 2 and len(report.cell_samples(same, 1)) == 1
    merged = report.cell_samples(same[:2], 2)
    assert len(merged) == 1 and merged[0].speedup == pytest.approx(4.0)  # the geometric mean of the copies
    missing = [greedy("d", [None]), greedy("e", [None])]
    assert len(report.cell_samples(missing, 1)) == 1
    # at temperature 0, in the config or the model's parameters: greedy too; otherwise each run a sample
    for kw, n in (({"model": "m", "temperature": 0.0}, 1), ({"model": "m", "model_params": {"temperature": 0}}, 1),
                  ({"model": "m", "temperature": 0.7}, 2), ({"model": "m"}, 2)):
        runs = [greedy(f"t{n}{k}{len(kw)}{id(kw)}", ["x"], **kw) for k in range(2)]
        assert len(report.cell_samples(runs, 1)) == n, kw
    # the same reply under another candidate's path is another trajectory
    d1, d2 = tmp_path / "p1" / "candidates" / "1-0", tmp_path / "p2" / "candidates" / "1-1"
    for d in (d1, d2):
        d.mkdir(parents=True)
        (d / "reply.md").write_text("x")
    p1 = record("p1", cand(1, **OK), folder=tmp_path / "p1", model="scripted:s.json")
    p2 = record("p2", cand(1, **OK, sample=1), folder=tmp_path / "p2", model="scripted:s.json")
    assert len(report.cell_samples([p1, p2], 1)) == 2
    # in another cell: another sample
    other = greedy("q", ["x", "y"], arch="sm_100a")
    assert len(report.cell_samples([same[0], other], 2)) == 2


def test_a_run_out_of_replies_keeps_what_it_reached_and_nothing_else():
    r = record("a", cand(1, **OK, speedup=3.0, sol_score=0.5), cand(1, "compile_error", sample=1),
               stop_reason="replay_end", model="m")
    at1, at4 = report.cell_samples([r], 1)[0], report.cell_samples([r], 4)[0]
    assert at1.speedup == 3.0 and at1.sol_score == 0.5
    assert (at4.speedup, at4.sol_score, at4.speedup_held_out) == (None, None, None)
    assert all(v is True for v in at4.values.values())
    fails = report.cell_samples([record("b", cand(1, "compile_error"), stop_reason="script_end")], 4)[0]
    assert all(v is None for v in fails.values.values())


def test_merged_copies_keep_the_verdicts_they_agree_on():
    a = RunMetrics({**metrics().values}, 2.0, 0.4, 1.0)
    b = RunMetrics({**metrics(correct_held_out=None).values}, 8.0, 0.8, 4.0)
    c = RunMetrics({**metrics(correct_held_out=False, compiled=None).values}, None, None, None)
    m = report._merge_copies([a, b, c])
    assert m.values["correct_held_out"] is None and m.values["compiled"] is True and m.values["cwa"] is True
    assert m.speedup == pytest.approx(4.0) and m.sol_score == pytest.approx(0.6) and m.speedup_held_out == 2.0
    assert [m.values[f"fast_{p:g}"] for p in report.FAST_P] == [True, True, True, True]
    split = report._merge_copies([a, RunMetrics(metrics(cwa_executed=False).values, None)])
    assert split.values["cwa_executed"] is None and split.speedup is None and split.sol_score is None
    assert split.values["fast_0.5"] is None
    untimed = report._merge_copies([RunMetrics(metrics().values, None), RunMetrics(metrics().values, None)])
    assert untimed.speedup is None and untimed.speedup_held_out is None and untimed.values["fast_1"] is None
    zero_sol = report._merge_copies([RunMetrics(metrics().values, 1.0, 0.0), RunMetrics(metrics().values, 1.0, 0.0)])
    assert zero_sol.sol_score == 0.0


# ---------------------------------------------------------------------------------------------- rows
def test_a_cell_rows_derived_figures():
    row = CellRow(("m",) * 8, 1, 3, 0, {}, [2.0, 8.0], [0.2, 0.6], speedups_held_out=[1.0, 4.0])
    assert row.samples == 3 and CellRow(("m",) * 8, 1, 3, 0, {}, samples=2).samples == 2
    assert CellRow(("m",) * 8, 1, 3, 0, {}, samples=0).samples == 0
    assert row.speedup == pytest.approx(4.0) and row.sol_score == pytest.approx(0.4)
    assert row.speedup_held_out == pytest.approx(2.0) and row.speedup_ci == report.bootstrap_geomean_ci([2.0, 8.0])
    empty = CellRow(("m",) * 8, 1, 0, 0, {})
    assert (empty.speedup, empty.sol_score, empty.speedup_held_out, empty.speedup_ci) == (None, None, None, None)


def test_summarise_counts_each_cell_at_each_limit():
    runs = [record("a", cand(1, "compile_error"), cand(2, **OK, speedup=2.0, speedup_held_out=1.5, sol_score=0.3)),
            record("b", cand(1, **OK, speedup=0.5, sol_score=0.7)),
            record("c", cand(1, "unverified", compiled=True, arch_sass=True)),
            record("d", cand(1, **OK), status="failed"),
            record("e", cand(1, **{**OK, "arch_executed": None}, speedup=9.0), model="scripted:x/s.json")]
    rows = report.summarise(runs, [2, 1, 2])
    assert [(r.key[0], r.turn_limit) for r in rows] == [("m", 1), ("m", 2), ("scripted:s", 1), ("scripted:s", 2)]
    at1, at2 = rows[0], rows[1]
    assert (at1.runs, at1.unfinished, at1.samples, at1.tasks, at1.model_source) == (3, 1, 3, (GEMM,), "m")
    assert at1.metrics["cwa_executed"] == Proportion(1, 2, 1) and at1.metrics["compiled"] == Proportion(2, 3, 0)
    assert at1.speedups == [0.5] and at1.sol_scores == [0.7] and at1.speedups_held_out == []
    assert sorted(at2.speedups) == [0.5, 2.0] and sorted(at2.sol_scores) == [0.3, 0.7]
    assert at2.speedups_held_out == [1.5]
    assert rows[2].speedups == [] and rows[2].metrics["cwa_executed"] == Proportion(0, 0, 1)
    assert rows[2].model_source == "scripted:s.json"
    assert report.summarise(runs, [1])[0].metrics["fast_1"] == Proportion(0, 2, 1)
    untimed = report.summarise([record("a", cand(1, **OK)), record("b", cand(1, **OK, speedup=2.0, sol_score=0.5))],
                               [1])
    assert (untimed[0].speedups, untimed[0].sol_scores) == ([2.0], [0.5])  # correct with arch, not timed: no speed
    pooled = report.summarise([record("a", model="b/y", model_name="x"), record("b", model="a/z", model_name="x")], [1])
    assert [r.model_source for r in pooled] == ["a/z, b/y"]  # one name, two models: both said


def test_rows_of_a_family_name_the_tasks_they_lack():
    runs = [record("a", cand(1, **OK), task=GEMM, model="x"), record("b", cand(1, **OK), task=GEMM2, model="x"),
            record("c", cand(1, **OK), task=GEMM, model="y"),
            record("d", cand(1, **OK), task=GEMM, model="z"), record("e", cand(1, **OK), task=GEMM2, model="z"),
            record("f", cand(1, **OK), task="gemm_n128_k2048", model="z"),
            record("g", cand(1, **OK), task=GEMM, model="w", status="failed")]
    rows = {r.key[0]: r for r in report.summarise(runs, [1], report.family_key)}
    assert rows["x"].key[1] == "GEMM (without gemm_n128_k2048)"
    assert rows["y"].key[1] == f"GEMM (tasks: {GEMM})"
    assert rows["z"].key[1] == "GEMM" and rows["w"].key[1] == "GEMM"  # all of them; no measured run
    assert rows["x"].tasks == tuple(sorted([GEMM, GEMM2]))
    even = {r.key[0]: r for r in report.summarise(runs[:3] + [record("h", task=GEMM2, model="y")], [1],
                                                  report.family_key)}
    assert even["y"].key[1] == "GEMM" and even["x"].key[1] == "GEMM"
    # both tasks in both rows, weighed otherwise: x over 2 + 2 runs, y over 2 + 1 (its third interrupted)
    both = [record(f"{m}{t}{k}", cand(1, **OK), task=task, model=m) for m in "xy" for t, task in enumerate((GEMM, GEMM2))
            for k in range(2)]
    both[-1].summary.status = "interrupted"
    uneven = {r.key[0]: r for r in report.summarise(both, [1], report.family_key)}
    assert uneven["x"].key[1] == f"GEMM (runs per task: {GEMM2} 2, {GEMM} 2)"
    assert uneven["y"].key[1] == f"GEMM (runs per task: {GEMM2} 1, {GEMM} 2)" and uneven["y"].unfinished == 1
    scaled = {r.key[0]: r for r in report.summarise(both[:4] + [record("z0", cand(1, **OK), task=GEMM, model="z"),
                                                                 record("z1", cand(1, **OK), task=GEMM2, model="z")],
                                                    [1], report.family_key)}
    assert scaled["z"].key[1] == scaled["x"].key[1] == "GEMM"  # 1 + 1 weighs them as 2 + 2 does
    assert [r.key[1] for r in report.summarise(both, [1])] == [GEMM2, GEMM, GEMM2, GEMM]  # one task a row: as is
    one_each = [record("a", task=GEMM, model="x"), record("b", task=GEMM2, model="y")]
    named = sorted(r.key[1] for r in report.summarise(one_each, [1], report.family_key))
    assert named == [f"GEMM (tasks: {GEMM2})", f"GEMM (tasks: {GEMM})"]
    five = ["gemm_n128_k2048", "gemm_n2048_k4096", "gemm_n2048_k5376", GEMM2, GEMM]
    runs = ([record(f"x{k}", task=t, model="x") for k, t in enumerate(five[:2])]
            + [record(f"y{k}", task=t, model="y") for k, t in enumerate(five)]
            + [record(f"z{k}", task=t, model="z") for k, t in enumerate(five[:3])])
    rows = {r.key[0]: r for r in report.summarise(runs, [1], report.family_key)}
    assert rows["x"].key == ("x", f"GEMM (tasks: {five[0]}, {five[1]})", *report.cell_key(runs[0])[2:])
    assert rows["z"].key[1] == f"GEMM (without {five[3]}, {five[4]})" and rows["y"].key[1] == "GEMM"
    families = report.summarise([record("a", task=GEMM, model="x"), record("b", task=ATTN, model="y")], [1],
                                report.family_key)
    assert [r.key[1] for r in families] == ["GEMM", "attention forward"]  # other families: not read side by side
    apart = report.summarise([record("a", task=GEMM, model="x"), record("b", task=GEMM2, model="y", arch="sm_100a")],
                             [1], report.family_key)
    assert [r.key[1] for r in apart] == ["GEMM", "GEMM"]  # other arch: not read side by side


# ---------------------------------------------------------------------------------------------- cells
def test_a_proportions_and_a_speedups_cell_text():
    assert report._fmt_prop(Proportion(0, 0, 2)) == "n/a"
    lo, hi = Proportion(2, 3, 2).wilson()
    assert report._fmt_prop(Proportion(2, 3, 2)) == f"67% [{lo:.0%}-{hi:.0%}] (2/3, 2 n/a)"
    assert report._fmt_prop(Proportion(1, 1, 0)) == "100% [21%-100%] (1/1)"
    row = CellRow(("m",) * 8, 1, 2, 0, {}, [2.0, 8.0], speedups_held_out=[3.0])
    ci = report.bootstrap_geomean_ci([2.0, 8.0])
    assert report._fmt_speedup(row) == f"4.00x [{ci[0]:.2f}-{ci[1]:.2f}] (n=2)"
    assert report._fmt_speedup(row, held_out=True) == "3.00x (n=1)"
    assert report._fmt_speedup(CellRow(("m",) * 8, 1, 2, 0, {})) == "n/a"


def _row(**kw) -> CellRow:
    ms = {m: Proportion(1, 2, 1) for m in report.PROPORTIONS}
    base = dict(key=("m", GEMM, "sm_90a", "docs", "linear", "off", "full", "on"), turn_limit=4, runs=3, unfinished=0,
                metrics=ms, speedups=[2.0, 8.0], sol_scores=[0.25, 0.5], samples=-1, tasks=(GEMM,),
                model_source="m", speedups_held_out=[1.5])
    return CellRow(**{**base, **kw})


def test_the_csv_fields_of_a_row(tmp_path):
    row = _row()
    d = report.csv_rows([row])[0]
    lo, hi = Proportion(1, 2, 1).wilson()
    ci = report.bootstrap_geomean_ci([2.0, 8.0])
    assert list(d)[:14] == [*report.KEY_NAMES, "model_source", "turn_limit", "runs", "samples", "unfinished",
                            "compiled"]
    assert {k: d[k] for k in ("model", "task", "model_source", "turn_limit", "runs", "samples", "unfinished")} == {
        "model": "m", "task": GEMM, "model_source": "m", "turn_limit": 4, "runs": 3, "samples": 3, "unfinished": 0}
    for m in report.PROPORTIONS:
        assert (d[m], d[f"{m}_lo"], d[f"{m}_hi"], d[f"{m}_n"], d[f"{m}_unknown"]) == (
            0.5, round(lo, 4), round(hi, 4), 2, 1), m
    assert (d["speedup_geomean"], d["speedup_lo"], d["speedup_hi"], d["speedup_n"]) == (
        4.0, round(ci[0], 4), round(ci[1], 4), 2)
    assert (d["speedup_held_out_geomean"], d["speedup_held_out_lo"], d["speedup_held_out_hi"],
            d["speedup_held_out_n"]) == (1.5, "", "", 1)
    assert (d["sol_score_mean"], d["sol_score_n"]) == (0.375, 2)
    bare = report.csv_rows([_row(metrics={m: Proportion(0, 0, 3) for m in report.PROPORTIONS}, speedups=[],
                                 sol_scores=[], speedups_held_out=[3.0, 1 / 3.0])])[0]
    assert (bare["cwa"], bare["cwa_lo"], bare["cwa_hi"], bare["cwa_n"], bare["cwa_unknown"]) == ("n/a", "", "", 0, 3)
    assert (bare["speedup_geomean"], bare["speedup_lo"], bare["speedup_hi"], bare["speedup_n"]) == ("n/a", "", "", 0)
    held = report.bootstrap_geomean_ci([3.0, 1 / 3.0])
    assert (bare["speedup_held_out_geomean"], bare["speedup_held_out_lo"], bare["speedup_held_out_hi"]) == (
        1.0, round(held[0], 4), round(held[1], 4))
    assert (bare["sol_score_mean"], bare["sol_score_n"]) == ("n/a", 0)
    assert report.csv_rows([_row(speedups=[1 / 3.0])])[0]["speedup_geomean"] == 0.3333
    speeds = [1.7, 2.9, 3.3, 2.2, 1.9, 2.6, 3.15]
    odd = report.csv_rows([_row(metrics={m: Proportion(1, 3, 1) for m in report.PROPORTIONS}, speedups=speeds,
                                sol_scores=[0.123456, 0.2], speedups_held_out=[1.234567, 2.345678])])[0]
    sp, held = report.bootstrap_geomean_ci(speeds), report.bootstrap_geomean_ci([1.234567, 2.345678])
    assert (odd["cwa"], odd["speedup_geomean"], odd["speedup_lo"], odd["speedup_hi"]) == (
        0.3333, round(report.geomean(speeds), 4), round(sp[0], 4), round(sp[1], 4))
    assert (odd["speedup_held_out_geomean"], odd["speedup_held_out_lo"], odd["speedup_held_out_hi"]) == (
        round(report.geomean([1.234567, 2.345678]), 4), round(held[0], 4), round(held[1], 4))
    assert odd["sol_score_mean"] == 0.1617 and (odd["speedup_lo"], odd["speedup_hi"]) == (2.079, 2.9004)
    none_held = report.csv_rows([_row(speedups_held_out=[])])[0]
    assert (none_held["speedup_held_out_geomean"], none_held["speedup_held_out_n"]) == ("n/a", 0)
    path = tmp_path / "r.csv"
    report.write_csv([row, _row(turn_limit=8)], path)
    rows = list(csv.DictReader(path.open()))
    assert [r["turn_limit"] for r in rows] == ["4", "8"] and list(rows[0]) == list(d)
    report.write_csv([row], path)
    assert len(list(csv.DictReader(path.open()))) == 1
    report.write_csv([], path)
    assert path.read_text() == ""


def test_the_tables_head_and_cells():
    head, body = report._table([_row(), _row(runs=3, samples=1, unfinished=2, sol_scores=[]), _row(samples=2)])
    assert head == [*report.KEY_NAMES, "runs", "compiled", "arch (SASS)", "correct", "correct held-out too",
                    "correct+arch", "correct+arch executed", "fast_0", "fast_0.5", "fast_0.8", "fast_1",
                    "speedup (geomean)", "speedup held-out (geomean)", "SOL score (mean)"]
    first = body[0]
    assert first[:9] == ["m", GEMM, "sm_90a", "docs", "linear", "off", "full", "on", "3"]
    assert first[9:19] == [report._fmt_prop(Proportion(1, 2, 1))] * 10
    assert first[19:] == [report._fmt_speedup(_row()), "1.50x (n=1)", "0.38 (n=2)"]
    assert body[1][8] == "3 (as 1 sample: same replies) (+2 unfinished)" and body[1][-1] == "n/a"
    assert body[2][8] == "3 (as 2 samples: same replies)"


# ---------------------------------------------------------------------------------------------- plots
def test_the_fast_p_curve_counts_known_runs_only():
    ms = [RunMetrics(metrics().values, 1.5), RunMetrics(metrics().values, 0.5), RunMetrics(metrics().values, None),
          RunMetrics(metrics(cwa_executed=False).values, None), RunMetrics(metrics(cwa_executed=None).values, None)]
    assert report.fast_p_curve(ms, [0, 0.5, 1.0, 1.5]) == [3 / 4, 1 / 3, 1 / 3, 0.0]
    assert report.fast_p_curve(ms[4:], [0, 1]) == [None, None]


def test_the_plots_series_and_which_plots_are_drawn():
    runs = [record("a", arch="sm_100a"), record("b"), record("c", task=ATTN), record("d", status="failed")]
    assert list(report._by_task_arch(runs)) == [(GEMM, "sm_100a"), (GEMM, "sm_90a"), (ATTN, "sm_90a")]
    assert "d" not in {r.config.run_id for rs in report._by_task_arch(runs).values() for r in rs}
    series = report._by_model_setting([record("a"), record("b", strategy="evolve", profile_feedback=True,
                                                          history="latest", require="off", context="none"),
                                       record("c", hints=["tma"], model_name="n")])
    assert list(series) == [("m", "docs"), ("m", "none, evolve, profile on, history latest, unasked"),
                            ("n", "docs+hint:tma")]
    assert [[r.config.run_id for r in rs] for rs in series.values()] == [["a"], ["b"], ["c"]]
    assert report.plots_for([_row()]) == ["fast_p", "speedup_by_turn"]
    varied = [_row(), _row(key=("m", GEMM, "sm_90a", "none", "linear", "on", "full", "off"))]
    assert report.plots_for(varied) == list(report.PLOTS)
    assert report.plots_for([_row(), _row(key=("m", GEMM, "sm_90a", "docs", "linear", "on", "full", "on"))]) == [
        "fast_p", "speedup_by_turn", "profile"]


def test_an_ablation_bar_carries_its_interval_and_count(tmp_path, monkeypatch):
    """Two arms side by side, one over 3 known runs, one over 1 known run and 2 unknown ones: both
    bars read 100%. Before, the plot drew two equal bars; the tables' intervals and counts were not
    on it, so the arm of one run read as sure as the arm of three."""
    from matplotlib.axes import Axes

    drawn: list[tuple] = []
    bar, text = Axes.bar, Axes.text
    monkeypatch.setattr(Axes, "bar", lambda ax, x, h, *a, **kw: drawn.append(("bar", round(h, 6), kw.get("yerr")))
                        or bar(ax, x, h, *a, **kw))
    monkeypatch.setattr(Axes, "text", lambda ax, x, y, s, *a, **kw: drawn.append(("text", s)) or text(ax, x, y, s,
                                                                                                     *a, **kw))
    sure, unsure = Proportion(3, 3, 0), Proportion(1, 1, 2)
    rows = [_row(key=("m", GEMM, "sm_90a", "none", *_row().key[4:]), metrics={m: sure for m in report.PROPORTIONS}),
            _row(metrics={m: unsure for m in report.PROPORTIONS})]
    report.plot_context(rows, 4, tmp_path / "context.png")
    lo3, lo1 = sure.wilson()[0], unsure.wilson()[0]
    assert [d for d in drawn if d[0] == "bar"] == [("bar", 1.0, [[1 - lo3], [0.0]]), ("bar", 1.0, [[1 - lo1], [0.0]])] * 2
    assert [d[1] for d in drawn if d[0] == "text"] == ["3/3", "1/1, 2 n/a"] * 2
    assert lo1 < lo3 and (tmp_path / "context.png").stat().st_size
    # the fast_p curves name their sample counts: one run beside three
    from matplotlib.axes import Axes

    labels: list[str] = []
    plot = Axes.plot
    monkeypatch.setattr(Axes, "plot", lambda ax, *a, **kw: labels.append(kw.get("label")) or plot(ax, *a, **kw))
    runs = [record(f"d{k}", cand(1, **OK, speedup=2.0)) for k in range(3)] + [
        record("n0", cand(1, **OK, speedup=0.5), context="none"), record("n1", context="none", status="interrupted")]
    report.plot_fast_p(runs, 1, tmp_path / "fast_p.png")
    assert labels == ["m (docs), n=3", "m (none), n=1"]


# ---------------------------------------------------------------------------------------------- around
def test_published_rows_go_after_their_tasks_rows():
    pub = PublishedRow(model="p", arch="sm_90a", definition="d", task=GEMM, workload="w", experiment="e",
                       turn_limit=4, trajectories=2, correct=1, correct_with_arch=1, arch_evidence="x",
                       best_speedup=1.5)
    rows = [_row(key=("m", GEMM, *_row().key[2:])), _row(key=("n", f"{GEMM} (tasks: {GEMM})", *_row().key[2:])),
            _row(key=("m", ATTN, *_row().key[2:])), _row(turn_limit=8)]
    head, body = report._turn_table(rows, 4, {4: [pub, pub.model_copy(update={"task": "other"})]})
    assert [b[0] for b in body] == ["m", "n", "p [e] (published, other harness)", "m",
                                    "p [e] (published, other harness)"]
    assert [b[1] for b in body] == [GEMM, f"{GEMM} (tasks: {GEMM})", GEMM, ATTN, "other"]  # after the task's last row
    assert report._turn_table(rows, 4, {8: [pub]})[1] == report._table(rows[:3])[1]
    assert report._turn_table(rows, 4, None) == report._table(rows[:3])


def test_the_default_turn_limits_and_the_runs_line():
    assert report._default_limits([record(budget=Budget(max_turns=8))]) == [1, 4, 8]
    assert report._default_limits([record(budget=Budget(max_turns=3)), record(budget=Budget(max_turns=2))]) == [1, 3]
    assert report._default_limits([record(budget=Budget(max_turns=1))]) == [1]
    assert report._default_limits([record(budget=Budget(max_turns=20))]) == [1, 4, 8, 20]
    assert report._default_limits([]) == [1, 4, 8]
    assert report._runs_line(1, 0).startswith("1 run (0 unfinished, interrupted")
    assert report._runs_line(2, 1).startswith("2 runs (1 unfinished, interrupted")


def test_the_notes_under_the_tables():
    runs = [record("a"), record("b"), record("c", summary=False), record("d")]  # d: evaluated ("ok")
    runs[0].summary.evaluation = "skipped: no GPU"
    runs[1].summary.evaluation = "skipped: no GPU"
    rows = [_row(model_source="scripted:a.json", key=("model_a", *_row().key[1:])),
            _row(model_source="replay:r0", key=("replay:r0", *_row().key[1:])),
            _row(model_source="human", key=("h", *_row().key[1:])),
            _row(model_source="scripted:b.json", key=("scripted:b", *_row().key[1:])),
            _row(model_source="human", key=("human", *_row().key[1:]))]  # labels that say so: no note
    assert report._evaluation_notes(runs, rows) == [
        "evaluation skipped: no GPU (correctness and speed are n/a for those runs)",
        "replies not drawn from a model here, not a model's own result: h: a person's replies; "
        "model_a: scripted replies, written in advance (a.json)"]
    samples = report._evaluation_notes([], [_row(samples=1)])
    assert samples == ["runs of a scripted: or replay: model, or of a model at temperature 0, that got the same "
                       "replies (its replicas) count as one sample: one draw of the model, with the verdicts its "
                       "copies agree on (n/a where they differ) and the geometric mean of their speedups"]
    assert report._evaluation_notes(runs[:0], [_row()]) == []
    assert report._not_a_model("m, replay:x") and report._not_a_model("human") and not report._not_a_model("humane")
    assert report._not_a_model("human, m")
    assert report._source_words("replay:r, human, m") == "a recorded run's replies (r), a person's replies, m"


def test_the_family_tables_and_the_json():
    groups = {"Per task family": [_row(turn_limit=1), _row(turn_limit=4)], "Per split": [_row(turn_limit=4)]}
    tables = list(report._group_tables(groups, [1, 4]))
    assert [t[0] for t in tables] == ["Per task family, turn limit 1", "Per task family, turn limit 4",
                                      "Per split, turn limit 1", "Per split, turn limit 4"]
    assert tables[0][1] == ["family" if h == "task" else h for h in report._table([])[0]]
    assert [len(t[2]) for t in tables] == [1, 1, 0, 1]
    assert list(report._group_tables(None, [1])) == []
    r = report.Report(Path("/o"), {"md": Path("/o/report.md")}, [_row()], 3, 1, [_row(turn_limit=8)], [], {"gpu_s": 1})
    assert report.report_json(r) == {"out_dir": "/o", "runs": 3, "unfinished": 1, "files": {"md": "/o/report.md"},
                                     "rows": report.csv_rows([_row()]),
                                     "families": report.csv_rows([_row(turn_limit=8)]), "splits": [],
                                     "cost": {"gpu_s": 1}}
    assert json.dumps(report.report_json(r))  # plain JSON


def test_the_published_csv(tmp_path):
    pub = PublishedRow(model="p", arch="sm_90a", definition="d", task=GEMM, workload="w", experiment="e",
                       turn_limit=4, trajectories=2, correct=1, correct_with_arch=1, arch_evidence="x",
                       best_speedup=1.5)
    path = tmp_path / "p.csv"
    report._write_published_csv({8: [pub.model_copy(update={"turn_limit": 8})], 4: [pub]}, path)
    rows = list(csv.DictReader(path.open()))
    assert [r["turn_limit"] for r in rows] == ["4", "8"] and rows[0]["source"] == "published, other harness"
    report._write_published_csv({4: [pub]}, path)
    assert len(list(csv.DictReader(path.open()))) == 1
    report._write_published_csv(None, path)
    assert path.read_text() == ""
    assert math.isfinite(float(rows[0]["best_speedup"]))


def test_the_published_rows_of_the_tasks_and_archs_measured():
    from agent.published import rows_for

    rows = [_row(tasks=(GEMM, ATTN)), _row(tasks=(GEMM,), key=("m", GEMM, "sm_100a", *_row().key[3:]))]
    pairs = {(GEMM, "sm_90a"), (ATTN, "sm_90a"), (GEMM, "sm_100a")}
    got = report._published_rows(rows, [1, 4])
    assert got == {1: rows_for(pairs, 1), 4: rows_for(pairs, 4)}
    assert len(got[4]) > len(rows_for({(GEMM, "sm_90a"), (ATTN, "sm_90a")}, 4)) > len(rows_for({(GEMM, "sm_90a")}, 4))
