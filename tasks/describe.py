"""What a model is told about a task: one markdown text per (task, arch, language, require).

It states the operation, every tensor with its axes, dtype and row-major layout, the
reference code, the VISIBLE workloads (held-out values are never shown), the scalars, the
instructions requested for the arch, how correctness and speed are judged, and the
solution format (kernel source + launch manifest, tools/solution.py) with an example
manifest for this task. Every fact about the harness lives here (what compiles the
kernel, which headers exist, no INFINITY under NVRTC, what each manifest field means), so
every arm of the context ablation gets it; nothing the architecture docs teach does (issue 41:
the example manifest is a design-free skeleton, no tile, swizzle, block size, pipeline depth or
kernel split; no description points at a doc). knowledge/docs/doc_only_facts.txt lists the facts
that must never appear here, and tests/test_statement_facts.py renders every statement against it.

`require` is the --require axis: True (on) names the requested instructions and what they are
to carry; False (off) names none of them anywhere (no feature list, no request note, no helper
header named after an instruction, no TMA in the manifest text), while the run is still judged on
them. Retrieval (architecture docs, the helper headers' API) is added by the agent separately.
"""
from __future__ import annotations

import json

from tasks.schema import Task

ARCH_NAMES = {"sm_90a": "Hopper (H100/H200)", "sm_100a": "Blackwell (B200)"}
ARCH_SMS = {"sm_90a": 132, "sm_100a": 148}
PTX_VERSION = "8.7"  # accepted by ptxas 13.0 for both arches (sm_100a needs 8.6 or later)

# Short, tool-neutral descriptions of the features a task can request (names as in DESIGN.md).
FEATURE_TEXT = {
    "wgmma": "warpgroup matrix multiply-accumulate: `wgmma.mma_async` (with `wgmma.fence`, "
             "`wgmma.commit_group`, `wgmma.wait_group`), operands from shared memory descriptors",
    "tma": "Tensor Memory Accelerator copies: `cp.async.bulk.tensor` with a tensor map declared in the "
           "manifest's `tensor_maps`, completing on an `mbarrier`",
    "tcgen05_mma": "5th-generation tensor core MMA: `tcgen05.mma`, accumulating in tensor memory",
    "tmem": "tensor memory traffic: `tcgen05.ld` / `tcgen05.st` / `tcgen05.cp` (after `tcgen05.alloc`)",
    "tcgen05_alloc": "tensor memory allocation: `tcgen05.alloc` / `tcgen05.dealloc`",
    "mbarrier": "`mbarrier` objects in shared memory", "cluster": "thread block clusters",
    "setmaxnreg": "`setmaxnreg` register reallocation between warpgroups",
    "stmatrix": "`stmatrix`", "ldmatrix": "`ldmatrix`", "cp_async": "`cp.async`",
    "bulk_copy": "`cp.async.bulk` (non-tensor bulk copies)", "pdl": "programmatic dependent launch",
    "mma_sync": "`mma.sync` (legacy warp-level MMA)",
}

_TERM_OUTPUTS = {"gemm": ("C",), "fp8_gemm": ("D",), "mha_fwd": ("O",), "fp8_mha_fwd": ("O",),
                 "mha_bwd": ("dQ", "dK", "dV"), "gdn_prefill": ("output",)}  # see reference.term_scales

_RSS_EXAMPLE = {"gemm": "C[m,n]: sqrt(sum_k (A[m,k] * B[n,k])^2)",
                "mha_fwd": "O[i,d]: sqrt(sum_j (P[i,j] * V[j,d])^2)",
                "mha_bwd": "dV[j,d]: sqrt(sum_i (P[i,j] * dO[i,d])^2); dQ, dK likewise with dS",
                "fp8_mha_fwd": "O[i,d]: sqrt(sum_j (P[i,j] * V[j,d] * descale_v)^2)",
                "gdn_prefill": "output[t,h,v]: scale * sqrt(sum_k (S_t[h,v,k] * q[t,h,k])^2), S_t the state after "
                               "token t",
                "fp8_gemm": "D[i,j]: sqrt(sum_k (A[i,k] * SF_A[i,k/128] * B[j,k] * SF_B[j/128,k/128])^2)"}

BASELINE_TEXT = {
    "cublas": "cuBLAS (`torch.matmul` in bf16)",
    "sdpa_fwd": "the fastest PyTorch scaled-dot-product-attention backend (cuDNN, FlashAttention or memory-efficient)",
    "sdpa_bwd": "the backward of the fastest PyTorch scaled-dot-product-attention backend (cuDNN, FlashAttention or "
                "memory-efficient), forward excluded",
    "sdpa_fp8_fwd": "cuDNN's FP8 attention (cudnn-frontend sdpa_fp8 on the same e4m3 inputs and descales) where it "
                    "runs, else bf16 cuDNN attention on the dequantised inputs (results name which); on Hopper "
                    "cuDNN writes O in e4m3, below this task's bf16 O: a timing reference, not a precision target",
    "fla_gdn": "flash-linear-attention's Gated DeltaNet kernels (fla-core: fused recurrent for decode and MTP, the "
               "faster of chunked and fused recurrent for prefill), gates and k-last state fused in",
    "fp8_block_gemm": "cuBLASLt's block-scaled FP8 GEMM (`torch._scaled_mm` with 1x128 scales for A and 128x128 "
                      "for B), or a Triton block-scaled FP8 GEMM where cuBLASLt refuses (results name which)",
    "none": "no library (speed is reported, not compared)",
}

# How the "fp8_block_scaled" generator draws inputs (tasks/families/fp8_gemm.py), added to the stress distribution.
_FP8_BLOCK_INPUTS = (", times a random magnitude 2^U(-3, 3) per scale block; each e4m3 tensor X is then quantised "
                     "per block as DeepGEMM does: SF_X = amax(|x| over the block) / 448 and X = x / SF_X, so every "
                     "block spans the e4m3 range and scales differ from block to block by up to ~64x")

# How the "gdn" generator draws inputs (tasks/families/gdn.py), said instead of the stress distribution.
_GDN_INPUTS = ("fresh random values for every check: q and k are l2-normalised per head (as the model feeds them), "
               "v and state are N(0, 1) with rare large outliers (N(0, 100) with probability 1e-3), the gates are in "
               "trained models' ranges (g mostly near 1, sometimes near 0; beta in about (0.02, 0.98)), and (prefill) "
               "cu_seqlens cuts the tokens into sequences of arbitrary lengths")


def render_task(task: Task, arch: str = "sm_90a", language: str = "cuda", require: bool = True) -> str:
    if language not in ("cuda", "ptx"):
        raise ValueError(f"language must be 'cuda' or 'ptx', got {language!r}")
    parts = [
        f"# Task `{task.name}` on {arch} ({ARCH_NAMES.get(arch, arch)})",
        task.description or f"Operation type: {task.op_type}.",
        _tensors(task),
        _reference(task),
        _workloads(task),
        _requested(task, arch) if require else "",
        _judging(task),
        _format(task, arch, language, require),
    ]
    return "\n\n".join(p.strip() for p in parts if p.strip()) + "\n"


def _tensors(task: Task) -> str:
    const = [f"{n}={a.value}" for n, a in task.axes.items() if a.type == "const"]
    var = [n for n, a in task.axes.items() if a.type == "var"]
    lines = ["## Tensors",
             f"Axes: {', '.join(const) or 'none fixed'}" + (f"; varying: {', '.join(var)}." if var else "."),
             "Every tensor is a separate, contiguous, row-major array (the last axis varies fastest; "
             "each starts 256-byte aligned).", "",
             "| tensor | role | shape | dtype | element offset | meaning |", "|---|---|---|---|---|---|"]
    for role, specs in (("input", task.inputs), ("output", task.outputs)):
        for name, spec in specs.items():
            lines.append(f"| `{name}` | {role} | [{', '.join(spec.shape)}] | {spec.dtype} | "
                         f"{_offset(spec.shape)} | {spec.description} |")
    if task.scalars:
        lines.append("")
        for name, expr in task.scalars.items():
            value = _scalar_value(task, name)
            shown = f" = {value:.9g}" if value is not None else ""
            lines.append(f"Scalar `{name}` = {expr}{shown} (fp32; pass it to a kernel by name).")
    lines.append("Inputs are read-only: a kernel that writes to an input fails.")
    return "\n".join(lines)


def _offset(shape: list[str]) -> str:
    """Row-major element offset, e.g. ((b*H + h)*S + s)*D + d for [B, H, S, D]."""
    # an upper-case axis gives its lower-case index; a lower-case one (batch_size) an i<k>
    idx = [a.lower() if a != a.lower() else f"i{k}" for k, a in enumerate(shape)]
    if len(set(idx)) != len(idx):
        idx = [f"i{k}" for k in range(len(shape))]
    expr = idx[0]
    for axis, i in zip(shape[1:], idx[1:]):
        expr = f"({expr})*{axis} + {i}" if "+" in expr else f"{expr}*{axis} + {i}"
    return f"`{expr}`"


def _scalar_value(task: Task, name: str) -> float | None:
    """The scalar's value where its expression uses const axes alone (each scalar on its own, so a
    fixed one keeps its value beside one that depends on a var axis), else None."""
    try:
        consts = {n: int(a.value) for n, a in task.axes.items() if a.type == "const"}
        return task.model_copy(update={"scalars": {name: task.scalars[name]}}).scalar_values(consts)[name]
    except Exception:  # noqa: BLE001 - depends on a var axis: show the expression only
        return None


def _reference(task: Task) -> str:
    return ("## Reference (PyTorch)\n"
            "The harness runs exactly this, in fp32 on the same inputs your kernel gets, and compares each "
            "of your outputs with its result in fp32.\n\n"
            f"```python\n{task.reference.rstrip()}\n```")


def _workloads(task: Task) -> str:
    visible = task.workloads_for("visible")
    lines = ["## Workloads"]
    if not visible:
        lines.append("No workloads are defined for this task yet.")
        return "\n".join(lines)
    for w in visible:
        axes = task.axis_values(w)
        shapes = ", ".join(f"{n} [{', '.join(str(s) for s in task.shape(n, axes))}]"
                           for n in {**task.inputs, **task.outputs})
        var = ", ".join(f"{k}={v}" for k, v in w.axes.items())
        lines.append(f"- `{w.name}`: {var} -> {shapes}; {task.flop_count(axes) / 1e9:,.1f} GFLOP")
    var_axes = [n for n, a in task.axes.items() if a.type == "var"]
    if var_axes:
        lines.append(f"\nYour kernel is also checked on other values of {', '.join(var_axes)} that are not shown "
                     "here, including values that are not a multiple of any tile size and values smaller than "
                     "one tile: read the sizes from the arguments and handle partial tiles.")
    return "\n".join(lines)


def _requested(task: Task, arch: str) -> str:
    """The request (--require on only): the features, what they are to carry, how they are checked."""
    features = task.features_for(arch)
    if not features:
        return "## Instructions\nNo specific instructions are requested for this arch."
    items = "\n".join(f"- `{f}`: {FEATURE_TEXT.get(f, f)}" for f in features)
    serialized = (", and wgmma that ptxas serializes (ptxas info C7515) does not count" if "wgmma" in features
                  else "")
    note = f"\n\n{task.request_note}" if task.request_note else ""
    return ("## Requested instructions\n"
            f"The kernel must use these {arch} instructions for its main work:\n{items}{note}\n\n"
            "They are checked in the compiled machine code (SASS) and counted while the kernel runs: an "
            f"instruction that sits in a branch never taken does not count{serialized}.")


def _row_and_aggregate_rules(task: Task) -> str:
    """The per-row and aggregate bounds (tasks.schema.Tolerance.rows, rel_l2), in one sentence each."""
    tol, parts = task.tolerance, []
    rows = [f"{n} {r.rtol:g}" for n, r in tol.rows.items() if r.row == "last_dim" and r.floor]
    if rows:
        parts.append(" Each row (last dimension) of an output must also be within a relative L2 error of its own "
                     "norm (never judged against less than 0.3 of a typical row's): " + ", ".join(rows) + ".")
    # GDN prefill (issue 42, item 6): rows held to their own norm alone, output rows to that of max(|ref|, rss)
    own = [n for n, r in tol.rows.items() if r.row == "last_dim" and not r.floor]
    if own:
        terms = [n for n in own if tol.scale == "terms" and n in _TERM_OUTPUTS.get(task.op_type, ())]
        parts.append(" Each row (last dimension) of " + ", ".join(own) + " must also be within a relative L2 error "
                     "of its own norm, with no floor (a row near zero is judged against itself"
                     + (f"; {', '.join(terms)}: the norm of max(|ref|, rss)" if terms else "") + "): "
                     + ", ".join(f"{n} {tol.rows[n].rtol:g}" for n in own) + ".")
    single = [f"{n} {r.atol:g}" if not r.spread else
              f"{n} min({r.atol:g}, {r.spread_atol:g} + {r.spread:g} * sqrt(sum_j p_j^2)) with p the row's softmax"
              for n, r in tol.rows.items() if r.row == "element"]
    if single:
        parts.append(" Instead of that rule, each element of these outputs must be within an absolute error of: "
                     + ", ".join(single) + ".")
    if tol.rel_l2:
        parts.append(" The whole of each output must be within a relative L2 error (||out - ref|| / ||ref||) of "
                     + ", ".join(f"{n} {b:g}" for n, b in tol.rel_l2.items()) + ".")
    return "".join(parts)


def _judging(task: Task) -> str:
    tol = task.tolerance
    if tol.scale == "terms":
        plain = [n for n in task.outputs if n not in _TERM_OUTPUTS.get(task.op_type, ())]
        example = _RSS_EXAMPLE.get(task.op_type, "computed by the harness")
        rule = (f"|out - ref| <= {tol.atol:g} + {tol.rtol:g} * max(|ref|, rss), where rss is the root-sum-square "
                f"of the products summed into that element ({example})."
                " It only forgives "
                + ("the tensor cores' reduced-precision fp8 accumulation" if task.op_type == "fp8_gemm"
                   else "the rounding of an fp32 tensor-core accumulation (which grows with the terms summed, not with "
                   "the result)"
                   if task.op_type == "gemm"
                   else f"{'e4m3' if task.op_type.startswith('fp8') else 'bf16'} rounding of those factors")
                + " where a sum cancels"
                + (f"; for {', '.join(plain)}, rss = |ref|" if plain else ""))
    else:
        rule = f"|out - ref| <= {tol.atol:g} + {tol.rtol:g} * |ref|"
    return ("## How it is judged\n"
            "- Correctness: ref is the fp32 result of the reference above on the same inputs (not rounded to the "
            f"output dtype). Every element of every output must satisfy {rule}. NaN never passes."
            + _row_and_aggregate_rules(task) + "\n"
            "- Inputs are " + (_GDN_INPUTS if task.generator == "gdn" else
                               "fresh random values for every check: N(0, 1) with rare large outliers (N(0, 100) "
                               "with probability 1e-3)") + (", drawn in bf16; each e4m3 tensor X is then quantised with one scale, "
                                          "X = x * 448/amax(|x|), and its descale_x input is amax/448"
                                          if task.generator == "stress_fp8_per_tensor" else
                                          _FP8_BLOCK_INPUTS if task.generator == "fp8_block_scaled" else "") +
            ". Outputs are filled with a poison value before every run, so every "
            "element must be written; writes outside an output are detected.\n"
            "- Speed: median time with a cold L2 cache, compared with "
            f"{BASELINE_TEXT.get(task.baseline, task.baseline)} timed the same way on the same GPU.")


def _format(task: Task, arch: str, language: str, require: bool = True) -> str:
    if language == "cuda":
        source = ("One ```cuda``` block: CUDA C++ kernels declared `extern \"C\" __global__` (the manifest names "
                  f"them), compiled with NVRTC for compute_{arch.removeprefix('sm_')} (C++17) and then ptxas "
                  f"-arch={arch}. Inline PTX with `asm volatile` is allowed. Available headers: `cuda_bf16.h`, "
                  "`cuda_fp16.h`, `cuda_fp8.h`; fixed-width integer types and the `CUtensorMap` type are "
                  "predefined (`<stdint.h>` and `<cuda.h>` also resolve to them), and ptxbench's helper headers "
                  f"{_helper_headers(arch, require)} are always on the include path (namespace `ptxbench`). There is no "
                  "C/C++ standard library: no `<cmath>`, `<math.h>` or `INFINITY` macro (write +inf as "
                  "`__int_as_float(0x7f800000)`, -inf as `__int_as_float(0xff800000)`); CUDA's device math "
                  "functions (`expf`, `exp2f`, `__expf`, `fmaxf`, ...) are built in. No host code, no `main`.")
        params = ("a device pointer (`const __nv_bfloat16*`, `float*`, ...)", "`int`", "`float`",
                  "`const __grid_constant__ CUtensorMap` (by value)")
    else:
        source = (f"One ```ptx``` block: a PTX module starting with `.version {PTX_VERSION}`, `.target {arch}`, "
                  f"`.address_size 64`, with `.visible .entry` kernels (the manifest names them), assembled by "
                  f"ptxas -arch={arch}.")
        params = ("`.param .u64` (a global address)", "`.param .s32`", "`.param .f32`",
                  "`.param .align 64 .b8 name[128]` (by value)")
    example = manifest_json(example_manifest(task, arch, require))
    bullets = [
        "`buffers`: scratch memory `{\"name\", \"dtype\", \"shape\", \"zero\"}`; zero-filled before every run "
        "when `\"zero\": true` (the default), otherwise filled with garbage.",
        # The fields and their encoding are the harness's (cuTensorMapEncodeTiled's arguments); what
        # a load of a box delivers, and which alignment a swizzle needs, is the docs' to teach.
        "`tensor_maps`: tensor-map descriptors (`CUtensorMap`, encoded by the harness with "
        "cuTensorMapEncodeTiled) `{\"name\", \"tensor\", \"box\", \"view\", \"swizzle\", "
        "\"element_strides\", \"l2_promotion\", \"oob_fill\"}` over an input, output or buffer. `view` reshapes "
        "it (row-major, same element count); `view` and `box` are outermost first (the harness reverses them into "
        "the driver's innermost-first order, so kernel-side coordinates are innermost first). `swizzle` is "
        "\"none\" (default), \"32B\", \"64B\" or \"128B\". `oob_fill`: box elements outside the tensor "
        "(or its view) read as zero with \"zero\" (default) or as NaN with \"nan\". `l2_promotion` (\"none\" "
        "default, \"64B\", \"128B\", \"256B\"). `element_strides` (default all 1) is the traversal stride per "
        "box dimension.",
        "`launches`: run in order on one stream, each `{\"kernel\", \"grid\", \"block\", \"cluster\", "
        "\"shared_bytes\", \"args\"}`. `shared_bytes` is dynamic shared memory (the per-kernel limit is raised "
        "for you, up to 227 KB; it starts 16-byte aligned). "
        "`cluster` (optional, `[x, y, z]`) launches the grid as thread-block clusters of that shape: each "
        "cluster dimension must divide the grid dimension, and a cluster has at most 16 blocks (8 is the portable "
        "size; above 8 the non-portable attribute is set for you). A kernel may instead declare "
        "`__cluster_dims__`. `when` (optional, an expression, default 1) runs a launch only on the workloads "
        "where it is true (a kernel per shape); at least one launch must run on every workload.",
        "`let` (optional): named sizes `{\"name\": expression}`, evaluated in order per workload (each may use "
        "the ones before it) and usable in every expression after them; passed by name in `args`, an integer "
        "`let` goes as an axis does.",
        f"Sizes are numbers or expressions over the axes ({', '.join(task.axes)}), the scalars "
        f"({', '.join(task.scalars) or 'none'}), `num_sms` ({ARCH_SMS.get(arch, '?')} on this GPU) and the `let` "
        "names, with "
        "`+ - * / // %`, comparisons, `a if cond else b`, `cdiv(a, b)`, `round_up(a, b)`, `min`, `max`. `/` is true division (`7 / 2` is 3.5, and a "
        "size or integer argument that is not a whole number is an error): use `//`, `cdiv` or `round_up` for "
        "integers.",
        f"`args` by name, in the kernel's parameter order: a tensor or buffer is passed as {params[0]}; an axis as "
        f"{params[1]}; a scalar as {params[2]}; a tensor map as {params[3]}. Anything else as "
        "`{\"type\": \"i32\"|\"u32\"|\"i64\"|\"u64\"|\"f32\", \"value\": <expression>}`.",
    ]
    manifest_text = "\n".join(f"   - {b}" for b in bullets)
    return (f"## Solution format\nAnswer with two fenced blocks.\n\n1. {source}\n"
            "2. One ```json``` block: the launch manifest. No host code of yours runs: the harness allocates the "
            "tensors, builds the tensor maps you declare (cuTensorMapEncodeTiled) and launches your kernels in "
            f"order.\n{manifest_text}\n\n"
            "Example manifest for this task: the shape of a valid answer with placeholder sizes, not a design "
            "(it says nothing about how to tile, stage or split the work):\n\n"
            f"```json\n{example}\n```")


def _helper_headers(arch: str, require: bool = True) -> str:
    """The ptxbench helper headers a kernel for `arch` can include (knowledge/include/ptxbench).
    Under --require off their names are not listed: most are named after an instruction."""
    if not require:
        return "(`<ptxbench/common.cuh>` and the others under `<ptxbench/...>`)"
    names = ["common", "mbarrier", "tma", "cluster"] + (["wgmma"] if arch == "sm_90a" else
                                                        ["tcgen05"] if arch == "sm_100a" else [])
    return ", ".join(f"`<ptxbench/{n}.cuh>`" for n in names)


def manifest_json(manifest: dict) -> str:
    """JSON with one buffer, tensor map or launch per line: short enough to read in a prompt."""
    sections = []
    for key, items in manifest.items():
        rows = ",\n".join(f"    {json.dumps(item)}" for item in items)
        sections.append(f'  "{key}": [\n{rows}\n  ]')
    return "{\n" + ",\n".join(sections) + "\n}"


# The skeleton's placeholder sizes: a tile of 64 x 64 outputs per block of 256 threads, by pointer.
# Deliberately what a first simple kernel would use and no tuned design (issue 41): no swizzle, no
# warpgroup counts, no pipeline ring in shared_bytes, one launch (no preprocessing or split kernels).
_TILE, _THREADS = 64, 256


def example_manifest(task: Task, arch: str, require: bool = True) -> dict:
    """A valid manifest for this task with placeholder sizes: one launch, every tensor and axis by
    name, and (where TMA is requested and --require on) one tensor map over the first input, to show
    how one is declared and passed. The same on both arches unless the request differs."""
    var = [n for n, a in task.axes.items() if a.type == "var"]
    tokens = {"gemm": ("M", "N"), "fp8_gemm": ("m", "n"), "mha_fwd": ("S", "B * H"), "mha_bwd": ("S", "B * H"),
              "fp8_mha_fwd": ("L", "B * H"), "gdn_decode": (None, "batch_size * num_v_heads"),
              "gdn_mtp": (None, "batch_size * num_v_heads"), "gdn_prefill": (None, "num_seqs * num_v_heads")}
    rows, cols = tokens.get(task.op_type, (var[0] if var else "1", None))
    if task.op_type in ("gemm", "fp8_gemm"):  # one block per 64 x 64 tile of the output
        grid = [f"cdiv({cols}, {_TILE})", f"cdiv({rows}, {_TILE})"]
    elif cols is None:
        grid = [f"cdiv({rows}, {_TILE})"]
    elif rows is None:  # one block per (sequence, value head)
        grid = [cols]
    else:  # one block per 64 query rows of one (batch, head)
        grid = [f"cdiv({rows}, {_TILE})", cols]
    args: list = [*task.inputs, *task.outputs, *task.axes, *task.scalars]
    manifest: dict = {}
    if require and "tma" in task.features_for(arch):
        first = next(iter(task.inputs))
        shape = task.inputs[first].shape
        # a box of up to 64 x 64 over the last two dims, one element deep in the others
        box = [1] * (len(shape) - 2) + [f"min({d}, {_TILE})" for d in shape[-2:]]
        manifest["tensor_maps"] = [{"name": f"tmap_{first}", "tensor": first, "box": box}]
        args = [f"tmap_{first}" if a == first else a for a in args]
    manifest["launches"] = [{"kernel": f"{task.op_type}_kernel", "grid": grid, "block": [_THREADS], "args": args}]
    return manifest
