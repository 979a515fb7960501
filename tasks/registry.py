"""The benchmark's tasks by name, their aliases, task groups and splits, and loading a
FlashInfer-Bench Definition JSON.

`get_task` accepts a task name, an alias, or a path to a JSON file (a FlashInfer-Bench
Definition, optionally with ptxbench's extensions: workloads, tolerance, flops, scalars,
requested_features, baseline, generator).

`select_tasks` also accepts a group, `<family>:<selector>` (e.g. `gemm:*`, `attention:causal`,
`ptxbench:all`, `ptxbench:held_out_tasks`): sweeps, bench and reports name sets of tasks that way.
`task_split` says which split a whole task belongs to: `train` (Fixit data may be built from its
runs) or `held_out_tasks` (never: the generalisation question is asked on these).
"""
from __future__ import annotations

import difflib
import json
from pathlib import Path

from pydantic import ValidationError

from tasks.families.attention import backward_task, forward_task
from tasks.families.fp8_attention import fp8_forward_task
from tasks.families.fp8_gemm import fp8_gemm_task
from tasks.families.gdn import gdn_tasks
from tasks.families.gemm import gemm_tasks
from tasks.schema import Task, Workload
from tasks.validation_words import plain_validation_errors


class UnknownTask(ValueError):
    """No task by that name; the message is one line and suggests close names."""


def _build() -> dict[str, Task]:
    tasks = [
        *gemm_tasks(),  # the seed shape n7168_k5120, then PTXBench's 16 other (N, K) shapes
        forward_task(128), forward_task(128, causal=True),
        backward_task(128), backward_task(128, causal=True),
        # held-out head-dimension variants, non-causal and causal (PTXBench's)
        forward_task(64), forward_task(96), backward_task(64), backward_task(96),
        forward_task(256), backward_task(256),
        forward_task(64, causal=True), forward_task(96, causal=True), forward_task(256, causal=True),
        backward_task(64, causal=True), backward_task(96, causal=True),
        fp8_gemm_task(),  # PTXBench's fp8_gemm_nt_1d2d_n4096_k7168: e4m3, 1x128 / 128x128 block scales
        *gdn_tasks(),  # Gated DeltaNet decode, prefill and MTP, qk4_v8 and qk8_v16
        # FP8 attention forward with LSE (PTXBench's fp8_mha_with_lse); d64/d96/d256 held out
        fp8_forward_task(128), fp8_forward_task(128, causal=True),
        fp8_forward_task(64), fp8_forward_task(96), fp8_forward_task(256),
        fp8_forward_task(64, causal=True), fp8_forward_task(96, causal=True), fp8_forward_task(256, causal=True),
    ]
    return {t.name: t for t in tasks}


TASKS: dict[str, Task] = _build()

ALIASES: dict[str, str] = {
    "gemm": "gemm_n7168_k5120",
    "fp8_gemm": "fp8_gemm_nt_1d2d_n4096_k7168",
    "attn_fwd": "mha_fwd_d128",
    "attn_fwd_causal": "mha_fwd_d128_causal",
    "attn_bwd": "mha_bwd_d128",
    "attn_bwd_causal": "mha_bwd_d128_causal",
    "gdn_decode": "gdn_decode_qk4_v8_d128_k_last",
    "gdn_prefill": "gdn_prefill_qk4_v8_d128_k_last",
    "gdn_mtp": "gdn_mtp_qk4_v8_d128_k_last",
    "fp8_attn_fwd": "fp8_mha_with_lse_d128",
    "fp8_attn_fwd_causal": "fp8_mha_with_lse_d128_causal",
}


def list_tasks(include_variants: bool = True) -> list[Task]:
    """Seed tasks first, then the held-out variants (each a fresh copy: callers may mutate it)."""
    tasks = [t for t in TASKS.values() if include_variants or "held_out_variant" not in t.tags]
    return [t.model_copy(deep=True) for t in sorted(tasks, key=lambda t: "held_out_variant" in t.tags)]


def aliases_of(name: str) -> list[str]:
    return [a for a, target in ALIASES.items() if target == name]


def get_task(name: str | Path) -> Task:
    """A task by name, alias, or path to a Definition JSON file; raises UnknownTask otherwise."""
    key = str(name).strip()
    if key in TASKS:
        return TASKS[key].model_copy(deep=True)
    if key in ALIASES:
        return TASKS[ALIASES[key]].model_copy(deep=True)
    if key.endswith(".json") or Path(key).is_file():
        return load_definition(key)
    close = difflib.get_close_matches(key, list(TASKS) + list(ALIASES), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(list(ALIASES) + list(TASKS))}"
    raise UnknownTask(f"unknown task {key!r}; {hint}")


# ---------------------------------------------------------------------------------------------
# Task groups: `<family>:<selector>`. A family is a set of op types; "ptxbench" is every task.

GROUP_FAMILIES: dict[str, tuple[str, ...] | None] = {
    "gemm": ("gemm",),
    "fp8_gemm": ("fp8_gemm",),
    "attention": ("mha_fwd", "mha_bwd"),
    "attention_fwd": ("mha_fwd",),
    "attention_bwd": ("mha_bwd",),
    "fp8_attention": ("fp8_mha_fwd",),
    "gdn": ("gdn_decode", "gdn_prefill", "gdn_mtp"),
    "ptxbench": None,  # every task
}
SPLITS = ("train", "held_out_tasks")

# Whole tasks no Fixit data is built from (`agent fixit build --split train`), so that a
# fine-tuned model can be asked whether what it learned carries to problems it never trained on:
# - GEMM shapes: one per kind of difficulty (a tiny N, a tall K, a very wide N, a square one, and
#   a mid one), the other 12 shapes stay in train;
# - every d96 task (a head dimension no tile size divides evenly: a size never seen), and the
#   causal head-dimension variants (d64/d256 causal: a variant never seen, the causal mask at a
#   head size train sees only without it; d96 causal: both unseen; d128 causal stays in train);
# - GDN MTP at qk8_v16 (train sees the qk4_v8 MTP; decode and prefill stay in train).
_HELD_OUT_GEMM = ("gemm_n128_k2048", "gemm_n5376_k21504", "gemm_n34816_k5120", "gemm_n4096_k4096", "gemm_n2048_k5376")
HELD_OUT_TASKS: frozenset[str] = frozenset(
    [*_HELD_OUT_GEMM, "gdn_mtp_qk8_v16_d128_k_last"]
    + [n for n, t in TASKS.items() if "_d96" in n or ("causal" in t.tags and "held_out_variant" in t.tags)])


def task_family(name: str) -> str:
    """The family a task is reported under (its op family: GEMM, attention forward, ...); a task
    of no registry (a Definition JSON) is its own family."""
    task = TASKS.get(name) or TASKS.get(ALIASES.get(name, ""))
    return task.op_family if task else name


def task_split(name: str) -> str:
    """`held_out_tasks` for a task no Fixit data may come from, else `train` (unknown names: train)."""
    return "held_out_tasks" if name in HELD_OUT_TASKS else "train"


def is_group(spec: str) -> bool:
    return ":" in str(spec) and not str(spec).endswith(".json")


def select_tasks(spec: str | Path) -> list[str]:
    """Task names for a task name, alias, Definition path, or group `<family>:<selector>`.

    The selector is `*` or `all` (the whole family), a split (`train`, `held_out_tasks`), or a tag
    (`causal`, `seed`, `held_out_variant`, `decode`, `mtp`, `fp8`, ...). Raises UnknownTask with
    the known families and selectors when nothing matches. Names come in registry order."""
    key = str(spec).strip()
    if not is_group(key):
        return [get_task(key).name]
    family, _, selector = key.partition(":")
    if family not in GROUP_FAMILIES:
        raise UnknownTask(f"unknown task group {key!r}: families are {', '.join(GROUP_FAMILIES)} "
                          f"(e.g. gemm:*, attention:causal, ptxbench:all)")
    op_types = GROUP_FAMILIES[family]
    members = [t for t in TASKS.values() if op_types is None or t.op_type in op_types]
    if selector in ("*", "all"):
        chosen = members
    elif selector in SPLITS:
        chosen = [t for t in members if task_split(t.name) == selector]
    else:
        chosen = [t for t in members if selector in t.tags]
    if not chosen:
        tags = sorted({tag for t in members for tag in t.tags})
        raise UnknownTask(f"task group {key!r} selects no task; selectors: *, all, {', '.join(SPLITS)}, "
                          f"or a tag ({', '.join(tags)})")
    return [t.name for t in chosen]


def select_many(specs: list[str]) -> list[str]:
    """The union of several selections, first occurrence first (a task named twice counts once)."""
    return list(dict.fromkeys(name for spec in specs for name in select_tasks(spec)))


def load_definition(path: str | Path) -> Task:
    """Load a FlashInfer-Bench Definition JSON (plus any ptxbench extensions) as a Task.

    What a plain Definition lacks gets a default: no workloads (evaluating it then says so),
    tolerance 1e-2, no requested features, no baseline. FlashInfer-Bench writes scalar inputs
    (e.g. sm_scale) as inputs with `"shape": null`; they become task scalars, whose value must
    come from a `scalars` entry (the Definition carries no value), except `sm_scale`, which
    defaults to 1/sqrt(head dimension) when the head-dimension axis is recognisable.
    """
    path = Path(path)
    if not path.is_file():
        raise UnknownTask(f"task file {str(path)!r} does not exist")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:  # a binary file given as --task: say so, not its decoder position
        raise UnknownTask(f"{path}: not a JSON Definition (not UTF-8 text)") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise UnknownTask(f"{path}: not a readable JSON Definition ({exc})") from None
    if not isinstance(data, dict):
        raise UnknownTask(f"{path}: a Definition is a JSON object, got {type(data).__name__}")
    data = dict(data)
    scalars = dict(data.get("scalars") or {})
    inputs = {}
    for name, spec in (data.get("inputs") or {}).items():
        if isinstance(spec, dict) and spec.get("shape") is None:
            if name not in scalars:
                scalars[name] = _default_scalar(name, data.get("axes") or {}, path)
        else:
            inputs[name] = spec
    data["inputs"], data["scalars"] = inputs, scalars
    data["workloads"] = [_workload(w, i) for i, w in enumerate(data.get("workloads") or [])]
    if isinstance(data.get("reference"), list):  # some Definitions store source as a list of lines
        data["reference"] = "\n".join(data["reference"])
    try:
        return Task.model_validate(data)
    except ValidationError as exc:
        raise UnknownTask(f"{path}: not a valid Definition: {plain_validation_errors(exc.errors())}") from None


def _default_scalar(name: str, axes: dict, path: Path) -> str:
    if name == "sm_scale":
        for axis in ("head_dim", "head_dim_qk", "D", "head_size"):
            if isinstance(axes.get(axis), dict) and axes[axis].get("type") == "const":
                return f"1/sqrt({axis})"
    raise UnknownTask(f"{path}: scalar input {name!r} has no value; give it under \"scalars\" "
                      f"(e.g. \"scalars\": {{\"{name}\": \"1.0\"}})")


def _workload(entry: dict, index: int) -> dict:
    """Accept ptxbench's {"name", "axes", "split"} and FlashInfer-Bench's {"workload": {"uuid", "axes"}}."""
    if isinstance(entry, dict) and "workload" in entry and isinstance(entry["workload"], dict):
        inner = entry["workload"]
        return Workload(name=str(inner.get("uuid") or f"w{index}"), axes=inner.get("axes") or {},
                        split=entry.get("split", "visible")).model_dump()
    if isinstance(entry, dict) and "axes" in entry:
        name = entry.get("name") or "_".join(f"{k}{v}" for k, v in entry["axes"].items()) or f"w{index}"
        return {**entry, "name": name}
    return entry  # let validation say what is wrong


def missing_workloads_reason(task: Task, which: str = "visible") -> str | None:
    """Why `task` cannot be evaluated on `which` workloads, or None if it can."""
    if task.workloads_for(which):  # type: ignore[arg-type]
        return None
    if not task.workloads:
        return (f"task {task.name} defines no workloads (a plain FlashInfer-Bench Definition has none): add "
                f"\"workloads\": [{{\"name\": ..., \"axes\": {{...}}}}] giving the var axes "
                f"({', '.join(n for n, a in task.axes.items() if a.type == 'var') or 'none'})")
    return f"task {task.name} has no {which} workloads"

