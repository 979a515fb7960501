"""A stand-in GPU worker for CPU tests of the evaluator's client side (watchdog, restart,
crash handling). Speaks tools.worker's protocol; what it does with a "run" request is
read from the file named by PTXBENCH_FAKE_WORKER_MODE at each request:

  pass      answer with a passed WorkloadResult
  hang      sleep forever (the client's watchdog must kill it)
  crash     die by SIGSEGV without answering
  fatal     answer cuda_error (CUDA_ERROR_ILLEGAL_ADDRESS) with fatal=True, then exit
  nostart   fail at start-up (hello with an error)
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
    while True:
        msg = read_msg(inp)
        if msg is None or msg.get("op") == "exit":
            return 0
        m = mode()
        wl = msg["workload"]
        result = {"workload": wl["name"], "split": wl["split"], "axes": wl["axes"], "seeds": msg["seeds"],
                  "status": "passed", "detail": f"pid {os.getpid()}"}
        if m == "hang":
            time.sleep(3600)
        elif m == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        elif m == "fatal":
            result.update(status="failed", reason="cuda_error", detail="CUDA_ERROR_ILLEGAL_ADDRESS (kernel execution)")
            write_msg(out, {"op": "result", "result": result, "fatal": True})
            return 3
        write_msg(out, {"op": "result", "result": result, "fatal": False})


if __name__ == "__main__":
    sys.exit(main())
