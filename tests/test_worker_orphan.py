"""A GPU worker whose client dies without closing it (SIGKILL, a test's timeout) exits by itself
(tools.worker.exit_with_parent): it has a session of its own, so nothing else would stop it, and
left running it would hold the GPU and the device's one profiling session. Real processes, no GPU:
a client process starts a stand-in worker that runs the same watch, then the client is killed."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WORKER = ("import time; from tools.worker import exit_with_parent; exit_with_parent(0.05); "
          "print('watching', flush=True); time.sleep(120)")
CLIENT = ("import subprocess, sys, time; "
          f"w = subprocess.Popen([sys.executable, '-c', {WORKER!r}], start_new_session=True, stdout=subprocess.PIPE); "
          "assert w.stdout.readline().strip() == b'watching'; print(w.pid, flush=True); time.sleep(120)")


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's exit is reaped by whoever adopted it, maybe never here)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def test_the_worker_exits_when_its_client_is_killed():
    client = subprocess.Popen([sys.executable, "-c", CLIENT], cwd=ROOT, stdout=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        worker = int(client.stdout.readline())
        time.sleep(0.3)
        assert _running(worker), "the stand-in worker did not stay up while its client lived"
        client.send_signal(signal.SIGKILL)
        client.wait(10)
        deadline = time.monotonic() + 10
        while _running(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(worker), "the worker outlived its client"
    finally:
        client.kill()
        if "worker" in locals() and _running(worker):
            os.kill(worker, signal.SIGKILL)
