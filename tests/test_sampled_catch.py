"""The sampled check's catch probabilities in docs/METHODOLOGY.md ("What a cheating kernel faces")
recomputed from the code's constants, so the table cannot drift from what the evaluator does:
the rows r per sampled run (tasks.sampled.SAMPLED_ROWS, at least tools.workspace.SAMPLED_ROWS), the
run counts (tools.timing: warm-up pairs, plan_pairs' bounds and extra), the number of runs judged
whole (tools.workspace.TimedJudge), and which families have no sampler (judged whole every run)."""
from __future__ import annotations

import inspect
import re
from pathlib import Path

from tasks.registry import TASKS
from tasks.sampled import SAMPLED_ROWS, has_sampler, rows_for
from tools import timing, workspace

DOC = Path(__file__).resolve().parents[1] / "docs" / "METHODOLOGY.md"
HEADER = "| family (rows r per run) | faulty runs k |"
# The families the table names, by the op types they stand for.
FAMILIES = {"GEMM, FP8 GEMM": ("gemm", "fp8_gemm"),
            "attention forward, backward, FP8 attention": ("mha_fwd", "mha_bwd", "fp8_mha_fwd"),
            "Gated DeltaNet decode, prefill, MTP": ("gdn_decode", "gdn_prefill", "gdn_mtp")}


def doc_table() -> tuple[list[float], list[tuple[str, int | None, str, list[str]]]]:
    """(the f of each column, rows as (family, r or None, k, cells)); a family's second row repeats it."""
    lines = DOC.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(HEADER))
    fs = [float(c.split("=")[1]) for c in lines[start].strip().strip("|").split("|")[2:]]
    rows, family, r = [], None, None
    for line in lines[start + 2:]:
        if not line.strip().startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0]:
            family = cells[0].split("(")[0].strip()
            m = re.search(r"r = (\d+)", cells[0])
            r = int(m.group(1)) if m else None
        rows.append((family, r, cells[1], cells[2:]))
    return fs, rows


def written(catch: float) -> str:
    """A probability as the table writes it: two digits ('0.64'); near 1, one digit of the escape
    probability ('1 − 4e-5'); '1' once the escape is below 1e-12."""
    escape = 1.0 - catch
    if escape >= 0.01:
        return f"{catch:.2g}"
    if escape < 1e-12:
        return "1"
    mantissa, exponent = f"{escape:.0e}".split("e")
    return f"1 − {mantissa}e{int(exponent)}"


def test_the_table_covers_every_family_with_the_codes_rows():
    _, rows = doc_table()
    named = {family for family, *_ in rows}
    assert named == set(FAMILIES), named
    for family, r, k, _ in rows:
        ops = FAMILIES[family]
        for op in ops:
            tasks = [t for t in TASKS.values() if t.op_type == op]
            assert tasks, f"no registered task of op type {op}"
            sampled = {has_sampler(t) for t in tasks}
            if r is None:  # judged whole on every run
                assert sampled == {False}, f"{op} has a sampler now: give it r in the table"
                assert k == "any"
            else:
                assert sampled == {True}, op
                assert {max(workspace.SAMPLED_ROWS, rows_for(t)) for t in tasks} == {r}, (op, r, SAMPLED_ROWS)
    covered = {op for ops in FAMILIES.values() for op in ops}
    assert {t.op_type for t in TASKS.values()} <= covered, "a family is missing from the table"


def test_the_catch_probabilities_follow_from_r_and_k():
    fs, rows = doc_table()
    for family, r, k, cells in rows:
        for f, cell in zip(fs, cells, strict=True):
            # no sampler: every run judged whole, so any fault on any run is caught
            expected = "1" if r is None else written(1 - (1 - f) ** (r * int(k)))
            assert cell == expected, (family, f"k={k}", f"f={f}", cell, expected)


def test_the_run_counts_in_the_text_follow_from_the_timing_code():
    """N judged runs per workload: warm-up pairs + timed pairs (plan_pairs: lo..hi plus up to half
    again); 1-2 judged whole; k = the rest. The text quotes N and k."""
    warm = re.search(r"warmup = rng\.randint\((\d+), (\d+)\)", inspect.getsource(timing.paired_steps))
    whole = re.search(r"rng\.randint\((\d+), (\d+)\)", inspect.getsource(workspace.TimedJudge.after_pair))
    assert warm and whole, "the warm-up or whole-check counts moved: update this test and the table's text"
    defaults = inspect.signature(timing.plan_pairs).parameters
    lo, hi = defaults["lo"].default, defaults["hi"].default
    assert "slow" in inspect.getsource(timing.paired_steps)  # a slow first pair is timed: no warm-up then
    n_min = lo
    n_max = int(warm.group(2)) + hi + hi // 2
    k_min, k_max = n_min - int(whole.group(2)), n_max - int(whole.group(1))
    text = " ".join(DOC.read_text().split())
    assert f"N = {n_min}–{n_max} candidate runs" in text, (n_min, n_max)
    assert f"k = {k_min}–{k_max} on r random rows" in text, (k_min, k_max)
    assert f"1–{whole.group(2)} of them" in text and f"then {lo}–{hi} timed pairs" in text
