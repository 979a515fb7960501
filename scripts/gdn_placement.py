"""Does where the buffers lie decide the GDN decode expert's speed? (a development probe, GPU)

The expert's run times were bimodal per evaluation (each evaluation allocates its own buffers) while
fla's were not. This times the expert (and any scripts/expert_dev.py variants) and fla's
fused_recurrent on the same state buffer, placed at chosen offsets inside one pool (state and new_state
apart by a multiple of 2 MiB, or off it by 256 B .. 1 MiB; the state off a 2 MiB boundary) and in fresh
allocations laid out as the evaluator's guarded tensors are (64 KiB guard, 256 B aligned). Every run cold
(L2 flushed by a 256 MiB memset, then the stream held ~1 ms so the host's issue time is not timed),
the two kernels alternating run by run, the order flipped per pair.

    python3 scripts/gdn_placement.py qk8:8 qk4:64 --reps 30 --variants tile --json out.json

Per placement: our and fla's median and 10th/90th percentile (us), the median per-pair ratio (fla / ours:
the speedup), and `slow`: the share of our runs more than 0.3 us (and 3%) above our fastest decile
(bimodality shows as a share well between 0 and 1, or as a placement whose median moves).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TASKS = {"qk4": "gdn_decode_qk4_v8_d128_k_last", "qk8": "gdn_decode_qk8_v16_d128_k_last"}
MIB = 1 << 20


def _pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p * (len(s) - 1) + 0.5))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="+", help="qk4:B or qk8:B (batch size), optionally :V1,V2 (variants for this case only)")
    ap.add_argument("--reps", type=int, default=30, help="timed pairs per placement")
    ap.add_argument("--variants", default="", help="scripts/expert_dev.py variants timed too (comma-separated)")
    ap.add_argument("--fresh", type=int, default=4, help="fresh guarded allocations per case")
    ap.add_argument("--no-pool", action="store_true", help="fresh allocations only")
    ap.add_argument("--json", default="", help="write every run's times here")
    args = ap.parse_args()
    bad = [c for c in args.cases if c.split(":")[0] not in TASKS or len(c.split(":")) < 2 or not c.split(":")[1].isdigit()]
    if bad:
        ap.error(f"cases are qk4:B or qk8:B (optionally :VARIANTS), not {', '.join(bad)}")  # exit 2
    from scripts.expert_dev import VARIANTS

    known = VARIANTS["gdn_decode_qk4_v8_d128_k_last"]
    asked = args.variants.split(",") + [v for c in args.cases for v in (c.split(":")[2].split(",") if c.count(":") > 1 else [])]
    unknown = sorted({v for v in asked if v and v not in known})
    if unknown:
        ap.error(f"unknown variant(s) {', '.join(unknown)} (scripts/expert_dev.py's GDN decode variants: {', '.join(known)})")

    from tools.evaluator import require_gpu

    require_gpu("scripts/gdn_placement.py")

    import tempfile

    import torch

    from scripts.expert_dev import variant
    from tasks import get_task
    from tasks.families.baselines import make_baseline
    from tasks.generators import generate_inputs
    from tools.compile import compile_solution
    from tools.correctness import GUARD_BYTES, TORCH_DTYPES
    from tools.launch import Bound, DeviceLimits, Module, plan_launches
    from tools.solution import Solution

    torch.zeros(1, device="cuda")
    props = torch.cuda.get_device_properties(0)
    limits = DeviceLimits(num_sms=props.multi_processor_count, max_smem_per_block=232448)
    flush = torch.empty(256 * MIB, dtype=torch.uint8, device="cuda")
    tmp = Path(tempfile.mkdtemp(prefix="gdn-placement-"))
    names = ["shipped"] + [v for v in args.variants.split(",") if v and v != "shipped"]
    out: list[dict] = []
    built: dict[str, object] = {}

    def cold(fn) -> tuple:
        flush.zero_()
        torch.cuda._sleep(2_000_000)  # ~1 ms: the host issues fn's launches (fla's Python wrapper too) before the start event
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        return a, b

    for case in args.cases:
        cfg, bs, *more = case.split(":")
        task = get_task(TASKS[cfg])
        axes = task.axis_values({"batch_size": int(bs)})
        case_names = names + [v for v in (more[0].split(",") if more else []) if v and v not in names]
        sols = {n: (Solution.from_dir(ROOT / "tasks" / task.name / "expert") if n == "shipped"
                    else variant(task.name, n, tmp)) for n in case_names}
        mods = {}
        for n, sol in sols.items():
            if sol.source not in built:  # both head configurations run one module
                comp = compile_solution(sol, "sm_90a")
                assert comp.ok, f"{n}: {comp.error}"
                built[sol.source] = Module(comp.cubin, comp.symbols)
            mods[n] = (built[sol.source], plan_launches(sol.manifest, task, axes, limits))
        inputs = generate_inputs(task, axes, 7, device="cuda", fast=True)
        _, plan0 = mods["shipped"]
        dtype, shape = plan0.tensors["state"]
        nbytes = inputs["state"].numel() * 4
        span = -(-nbytes // (2 * MIB)) * 2 * MIB
        others = {n: torch.empty(plan0.tensors[n][1], dtype=TORCH_DTYPES[plan0.tensors[n][0]], device="cuda")
                  for n in task.outputs if n != "new_state"}

        placements: list[tuple[str, torch.Tensor, torch.Tensor]] = []
        if not args.no_pool:
            pool = torch.empty(2 * span + 8 * MIB, dtype=torch.uint8, device="cuda")
            base = (-pool.data_ptr()) % (2 * MIB)

            def at(off: int) -> torch.Tensor:
                return pool[base + off: base + off + nbytes].view(torch.float32).view(shape)

            for label, s_off, n_off in (
                    ("pool s@0 n@span", 0, span), ("pool s@0 n@span+256", 0, span + 256),
                    ("pool s@0 n@span+4K", 0, span + 4096), ("pool s@0 n@span+64K", 0, span + 65536),
                    ("pool s@0 n@span+1M", 0, span + MIB), ("pool s@64K n@span+64K", 65536, span + 65536),
                    ("pool s@256 n@span+256", 256, span + 256), ("pool s@1M n@span+3M", MIB, span + 3 * MIB),
                    ("pool n@0 s@span", span, 0), ("pool s@0 n@span (again)", 0, span)):
                placements.append((label, at(s_off), at(n_off)))
        keep = []
        for i in range(args.fresh):  # as the evaluator: Guarded (64 KiB guard, 256 B aligned), state then new_state
            raws = [torch.empty(2 * GUARD_BYTES + nbytes + 512, dtype=torch.uint8, device="cuda") for _ in range(2)]
            keep.append(raws)
            ts = []
            for r in raws:
                start = GUARD_BYTES + (-(r.data_ptr() + GUARD_BYTES)) % 256
                ts.append(r[start:start + nbytes].view(torch.float32).view(shape))
            placements.append((f"fresh {i}", ts[0], ts[1]))

        for label, st, ns in placements:
            st.copy_(inputs["state"])
            x = {**inputs, "state": st}
            lib = make_baseline(task, x)
            runs = {}
            for n, (mod, plan) in mods.items():
                ptrs = {k: t.data_ptr() for k, t in x.items()} | {k: t.data_ptr() for k, t in others.items()}
                ptrs["new_state"] = ns.data_ptr()
                runs[n] = Bound(plan, mod, ptrs).launch
            # the device-to-device copy of the same bytes into the same new_state: the placement's own ceiling
            sides = list(runs.items()) + [("fla", lib.run), ("copy", lambda st=st, ns=ns: ns.copy_(st))]
            for _, fn in sides:  # warm
                fn()
            ref = lib.run()  # fla's answer on this placement: each of ours is checked against it
            err = {}
            for n, fn in runs.items():
                others["output"].zero_()
                ns.zero_()
                fn()
                err[n] = max(float((ns - ref["new_state"]).norm() / ref["new_state"].norm()),
                             float((others["output"].float() - ref["output"].float()).norm() / ref["output"].float().norm()))
            times: dict[str, list[float]] = {n: [] for n, _ in sides}
            for rep in range(args.reps):
                order = sides if rep % 2 == 0 else sides[::-1]
                evs = [(n, cold(fn)) for n, fn in order]
                torch.cuda.synchronize()
                for n, (a, b) in evs:
                    times[n].append(a.elapsed_time(b) * 1000)
            row = {"case": case, "placement": label, "err": err, "state_mod_2M": st.data_ptr() % (2 * MIB),
                   "new_minus_state": ns.data_ptr() - st.data_ptr(), "us": times}
            out.append(row)
            f = times["fla"]
            parts = []
            for n in runs:
                t = times[n]
                fast = _pct(t, 0.1)
                slow = sum(1 for v in t if v > fast + max(0.3, 0.03 * fast)) / len(t)
                ratio = statistics.median(fv / tv for fv, tv in zip(f, t))
                parts.append(f"{n} {statistics.median(t):6.2f} [{fast:6.2f},{_pct(t, 0.9):6.2f}] x{ratio:.3f} slow {slow:.2f}"
                             + (f" ERR {err[n]:.1e}" if not err[n] < 1e-2 else ""))
            c = times["copy"]
            print(f"{case:<7} {label:<24} s%2M {row['state_mod_2M'] // 1024:>5}K d {row['new_minus_state'] / MIB:+9.3f}M | "
                  + " | ".join(parts) + f" | fla {statistics.median(f):6.2f} [{_pct(f, 0.1):6.2f},{_pct(f, 0.9):6.2f}]"
                  f" | copy {statistics.median(c):6.2f} [{_pct(c, 0.1):6.2f},{_pct(c, 0.9):6.2f}]", flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(out))
        del keep, placements
    return 0


if __name__ == "__main__":
    sys.exit(main())
