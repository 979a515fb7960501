#!/usr/bin/env bash
# One sweep, three ways, on the 2-GPU machine (kind nvidia-h200-x2), from the repo root:
#   bash scripts/ray_gpu_sweep.sh
# The sweep is docs/examples/sweep_gpu_ray.toml: recorded replies (the shipped simple and
# expert GEMM and attention-forward solutions), 8 runs x 2 turns = 16 evaluations of real
# GPU work. It runs
#   local1  local executor, CUDA_VISIBLE_DEVICES=0    (one GPU worker)
#   local2  local executor, both GPUs                 (one worker per GPU, queued per GPU)
#   ray2    Ray executor, a local Ray instance        (one evaluator actor per GPU)
# each from its own folder under $WORK (default /tmp/sweeps; cold baseline caches alike),
# times it, counts evaluations and which GPU ran each (eval.json `device`), and compares
# the runs' verdict sequences (compiled, arch, correct, correct_with_arch, outcome per
# candidate; speedups differ run to run and are left out). Into $OUT (default
# runs/ray_gpu_sweep): ray_sweep.md (the table for docs/BENCHMARKS.md), ray_sweep.json,
# ray_sweep.log. Exit status 0 when the three agree and every sweep finished.
#
# Before it, here: bash scripts/fetch_device_wheels.sh && bash scripts/fetch_ray_wheels.sh
# On the device it installs .whl/*.whl and Ray into /tmp/site (PYTHONPATH): Ray from
# .ray/ray-*-min.tar.xz if carried, else from the two chunks .ray_a/ray.whl.part-aa +
# .ray_b/ray.whl.part-ab (reassembled, checked against .ray_a/ray.whl.sha256, pip-installed).
#
# DRY_CPU=1: a rehearsal on a machine without a GPU: .venv's Python, no install, no GPU
# check, Ray told it has 2 GPUs (RAY_OVERRIDE_RESOURCES) so the GPU-actor path runs; the
# evaluations compile + inspect only (verdicts `unverified` instead of correct). DRY_SITE=dir
# puts a folder before the repo on PYTHONPATH (e.g. a stripped Ray and a sitecustomize.py
# that hides packages the device lacks).
# Knobs: REPLICAS (default: the config's 4), DEADLINE_S (default 450: every sweep ends by
# then, counted from the start of this script; a sweep cut short still gives its rate),
# SWEEPS (default "ray2 local2 local1": which to run, in this order).
set -uo pipefail
# else pytest skips every GPU test and says "passed"; CUDA_VISIBLE_DEVICES="" (or -1) hides them all
if [[ "${CUDA_VISIBLE_DEVICES-unset}" == "" || "${CUDA_VISIBLE_DEVICES-unset}" == "-1" ]] \
    || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "scripts/ray_gpu_sweep.sh needs an NVIDIA GPU: none is visible here (nvidia-smi -L, CUDA_VISIBLE_DEVICES)" >&2
  exit 3
fi
cd "$(dirname "$0")/.."
REPO="$PWD"
T0=$(date +%s)
OUT="${OUT:-runs/ray_gpu_sweep}"
mkdir -p "$OUT" && OUT="$(cd "$OUT" && pwd)"
WORK="${WORK:-/tmp/sweeps}"
DEADLINE_S="${DEADLINE_S:-450}"
LOG="$OUT/ray_sweep.log"
: > "$LOG"
export PYTHONUNBUFFERED=1 LITELLM_LOCAL_MODEL_COST_MAP=True RAY_USAGE_STATS_ENABLED=0
# Ray's memory monitor reads MemTotal, which starts small and grows on these machines.
export RAY_memory_monitor_refresh_ms=0
SWEEPS="${SWEEPS:-ray2 local2 local1}"
say() { echo "== $(date -u +%T) $*" | tee -a "$LOG"; }

if [ "${DRY_CPU:-0}" = 1 ]; then
  PY="${PYTHON:-$REPO/.venv/bin/python}"
  export PYTHONPATH="${DRY_SITE:+$DRY_SITE:}$REPO"
  NGPU=2  # pretend, for Ray's resources only
  say "DRY_CPU rehearsal: $PY, no install, no GPU"
else
  PY="${PYTHON:-python3}"
  # (a) wheels and Ray into /tmp/site
  {
    set -e
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    if compgen -G ".ray/ray-*-min.tar.xz" > /dev/null; then
      (cd .ray && sha256sum -c ./*.sha256)
      # Python's tarfile (lzma): the image need not have an xz binary; modes (gcs_server, raylet) kept.
      "$PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall("/tmp/site", filter="tar")' .ray/ray-*-min.tar.xz
      echo "ray: from $(ls .ray/*.tar.xz)"
    elif [ -f .ray_a/ray.whl.part-aa ] && [ -f .ray_b/ray.whl.part-ab ]; then
      whl=/tmp/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
      [ -f .ray_a/ray.whl.sha256 ] && whl=/tmp/$(awk '{print $2}' .ray_a/ray.whl.sha256)
      cat .ray_a/ray.whl.part-* .ray_b/ray.whl.part-* > "$whl"
      if [ -f .ray_a/ray.whl.sha256 ]; then (cd /tmp && sha256sum -c "$REPO/.ray_a/ray.whl.sha256"); fi
      "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$whl"
      echo "ray: from the chunks .ray_a + .ray_b"
    else
      echo "no Ray carried: need .ray/ (one call) or .ray_a/ + .ray_b/ (two calls); see scripts/fetch_ray_wheels.sh"
      exit 1
    fi
    set +e
  } 2>&1 | tee -a "$LOG"
  [ "${PIPESTATUS[0]}" = 0 ] || { say "install failed"; exit 1; }
  export PYTHONPATH="/tmp/site:$REPO"
  # (b) the GPUs (this also warms torch and CUDA from disk before the timed sweeps)
  NGPU=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>>"$LOG" | tail -1)
  say "torch.cuda.device_count() = ${NGPU:-?}"
  nvidia-smi --query-gpu=index,name,uuid,memory.total,clocks.max.sm --format=csv,noheader 2>&1 | tee -a "$LOG"
  if ! [[ "$NGPU" =~ ^[0-9]+$ ]] || [ "$NGPU" -lt 1 ]; then say "no GPU: stopping"; exit 1; fi
  [ "$NGPU" -ge 2 ] || say "only $NGPU GPU: the 2-GPU rows will show it"
fi
"$PY" -c 'import sys, ray, pydantic, langgraph, torch; print("python", sys.version.split()[0], "ray", ray.__version__, "pydantic", pydantic.__version__, "torch", torch.__version__)' 2>&1 | tee -a "$LOG"
[ "${PIPESTATUS[0]}" = 0 ] || { say "imports failed"; exit 1; }
"$PY" -c 'import jsonschema, packaging, attrs; print("jsonschema", jsonschema.__version__ if hasattr(jsonschema, "__version__") else "ok", "packaging", packaging.__version__, "attrs", attrs.__version__)' 2>&1 | tail -1 | tee -a "$LOG"

# The config, with absolute scripted: paths (it is read from $WORK) and REPLICAS if given.
rm -rf "$WORK" && mkdir -p "$WORK"
sed -e "s#scripted:recorded/#scripted:$REPO/docs/examples/recorded/#g" \
    ${REPLICAS:+-e "s/^replicas = .*/replicas = $REPLICAS/"} \
    docs/examples/sweep_gpu_ray.toml > "$WORK/sweep.toml"
"$PY" -m agent.cli sweep "$WORK/sweep.toml" --dry-run 2>&1 | tail -1 | tee -a "$LOG"

# (c) the three sweeps, each with its own wall clock and a share of the deadline
run_one() {  # name executor cuda_visible_devices(or "all") cap_s
  local name=$1 executor=$2 cvd=$3 cap=$4 dir="$WORK/$1"
  local left=$(( DEADLINE_S - ($(date +%s) - T0) ))
  local limit=$(( cap < left ? cap : left ))
  if [ "$limit" -lt 30 ]; then say "$name: skipped, ${left}s left before the deadline"; return; fi
  mkdir -p "$dir"
  say "$name: executor $executor, GPUs $cvd, limit ${limit}s"
  local start end rc
  start=$(date +%s.%N)
  (
    cd "$dir"
    if [ "$cvd" = all ]; then unset CUDA_VISIBLE_DEVICES; else export CUDA_VISIBLE_DEVICES="$cvd"; fi
    if [ "$executor" = ray ]; then  # Ray counts the GPUs itself (NVML); say it, so a miscount cannot pass
      export RAY_OVERRIDE_RESOURCES="{\"GPU\": $NGPU, \"object_store_memory\": 2000000000}"
    fi
    exec timeout -k 30 -s INT "$limit" "$PY" -m agent.cli sweep "$WORK/sweep.toml" --executor "$executor" \
      --runs-dir "$dir/runs" --json > "$dir/sweep_out.json" 2> "$dir/stderr.log"
  )
  rc=$?
  end=$(date +%s.%N)
  echo "{\"name\": \"$name\", \"executor\": \"$executor\", \"gpus\": \"$cvd\", \"rc\": $rc, \"start\": $start, \"end\": $end, \"limit_s\": $limit}" > "$dir/timing.json"
  say "$name: rc $rc, $(awk "BEGIN {printf \"%.1f\", $end - $start}")s"
  grep -v '^\s*$' "$dir/stderr.log" | grep -iv "progress\|━" | tail -15 >> "$LOG"
  if [ "$rc" != 0 ] && [ "$executor" = ray ]; then  # what Ray itself said
    for f in /tmp/ray/session_latest/logs/raylet.err /tmp/ray/session_latest/logs/gcs_server.err; do
      [ -s "$f" ] && { echo "--- tail $f"; tail -20 "$f"; } >> "$LOG"
    done
  fi
}
for s in $SWEEPS; do
  case $s in
    ray2) run_one ray2 ray all 170 ;;
    local2) run_one local2 local all 150 ;;
    local1) run_one local1 local 0 400 ;;
    *) say "unknown sweep $s (ray2, local2, local1)" ;;
  esac
done

# (d) compare and report
"$PY" - "$WORK" "$OUT" "${DRY_CPU:-0}" <<'PYEOF' 2>&1 | tee -a "$LOG"
import datetime, json, os, platform, re, subprocess, sys
from pathlib import Path

from agent.sweep import expand, load_sweep_config, verdict_sequence
from agent.trajectory import read_summary

work, out, dry = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "1"
cfg = load_sweep_config(work / "sweep.toml")
run_ids = [r.run_id for r in expand(cfg)]
# Each run: the simple solution (correct, no wgmma/TMA), then the expert one. The expert is
# `correct_with_arch` only where the executed check (ncu) ran and credited the features; this
# sweep turns it off (it would serialise the GPU), and without a GPU nothing runs; either way
# the expert is "unverified": the features are in its SASS, but no instruction credit is given.
EXPECTED_EXPERT = "correct_with_arch" if cfg.executed_check else "unverified"


def expected(gpu_checked: bool) -> list[str]:
    return ["arch_missing", EXPECTED_EXPERT if gpu_checked else "unverified"]


GPUS = {"local1": 1, "local2": 2, "ray2": 2}

rows, sequences = [], {}
for name in ("local1", "local2", "ray2"):
    d = work / name
    if not (d / "timing.json").exists():
        rows.append({"name": name, "ran": False})
        continue
    timing = json.loads((d / "timing.json").read_text())
    wall = timing["end"] - timing["start"]
    try:
        text = (d / "sweep_out.json").read_text()
        result = json.loads(text[text.index("{"):])
    except (OSError, ValueError):
        result = None
    evals = sorted((d / "runs").glob(f"{cfg.name}/**/candidates/*/eval.json"))
    per_gpu, busy = {}, {}
    mtimes = []
    for p in evals:
        ev = json.loads(p.read_text())
        dev = ev.get("device") or "none"
        per_gpu[dev] = per_gpu.get(dev, 0) + 1
        busy[dev] = busy.get(dev, 0.0) + float(ev.get("seconds") or 0.0)
        mtimes.append(p.stat().st_mtime)
    seq, finished = {}, 0
    for rid in run_ids:
        run_dir = d / "runs" / rid
        s = read_summary(run_dir) if (run_dir / "summary.json").exists() else None
        if s is not None and s.status == "finished":
            finished += 1
            seq[rid] = verdict_sequence(s)
    sequences[name] = seq
    mtimes.sort()
    steady = (60.0 * (len(mtimes) - 1) / (mtimes[-1] - mtimes[0])) if len(mtimes) > 2 and mtimes[-1] > mtimes[0] else None
    executor = (result or {}).get("executor") or timing["executor"]
    # The Ray executor's summary ends with its driver overhead (agent/executors.py, describe()).
    overhead = re.search(r"driver CPU ([\d.]+) ms/evaluation \(executor bookkeeping ([\d.]+) ms\)", executor)
    rows.append({
        "name": name, "ran": True, "executor": executor.split(";")[0],
        "driver_cpu_ms_per_eval": float(overhead.group(1)) if overhead else None,
        "bookkeeping_cpu_ms_per_eval": float(overhead.group(2)) if overhead else None,
        "gpus": GPUS[name], "rc": timing["rc"], "limit_s": timing["limit_s"], "runs_total": len(run_ids),
        "runs_finished": finished, "evaluations": len(evals), "wall_s": round(wall, 1),
        "evals_per_min": round(60.0 * len(evals) / wall, 2) if wall > 0 else None,
        "evals_per_min_steady": round(steady, 2) if steady else None,  # first to last eval.json: no start-up
        "per_gpu": dict(sorted(per_gpu.items())),  # eval.json `device`: the GPU that ran it ("none": nothing ran)
        # Sum of EvalResult.seconds per GPU: compile, inspect and queueing included (local: overlapping).
        "eval_seconds_per_gpu": {k: round(v, 1) for k, v in sorted(busy.items())},
        "failed": (result or {}).get("failed"),
    })
    row = rows[-1]
    row["gpu_checked"] = bool(seq) and all(c["correct"] is not None for v in seq.values() for c in v)
    row["as_expected"] = finished == len(run_ids) and all(
        [c["outcome"] for c in seq[r]] == expected(row["gpu_checked"]) for r in run_ids)

done = [r for r in rows if r.get("ran")]
complete = all(r["runs_finished"] == r["runs_total"] for r in done) and len(done) == 3
common = set.intersection(*(set(s) for s in sequences.values())) if sequences else set()
identical = bool(common) and all(sequences[n][rid] == sequences[done[0]["name"]][rid] for n in sequences for rid in common)
diffs = [f"{rid}: " + "; ".join(f"{n} {[c['outcome'] for c in sequences[n][rid]]}" for n in sequences)
         for rid in sorted(common) if len({json.dumps(sequences[n][rid], sort_keys=True) for n in sequences}) > 1]
for r in done:
    r["identical"] = identical and r["runs_finished"] == r["runs_total"]

gpu_names = "no GPU (DRY_CPU rehearsal)" if dry else subprocess.run(
    ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip().replace("\n", ", ")
try:
    import ray
    ray_version = ray.__version__
except ImportError:
    ray_version = "?"
import torch
meta = {"date": datetime.date.today().isoformat(), "host": platform.node(), "gpus": gpu_names, "cpus": os.cpu_count(),
        "python": platform.python_version(), "torch": torch.__version__, "ray": ray_version, "dry_cpu": dry,
        "sweep": cfg.name, "runs": len(run_ids), "replicas": cfg.replicas, "max_turns": cfg.budget.max_turns,
        "concurrency": cfg.concurrency, "executed_check": cfg.executed_check}
summary = {"meta": meta, "rows": rows, "identical": identical, "complete": complete, "compared_runs": len(common),
           "differences": diffs, "verdicts": sequences}
(out / "ray_sweep.json").write_text(json.dumps(summary, indent=2) + "\n")

def cell(v):
    return "—" if v is None else v
lines = [f"## Sweep throughput: local and Ray executors ({meta['date']})", "",
         f"`bash scripts/ray_gpu_sweep.sh` on {gpu_names} ({meta['cpus']} CPU cores), Python {meta['python']}, "
         f"torch {meta['torch']}, Ray {meta['ray']}. Sweep `docs/examples/sweep_gpu_ray.toml`: {len(run_ids)} runs "
         f"(2 recorded models x their task x {cfg.replicas} replicas, {cfg.budget.max_turns} turns), every "
         f"evaluation on all five workloads of its task, the visible one timed against the library; "
         f"executed check {'on' if cfg.executed_check else 'off'}; {cfg.concurrency} runs in flight. Wall time is the whole `agent sweep` "
         f"process (start-up, Ray or worker start, compile, inspect, GPU); 'steady' counts from the first "
         f"to the last evaluation written. Driver CPU per evaluation (Ray only): the `agent sweep` process's "
         f"CPU time (every thread: the runs' own agent work and start-up included) over its evaluations, and in "
         f"parentheses the executor's part (the run threads inside evaluate()); compile + inspect run in Ray "
         f"CPU tasks, not in the driver.", "",
         "| executor | GPUs | runs finished | evaluations | wall s | evaluations/min | steady evaluations/min | evaluations per GPU | driver CPU ms/evaluation (executor's part) | identical verdicts |",
         "|---|---|---|---|---|---|---|---|---|---|"]
for r in rows:
    if not r.get("ran"):
        lines.append(f"| {r['name']} | | not run | | | | | | | |")
        continue
    per = ", ".join(f"{k}: {v}" for k, v in r["per_gpu"].items()) or "—"
    cpu = "—" if r["driver_cpu_ms_per_eval"] is None else \
        f"{r['driver_cpu_ms_per_eval']} ({r['bookkeeping_cpu_ms_per_eval']})"
    lines.append(f"| {r['executor']} | {r['gpus']} | {r['runs_finished']}/{r['runs_total']} | {r['evaluations']} | "
                 f"{r['wall_s']} | {cell(r['evals_per_min'])} | {cell(r['evals_per_min_steady'])} | {per} | "
                 f"{cpu} | {'yes' if r['identical'] else 'no'} |")
lines += ["", f"Verdict sequences (compiled, arch, correct, correct_with_arch, outcome of every candidate) of "
          f"{len(common)} runs compared across the executors: {'identical' if identical else 'DIFFERENT'}"
          f"{'' if complete else ' (not every sweep finished: only runs finished in all are compared)'}. "
          f"Expected per run: {' then '.join(expected(all(r['gpu_checked'] for r in done)))}; as expected: "
          f"{', '.join(r['name'] + ' ' + ('yes' if r['as_expected'] else 'no') for r in done)}; verdicts checked on "
          f"a GPU: {', '.join(r['name'] + ' ' + ('yes' if r['gpu_checked'] else 'no') for r in done)}."]
if diffs:
    lines += ["", "Differences:", *[f"- {x}" for x in diffs[:20]]]
(out / "ray_sweep.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
ok = identical and complete and all(r["rc"] == 0 and r["as_expected"] and (dry or r["gpu_checked"]) for r in done)
sys.exit(0 if ok else 1)
PYEOF
status=${PIPESTATUS[0]}
say "done in $(( $(date +%s) - T0 ))s, exit $status"
exit "$status"
