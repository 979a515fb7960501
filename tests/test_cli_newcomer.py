"""A newcomer's pass over the CLI (issue 13), as a user meets it: the real `agent` in a
subprocess. Bad input is one line and exit 2 with nothing written; machine-readable output
keeps the target architecture (`arch`) apart from the SASS verdict (`arch_sass`); a sweep
where no run succeeds says so and exits non-zero; shipped examples are never written to."""
from __future__ import annotations

import csv
import json
import shlex
import shutil
import subprocess
import sys

import pytest
from agent_loop_helpers import cpu_only  # noqa: F401  (autouse fixture)
from agent_loop_helpers import (GEMM_TASK, REPO, agent_cli, broken_probe_reply, cli_env, ctrl_c_reaches_it,
                                probe_reply, write_script)
from openai_server import OpenAIServer as S
from openai_server import openai_server  # noqa: F401  (the fixture)

from agent import replay
from agent.run import SolveRequest, settings_problem, solve
from agent.sweep import SweepConfig, SweepError, load_sweep_config, run_sweep
from agent.trajectory import EXECUTED_CHECK_DEFAULT, Budget, RunFolderError, read_config

EXAMPLE = REPO / "runs" / "examples" / "attn_bwd_human"


def one_line_error(p: subprocess.CompletedProcess, *words: str) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    message = " ".join(p.stderr.split())  # rich may wrap one message when stderr is not a terminal
    assert message.startswith("error:") and message.count("error:") == 1, p.stderr
    assert "Traceback" not in p.stderr and p.stdout == "", (p.stdout, p.stderr)
    for w in words:
        assert w in message, (w, message)
    return message


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A real two-turn run (compile error, then wgmma + TMA), recorded with a scripted model."""
    root = tmp_path_factory.mktemp("recorded")
    model = write_script(root / "s.json", [broken_probe_reply(), probe_reply()])
    s = solve(SolveRequest(task=GEMM_TASK, model=model, runs_dir=root / "runs", context="none",
                           budget=Budget(max_turns=2)), progress=False)
    return root / "runs" / s.run_id


def copy_of(run_dir, tmp_path, name="copy"):
    return shutil.copytree(run_dir, tmp_path / name)


# ---- 1. no traceback --------------------------------------------------------------------------
def test_a_binary_task_file_is_one_line(tmp_path):
    blob = tmp_path / "task.bin"
    blob.write_bytes(bytes(range(256)) * 8)
    solution = str(REPO / "tasks" / GEMM_TASK / "expert")
    for args in (("eval", solution, "--task", str(blob)), ("check", solution, "--task", str(blob)),
                 ("tasks", "show", str(blob))):
        one_line_error(agent_cli(*args), "not UTF-8")


def test_a_bad_config_json_is_one_line(recorded, tmp_path):
    run = copy_of(recorded, tmp_path)
    (run / "config.json").write_text("{}")
    for args in (("solve", "--resume", str(run)), ("replay", str(run))):
        one_line_error(agent_cli(*args), "config.json", "run_id")
    with pytest.raises(replay.ReplayError, match="config.json"):
        replay.through_graph(run, runs_dir=tmp_path / "replays")
    for text in ("not json", '{"run_id": "x"}'):
        (run / "config.json").write_text(text)
        with pytest.raises(RunFolderError, match="config.json: not a valid RunConfig"):
            read_config(run)


def test_a_damaged_events_log_is_an_error_not_a_match(recorded, tmp_path):
    binary = copy_of(recorded, tmp_path, "binary")
    (binary / "events.jsonl").write_bytes(bytes(range(128, 256)) * 20)
    garbage = copy_of(recorded, tmp_path, "garbage")
    (garbage / "events.jsonl").write_text("garbage\nmore garbage\n")
    cut = copy_of(recorded, tmp_path, "cut")
    text = (recorded / "events.jsonl").read_text()
    (cut / "events.jsonl").write_text(text[:len(text) // 3])
    for run, words in ((binary, "not UTF-8"), (garbage, "not a JSON event"), (cut, "cut short")):
        with pytest.raises(replay.ReplayError, match=words):
            replay.reevaluate(run)
        with pytest.raises(replay.ReplayError, match=words):
            replay.through_graph(run, runs_dir=tmp_path / "replays")
    one_line_error(agent_cli("replay", str(binary), "--through-graph"), "not UTF-8")


def test_an_unfinished_log_compares_only_its_recorded_turns(recorded, tmp_path):
    run = copy_of(recorded, tmp_path)
    lines = (run / "events.jsonl").read_text().splitlines(keepends=True)
    first_decision = next(i for i, line in enumerate(lines) if '"type": "decision"' in line)
    (run / "events.jsonl").write_text("".join(lines[:first_decision + 1]))
    (run / "summary.json").unlink()  # killed during turn 2
    p = agent_cli("replay", str(run), "--through-graph", "--runs-dir", str(tmp_path / "replays"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "DIFFERENT" not in p.stdout and "not recorded" in p.stdout and "match: decision sequence" in p.stdout


def test_report_and_fixit_bad_input_are_one_line(recorded, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    one_line_error(agent_cli("report", str(recorded), "--turn-limits", "0,-1", "--out", str(tmp_path / "r")),
                   "--turn-limits")
    one_line_error(agent_cli("report", str(recorded), "--out", str(afile)), "not a folder")
    one_line_error(agent_cli("fixit", "build", str(recorded), "--out", str(afile)), "not a folder")
    assert afile.read_text() == "keep me" and not (tmp_path / "r").exists()


def test_bench_eval_knowledge_bad_values_are_one_line():
    one_line_error(agent_cli("bench", "--workloads", "bogus"), "--workloads", "bogus")
    one_line_error(agent_cli("bench", "--arch", "sm_80"), "sm_80")
    one_line_error(agent_cli("eval", str(REPO / "tasks" / GEMM_TASK / "expert"), "--task", "gemm", "--timeout", "-1"),
                   "--timeout")
    one_line_error(agent_cli("knowledge", "search", "wgmma", "--features", "wgmma,nosuch"), "nosuch")
    one_line_error(agent_cli("knowledge", "search", "  "), "QUERY is empty")  # not an empty table, exit 0


def test_a_sweep_config_that_does_not_parse_is_one_line_naming_the_file(tmp_path):
    bad = tmp_path / "s.toml"
    bad.write_text("hello = \n[x")
    one_line_error(agent_cli("sweep", str(bad), "--dry-run"), str(bad), "not valid TOML", "line 1")
    yml = tmp_path / "s.yaml"
    yml.write_text("a: [1\n")
    one_line_error(agent_cli("sweep", str(yml), "--dry-run"), str(yml), "not valid YAML", "line 2")


def test_solve_settings_are_checked_up_front(tmp_path):
    one_line_error(agent_cli("solve", "--task", "gemm", "--model", "openai/x", "--api-base", "http://127.0.0.1:9/v1",
                             "--max-cost", "-1", "--runs-dir", str(tmp_path)), "max_cost (--max-cost)")
    assert not any(tmp_path.iterdir())
    assert "max_turns" in settings_problem(budget=Budget(max_turns=0))
    assert "--request-timeout" in settings_problem(model_options={"timeout_s": 0})
    assert "unknown model option 'timeout'" in settings_problem(model_options={"timeout": 5})
    assert settings_problem(arch="sm_100a", context="full", budget=Budget(max_time_s=60)) is None


def test_human_model_without_a_terminal_or_with_a_missing_file(tmp_path):
    env = {"PTXBENCH_HUMAN_REPLY_FILE": ""}
    p = agent_cli("solve", "--task", "gemm", "--model", "human", "--runs-dir", str(tmp_path), env=env,
                  stdin=subprocess.DEVNULL)
    one_line_error(p, "needs a terminal", "--human-reply-file")
    p = agent_cli("solve", "--task", "gemm", "--model", "human", "--human-reply-file", str(tmp_path / "nope.md"),
                  "--runs-dir", str(tmp_path), env=env)
    one_line_error(p, "nope.md", "does not exist")  # and no 500-line prompt before it
    assert not any(tmp_path.iterdir())


def test_markup_in_a_message_is_printed_as_text():
    # rich would read "[train]" as a style tag and drop it ("pip install -e '.'" was printed)
    one_line_error(agent_cli("tasks", "show", "gemm[train]"), "gemm[train]")


# ---- 2. the target architecture and the SASS verdict, apart ------------------------------------
def test_report_keeps_arch_and_the_sass_verdict_apart(recorded, tmp_path):
    p = agent_cli("report", str(recorded), "--out", str(tmp_path / "r"), "--json")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)["rows"]
    assert {r["arch"] for r in rows} == {"sm_90a"}
    assert [r["arch_sass"] for r in rows] == [0.0, 1.0]  # turn 1: compile error; by turn 2: wgmma + TMA
    [first, second] = csv.DictReader(open(tmp_path / "r" / "report.csv"))
    assert first["arch"] == second["arch"] == "sm_90a" and (first["arch_sass"], second["arch_sass"]) == ("0.0", "1.0")


def test_bench_and_eval_json_keep_arch_and_the_sass_verdict_apart():
    p = agent_cli("bench", "--task", "gemm", "--json")
    assert p.returncode == 0, p.stderr
    [row] = json.loads(p.stdout)
    assert row["arch"] == "sm_90a" and row["arch_sass"] is True and row["compiled"] is True
    assert "[1/1] gemm_n7168_k5120: compiled yes" in p.stderr  # a progress line per solution
    p = agent_cli("eval", str(REPO / "tasks" / GEMM_TASK / "expert"), "--task", "gemm", "--json")
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout)
    assert result["arch"] == "sm_90a" and result["verdicts"]["arch_sass"] is True and "arch" not in result["verdicts"]


# ---- 3. no silent success ---------------------------------------------------------------------
SWEEP = """\
name = "s"
models = [{models}]
tasks = ["gemm"]
contexts = ["none"]
runs_dir = "runs"
{extra}
[budget]
max_turns = {turns}
"""


def sweep_cli(tmp_path, models='"openai/gpt-4o"', extra="", turns=1):
    """`agent sweep` on a one-model config, with no LLM key in the environment."""
    (tmp_path / "s.toml").write_text(SWEEP.format(models=models, extra=extra, turns=turns))
    env = {k: v for k, v in cli_env().items() if k not in ("OPENAI_API_KEY", "PTXBENCH_API_KEY")}
    return subprocess.run([sys.executable, "-m", "agent.cli", "sweep", "s.toml"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_sweep_config_is_checked_when_loaded(tmp_path):
    one_line_error(sweep_cli(tmp_path, extra="replicaz = 3"), "replicaz", "did you mean 'replicas'")
    assert not (tmp_path / "runs").exists()
    for models, extra, turns, words in [
            ('"openai/a"', 'arches = ["sm_80"]', 1, "sm_80"),
            ('"openai/a"', "", -1, "max_turns"),
            ('"openai/a"', "", "1\nmax_turnz = 2", "max_turnz"),
            ('{spec = "openai/a", options = {timeout = 5}}', "", 1, "timeout"),
            ('{spec = "openai/a", replicas = 2}', "", 1, "replicas")]:
        (tmp_path / "s.toml").write_text(SWEEP.format(models=models, extra=extra, turns=turns))
        with pytest.raises(ValueError, match=words):
            load_sweep_config(tmp_path / "s.toml")


def test_a_sweep_with_an_unusable_model_stops_before_any_run(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("PTXBENCH_API_KEY", raising=False)
    one_line_error(sweep_cli(tmp_path), "OPENAI_API_KEY")  # through the CLI, before the progress bar
    assert not (tmp_path / "runs").exists()
    for models, words in [('{spec = "openai/x", api_base = "http://127.0.0.1:9/v1"}', "cannot reach"),
                          ('"nosuchmodel"', "no provider"), ('"replay:nope"', "replay: no events.jsonl")]:
        (tmp_path / "s.toml").write_text(SWEEP.format(models=models, extra="", turns=1))
        config = load_sweep_config(tmp_path / "s.toml")
        with pytest.raises(SweepError, match=words):
            run_sweep(config)
        assert not (tmp_path / "runs").exists()


def test_a_model_the_server_does_not_know_stops_the_sweep(tmp_path, openai_server):
    openai_server.push(S.status(404, "The model `nosuch` does not exist"))
    (tmp_path / "s.toml").write_text(SWEEP.format(
        models=f'{{spec = "openai/nosuch", api_base = "{openai_server.base_url}"}}', extra="", turns=1))
    with pytest.raises(SweepError, match="openai/nosuch: a test request failed: bad_request"):
        run_sweep(load_sweep_config(tmp_path / "s.toml"))
    assert len(openai_server.requests) == 1 and not (tmp_path / "runs").exists()


def test_a_sweep_where_every_run_fails_exits_nonzero_once(tmp_path):
    (tmp_path / "bad.json").write_text(json.dumps({"replies": [{"fault": "auth", "status": 401,
                                                                "message": "invalid api key"}]}))
    p = sweep_cli(tmp_path, '"scripted:bad.json"', "replicas = 3")
    assert p.returncode == 1, p.stderr
    assert p.stdout.count("invalid api key") == 1 and "and 2 other runs" in p.stdout
    assert "agent report" not in p.stdout and "no run of sweep s succeeded" in p.stderr


def test_config_defaults_agree():
    assert EXECUTED_CHECK_DEFAULT is True and SolveRequest(task="gemm", model="x").executed_check is True
    assert SweepConfig(name="x", models=["openai/a"], tasks=["gemm"]).executed_check is True
    with pytest.raises(ValueError, match="replicaz"):
        SweepConfig(name="x", models=["openai/a"], tasks=["gemm"], replicaz=2)


# ---- 4. shipped examples are read-only inputs ---------------------------------------------------
def git_status(path):
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--", str(path)], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout


@pytest.mark.skipif(not (REPO / ".git").exists(), reason="needs the git checkout")
def test_commands_on_the_shipped_example_leave_it_untouched(tmp_path):
    assert git_status(EXAMPLE) == ""
    message = one_line_error(agent_cli("solve", "--resume", str(EXAMPLE)), "shipped example")
    # the hint is a command that works
    hint = shlex.split(message.split("replies:", 1)[1])
    assert hint[:2] == ["agent", "solve"]
    one_line_error(agent_cli("solve", "--resume", "attn_bwd_human", "--runs-dir", str(EXAMPLE.parent)),
                   "shipped example")
    one_line_error(agent_cli("report", str(EXAMPLE)), "--out")
    one_line_error(agent_cli("report", str(EXAMPLE), "--out", str(EXAMPLE / "report")), "read-only")
    p = agent_cli("replay", str(EXAMPLE))  # 1 would mean today's tools judge a candidate differently
    assert p.returncode in (0, 1) and "Traceback" not in p.stderr, p.stderr
    assert agent_cli("report", str(EXAMPLE), "--out", str(tmp_path / "r")).returncode == 0
    p = agent_cli(*hint[1:], "--runs-dir", str(tmp_path / "runs"), "--max-turns", "1", "--quiet")
    assert p.returncode == 0, p.stderr
    assert git_status(EXAMPLE) == ""


def test_resume_refuses_options_it_would_ignore(recorded, tmp_path):
    run = copy_of(recorded, tmp_path)
    one_line_error(agent_cli("solve", "--resume", str(run), "--model", "openai/other", "--max-turns", "9"),
                   "--model", "--max-turns")
    config = read_config(run)
    p = agent_cli("solve", "--resume", str(run), "--task", "gemm", "--model", config.model, "--json")
    assert p.returncode == 0, p.stderr  # repeating what was recorded is fine
    assert json.loads(p.stdout)["run_id"] == config.run_id


def test_replaying_a_run_on_another_task_says_so(tmp_path):
    """Refused, not warned: the run would record the replies as the model's answers to gemm."""
    p = agent_cli("solve", "--task", "gemm", "--model", f"replay:{EXAMPLE}", "--max-turns", "1", "--context",
                  "none", "--runs-dir", str(tmp_path), "--quiet")
    one_line_error(p, "task mha_bwd_d128", "task gemm_n7168_k5120", "agent eval")
    assert not any(tmp_path.iterdir())


# ---- 5. printed things work and read right ------------------------------------------------------
def test_version_plurals_and_the_folder_printed(tmp_path):
    p = agent_cli("--version")
    assert p.returncode == 0 and p.stdout.startswith("ptxbench ")
    model = write_script(tmp_path / "s.json", [probe_reply()])
    p = agent_cli("solve", "--task", GEMM_TASK, "--model", model, "--max-turns", "1", "--context", "none",
                  "--runs-dir", str(tmp_path / "runs"), "--quiet")
    assert p.returncode == 0, p.stderr
    assert "1 LLM call," in p.stdout and "0 faults" in p.stdout
    folder = p.stdout.split("folder: ", 1)[1].split()[0]
    assert (tmp_path / "runs").resolve() in (REPO / folder).resolve().parents
    assert read_config(REPO / folder).executed_check is EXECUTED_CHECK_DEFAULT  # solve's default, like eval's
    p = agent_cli("report", folder, "--out", str(tmp_path / "r"))
    assert p.returncode == 0 and p.stdout.startswith("1 run (")


def test_tables_fold_instead_of_cutting_names():
    p = agent_cli("tasks", env={"COLUMNS": "80"})
    assert p.returncode == 0, p.stderr
    assert "…" not in p.stdout and max(len(line) for line in p.stdout.splitlines()) <= 80
    for name in ("mha_fwd_d128_causal", "attn_fwd_causal", "mha_bwd_d128_causal", "attn_bwd_causal"):
        assert name in p.stdout
    narrow = agent_cli("tasks", env={"COLUMNS": "40"})
    assert narrow.returncode == 0 and "…" not in narrow.stdout and "attn_bwd_causal" in narrow.stdout


# ---- issue 23: newcomer pass 2 ------------------------------------------------------------------
def summary_of(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


def test_a_missing_toolchain_is_an_infrastructure_error_not_the_models(tmp_path):
    """PTXBENCH_PTXAS pointing nowhere: no candidate is recorded as a compile error, the model
    is never told ptxas rejected its kernel, the run stops with infra_error and exit 3; once
    the toolchain is back, resume evaluates the same reply (no new LLM call) and finishes."""
    model = write_script(tmp_path / "s.json", [probe_reply()])
    broken = {"PTXBENCH_PTXAS": str(tmp_path / "nonexistent")}
    p = agent_cli("solve", "--task", "gemm", "--model", model, "--max-turns", "1", "--context", "none",
                  "--runs-dir", str(tmp_path / "runs"), "--run-id", "r", "--quiet", env=broken)
    assert p.returncode == 3, (p.stdout, p.stderr)
    assert "infrastructure error" in p.stderr and "Traceback" not in p.stderr
    run = tmp_path / "runs" / "r"
    s = summary_of(run)
    assert (s["status"], s["stop_reason"]) == ("failed", "infra_error") and s["per_turn"] == []
    kinds = [json.loads(line)["type"] for line in (run / "events.jsonl").read_text().splitlines()]
    assert "infra_error" in kinds and "candidate" not in kinds and "feedback" not in kinds
    assert "compile_error" not in (run / "events.jsonl").read_text()
    solution = REPO / "tasks" / GEMM_TASK / "expert"
    p = agent_cli("eval", str(solution), "--task", "gemm", env=broken)
    assert p.returncode == 3 and "infrastructure error" in p.stdout, (p.stdout, p.stderr)
    p = agent_cli("check", str(solution), "--task", "gemm", env=broken)
    assert p.returncode == 3 and "ptxas" in p.stderr, (p.stdout, p.stderr)
    p = agent_cli("bench", "--task", "gemm", env=broken)
    assert p.returncode == 3, (p.stdout, p.stderr)
    # no disassembler: the features cannot be judged, which is no verdict of "arch missing"
    blind = {"PTXBENCH_CUOBJDUMP": str(tmp_path / "none"), "PTXBENCH_NVDISASM": str(tmp_path / "none")}
    p = agent_cli("check", str(solution), "--task", "gemm", env=blind)
    assert p.returncode == 3, (p.stdout, p.stderr)
    p = agent_cli("solve", "--task", "gemm", "--model", model, "--max-turns", "1", "--context", "none",
                  "--runs-dir", str(tmp_path / "runs"), "--run-id", "blind", "--json", env=blind)
    assert p.returncode == 3 and json.loads(p.stdout)["stop_reason"] == "infra_error", (p.stdout, p.stderr)
    p = agent_cli("replay", str(EXAMPLE), env=broken)  # today's tools cannot judge: nothing compared
    assert p.returncode == 3 and "infrastructure error" in p.stderr, (p.stdout, p.stderr)
    # the sweep side: an infra_error run is not done; it is resumed by the next `agent sweep`
    from agent.sweep import run_state
    assert run_state(run) == "partial"
    p = agent_cli("solve", "--resume", str(run), "--json")
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["status"] == "finished" and s["usage"]["llm_calls"] == 1
    assert s["per_turn"][0]["candidates"][0]["outcome"] in ("unverified", "correct_with_arch")


def test_ctrl_c_in_a_sweep_records_runs_in_flight_as_interrupted(tmp_path, openai_server):
    """Concurrency 1, three runs, Ctrl-C while the first run waits for the model: that run ends
    `interrupted` (no candidate, no verdict), the others never start, exit 130; `--dry-run`
    calls it partial, and the next `agent sweep` resumes it and the report counts 3/3 compiled."""
    import signal
    import time

    openai_server.default = S.ok(probe_reply())
    openai_server.push(S.delay(4.0, S.ok(probe_reply())))
    (tmp_path / "s.toml").write_text(SWEEP.format(
        models=f'{{spec = "openai/m", api_base = "{openai_server.base_url}"}}',
        extra="replicas = 3\nconcurrency = 1\ncheck_models = false", turns=1))
    proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "sweep", "s.toml"], cwd=tmp_path,
                            env=cli_env({"OPENAI_API_KEY": "x"}), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=ctrl_c_reaches_it)
    deadline = time.monotonic() + 120
    while not openai_server.requests and time.monotonic() < deadline:
        time.sleep(0.1)
    assert openai_server.requests, "the first run never called the model"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err and "cannot schedule" not in out + err and "interrupted" in err
    runs = tmp_path / "runs" / "s" / "openai-m" / GEMM_TASK / "sm_90a" / "none"
    s = summary_of(runs / "r0")
    assert s["status"] == "interrupted" and s["per_turn"] == []
    assert not (runs / "r1").exists() and not (runs / "r2").exists()
    p = subprocess.run([sys.executable, "-m", "agent.cli", "sweep", "s.toml", "--dry-run"], cwd=tmp_path,
                       env=cli_env(), capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.count("partial") == 1 and p.stdout.count("new") == 2, p.stdout
    p = subprocess.run([sys.executable, "-m", "agent.cli", "sweep", "s.toml"], cwd=tmp_path,
                       env=cli_env({"OPENAI_API_KEY": "x"}), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert "1 resumed" in p.stdout and "3 succeeded" in p.stdout
    assert len(openai_server.requests) == 3  # the interrupted run's reply was kept, not asked again
    p = agent_cli("report", str(tmp_path / "runs" / "s"), "--out", str(tmp_path / "report"), "--json")
    assert p.returncode == 0, p.stderr
    [row] = json.loads(p.stdout)["rows"]  # one cell, one turn limit: all three runs, all compiled
    assert (row["runs"], row["unfinished"], row["compiled"], row["compiled_n"]) == (3, 0, 1.0, 3), row


def test_run_folders_resume_from_anywhere_and_stay_where_they_belong(tmp_path):
    """A run started with a relative replay path resumes from another folder; --run-id cannot
    climb out of --runs-dir; --runs-dir inside the shipped examples is refused."""
    work = tmp_path / "work"
    shutil.copytree(EXAMPLE, work / "rec")
    p = agent_cli("solve", "--task", "attn_bwd", "--model", "replay:rec", "--max-turns", "2", "--context", "none",
                  "--runs-dir", "runs", "--run-id", "r", "--quiet", cwd=work)
    assert p.returncode == 0, p.stderr
    (work / "runs" / "r" / "summary.json").unlink()  # as if killed before the end
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    p = agent_cli("solve", "--resume", str(work / "runs" / "r"), "--json", cwd=elsewhere)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["status"] == "finished"
    for bad in ("../x", "/tmp/x", "a/../../x", "a//b", "."):
        one_line_error(agent_cli("solve", "--task", "attn_bwd", "--model", "replay:rec", "--run-id", bad,
                                 "--runs-dir", "runs", cwd=work), "--run-id")
    assert not (work / "x").exists() and not (tmp_path / "x").exists()
    if (REPO / ".git").exists():
        one_line_error(agent_cli("solve", "--task", "attn_bwd", "--model", "replay:rec", "--runs-dir",
                                 str(EXAMPLE.parent), "--quiet", cwd=work), "shipped example")
        (tmp_path / "s.toml").write_text(SWEEP.format(models='"replay:work/rec"', extra="", turns=1)
                                         .replace('runs_dir = "runs"', f'runs_dir = "{EXAMPLE.parent}"')
                                         .replace('tasks = ["gemm"]', 'tasks = ["attn_bwd"]'))  # the recording's
        one_line_error(agent_cli("sweep", "s.toml", cwd=tmp_path), "read-only")
        assert git_status(EXAMPLE.parent) == ""


def test_fixit_train_takes_a_local_model_folder_and_says_so(tmp_path):
    """An empty folder or a hub name is one line at once (no traceback, no hub retries)."""
    import time

    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text(json.dumps({"messages": [
        {"role": "user", "content": "fix it"}, {"role": "assistant", "content": "fixed", "weight": 1}]}) + "\n")
    (tmp_path / "empty").mkdir()
    started = time.monotonic()
    one_line_error(agent_cli("fixit", "train", str(data), "--base-model", str(tmp_path / "empty"), "--out",
                             str(tmp_path / "a")), "not a model folder")
    one_line_error(agent_cli("fixit", "train", str(data), "--base-model", "gpt2", "--out", str(tmp_path / "a")),
                   "no such folder", "local folder")
    assert time.monotonic() - started < 60 and not (tmp_path / "a").exists()


def test_a_human_out_of_replies_ends_like_a_replay_and_a_finished_run_stays_finished(tmp_path):
    replies = tmp_path / "replies"
    replies.mkdir()
    (replies / "1.md").write_text(probe_reply())
    p = agent_cli("solve", "--task", "gemm", "--model", "human", "--human-reply-file", str(replies), "--max-turns",
                  "3", "--context", "none", "--runs-dir", str(tmp_path / "runs"), "--run-id", "h", "--quiet")
    assert p.returncode == 0, (p.stdout, p.stderr)
    run = tmp_path / "runs" / "h"
    before = (run / "summary.json").read_text()
    assert json.loads(before)["stop_reason"] == "human_end" and "error:" not in p.stderr
    # resuming it changes nothing and asks nobody (no terminal, no reply file, an editor that fails)
    p = agent_cli("solve", "--resume", str(run), env={"EDITOR": "false", "VISUAL": "false"})
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert "already finished" in p.stderr and (run / "summary.json").read_text() == before


def test_a_sweep_refuses_runs_recorded_for_another_spec_under_the_same_name(tmp_path):
    write_script(tmp_path / "a.json", [probe_reply()])
    write_script(tmp_path / "b.json", [broken_probe_reply()])
    (tmp_path / "s.toml").write_text(SWEEP.format(models='{spec = "scripted:a.json", name = "m"}', extra="",
                                                  turns=1))
    p = agent_cli("sweep", "s.toml", cwd=tmp_path)
    assert p.returncode == 0, (p.stdout, p.stderr)
    (tmp_path / "s.toml").write_text(SWEEP.format(models='{spec = "scripted:b.json", name = "m"}', extra="",
                                                  turns=1))
    for args in (("sweep", "s.toml"), ("sweep", "s.toml", "--dry-run")):
        one_line_error(agent_cli(*args, cwd=tmp_path), "model 'm'", "a.json", "b.json", "another `name`")


def test_a_missing_key_names_flags_that_exist(tmp_path):
    env = {k: v for k, v in cli_env().items() if k not in ("OPENAI_API_KEY", "PTXBENCH_API_KEY")}
    p = subprocess.run([sys.executable, "-m", "agent.cli", "solve", "--task", "gemm", "--model", "openai/gpt-4o"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    message = one_line_error(p, "OPENAI_API_KEY")
    flags = {w.strip("`(),") for w in message.split() if w.startswith(("--", "`--"))}
    help_text = agent_cli("solve", "--help", env={"COLUMNS": "200"}).stdout
    assert flags and all(f in help_text for f in flags), flags
    one_line_error(sweep_cli(tmp_path), "api_base")


def test_check_finds_the_manifest_problems_eval_finds_without_a_gpu(tmp_path):
    """An unknown kernel name and a wrong argument count: found by `check` on CPU (from the PTX
    signature), exit 1, as `eval` reports them."""
    good = REPO / "tasks" / GEMM_TASK / "simple"
    for name, change in (("name", lambda m: m["launches"][0].update(kernel="gemm_nope")),
                         ("count", lambda m: m["launches"][0]["args"].pop())):
        folder = shutil.copytree(good, tmp_path / name)
        manifest = json.loads((folder / "launch.json").read_text())
        change(manifest)
        (folder / "launch.json").write_text(json.dumps(manifest))
        p = agent_cli("check", str(folder), "--task", "gemm")
        assert p.returncode == 1, (p.stdout, p.stderr)
        words = "gemm_nope" if name == "name" else "parameters, the manifest gives"
        assert "launch.json" in p.stdout and words in p.stdout, p.stdout
        e = agent_cli("eval", str(folder), "--task", "gemm", "--json")
        assert e.returncode == 1 and words in e.stdout
    assert agent_cli("check", str(good), "--task", "gemm").returncode == 1  # no wgmma/tma: requested, missing
    assert agent_cli("check", str(REPO / "tasks" / GEMM_TASK / "expert"), "--task", "gemm").returncode == 0


def too_wide(text: str, width: int = 80) -> list[str]:
    """Lines over `width` that could have been folded (one unbreakable path and a label are allowed)."""
    return [line for line in text.splitlines()
            if len(line) > width and len(line) - max(len(w) for w in line.split()) > 20]


def test_output_fits_80_columns_and_says_things_once(tmp_path):
    narrow = {"COLUMNS": "80"}
    for args in (("--help",), ("solve", "--help"), ("eval", "--help"), ("sweep", "--help"), ("fixit", "train", "--help")):
        p = agent_cli(*args, env=narrow)
        assert p.returncode == 0 and "…" not in p.stdout and "<bool>" not in p.stdout, p.stdout
        assert not too_wide(p.stdout), too_wide(p.stdout)
    assert "--executed, --executed-check / --no-executed" in agent_cli("solve", "--help", env=narrow).stdout
    assert "Exit status" in agent_cli("--help", env=narrow).stdout
    assert not too_wide(agent_cli("doctor", env=narrow).stdout)
    expert = str(REPO / "tasks" / GEMM_TASK / "expert")
    for args in (("eval", expert, "--task", "gemm"), ("inspect", expert)):
        p = agent_cli(*args, env=narrow)
        assert p.returncode == 0 and not too_wide(p.stdout), too_wide(p.stdout)
    p = agent_cli("tasks", env={"COLUMNS": "40"})
    assert p.stdout.startswith("GEMM\n") and "\nattention backward\n" in p.stdout, p.stdout[:400]
    # a compile error is printed once
    folder = shutil.copytree(REPO / "tasks" / GEMM_TASK / "simple", tmp_path / "broken")
    (folder / "kernel.cu").write_text((folder / "kernel.cu").read_text() + "\nthis is not C++;\n")
    p = agent_cli("check", str(folder), env=narrow)
    assert p.returncode == 1 and p.stdout.count("this declaration has no storage class") <= 1, p.stdout
    # a turn without a reply, and the run's own lines, read right at 80 columns
    model = write_script(tmp_path / "s.json", [{"fault": "auth", "status": 401, "message": "bad key"}])
    p = agent_cli("solve", "--task", "gemm", "--model", model, "--context", "none", "--runs-dir",
                  str(tmp_path / "runs"), env=narrow)
    assert "no reply" in p.stderr and "turn 1: no reply" not in p.stderr and "(None)" not in p.stderr, p.stderr
    assert not too_wide(p.stdout) and not too_wide(p.stderr), too_wide(p.stdout + p.stderr)


def test_report_names_models_as_the_config_does_and_draws_only_ablations_that_exist(tmp_path):
    write_script(tmp_path / "a.json", [probe_reply()])
    (tmp_path / "s.toml").write_text(SWEEP.format(models='{spec = "scripted:a.json", name = "probe-model"}',
                                                  extra="", turns=1).replace('contexts = ["none"]',
                                                                             'contexts = ["none", "docs"]'))
    p = agent_cli("sweep", "s.toml", cwd=tmp_path)
    assert p.returncode == 0, (p.stdout, p.stderr)
    p = agent_cli("report", "runs/s", "--out", "rep", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "| probe-model |" in md and "scripted:" not in md and "2 runs (" in md
    assert (tmp_path / "rep" / "context.png").exists() and not (tmp_path / "rep" / "profile.png").exists()
    one = next((tmp_path / "runs" / "s").rglob("config.json")).parent
    p = agent_cli("report", str(one), "--out", "rep1", cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.startswith("1 run (")
    md = (tmp_path / "rep1" / "report.md").read_text()
    assert "1 run (" in md and "1 runs" not in md and "context.png" not in md


def test_launch_json_keys_are_strict_and_the_run_language_is_enforced(tmp_path):
    """Issue 23 item 3: an unknown key in launch.json (the file the model writes) is an error
    with "did you mean", never ignored: from `eval` and `check` on a folder (one line; exit 1,
    the kernel's fault: issue 45) and, in the loop, as the format error the model is told. Issue 26: in a --lang ptx
    run a CUDA reply is a format error that says what the run takes."""
    folder = shutil.copytree(REPO / "tasks" / GEMM_TASK / "simple", tmp_path / "typo")
    manifest = json.loads((folder / "launch.json").read_text())
    manifest["launches"][0]["shared_byte"] = 1024
    (folder / "launch.json").write_text(json.dumps(manifest))
    for args in (("eval", str(folder), "--task", "gemm"), ("check", str(folder))):
        p = agent_cli(*args)
        p.returncode, code = 2, p.returncode  # one_line_error checks the words; the status is 1
        one_line_error(p, "launches.0: unknown key 'shared_byte' in a launch", "did you mean 'shared_bytes'?")
        assert code == 1, args

    ptx = (".version 8.0\n.target sm_90a\n.address_size 64\n\n.visible .entry k(.param .u64 c)\n{\n    ret;\n}")
    typo = json.dumps({"launches": [{"kernel": "k", "grid": [1], "block": [32], "args": ["C"],
                                     "shared_byte": 0}]})
    model = write_script(tmp_path / "s.json", [probe_reply(), f"```ptx\n{ptx}\n```\n\n```json\n{typo}\n```\n"])
    p = agent_cli("solve", "--task", "gemm", "--model", model, "--lang", "ptx", "--context", "none",
                  "--max-turns", "2", "--runs-dir", str(tmp_path / "runs"))
    run = next((tmp_path / "runs").rglob("config.json")).parent
    errors = [e["message"] for e in replay.load_recorded(run).events if e["type"] == "format_error"]
    assert len(errors) == 2, (p.stdout, p.stderr, errors)
    assert errors[0].startswith("this run takes raw PTX (--lang ptx), but the kernel is CUDA C++"), errors[0]
    assert "did you mean 'shared_bytes'?" in errors[1], errors[1]
    assert not list(run.rglob("kernel.cu")) and not list(run.rglob("launch.json"))  # nothing was extracted


def test_the_readme_tour_runs_on_files_that_ship_and_its_outputs_are_ignored(tmp_path):
    import re

    readme = (REPO / "README.md").read_text()
    for command in ("check", "inspect"):
        row = next(line for line in readme.splitlines() if line.startswith(f"| `agent {command} "))
        args = shlex.split(re.sub(r"\[.*?\]", "", row.split("`")[1]))[1:]
        assert (REPO / args[1]).exists(), args
        p = agent_cli(*args)
        assert p.returncode == 0 and "Traceback" not in p.stderr, (args, p.stdout, p.stderr)
    for status in ("| 0 |", "| 1 |", "| 2 |", "| 3 |", "| 130 |"):
        assert status in readme
    if (REPO / ".git").exists():  # the README's own --out examples stay out of git
        p = subprocess.run(["git", "check-ignore", "report/report.md", "data/train.jsonl", "fixit-adapter/x"],
                           cwd=REPO, capture_output=True, text=True)
        assert p.stdout.split() == ["report/report.md", "data/train.jsonl", "fixit-adapter/x"], p.stdout


def test_a_gpu_worker_that_cannot_start_stops_the_run_as_infrastructure(tmp_path, monkeypatch):
    """On a GPU machine whose worker cannot start (the CPU stand-in: tests/fake_worker.py), the
    candidate gets no verdict and the run stops with infra_error, not `unverified`."""
    from tools.evaluator import Evaluator

    (tmp_path / "mode").write_text("nostart")
    monkeypatch.setenv("PTXBENCH_FAKE_WORKER_MODE", str(tmp_path / "mode"))
    model = write_script(tmp_path / "s.json", [probe_reply()])
    with Evaluator(gpus=[0], worker_cmd=[sys.executable, str(REPO / "tests" / "fake_worker.py")],
                   cache_dir=tmp_path / "cache") as ev:
        s = solve(SolveRequest(task=GEMM_TASK, model=model, runs_dir=tmp_path / "runs", context="none",
                               budget=Budget(max_turns=1)), progress=False, evaluator=ev)
    assert (s.status, s.stop_reason) == ("failed", "infra_error") and s.per_turn == []
    assert "did not start" in s.stop_detail
