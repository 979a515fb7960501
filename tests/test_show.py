"""agent show: one run as a timeline, a turn in full, a self-contained page (opened in a real headless
browser), report links to each run's page, and the seed study's published rows beside a report's."""
from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from html.parser import HTMLParser
from pathlib import Path

import pytest
from trajectory_fixtures import eval_result, kernel, reply_for, write_run

from agent.published import MARK, load_published
from agent.report import write_report
from agent.show import load_run, render_html, turn_details

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "runs" / "examples" / "attn_bwd_human"


def agent(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


# ---------------------------------------------------------------------------------------
# The terminal
# ---------------------------------------------------------------------------------------
def test_timeline_of_the_shipped_run():
    r = agent("show", str(EXAMPLE))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "attn_bwd_human: mha_bwd_d128 on sm_90a" in out and "requested wgmma, tma" in out
    # both turns, their actions and outcomes, the best kernel marked
    assert "draft" in out and "arch_missing" in out and "repair" in out and "unverified" in out
    assert "2 ★ best" in out and "best kernel: candidates/2-0" in out
    # the verdicts and the requested instructions' SASS opcode counts
    assert "wgmma: MISSING from SASS" in out and "HGMMA x32" in out and "UTMALDG x10" in out
    # the feedback's gist (its section headings), and why the last turn has none
    assert "Compile: ok · Architecture instructions: missing wgmma, tma" in out
    assert "(none: stop: 2 of 2 turns used)" in out


def test_one_turn_in_full_with_the_kernel_diff():
    r = agent("show", str(EXAMPLE), "--turn", "2")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "after 3 earlier messages" in out  # system, task, the first reply: then this turn's user message
    assert "## Result of turn 1" in out  # the prompt of turn 2 opens with turn 1's feedback
    assert "Expert sm_90a attention backward" in out  # the reply
    assert "kernel diff against candidates/1-0" in out
    assert "--- candidates/1-0/kernel.cu" in out and "+++ candidates/2-0/kernel.cu" in out
    assert "-// Simple SIMT attention backward" in out


def test_json_for_scripts():
    r = agent("show", str(EXAMPLE), "--json")
    assert r.returncode == 0, r.stderr
    view = json.loads(r.stdout)
    assert [t["action"] for t in view["turns"]] == ["draft", "repair"]
    c1, c2 = view["turns"][0]["candidates"][0], view["turns"][1]["candidates"][0]
    assert (c1["arch_sass"], c2["arch_sass"], c2["best"]) == (False, True, True)
    wgmma = next(f for f in c2["features"] if f["name"] == "wgmma")
    assert wgmma == {**wgmma, "in_sass": True, "opcodes": {"HGMMA": 32}, "ran": None}
    assert c2["correct"] is None  # no GPU: unknown, never true
    assert view["turns"][1]["retrieved"] and all(s["tokens"] > 0 for s in view["turns"][1]["retrieved"])
    detail = json.loads(agent("show", str(EXAMPLE), "--turn", "1", "--json").stdout)
    assert detail[0]["diff"] is None and detail[0]["feedback"].startswith("## Result of turn 1")


def test_bad_input_is_one_line_and_writes_nothing(tmp_path):
    for args, words in ((["show", str(EXAMPLE), "--turn", "3"], "has no turn 3 (its turns: 1, 2)"),
                        (["show", str(tmp_path)], "not a run folder"),
                        (["show", str(tmp_path / "nope")], "no such run folder"),
                        (["show", str(EXAMPLE), "--html", str(EXAMPLE / "page.html")], "read-only")):
        r = agent(*args)
        assert r.returncode == 2 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
    assert not (EXAMPLE / "page.html").exists()


def test_a_run_still_going_shows_its_events(tmp_path):
    run = tmp_path / "live"
    shutil.copytree(EXAMPLE, run)
    (run / "summary.json").unlink()
    view = load_run(run)
    assert view.status == "running" and [t.turn for t in view.turns] == [1, 2]
    assert view.turns[1].candidates[0].outcome == "unverified" and view.turns[1].candidates[0].arch_sass


def _cand(kind: str, tag: str, speedup: float | None = None):
    s = kernel(tag, body=f"  // step {tag}\n")
    return (s, eval_result(kind, speedup=speedup), reply_for(s, f"attempt {tag}"))


def test_a_judged_run_shows_speed_and_executed_verdicts(tmp_path):
    run = write_run(tmp_path, "gpu/r0", [[_cand("compile", "a")], [_cand("numerical", "b")],
                                        [_cand("correct", "c", 0.8)]])
    view = load_run(run)
    c1, c2, c3 = (t.candidates[0] for t in view.turns)
    assert (c1.outcome, c1.compiled, c2.correct, c3.correct_with_arch, c3.speedup) == \
        ("compile_error", False, False, True, 0.8)
    assert c3.best and all(f.ran and f.carries for f in c3.features)
    page = render_html(view)
    assert "0.800x" in page and "correct with arch: yes" in page and "executed, carries" in page
    diff = turn_details(view, 3)[0].diff
    assert "-    // step b" in diff and "+    // step c" in diff and diff.startswith("--- candidates/2-0/kernel.cu")


# ---------------------------------------------------------------------------------------
# The page in a real browser
# ---------------------------------------------------------------------------------------
def _chromium() -> str | None:
    return next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


# Chromium's own service traffic, which a blank page draws as well (measured with chromium 156: the
# component updater, the network time check, the account service), whatever the flags say.
BROWSER_OWN = ("update.googleapis.com", "clients2.google.com", "accounts.google.com")


def _page_requests() -> list[str]:
    return [s for s in _Recorder.seen if not any(f" {h}" in s or f"//{h}/" in s for h in BROWSER_OWN)]


class _Recorder(http.server.BaseHTTPRequestHandler):
    """A proxy that answers nothing and writes down every request a browser sends through it."""

    seen: list[str] = []

    def _record(self):
        self.seen.append(f"{self.command} {self.path}")
        self.send_response(404)
        self.end_headers()

    do_GET = do_POST = do_HEAD = do_CONNECT = _record

    def log_message(self, *args):
        pass


def _open(page: Path, proxy_port: int) -> str:
    """The DOM chromium built from `page`, every request it made sent to the recording proxy
    (loopback too: the bypass list drops chromium's implicit loopback exception)."""
    browser = _chromium()
    r = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                        "--disable-background-networking", "--disable-component-update", "--disable-sync",
                        "--disable-default-apps", f"--proxy-server=http://127.0.0.1:{proxy_port}",
                        "--proxy-bypass-list=<-loopback>", f"--user-data-dir={page.parent / 'profile'}",
                        "--virtual-time-budget=3000", "--dump-dom", page.as_uri()],
                       capture_output=True, text=True, timeout=90)
    assert r.returncode == 0 and "<html" in r.stdout, r.stderr[-2000:]
    return r.stdout


class _Text(HTMLParser):
    """The text of a DOM, and every attribute that could load something."""

    def __init__(self):
        super().__init__()
        self.text: list[str] = []
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("src", "href", "srcset", "poster", "data", "action", "background") and value:
                self.urls.append(value)

    def handle_data(self, data):
        self.text.append(data)


@pytest.fixture()
def proxy():
    _Recorder.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


@pytest.mark.skipif(_chromium() is None, reason="no chromium, chromium-browser or google-chrome on PATH "
                                                 "(Debian: apt-get install chromium)")
def test_the_page_in_a_headless_browser_shows_the_run_and_loads_nothing(tmp_path, proxy):
    # the shipped run, with a reply that tries to load from the network: text on the page, never a request
    run = tmp_path / "run"
    shutil.copytree(EXAMPLE, run)
    leak = f"<img src='http://127.0.0.1:{proxy}/leak.png'><script>fetch('http://127.0.0.1:{proxy}/x')</script>"
    reply = run / "candidates" / "2-0" / "reply.md"
    reply.write_text(leak + "\n" + reply.read_text())
    page = tmp_path / "page.html"
    r = agent("show", str(run), "--html", str(page))
    assert r.returncode == 0, r.stderr
    dom = _open(page, proxy)
    parsed = _Text()
    parsed.feed(dom)
    text = " ".join(parsed.text)
    # turn cards, verdicts, opcode counts, feedback and the diff, as rendered
    for words in ("Turn 1", "Turn 2", "draft", "arch_missing", "unverified", "best kernel",
                  "requested instructions in SASS: no", "requested instructions in SASS: yes", "HGMMA", "UTMALDG",
                  "Compile: ok · Architecture instructions: missing wgmma, tma", "diff against candidates/1-0",
                  "+++ candidates/2-0/kernel.cu", "-// Simple SIMT attention backward", "Retrieved sections",
                  "fence, commit, wait", leak):
        assert words in text, words
    assert "speedup and verdicts over turns" in dom  # the inline SVG plot
    assert "Content-Security-Policy" in dom and "default-src 'none'" in dom
    assert parsed.urls == [] and "<script" not in dom.split("</head>")[1].replace("&lt;script", "")
    assert _page_requests() == [], _Recorder.seen


@pytest.mark.skipif(_chromium() is None, reason="no chromium, chromium-browser or google-chrome on PATH")
def test_the_network_check_sees_a_page_that_does_load(tmp_path, proxy):
    """The control: without the page's policy, the same browser and proxy do see a request."""
    page = tmp_path / "loads.html"
    page.write_text(f"<!doctype html><html><body><img src='http://127.0.0.1:{proxy}/leak.png'>hi</body></html>")
    _open(page, proxy)
    assert any("leak.png" in s for s in _Recorder.seen), _Recorder.seen


# ---------------------------------------------------------------------------------------
# The report: links to each run's page, the published rows beside
# ---------------------------------------------------------------------------------------
def test_report_links_each_run_and_adds_the_published_rows(tmp_path):
    out = tmp_path / "report"
    rep = write_report([EXAMPLE], out, published=True)
    page = out / "runs" / "attn_bwd_human.html"
    assert page.is_file() and "Turn 2" in page.read_text()
    html_text = rep.files["html"].read_text()
    md = rep.files["md"].read_text()
    assert "href='runs/attn_bwd_human.html'" in html_text and "(runs/attn_bwd_human.html)" in md
    # published rows at the report's turn limits (1 and 2 here): the study published 1, 4 and 8
    turn1, turn2 = md.split("## Turn limit 1")[1].split("## Turn limit 2")
    assert f"Claude Opus 4.8 [opus48-mha-bwd-d128] ({MARK}) | mha_bwd_d128 | sm_90a" in turn1
    assert "| 50% (6/12) |" in turn1 and "best 0.300x" in turn1
    assert MARK not in turn2.split("## Per task family")[0]
    assert "zhang677/PTXBench at 491860bd3e58" in md  # the source, next to the rows
    assert "opus48-mha-bwd-d128" in rep.files["published_csv"].read_text()
    # only the tasks and archs the runs measured; and nothing published unless asked
    assert "gemm_n7168_k5120" not in turn1
    assert MARK not in write_report([EXAMPLE], tmp_path / "plain").files["md"].read_text()


def test_published_data_records_its_source_and_holds_together():
    pub = load_published()
    src = pub.source
    assert src["repository"] == "zhang677/PTXBench" and len(src["commit"]) == 40 and src["retrieved"]
    assert all(p.startswith("benchmark/plot_viewer_v1/data/") for p in src["paths"])
    assert len(pub.rows) == 315 and {r.turn_limit for r in pub.rows} == {1, 4, 8}
    for r in pub.rows:
        assert 0 <= r.correct_with_arch <= r.trajectories and 0 <= r.correct <= r.trajectories
        assert (r.best_speedup > 0) == (r.correct > 0)
    # FACTS.md's anchor numbers (the best model at turn 8)
    best = {(r.experiment, r.turn_limit): r.best_speedup for r in pub.rows}
    assert round(best[("opus48-gemm", 8)], 2) == 0.98 and round(best[("opus48-mha-d128", 8)], 2) == 0.84
    assert round(best[("opus48-mha-bwd-d128", 8)], 2) == 0.49 and round(best[("opus48-b200-mha-bwd-d128", 8)], 3) == 0.155
