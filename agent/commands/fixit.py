"""`agent fixit build` (fine-tuning data from trajectories) and `agent fixit train` (LoRA with TRL)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import List, Optional

import typer

from agent.commands.common import console, err_console, fail, out_folder, plural, print_json

fixit_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                        help="Fine-tuning data from a model's own mistakes, and LoRA training.")


def register(app: typer.Typer) -> None:
    app.add_typer(fixit_app, name="fixit")


BUILD_HELP = (
    "Fine-tuning data from trajectories: pair every failed turn (compile, runtime, numerical, timeout, features "
    "missing) with the later turn of the same run that fixed that error class (or a teacher's repair), explain "
    "the fix, balance per task, error class and turn, drop near-duplicates, and write chat-format JSONL (loss on "
    "the last message only) with a data card. See docs/FIXIT.md.")


@fixit_app.command("build", help=BUILD_HELP)
def build(
    runs: List[Path] = typer.Argument(..., help="run folders or sweep folders"),
    out: Path = typer.Option(..., "--out", help="data folder: train.jsonl, data_card.md, data_card.json"),
    teacher: Optional[str] = typer.Option(None, help="model that repairs failures no later turn fixed (agent loop)"),
    teacher_api_base: Optional[str] = typer.Option(None, help="api_base for the teacher"),
    teacher_turns: int = typer.Option(3, help="turns the teacher gets to repair one failure"),
    explainer: Optional[str] = typer.Option(
        None, help="model that explains each fix (default: the fixing reply's own reasoning)"),
    explainer_api_base: Optional[str] = typer.Option(None, help="api_base for the explainer"),
    min_speedup: Optional[float] = typer.Option(None, help="keep fixes timed at least this fast vs the library"),
    cap_per_task: Optional[int] = typer.Option(None, help="at most N examples per task"),
    cap_per_error: Optional[int] = typer.Option(None, help="at most N examples per error class"),
    max_examples: Optional[int] = typer.Option(
        None, help="at most N examples, the first N of the balanced order (spread over tasks, error classes and "
                   "turns); with --task, N from those tasks only: equal-size sets for diverse-vs-narrow data"),
    task: Optional[List[str]] = typer.Option(None, "--task", help="only examples of this task (repeatable; aliases "
                                                                  "accepted)"),
    max_chars: int = typer.Option(60_000, help="drop pairs whose two kernels exceed this many characters"),
    seed: int = typer.Option(0, help="seed of the stratified down-sampling"),
    split: str = typer.Option(
        "train", help="train: only runs of the train split's tasks (the held_out_tasks, marked by `agent tasks`, "
                       "give no examples); all: every run"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace a data set already in --out"),
    as_json: bool = typer.Option(False, "--json", help="print the data card as JSON"),
) -> None:
    from agent.fixit.build import BuildOptions, Filters, build as build_data

    if split not in ("train", "all"):
        fail(f"--split must be train or all, not {split!r} (no Fixit data is built from held-out tasks)")

    missing = [str(p) for p in runs if not p.exists()]
    if missing:
        fail(f"no such run or sweep folder: {missing[0]}")
    for name, cap in (("--cap-per-task", cap_per_task), ("--cap-per-error", cap_per_error),
                      ("--max-examples", max_examples), ("--max-chars", max_chars), ("--teacher-turns", teacher_turns)):
        if cap is not None and cap < 1:
            fail(f"{name} must be at least 1, not {cap}")
    if min_speedup is not None and not (math.isfinite(min_speedup) and min_speedup > 0):
        fail(f"--min-speedup must be a positive number, not {min_speedup}")
    tasks = None
    if task:
        from tasks.registry import UnknownTask, get_task

        try:
            tasks = tuple(sorted({get_task(t).name for t in task}))
        except UnknownTask as exc:
            fail(str(exc).splitlines()[0])
    out_folder(out)
    held = [name for name in DATA_FILES if (out / name).exists()]
    if held and not overwrite:  # a data set is a result: never replaced by another build unasked
        fail(f"--out {out} already holds a data set ({held[0]}); give another --out, or --overwrite to replace it")
    options = BuildOptions(teacher=teacher, teacher_api_base=teacher_api_base, teacher_turns=teacher_turns,
                           explainer=explainer,
                           explainer_api_base=explainer_api_base,
                           filters=Filters(min_speedup=min_speedup, max_chars=max_chars),
                           cap_per_task=cap_per_task, cap_per_error=cap_per_error, max_examples=max_examples,
                           tasks=tasks, seed=seed, split=None if split == "all" else split)
    try:
        result = build_data(runs, out, options)
    except (ValueError, OSError) as exc:
        fail((str(exc).splitlines() or [type(exc).__name__])[0])
    if max_examples is not None and result.examples < max_examples:  # equal-size arms are equal only if both fill
        err_console.print(f"warning: only {plural(result.examples, 'example')}, fewer than --max-examples "
                          f"{max_examples}: a set built with the same --max-examples from other tasks is larger",
                          highlight=False, markup=False)
    if as_json:
        print_json(result.card)
        return
    card = result.card
    console.print(f"{plural(result.examples, 'example')} -> {out / 'train.jsonl'} (by error: "
                  f"{_counts(card['by_error'])}; by source: {_counts(card['by_source'])}); "
                  f"data card: {out / 'data_card.md'}", highlight=False)


DATA_FILES = ("train.jsonl", "data_card.json", "data_card.md")  # what `fixit build` writes into --out


def _counts(counts: dict) -> str:
    """{'compile': 3, 'runtime': 1} -> 'compile 3, runtime 1' (a person's words, not a dict)."""
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "none"


TRAIN_HELP = (
    "LoRA fine-tuning on Fixit data with TRL (SFTTrainer) + PEFT, loss on the answer only.\n\n"
    "Runs on the GPU when there is one, else on CPU (fine for tiny models). Needs the optional extra: "
    "pip install -e '.[train]'.\n\n"
    "\b\n"  # keep the lines below as they are
    "Serve the adapter with vLLM and benchmark it through a sweep:\n"
    "  vllm serve BASE_MODEL --enable-lora --lora-modules fixit=ADAPTER_DIR \\\n"
    "      --max-lora-rank RANK\n"
    "  # sweep.toml: models = [{spec = \"openai/fixit\", name = \"fixit\",\n"
    "  #                        api_base = \"http://localhost:8000/v1\"}]\n"
    "  agent sweep sweep.toml && agent report runs/<sweep>\n"
    "See docs/FIXIT.md.")


@fixit_app.command("train", help=TRAIN_HELP)
def train(
    data: Path = typer.Argument(..., help="data folder from `agent fixit build` (or its train.jsonl)"),
    base_model: str = typer.Option(..., "--base-model", help="local folder of a chat model (Hugging Face format: "
                                                             "config.json, weights, tokenizer); never downloaded"),
    out: Path = typer.Option(Path("fixit-adapter"), "--out", help="where the LoRA adapter goes"),
    rank: int = typer.Option(16, help="LoRA rank"),
    alpha: Optional[int] = typer.Option(None, help="LoRA alpha (default 2 x rank)"),
    lr: float = typer.Option(2e-4, help="learning rate"),
    epochs: float = typer.Option(1.0, help="epochs"),
    batch_size: int = typer.Option(1, help="per-device batch size"),
    grad_accum: int = typer.Option(1, help="gradient accumulation steps"),
    max_length: int = typer.Option(16384, help="tokens per example (longer ones are left out whole, and counted)"),
    seed: int = typer.Option(0),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
) -> None:
    from dataclasses import asdict

    from agent.fixit.train import TrainError, TrainOptions, train as train_adapter

    if not (math.isfinite(lr) and lr > 0 and math.isfinite(epochs) and epochs > 0):  # nan passes "<= 0"
        fail(f"--lr and --epochs must be positive numbers, not {lr:g} and {epochs:g}")
    for name, n in (("--rank", rank), ("--batch-size", batch_size), ("--grad-accum", grad_accum),
                    ("--max-length", max_length), ("--alpha", alpha)):
        if n is not None and n < 1:
            fail(f"{name} must be at least 1, not {n}")
    options = TrainOptions(base_model=base_model, out=str(out), rank=rank, alpha=alpha, lr=lr, epochs=epochs,
                           batch_size=batch_size, grad_accum=grad_accum, max_length=max_length, seed=seed)
    try:
        result = train_adapter(data, options)
    except (TrainError, OSError) as exc:
        fail(str(exc).splitlines()[0])
    if as_json:
        print_json(asdict(result))
        return
    loss = "n/a" if result.train_loss is None else f"{result.train_loss:.4f}"
    longer = (f" ({plural(result.dropped_too_long, 'example')} longer than --max-length {max_length} left out)"
              if result.dropped_too_long else "")
    console.print(f"adapter -> {result.out}: {plural(result.examples, 'example')}{longer}, "
                  f"{plural(result.steps, 'step')}, "
                  f"loss {loss} "
                  f"({result.loss_tokens} of {result.tokens} tokens) on {result.device} in {result.seconds:.0f}s",
                  highlight=False)
    console.print(f"serve: vllm serve {base_model} --enable-lora --lora-modules fixit={result.out} "
                  f"--max-lora-rank {rank}", highlight=False)
