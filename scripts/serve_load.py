"""Load test of `agent serve`: start it on loopback, send a bounded number of evaluations from
several clients at once, and report jobs per minute and the p50/p99 latency (submit to done).

    python3 scripts/serve_load.py --jobs 40 --clients 4 --max-s 420 --out runs/serve_load

Each job is an expert (or --solution simple) solution of --tasks, evaluated on the visible
workloads (credit on, as `agent eval`); the verdicts are compared with `agent eval --json` of the
same solutions run first in a process of its own (--compare), so the service is shown to judge as
the CLI does. Bounded in count (--jobs) and time (--max-s: what is unfinished then is cancelled
and counted as such). Writes load.json (every job's latency and verdicts, the figures) and prints
a markdown line for docs/BENCHMARKS.md. A 429 is waited out per its Retry-After and counted.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.client import ServiceClient, ServiceError  # noqa: E402


def start_server(store: Path, slots: int | None, log: Path) -> tuple[subprocess.Popen, str]:
    args = [sys.executable, "-m", "agent.cli", "serve", "--port", "0", "--store", str(store), "--queue-size", "1000",
            "--per-client", "1000"] + (["--slots", str(slots)] if slots else [])
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=open(log, "w"), text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("listening on "):
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            print(line.strip(), flush=True)
            return proc, line.split()[2]
        if not line and proc.poll() is not None:
            break
    raise SystemExit(f"agent serve did not start; see {log}")


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--tasks", default="gemm_n7168_k5120,mha_fwd_d128,mha_bwd_d128")
    ap.add_argument("--solution", default="expert", help="expert | simple: the folder under each task")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--slots", type=int, default=None)
    ap.add_argument("--max-s", type=float, default=420.0, help="stop waiting after this; the rest is cancelled")
    ap.add_argument("--compare", action="store_true", help="first run `agent eval --json` on each solution")
    ap.add_argument("--url", default=None, help="a running service instead of starting one")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "serve_load")
    a = ap.parse_args()
    if a.jobs < 1 or a.clients < 1:
        print("error: --jobs and --clients must be at least 1", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    tasks = [t.strip() for t in a.tasks.split(",") if t.strip()]
    sols = {}
    for t in tasks:
        d = ROOT / "tasks" / t / a.solution
        if not d.is_dir():
            print(f"error: no {a.solution} solution at {d}", file=sys.stderr)
            return 2
        src = next(p for p in (d / "kernel.cu", d / "kernel.ptx") if p.exists())
        sols[t] = (src.read_text(), json.loads((d / "launch.json").read_text()), "cuda" if src.suffix == ".cu" else "ptx")

    cli_verdicts = {}
    if a.compare:
        for t in tasks:
            p = subprocess.run([sys.executable, "-m", "agent.cli", "eval", str(ROOT / "tasks" / t / a.solution),
                                "--task", t, "--arch", a.arch, "--json"], cwd=ROOT, capture_output=True, text=True)
            cli_verdicts[t] = json.loads(p.stdout)["verdicts"] if p.stdout.strip() else {"error": p.stderr[-300:]}
            print(f"agent eval {t}: {cli_verdicts[t]}", flush=True)

    proc = None
    url = a.url
    if url is None:
        proc, url = start_server(a.out / "jobs.sqlite", a.slots, a.out / "serve.log")
    records: list[dict] = []
    lock = threading.Lock()
    counter = iter(range(a.jobs))
    t0 = time.monotonic()
    deadline = t0 + a.max_s

    def client(k: int) -> None:
        with ServiceClient(url, retries_429=1000) as c:
            while time.monotonic() < deadline:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                task = tasks[i % len(tasks)]
                source, launch, lang = sols[task]
                start = time.monotonic()
                rec = {"job": i, "client": k, "task": task}
                try:
                    job_id = c.submit(task, source, launch, arch=a.arch, lang=lang)
                    job = c.wait(job_id, timeout_s=max(1.0, deadline - time.monotonic()), poll_s=0.2)
                    rec.update(status=job["status"], latency_s=time.monotonic() - start,
                               queued_s=(job["started"] or job["created"]) - job["created"],
                               run_s=(job["finished"] or 0) - (job["started"] or 0),
                               verdicts=(job["result"] or {}).get("verdicts"), error=job["error"])
                except TimeoutError:
                    c.cancel(job_id)
                    rec.update(status="unfinished", latency_s=time.monotonic() - start)
                except ServiceError as exc:
                    rec.update(status=f"refused {exc.status}", error=exc.detail)
                with lock:
                    records.append(rec)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    health = None
    try:
        with ServiceClient(url) as c:
            health = c.health()
    except ServiceError:
        pass
    if proc is not None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)

    done = [r for r in records if r["status"] == "done"]
    lat = [r["latency_s"] for r in done]
    mismatched = [r for r in done if cli_verdicts.get(r["task"]) and _judged(r["verdicts"]) != _judged(cli_verdicts[r["task"]])]
    summary = {
        "jobs": a.jobs, "clients": a.clients, "tasks": tasks, "solution": a.solution, "done": len(done),
        "other": {s: sum(1 for r in records if r["status"] == s) for s in {r["status"] for r in records} - {"done"}},
        "wall_s": round(wall, 1), "jobs_per_min": round(60 * len(done) / wall, 2) if wall else None,
        "p50_s": round(statistics.median(lat), 2) if lat else None, "p99_s": round(percentile(lat, 99), 2) if lat else None,
        "run_p50_s": round(statistics.median([r["run_s"] for r in done]), 2) if done else None,
        "verdicts_as_cli": (len(done) - len(mismatched)) if cli_verdicts else None,
        "gpu": (health or {}).get("gpu"), "executor": (health or {}).get("executor"),
    }
    (a.out / "load.json").write_text(json.dumps({"summary": summary, "cli_verdicts": cli_verdicts, "jobs": records},
                                                indent=2, default=str))
    print(json.dumps(summary, indent=2))
    print(f"| serve load | {summary['gpu']} | {a.clients} clients, {len(done)}/{a.jobs} jobs done in {wall:.0f} s | "
          f"{summary['jobs_per_min']} jobs/min | p50 {summary['p50_s']} s, p99 {summary['p99_s']} s |")
    return 0 if len(done) == a.jobs and not mismatched else 1


def _judged(v: dict | None) -> dict:
    """The verdicts that must agree (speedups vary run to run: their presence must not)."""
    v = v or {}
    return {k: (x if not k.startswith("speedup") and k != "sol_score" else x is not None) for k, x in v.items()}


if __name__ == "__main__":
    sys.exit(main())
