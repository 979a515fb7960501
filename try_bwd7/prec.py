"""bwd7 (temporary): relative L2 error of the attention-backward expert variants and of cuDNN against the task's fp32
reference, whole outputs and the judge's 256 sampled rows, over fresh input sets (the timed runs' fast generator).

    python3 try_bwd7/prec.py VARIANT[,VARIANT...] DRAWS TASK:S:SEEDS ...   (variants: scripts/expert_dev.py; "cudnn")
"""
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import torch  # noqa: E402

DEVICE = os.environ.get("PREC_DEVICE", "cuda")
T0 = time.time()


def main():
    names, draws = sys.argv[1].split(","), int(sys.argv[2])
    if DEVICE == "cuda":
        from cuda.bindings import driver as d

        from tools.launch import check

        torch.zeros(1, device="cuda")
        check(d.cuInit(0), "cuInit")
    for job in sys.argv[3:]:
        task_name, S, seeds = job.split(":")
        try:
            one(names, draws, task_name, int(S), int(seeds))
        except Exception as e:  # noqa: BLE001 - the next job may still run
            print(f"{job} EXC {type(e).__name__}: {e}", flush=True)


_COMPILED = {}


def one(names, draws, task_name, S, seeds):
    from tasks import get_task
    from tasks.generators import generate_inputs
    from tasks.reference import run_reference
    from tasks.sampled import rows_for, sample, view_rows

    task = get_task(task_name)
    axes = task.axis_values({"S": S})
    runners = {}
    if DEVICE == "cuda":
        from tasks.families.baselines import make_baseline
        from tools.evaluator import _compile
        from tools.launch import NOMINAL_LIMITS, Bound, Module, plan_launches
        from tools.workspace import Workspace

        spec = importlib.util.spec_from_file_location("expert_dev", ROOT / "scripts" / "expert_dev.py")
        dev = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(dev)
        tmp = Path(tempfile.mkdtemp())
        for name in names:
            if name == "cudnn":
                continue
            sol = dev.variant(task_name, name, tmp)
            if (task_name, name) not in _COMPILED:
                _COMPILED[task_name, name] = _compile(sol, "sm_90a")
            comp = _COMPILED[task_name, name]
            if not comp.cubin:  # one variant that does not build must not cost the others' figures
                print(f"# {task_name} {name}: compile failed: {comp.error}", flush=True)
                continue
            plan = plan_launches(sol.manifest, task, axes, NOMINAL_LIMITS["sm_90a"])
            ws = Workspace(task, plan, "cuda")
            bound = Bound(plan, Module(comp.cubin, getattr(comp, "symbols", None) or None), ws.pointers())

            def run(inputs, ws=ws, bound=bound):
                ws.load_inputs(inputs)
                ws.reset()
                bound.launch()
                torch.cuda.synchronize()
                return {n: t.clone() for n, t in ws.outputs.items()}
            runners[name] = run
        if "cudnn" in names:
            def run_cudnn(inputs):
                b = make_baseline(task, inputs)
                b.prepare()
                out = {n: t.clone() for n, t in b.run().items()}
                torch.cuda.synchronize()
                return out
            runners["cudnn"] = run_cudnn
    else:  # CPU dry run of the bookkeeping: "kernels" are the reference plus bf16 rounding
        for name in names:
            runners[name] = lambda inputs: {n: t.to(torch.bfloat16) for n, t in run_reference(task, inputs).items()}
    import gc

    gc.collect()
    print(f"# {task_name} S={S} setup {time.time() - T0:.1f}s", flush=True)

    def rel(g, e):
        return float((g.float() - e.float()).norm() / e.float().norm())

    whole = {n: {o: [] for o in task.outputs} for n in runners}
    sampled = {n: {o: [] for o in task.outputs} for n in runners}
    for seed in range(seeds):
        inputs = generate_inputs(task, axes, 1000 + seed, device=DEVICE, fast=True)
        outs = {n: r(inputs) for n, r in runners.items()}
        ref = run_reference(task, inputs)
        for n, out in outs.items():
            for o in task.outputs:
                whole[n][o].append(rel(out[o], ref[o]))
        del ref
        gen = torch.Generator(device=DEVICE)
        gen.manual_seed(77 + seed)
        for _ in range(draws):
            smp = sample(task, inputs, gen, rows_for(task))
            for n, out in outs.items():
                for o, s in smp.items():
                    sampled[n][o].append(rel(view_rows(out[o])[s.rows], s.expected))
        line = " ".join(f"{n}:" + ",".join(f"{o}={whole[n][o][-1]:.2e}" for o in task.outputs) for n in runners)
        print(f"  seed {seed} ({time.time() - T0:.1f}s) whole {line}", flush=True)
    print(f"## {task_name} S={S}: rel-L2 over {seeds} input sets (whole) and {seeds * draws} draws of "
          f"{rows_for(task)} rows (sampled); bound 5e-3")
    print("| kernel | output | whole median | whole max | sampled median | sampled p99 | sampled max | sampled > 5e-3 |")
    print("|---|---|---|---|---|---|---|---|")
    for n in runners:
        for o in task.outputs:
            w, s = whole[n][o], sorted(sampled[n][o])
            p99 = s[min(len(s) - 1, int(0.99 * len(s)))] if s else float("nan")
            print(f"| {n} | {o} | {statistics.median(w):.3e} | {max(w):.3e} | "
                  f"{statistics.median(s) if s else float('nan'):.3e} | {p99:.3e} | {max(s) if s else float('nan'):.3e} | "
                  f"{sum(x > 5e-3 for x in s)}/{len(s)} |", flush=True)
    out = os.environ.get("HOUT")
    if out:
        Path(out, f"prec_{task_name}_S{S}.json").write_text(json.dumps({"whole": whole, "sampled": sampled}))


if __name__ == "__main__":
    main()
