"""`agent doctor`: what this machine offers ptxbench: the CUDA toolchain (paths, versions,
whether ptxas accepts NVRTC's PTX), the GPU and driver (from nvidia-smi; CUDA is never
initialised here), key Python packages, and which LLM providers have credentials."""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
from importlib import metadata
from typing import Annotated

import typer

from agent.commands.common import ExitCode, console, print_json, wrap_items

# long paths and messages stay on one line each (rich would wrap them at 80 columns in a pipe)
say = functools.partial(console.print, highlight=False, soft_wrap=True)
from tools.compile import isa_check
from tools.toolchain import find_toolchain

PACKAGES = ("torch", "cuda-bindings", "cuda-pathfinder", "pydantic", "langgraph", "litellm", "typer", "numpy")
# Credentials litellm reads for common providers; only whether each is set is ever shown.
PROVIDER_KEYS = {
    "openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY", "gemini": "GEMINI_API_KEY",
    "deepseek": "DEEPSEEK_API_KEY", "mistral": "MISTRAL_API_KEY", "xai": "XAI_API_KEY",
    "groq": "GROQ_API_KEY", "together_ai": "TOGETHERAI_API_KEY", "openrouter": "OPENROUTER_API_KEY",
    "fireworks_ai": "FIREWORKS_AI_API_KEY", "azure": "AZURE_API_KEY", "huggingface": "HF_TOKEN",
}


def toolchain_report() -> dict:
    tc = find_toolchain()
    isa = isa_check(tc)
    return {
        "tools": {t.name: {"path": t.path, "version": t.version, "found_via": t.found_via, "missing": t.reason}
                  for t in tc.tools()},
        "include_dir": tc.include_dir,
        "notes": list(tc.notes),
        "ptx_isa": {"ok": isa.ok, "ptx_version": isa.ptx_version, "detail": isa.detail},
    }


def gpu_report() -> dict:
    """GPUs and driver from nvidia-smi, without touching CUDA in this process."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {"gpus": [], "driver": None, "reason": "no nvidia-smi on PATH (no NVIDIA driver here): "
                                                      "compile and inspect work, runs are skipped"}
    try:
        p = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"gpus": [], "driver": None, "reason": f"nvidia-smi failed: {exc}"}
    if p.returncode != 0:
        first = (p.stderr or p.stdout).strip().splitlines()[:1]
        return {"gpus": [], "driver": None, "reason": f"nvidia-smi failed: {' '.join(first)}"}
    rows = [[c.strip() for c in line.split(",")] for line in p.stdout.strip().splitlines() if line.strip()]
    gpus = [{"name": r[0], "memory": r[2] if len(r) > 2 else None} for r in rows]
    return {"gpus": gpus, "driver": rows[0][1] if rows else None, "reason": None if rows else "nvidia-smi lists no GPU"}


def packages_report() -> dict:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def credentials_report() -> dict:
    return {provider: ("set" if os.environ.get(var) else "unset") for provider, var in PROVIDER_KEYS.items()}


def doctor(json_out: Annotated[bool, typer.Option("--json", help="print JSON")] = False) -> None:
    """Check the toolchain, GPU, packages and LLM credentials; exit 3 if kernels cannot be compiled."""
    data = {"toolchain": toolchain_report(), "gpu": gpu_report(), "packages": packages_report(),
            "credentials": credentials_report()}
    tools = data["toolchain"]["tools"]
    can_compile = bool(tools["ptxas"]["path"] and tools["nvrtc"]["path"] and data["toolchain"]["ptx_isa"]["ok"])
    data["ok"] = can_compile
    if json_out:
        print_json(data)
    else:
        _show(data)
    if not can_compile:  # the machine, not a kernel: the infrastructure exit status
        raise typer.Exit(ExitCode.INFRA)


def _show(data: dict) -> None:
    tc = data["toolchain"]
    say("[bold]toolchain[/bold]")
    for name, t in tc["tools"].items():
        if t["path"]:
            line = f"  {name:<10} {t['version'] or '?':<10} {t['path']}  [dim]({t['found_via']})[/dim]"
            if len(line) - len("[dim][/dim]") > console.width:  # a long path goes on a line of its own
                line = f"  {name:<10} {t['version'] or '?':<10} [dim]({t['found_via']})[/dim]\n    {t['path']}"
            say(line)
        else:
            say(f"  {name:<10} [red]missing[/red]: {t['missing']}")
    headers = tc['include_dir'] or '[red]missing[/red]'
    say(f"  {'headers':<10} {'':<10} {headers}" if 24 + len(headers) <= console.width else f"  headers\n    {headers}")
    isa = tc["ptx_isa"]
    wrap_items(f"  ptx isa    {'[green]ok[/green]' if isa['ok'] else '[red]FAIL[/red]'}:", isa['detail'].split(" "),
               sep="", indent="    ")
    for note in tc["notes"]:
        say(f"  [yellow]note[/yellow]: {note}")
    gpu = data["gpu"]
    say("[bold]gpu[/bold]")
    for g in gpu["gpus"]:
        say(f"  {g['name']} ({g['memory']}), driver {gpu['driver']}")
    if gpu["reason"]:
        wrap_items("  none:", gpu['reason'].split(" "), sep="", indent="    ")
    say("[bold]packages[/bold]")
    wrap_items(" ", [f"{k} {v or '[red]missing[/red]'}" for k, v in data["packages"].items()])
    say("[bold]llm credentials[/bold]")
    wrap_items(" ", [f"{k} {'[green]set[/green]' if v == 'set' else 'unset'}" for k, v in data["credentials"].items()])


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
