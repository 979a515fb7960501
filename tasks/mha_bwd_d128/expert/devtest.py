"""Check and time the expert attention backward's variants on the H200, standalone (torch + cuda.bindings only).

Runs on the GPU machine's python3 (no pydantic, no ptxbench imports). Cubins come from
build_variants.py (compiled on the CPU machine, carried as build/attn_bwd_expert). The three
launches, buffers and tensor maps are read from the launch.json of mha_bwd_d128/expert
(non-causal) and mha_bwd_d128_causal/expert (causal), so they cannot drift from the manifests
the harness runs; variants only override shared bytes.

Each variant runs in its own child process with a timeout. Per variant and mask: correctness for
several S (Q, K, V, dO stress inputs; O and LSE from PyTorch's flash forward; dQ, dK, dV poisoned
with NaN and scratch buffers filled with NaN; the launches run twice so a stale dQ accumulator
would show; every element checked for NaN; sampled heads, the last included, against the task's
fp32 reference formula; all heads against PyTorch's autograd backward), then timing of the three
launches against cuDNN's backward (autograd.grad on a retained graph), interleaved round by
round, L2 flushed before every launch, median of events.
Usage: python3 devtest.py [variant ...]
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
CUBINS = ROOT / "build" / "attn_bwd_expert"
B, H, D = 4, 48, 128
CHECK_S = [int(x) for x in os.environ.get("CHECK_S", "4096,3000,77,1024").split(",")]
TIME_S = [int(x) for x in os.environ.get("TIME_S", "4096,8192").split(",")]
SAMPLE_HEADS = [0, 1, 95, B * H - 1]
MANIFESTS = {False: ROOT / "tasks" / "mha_bwd_d128" / "expert" / "launch.json",
             True: ROOT / "tasks" / "mha_bwd_d128_causal" / "expert" / "launch.json"}
# main kernel's dynamic smem per variant: 1 KiB alignment slack, K, V, STAGES x (Q, dO, LSE/Delta), dS (x2 with
# DQ_COMP), dQ staging (DQ_TMA), barriers; None = the manifest's value
SMEM = lambda stages=2, comp=0, tma=1: -(-(1024 + 65536 + stages * 33280 + 32768 * (1 + comp) + 32768 * tma + 8 * (1 + 2 * stages)) // 128) * 128
VARIANTS = {"shipped": {}, "st3": {"shared_bytes": SMEM(stages=3)}, "tma": {"shared_bytes": SMEM()},
            "defer": {"shared_bytes": SMEM(tma=0)}, "v2": {"shared_bytes": SMEM(tma=0)}, "comp": {"shared_bytes": SMEM(comp=1)}}
CHILD_TIMEOUT_S = int(os.environ.get("CHILD_TIMEOUT_S", 60))
BUDGET_S = int(os.environ.get("BUDGET_S", 100))


def ev(expr, env):
    if isinstance(expr, (int, float)):
        return expr
    fns = {"cdiv": lambda a, b: -(-int(a) // int(b)), "min": min, "max": max, "sqrt": math.sqrt}
    return eval(str(expr), {"__builtins__": {}}, {**fns, **env})


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
    torch.empty(1, device=dev)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    mod = ck(cu.cuModuleLoadData((CUBINS / f"{variant}.cubin").read_bytes()))
    stream = torch.cuda.current_stream().cuda_stream
    out = {"variant": variant, "checks": [], "timings": []}
    DT = {"bfloat16": (torch.bfloat16, cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16),
          "float32": (torch.float32, cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT32)}
    swz = {"none": cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE, "128B": cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B}
    l2p = {"none": cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_NONE,
           "256B": cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B}

    def tensor_map(t, spec, env):
        shape = [int(ev(v, env)) for v in spec["view"]] if spec.get("view") else list(t.shape)
        assert math.prod(shape) == t.numel()
        rank = len(shape)
        dtype = DT["float32" if t.dtype == torch.float32 else "bfloat16"][1]
        dims = [cu.cuuint64_t(s) for s in reversed(shape)]
        strides = [cu.cuuint64_t(math.prod(shape[i + 1:]) * t.element_size()) for i in reversed(range(rank - 1))]
        box = [cu.cuuint32_t(int(ev(b, env))) for b in reversed(spec["box"])]
        return ck(cu.cuTensorMapEncodeTiled(
            dtype, rank, t.data_ptr(), dims, strides, box, [cu.cuuint32_t(1)] * rank,
            cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, swz[spec.get("swizzle", "none")],
            l2p[spec.get("l2_promotion", "none")], cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE))

    def prepare(causal, tensors, S):
        man = json.loads(MANIFESTS[causal].read_text())
        env = {"B": B, "H": H, "S": S, "D": D, "sm_scale": 1 / math.sqrt(D), "num_sms": num_sms}
        tensors = dict(tensors)
        for b in man.get("buffers", []):  # NaN-filled: the kernels must initialise what they read
            tensors[b["name"]] = torch.full([int(ev(x, env)) for x in b["shape"]], float("nan"),
                                            dtype=DT[b["dtype"]][0], device=dev)
        maps = {m["name"]: m for m in man["tensor_maps"]}
        encoded = {n: tensor_map(tensors[m["tensor"]], m, env) for n, m in maps.items()}
        launches = []
        keep = [tensors, encoded]
        for launch in man["launches"]:
            fn = ck(cu.cuModuleGetFunction(mod, launch["kernel"].encode()))
            smem = int(ev(launch.get("shared_bytes", 0), {}))
            if launch["kernel"].startswith("attn_bwd_main") and "shared_bytes" in VARIANTS[variant]:
                smem = VARIANTS[variant]["shared_bytes"]
            if smem:
                ck(cu.cuFuncSetAttribute(fn, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem))
            ptrs = (ctypes.c_void_p * len(launch["args"]))()
            for i, a in enumerate(launch["args"]):
                if isinstance(a, dict):
                    v = ev(a["value"], env)
                    buf = ctypes.c_float(v) if a["type"] == "f32" else ctypes.c_int32(int(v))
                elif a in maps:
                    buf = (ctypes.c_ubyte * 128)()
                    ctypes.memmove(buf, encoded[a].getPtr(), 128)
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
            launches.append((fn, cfg, ptrs))
        return launches, keep

    def run(prep):
        for fn, cfg, ptrs in prep[0]:
            ck(cu.cuLaunchKernelEx(cfg, fn, ctypes.addressof(ptrs), 0))

    def stress(shape, gen):
        x = torch.randn(shape, device=dev, generator=gen)
        x += torch.randn(shape, device=dev, generator=gen) * 10 * (torch.rand(shape, device=dev, generator=gen) < 1e-3)
        return x.to(torch.bfloat16)

    def forward(Q, K, V, causal):  # bf16 O and natural-log LSE [B,H,S] from PyTorch's flash forward
        res = torch.ops.aten._scaled_dot_product_flash_attention(Q, K, V, 0.0, causal)
        return res[0].contiguous(), res[1][..., :Q.shape[2]].float().contiguous()

    def reference(q, k, v, o, do, lse, causal):  # the task's fp32 formula, [n,S,D]
        S = q.shape[1]
        sc = 1 / math.sqrt(D)
        q, k, v, o, do = (t.float() for t in (q, k, v, o, do))
        p = torch.exp(torch.matmul(q, k.transpose(1, 2)) * sc - lse[..., None])
        if causal:
            p.masked_fill_(~torch.ones(S, S, dtype=torch.bool, device=dev).tril(), 0.0)
        dv = torch.matmul(p.transpose(1, 2), do)
        delta = (do * o).sum(-1, keepdim=True)
        ds = (torch.matmul(do, v.transpose(1, 2)) - delta) * p
        # rss of the products summed into each element (the task's tolerance.scale = "terms")
        ds2 = ds.square()
        rss = ((ds2 @ k.square()).sqrt() * sc, (ds2.transpose(1, 2) @ q.square()).sqrt() * sc,
               (p.square().transpose(1, 2) @ do.square()).sqrt())
        return (torch.matmul(ds, k) * sc, torch.matmul(ds.transpose(1, 2), q) * sc, dv), rss

    gen = torch.Generator(device=dev)
    for causal in (False, True):
        for i, S in enumerate(CHECK_S):
            gen.manual_seed(100 * i + 11 + causal)
            Q, K, V, dO = (stress((B, H, S, D), gen) for _ in range(4))
            O, LSE = forward(Q, K, V, causal)
            grads = {n: torch.full((B, H, S, D), float("nan"), device=dev, dtype=torch.bfloat16) for n in ("dQ", "dK", "dV")}
            prep = prepare(causal, {"Q": Q, "K": K, "V": V, "O": O, "dO": dO, "LSE": LSE, **grads}, S)
            run(prep)
            for g in grads.values():
                g.fill_(float("nan"))
            run(prep)  # second run on the same scratch: dQacc must be re-zeroed by the kernels
            torch.cuda.synchronize()
            c = {"causal": causal, "S": S}
            hs = torch.tensor(SAMPLE_HEADS, device=dev)
            sel = lambda t: t.reshape(B * H, S, -1)[hs] if t.dim() == 4 else t.reshape(B * H, S)[hs]
            refs, rsss = reference(sel(Q), sel(K), sel(V), sel(O), sel(dO), sel(LSE), causal)
            qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (Q, K, V))
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION]):
                oo = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
            tg = torch.autograd.grad(oo, (qq, kk, vv), dO)
            ok = True
            for n, ref, rss, lib in zip(("dQ", "dK", "dV"), refs, rsss, tg):
                got = grads[n]
                nan = int(torch.isnan(got).sum())
                d = (sel(got).float() - ref).nan_to_num(float("inf"))
                bad = int((d.abs() > 1e-2 + 1e-2 * torch.maximum(ref.abs(), rss)).sum())  # the task's check
                bad_ref = int((d.abs() > 1e-2 + 1e-2 * ref.abs()).sum())  # stricter: |ref| scale
                rel = float(d.norm() / ref.norm())
                lib_bad = int(((got.float() - lib.float()).nan_to_num(float("inf")).abs() > 5e-2 + 5e-2 * lib.float().abs()).sum())
                c[n] = {"nan": nan, "rel": rel, "bad": bad, "bad_ref": bad_ref, "lib_bad": lib_bad,
                        "maxabs": float(d.abs().max()), "max_err_over_rss": float((d.abs() / rss.clamp_min(1e-30)).max())}
                ok = ok and nan == 0 and bad == 0
            c["ok"] = ok
            out["checks"].append(c)
            print("CHECK " + json.dumps(c), flush=True)
            del Q, K, V, dO, O, LSE, grads, prep, refs, rsss, tg, qq, kk, vv, oo
    print("RESULT " + json.dumps(out), flush=True)
    if any(c[n]["nan"] for c in out["checks"] for n in ("dQ", "dK", "dV")):
        return  # broken, not merely imprecise: timing would mean nothing

    flush = torch.empty(512 * 1024 * 1024, dtype=torch.uint8, device=dev)
    for causal in (False, True):
        for S in TIME_S:
            gen.manual_seed(7)
            Q, K, V, dO = (torch.randn((B, H, S, D), device=dev, generator=gen).bfloat16() for _ in range(4))
            O, LSE = forward(Q, K, V, causal)
            grads = {n: torch.empty((B, H, S, D), device=dev, dtype=torch.bfloat16) for n in ("dQ", "dK", "dV")}
            prep = prepare(causal, {"Q": Q, "K": K, "V": V, "O": O, "dO": dO, "LSE": LSE, **grads}, S)
            qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (Q, K, V))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                oo = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
            lib = {}

            def cudnn():
                lib["g"] = torch.autograd.grad(oo, (qq, kk, vv), dO, retain_graph=True)

            fns = {"kernel": lambda: run(prep), "cudnn": cudnn}
            for f in fns.values():
                for _ in range(2):
                    f()
            torch.cuda.synchronize()
            times = {k: [] for k in fns}
            reps = 6 if S <= 4096 else 3
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
            match = all(bool(torch.allclose(grads[n].float(), g.float(), rtol=5e-2, atol=5e-2))
                        for n, g in zip(("dQ", "dK", "dV"), lib["g"]))
            flop = 10.0 * B * H * S * S * D / (2 if causal else 1)
            t = {"causal": causal, "S": S, "kernel_ms": med["kernel"], "cudnn_ms": med["cudnn"],
                 "kernel_tflops": flop / med["kernel"] / 1e9, "cudnn_tflops": flop / med["cudnn"] / 1e9,
                 "speedup": med["cudnn"] / med["kernel"], "kernel_p10_p90": spread["kernel"],
                 "cudnn_p10_p90": spread["cudnn"], "timed_output_matches_cudnn": match}
            out["timings"].append(t)
            print("TIMING " + json.dumps(t), flush=True)
            del Q, K, V, dO, O, LSE, grads, prep, qq, kk, vv, oo, lib
    print("RESULT " + json.dumps(out), flush=True)


def summarize(r: dict) -> None:
    print(f"{r['variant']} ({r.get('wall_s')} s){' ERROR ' + r['error'][-400:] if 'error' in r else ''}")
    for c in r.get("checks", []):
        parts = "  ".join(f"{n} {c[n]['rel']:.1e}/{c[n]['bad']}/{c[n]['bad_ref']}/{c[n]['nan']}/{c[n]['lib_bad']}" for n in ("dQ", "dK", "dV"))
        print(f"   {'C' if c['causal'] else 'N'} S={c['S']:<5} {parts}{'' if c['ok'] else '  FAIL'}")
    for t in r.get("timings", []):
        print(f"   {'C' if t['causal'] else 'N'} S={t['S']:<5} kernel {t['kernel_tflops']:6.1f} TF ({t['kernel_ms']:.3f} ms)  "
              f"cuDNN {t['cudnn_tflops']:6.1f} TF ({t['cudnn_ms']:.3f} ms)  speedup {t['speedup']:.3f}"
              f"{'' if t['timed_output_matches_cudnn'] else ' MISMATCH'}", flush=True)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        child(argv[1])
        return 0
    variants = argv or list(VARIANTS)
    results = []
    outdir = Path(os.environ.get("OUT", "/tmp"))
    t_start = time.time()
    for v in variants:
        if time.time() - t_start > BUDGET_S:
            print(f"{v}: skipped, out of time", flush=True)
            continue
        t0 = time.time()
        try:
            p = subprocess.run([sys.executable, __file__, "--child", v], capture_output=True, text=True,
                               timeout=CHILD_TIMEOUT_S)
            text, rc = p.stdout + p.stderr, p.returncode
        except subprocess.TimeoutExpired as exc:
            text, rc = (exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")), "TIMEOUT"
        (outdir / f"bwd_{v}.log").write_text(text)
        res = [json.loads(l[7:]) for l in text.splitlines() if l.startswith("RESULT ")]
        r = res[-1] if res else {"variant": v, "checks": [json.loads(l[6:]) for l in text.splitlines() if l.startswith("CHECK ")]}
        if rc != 0:
            r["error"] = f"rc={rc}: " + text[-500:]
        r["wall_s"] = round(time.time() - t0, 1)
        results.append(r)
        summarize(r)  # now, so a run cut off by its time limit still reports the variants it finished
        (outdir / "bwd_results.json").write_text(json.dumps(results, indent=1))
    print("\nbackward variant | check c/S: dQ dK dV rel/bad(terms)/bad(|ref|)/nan/lib_bad")
    for r in results:
        summarize(r)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
