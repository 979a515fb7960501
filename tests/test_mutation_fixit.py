"""Which failures and fixes become Fixit training pairs (agent/fixit/build.py), exactly, on
attempts built here: the error classes a candidate showed, the checks it passed, when a later
kernel is a correction of a failed one, the same kernel sent again, whose reasoning answers the
mistake, the filters, and near-duplicates. The whole build over real run folders is
tests/test_fixit*.py's; these are fast, for mutation runs (docs/BENCHMARKS.md)."""
from __future__ import annotations

from pathlib import Path

from agent.fixit.build import (Attempt, Filters, Pair, answers, dedupe, error_classes, fixes, jaccard, passed_checks,
                               same_kernel, shingles)
from agent.trajectory import CandidateRecord, RunConfig
from tools.results import (CompileResult, EvalResult, ExecutedCheck, FeatureVerdict, InspectResult, Timing,
                           WorkloadResult)
from tools.solution import LaunchManifest, Solution

MANIFEST = LaunchManifest.model_validate({"launches": [{"kernel": "k", "grid": [1], "block": [128], "args": ["A"]}]})
SOURCE = "__global__ void k(float* A) {\n  A[threadIdx.x] = 1.0f;  // one\n}\n"
TIMED = Timing(median_ms=1.0, iqr_ms=0.01, cv=0.01, runs=10)


def wl(split: str = "visible", status: str = "passed", reason: str | None = None, timing=TIMED) -> WorkloadResult:
    return WorkloadResult(workload=f"{split}-{status}-{reason}", split=split, axes={}, status=status, reason=reason,
                          timing=timing)


def ev(*workloads: WorkloadResult, compiled: bool = True, arch: bool = True, executed: bool | None = True,
       run_status: str = "ok", speedup: float | None = None) -> EvalResult:
    feats = {"wgmma": FeatureVerdict(present=arch)}
    ex = (ExecutedCheck(status="ok", executed={"wgmma": True}, carries={"wgmma": executed})
          if executed is not None else ExecutedCheck(status="skipped", reason="no GPU"))
    return EvalResult(task="gemm_n7168_k5120", arch="sm_90a", requested_features=["wgmma"],
                      compile=CompileResult(status="ok" if compiled else "failed", arch="sm_90a", language="cuda"),
                      inspect=InspectResult(status="ok", arch="sm_90a", features=feats), executed=ex,
                      run_status=run_status, workloads=list(workloads), speedup=speedup)


def attempt(e: EvalResult | None, turn: int = 1, source: str = SOURCE, parent: str | None = None,
            solution: bool = True, task: str = "gemm_n7168_k5120") -> Attempt:
    sol = Solution(language="cuda", source=source, manifest=MANIFEST) if solution else None
    rec = CandidateRecord(turn=turn, sample=0, path=f"candidates/{turn}-0", outcome="incorrect")
    return Attempt(Path("run"), RunConfig(run_id="r", task=task, model="m"), rec, sol, e, reply="", parent=parent)


def other(n: int) -> str:
    return SOURCE.replace("1.0f", f"{n}.0f")


# ---------------------------------------------------------------- what a candidate showed

def test_error_classes():
    assert error_classes(attempt(None)) == set() and error_classes(attempt(ev(), solution=False)) == set()
    assert error_classes(attempt(ev(compiled=False))) == {"compile"}
    assert error_classes(attempt(ev(wl()))) == set()
    assert error_classes(attempt(ev(wl(), arch=False))) == {"features_missing"}
    assert error_classes(attempt(ev(wl(), executed=False))) == {"features_missing"}
    assert error_classes(attempt(ev(wl(), executed=None))) == set()  # unchecked is no failure
    for reason, cls in (("timeout", "timeout"), ("input_modified", "input_modified"), ("implausible", "implausible"),
                        ("incorrect", "numerical"), ("nan_output", "numerical"), ("wrong_in_timed_run", "numerical"),
                        ("cuda_error", "runtime"), ("manifest_error", "runtime"), (None, "runtime")):
        assert error_classes(attempt(ev(wl(status="failed", reason=reason), run_status="ok"))) == {cls}, reason
    assert error_classes(attempt(ev(wl(), run_status="failed"))) == {"runtime"}  # failed, no workload named
    assert error_classes(attempt(ev(wl(status="failed", reason="timeout"), run_status="failed"))) == {"timeout"}
    # held-out failures are their own class only when every visible workload passed
    assert error_classes(attempt(ev(wl(), wl("held_out", "failed", "incorrect")))) == {"held_out"}
    assert error_classes(attempt(ev(wl("visible", "failed", "incorrect"), wl("held_out", "failed", "incorrect")))) \
        == {"numerical"}
    assert error_classes(attempt(ev(wl(), wl("held_out", "failed", "incorrect"), run_status="failed"))) == {"runtime"}
    assert error_classes(attempt(ev(wl(), wl("held_out", "skipped")))) == set()
    assert error_classes(attempt(ev(wl(status="failed", reason="incorrect"), run_status="skipped"))) == set()  # no GPU


def test_passed_checks():
    every = {"compile", "features_missing", "runtime", "timeout", "numerical", "input_modified", "implausible",
             "held_out"}
    assert passed_checks(attempt(ev(wl(), wl("held_out")))) == every
    assert passed_checks(attempt(None)) == set() and passed_checks(attempt(ev(), solution=False)) == set()
    assert passed_checks(attempt(ev(compiled=False))) == set()
    assert passed_checks(attempt(ev(wl(), wl("held_out"), arch=False))) == every - {"features_missing"}
    assert passed_checks(attempt(ev(wl(), run_status="skipped"))) == {"compile", "features_missing"}  # no GPU
    assert passed_checks(attempt(ev(wl()))) == every - {"held_out"}  # no held-out size ran
    assert passed_checks(attempt(ev(wl(), wl("held_out", "skipped")))) == every - {"held_out"}
    assert passed_checks(attempt(ev(wl(timing=None), wl("held_out")))) == every - {"implausible"}  # untimed
    assert passed_checks(attempt(ev(wl(status="failed", reason="incorrect")))) == {
        "compile", "features_missing", "runtime", "timeout"}
    assert passed_checks(attempt(ev(wl(status="failed", reason="timeout")))) == {"compile", "features_missing"}
    assert passed_checks(attempt(ev(wl(status="failed", reason="cuda_error")))) == {
        "compile", "features_missing", "timeout"}


# ---------------------------------------------------------------- corrections

def test_a_correction_passes_what_failed_keeps_what_passed_and_fails_nothing_on_the_gpu():
    wrong = attempt(ev(wl(status="failed", reason="incorrect")), turn=1)
    right = attempt(ev(wl(), wl("held_out")), turn=2, source=other(2))
    assert fixes(right, wrong, "numerical")
    assert fixes(right, attempt(ev(compiled=False), turn=1), "compile")
    assert not fixes(attempt(ev(wl(status="failed", reason="incorrect")), turn=2, source=other(2)), wrong, "numerical")
    no_arch = attempt(ev(wl(), wl("held_out"), arch=False), turn=2, source=other(3))
    assert not fixes(no_arch, attempt(ev(wl(status="failed", reason="incorrect")), turn=1), "numerical")  # lost arch
    crashing = attempt(ev(wl(status="failed", reason="cuda_error")), turn=2, source=other(4))
    assert not fixes(crashing, attempt(ev(compiled=False)), "compile")  # a crash teaches the crash
    fitted = attempt(ev(wl(), wl("held_out", "failed", "incorrect")), turn=2, source=other(5))
    assert not fixes(fitted, wrong, "numerical")  # fitted to the visible sizes
    resent = attempt(ev(wl(), wl("held_out")), turn=2, source=SOURCE.replace("// one", "// again"))
    assert not fixes(resent, wrong, "numerical")  # the same kernel sent again fixed nothing


def test_the_same_kernel_sent_again():
    a = Solution(language="cuda", source=SOURCE, manifest=MANIFEST)
    assert same_kernel(a, a.model_copy(update={"source": SOURCE.replace("  ", "\t") + "/* note */\n"}))
    assert same_kernel(a, a.model_copy(update={"source": "/* a note\n   over lines */\n" + SOURCE}))
    assert not same_kernel(a, a.model_copy(update={"source": other(2)}))
    assert not same_kernel(a, a.model_copy(update={"language": "ptx"}))
    m2 = LaunchManifest.model_validate({"launches": [{"kernel": "k", "grid": [2], "block": [128], "args": ["A"]}]})
    assert not same_kernel(a, a.model_copy(update={"manifest": m2}))
    assert not same_kernel(None, a) and not same_kernel(a, None)


def test_whose_reasoning_answers_the_mistake():
    failed = attempt(ev(compiled=False), turn=1)
    child = attempt(ev(wl()), turn=2, source=other(2), parent=failed.record.path)
    grandchild = attempt(ev(wl()), turn=3, source=other(3), parent="candidates/2-0")
    assert answers(Pair(failed, child, "compile", "trajectory"))
    assert not answers(Pair(failed, grandchild, "compile", "trajectory"))  # it answered a later kernel
    assert answers(Pair(failed, attempt(ev(wl()), parent=None), "compile", "teacher"))  # a teacher's first turn
    assert not answers(Pair(failed, attempt(ev(wl()), parent="candidates/1-0"), "compile", "teacher"))


# ---------------------------------------------------------------- filters and near-duplicates

def test_filters():
    failed = attempt(ev(compiled=False))
    fixed = attempt(ev(wl(), speedup=1.5), turn=2, source=other(2))
    p = Pair(failed, fixed, "compile", "trajectory")
    assert Filters().reject(p) is None
    assert Filters(min_speedup=1.5).reject(p) is None
    assert Filters(min_speedup=1.6).reject(p) == "below_min_speedup"
    assert Filters(min_speedup=0.1).reject(Pair(failed, attempt(ev(wl()), turn=2), "compile", "trajectory")) \
        == "below_min_speedup"  # untimed
    assert Filters(min_speedup=0.1).reject(Pair(failed, attempt(None, turn=2), "compile", "trajectory")) \
        == "below_min_speedup"
    both = 2 * len(SOURCE)
    assert Filters(max_chars=both).reject(p) is None and Filters(max_chars=both - 1).reject(p) == "too_long"
    assert Filters().max_chars == 60_000


def test_shingles_and_jaccard():
    assert shingles("a b c d e f", k=5) == frozenset({"a b c d e", "b c d e f"})
    assert shingles("a  b // c d\n c /* x y */ d", k=3) == frozenset({"a b c", "b c d"})
    assert shingles("a b", k=5) == frozenset({"a b"}) and shingles("a b c d e", k=5) == frozenset({"a b c d e"})
    assert shingles("x+=1;") == frozenset({"x + = 1 ;"})
    assert jaccard(frozenset("ab"), frozenset("bc")) == 1 / 3 and jaccard(frozenset(), frozenset()) == 1.0
    assert jaccard(frozenset("a"), frozenset()) == 0.0


def test_near_duplicate_pairs_are_dropped():
    """A pair is dropped when its wrong kernel is near a kept pair's wrong kernel AND its fix near
    that pair's fix (Jaccard of 5-token shingles >= 0.9, at equality included)."""
    wrong = " ".join(f"w{i}" for i in range(100))
    right = " ".join(f"r{i}" for i in range(100))

    def pair(failed_src: str, fixed_src: str) -> Pair:
        return Pair(attempt(ev(compiled=False), source=failed_src), attempt(ev(wl()), turn=2, source=fixed_src),
                    "compile", "trajectory")

    a = pair(wrong, right)
    near = pair(wrong + " extra", right)  # 96 of 97 shingles shared on the wrong side, all on the fixed side
    apart = pair(wrong, "something else entirely here and now")
    kept, dropped = dedupe([a, near, apart])
    assert kept == [a, apart] and dropped == 1
    at = jaccard(shingles(wrong), shingles(wrong + " extra"))
    assert at == 96 / 97
    assert dedupe([a, near], threshold=at) == ([a], 1)  # at the threshold: a duplicate
    assert dedupe([a, pair(wrong, right + " extra")], threshold=at)[1] == 1  # the fixed side at it too
    assert dedupe([a, near], threshold=0.999) == ([a, near], 0)
    # the wrong kernels differ: kept, however alike the fixes
    half = pair(" ".join(f"w{i}" for i in range(50)), right)
    assert dedupe([a, half]) == ([a, half], 0)
