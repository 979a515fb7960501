"""Ship the one expert GEMM as every GEMM task's expert.

The kernel and its launch manifest are the same for every (N, K): the manifest's expressions
choose the schedule from M, N, K and num_sms (data-parallel tiles, or stream-K when the tiles
would fill at most half the SMs), and the kernel handles any N that is a multiple of 8. A
solution folder must hold its own kernel.cu and launch.json (tools.solution.Solution.from_dir
reads no references), so the other tasks' folders link to the seed task's files (relative
symbolic links, as GDN decode's qk8 expert does), written here and checked here (tests/test_gemm_experts.py runs --check):

    python scripts/gemm_experts.py          # write tasks/gemm_n*_k*/expert from the seed's
    python scripts/gemm_experts.py --check  # exit 1 if any copy is missing or differs
Edit only tasks/gemm_n7168_k5120/expert/; then run this.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tasks.families.gemm import GEMM_SHAPES, SEED_SHAPE  # noqa: E402

SOURCE = ROOT / "tasks" / f"gemm_n{SEED_SHAPE[0]}_k{SEED_SHAPE[1]}" / "expert"
COPIED = ("kernel.cu", "launch.json")
# Shapes the kernel is not shipped for until it is correct there (a wrong expert would be the
# benchmark's ceiling): task name -> the reason, measured on the H200. None now. gemm_n5376_k21504
# was withheld from 2026-12-03 (one output near zero 1.001x past the fixed atol=1e-2 at K=21504, the
# tensor cores' accumulation error, not a race: NOTES.md of the seed's expert) until the GEMM tasks
# were judged on the scale of their terms (tasks/families/gemm.py); since then it passed every
# workload, three evaluations each, with cuBLAS at the same margins (docs/METHODOLOGY.md).
WITHHELD: dict[str, str] = {}


def notes(task: str) -> str:
    return (f"# Expert sm_90a GEMM — {task}\n\n"
            f"A copy of `tasks/{SOURCE.parent.name}/expert` (kernel.cu and launch.json), written by\n"
            "`scripts/gemm_experts.py`: edit the seed task's folder, then run that script. The design,\n"
            f"the measurements and the speedup per shape are in `tasks/{SOURCE.parent.name}/expert/NOTES.md`\n"
            "and docs/BENCHMARKS.md.\n")


def expected() -> dict[Path, str]:
    """Every file the copies should hold, with its text."""
    files: dict[Path, str] = {}
    for n, k in GEMM_SHAPES:
        folder = ROOT / "tasks" / f"gemm_n{n}_k{k}" / "expert"
        if folder.parent.name in WITHHELD:
            continue
        for name in COPIED:
            files[folder / name] = (SOURCE / name).read_text()
        files[folder / "NOTES.md"] = notes(folder.parent.name)
    return files


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only check that the copies are there and current")
    args = ap.parse_args()
    want = expected()
    stale = [p for p, text in want.items()
             if not p.exists() or p.read_text() != text or (p.name in COPIED and not p.is_symlink())]
    shipped_withheld = [t for t in WITHHELD if (ROOT / "tasks" / t / "expert").exists()]
    if args.check:
        for p in stale:
            print(f"stale or missing: {p.relative_to(ROOT)} (run scripts/gemm_experts.py)")
        for t in shipped_withheld:
            print(f"withheld but present: tasks/{t}/expert ({WITHHELD[t]})")
        return 1 if stale or shipped_withheld else 0
    for p in stale:
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.name in COPIED:  # a relative link to the seed's file: one source, no copies to drift
            p.unlink(missing_ok=True)
            p.symlink_to(os.path.relpath(SOURCE / p.name, p.parent))
        else:
            p.write_text(want[p])
    print(f"{len(stale)} file(s) written, {len(want) - len(stale)} already current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
