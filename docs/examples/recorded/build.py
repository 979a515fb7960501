"""Rebuild the recorded replies of docs/examples/sweep_gpu_ray.toml from the shipped solutions.

    python docs/examples/recorded/build.py          # rewrite model_a.json, model_b.json
    python docs/examples/recorded/build.py --check  # exit 1 if they are stale

Each file is a `scripted:` model (agent/models.py, ScriptedModel): a list of replies given in
order, one per turn. A reply is what a model would write: a line of prose, the kernel in a
```cuda block and its launch manifest in a ```json block. The replies are the repo's own
solutions, so every evaluation in the sweep is real GPU work with a known verdict:

  model_a (task gemm):     turn 1 tasks/gemm_n7168_k5120/simple  (correct, SIMT: arch_missing)
                           turn 2 tasks/gemm_n7168_k5120/expert  (wgmma + TMA: correct_with_arch)
  model_b (task attn_fwd): turn 1 tasks/mha_fwd_d128/simple      (correct, SIMT: arch_missing)
                           turn 2 tasks/mha_fwd_d128/expert      (wgmma + TMA: correct_with_arch)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]

SCRIPTS = {
    "model_a.json": [("gemm_n7168_k5120/simple", "A plain SIMT GEMM first: 64x64 tiles, fp32 accumulate."),
                     ("gemm_n7168_k5120/expert", "Now wgmma fed by TMA, warp-specialised, stream-K when tiles are few.")],
    "model_b.json": [("mha_fwd_d128/simple", "A plain SIMT attention forward first: online softmax, fp32 math."),
                     ("mha_fwd_d128/expert", "Now an FA3-style forward: TMA loads, wgmma for QK^T and PV.")],
}


def reply(folder: str, prose: str) -> str:
    d = REPO / "tasks" / folder
    source, manifest = (d / "kernel.cu").read_text(), (d / "launch.json").read_text()
    return f"{prose}\n\n```cuda\n{source.rstrip()}\n```\n\n```json\n{manifest.rstrip()}\n```\n"


def build() -> dict[str, str]:
    sys.path.insert(0, str(REPO))
    from tools.solution import Solution, extract_solution

    out = {}
    for name, turns in SCRIPTS.items():
        replies = []
        for folder, prose in turns:
            text = reply(folder, prose)
            got, want = extract_solution(text), Solution.from_dir(REPO / "tasks" / folder)
            # The reply must parse back to exactly the shipped solution.
            assert got.source.strip() == want.source.strip() and got.manifest == want.manifest, folder
            replies.append({"text": text, "source": f"tasks/{folder}"})
        out[name] = json.dumps({"replies": replies}, indent=1) + "\n"
    return out


def main() -> int:
    stale = []
    for name, text in build().items():
        path = HERE / name
        if "--check" in sys.argv:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(REPO)} ({len(text)} bytes)")
    if stale:
        print(f"stale: {', '.join(stale)}; run python docs/examples/recorded/build.py")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
