#!/usr/bin/env bash
# The GPU suite, run on the device machine from anywhere in the repo:
#   bash scripts/gpu_suite.sh
# 1. installs the wheels carried in .whl/ (pydantic, ...; the device has no package index)
#    into /tmp/site with pip --target and puts it on PYTHONPATH;
# 2. runs the GPU tests (tests/gpu, marker `gpu`);
# 3. runs scripts/bench_harness.py (evaluation wall times per stage, timing spread) in what is
#    left of one device call (CALL_S, 590 s).
# The tests take about 24 minutes on one H200 (2026-12-04: 1,442 s, pytest's own totals of the four parts),
# more than one 10-minute call. On one GPU run PART=1 to PART=4 (below), one device call each, each at
# most about 420 s; or any list with
# GPU_TESTS="...". With two GPUs visible (the device tool's nvidia-h200-x2) and no PART or
# GPU_TESTS the two halves run side by side, one per GPU. The bench gets what a call leaves
# (SKIP_BENCH=1 skips it; or `python3 scripts/bench_harness.py` in a call of its own, `--solution
# expert`, `--tasks` for the new families).
# Into $OUT (default runs/gpu_suite), at most 8 files as the device tool returns them:
#   suite.log (environment + pytest + per-test durations), bench.log, bench.json, bench.md, worker_tests.log,
#   baselines_tests.json, worker_bench.log, cupti_counters.json.
# Exit status: the tests' (the benchmark is informative).
set -uo pipefail
# else pytest skips every GPU test and says "passed"; CUDA_VISIBLE_DEVICES="" (or -1) hides them all
if [[ "${CUDA_VISIBLE_DEVICES-unset}" == "" || "${CUDA_VISIBLE_DEVICES-unset}" == "-1" ]] \
    || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "scripts/gpu_suite.sh needs an NVIDIA GPU: none is visible here (nvidia-smi -L, CUDA_VISIBLE_DEVICES)" >&2
  exit 3
fi
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
  bash scripts/tree_fingerprint.sh || true  # which tree ran: the same line for the same commit's files, anywhere
} 2>&1 | tee "$OUT/suite.log"
if compgen -G ".whl/*.whl" > /dev/null; then export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"; fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

# One pytest over the GPU tests: run_tests DEVICES CACHE LOG [pytest targets...]; DEVICES "" keeps
# CUDA_VISIBLE_DEVICES as it is. -rP keeps what passing tests print (the figures BENCHMARKS reads:
# e.g. each expert's credit phase in test_credit_gpu). Each run has its own cache (worker logs, baseline cache, per-test
# durations written as each test finishes: tests/conftest.py).
run_tests() {
  local devices=$1 cache=$2 log=$3
  shift 3
  mkdir -p "$cache"
  ( if [ -n "$devices" ]; then export CUDA_VISIBLE_DEVICES="$devices"; fi
    PTXBENCH_GPU_LOGS="$cache" PTXBENCH_TEST_TIMES="$cache/test_times.txt" \
      timeout "${GPU_TEST_TIMEOUT:-540}" "$PY" -m pytest -m gpu -v -rP --durations=20 -p no:cacheprovider \
      --timeout "${GPU_TEST_EACH:-300}" "$@" > "$log" 2>&1 )
}
# One device call each on one H200 (pytest's own totals, docs/BENCHMARKS.md, 2026-12-04 evening): PART=1 414 s
# (with PTXBENCH_GPU_GEMM_SHAPES=cover 7 of the 17 GEMM shapes, tests/gpu/test_credit_gpu.py says which and why),
# PART=2 368 s, PART=3 322 s, PART=4 338 s: 1,442 s, and with the calls made back to back on a warm machine
# 1,660 s of a session's 1,800 s of device time. Run them first, on the tree that is to land, before anything else.
case "${PART:-}" in
  1) GPU_TESTS="tests/gpu/test_credit_gpu.py tests/gpu/test_tasks_gpu.py" ;;
  2) GPU_TESTS="tests/gpu/test_evaluator_gpu.py tests/gpu/test_gdn_gpu.py tests/gpu/test_fp8_gemm_gpu.py
       tests/gpu/test_timing_gate_gpu.py tests/gpu/test_memcheck_feedback_gpu.py
       tests/gpu/test_knowledge_examples_gpu.py tests/gpu/test_fp8_attention_gpu.py
       tests/gpu/test_gemm_expert_gpu.py tests/gpu/test_fp8_expert_gpu.py tests/gpu/test_sass_counts_gpu.py" ;;
  3) GPU_TESTS="tests/gpu/test_judge_power_gpu.py tests/gpu/test_cupti_counters_gpu.py tests/gpu/test_profile_gpu.py
       tests/gpu/test_range_cost_gpu.py
       tests/test_replay.py" ;;
  4) GPU_TESTS="tests/gpu/test_solve_gpu.py tests/gpu/test_sweep_cost_gpu.py" ;;
  "") ;;
  *) echo "PART must be 1, 2, 3 or 4" >&2; exit 2 ;;
esac
# The second half of the suite, as split on the H200 on 2026-11-30 (264 s against 484 s for the rest).
HALF_B="tests/gpu/test_solve_gpu.py tests/gpu/test_tasks_gpu.py tests/test_replay.py"
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ -z "${GPU_TESTS:-}" ] && [ "${ngpu:-0}" -ge 2 ] && [ -z "${ONE_GPU:-}" ]; then
  # Two GPUs: the halves run side by side, one per GPU, so the whole suite fits one call.
  echo "== two GPUs: the suite's halves side by side (ONE_GPU=1 runs it on one)" | tee -a "$OUT/suite.log"
  run_tests 0 "$TESTS_CACHE/a" "$TESTS_CACHE/a.log" tests $(printf -- '--ignore=%s ' $HALF_B) &
  pid_a=$!
  run_tests 1 "$TESTS_CACHE/b" "$TESTS_CACHE/b.log" $HALF_B &
  pid_b=$!
  wait "$pid_a"; status_a=$?
  wait "$pid_b"; status_b=$?
  status=$(( status_a > status_b ? status_a : status_b ))
  parts="a b"
else
  run_tests "" "$TESTS_CACHE/a" "$TESTS_CACHE/a.log" ${GPU_TESTS:-tests}
  status=$?
  parts="a"
fi
: > "$OUT/worker_tests.log"
for p in $parts; do
  { if [ "$parts" != "a" ]; then echo "== half $p"; fi; cat "$TESTS_CACHE/$p.log"; } | tee -a "$OUT/suite.log"
  cat "$TESTS_CACHE/$p"/worker-gpu*.log >> "$OUT/worker_tests.log" 2>/dev/null || true
done
{ echo "== test durations, slowest first (also of tests cut off by the time limit's end)"
  cat "$TESTS_CACHE"/*/test_times.txt 2>/dev/null | sort -rn | head -40
  cat "$TESTS_CACHE"/*/test_times.txt 2>/dev/null | awk '{s += $1} END {printf "total %.0f s in %d tests\n", s, NR}'; } >> "$OUT/suite.log"
cp -f "$TESTS_CACHE/a/baselines.json" "$OUT/baselines_tests.json" 2>/dev/null || true
cp -f "$TESTS_CACHE"/*/cupti_counters.json "$OUT/" 2>/dev/null || true  # what each counter read (PART=4)

left=$(( CALL_S - (SECONDS - START) ))
if [ -n "${SKIP_BENCH:-}" ] || [ "$left" -lt 60 ]; then
  echo "bench skipped (${SKIP_BENCH:+SKIP_BENCH set; }${left} s left in the call)" | tee "$OUT/bench.log"
else
  timeout "$(( left < ${BENCH_TIMEOUT:-200} ? left : ${BENCH_TIMEOUT:-200} ))" "$PY" scripts/bench_harness.py --out "$OUT" \
    --cache "$BENCH_CACHE" --skip-do-bench 2>&1 | tee "$OUT/bench.log"
fi
cp -f "$BENCH_CACHE"/worker-gpu*.log "$OUT/worker_bench.log" 2>/dev/null || true
echo "gpu tests exit status: $status" | tee -a "$OUT/suite.log"
exit "$status"
