"""Shared pieces for the agent-loop tests (test_graph, test_solve_cli, test_resume, test_replay,
test_faults_e2e): replies a scripted model sends, and a way to run the real `agent` CLI.

The only fake is the model's judgement (scripted replies); compile, SASS inspection,
SQLite checkpoints and the HTTP server are real.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.trajectory import read_events

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def cpu_only(request, monkeypatch):
    """The loop without a GPU, on any machine (subprocesses inherit it); `gpu` tests see the GPU."""
    if request.node.get_closest_marker("gpu") is None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")

# A small kernel with one TMA load and four wgmmas in flight (not a GEMM: the loop's tests
# need a candidate that compiles with the requested wgmma + tma, unserialized).
PROBE_CU = r"""// Probe for the agent loop's tests: TMA + wgmma in the SASS.
#include <cuda.h>
extern "C" __global__ void gemm_probe(const __grid_constant__ CUtensorMap tmap_a, float* C) {
    __shared__ alignas(128) unsigned short tile[64 * 16];
    __shared__ alignas(8) unsigned long long bar;
    unsigned tile_addr = (unsigned)__cvta_generic_to_shared(tile);
    unsigned bar_addr = (unsigned)__cvta_generic_to_shared(&bar);
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(bar_addr));
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], 2048;" :: "r"(bar_addr));
        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                     :: "r"(tile_addr), "l"(&tmap_a), "r"(0), "r"((int)blockIdx.x * 64), "r"(bar_addr) : "memory");
    }
    __syncthreads();
    asm volatile("{\n.reg .pred done;\nwait:\nmbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\n@!done bra wait;\n}"
                 :: "r"(bar_addr) : "memory");
    unsigned long long desc = ((unsigned long long)((tile_addr & 0x3FFFF) >> 4)) | (1ull << 16) | (8ull << 32);
    float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}"
                     : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3) : "l"(desc + 2 * k), "l"(desc), "r"(k));
    }
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    C[blockIdx.x * 128 + threadIdx.x] = d0 + d1 + d2 + d3;
}
"""
PROBE_MANIFEST = {"tensor_maps": [{"name": "tmA", "tensor": "A", "box": [64, 16]}],
                  "launches": [{"kernel": "gemm_probe", "grid": ["cdiv(M, 64)"], "block": [128], "args": ["tmA", "C"]}]}
GEMM_TASK = "gemm_n7168_k5120"  # requests wgmma + tma on sm_90a
# The typo that breaks the probe, and the line of PROBE_CU it is on (1-based).
BROKEN_LINE_TEXT = "    float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;"
BROKEN_LINE = PROBE_CU.splitlines().index(BROKEN_LINE_TEXT) + 1


def reply(source: str, manifest: dict | str, lang: str = "cuda", prose: str = "Plan: as below.") -> str:
    manifest = manifest if isinstance(manifest, str) else json.dumps(manifest, indent=2)
    return f"{prose}\n\n```{lang}\n{source}\n```\n\n```json\n{manifest}\n```\n"


def probe_reply() -> str:
    return reply(PROBE_CU, PROBE_MANIFEST, prose="Four wgmmas fed by one TMA load.")


def broken_probe_reply() -> str:
    return reply(PROBE_CU.replace(BROKEN_LINE_TEXT, BROKEN_LINE_TEXT.replace("float d0", "flaot d0")),
                 PROBE_MANIFEST, prose="First try.")


def simple_attn_bwd_reply() -> str:
    """The repo's plain SIMT attention backward (tasks/mha_bwd_d128/simple): no wgmma, no TMA. Only
    the instances its manifest launches: the shared source defines one per head dim and mask."""
    d = REPO / "tasks" / "mha_bwd_d128" / "simple"
    manifest = (d / "launch.json").read_text()
    launched = [launch["kernel"] for launch in json.loads(manifest)["launches"]]
    source = "".join(line for line in (d / "kernel.cu").read_text().splitlines(keepends=True)
                     if not line.startswith('extern "C"') or any(f" {k}(" in line for k in launched))
    return reply(source, manifest, prose="Plain SIMT version.")


NO_CODE = "I would tile with 128x128 wgmma and a TMA pipeline, but here is only prose."


# The provider refuses the next call (a key revoked): the run stops with model_error, resumable once
# the script goes on past it. (A script that runs out ends the run for good, as a replay does.)
PROVIDER_FAILS = {"fault": "auth", "status": 401, "message": "key revoked"}


def write_script(path: Path, replies: list) -> str:
    path.write_text(json.dumps({"replies": replies}))
    return f"scripted:{path}"


def events(run_dir: Path, type: str | None = None) -> list[dict]:
    return list(read_events(run_dir, type))


def agent_cli(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 300,
              **popen) -> subprocess.CompletedProcess:
    """Run the real `agent` command (python -m agent.cli) and capture its output."""
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], cwd=cwd or REPO, env=cli_env(env),
                          capture_output=True, text=True, timeout=timeout, **popen)


def ctrl_c_reaches_it() -> None:
    """Popen's preexec_fn for a CLI a test stops with SIGINT: the child starts with SIGINT at its
    default. A shell runs a background job without job control (`cmd &` in a script, some CI
    runners) with SIGINT ignored, and children inherit that: Python then installs no
    KeyboardInterrupt handler and the test would measure the harness, not the CLI."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def cli_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    env.update(extra or {})
    return env
