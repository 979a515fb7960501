#!/usr/bin/env bash
# Mutation testing of the modules that decide verdicts and runs, one module at a time.
#
#   scripts/mutation.sh                                  every module in pyproject's [tool.ptxbench.mutation]
#   scripts/mutation.sh tools/expressions.py agent/budget.py
#
# Each module runs in its own scratch copy of the working tree (so edits made meanwhile change
# nothing, and nothing is written into the repo), under $MUTATION_DIR (default
# /tmp/ptxbench-mutation), at the lowest CPU priority with $MUTATION_JOBS workers (default 1),
# against that module's own tests only. Per module it prints the mutants, how many were killed,
# survived, had no test or timed out, the score (killed / all mutants, a mutant no test reaches
# counting as a survivor), and the survivors' names. To read one:
#   cd $MUTATION_DIR/<module> && mutmut show NAME
# The scores and why each survivor lives: docs/BENCHMARKS.md, "Mutation scores" and "Mutation scores, pass 2" (passes 3 and 4 in it),
# "Session of 2026-12-04: mutation pass 5", the "Mutation pass 6", "pass 7" and "pass 8" sections (38 modules in all).
# Not run by CI (.ci/run runs `pytest -m "not gpu"` only): run it by hand after changing a module.
# How long, on a 2-core machine shared with other work (one worker): 1-9 minutes a module,
# agent/feedback.py 18, knowledge/retriever.py 14, tools/credit.py 21 (all of it, 1219 mutants),
# agent/nodes.py 20 (all of it, 1647); measured 2026-12-03 with six or seven other jobs on the two
# cores, all 27 modules: about 2.5 hours (re-running a module's survivors after new tests: minutes). Pass 5
# (2026-12-04, MUTATION_JOBS=2 on the same shared 2 cores): 18 changed modules in about 46 minutes, the
# slowest knowledge/retriever.py 8, tools/correctness.py 7.5 (its entry widened; one worker), tools/cupti.py 5.
# Pass 6 (2026-12-04, MUTATION_JOBS=2, four jobs on the 2 cores): counted 2.6-7, credit 5.5-17, workspace
# 1.6-4, timed 0.7-1.1, launch 1.9-11, timing 1.3-7, report 2.4-10, describe 5, prompts 2 minutes (quiet-load
# figure first). Pass 7 (one worker, 2 cores shared): worker 1.8, reference 3, gdn 2.2, fp8_attention 0.8 minutes.
# Pass 8 (one worker, 2 cores shared): stress 0.9, generators 1.4-2.8, roofline 0.6, ceilings 0.6, fp8_gemm 1.6
# minutes; gdn's generator functions alone 5.5, all of gdn.py (1,422 mutants) over 28 minutes (stopped at 1,104).
# All 38 modules one after another, 2 workers on an idle 2-core machine: about 90 minutes (the sum of each
# module's latest wall time; not run as one set).
# Under such load a slow test can read as a "timeout" (counted as killed below): re-run those by
# name (cd $MUTATION_DIR/<module> && mutmut run NAME ...) before trusting a score.
# MUTATION_JOBS=N checks N mutants at a time where N cores are free.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$repo/.venv/bin/python}
work=${MUTATION_DIR:-/tmp/ptxbench-mutation}
jobs=${MUTATION_JOBS:-1}

modules=("$@")
if [ ${#modules[@]} -eq 0 ]; then
  mapfile -t modules < <("$py" -c '
import sys, tomllib
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["tool"]["ptxbench"]["mutation"]))' "$repo/pyproject.toml")
fi

for module in "${modules[@]}"; do
  dest="$work/$(echo "${module%.py}" | tr / _)"
  rm -rf "$dest" && mkdir -p "$dest"
  # The working tree as it is (tracked and new files; a file deleted but not yet committed is skipped).
  (cd "$repo" && git ls-files -co --exclude-standard -z | tar --null --ignore-failed-read -T - -cf - 2>/dev/null) \
    | tar -xf - -C "$dest"
  # mutmut reads [tool.mutmut] from the copy's pyproject: narrow it to this module and its tests.
  "$py" - "$dest/pyproject.toml" "$module" > "$dest/.mutation-functions" <<'PY'
import json, re, sys, tomllib
path, module = sys.argv[1:]
text = open(path).read()
entry = tomllib.loads(text)["tool"]["ptxbench"]["mutation"].get(module)
if entry is None:
    sys.exit(f"{module}: not listed in [tool.ptxbench.mutation] of pyproject.toml")
base = tomllib.loads(text)["tool"]["mutmut"]
text = re.sub(r"(?ms)^\[tool\.mutmut\]\n.*?(?=^\[|\Z)", "", text)
conf = {**base, "only_mutate": [module], "pytest_add_cli_args_test_selection": entry["tests"]}
text += "\n[tool.mutmut]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in conf.items())
open(path, "w").write(text)
sys.stdout.write("".join(f + "\n" for f in entry.get("functions", [])))
PY
  mapfile -t functions < "$dest/.mutation-functions"
  echo "== $module (tests: $(grep -A0 '^pytest_add_cli_args_test_selection' "$dest/pyproject.toml" | cut -d= -f2-))"
  start=$(date +%s)
  # One OpenMP thread: mutmut forks each mutant's pytest from a process whose torch already started
  # its OpenMP pool, and a forked child's first parallel op can spin until the CPU limit (a false
  # "timeout" counted as killed).
  (cd "$dest" && OMP_NUM_THREADS=1 nice -n 19 "$py" -m mutmut run --max-children "$jobs" "${functions[@]}" \
    > mutmut.log 2>&1) \
    || { echo "mutmut failed for $module; see $dest/mutmut.log"; tail -20 "$dest/mutmut.log"; continue; }
  (cd "$dest" && "$py" - "$module" "$(( $(date +%s) - start ))" "${functions[@]}" <<'PY'
import fnmatch, json, sys
from collections import Counter
from mutmut.stats import status_by_exit_code

module, seconds, globs = sys.argv[1], sys.argv[2], sys.argv[3:]
codes = json.load(open(f"mutants/{module}.meta"))["exit_code_by_key"]
codes = {k: v for k, v in codes.items() if not globs or any(fnmatch.fnmatch(k, g) for g in globs)}
status = {k: status_by_exit_code[v] for k, v in codes.items()}
n = Counter(status.values())
killed = n["killed"] + n["timeout"] + n["caught by type check"]
total = len(status) - n["skipped"]
score = 100.0 * killed / total if total else float("nan")
print(f"{module}: {total} mutants, {n['killed']} killed, {n['timeout']} timeout, {n['survived']} survived, "
      f"{n['no tests']} no test, {n['suspicious']} suspicious, {n['not checked']} not checked; "
      f"score {score:.1f}% ({seconds} s)")
for k in sorted(k for k, s in status.items() if s not in ("killed", "timeout", "caught by type check", "skipped")):
    print(f"  {status[k]}: {k}")
PY
  )
done
