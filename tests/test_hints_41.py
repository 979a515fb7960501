"""Issue 41, item 7: one pattern hint at a time. `--hint NAME` adds a named pattern doc
(knowledge/hints) whole on top of any arm, the none arm included; `agent knowledge hints` lists
them; the run's config, summary, retrieval event, sweep cell and report row record it, and a
resume cannot change it."""
from __future__ import annotations

import json

import pytest
from agent_loop_helpers import NO_CODE, agent_cli, events, write_script

from knowledge import retriever as kr

NAMES = ("cluster_multicast_load", "fa3_forward", "tma_store_epilogue", "two_kernel_backward", "warp_specialization")


def test_the_named_patterns_exist_and_are_listed():
    assert set(kr.load_hints()) == set(NAMES)
    p = agent_cli("knowledge", "hints", "--json")
    assert p.returncode == 0, p.stderr
    rows = {r["name"]: r for r in json.loads(p.stdout)}
    assert set(rows) == set(NAMES) and rows["fa3_forward"]["arch"] == ["sm_90a"]
    for h in kr.load_hints().values():
        assert "<!--" not in h.text and 100 < kr.count_tokens(h.text) < 1000


@pytest.mark.parametrize("mode", kr.MODES)
def test_a_hint_is_added_whole_on_top_of_any_arm(mode):
    base = kr.retrieve("gemm", "sm_90a", ["wgmma", "tma"], mode=mode, token_budget=6000, op_type="gemm")
    hinted = kr.retrieve("gemm", "sm_90a", ["wgmma", "tma"], mode=mode, token_budget=6000, op_type="gemm",
                         hints=["warp_specialization"])
    hint = kr.load_hints()["warp_specialization"]
    assert hint.text.split("\n", 1)[1].strip()[:300] in hinted.text and hinted.text.startswith(base.text.rstrip("\n"))
    assert hinted.parts["hints"]["sections"] == 1 and hinted.sections[-1].why == "hint:warp_specialization"
    assert hinted.sections[:-1] == base.sections  # the arm itself is unchanged


def test_bad_hints_are_refused_in_one_line():
    assert "unknown hint 'nope'" in kr.hint_problem(["nope"], "sm_90a")
    assert "sm_90a, not sm_100a" in kr.hint_problem(["fa3_forward"], "sm_100a")
    assert "twice" in kr.hint_problem(["fa3_forward", "fa3_forward"], "sm_90a")
    p = agent_cli("solve", "--task", "gemm", "--model", "scripted:/nonexistent.json", "--hint", "nope")
    assert p.returncode == 2 and "unknown hint 'nope'" in p.stderr


def test_a_run_records_its_hint_and_a_resume_cannot_change_it(tmp_path):
    model = write_script(tmp_path / "script.json", [NO_CODE, NO_CODE])
    runs = tmp_path / "runs"
    p = agent_cli("solve", "--task", "gemm", "--model", model, "--arch", "sm_90a", "--context", "none",
                  "--hint", "warp_specialization", "--max-turns", "1", "--runs-dir", str(runs), "--quiet")
    assert p.returncode in (0, 1), p.stderr
    [run_dir] = [d for d in runs.iterdir() if d.is_dir()]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["hints"] == ["warp_specialization"] and config["context"] == "none"
    assert json.loads((run_dir / "summary.json").read_text())["hints"] == ["warp_specialization"]
    [ret] = events(run_dir, "retrieval")
    assert ret["added"] == {"hints": ret["added"]["hints"]} and ret["added"]["hints"]["sections"] == 1
    [req] = events(run_dir, "llm_request")
    user = next(m["content"] for m in req["messages"] if m["role"] == "user")
    assert "Pattern hint: warp specialisation" in user
    p = agent_cli("solve", "--resume", str(run_dir), "--hint", "fa3_forward", "--quiet")
    assert p.returncode == 2 and "--hint" in p.stderr


def test_the_sweep_axis_names_its_cells_and_the_report_keeps_them_apart():
    from agent.report import arm
    from agent.sweep import SweepConfig, expand, variant
    from agent.trajectory import RunConfig

    assert variant("linear", 1, False, "full", "on", ["warp_specialization"]) == "hint-warp_specialization"
    cfg = SweepConfig.model_validate({"name": "h", "models": [{"name": "m", "spec": "scripted:/x.json"}],
                                      "tasks": ["gemm"], "contexts": ["none", "docs"],
                                      "hints": [[], ["warp_specialization"]]})
    runs = expand(cfg)
    assert len(runs) == 4 and {r.hints for r in runs} == {(), ("warp_specialization",)}
    assert any("/hint-warp_specialization/" in r.run_id for r in runs)
    with pytest.raises(ValueError, match="unknown hint"):
        SweepConfig.model_validate({"name": "h", "models": [{"name": "m", "spec": "scripted:/x.json"}],
                                    "tasks": ["gemm"], "hints": [["nope"]]})
    c = RunConfig(run_id="r", task="gemm_n7168_k5120", model="m", arch="sm_90a", context="docs",
                  hints=["warp_specialization"])
    assert arm(c) == "docs+hint:warp_specialization"
