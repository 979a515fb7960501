"""Check and time the expert attention forward's variants on the H200, standalone (torch + cuda.bindings only).

Runs on the GPU machine's python3 (no pydantic, no ptxbench imports). Cubins come from
build_variants.py (compiled on the CPU machine, carried as build/attn_fwd_expert). Each launch is
read from the launch.json of mha_fwd_d128/expert (non-causal) and mha_fwd_d128_causal/expert
(causal) so it cannot drift from the manifests the harness runs; variants only override what
their -D knobs change (shared bytes for STAGES=3).

Each variant runs in its own child process with a timeout, so a deadlocked kernel costs one
variant, not the call. Per variant and mask: correctness for several S (stress inputs
N(0,1) + N(0,100)*Bernoulli(1e-3), O and LSE poisoned with NaN; every element checked for NaN;
O and LSE of sampled heads, the last head included, against an fp32 reference; all of O against
torch SDPA), then timing interleaved with cuDNN SDPA round by round, L2 flushed before every
launch, median of events.
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
CUBINS = ROOT / "build" / "attn_fwd_expert"
B, H, D = 4, 48, 128
CHECK_S = [4096, 3000, 77, 1024]
TIME_S = [4096, 8192]
SAMPLE_HEADS = [0, 1, 95, B * H - 1]
MANIFESTS = {False: ROOT / "tasks" / "mha_fwd_d128" / "expert" / "launch.json",
             True: ROOT / "tasks" / "mha_fwd_d128_causal" / "expert" / "launch.json"}
ST2 = {"shared_bytes": 1024 + 32768 * 5 + 256}
VARIANTS = {"shipped": {}, "pp": ST2, "base": ST2, "split": ST2}
DEFAULT = list(VARIANTS)
CHILD_TIMEOUT_S = 45
BUDGET_S = 115  # stop starting variants after this much wall time


def ev(expr, env):
    if isinstance(expr, (int, float)):
        return expr
    fns = {"cdiv": lambda a, b: -(-int(a) // int(b)), "min": min, "max": max, "sqrt": math.sqrt}
    return eval(str(expr), {"__builtins__": {}}, {**fns, **env})


def manifest_for(variant: str, causal: bool) -> dict:
    man = json.loads(MANIFESTS[causal].read_text())
    ov = VARIANTS[variant]
    if "shared_bytes" in ov:
        man["launches"][0]["shared_bytes"] = ov["shared_bytes"]
    return man


# ------------------------------------------------------------------ child: one variant
def child(variant: str) -> None:
    import torch
    import torch.nn.functional as F
    from cuda.bindings import driver as cu
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def ck(res):
        err = res[0] if isinstance(res, tuple) else res
        if err != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"CUDA driver error {err}")
        return res[1] if isinstance(res, tuple) and len(res) == 2 else None

    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    torch.empty(1, device=dev)  # primary context current before module load
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    mod = ck(cu.cuModuleLoadData((CUBINS / f"{variant}.cubin").read_bytes()))
    stream = torch.cuda.current_stream().cuda_stream
    out = {"variant": variant, "checks": [], "timings": []}
    swz = {"none": cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE, "128B": cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B}
    l2p = {"none": cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_NONE,
           "256B": cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B}

    def tensor_map(t, spec, env):
        shape = [int(ev(v, env)) for v in spec["view"]] if spec.get("view") else list(t.shape)
        assert math.prod(shape) == t.numel()
        rank = len(shape)
        dims = [cu.cuuint64_t(s) for s in reversed(shape)]
        strides = [cu.cuuint64_t(math.prod(shape[i + 1:]) * t.element_size()) for i in reversed(range(rank - 1))]
        box = [cu.cuuint32_t(int(ev(b, env))) for b in reversed(spec["box"])]
        es = [cu.cuuint32_t(1)] * rank
        return ck(cu.cuTensorMapEncodeTiled(
            cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, t.data_ptr(), dims, strides, box, es,
            cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, swz[spec.get("swizzle", "none")],
            l2p[spec.get("l2_promotion", "none")], cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE))

    def prepare(causal, tensors, S):
        man = manifest_for(variant, causal)
        launch = man["launches"][0]
        fn = ck(cu.cuModuleGetFunction(mod, launch["kernel"].encode()))
        smem = int(ev(launch["shared_bytes"], {}))
        ck(cu.cuFuncSetAttribute(fn, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem))
        env = {"B": B, "H": H, "S": S, "D": D, "sm_scale": 1 / math.sqrt(D), "num_sms": num_sms}
        maps = {m["name"]: m for m in man["tensor_maps"]}
        keep = [tensors]
        ptrs = (ctypes.c_void_p * len(launch["args"]))()
        for i, a in enumerate(launch["args"]):
            if isinstance(a, dict):
                v = ev(a["value"], env)
                buf = ctypes.c_float(v) if a["type"] == "f32" else ctypes.c_int32(int(v))
            elif a in maps:
                tm = tensor_map(tensors[maps[a]["tensor"]], maps[a], env)
                buf = (ctypes.c_ubyte * 128)()
                ctypes.memmove(buf, tm.getPtr(), 128)
            elif a in tensors:
                buf = ctypes.c_uint64(tensors[a].data_ptr())
            elif a in ("B", "H", "S", "D"):
                buf = ctypes.c_int32(env[a])
            else:
                buf = ctypes.c_float(env[a])
            keep.append(buf)
            ptrs[i] = ctypes.addressof(buf)
        grid = [int(ev(g, env)) for g in launch["grid"]] + [1, 1]
        block = [int(ev(b, env)) for b in launch["block"]] + [1, 1]
        cfg = cu.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid[:3]
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block[:3]
        cfg.sharedMemBytes = smem
        cfg.hStream = cu.CUstream(stream)
        cfg.numAttrs = 0
        return fn, cfg, ptrs, keep

    def run(prep):
        fn, cfg, ptrs, _ = prep
        ck(cu.cuLaunchKernelEx(cfg, fn, ctypes.addressof(ptrs), 0))

    def stress(shape, gen):
        x = torch.randn(shape, device=dev, generator=gen)
        x += torch.randn(shape, device=dev, generator=gen) * 10 * (torch.rand(shape, device=dev, generator=gen) < 1e-3)
        return x.to(torch.bfloat16)

    def reference(q, k, v, causal):  # fp32, [n, S, D] -> O [n,S,D], LSE [n,S]
        S = q.shape[1]
        sc = torch.matmul(q.float(), k.float().transpose(1, 2)) / math.sqrt(D)
        if causal:
            sc.masked_fill_(~torch.ones(S, S, dtype=torch.bool, device=dev).tril(), float("-inf"))
        lse = torch.logsumexp(sc, dim=-1)
        return torch.matmul(torch.exp(sc - lse[..., None]), v.float()), lse

    gen = torch.Generator(device=dev)
    for causal in (False, True):
        for i, S in enumerate(CHECK_S):
            gen.manual_seed(100 * i + 7 + causal)
            Q, K, V = (stress((B, H, S, D), gen) for _ in range(3))
            O = torch.full((B, H, S, D), float("nan"), device=dev, dtype=torch.bfloat16)
            LSE = torch.full((B, H, S), float("nan"), device=dev, dtype=torch.float32)
            prep = prepare(causal, {"Q": Q, "K": K, "V": V, "O": O, "LSE": LSE}, S)
            run(prep)
            torch.cuda.synchronize()
            nan_o, nan_l = int(torch.isnan(O).sum()), int(torch.isnan(LSE).sum())
            hs = torch.tensor(SAMPLE_HEADS, device=dev)
            q3, k3, v3 = (t.reshape(B * H, S, D)[hs] for t in (Q, K, V))
            ro, rl = reference(q3, k3, v3, causal)
            oo = O.reshape(B * H, S, D)[hs].float()
            ol = LSE.reshape(B * H, S)[hs]
            do = (oo - ro).nan_to_num(float("inf"))
            dl = (ol - rl).nan_to_num(float("inf"))
            bad_o = int((do.abs() > 1e-2 + 1e-2 * ro.abs()).sum())
            bad_l = int((dl.abs() > 1e-2 + 1e-2 * rl.abs()).sum())
            rel_o = float(do.norm() / ro.norm())
            rel_l = float(dl.norm() / rl.norm())
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
                so = F.scaled_dot_product_attention(Q, K, V, is_causal=causal).float()
            sdpa_bad = int(((O.float() - so).nan_to_num(float("inf")).abs() > 2e-2 + 2e-2 * so.abs()).sum())
            ok = nan_o == 0 and nan_l == 0 and bad_o == 0 and bad_l == 0 and sdpa_bad == 0
            c = {"causal": causal, "S": S, "nan_o": nan_o, "nan_lse": nan_l, "rel_o": rel_o, "bad_o": bad_o,
                 "rel_lse": rel_l, "bad_lse": bad_l, "sdpa_bad": sdpa_bad, "ok": ok}
            out["checks"].append(c)
            print("CHECK " + json.dumps(c), flush=True)
            del Q, K, V, O, LSE, so
    print("RESULT " + json.dumps(out), flush=True)
    if not all(c["ok"] for c in out["checks"]):
        return

    flush = torch.empty(512 * 1024 * 1024, dtype=torch.uint8, device=dev)
    for causal in (False, True):
        for S in TIME_S:
            gen.manual_seed(7)
            Q, K, V = (torch.randn((B, H, S, D), device=dev, generator=gen).bfloat16() for _ in range(3))
            O = torch.empty((B, H, S, D), device=dev, dtype=torch.bfloat16)
            LSE = torch.empty((B, H, S), device=dev, dtype=torch.float32)
            prep = prepare(causal, {"Q": Q, "K": K, "V": V, "O": O, "LSE": LSE}, S)
            ref = {}

            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    ref["o"] = F.scaled_dot_product_attention(Q, K, V, is_causal=causal)

            fns = {"kernel": lambda: run(prep), "cudnn": cudnn}
            for f in fns.values():
                for _ in range(3):
                    f()
            torch.cuda.synchronize()
            times = {k: [] for k in fns}
            reps = 10 if S <= 4096 else 5
            for rnd in range(8):
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
            spread = {k: (round(sorted(v)[len(v) // 10], 4), round(sorted(v)[9 * len(v) // 10], 4)) for k, v in times.items()}
            match = bool(torch.allclose(O.float(), ref["o"].float(), rtol=2e-2, atol=2e-2))
            flop = 4.0 * B * H * S * S * D / (2 if causal else 1)
            t = {"causal": causal, "S": S, "kernel_ms": med["kernel"], "cudnn_ms": med["cudnn"],
                 "kernel_tflops": flop / med["kernel"] / 1e9, "cudnn_tflops": flop / med["cudnn"] / 1e9,
                 "speedup": med["cudnn"] / med["kernel"], "kernel_p10_p90": spread["kernel"],
                 "cudnn_p10_p90": spread["cudnn"], "timed_output_matches_cudnn": match}
            out["timings"].append(t)
            print("TIMING " + json.dumps(t), flush=True)
            del Q, K, V, O, LSE, ref
    print("RESULT " + json.dumps(out), flush=True)


# ------------------------------------------------------------------ parent
def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        child(argv[1])
        return 0
    variants = argv or DEFAULT
    results = []
    outdir = Path(os.environ.get("OUT", "/tmp"))
    t_start = time.time()
    for v in variants:
        if not (CUBINS / f"{v}.cubin").exists():
            print(f"{v}: no cubin at {CUBINS}", flush=True)
            continue
        if time.time() - t_start > BUDGET_S:
            print(f"{v}: skipped, out of time", flush=True)
            continue
        t0 = time.time()
        try:
            p = subprocess.run([sys.executable, __file__, "--child", v], capture_output=True, text=True,
                               timeout=CHILD_TIMEOUT_S)
            text, rc = p.stdout + p.stderr, p.returncode
        except subprocess.TimeoutExpired as exc:
            so = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            text, rc = so, "TIMEOUT"
        (outdir / f"{v}.log").write_text(text)
        res = [json.loads(l[7:]) for l in text.splitlines() if l.startswith("RESULT ")]
        r = res[-1] if res else {"variant": v, "error": f"rc={rc}: " + text[-600:]}
        if res and rc != 0:
            r["error"] = f"rc={rc}: " + text[-400:]
        if not res:  # keep the checks that did print
            r["checks"] = [json.loads(l[6:]) for l in text.splitlines() if l.startswith("CHECK ")]
        r["wall_s"] = round(time.time() - t0, 1)
        results.append(r)
        print(json.dumps(r), flush=True)
    (outdir / "results.json").write_text(json.dumps(results, indent=1))
    print("\nvariant | checks c/S: relO/badO relLSE/badLSE nan sdpa_bad")
    for r in results:
        print(f"{r['variant']} ({r.get('wall_s')} s){' ERROR ' + r['error'][-300:] if 'error' in r else ''}")
        for c in r.get("checks", []):
            print(f"   {'C' if c['causal'] else 'N'} S={c['S']:<5} O {c['rel_o']:.1e}/{c['bad_o']}  LSE {c['rel_lse']:.1e}/"
                  f"{c['bad_lse']}  nan {c['nan_o']}/{c['nan_lse']}  sdpa_bad {c['sdpa_bad']}{'' if c['ok'] else '  FAIL'}")
        for t in r.get("timings", []):
            print(f"   {'C' if t['causal'] else 'N'} S={t['S']:<5} kernel {t['kernel_tflops']:6.1f} TF  cuDNN "
                  f"{t['cudnn_tflops']:6.1f} TF  speedup {t['speedup']:.3f}{'' if t['timed_output_matches_cudnn'] else ' MISMATCH'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
