"""Launch manifest -> driver launches.

Two halves. `plan_launches` is pure Python (runs on CPU too): it evaluates every
expression of the manifest for one workload and checks names, shapes and device limits,
so a bad manifest is a one-line `ManifestError` naming the field, never a crash. The
rest runs in the GPU worker: `Module` loads the cubin (cuModuleLoadData) and resolves
kernels, `Bound` turns a plan plus allocated tensors into kernel parameter blocks and
TMA descriptors (cuTensorMapEncodeTiled) and launches them (cuLaunchKernelEx, clusters as
a launch attribute, the dynamic shared memory limit raised per kernel).
"""
from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass, field

from tools.expressions import evaluate
from tools.solution import LaunchManifest, ScalarArg

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1, "int32": 4, "int64": 8, "uint8": 1}
SCALAR_BYTES = {"i32": 4, "u32": 4, "i64": 8, "u64": 8, "f32": 4}
MAX_BUFFER_BYTES = 64 << 30  # scratch larger than this, in one buffer or all together, is a manifest bug, not a
# plan (a limit per buffer alone was a limit on nothing: three of 60 GiB passed, an `oom` on the device)


@dataclass(frozen=True)
class DeviceLimits:
    """What the manifest is checked against: the real device's figures in the worker,
    nominal ones for the arch on a CPU machine."""

    num_sms: int
    max_smem_per_block: int  # opt-in maximum of dynamic + static shared memory per block
    max_threads_per_block: int = 1024
    max_block: tuple[int, int, int] = (1024, 1024, 64)
    max_grid: tuple[int, int, int] = (2**31 - 1, 65535, 65535)
    max_cluster: int = 16  # 8 is portable; 16 needs the non-portable attribute (set automatically)


NOMINAL_LIMITS = {"sm_90a": DeviceLimits(num_sms=132, max_smem_per_block=232448),
                  "sm_100a": DeviceLimits(num_sms=148, max_smem_per_block=232448)}


class ManifestError(ValueError):
    """A manifest that cannot be launched for this workload.

    reason is "manifest_error" (a name, expression or shape is wrong) or "launch_error"
    (the device cannot do it: too much shared memory, grid too large, driver refusal)."""

    def __init__(self, message: str, reason: str = "manifest_error"):
        super().__init__(message)
        self.reason = reason


@dataclass
class BufferPlan:
    name: str
    dtype: str
    shape: tuple[int, ...]
    zero: bool

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]


@dataclass
class TensorMapPlan:
    name: str
    tensor: str
    dtype: str
    view: tuple[int, ...]  # outermost first, as written in the manifest
    box: tuple[int, ...]
    element_strides: tuple[int, ...]
    swizzle: str
    l2_promotion: str
    oob_fill: str


@dataclass
class ArgPlan:
    kind: str  # "pointer" | "tensor_map" | one of SCALAR_BYTES
    name: str  # tensor / buffer / tensor map / axis / scalar name (for messages)
    value: float | int | None = None  # for scalars

    @property
    def nbytes(self) -> int:
        return 8 if self.kind == "pointer" else 128 if self.kind == "tensor_map" else SCALAR_BYTES[self.kind]


@dataclass
class LaunchPlan:
    index: int
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    cluster: tuple[int, int, int] | None
    shared_bytes: int
    args: list[ArgPlan]


def check_param_sizes(lp: LaunchPlan, sizes: list[int | None], where: str) -> None:
    """The manifest's args against the kernel's parameter sizes (None: size unknown), as the
    driver reports them at launch or the PTX signature gives them without a GPU
    (tools.kernel_names.entry_param_sizes): a missing or misplaced argument is a clear
    launch_error instead of garbage reads."""
    if len(sizes) != len(lp.args):
        raise ManifestError(f"{where}.args: kernel takes {len(sizes)} parameters, the manifest gives {len(lp.args)}",
                            "launch_error")
    for j, (a, size) in enumerate(zip(lp.args, sizes)):
        if size is not None and size != a.nbytes:
            hint = (" (give it as {\"type\": \"i64\", \"value\": \"%s\"})" % a.name
                    if a.kind == "i32" and size == 8 else "")
            raise ManifestError(f"{where}.args[{j}] {a.name!r} is passed as {a.kind} ({a.nbytes} bytes) but kernel "
                                f"parameter {j} is {size} bytes{hint}", "launch_error")


@dataclass
class Plan:
    buffers: list[BufferPlan] = field(default_factory=list)
    tensor_maps: list[TensorMapPlan] = field(default_factory=list)
    launches: list[LaunchPlan] = field(default_factory=list)
    tensors: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)  # name -> (dtype, shape)

    @property
    def kernel_names(self) -> list[str]:
        return list(dict.fromkeys(lp.kernel for lp in self.launches))


# The values a by-value scalar argument can hold: a manifest value outside them is a
# manifest_error naming the argument, not a silent wrap-around or an OverflowError in ctypes.
SCALAR_RANGES = {"i32": (-2**31, 2**31 - 1), "u32": (0, 2**32 - 1), "i64": (-2**63, 2**63 - 1),
                 "u64": (0, 2**64 - 1)}
F32_MAX = 3.4028234663852886e38


def _value(expr, env: dict, where: str) -> float | int:
    """evaluate() with every failure as a ManifestError naming the field. evaluate raises
    only ValueError by contract; the rest are caught too, as the last line of defence."""
    try:
        return evaluate(expr, env)
    except (ValueError, TypeError, ArithmeticError, RecursionError, MemoryError) as exc:
        raise ManifestError(f"{where}: {exc}") from None


def _scalar(a: ScalarArg, env: dict, where: str) -> ArgPlan:
    v = _value(a.value, env, where)
    if a.type == "f32":
        if abs(v) > F32_MAX:
            raise ManifestError(f"{where}: {a.value!r:.80} = {v:.6g} does not fit in f32 (|v| <= {F32_MAX:.6g})")
        return ArgPlan("f32", a.name or str(a.value), float(v))
    if isinstance(v, float) and not v.is_integer():
        raise ManifestError(f"{where}: {a.value!r:.80} = {v} is not an integer ({a.type})")
    lo, hi = SCALAR_RANGES[a.type]
    if not lo <= int(v) <= hi:
        raise ManifestError(f"{where}: {a.value!r:.80} = {int(v)} is outside the {a.type} range {lo}..{hi}")
    return ArgPlan(a.type, a.name or str(a.value), int(v))


def _int(expr, env: dict, where: str, minimum: int = 1) -> int:
    v = _value(expr, env, where)
    if isinstance(v, float):
        if not v.is_integer():
            raise ManifestError(f"{where}: {expr!r:.80} = {v} is not an integer")
        v = int(v)
    if v < minimum:
        raise ManifestError(f"{where}: {expr!r:.80} = {v}, must be at least {minimum}")
    return int(v)


def _dims3(exprs, env: dict, where: str) -> tuple[int, int, int]:
    vals = [_int(e, env, f"{where}[{i}]") for i, e in enumerate(exprs)]
    return tuple(vals + [1] * (3 - len(vals)))  # type: ignore[return-value]


def plan_launches(manifest: LaunchManifest, task, axes: dict[str, int], limits: DeviceLimits) -> Plan:
    """Evaluate and check a manifest for one workload. Raises ManifestError naming the field."""
    axes = task.axis_values(axes)
    scalars = task.scalar_values(axes)
    env: dict[str, float | int] = {**scalars, **axes, "num_sms": limits.num_sms}
    plan = Plan()
    for name, spec in {**task.inputs, **task.outputs}.items():
        plan.tensors[name] = (spec.dtype, task.shape(name, axes))
    lets = _lets(manifest, env, plan)

    for i, b in enumerate(manifest.buffers):
        where = f"buffers[{i}] ({b.name!r})"
        if b.name in plan.tensors:
            raise ManifestError(f"{where}: name clashes with the task's tensor {b.name!r}")
        shape = tuple(_int(e, env, f"{where}.shape[{j}]") for j, e in enumerate(b.shape))
        zero = b.zero if isinstance(b.zero, bool) else bool(_value(b.zero, env, f"{where}.zero"))
        bp = BufferPlan(b.name, b.dtype, shape, zero)
        total = bp.nbytes + sum(x.nbytes for x in plan.buffers)
        if total > MAX_BUFFER_BYTES:
            before = f" ({total / 2**30:.1f} GiB with the buffers before it)" if plan.buffers else ""
            raise ManifestError(f"{where}: {bp.nbytes / 2**30:.1f} GiB{before} is more than the "
                                f"{MAX_BUFFER_BYTES >> 30} GiB allowed")
        plan.buffers.append(bp)
        plan.tensors[b.name] = (b.dtype, shape)

    for i, t in enumerate(manifest.tensor_maps):
        where = f"tensor_maps[{i}] ({t.name!r})"
        if t.name in plan.tensors:
            raise ManifestError(f"{where}: name clashes with tensor {t.name!r}")
        if t.tensor not in plan.tensors:
            raise ManifestError(f"{where}.tensor: unknown tensor {t.tensor!r} (known: {', '.join(plan.tensors)})")
        dtype, shape = plan.tensors[t.tensor]
        view = tuple(_int(e, env, f"{where}.view[{j}]") for j, e in enumerate(t.view)) if t.view else shape
        if len(view) != len(t.box):
            raise ManifestError(f"{where}.box: {len(t.box)} dims but the tensor has {len(view)} (give a view)")
        if math.prod(view) != math.prod(shape):
            raise ManifestError(f"{where}.view: {list(view)} has {math.prod(view)} elements, "
                                f"{t.tensor!r} {list(shape)} has {math.prod(shape)}")
        box = tuple(_int(e, env, f"{where}.box[{j}]") for j, e in enumerate(t.box))
        esize = DTYPE_BYTES[dtype]
        if any(b > 256 for b in box):
            raise ManifestError(f"{where}.box: {list(box)}: TMA boxes have at most 256 elements per dim")
        if (box[-1] * esize) % 16:
            raise ManifestError(f"{where}.box: innermost box dim {box[-1]} x {esize} B is not a multiple of 16 bytes")
        span = {"32B": 32, "64B": 64, "128B": 128}.get(t.swizzle)
        if span and box[-1] * esize > span:
            raise ManifestError(f"{where}: swizzle {t.swizzle} needs the innermost box dim to span at most "
                                f"{span} bytes, {box[-1]} x {esize} B = {box[-1] * esize} B")
        for j in range(len(view) - 1):  # driver strides: bytes of every dim but the innermost
            stride = math.prod(view[j + 1:]) * esize
            if stride % 16:
                raise ManifestError(f"{where}.view: the stride of dim {j} is {stride} bytes, TMA needs a multiple of 16")
        es = tuple(t.element_strides) if t.element_strides else (1,) * len(box)
        if any(not 1 <= s <= 8 for s in es):
            raise ManifestError(f"{where}.element_strides: each must be 1..8")
        plan.tensor_maps.append(TensorMapPlan(t.name, t.tensor, dtype, view, box, es, t.swizzle, t.l2_promotion,
                                              t.oob_fill))

    maps = {t.name for t in plan.tensor_maps}
    for i, lc in enumerate(manifest.launches):
        where = f"launches[{i}] ({lc.kernel!r})"
        if not _value(lc.when, env, f"{where}.when"):
            continue  # not for this workload (its index stays the manifest's)
        grid = _dims3(lc.grid, env, f"{where}.grid")
        block = _dims3(lc.block, env, f"{where}.block")
        cluster = _dims3(lc.cluster, env, f"{where}.cluster") if lc.cluster else None
        smem = _int(lc.shared_bytes, env, f"{where}.shared_bytes", minimum=0)
        for d, (g, m) in enumerate(zip(grid, limits.max_grid)):
            if g > m:
                raise ManifestError(f"{where}.grid[{d}] = {g} exceeds the device limit {m}", "launch_error")
        if any(b > m for b, m in zip(block, limits.max_block)) or math.prod(block) > limits.max_threads_per_block:
            raise ManifestError(f"{where}.block = {list(block)}: at most {limits.max_threads_per_block} threads "
                                f"and {list(limits.max_block)} per dim", "launch_error")
        if smem > limits.max_smem_per_block:
            raise ManifestError(f"{where}.shared_bytes = {smem} exceeds the device's {limits.max_smem_per_block} "
                                "bytes of shared memory per block", "launch_error")
        if cluster:
            if math.prod(cluster) > limits.max_cluster:
                raise ManifestError(f"{where}.cluster = {list(cluster)}: at most {limits.max_cluster} blocks per cluster",
                                    "launch_error")
            for d in range(3):
                if grid[d] % cluster[d]:
                    raise ManifestError(f"{where}.cluster[{d}] = {cluster[d]} does not divide grid[{d}] = {grid[d]}",
                                        "launch_error")
        args = []
        for j, a in enumerate(lc.args):
            aw = f"{where}.args[{j}]"
            if isinstance(a, ScalarArg):
                args.append(_scalar(a, env, aw))
            elif a in plan.tensors:
                args.append(ArgPlan("pointer", a))
            elif a in maps:
                args.append(ArgPlan("tensor_map", a))
            elif a in axes or a == "num_sms" or a in lets:
                # an int32, held to its range as a typed argument is (an axis of a Definition file may pass
                # 2**31: wrapped, the kernel read a negative size); else give it a type ({"type": "i64", "value": a})
                args.append(_scalar(ScalarArg(name=a, type="i32", value=a), env, aw))
            elif a in scalars:
                args.append(ArgPlan("f32", a, float(scalars[a])))
            else:
                known = list(plan.tensors) + sorted(maps) + list(axes) + list(scalars) + ["num_sms"] + list(lets)
                raise ManifestError(f"{aw}: unknown name {a!r} (known: {', '.join(known)})")
        plan.launches.append(LaunchPlan(i, lc.kernel, grid, block, cluster, smem, args))
    if not plan.launches:
        shape = ", ".join(f"{k}={v}" for k, v in axes.items())
        raise ManifestError(f"launches: every launch's `when` is false for this workload ({shape}): nothing would run")
    return plan


def _lets(manifest: LaunchManifest, env: dict, plan: Plan) -> dict[str, float | int]:
    """The manifest's `let` values for this workload, in order, each added to `env` for the
    expressions after it. A name that is already an axis, scalar, `num_sms`, function or tensor
    would make an expression mean two things: refused."""
    from tools.expressions import FUNCTIONS

    lets: dict[str, float | int] = {}
    for name, expr in manifest.let.items():
        if name in env or name in FUNCTIONS or name in plan.tensors:
            raise ManifestError(f"let.{name}: {name!r} is already an axis, scalar, function or tensor name")
        lets[name] = env[name] = _value(expr, env, f"let.{name}")
    return lets


# ----------------------------------------------------------------------------------------
# Worker side: everything below needs a CUDA driver (cuda.bindings) and a current context.

class CudaError(RuntimeError):
    """A driver call failed. `name` is the CUresult name, e.g. CUDA_ERROR_ILLEGAL_ADDRESS."""

    def __init__(self, name: str, what: str):
        super().__init__(f"{what}: {name}")
        self.name, self.what = name, what


def check(result, what: str):
    """Unpack a cuda-python (err, *values) tuple; raise CudaError unless CUDA_SUCCESS."""
    from cuda.bindings import driver

    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise CudaError(getattr(err, "name", str(err)), what)
    return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)


class Module:
    """A loaded cubin. Load only after the primary context is current (FACTS.md)."""

    def __init__(self, cubin: bytes, symbols: dict[str, str] | None = None):
        from cuda.bindings import driver

        self._d = driver
        self.handle = check(driver.cuModuleLoadData(cubin), "cuModuleLoadData")
        self.symbols = dict(symbols or {})  # plain name -> mangled entry (from compile)
        self._functions: dict[str, object] = {}

    def names(self) -> list[str]:
        d = self._d
        try:
            n = check(d.cuModuleGetFunctionCount(self.handle), "cuModuleGetFunctionCount")
            funcs = check(d.cuModuleEnumerateFunctions(n, self.handle), "cuModuleEnumerateFunctions")
            return sorted(check(d.cuFuncGetName(f), "cuFuncGetName").decode() for f in funcs)
        except Exception:  # noqa: BLE001 - only used to make an error message better
            return sorted(self.symbols.values())

    def function(self, name: str):
        if name not in self._functions:
            d = self._d
            found = {}
            for candidate in dict.fromkeys([name, self.symbols.get(name, name)]):
                err, fn = d.cuModuleGetFunction(self.handle, candidate.encode())
                if err == d.CUresult.CUDA_SUCCESS:
                    found[candidate] = fn
            if len(found) > 1:  # tools.kernel_names: the same rule as inspection and the executed check
                raise ManifestError(f"kernel name {name!r} is ambiguous: both {' and '.join(found)} exist")
            if found:
                self._functions[name] = next(iter(found.values()))
            else:
                plain = {v: k for k, v in self.symbols.items()}
                avail = ", ".join(plain.get(n, n) for n in self.names()) or "none"
                raise ManifestError(f"kernel {name!r} is not in the compiled module (kernels: {avail}); "
                                    "declare it extern \"C\" or use the name the module has")
        return self._functions[name]

    def unload(self) -> None:
        self._d.cuModuleUnload(self.handle)


_TMAP_DTYPE = {"bfloat16": "BFLOAT16", "float16": "FLOAT16", "float32": "FLOAT32", "float8_e4m3fn": "UINT8",
               "int32": "INT32", "int64": "INT64", "uint8": "UINT8"}
_SWIZZLE = {"none": "NONE", "32B": "32B", "64B": "64B", "128B": "128B"}
_L2 = {"none": "NONE", "64B": "L2_64B", "128B": "L2_128B", "256B": "L2_256B"}


def encode_tensor_map(tm: TensorMapPlan, address: int) -> bytes:
    """cuTensorMapEncodeTiled -> the 128-byte descriptor, to be passed to the kernel by value.

    The manifest is outermost first; the driver wants innermost first, and byte strides
    for dims 1..rank-1 only (dim 0 is contiguous)."""
    from cuda.bindings import driver as d

    esize = DTYPE_BYTES[tm.dtype]
    dims = list(reversed(tm.view))
    strides = [math.prod(dims[:j + 1]) * esize for j in range(len(dims) - 1)]
    box = list(reversed(tm.box))
    estr = list(reversed(tm.element_strides))
    oob = "NAN_REQUEST_ZERO_FMA" if tm.oob_fill == "nan" else "NONE"
    try:
        tmap = check(d.cuTensorMapEncodeTiled(
            getattr(d.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{_TMAP_DTYPE[tm.dtype]}"),
            d.cuuint32_t(len(dims)), address,
            [d.cuuint64_t(x) for x in dims], [d.cuuint64_t(x) for x in strides],
            [d.cuuint32_t(x) for x in box], [d.cuuint32_t(x) for x in estr],
            d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            getattr(d.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{_SWIZZLE[tm.swizzle]}"),
            getattr(d.CUtensorMapL2promotion, f"CU_TENSOR_MAP_L2_PROMOTION_{_L2[tm.l2_promotion]}"),
            getattr(d.CUtensorMapFloatOOBfill, f"CU_TENSOR_MAP_FLOAT_OOB_FILL_{oob}")), "cuTensorMapEncodeTiled")
    except CudaError as exc:
        raise ManifestError(f"tensor map {tm.name!r}: cuTensorMapEncodeTiled refused it ({exc.name}; driver order "
                            f"dims {dims}, strides {strides} B, box {box})", "launch_error") from None
    return ctypes.string_at(tmap.getPtr(), 128)


class Bound:
    """A plan bound to device tensors: parameter blocks built once, launched many times.

    Tensor addresses must stay fixed while a Bound is used (the worker copies fresh
    inputs into the same tensors rather than allocating new ones)."""

    def __init__(self, plan: Plan, module: Module, pointers: dict[str, int]):
        from cuda.bindings import driver as d

        self._d = d
        self.plan = plan
        maps = {tm.name: encode_tensor_map(tm, pointers[tm.tensor]) for tm in plan.tensor_maps}
        smem: dict[str, int] = {}  # a kernel launched twice gets the larger of its two limits
        for lp in plan.launches:
            smem[lp.kernel] = max(smem.get(lp.kernel, 0), lp.shared_bytes)
        self._launches = []
        for lp in plan.launches:
            fn = module.function(lp.kernel)
            where = f"launches[{lp.index}] ({lp.kernel!r})"
            self._check_params(fn, lp, where)
            if lp.shared_bytes:
                static = check(d.cuFuncGetAttribute(d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn),
                               "cuFuncGetAttribute(SHARED_SIZE_BYTES)")
                try:
                    check(d.cuFuncSetAttribute(
                        fn, d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem[lp.kernel]),
                        "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)")
                except CudaError as exc:
                    raise ManifestError(f"{where}.shared_bytes = {lp.shared_bytes} (+{static} static) is more than the "
                                        f"device allows ({exc.name})", "launch_error") from None
            if lp.cluster and lp.cluster[0] * lp.cluster[1] * lp.cluster[2] > 8:
                check(d.cuFuncSetAttribute(fn, d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                                           1), "cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED)")
            storage = []
            for a in lp.args:
                if a.kind == "pointer":
                    storage.append(ctypes.c_uint64(pointers[a.name]))
                elif a.kind == "tensor_map":
                    storage.append(ctypes.create_string_buffer(maps[a.name], 128))
                else:
                    ctype = {"i32": ctypes.c_int32, "u32": ctypes.c_uint32, "i64": ctypes.c_int64,
                             "u64": ctypes.c_uint64, "f32": ctypes.c_float}[a.kind]
                    storage.append(ctype(a.value))
            params = (ctypes.c_void_p * max(1, len(storage)))(*[ctypes.addressof(s) for s in storage])
            self._launches.append((lp, fn, storage, params, self._config(lp)))

    def _check_params(self, fn, lp: LaunchPlan, where: str) -> None:
        """Compare the manifest's args with the kernel's parameter list (count and sizes), so
        a missing or misplaced argument is a clear launch_error instead of garbage reads."""
        d = self._d
        try:  # cuFuncGetParamCount is recent: an older driver or binding just skips the check
            err, count = d.cuFuncGetParamCount(fn)
        except Exception:  # noqa: BLE001
            return
        if err != d.CUresult.CUDA_SUCCESS:
            return
        sizes: list[int | None] = []
        for j in range(count):
            err, _offset, size = d.cuFuncGetParamInfo(fn, j)
            sizes.append(size if err == d.CUresult.CUDA_SUCCESS else None)
        check_param_sizes(lp, sizes, where)

    def _config(self, lp: LaunchPlan):
        d = self._d
        cfg = d.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = lp.grid
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = lp.block
        cfg.sharedMemBytes = lp.shared_bytes
        cfg.hStream = d.CUstream(0)  # the legacy default stream, which torch and the timing events use too
        if lp.cluster:
            attr = d.CUlaunchAttribute()
            attr.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = lp.cluster
            cfg.attrs = [attr]
            cfg.numAttrs = 1
        else:
            cfg.numAttrs = 0
        return cfg

    def launch(self) -> None:
        """Enqueue every launch of the manifest, in order, on the default stream."""
        for lp, fn, _storage, params, cfg in self._launches:
            try:
                check(self._d.cuLaunchKernelEx(cfg, fn, ctypes.addressof(params), 0),
                      f"cuLaunchKernelEx(launches[{lp.index}] {lp.kernel!r})")
            except CudaError as exc:
                if exc.name in STICKY_ERRORS:
                    raise
                raise ManifestError(f"launches[{lp.index}] ({lp.kernel!r}): the driver refused the launch: {exc.name} "
                                    f"(grid {list(lp.grid)}, block {list(lp.block)}, cluster "
                                    f"{list(lp.cluster) if lp.cluster else None}, shared_bytes {lp.shared_bytes})",
                                    "launch_error") from None


# Errors after which the context is unusable: the worker reports them and exits.
STICKY_ERRORS = frozenset({
    "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_MISALIGNED_ADDRESS", "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    "CUDA_ERROR_INVALID_ADDRESS_SPACE", "CUDA_ERROR_INVALID_PC", "CUDA_ERROR_LAUNCH_FAILED",
    "CUDA_ERROR_HARDWARE_STACK_ERROR", "CUDA_ERROR_ASSERT", "CUDA_ERROR_LAUNCH_TIMEOUT",
    "CUDA_ERROR_TENSOR_MEMORY_LEAK", "CUDA_ERROR_CONTAINED", "CUDA_ERROR_ECC_UNCORRECTABLE",
    "CUDA_ERROR_UNKNOWN", "CUDA_ERROR_CONTEXT_IS_DESTROYED",
})
