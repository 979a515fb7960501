"""A stand-in GPU worker for CPU tests of the evaluator's client side (watchdog, restart,
crash handling). Speaks tools.worker's protocol; what it does with a "run" request is
read from the file named by PTXBENCH_FAKE_WORKER_MODE at each request:

  pass      answer with a passed WorkloadResult
  hang      sleep forever (the client's watchdog must kill it)
  crash     die by SIGSEGV without answering
  fatal     answer cuda_error (CUDA_ERROR_ILLEGAL_ADDRESS) with fatal=True, then exit
  nostart   fail at start-up (hello with an error)
  fp8_wgmma pass, and where the request asks for the in-process executed check, report a counted
            run whose counters are an honest fp8 wgmma kernel's (GMMA, fp8 tensor ops = the task's
            FLOPs, the HMMA-pipe counter above 0 as QGMMA makes it: tools/ncu.py); the workload's
            credit is "pending" and comes with the credit op, as tools.worker keeps it
  counted_wrong   as fp8_wgmma, but the credit op says the first workload's counted run answered wrong
  timed     as fp8_wgmma, each workload timed: speedup 2.0 on visible workloads, 0.5 on held-out ones
  held_out_wrong  as timed, but the credit op says every held-out workload's counted run answered
            wrong (a failure after its timing)
  counted_hang    as fp8_wgmma, but the credit op never answers
  fp8_then_fatal  as fp8_wgmma on this process's first run request, as fatal on the next
  prints    as pass, writing the workload's rows to stderr first, as a kernel's debug printf lands
            there (tools.worker sends fd 1 to stderr)
  counted_crash   as fp8_wgmma, but at the credit op it prints each kept workload's rows, then dies
            by SIGSEGV without answering
  held_out_harness_error  as pass, but a held-out workload fails in the worker's own code (harness_error),
            its exception quoting a tensor size (its M)
"""
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tools.launch import NOMINAL_LIMITS  # noqa: E402
from tools.worker import read_msg, write_msg  # noqa: E402


def mode() -> str:
    with open(os.environ["PTXBENCH_FAKE_WORKER_MODE"]) as f:
        return f.read().strip()


def main() -> int:
    out, inp = sys.stdout.buffer, sys.stdin.buffer
    if mode() == "nostart":
        write_msg(out, {"op": "hello", "error": "RuntimeError: torch sees no CUDA device"})
        return 1
    write_msg(out, {"op": "hello", "info": {"gpu": "Fake H200", "cc": "9.0", "pid": os.getpid(),
                                            "limits": NOMINAL_LIMITS["sm_90a"]}})
    pending: dict[str, dict] = {}  # deferred credits, as tools.worker keeps them until the credit op
    held_out: set[str] = set()  # the pending workloads of the held-out split
    rows: dict[str, int] = {}  # each workload's M, which counted_crash prints
    runs = 0
    while True:
        msg = read_msg(inp)
        if msg is None or msg.get("op") == "exit":
            return 0
        m = mode()
        if msg.get("op") == "credit" and msg.get("drop"):  # as tools.worker: the kept workloads dropped, none counted
            write_msg(out, {"op": "credits", "credits": {}, "failed": {}, "dropped": len(pending), "fatal": False,
                            "seconds": 0.0})
            pending = {}
            continue
        if msg.get("op") == "credit":
            if m == "counted_hang":
                time.sleep(3600)
            if m == "counted_crash":
                print("\n".join(f"rows {rows[name]}" for name in pending), file=sys.stderr, flush=True)
                os.kill(os.getpid(), signal.SIGSEGV)
            failed = {}
            wrong = {"reason": "wrong_in_timed_run", "outputs": [], "detail": (
                "the executed check's counted run 2 (after the timed runs) (fresh inputs, right in the checks "
                "before): output 'C': 3 of 64 elements off")}
            if m == "counted_wrong" and pending:
                failed[next(iter(pending))] = wrong
            if m == "held_out_wrong":
                failed.update({name: wrong for name in pending if name in held_out})
            parts = {"padding": 0.03, "cupti": 0.02, "pass_boundaries": 0.01, "instrumented_run": 0.02, "other": 0.0}
            write_msg(out, {"op": "credits", "credits": pending, "failed": failed, "fatal": False, "seconds": 0.1,
                            "cost_parts": parts})
            pending = {}
            continue
        runs += 1
        if m == "fp8_then_fatal":
            m = "fp8_wgmma" if runs == 1 else "fatal"
        wl = msg["workload"]
        result = {"workload": wl["name"], "split": wl["split"], "axes": wl["axes"], "seeds": msg["seeds"],
                  "status": "passed", "detail": f"pid {os.getpid()}"}
        if m == "prints":
            print(f"rows {wl['axes']['M']}", file=sys.stderr, flush=True)
        if m == "hang":
            time.sleep(3600)
        elif m == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        elif m == "held_out_harness_error" and wl["split"] == "held_out":
            result.update(status="failed", reason="harness_error", detail=(
                f"RuntimeError: The size of tensor a ({wl['axes']['M']}) must match the size of tensor b (64)"))
        elif m == "fatal":
            result.update(status="failed", reason="cuda_error", detail="CUDA_ERROR_ILLEGAL_ADDRESS (kernel execution)")
            write_msg(out, {"op": "result", "result": result, "fatal": True})
            return 3
        if m in ("timed", "held_out_wrong"):
            result["speedup"] = 2.0 if wl["split"] == "visible" else 0.5
            held_out |= {wl["name"]} if wl["split"] == "held_out" else set()
        if m in ("fp8_wgmma", "counted_wrong", "counted_hang", "timed", "held_out_wrong", "counted_crash") \
                and msg.get("credit"):
            credit = fp8_wgmma_credit(msg)
            pending[wl["name"]] = {**credit, "own_s": 0.02, "workloads_counted": 0}
            rows[wl["name"]] = wl["axes"]["M"]
            result["credit"] = {**credit, "status": "pending", "launches": []}
        write_msg(out, {"op": "result", "result": result, "fatal": False})


def fp8_wgmma_credit(msg: dict) -> dict:
    """tools.counted.defer_counted's result for the counted runs of an honest fp8 wgmma kernel (one per
    pass of the metric set the evaluator asked for; the last one SASS-patched)."""
    from tasks.schema import Task, Workload
    from tools import credit as ncu

    task, wl = Task.model_validate(msg["task"]), Workload.model_validate(msg["workload"])
    metrics = {m: 0.0 for m in msg["credit"]["metrics"]}
    metrics.update({ncu.GMMA_METRIC: 1e4, ncu.HMMA_INST_METRIC: 1e4, ncu.TENSOR_INST_METRIC: 1e4,
                    ncu.FP8_OPS_METRIC: float(task.flop_count(task.axis_values(wl)))})
    metrics.pop(ncu.DURATION_METRIC, None)  # not asked for in process: each counted run is timed with events
    passes = 3
    return {"status": "ran", "reason": None, "runs": passes, "lead_runs": 0, "counted_from": 1, "passes": passes,
            "run_ms": [0.01] * (passes - 1), "instrumented_ms": [0.5], "profile_s": 0.0,
            "launches": [{"name": "kernel", "metrics": metrics}]}


if __name__ == "__main__":
    sys.exit(main())
