#!/bin/bash
# bwdexp W2: the expert as shipped on this tree, both masks, every workload, credit on (executed check),
# one evaluator; then, if time is left, variants on the visible workload.
mkdir -p $HOUT
t0=$(date +%s)
timeout -k 2 74 python3 - > $HOUT/final.txt 2>&1 <<'PY'
import importlib.util, json, sys, time
from pathlib import Path
spec = importlib.util.spec_from_file_location("ed", "scripts/expert_dev.py"); ed = importlib.util.module_from_spec(spec); spec.loader.exec_module(ed)
from tools.evaluator import Evaluator
from tools.solution import Solution
with Evaluator(timeout_s=60.0) as ev:
    for task in ("mha_bwd_d128", "mha_bwd_d128_causal"):
        t = time.time()
        r = ev.evaluate(Solution.from_dir(Path("tasks") / task / "expert"), task, "sm_90a", workloads="all", executed_check=True)
        print(f"{task} correct {r.correct} correct_with_arch {r.correct_with_arch} speedup {r.speedup} "
              f"({time.time() - t:.1f} s) {(r.executed.notes if r.executed else '') or ''}", flush=True)
        for w in r.workloads:
            print(f"  {w.workload:<6} {w.split:<9} {w.status:<8} {w.speedup or 0:.3f} {w.timing.median_ms if w.timing else 0:.4g} ms "
                  f"lib {w.baseline.median_ms if w.baseline else 0:.4g} ms {w.reason or ''}", flush=True)
        Path(f"{__import__('os').environ['HOUT']}/{task}.json").write_text(r.model_dump_json(indent=1))
    # VARIANTS_HERE
PY
echo "rc=$? $(( $(date +%s) - t0 ))s"
grep -v "^\s*$" $HOUT/final.txt | grep -v Traceback | tail -30
