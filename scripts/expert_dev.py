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

from tools.solution import Solution, strip_jsonc  # noqa: E402

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


def _gdn_rows(rows: int, warps: int = 4) -> dict:
    """GDN decode with a fixed tile height (the shipped manifest picks 32 or 16 by the head count)."""
    return {"box": {"tmState": [rows, "head_size"], "tmNewState": [rows, "head_size"]},
            "grid": [f"batch_size * num_v_heads * (head_size // {rows})"], "block": [32 * warps],
            "shared_bytes": rows * 512 + 128,
            "args": ["tmState", "tmNewState", "q", "k", "v", "A_log", "a", "dt_bias", "b", "output", "new_state",
                     "num_q_heads", "num_v_heads", {"type": "i32", "value": str(rows)}, "scale"]}


_GDN_SPLIT = {"box": {"tmState": ["(32 if batch_size * num_v_heads >= 256 else 16) // 4", "head_size"]}}
_GDN_DECODE = {
    "shipped": ({}, {}),  # tiles of 32 rows from 256 heads up, else 16
    "r16": ({}, _gdn_rows(16)),
    "r32": ({}, _gdn_rows(32)),
    "r64": ({}, _gdn_rows(64)),
    "cs": ({"STORE_CS": 1}, {}),  # new_state stored with st.global.cs
    "tmastore": ({"STORE_TMA": 1}, {}),  # new_state through one TMA store per tile
    "r64w8": ({"WARPS": 8}, _gdn_rows(64, 8)),
    "r32w2": ({"WARPS": 2}, _gdn_rows(32, 2)),
    "r8w2": ({"WARPS": 2}, _gdn_rows(8, 2)),  # fla's tile: 8 rows (4 KiB), here 2 warps
    "ef": ({"LOAD_EVICT_FIRST": 1}, {}),  # state loads hinted L2 evict-first
    "splitcs": ({"SPLIT_TMA": 1, "STORE_CS": 1}, _GDN_SPLIT),
    "splitef": ({"SPLIT_TMA": 1, "LOAD_EVICT_FIRST": 1}, _GDN_SPLIT),
    "split16": ({"SPLIT_TMA": 1}, {**_gdn_rows(16), "box": {"tmState": [4, "head_size"], "tmNewState": [16, "head_size"]}}),
    # one TMA load and mbarrier per warp's rows (the load box a quarter of the tile)
    "split": ({"SPLIT_TMA": 1}, _GDN_SPLIT),
}
VARIANTS: dict[str, dict[str, tuple[dict[str, int], dict]]] = {
    "gemm_n7168_k5120": {
        "tma_c1": ({}, {}),  # the shipped configuration
        "direct_c1": ({"EPI_TMA": 0}, {}),  # C stored from registers, not through a TMA store
        "tma_c2": ({"CLUSTER_M": 2}, _GEMM_CLUSTER2),
        "tma_c1_g8": ({"GROUP_M": 8}, {}),  # tiles visited in groups of 8 rows of tiles (L2 reuse)
        "direct_c2": ({"EPI_TMA": 0, "CLUSTER_M": 2}, _GEMM_CLUSTER2),
    },
    "mha_fwd_d128": _FWD, "mha_fwd_d128_causal": _FWD, "mha_bwd_d128": _BWD, "mha_bwd_d128_causal": _BWD,
    "gdn_decode_qk4_v8_d128_k_last": _GDN_DECODE, "gdn_decode_qk8_v16_d128_k_last": _GDN_DECODE,
}


def variant(task: str, name: str, into: Path) -> Solution:
    """The expert of `task` with variant `name`'s knobs and launch overrides, as a solution folder."""
    expert = ROOT / "tasks" / task / "expert"
    defines, over = VARIANTS[task][name]
    src = "".join(f"#define {k} {v}\n" for k, v in defines.items()) + (expert / "kernel.cu").read_text()
    manifest = json.loads(strip_jsonc((expert / "launch.json").read_text()))
    # (a shared_bytes given as an expression counts as 0 here: such manifests have one launch)
    main = max(manifest["launches"], key=lambda launch: launch.get("shared_bytes", 0)
               if isinstance(launch.get("shared_bytes", 0), int) else 0)
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


def check(task: str, names: list[str], workloads: str) -> int:
    from tools.evaluator import Evaluator

    rows = []
    with tempfile.TemporaryDirectory(prefix="expert-dev-") as tmp, Evaluator() as ev:
        for name in names:
            r = ev.evaluate(variant(task, name, Path(tmp)), task, "sm_90a", workloads=workloads)
            times = ", ".join(f"{w.workload} {w.timing.median_ms:.4g} ms" for w in r.workloads if w.timing)
            bad = [f"{w.workload}: {w.reason}" for w in r.workloads if w.status != "passed"]
            rows.append((name, r.correct, r.split_correct("held_out"), r.speedup, times, "; ".join(bad)))
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
    args = ap.parse_args()
    names = args.variants or list(VARIANTS[args.task])
    unknown = [n for n in names if n not in VARIANTS[args.task]]
    if unknown:
        ap.error(f"unknown variant(s) {', '.join(unknown)} of {args.task} (known: {', '.join(VARIANTS[args.task])})")
    if args.verb == "check":
        from tools.evaluator import require_gpu

        require_gpu("scripts/expert_dev.py check")
    return build(args.task, names) if args.verb == "build" else check(args.task, names, args.workloads)


if __name__ == "__main__":
    sys.exit(main())
