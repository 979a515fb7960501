"""scripts/probe_range_cost.py's command line (the probe itself needs an H200: /work/gpuq's cost8 call).
Bad input is one line and exit 2 with nothing written, before any GPU is looked for."""
from __future__ import annotations

import pytest

from script_cli import ROOT, assert_refused


@pytest.mark.parametrize("args", [["--sets", "one,bogus"], ["--sets", "full@x"], ["--n", "8"], ["--busy-ms", "0"]])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args):
    out = tmp_path / "probe.json"
    assert_refused("probe_range_cost.py", [*args, "--json", str(out)], out)


def test_the_probe_runs_end_to_end_on_stand_ins(monkeypatch, tmp_path, capsys):
    """The probe's whole path (every case, every set, --each, the restart, the table, the JSON) on CPU
    stand-ins for CUDA and CUPTI: the lead's one GPU call must not end in a typo. A stand-in range
    counts one unit of each metric per GEMM and ten per flush, so a two-run range reads more per run."""
    import contextlib
    import importlib.util
    import json

    import torch

    from tools import credit, cupti, evaluator
    from tools.cupti import Launch

    spec = importlib.util.spec_from_file_location("probe_range_cost", ROOT / "scripts" / "probe_range_cost.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    state = {"open": None, "counts": {}}

    def on_cpu(fn):
        def wrapper(*a, device=None, **k):
            return fn(*a, **k)
        return wrapper
    for name in ("zeros", "randn", "empty"):
        monkeypatch.setattr(torch, name, on_cpu(getattr(torch, name)))
    real_matmul = torch.matmul

    def matmul(a, b, out=None):
        if state["open"] is not None:
            state["counts"][state["open"]] = state["counts"].get(state["open"], 0) + 1
        return real_matmul(a.float(), b.float()).to(out.dtype) if out is None else out.copy_(real_matmul(a.float(), b.float()))
    monkeypatch.setattr(torch, "matmul", matmul)
    real_zero = torch.Tensor.zero_

    def zero_(t):
        if state["open"] is not None and t.dtype == torch.uint8:
            state["counts"][state["open"]] = state["counts"].get(state["open"], 0) + 10
        return real_zero(t)
    monkeypatch.setattr(torch.Tensor, "zero_", zero_)

    class Event:
        def __init__(self, enable_timing=False):
            pass

        def record(self):
            pass

        def elapsed_time(self, end):
            return 0.5
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: type("P", (), {"L2_cache_size": 1 << 10})())
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "stand-in")
    monkeypatch.setattr(evaluator, "require_gpu", lambda what: None)

    class Profiler:
        def __init__(self, metrics, replay="user"):
            self.metrics, self.passes, self.instrumented_passes = list(metrics), min(4, len(metrics)), ()
            self.last_phase_s, self.last_pass_s, self._capacity = {}, [], 4

        def profile_passes(self, run_pass, name, max_ranges=None):
            state["counts"] = {}
            for i in range(self.passes):
                self.last_pass_s.append([0.28 if i == 0 else 0.002, 0.01])
                run_pass(i, lambda label=None: self._ranged(None, label or name, []))
            self.last_phase_s = {"setup": 0.04, "decode": 0.01}
            return [Launch(n, {m: float(c) for m in self.metrics}) for n, c in state["counts"].items()]

        @contextlib.contextmanager
        def _ranged(self, obj, label, seen):
            state["open"] = label
            try:
                yield
            finally:
                state["open"] = None

        def _configure(self, *a):
            return object(), None

        def close(self):
            pass
    monkeypatch.setattr(cupti, "RangeProfiler", Profiler)
    monkeypatch.setattr(cupti, "_call", lambda fn, params: None)
    monkeypatch.setattr(cupti, "RPObject", lambda **k: None)
    monkeypatch.setattr(cupti, "Stop", lambda **k: None)
    out = tmp_path / "probe.json"
    assert probe.main(["--n", "64", "--runs", "2", "--each", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert set(res["sets"]) == {"one", "six", "full", "full@512"} and res["sets"]["full@512"]["capacity"] == 512
    full = res["sets"]["full"]
    assert full["error"] is None and all(full["cases"][c]["push_ms"] is not None for c in probe.CASES)
    thread = credit.THREAD_INST_METRIC
    assert full["counts_one"][thread] > 0 and full["two_over_one"][thread] == 6.0  # (2 GEMMs + a flush) / 2
    assert full["judged_over_one"][thread] == 6.5 and "second_start_s" in res["restart"]
    assert len(res["each"]) == len(credit.credit_metrics()) and all("error" not in r for r in res["each"].values())
    printed = capsys.readouterr().out
    assert f"[full] {len(credit.credit_metrics())} metrics" in printed and "each metric alone" in printed
    assert "a second configuration on the same enabled object" in printed
