"""Disk cache of library baseline timings (runs/.cache/baselines.json by default).

Keyed by task, workload, GPU, driver and library versions. It decides which backend is the
"best library" once (e.g. the fastest SDPA backend) and keeps the figures for reports;
speedups themselves always come from the interleaved measurement of one evaluation.
Several workers may write it at once: updates take a file lock and replace the file
atomically.
"""
from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

DEFAULT_PATH = Path("runs/.cache/baselines.json")


def cache_key(task: str, workload: str, axes: dict[str, int], env: dict[str, object]) -> str:
    """env: the worker's device info (gpu, driver, torch, cuda, cudnn versions)."""
    shape = ",".join(f"{k}={v}" for k, v in sorted(axes.items()))
    libs = "|".join(f"{k}={env.get(k)}" for k in ("gpu", "driver", "torch", "cuda", "cudnn"))
    return f"{task}|{workload}|{shape}|{libs}"


class BaselineCache:
    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path else DEFAULT_PATH

    def _read(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}  # a missing or damaged cache is only a cache

    @contextmanager
    def _locked(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def get(self, key: str) -> dict | None:
        return self._read().get(key)

    def update(self, key: str, **fields) -> dict:
        """Merge fields into the entry for key (creating it) and write the file atomically."""
        with self._locked():
            data = self._read()
            entry = {**data.get(key, {}), **fields, "updated": time.strftime("%Y-%m-%dT%H:%M:%S")}
            data[key] = entry
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".baselines-", suffix=".json")
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
            return entry

    def entries(self) -> dict[str, dict]:
        return self._read()
