"""The development harness of the expert kernels (tasks/<task>/expert): build their variants and
check them on a GPU, through the project's own compile, SASS inspection and evaluator.

A variant is the expert's kernel.cu with some of its `#ifndef` knobs defined (STAGES, CLUSTER_M,
PINGPONG, ...) and, where a knob changes what the host must launch, the manifest's main launch
(the one with the most dynamic shared memory) overridden to match.

    python scripts/expert_dev.py build TASK [VARIANT ...]    # CPU: registers, smem, spills, ptxas
                                                             # warnings, requested features in the SASS
    python scripts/expert_dev.py check TASK [VARIANT ...] [--workloads all]
                                                             # GPU: correctness and speedup against the
                                                             # library, the evaluator's own verdict
Tasks with variants: see VARIANTS (the causal folders share their non-causal kernel's knobs).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.solution import Solution  # noqa: E402

_GEMM_SPLITS = "max(1, min(8, num_sms // (cdiv(M, 128) * (N // 256))))"
# Two CTAs of a cluster share a 256-column tile of B: each loads half of it.
_GEMM_CLUSTER2 = {"cluster": [2, 1, 1], "box": {"tmB": [128, 64]},
                  "grid": [f"min(num_sms // 2 * 2, 2 * cdiv(M, 256) * (N // 256) * ({_GEMM_SPLITS}))"]}


def _bwd_smem(stages: int = 2, comp: int = 0, tma: int = 1) -> int:
    """The backward's main kernel: 1 KiB alignment slack, K, V, STAGES x (Q, dO, LSE/Delta), dS
    (twice with DQ_COMP), the dQ staging tile (DQ_TMA), barriers; rounded up to 128 bytes."""
    raw = 1024 + 65536 + stages * 33280 + 32768 * (1 + comp) + 32768 * tma + 8 * (1 + 2 * stages)
    return -(-raw // 128) * 128


_FWD_ST2 = {"shared_bytes": 1024 + 32768 * 5 + 256}
_FWD = {
    "shipped": ({}, {}),  # kernel.cu defaults: PINGPONG=1, STAGES=3
    "pp": ({"STAGES": 2}, _FWD_ST2),
    "base": ({"PINGPONG": 0, "STAGES": 2}, _FWD_ST2),  # no ping-pong between the two consumer warpgroups
    "split": ({"PINGPONG": 0, "STAGES": 2, "PV_SPLIT": 1}, _FWD_ST2),  # P V as two n64 wgmmas
}
_BWD = {
    "shipped": ({}, {}),  # kernel.cu defaults: DQ_TMA=1, DQ_DEFER=1, STAGES=2
    "st3": ({"STAGES": 3}, {"shared_bytes": _bwd_smem(stages=3)}),
    "tma": ({"DQ_DEFER": 0, "STAGES": 2}, {"shared_bytes": _bwd_smem()}),  # TMA reduce-add of a staged dQ tile
    "defer": ({"DQ_TMA": 0, "STAGES": 2}, {"shared_bytes": _bwd_smem(tma=0)}),  # per-thread reds, drained later
    "v2": ({"DQ_TMA": 0, "DQ_DEFER": 0, "STAGES": 2}, {"shared_bytes": _bwd_smem(tma=0)}),
    "comp": ({"DQ_COMP": 1, "STAGES": 2}, {"shared_bytes": _bwd_smem(comp=1)}),  # dQ from dS = hi + lo
}
_FP8_SPLITS_C2 = "max(1, min(8, num_sms // (2 * cdiv(m, 256) * (n // 256))))"
_FP8_SPLITS_MAX4 = "max(1, min(4, num_sms // (cdiv(m, 128) * (n // 256))))"
_FP8_SPLITS128 = "max(1, min(8, num_sms // (cdiv(m, 128) * (n // 128))))"
_FP8_BN128 = {"box": {"tmB": [128, 128]}, "shared_bytes": 1024 + 6 * 32768 + 32768 + 112,
              "grid": [f"min(num_sms, cdiv(m, 128) * (n // 128) * ({_FP8_SPLITS128}))"],
              "args": ["tmA", "tmB", "tmD", "SF_A", "SF_B", "ws", "counters", "m", "n", "k",
                       {"name": "splits", "type": "i32", "value": _FP8_SPLITS128}]}
_FP8 = {
    "shipped": ({}, {}),  # kernel.cu defaults: BN=256 (two 128-column passes per K block), STAGES=4, GROUP_M=8, SPLIT_RED=1
    # 128x128 tiles, one pass per K block; the manifest's ws (sized for BN=256's splits) is large enough.
    "bn128": ({"BN": 128, "STAGES": 6}, _FP8_BN128),
    # bn128 with two partials: K block kb+1's wgmmas run while kb is promoted (192 accumulator registers)
    "pipe": ({"BN": 128, "STAGES": 6, "PIPE": 1}, _FP8_BN128),
    "g16": ({"GROUP_M": 16}, {}),  # tiles visited in groups of 16 rows of tiles (shipped before 2026-12-03 W1)
    # split K at most 4 ways (M = 70: 16 tiles x 4 instead of x 8; the fix-up reads 3 partials, not 7)
    "s4": ({}, {"grid": [f"min(num_sms, cdiv(m, 128) * (n // 256) * ({_FP8_SPLITS_MAX4}))"],
                "args": ["tmA", "tmB", "tmD", "SF_A", "SF_B", "ws", "counters", "m", "n", "k",
                         {"name": "splits", "type": "i32", "value": _FP8_SPLITS_MAX4}]}),
    # clusters of 2 CTAs on vertically adjacent tiles, each loading half of B for both (multicast)
    "c2": ({"CLUSTER_M": 2}, {"cluster": [2, 1, 1], "box": {"tmB": [128, 128]},
                              "grid": [f"min(num_sms // 2 * 2, 2 * cdiv(m, 256) * (n // 256) * ({_FP8_SPLITS_C2}))"],
                              "args": ["tmA", "tmB", "tmD", "SF_A", "SF_B", "ws", "counters", "m", "n", "k",
                                       {"name": "splits", "type": "i32", "value": _FP8_SPLITS_C2}]}),
}
VARIANTS: dict[str, dict[str, tuple[dict[str, int], dict]]] = {
    "fp8_gemm_nt_1d2d_n4096_k7168": _FP8,
    "gemm_n7168_k5120": {
        "tma_c1": ({}, {}),  # the shipped configuration
        "direct_c1": ({"EPI_TMA": 0}, {}),  # C stored from registers, not through a TMA store
        "tma_c2": ({"CLUSTER_M": 2}, _GEMM_CLUSTER2),
        "tma_c1_g8": ({"GROUP_M": 8}, {}),  # tiles visited in groups of 8 rows of tiles (L2 reuse)
        "direct_c2": ({"EPI_TMA": 0, "CLUSTER_M": 2}, _GEMM_CLUSTER2),
    },
    "mha_fwd_d128": _FWD, "mha_fwd_d128_causal": _FWD, "mha_bwd_d128": _BWD, "mha_bwd_d128_causal": _BWD,
}


def variant(task: str, name: str, into: Path) -> Solution:
    """The expert of `task` with variant `name`'s knobs and launch overrides, as a solution folder."""
    expert = ROOT / "tasks" / task / "expert"
    defines, over = VARIANTS[task][name]
    src = "".join(f"#define {k} {v}\n" for k, v in defines.items()) + (expert / "kernel.cu").read_text()
    manifest = json.loads((expert / "launch.json").read_text())
    main = max(manifest["launches"], key=lambda launch: int(launch.get("shared_bytes", 0) or 0))
    for key, value in over.items():
        if key == "box":
            for tm in manifest.get("tensor_maps", []):
                tm["box"] = value.get(tm["name"], tm["box"])
        else:
            main[key] = value
    folder = into / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kernel.cu").write_text(src)
    (folder / "launch.json").write_text(json.dumps(manifest, indent=1))
    return Solution.from_dir(folder)


def build(task: str, names: list[str]) -> int:
    from tasks import get_task
    from tools.evaluator import Evaluator

    wanted = get_task(task).features_for("sm_90a")
    with tempfile.TemporaryDirectory(prefix="expert-dev-") as tmp:
        for name in names:
            comp, insp = Evaluator.compile_and_inspect(variant(task, name, Path(tmp)), "sm_90a")
            print(f"== {task} {name}: {comp.status}" + (f" ({comp.error})" if comp.error else ""))
            for kernel, k in (comp.kernels or {}).items():
                print(f"   {kernel}: {k.registers} registers, {k.shared_bytes} B static smem, "
                      f"{k.spill_stores}/{k.spill_loads} B spilled, {k.stack_frame} B stack")
            for d in comp.diagnostics:
                if d.code in ("C7515", "C7508") or d.severity == "warning":
                    print(f"   ptxas {d.severity} {d.code or ''}: {d.message}")
            if insp.status == "ok":
                print(f"   requested in the SASS: {', '.join(f'{f} {insp.feature_present(f)}' for f in wanted)}; "
                      f"flags {dict(insp.flags)}")
    return 0


def check(task: str, names: list[str], workloads: str, only: str | None = None) -> int:
    from tasks import get_task
    from tools.evaluator import Evaluator

    target = get_task(task)
    if only:  # one workload of the task, judged and timed as if it were the visible one
        picked = [w for w in target.workloads if w.name == only]
        if not picked:
            raise SystemExit(f"{task} has no workload {only!r} (it has {', '.join(w.name for w in target.workloads)})")
        target = target.model_copy(update={"workloads": [picked[0].model_copy(update={"split": "visible"})]})
        workloads = "visible"
    rows = []
    with tempfile.TemporaryDirectory(prefix="expert-dev-") as tmp, Evaluator() as ev:
        for name in names:
            r = ev.evaluate(variant(task, name, Path(tmp)), target, "sm_90a", workloads=workloads)
            times = ", ".join(f"{w.workload} {w.timing.median_ms:.4g} ms" for w in r.workloads if w.timing)
            bad = [f"{w.workload}: {w.reason}" for w in r.workloads if w.status != "passed"]
            rows.append((name, r.correct, r.split_correct("held_out"), r.speedup, times, "; ".join(bad)))
            # each row as soon as it is known: a run cut short by its time slot keeps what it measured
            print(f"{name}: correct {r.correct}, speedup {r.speedup or 0:.3f}, {times} {rows[-1][-1]}", flush=True)
    print(f"\n{'variant':<12} {'correct':<8} {'held-out':<9} {'speedup':<8} times / failures")
    for name, ok, held, speedup, times, bad in rows:
        print(f"{name:<12} {str(ok):<8} {str(held):<9} {speedup or 0:<8.3f} {times} {bad}")
    return 0 if all(r[1] for r in rows) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("verb", choices=["build", "check"])
    ap.add_argument("task", choices=sorted(VARIANTS))
    ap.add_argument("variants", nargs="*", help="default: every variant of the task")
    ap.add_argument("--workloads", default="visible", choices=["visible", "held_out", "all"])
    ap.add_argument("--workload", default=None, help="check: only this workload (e.g. M70), timed as the visible one")
    args = ap.parse_args()
    names = args.variants or list(VARIANTS[args.task])
    unknown = [n for n in names if n not in VARIANTS[args.task]]
    if unknown:
        ap.error(f"unknown variant(s) {', '.join(unknown)} of {args.task} (known: {', '.join(VARIANTS[args.task])})")
    if args.verb == "check":
        from tools.evaluator import require_gpu

        require_gpu("scripts/expert_dev.py check")
    return build(args.task, names) if args.verb == "build" else check(args.task, names, args.workloads, args.workload)


if __name__ == "__main__":
    sys.exit(main())
