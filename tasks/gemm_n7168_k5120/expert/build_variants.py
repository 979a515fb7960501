"""Compile the expert GEMM's variants here (CPU) into build/gemm_expert/<variant>.cubin.

Each variant is kernel.cu with -D knobs; devtest.py runs the cubins on the H200. Prints
ptxas resources and the lines that matter (C7515 serialized wgmma, C7508 ignored
setmaxnreg) and counts the SASS opcodes that prove wgmma and TMA.
Usage: .venv/bin/python tasks/gemm_n7168_k5120/expert/build_variants.py [variant ...]
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
OUT = ROOT / "build" / "gemm_expert"
VARIANTS = {
    "tma_c1": [],  # the shipped configuration (kernel.cu defaults)
    "direct_c1": ["-DEPI_TMA=0"],
    "tma_c2": ["-DCLUSTER_M=2"],
    "tma_c1_g8": ["-DGROUP_M=8"],
    "direct_c2": ["-DEPI_TMA=0", "-DCLUSTER_M=2"],
}


def sass_counts(cubin: bytes) -> collections.Counter:
    tc = find_toolchain()
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tc.cuobjdump.path, "-sass", f.name], capture_output=True, text=True).stdout
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", out)
    return collections.Counter(ops)


def main(names: list[str]) -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    src = (HERE / "kernel.cu").read_text()
    bad = 0
    for name in names or list(VARIANTS):
        res = compile_source(src, "cuda", "sm_90a", extra_flags=VARIANTS[name])
        if res.status != "ok":
            print(f"{name}: FAILED {res.error}")
            for d in res.diagnostics[:20]:
                print("   ", d.render() if hasattr(d, "render") else d)
            bad += 1
            continue
        (OUT / f"{name}.cubin").write_bytes(res.cubin)
        ops = sass_counts(res.cubin)
        notes = [d.message for d in res.diagnostics if d.code in ("C7515", "C7508") or d.severity in ("warning", "error")]
        kr = {k: v.model_dump() if hasattr(v, "model_dump") else v for k, v in (res.kernels or {}).items()} if hasattr(res, "kernels") else {}
        print(f"{name}: ok  HGMMA={ops['HGMMA']} UTMALDG={ops['UTMALDG']} UTMASTG={ops['UTMASTG']} "
              f"UBLKCP={ops['UBLKCP']} LDL={ops['LDL']} STL={ops['STL']} resources={kr}")
        for n in notes:
            print("    !!", n)
    return bad


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
