"""Issue 41's steering check, through the real CLI with a scripted model: the turn-1 prompts a run
sends (its llm_request events) for GEMM, attention backward, causal forward and FP8 attention on
sm_90a, in the none and docs arms, with the instructions requested and not (one `agent sweep` over
the `requires` axis); then a two-turn `agent solve --require off` whose feedback must not name
them either, a resume that must not change the setting, and the report's require column.

The docs-arm checks (the pipeline in code, no doc markup, no Blackwell material on Hopper) are the
docs side of the issue; tests/test_arms_docs_41.py checks them on every task x arch x arm."""
from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from agent_loop_helpers import NO_CODE, agent_cli, cli_env, cpu_only, simple_attn_bwd_reply, write_script  # noqa: F401

from agent.trajectory import read_config, read_events, read_summary

TASKS = {"gemm": "gemm_n7168_k5120", "attn_bwd": "mha_bwd_d128", "attn_fwd_causal": "mha_fwd_d128_causal",
         "fp8_attn_fwd": "fp8_mha_with_lse_d128"}
INSTRUCTION_NAMES = re.compile(r"wgmma|cp\.async\.bulk|mbarrier|\bTMA\b|tcgen05|setmaxnreg", re.I)
REQUEST_WORDS = re.compile(r"requested instruction|Requested instructions|credited|must use these", re.I)

GRID = """\
name = "steer"
models = [{spec = "scripted:script.json", name = "script"}]
tasks = ["gemm", "attn_bwd", "attn_fwd_causal", "fp8_attn_fwd"]
arches = ["sm_90a"]
contexts = ["none", "docs"]
requires = ["on", "off"]
executed_check = false
check_models = false
concurrency = 4
runs_dir = "runs"

[budget]
max_turns = 1
"""


@pytest.fixture(scope="module")
def turn1(tmp_path_factory) -> dict[tuple[str, str, str], list[dict]]:
    """(task alias, context, require) -> the chat its run sent on turn 1."""
    d = tmp_path_factory.mktemp("steer")
    (d / "script.json").write_text(json.dumps({"replies": [NO_CODE]}))
    (d / "sweep.toml").write_text(GRID)
    proc = subprocess.run([sys.executable, "-m", "agent.cli", "sweep", "sweep.toml", "--json"], cwd=d, env=cli_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = {}
    for alias, task in TASKS.items():
        for context in ("none", "docs"):
            for require in ("on", "off"):
                run = d / "runs" / "steer" / "script" / task / "sm_90a" / context / \
                    ("require-off/" if require == "off" else "") / "r0"
                assert read_config(run).require == require and read_summary(run).require == require
                req = next(read_events(run, "llm_request"))
                out[(alias, context, require)] = req["messages"]
    out["_dir"] = d  # type: ignore[index]
    return out


def _text(messages: list[dict]) -> str:
    return "\n".join(m["content"] for m in messages)


def _statement(messages: list[dict]) -> str:
    """The system prompt and the task statement, without the retrieved docs."""
    user = messages[1]["content"].split("## Reference material")[0]
    return messages[0]["content"] + "\n" + user


@pytest.mark.parametrize("alias", TASKS)
def test_require_off_prompts_name_no_instruction(turn1, alias):
    none = _text(turn1[(alias, "none", "off")])
    assert not INSTRUCTION_NAMES.search(none), INSTRUCTION_NAMES.search(none).group(0)
    assert not REQUEST_WORDS.search(none), REQUEST_WORDS.search(none).group(0)
    # the docs arm keeps the architecture docs (the knowledge ablated), with no request or credit rule
    docs = turn1[(alias, "docs", "off")]
    assert not INSTRUCTION_NAMES.search(_statement(docs)) and not REQUEST_WORDS.search(_statement(docs))
    assert "## Reference material" in docs[1]["content"]
    # the docs are the same docs whether asked or not
    on_docs = turn1[(alias, "docs", "on")][1]["content"].split("## Reference material")[1]
    assert docs[1]["content"].split("## Reference material")[1].split("\nThis is turn")[0] == \
        on_docs.split("\nThis is turn")[0]
    on = _text(turn1[(alias, "none", "on")])
    assert "## Requested instructions" in on and "credited only if" in on


@pytest.mark.parametrize("alias", ["gemm", "fp8_attn_fwd"])
def test_none_prompts_carry_no_design(turn1, alias):
    for require in ("on", "off"):
        text = _text(turn1[(alias, "none", require)])
        assert '"128B"' not in text.split("`swizzle` is")[0] and "128B swizzle" not in text
        assert not re.search(r'"swizzle"\s*:', text) and "384" not in text
        assert not re.search(r"transpos\w* V|\bVt\b|transpose_v", text)


@pytest.mark.parametrize("alias", TASKS)
def test_no_doc_markup_or_blackwell_material_in_the_none_arm(turn1, alias):
    for require in ("on", "off"):
        text = _text(turn1[(alias, "none", require)])
        assert "<!--" not in text and "tcgen05" not in text


@pytest.mark.parametrize("alias", TASKS)
def test_no_doc_markup_or_blackwell_material_in_the_docs_arm(turn1, alias):
    for require in ("on", "off"):
        text = _text(turn1[(alias, "docs", require)])
        assert "<!--" not in text and "tcgen05" not in text


def _code_blocks(text: str) -> str:
    return "\n".join(re.findall(r"```[a-z+]*\n(.*?)```", text, re.S))


@pytest.mark.parametrize("alias", ["gemm", "attn_bwd", "attn_fwd_causal"])
def test_docs_arm_teaches_the_tma_pipeline_in_code(turn1, alias):
    for require in ("on", "off"):
        code = _code_blocks(turn1[(alias, "docs", require)][1]["content"])
        assert "cp.async.bulk.tensor" in code and "mbarrier.try_wait" in code


def test_solve_require_off_feedback_resume_and_report(tmp_path):
    """Two turns of the SIMT attention backward under --require off: compiled without the requested
    instructions, which under off is the goal met (optimise), and the feedback names none of them;
    the run is still judged on them (arch_sass false). A resume cannot change the setting."""
    model = write_script(tmp_path / "s.json", [simple_attn_bwd_reply(), NO_CODE])
    proc = agent_cli("solve", "--task", "attn_bwd", "--model", model, "--context", "none", "--require", "off",
                     "--max-turns", "2", "--no-executed", "--runs-dir", str(tmp_path / "runs"), "--run-id", "off",
                     "--json", "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "runs" / "off"
    summary = read_summary(run)
    assert summary.require == "off" and read_config(run).require == "off"
    first = summary.per_turn[0]
    assert first.candidates[0].outcome == "arch_missing" and first.action == "optimise"
    assert first.candidates[0].verdicts.arch_sass is False  # judged on them all the same
    for req in read_events(run, "llm_request"):
        text = _text(req["messages"])
        assert not INSTRUCTION_NAMES.search(text.replace(simple_attn_bwd_reply(), "")), req["turn"]
    fb = next(read_events(run, "feedback"))["text"]
    assert "compiles (its correctness is not known yet)" in fb and not REQUEST_WORDS.search(fb)
    again = agent_cli("solve", "--resume", "off", "--runs-dir", str(tmp_path / "runs"), "--require", "on")
    assert again.returncode == 2 and "cannot change --require" in again.stderr, again.stderr
    same = agent_cli("solve", "--resume", "off", "--runs-dir", str(tmp_path / "runs"), "--require", "off", "--quiet")
    assert same.returncode == 0, same.stderr[-2000:]


def test_report_rows_name_the_require_setting(turn1, tmp_path):
    from agent.report import write_report

    report = write_report([turn1["_dir"] / "runs"], tmp_path / "report", turn_limits=[1])
    with open(report.files["csv"]) as f:
        rows = list(csv.DictReader(f))
    assert {r["require"] for r in rows} == {"on", "off"} and len(rows) == 16
    assert "require" in report.files  # the ablation's plot: the runs vary it
