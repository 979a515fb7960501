"""The attention references on tensor cores (tasks.families.attention.exact_reference) against the
sources run in IEEE fp32, at full size on this GPU: seconds of each, and the largest difference over
the task's elementwise bound (against the term scales) and over the term scale.

    python scripts/probe_exact_reference.py [--cases mha_bwd_d128:S4096,...] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CASES = "mha_bwd_d128:S4096,mha_bwd_d128:S8192,mha_bwd_d128_causal:S8192,mha_fwd_d128:S8192,mha_bwd_d128:S77"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=CASES)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    cases = [c.split(":") for c in args.cases.split(",") if c]
    if any(len(c) != 2 for c in cases):
        print("probe_exact_reference: --cases takes task:workload,...", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("probe_exact_reference: skipped: no CUDA device", file=sys.stderr)
        return 2
    from tasks import get_task
    from tasks.families.attention import exact_reference
    from tasks.generators import generate_inputs
    from tasks.reference import reference_function, run_reference, term_scales

    rows = []
    for name, wl_name in cases:
        task = get_task(name)
        wl = next(w for w in task.workloads if w.name == wl_name)
        x = generate_inputs(task, task.axis_values(wl), 11, device="cuda", fast=True)
        row = {"task": name, "workload": wl_name}
        for label, fn in (("ieee_s", lambda: run_reference(task, x)), ("exact_s", lambda: exact_reference(task, x))):
            for _ in range(2):  # the second is what a warm worker pays
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                out = fn()
                torch.cuda.synchronize()
                row[label] = round(time.perf_counter() - t0, 4)
            row[label[:-2]] = out
        if row["exact"] is None:
            row.update(exact=None, note="exact_reference did not apply")
            rows.append({k: v for k, v in row.items() if k not in ("ieee", "exact")})
            print(json.dumps(rows[-1]), flush=True)
            continue
        scales = term_scales(task, x)
        for n in task.outputs:
            ref, fast = row["ieee"][n], row["exact"][n]
            s = ref.abs() if scales.get(n) is None else torch.maximum(ref.abs(), scales[n])
            diff = (fast - ref).abs()
            row[f"{n}_err_over_bound"] = float((diff / (task.tolerance.atol + task.tolerance.rtol * s)).max())
            row[f"{n}_err_over_scale"] = float((diff / s.clamp_min(1e-30)).max())
            row[f"{n}_nan"] = int(torch.isnan(fast).sum())
        del row["ieee"], row["exact"]
        rows.append(row)
        print(json.dumps(rows[-1]), flush=True)
        del x, scales
        torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
