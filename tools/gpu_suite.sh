#!/usr/bin/env bash
# The GPU suite, run on the device machine from anywhere in the repo:
#   bash tools/gpu_suite.sh
# 1. installs the wheels carried in .whl/ (pydantic, ...; the device has no package index)
#    into /tmp/site with pip --target and puts it on PYTHONPATH;
# 2. runs the GPU tests (tests/gpu, marker `gpu`);
# 3. runs tools/bench_harness.py (evaluation wall times per stage, timing spread) in what is
#    left of one device call (CALL_S, 590 s): the tests took about 12.5 minutes on the H200 on
#    2026-11-30 (97 tests: 484 s for test_timing_gate_gpu, test_evaluator_gpu, test_fp8_*,
#    test_gdn_gpu and test_profile_gpu; 264 s for test_solve_gpu, test_tasks_gpu and
#    tests/test_replay.py), so split them over two calls
#    (GPU_TESTS below) and run the bench in a call of its own (SKIP_BENCH=1 here, then
#    `python3 tools/bench_harness.py`; `--solution expert`, `--tasks` for the new families).
# Into $OUT (default runs/gpu_suite), at most 8 files as the device tool returns them:
#   suite.log (environment + pytest + per-test durations), bench.log, bench.json, bench.md, worker_tests.log,
#   baselines_tests.json, worker_bench.log.
# Exit status: the tests' (the benchmark is informative).
set -uo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS
CALL_S="${CALL_S:-590}"  # the device tool's per-call limit, less a margin: the bench gets what the tests leave
OUT="${OUT:-runs/gpu_suite}"
mkdir -p "$OUT" && OUT="$(cd "$OUT" && pwd)"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
TESTS_CACHE=/tmp/ptxbench_gpu_tests BENCH_CACHE=/tmp/ptxbench_bench
rm -rf "$TESTS_CACHE" "$BENCH_CACHE"

{
  if compgen -G ".whl/*.whl" > /dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  echo "== $(date -u +%FT%TZ) $(hostname) $(uname -r)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || true
  "$PY" -c 'import sys, torch, pydantic; import cuda.bindings as cb; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "cuda-bindings", cb.__version__, "pydantic", pydantic.__version__)'
  command -v ncu compute-sanitizer ptxas cuobjdump || true
} 2>&1 | tee "$OUT/suite.log"
if compgen -G ".whl/*.whl" > /dev/null; then export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"; fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

export PTXBENCH_GPU_LOGS="$TESTS_CACHE"  # worker log + baseline cache of the GPU tests
export PTXBENCH_TEST_TIMES="$TESTS_CACHE/test_times.txt"  # per test, as each finishes (tests/conftest.py)
mkdir -p "$TESTS_CACHE"
timeout "${GPU_TEST_TIMEOUT:-540}" "$PY" -m pytest -m gpu -v --durations=20 -p no:cacheprovider --timeout "${GPU_TEST_EACH:-240}" ${GPU_TESTS:-tests} \
  2>&1 | tee -a "$OUT/suite.log"
status=${PIPESTATUS[0]}
cp -f "$TESTS_CACHE"/worker-gpu*.log "$OUT/worker_tests.log" 2>/dev/null || true
{ echo "== test durations, slowest first (also of tests cut off by the time limit's end)"
  sort -rn "$PTXBENCH_TEST_TIMES" 2>/dev/null | head -40
  awk '{s += $1} END {printf "total %.0f s in %d tests\n", s, NR}' "$PTXBENCH_TEST_TIMES" 2>/dev/null; } >> "$OUT/suite.log"
cp -f "$TESTS_CACHE/baselines.json" "$OUT/baselines_tests.json" 2>/dev/null || true

left=$(( CALL_S - (SECONDS - START) ))
if [ -n "${SKIP_BENCH:-}" ] || [ "$left" -lt 60 ]; then
  echo "bench skipped (${SKIP_BENCH:+SKIP_BENCH set; }${left} s left in the call)" | tee "$OUT/bench.log"
else
  timeout "$(( left < ${BENCH_TIMEOUT:-200} ? left : ${BENCH_TIMEOUT:-200} ))" "$PY" tools/bench_harness.py --out "$OUT" \
    --cache "$BENCH_CACHE" --skip-do-bench 2>&1 | tee "$OUT/bench.log"
fi
cp -f "$BENCH_CACHE"/worker-gpu*.log "$OUT/worker_bench.log" 2>/dev/null || true
echo "gpu tests exit status: $status" | tee -a "$OUT/suite.log"
exit "$status"
