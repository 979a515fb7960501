"""Check and time the expert GEMM's variants on the H200, standalone (torch + cuda.bindings only).

Runs on the GPU machine's python3 (no pydantic, no ptxbench imports). Cubins come from
build_variants.py (compiled on the CPU machine, carried as build/gemm_expert). The launch
is read from launch.json beside this file (tensor maps, grid/block/cluster expressions,
shared bytes, argument order) so it cannot drift from the manifest the harness runs;
variants only override what their -D knobs change.

Each variant runs in its own child process with a timeout, so a deadlocked kernel costs
one variant, not the call. Per variant: correctness for several M (stress inputs, C
poisoned with NaN, compared with an fp32 torch.matmul), then timing interleaved with
cuBLAS (torch.matmul) round by round, L2 flushed before every launch, median of events.
Usage: python3 devtest.py [variant ...]     (prints a table last)
"""
from __future__ import annotations

import ctypes
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
CUBINS = ROOT / "build" / "gemm_expert"
N, K = 7168, 5120
CHECK_M = [8192, 8000, 4096, 1024, 256, 70, 1]
TIME_M = [8192, 8000, 4096, 1024, 256, 70]

# Overrides of launch.json per variant (cluster variants load half of B per CTA).
SPLITS = "max(1, min(8, num_sms // (cdiv(M, 128) * (N // 256))))"
CLUSTER2 = {"cluster": [2, 1, 1], "grid": [f"min(num_sms // 2 * 2, 2 * cdiv(M, 256) * (N // 256) * ({SPLITS}))"],
            "box_B": [128, 64]}
VARIANTS = {"tma_c1": {}, "tma_c2": CLUSTER2, "tma_c1_g8": {}, "direct_c1": {}, "direct_c2": CLUSTER2}
DEFAULT = ["tma_c1", "tma_c2", "tma_c1_g8"]


def manifest_for(variant: str) -> dict:
    man = json.loads((HERE / "launch.json").read_text())
    ov = VARIANTS[variant]
    launch = man["launches"][0]
    if "cluster" in ov:
        launch["cluster"] = ov["cluster"]
    if "grid" in ov:
        launch["grid"] = ov["grid"]
    if "box_B" in ov:
        next(t for t in man["tensor_maps"] if t["tensor"] == "B")["box"] = ov["box_B"]
    return man


def ev(expr, env):
    if isinstance(expr, (int, float)):
        return int(expr)
    fns = {"cdiv": lambda a, b: -(-a // b), "min": min, "max": max}
    return int(eval(str(expr), {"__builtins__": {}}, {**fns, **env}))


# ------------------------------------------------------------------ child: one variant
def child(variant: str) -> None:
    import torch
    from cuda.bindings import driver as cu

    def ck(res):
        err = res[0] if isinstance(res, tuple) else res
        if err != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"CUDA driver error {err}")
        return res[1] if isinstance(res, tuple) and len(res) == 2 else res[1:] if isinstance(res, tuple) else None

    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    torch.empty(1, device=dev)  # primary context current before module load
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    man = manifest_for(variant)
    launch = man["launches"][0]
    mod = ck(cu.cuModuleLoadData((CUBINS / f"{variant}.cubin").read_bytes()))
    fn = ck(cu.cuModuleGetFunction(mod, launch["kernel"].encode()))
    smem = ev(launch["shared_bytes"], {})
    ck(cu.cuFuncSetAttribute(fn, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem))
    cluster = launch.get("cluster")
    out = {"variant": variant, "num_sms": num_sms}
    stream = torch.cuda.current_stream().cuda_stream

    def make_config(M):
        env = {"M": M, "N": N, "K": K, "num_sms": num_sms}
        grid = [ev(g, env) for g in launch["grid"]] + [1, 1]
        block = [ev(b, env) for b in launch["block"]] + [1, 1]
        cfg = cu.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid[:3]
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block[:3]
        cfg.sharedMemBytes = smem
        cfg.hStream = cu.CUstream(stream)
        if cluster:
            attr = cu.CUlaunchAttribute()
            attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            cl = [int(c) for c in cluster] + [1, 1]
            attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = cl[:3]
            cfg.attrs = [attr]
            cfg.numAttrs = 1
        return cfg, grid

    if cluster:
        cfg, _ = make_config(8192)
        out["max_active_clusters"] = ck(cu.cuOccupancyMaxActiveClusters(fn, cfg))

    swz = {"none": cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE, "32B": cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_32B,
           "64B": cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_64B, "128B": cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B}
    l2p = {"none": cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_NONE,
           "64B": cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_64B,
           "128B": cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
           "256B": cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B}

    def tensor_map(t: torch.Tensor, spec: dict):
        shape = list(t.shape)  # outermost first; the driver wants innermost first
        rank = len(shape)
        dims = [cu.cuuint64_t(s) for s in reversed(shape)]
        strides = [cu.cuuint64_t(t.stride(i) * t.element_size()) for i in reversed(range(rank - 1))]
        box = [cu.cuuint32_t(b) for b in reversed(spec["box"])]
        es = [cu.cuuint32_t(1)] * rank
        return ck(cu.cuTensorMapEncodeTiled(
            cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, t.data_ptr(), dims, strides, box, es,
            cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, swz[spec.get("swizzle", "none")],
            l2p[spec.get("l2_promotion", "none")], cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE))

    def prepare(tensors: dict, M: int):
        env = {"M": M, "N": N, "K": K, "num_sms": num_sms}
        tensors = dict(tensors)
        dt = {"float32": torch.float32, "int32": torch.int32, "bfloat16": torch.bfloat16}
        for b in man.get("buffers", []):
            shape = [ev(s, env) for s in b["shape"]]
            buf = torch.zeros(shape, dtype=dt[b["dtype"]], device=dev) if b.get("zero", True) else \
                torch.full(shape, float("nan") if dt[b["dtype"]].is_floating_point else -1, dtype=dt[b["dtype"]], device=dev)
            tensors[b["name"]] = buf
        keep = [tensors]
        ptrs = (ctypes.c_void_p * len(launch["args"]))()
        maps = {m["name"]: m for m in man["tensor_maps"]}
        for i, name in enumerate(launch["args"]):
            if isinstance(name, dict):  # explicit scalar
                assert name["type"] == "i32"
                buf = ctypes.c_int32(ev(name["value"], env))
            elif name in maps:
                tm = tensor_map(tensors[maps[name]["tensor"]], maps[name])
                buf = (ctypes.c_ubyte * 128)()
                ctypes.memmove(buf, tm.getPtr(), 128)
            elif name in tensors:
                buf = ctypes.c_uint64(tensors[name].data_ptr())
            else:
                buf = ctypes.c_int32({"M": M, "N": N, "K": K}[name])
            keep.append(buf)
            ptrs[i] = ctypes.addressof(buf)
        cfg, grid = make_config(M)
        return cfg, ptrs, keep, grid

    def run(prep):
        cfg, ptrs, _, _ = prep
        ck(cu.cuLaunchKernelEx(cfg, fn, ctypes.addressof(ptrs), 0))

    def stress(shape, gen):
        x = torch.randn(shape, device=dev, generator=gen)
        x += torch.randn(shape, device=dev, generator=gen) * 10 * (torch.rand(shape, device=dev, generator=gen) < 1e-3)
        return x.to(torch.bfloat16)

    gen = torch.Generator(device=dev)
    checks = []
    for i, M in enumerate(CHECK_M):
        gen.manual_seed(1000 + i)
        A, B = stress((M, K), gen), stress((N, K), gen)
        C = torch.full((M, N), float("nan"), device=dev, dtype=torch.bfloat16)
        prep = prepare({"A": A, "B": B, "C": C}, M)
        run(prep)  # twice with the same buffers: split-K counters must reset themselves
        torch.cuda.synchronize()
        C.fill_(float("nan"))
        run(prep)
        torch.cuda.synchronize()
        ref = A.float() @ B.float().T
        out_f = C.float()
        nan = int(torch.isnan(out_f).sum())
        diff = (out_f - ref).nan_to_num(float("inf"))
        rel = float(diff.norm() / ref.norm())
        bad = int((diff.abs() > 1e-2 + 1e-2 * ref.abs()).sum())
        checks.append({"M": M, "grid": prep[3][0], "nan": nan, "rel": rel, "bad": bad, "ok": nan == 0 and bad == 0 and rel < 1e-2})
    out["checks"] = checks
    print("RESULT " + json.dumps(out), flush=True)
    if not all(c["ok"] for c in checks):
        return

    flush = torch.empty(512 * 1024 * 1024, dtype=torch.uint8, device=dev)
    timings = []
    for M in TIME_M:
        gen.manual_seed(7)
        A, B = torch.randn((M, K), device=dev, generator=gen).bfloat16(), torch.randn((N, K), device=dev, generator=gen).bfloat16()
        C = torch.empty((M, N), device=dev, dtype=torch.bfloat16)
        Cref = torch.empty((M, N), device=dev, dtype=torch.bfloat16)
        prep = prepare({"A": A, "B": B, "C": C}, M)
        fns = {"kernel": lambda: run(prep), "cublas": lambda: torch.matmul(A, B.T, out=Cref)}
        for f in fns.values():  # warm-up
            for _ in range(3):
                f()
        torch.cuda.synchronize()
        times = {k: [] for k in fns}
        reps = 20 if M >= 4096 else 40
        for rnd in range(10):
            order = list(fns) if rnd % 2 == 0 else list(fns)[::-1]
            for name in order:
                evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
                for s, e in evs:
                    flush.zero_()
                    s.record()
                    fns[name]()
                    e.record()
                torch.cuda.synchronize()
                times[name] += [s.elapsed_time(e) for s, e in evs]
        med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
        spread = {k: (sorted(v)[len(v) // 10], sorted(v)[9 * len(v) // 10]) for k, v in times.items()}
        ok = bool(torch.allclose(C.float(), Cref.float(), rtol=1e-2, atol=1e-2))  # output of the timed runs
        flop = 2.0 * M * N * K
        timings.append({"M": M, "kernel_ms": med["kernel"], "cublas_ms": med["cublas"],
                        "kernel_tflops": flop / med["kernel"] / 1e9, "cublas_tflops": flop / med["cublas"] / 1e9,
                        "speedup": med["cublas"] / med["kernel"], "kernel_p10_p90": spread["kernel"],
                        "cublas_p10_p90": spread["cublas"], "timed_output_matches_cublas": ok})
        print("TIMING " + json.dumps(timings[-1]), flush=True)
    out["timings"] = timings
    print("RESULT " + json.dumps(out), flush=True)


# ------------------------------------------------------------------ parent
def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        child(argv[1])
        return 0
    variants = argv or DEFAULT
    results = []
    outdir = Path(os.environ.get("OUT", "/tmp"))
    for v in variants:
        if not (CUBINS / f"{v}.cubin").exists():
            print(f"{v}: no cubin at {CUBINS}", flush=True)
            continue
        t0 = time.time()
        try:
            p = subprocess.run([sys.executable, __file__, "--child", v], capture_output=True, text=True, timeout=40)
            text, rc = p.stdout + p.stderr, p.returncode
        except subprocess.TimeoutExpired as exc:
            text, rc = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or ""), "TIMEOUT"
        (outdir / f"{v}.log").write_text(text)
        res = [json.loads(l[7:]) for l in text.splitlines() if l.startswith("RESULT ")]
        r = res[-1] if res else {"variant": v, "error": f"rc={rc}: " + text[-800:]}
        r["wall_s"] = round(time.time() - t0, 1)
        results.append(r)
        print(json.dumps(r), flush=True)
    (outdir / "results.json").write_text(json.dumps(results, indent=1))
    print("\nvariant     | checks (M:rel/bad/nan)                         | M     kernel TF  cuBLAS TF  speedup")
    for r in results:
        if "error" in r:
            print(f"{r['variant']:<11} | ERROR {r['error'][-300:]}")
            continue
        cks = " ".join(f"{c['M']}:{c['rel']:.1e}/{c['bad']}/{c['nan']}{'' if c['ok'] else '!'}" for c in r["checks"])
        extra = f" maxclusters={r['max_active_clusters']}" if "max_active_clusters" in r else ""
        print(f"{r['variant']:<11} | {cks}{extra}")
        for t in r.get("timings", []):
            print(f"{'':<11} | {'':<46} | {t['M']:<5} {t['kernel_tflops']:9.1f} {t['cublas_tflops']:10.1f} {t['speedup']:8.3f}"
                  f"{'' if t['timed_output_matches_cublas'] else ' MISMATCH'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
