"""Compile the expert attention backward's variants here (CPU) into build/attn_bwd_expert/<variant>.cubin.

Each variant is kernel.cu with -D knobs; devtest.py runs the cubins on the H200. Prints ptxas
resources per kernel, the lines that matter (C7515 serialized wgmma, C7508 ignored setmaxnreg,
spills) and the SASS opcodes that prove wgmma (HGMMA) and TMA (UTMALDG/UTMASTG).
Usage: .venv/bin/python tasks/mha_bwd_d128/expert/build_variants.py [variant ...]
"""
from __future__ import annotations

import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from tools.compile import compile_source  # noqa: E402
from tools.toolchain import find_toolchain  # noqa: E402

HERE = Path(__file__).resolve().parent
OUT = ROOT / "build" / "attn_bwd_expert"
VARIANTS = {
    "shipped": [],                                           # kernel.cu defaults (v3: DQ_TMA=1, DQ_DEFER=1, STAGES=2)
    "st3": ["-DSTAGES=3"],                                   # v3 with a 3-deep Q/dO ring
    "tma": ["-DDQ_DEFER=0", "-DSTAGES=2"],                   # TMA reduce-add of a staged dQ tile, dK before dQ
    "defer": ["-DDQ_TMA=0", "-DSTAGES=2"],                   # per-thread reds, drained while dK runs
    "v2": ["-DDQ_TMA=0", "-DDQ_DEFER=0", "-DSTAGES=2"],      # v2: per-thread red.global.add.v2 after wait_group 0
    "comp": ["-DDQ_COMP=1", "-DSTAGES=2"],                   # dQ from dS = hi + lo (one more GEMM per step)
}


def sass_counts(cubin: bytes) -> dict[str, collections.Counter]:
    tc = find_toolchain()
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tc.cuobjdump.path, "-sass", f.name], capture_output=True, text=True).stdout
    per: dict[str, collections.Counter] = {}
    cur = None
    for line in out.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = per.setdefault(m.group(1), collections.Counter())
            continue
        op = re.search(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if op and cur is not None:
            cur[op.group(1)] += 1
    return per


def main(names: list[str]) -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    src = (HERE / "kernel.cu").read_text()
    bad = 0
    for name in names or list(VARIANTS):
        res = compile_source(src, "cuda", "sm_90a", extra_flags=VARIANTS[name])
        if res.status != "ok":
            print(f"{name}: FAILED {res.error}")
            for d in res.diagnostics[:20]:
                print("   ", d)
            bad += 1
            continue
        (OUT / f"{name}.cubin").write_bytes(res.cubin)
        print(f"{name}: ok")
        for kname, ops in sass_counts(res.cubin).items():
            kr = res.kernels.get(kname)
            print(f"   {kname}: HGMMA={ops['HGMMA']} UTMALDG={ops['UTMALDG']} UTMASTG={ops['UTMASTG']} "
                  f"USETMAXREG={ops['USETMAXREG']} MUFU={ops['MUFU']} LDL={ops['LDL']} STL={ops['STL']} | {kr}")
        for d in res.diagnostics:
            if d.code in ("C7515", "C7508") or d.severity in ("warning", "error") or "spill" in d.message.lower():
                print("    !!", d.code, d.message)
    return bad


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
