"""One workload's tensors and the verdict on its runs (tools/workspace.py), on CPU with real
tensors: the Workspace of a shrunk GEMM (guarded tensors, poison, scratch), `verdict` on each way
an output can be wrong, in the order the worker reports them, the seeded checks (`verify`), a
context that must be restarted, and the GPU-time marks' accounting (CUDA events stood in by
host clocks). Fast (each test well under a second): the mutation entry of tools/workspace.py
runs these beside tests/test_mutation_worker.py (the timed judge through `run_workload`).
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from test_evaluator_cpu import manifest, small_gemm
from tasks.generators import generate_inputs
from tasks.reference import run_reference
from tasks.sampled import sample
from tools import workspace
from tools.correctness import CANARY, same_bits
from tools.launch import NOMINAL_LIMITS, plan_launches
from tools.workspace import Failed, Workspace, must_restart

AXES = {"M": 128}


def ws_with_scratch() -> Workspace:
    """The shrunk GEMM's workspace with two scratch buffers: one the harness zeroes before every
    run (zero=true, timed as the candidate's work), one it fills with garbage (zero=false)."""
    task = small_gemm()
    m = manifest(buffers=[{"name": "acc", "dtype": "float32", "shape": ["M", 4], "zero": True},
                          {"name": "tmp", "dtype": "float32", "shape": [8], "zero": False},
                          {"name": "ids", "dtype": "int32", "shape": [4], "zero": False}])
    return Workspace(task, plan_launches(m, task, AXES, NOMINAL_LIMITS["sm_90a"]), "cpu")


def right(ws: Workspace, fresh: dict) -> dict:
    """Load `fresh`, write the reference answer, return the reference."""
    ws.load_inputs(fresh)
    ws.reset()
    expected = run_reference(ws.task, fresh)
    ws.outputs["C"].copy_(expected["C"])
    return expected


def test_the_workspace_holds_every_tensor_guarded_at_fixed_addresses():
    ws = ws_with_scratch()
    assert set(ws.guarded) == {"A", "B", "C", "acc", "tmp", "ids"}
    assert set(ws.inputs) == {"A", "B"} and set(ws.outputs) == {"C"}
    assert ws.outputs["C"].shape == (128, 64) and ws.outputs["C"].dtype == torch.bfloat16
    assert ws.inputs["A"].data_ptr() == ws.guarded["A"].data_ptr()
    assert {n: z for n, (_, z) in ws.buffers.items()} == {"acc": True, "tmp": False, "ids": False}
    assert ws.buffers["acc"][0].shape == (128, 4)
    assert ws.pointers() == {n: g.data_ptr() for n, g in ws.guarded.items()}
    # fixed: loading new inputs copies into the same memory (the tensor maps point at it)
    before = ws.pointers()
    ws.load_inputs(generate_inputs(ws.task, AXES, 3, device="cpu", fast=True))
    assert ws.pointers() == before


def test_load_inputs_copies_every_input():
    ws = ws_with_scratch()
    fresh = generate_inputs(ws.task, AXES, 5, device="cpu", fast=True)
    ws.load_inputs(fresh)
    for n in ("A", "B"):
        assert torch.equal(ws.inputs[n], fresh[n])


def test_prepare_poisons_outputs_and_garbles_only_the_unzeroed_scratch():
    """Before every run: a kernel that skips an output element or relies on uncleared scratch
    being zero fails instead of passing by luck; zero=true scratch is left to zero_scratch (timed)."""
    ws = ws_with_scratch()
    for t, _ in ws.buffers.values():
        t.fill_(7)
    ws.outputs["C"].fill_(1.0)
    ws.prepare(checks=True)
    assert torch.isnan(ws.outputs["C"]).all()
    garbled = {n: ws.buffers[n][0].clone() for n in ("tmp", "ids")}
    # random bytes: no NaN to test for, no constant to count from
    assert not torch.isnan(garbled["tmp"]).all() and (garbled["tmp"] != 7).all()
    assert not (garbled["ids"].view(torch.uint8) == 0x5A).all() and (garbled["ids"] != 7).all()
    assert (ws.buffers["acc"][0] == 7).all()  # not prepare's
    ws.zero_scratch()
    assert (ws.buffers["acc"][0] == 0).all()
    for n, t in garbled.items():  # zero_scratch leaves zero=false scratch alone
        assert same_bits(ws.buffers[n][0], t)
    ws.prepare()
    for n, t in garbled.items():  # and every run gets new bytes
        assert not same_bits(ws.buffers[n][0], t)


def test_reset_is_prepare_and_the_scratch_reset():
    ws = ws_with_scratch()
    for t, _ in ws.buffers.values():
        t.fill_(7)
    ws.reset()
    assert (ws.buffers["acc"][0] == 0).all() and (ws.buffers["tmp"][0] != 7).all()
    assert torch.isnan(ws.outputs["C"]).all()


@pytest.mark.parametrize("bit, poisoned", [(0, True), (1, False)], ids=["poison", "random_bytes"])
def test_every_run_but_the_checks_fills_its_outputs_by_the_secret_coin(monkeypatch, bit, poisoned):
    """prepare() (the timed and counted runs): the coin decides poison or random bytes; reset() (the
    seeded checks) always poisons, whatever the coin says."""
    import tools.correctness as C

    monkeypatch.setattr(C, "secrets", SimpleNamespace(randbits=lambda _: bit))
    ws = ws_with_scratch()
    ws.prepare()
    assert bool(C.poison_mask(ws.outputs["C"]).all()) == poisoned
    assert poisoned or C.poison_mask(ws.outputs["C"]).float().mean() < 0.01
    ws.reset()
    assert C.poison_mask(ws.outputs["C"]).all()


def test_the_verdict_needs_the_regenerated_inputs():
    ws = ws_with_scratch()
    with pytest.raises(ValueError) as e:
        ws.verdict({}, ws.task.tolerance)
    assert str(e.value) == "verdict() needs the inputs generated again from the run's seed (inputs=...)"


def test_a_right_output_passes_with_its_mismatch_records():
    ws = ws_with_scratch()
    fresh = generate_inputs(ws.task, AXES, 1, device="cpu", fast=True)
    expected = right(ws, fresh)
    reason, detail, mism = ws.verdict(expected, ws.task.tolerance, inputs=fresh)
    assert (reason, detail) == (None, None)
    assert [m.output for m in mism] == ["C"] and all(m.passed for m in mism)


@pytest.mark.parametrize("where,side", [("before", 0), ("after", 1)])
def test_a_write_outside_a_tensor_is_named_with_its_kind_and_side(where, side):
    ws = ws_with_scratch()
    fresh = generate_inputs(ws.task, AXES, 1, device="cpu", fast=True)
    expected = right(ws, fresh)
    for name, kind in (("C", "output"), ("B", "input"), ("tmp", "buffer")):
        g = ws.guarded[name]
        at = g.start - 3 if side == 0 else g.end + 3
        g.raw[at:at + 2] = CANARY ^ 1
        reason, detail, mism = ws.verdict(expected, ws.task.tolerance, inputs=fresh)
        assert (reason, detail, mism) == (
            "out_of_bounds_write", f"wrote outside {kind} {name!r}: 2 guard bytes changed {where} it", [])
        g.reset_guards()
    g = ws.guarded["C"]
    g.raw[g.start - 1] = CANARY ^ 1
    g.raw[g.end] = CANARY ^ 1
    assert ws.verdict(expected, ws.task.tolerance, inputs=fresh)[1] == \
        "wrote outside output 'C': 2 guard bytes changed before and after it"


def test_the_checks_come_in_order_guards_inputs_unwritten_nan_values():
    """The first problem found is the one reported: a bad write outranks a changed input, which
    outranks an unwritten element, a NaN, then wrong values."""
    ws = ws_with_scratch()
    fresh = generate_inputs(ws.task, AXES, 2, device="cpu", fast=True)
    expected = right(ws, fresh)
    tol = ws.task.tolerance
    ws.outputs["C"][0, 0] = ws.outputs["C"][0, 0] * 4 + 1  # wrong value
    assert ws.verdict(expected, tol, inputs=fresh)[0] == "incorrect"
    ws.outputs["C"][1, 1] = float("nan")
    assert ws.verdict(expected, tol, inputs=fresh)[:2] == ("nan_output", "output 'C' has 1 NaN elements")
    ws.prepare(checks=True)
    ws.outputs["C"][:, :-1] = expected["C"][:, :-1]  # the last column never written: 128 poison elements
    assert ws.verdict(expected, tol, inputs=fresh)[:2] == (
        "unwritten_output", "output 'C': 128 of 8192 elements were never written (still the poison NaN)")
    ws.inputs["A"].view(torch.int16)[3, 3] += 1
    assert ws.verdict(expected, tol, inputs=fresh) == (
        "input_modified", "input 'A' changed during the run (inputs are read-only)", [])
    g = ws.guarded["acc"]
    g.raw[g.end + 1] = CANARY ^ 0xFF
    assert ws.verdict(expected, tol, inputs=fresh)[0] == "out_of_bounds_write"


def test_wrong_values_name_the_first_failing_output_and_keep_every_record():
    ws = ws_with_scratch()
    fresh = generate_inputs(ws.task, AXES, 4, device="cpu", fast=True)
    expected = right(ws, fresh)
    ws.outputs["C"].mul_(1.5)
    reason, detail, mism = ws.verdict(expected, ws.task.tolerance, inputs=fresh)
    assert reason == "incorrect" and detail == mism[0].describe() and not mism[0].passed
    assert "(on randomly sampled rows)" not in detail


def test_sampled_rows_judge_only_those_rows_and_say_so():
    """samples= (tasks.sampled): the values on the drawn rows only, against their fp32 reference;
    the whole output is still scanned (an unwritten row outside the sample fails)."""
    ws = ws_with_scratch()
    fresh = generate_inputs(ws.task, AXES, 6, device="cpu", fast=True)
    right(ws, fresh)
    gen = torch.Generator().manual_seed(0)
    samples = sample(ws.task, fresh, gen, 8)
    rows = samples["C"].rows.tolist()
    reason, detail, mism = ws.verdict(None, ws.task.tolerance, inputs=fresh, samples=samples)
    assert reason is None and [m.output for m in mism] == ["C"]
    # a row outside the sample wrong: unseen by the values' check
    other = next(r for r in range(128) if r not in rows)
    ws.outputs["C"][other].mul_(3.0).add_(1.0)
    assert ws.verdict(None, ws.task.tolerance, inputs=fresh, samples=samples)[0] is None
    ws.outputs["C"][rows[0]].mul_(3.0).add_(1.0)
    reason, detail, _ = ws.verdict(None, ws.task.tolerance, inputs=fresh, samples=samples)
    assert reason == "incorrect" and detail.endswith(" (on randomly sampled rows)")
    ws.outputs["C"][other, 0] = float("nan")
    assert ws.verdict(None, ws.task.tolerance, inputs=fresh, samples=samples)[0] == "nan_output"


def test_scales_given_as_a_dict_or_computed_only_when_needed():
    """A dict of term scales judges each output against its own scale; a function is called only
    where a value fails the |ref| check (tools.correctness.judge_outputs)."""
    ws = ws_with_scratch()
    fresh = generate_inputs(ws.task, AXES, 7, device="cpu", fast=True)
    expected = right(ws, fresh)
    tol = ws.task.tolerance
    ws.outputs["C"][0, 0] = ws.outputs["C"][0, 0] + 0.5  # off against |ref|
    assert ws.verdict(expected, tol, inputs=fresh)[0] == "incorrect"
    big = {"C": torch.full((128, 64), 1e6)}
    assert ws.verdict(expected, tol, big, inputs=fresh)[0] is None  # judged against a huge scale: passes
    calls = []

    def whole():
        calls.append(1)
        return big

    assert ws.verdict(expected, tol, whole, inputs=fresh)[0] is None and calls == [1]
    ws.outputs["C"].copy_(expected["C"])
    calls.clear()
    assert ws.verdict(expected, tol, whole, inputs=fresh)[0] is None and calls == []  # right: never computed


class _State:
    def __init__(self, why=None, exc=None):
        self.why, self.exc, self.restored = why, exc, 0

    def restore(self):
        self.restored += 1
        if self.exc:
            raise self.exc
        return self.why


def test_a_context_is_reused_only_when_restored_cleanly(capsys):
    s = _State()
    assert must_restart(s, "w1") is False and s.restored == 1
    assert capsys.readouterr().err == ""
    assert must_restart(_State("a stream left busy"), "w2") is True
    assert capsys.readouterr().err == "[worker] restarting after w2: a stream left busy\n"
    assert must_restart(_State(exc=RuntimeError("sticky")), "w3") is True  # cannot restore: never reused
    assert capsys.readouterr().err == "[worker] restarting after w3: RuntimeError: sticky\n"
    assert must_restart(_State(""), "w4") is False


def test_failed_carries_reason_detail_fatal_and_outputs():
    f = Failed("incorrect", "C off")
    assert (f.reason, f.detail, f.fatal, f.outputs, str(f)) == ("incorrect", "C off", False, [], "C off")
    f = Failed("cuda_error", "illegal address", fatal=True, outputs=["m"])
    assert (f.fatal, f.outputs) == (True, ["m"])


# ---------------------------------------------------------------------------------------
# The seeded checks (verify): each seed's inputs, one whole run, the whole output judged
# ---------------------------------------------------------------------------------------
class _Bound:
    def __init__(self, ws, kernel):
        self.ws, self.kernel, self.calls = ws, kernel, 0

    def launch(self):
        self.calls += 1
        self.kernel(self.ws, self.calls)


class _CpuState:
    device = "cpu"

    def __init__(self):
        self.waits = []

    def wait(self, limit):
        self.waits.append(limit)


class _Result:
    def __init__(self):
        self.phase_s, self.outputs = {}, None


def gemm(ws, call):
    ws.outputs["C"].copy_((ws.inputs["A"].float() @ ws.inputs["B"].float().T).bfloat16())


def _verify(kernel, seeds=(11, 12)):
    ws = ws_with_scratch()
    state, result, bound = _CpuState(), _Result(), None
    bound = _Bound(ws, kernel)
    workspace.verify(state, {"seeds": list(seeds)}, ws.task, AXES, ws, bound, result, 2.5)
    return ws, state, result, bound


def test_verify_runs_once_per_seed_on_that_seeds_inputs_and_waits_each_time():
    seen = []

    def k(ws, call):
        seen.append(ws.inputs["A"].clone())
        assert torch.isnan(ws.outputs["C"]).all()  # poisoned before every run
        assert (ws.buffers["acc"][0] == 0).all()
        gemm(ws, call)

    ws, state, result, bound = _verify(k, seeds=(11, 12, 13))
    assert bound.calls == 3 and state.waits == [2.5, 2.5, 2.5]
    for s, a in zip((11, 12, 13), seen):
        assert torch.equal(a, generate_inputs(ws.task, AXES, s, device="cpu", fast=True)["A"])
    assert [m.output for m in result.outputs] == ["C"] and result.outputs[0].passed


def test_verify_names_a_wrong_first_call_by_its_reason():
    with pytest.raises(Failed) as f:
        _verify(lambda ws, c: ws.outputs["C"].zero_())
    assert f.value.reason == "incorrect" and f.value.outputs and not f.value.outputs[0].passed
    assert f.value.detail == f.value.outputs[0].describe()


@pytest.mark.parametrize("later,reason,records", [
    (lambda ws: ws.outputs["C"].zero_(), "wrong_after_first_call", True),
    (lambda ws: None, "wrong_after_first_call", False),  # nothing written: replays a cache
    (lambda ws: (gemm(ws, 2), ws.outputs["C"].__setitem__((0, 0), math.nan)), "wrong_after_first_call", False),
    (lambda ws: (gemm(ws, 2), ws.inputs["B"].view(torch.int16)[0, 0].add_(1)), "input_modified", False),
])
def test_a_later_call_that_goes_wrong_is_wrong_after_first_call_unless_it_broke_a_rule(later, reason, records):
    """Wrong numbers (values, unwritten, NaN) on a later call of fresh inputs: the kernel was right
    once, so it keys on something (a cache, a launch count); a broken rule keeps its own reason."""
    with pytest.raises(Failed) as f:
        _verify(lambda ws, c: gemm(ws, c) if c == 1 else later(ws))
    assert f.value.reason == reason
    if reason == "wrong_after_first_call":
        assert f.value.detail.startswith("right on the first call, wrong on call 2 (fresh inputs, seed 12): ")
    assert bool(f.value.outputs) == records  # the value comparisons, where the values were compared


# ---------------------------------------------------------------------------------------
# Term scales (tasks judged against them) and the GPU-time marks
# ---------------------------------------------------------------------------------------
def test_term_scales_only_for_tasks_judged_against_them():
    """A task judged against |ref| alone gets no term scales, whole or by rows (GEMM is judged on
    term scales since 2026-12-03 night: its tolerance is set back to |ref| here)."""
    gemm_task = small_gemm()
    gemm_task.tolerance = gemm_task.tolerance.model_copy(update={"scale": "ref"})
    assert workspace.term_scales(gemm_task, {}) is None
    assert workspace.lazy_term_scales(gemm_task, {}) == (None, None)


def test_lazy_term_scales_compute_the_whole_and_the_rows_of_the_same_inputs(monkeypatch):
    import tasks.reference as R
    import tasks.sampled as S
    from tasks import get_task

    task = get_task("mha_fwd_d128")
    monkeypatch.setattr(R, "term_scales", lambda t, fresh: {"O": ("whole", fresh["seed"])})
    monkeypatch.setattr(S, "rows_at", lambda t, fresh, wanted: {
        n: type("Smp", (), {"scale": ("rows", fresh["seed"], tuple(r))})() for n, r in wanted.items()})
    whole, rows = workspace.lazy_term_scales(task, {"seed": 9})
    assert whole() == {"O": ("whole", 9)}
    assert rows({"O": [1, 5]}) == {"O": ("rows", 9, (1, 5))}
    monkeypatch.setattr(S, "has_sampler", lambda t: False)
    assert workspace.lazy_term_scales(task, {"seed": 9})[1] is None  # no sampler: rows from the whole


class _Event:
    clock = [0.0]

    def __init__(self, enable_timing=False):
        assert enable_timing
        self.t, self.synced = None, False

    def record(self):
        self.t = _Event.clock[0]

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3  # ms

    def synchronize(self):
        self.synced = True


def test_gpu_marks_sum_each_parts_seconds_and_cost_nothing_off_the_gpu(monkeypatch):
    m = workspace.GpuMarks("cpu")
    m.mark(None)
    m.mark("run")
    assert m.parts("x_") == {}
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    m = workspace.GpuMarks("cuda")
    for t, part in ((0.0, None), (0.5, "inputs"), (2.0, "run"), (2.25, None), (3.0, "run"), (3.00004, "verdict")):
        _Event.clock[0] = t
        m.mark(part)
    # run: 1.5 s + 0.75 s (the span after a None mark is no part's); rounded to 0.1 ms
    assert m.parts("verify_gpu_") == {"verify_gpu_inputs": 0.5, "verify_gpu_run": 2.25, "verify_gpu_verdict": 0.0}
    assert m._marks[-1][2].synced  # read once the stage is over: one sync, on the last event
    first = workspace.GpuMarks("cuda")
    _Event.clock[0] = 1.0
    first.mark("inputs")  # no starting point yet: nothing to attribute
    _Event.clock[0] = 1.5
    first.mark("run")
    assert first.parts("") == {"run": 0.5}


def test_the_workspace_is_on_the_gpu_unless_told(monkeypatch):
    import inspect

    import tools.correctness as C

    assert inspect.signature(Workspace).parameters["device"].default == "cuda"
    made = []
    real = C.Guarded
    monkeypatch.setattr(C, "Guarded", lambda shape, dtype, device: made.append(device) or real(shape, dtype, "cpu"))
    task = small_gemm()
    Workspace(task, plan_launches(manifest(), task, AXES, NOMINAL_LIMITS["sm_90a"]), "cuda:1")
    assert made == ["cuda:1"] * 3
    made.clear()
    Workspace(task, plan_launches(manifest(), task, AXES, NOMINAL_LIMITS["sm_90a"]))
    assert made == ["cuda"] * 3


def test_sampled_rows_are_judged_against_their_own_scale():
    """samples= with a term scale per output (attention's): each sample's rows against its scale."""
    from types import SimpleNamespace

    from test_evaluator_cpu import TOL  # elementwise only (the GEMM's rel-L2 bound over 4 rows would decide)

    ws = ws_with_scratch()
    fresh = generate_inputs(ws.task, AXES, 6, device="cpu", fast=True)
    expected = right(ws, fresh)
    ws.outputs["C"][2, 3] += 0.5
    rows = torch.arange(4)
    plain = {"C": SimpleNamespace(rows=rows, expected=expected["C"][:4].float(), scale=None)}
    assert ws.verdict(None, TOL, inputs=fresh, samples=plain)[0] == "incorrect"
    scaled = {"C": SimpleNamespace(rows=rows, expected=expected["C"][:4].float(), scale=torch.full((4, 64), 1e6))}
    got = ws.verdict(None, TOL, inputs=fresh, samples=scaled)
    assert got[0] is None, got[1]


def test_row_scales_are_handed_to_the_whole_outputs_judge(monkeypatch):
    import tools.correctness as C

    seen = []
    monkeypatch.setattr(C, "judge_outputs", lambda got, expected, tol, scales, row_scales=None:
                        seen.append((sorted(got), scales, row_scales)) or [])
    ws = ws_with_scratch()
    fresh = generate_inputs(ws.task, AXES, 6, device="cpu", fast=True)
    expected = right(ws, fresh)

    def whole():
        return {}

    def rows(wanted):
        return {}

    assert ws.verdict(expected, ws.task.tolerance, whole, inputs=fresh, row_scales=rows) == (None, None, [])
    assert seen == [(["C"], whole, rows)]


class _Marks:
    """Records GpuMarks' use: the device it was made for, each part marked, the prefix read."""
    made: list = []

    def __init__(self, device):
        self.device, self.parts_marked, self.prefixes = device, [], []
        _Marks.made.append(self)

    def mark(self, part):
        self.parts_marked.append(part)

    def parts(self, prefix):
        self.prefixes.append(prefix)
        return {prefix + "x": 1.0}


class _RecWs:
    def __init__(self, answers):
        self.answers, self.log = list(answers), []

    def load_inputs(self, fresh):
        self.log.append(("load", fresh))

    def reset(self):
        self.log.append(("reset",))

    def verdict(self, expected, tol, scales=None, samples=None, *, inputs=None, row_scales=None):
        self.log.append(("verdict", expected, tol, scales, inputs, row_scales))
        return self.answers.pop(0)


def test_verify_marks_each_part_regenerates_after_the_run_and_judges_with_the_lazy_scales(monkeypatch):
    """Per seed: the inputs (fast generator, on the state's device), the run, the inputs generated
    again after it, the reference of those, the verdict with the term scales of those; each part
    marked for the cost breakdown (verify_gpu_*), inside an NVTX range named verify."""
    import tasks.generators as G
    import tasks.reference as R

    _Marks.made = []
    monkeypatch.setattr(workspace, "GpuMarks", _Marks)
    gen_calls, ranges = [], []
    monkeypatch.setattr(G, "generate_inputs", lambda task, axes, seed, device="cuda", fast=False:
                        gen_calls.append((seed, device, fast)) or {"seed": seed, "n": len(gen_calls)})
    monkeypatch.setattr(R, "run_reference", lambda task, fresh: ("ref", fresh["n"]))
    monkeypatch.setattr(workspace, "lazy_term_scales", lambda task, fresh: (("whole", fresh["n"]), ("rows", fresh["n"])))
    import contextlib

    @contextlib.contextmanager
    def nvtx(name):
        ranges.append(name)
        yield

    monkeypatch.setattr(workspace, "nvtx_range", nvtx)
    task = small_gemm()
    ws = _RecWs([(None, None, ["m1"]), (None, None, ["m2"])])
    state, result, bound = _CpuState(), _Result(), _Bound(None, lambda w, c: None)
    state.device = "cuda:2"
    workspace.verify(state, {"seeds": [5, 6]}, task, AXES, ws, bound, result, 1.0)
    assert gen_calls == [(5, "cuda:2", True), (5, "cuda:2", True), (6, "cuda:2", True), (6, "cuda:2", True)]
    assert ws.log[:3] == [("load", {"seed": 5, "n": 1}), ("reset",),
                          ("verdict", ("ref", 2), task.tolerance, ("whole", 2), {"seed": 5, "n": 2}, ("rows", 2))]
    (m,) = _Marks.made
    assert m.device == "cuda:2"
    assert m.parts_marked == [None, "inputs", "run", "regenerate", "reference_whole", "verdict"] * 2
    assert m.prefixes == ["verify_gpu_"] * 2 and result.phase_s == {"verify_gpu_x": 1.0}
    assert result.outputs == ["m2"] and ranges == ["verify"] and bound.calls == 2
    _Marks.made = []


def test_the_timed_judge_marks_its_parts_and_hands_the_marks_only_on_a_gpu(monkeypatch):
    _Marks.made = []
    monkeypatch.setattr(workspace, "GpuMarks", _Marks)
    calls = []
    monkeypatch.setattr(workspace, "judge_run", lambda *a, **k: calls.append((a, k)))
    import tasks.generators as G

    monkeypatch.setattr(G, "generate_inputs", lambda task, axes, seed, device="cpu", fast=False: {"seed": seed})
    for device in ("cuda", "cpu"):
        ws = _RecWs([])
        judge = workspace.TimedJudge(small_gemm(), AXES, ws, __import__("random").Random(3), device)
        assert _Marks.made[-1].device == device and judge.mark == _Marks.made[-1].mark
        judge.before_pair(0, 4)
        generated = judge._generated
        judge.after_pair(0, 4)
        a, k = calls[-1]
        assert k.get("copies") is generated and judge._generated is None
        assert ("mark" in k) == (device == "cuda") and (k.get("mark") is None or k["mark"] == judge.mark)
        assert a[:4] == (judge.task, AXES, ws, judge.seed) and a[6:] == (judge.rows, True, "timed-phase run 1 of 4") or \
            a[6:] == (judge.rows, False, "timed-phase run 1 of 4")
        assert _Marks.made[-1].parts_marked == [None, "inputs", "runs"]
    _Marks.made = []


def test_a_changed_harness_copy_of_the_inputs_is_input_modified(monkeypatch):
    import tasks.generators as G

    monkeypatch.setattr(G, "generate_inputs", lambda task, axes, seed, device="cpu", fast=False:
                        {"A": torch.zeros(3), "B": torch.ones(3)})
    copies = {"A": torch.zeros(3), "B": torch.full((3,), 2.0)}
    with pytest.raises(Failed) as f:
        workspace.judge_run(small_gemm(), AXES, _RecWs([]), 1, None, "cpu", 8, True, "timed-phase run 2 of 5",
                            copies=copies)
    assert (f.value.reason, f.value.detail) == ("input_modified", (
        "timed-phase run 2 of 5: the harness's copy of input 'B' (read by the pair's other side) changed during "
        "the pair (inputs are read-only)"))


def test_judge_run_marks_each_part_and_passes_the_row_scales(monkeypatch):
    import tasks.generators as G
    import tasks.reference as R
    import tasks.sampled as S

    monkeypatch.setattr(G, "generate_inputs", lambda task, axes, seed, device="cpu", fast=False: {"seed": seed})
    monkeypatch.setattr(R, "run_reference", lambda task, fresh: "ref")
    monkeypatch.setattr(S, "draw_rows", lambda task, fresh, gen, rows: "drawn")
    sampled = []
    monkeypatch.setattr(S, "rows_at", lambda task, fresh, drawn, terms=None: sampled.append((drawn, terms)) or "rows")
    monkeypatch.setattr(workspace, "lazy_term_scales", lambda task, fresh: ("whole", "rows_of"))
    monkeypatch.setattr(workspace, "lazy_sample_scales", lambda task, fresh, drawn: (f"every {drawn}", f"some {drawn}"))
    marked = []
    ws = _RecWs([(None, None, []), (None, None, [])])
    import random

    workspace.judge_run(small_gemm(), AXES, ws, 1, random.Random(1), "cpu", 8, True, "r", mark=marked.append)
    workspace.judge_run(small_gemm(), AXES, ws, 2, random.Random(1), "cpu", 8, False, "r", mark=marked.append)
    assert marked == ["regenerate", "reference_whole", "verdict", "regenerate", "reference_rows", "verdict"]
    assert ws.log[0][3:] == ("whole", {"seed": 1}, "rows_of")
    # a sampled run: its rows drawn without their term scales, which the verdict gets lazily, of those rows
    assert sampled == [("drawn", False)]
    assert ws.log[1][3:] == ("every drawn", {"seed": 2}, "some drawn")


def test_the_row_scales_are_of_the_task_at_hand(monkeypatch):
    import tasks.sampled as S
    from tasks import get_task

    task = get_task("mha_fwd_d128")
    monkeypatch.setattr(S, "rows_at", lambda t, fresh, wanted: {"O": type("S", (), {"scale": t is task})()})
    assert workspace.lazy_term_scales(task, {})[1]({"O": [0]}) == {"O": True}


# ---------------------------------------------------------------------------------------
# Found by mutation pass 6 (2026-12-04, issue 46)
# ---------------------------------------------------------------------------------------
def _off_against_ref_only():
    """The shrunk GEMM (judged on term scales) right but for one element of a sampled row, off by
    more than its |ref| allows and less than its term scale does; the sample drawn without its
    scales, and the lazy scales of those rows (tools.workspace.lazy_sample_scales), each call counted."""
    from tasks.sampled import draw_rows, rows_at

    ws = ws_with_scratch()
    task = ws.task
    fresh = generate_inputs(task, AXES, 6, device="cpu", fast=True)
    right(ws, fresh)
    drawn = draw_rows(task, fresh, torch.Generator().manual_seed(0), 8)
    samples = rows_at(task, fresh, drawn, terms=False)
    every, some = workspace.lazy_sample_scales(task, fresh, drawn)
    ref, terms = samples["C"].expected.abs(), every()["C"]
    r, c = divmod(int((terms - ref).argmax()), ref.shape[1])  # where the terms allow most beyond |ref|
    ws.outputs["C"][int(drawn["C"][r]), c] += task.tolerance.atol + task.tolerance.rtol * float(ref[r, c] + terms[r, c]) / 2
    calls: list[str] = []

    def whole():
        calls.append("every")
        return every()

    def rows(wanted):
        calls.append("some")
        return some(wanted)

    return ws, fresh, samples, whole, rows, calls


def test_a_sampled_row_off_against_ref_alone_passes_on_the_term_scales_of_its_rows():
    """A sampled verdict with lazy term scales: an element that fails against |ref| alone passes on
    its term scale; the scales of the failing rows alone are computed (row_scales), never the whole
    sample's. Without row scales, the whole sample's scales decide, the same way."""
    ws, fresh, samples, whole, rows, calls = _off_against_ref_only()
    tol = ws.task.tolerance
    assert ws.verdict(None, tol, inputs=fresh, samples=samples)[0] == "incorrect"  # against |ref|
    assert ws.verdict(None, tol, whole, inputs=fresh, samples=samples, row_scales=rows)[0] is None
    assert calls == ["some"]
    calls.clear()
    assert ws.verdict(None, tol, whole, inputs=fresh, samples=samples)[0] is None
    assert calls == ["every"]


def test_the_sampled_rows_are_drawn_on_the_judges_device(monkeypatch):
    """judge_run draws a sampled run's rows with a generator on the run's device (tasks.sampled
    draws them there: a host generator cannot draw device rows)."""
    import random

    import tasks.generators as G
    import tasks.sampled as S

    made, real = [], torch.Generator
    monkeypatch.setattr(torch, "Generator", lambda device: made.append(device) or real())
    monkeypatch.setattr(G, "generate_inputs", lambda task, axes, seed, device="cpu", fast=False: {"seed": seed})
    monkeypatch.setattr(S, "draw_rows", lambda task, fresh, gen, rows: "drawn")
    monkeypatch.setattr(S, "rows_at", lambda task, fresh, drawn, terms=None: "rows")
    monkeypatch.setattr(workspace, "lazy_sample_scales", lambda task, fresh, drawn: (None, None))
    workspace.judge_run(small_gemm(), AXES, _RecWs([(None, None, [])]), 1, random.Random(1), "cuda:1", 8, False, "r")
    assert made == ["cuda:1"]


def test_a_tolerance_without_a_scale_gets_no_term_scales_lazily_either():
    """As term_scales (test_mutation_worker.py): a tolerance that names no scale is judged against
    |ref| alone, with no scale functions to call."""
    task = type("T", (), {"tolerance": object()})()
    assert workspace.lazy_term_scales(task, {}) == (None, None)
