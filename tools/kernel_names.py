"""One mapping from a manifest's kernel name to the PTX entry it means, used by every stage
that names kernels (the static check, SASS inspection, the launch, Nsight Compute), so a
kernel cannot be inspected as one entry, launched as another and profiled as a third.

A manifest names a kernel by its exact PTX entry name (extern "C" kernels, or a mangled
name) or by the plain name of a C++ kernel NVRTC mangled (`gemm` for `_Z4gemmPf`). When
both readings exist and differ (an extern "C" `gemm` beside a `hopper::gemm`), the name is
ambiguous: a manifest_error, never a guess.
"""
from __future__ import annotations

import re


class AmbiguousKernel(ValueError):
    pass


def resolve_kernel(name: str, entries: set[str] | list[str], symbols: dict[str, str]) -> str | None:
    """The PTX entry `name` means; None when no entry matches. Raises AmbiguousKernel."""
    entries = set(entries)
    mangled = symbols.get(name)
    if name in entries:
        if mangled and mangled != name and mangled in entries:
            raise AmbiguousKernel(f"kernel name {name!r} is ambiguous: it is both an extern \"C\" kernel and the "
                                  f"C++ kernel {mangled!r}; give the full entry name or rename one")
        return name
    return mangled if mangled and (not entries or mangled in entries) else None


_ENTRY_SIGNATURE = re.compile(r"\.entry\s+([\w$]+)\s*\(([^)]*)\)")
# `.param [.align N] .TYPE [.ptr .space .align N] name[N]`: the element type's width times the count
_PARAM = re.compile(r"\.param\s+(?:\.align\s+\d+\s+)?\.([a-z]+)(\d+)\b[^,\[]*?(?:\[(\d+)\])?\s*(?:,|$)")


def entry_param_sizes(ptx: str) -> dict[str, list[int]]:
    """PTX entry -> the byte size of each of its parameters, read from the `.entry` signature,
    so a manifest's argument count and sizes are checked without a GPU (the launch checks them
    again with cuFuncGetParamInfo). An entry whose signature is not in the text is left out."""
    out: dict[str, list[int]] = {}
    for m in _ENTRY_SIGNATURE.finditer(ptx):
        params = m[2].strip()
        out[m[1]] = [int(p[2]) // 8 * int(p[3] or 1) for p in _PARAM.finditer(params)] if params else []
    return out
