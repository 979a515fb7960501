"""LoRA fine-tuning on Fixit data with TRL's SFTTrainer and PEFT, loss on the answer only.

train.jsonl rows are chat messages whose last (assistant) message carries weight 1: they
become TRL prompt/completion rows (prompt = every message before it), and SFTTrainer's
completion_only_loss masks the prompt out of the loss. Runs on the user's GPU when there
is one, else on CPU (fine for tiny models, as the tests do). The adapter lands in `out`,
ready for vLLM:

    vllm serve BASE --enable-lora --lora-modules fixit=OUT --max-lora-rank RANK
    # then in a sweep config: models = [{spec = "openai/fixit", api_base = "http://localhost:8000/v1"}]

Needs the optional extra: pip install -e '.[train]' (transformers, trl, peft, datasets, accelerate).
"""
from __future__ import annotations

import contextlib
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

SERVE_HELP = """\
Serve the adapter with vLLM and benchmark it through a sweep:

  vllm serve BASE_MODEL --enable-lora --lora-modules fixit=ADAPTER_DIR --max-lora-rank RANK
  # sweep.toml:  models = [{spec = "openai/fixit", api_base = "http://localhost:8000/v1", name = "fixit"}]
  agent sweep sweep.toml && agent report runs/<sweep>
"""


class TrainError(ValueError):
    """Bad training input (missing extra, malformed data, base model without a chat template)."""


@dataclass
class TrainOptions:
    base_model: str  # a local folder of a chat model in Hugging Face format (never fetched from a hub)
    out: str
    rank: int = 16
    alpha: int | None = None  # LoRA alpha; 2 x rank when None
    dropout: float = 0.05
    lr: float = 2e-4
    epochs: float = 1.0
    batch_size: int = 1
    grad_accum: int = 1
    max_length: int = 16384  # an example holds the docs its run was sent: about 37k characters with the docs arm
    target_modules: str = "all-linear"
    seed: int = 0


@dataclass
class TrainResult:
    out: str
    examples: int
    steps: int
    train_loss: float | None
    device: str
    seconds: float
    loss_tokens: int  # tokens the loss is computed on (the answers)
    tokens: int  # all tokens seen
    dropped_too_long: int = 0  # examples longer than max_length, left out whole (`examples` does not count them)


def data_file(data: str | Path) -> Path:
    path = Path(data)
    return path / "train.jsonl" if path.is_dir() else path


def data_provenance(data: str | Path) -> dict:
    """Which data an adapter was trained on: the file, its sha256, and from the data card next to
    it the split it was built for and the runs that split left out (an adapter tested on held-out
    tasks means something only if its data left them out)."""
    import hashlib

    path = data_file(data)
    record: dict = {"path": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    card_path = path.parent / "data_card.json"
    if card_path.is_file():
        card = json.loads(card_path.read_text())
        record.update(split=(card.get("options") or {}).get("split"), runs=card.get("runs"),
                      runs_left_out=card.get("runs_left_out"), examples=card.get("examples"))
    else:
        record["split"] = "unknown (no data_card.json next to the data)"
    return record


def load_examples(data: str | Path) -> list[dict]:
    """train.jsonl (or a folder holding it) -> TRL conversational prompt/completion rows."""
    path = data_file(data)
    if not path.is_file():
        raise TrainError(f"{path}: no Fixit data (build it with `agent fixit build`)")
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        msgs = json.loads(line).get("messages") or []
        if len(msgs) < 2 or msgs[-1].get("role") != "assistant" or msgs[-1].get("weight", 1) != 1:
            raise TrainError(f"{path}:{n}: the last message must be the trained assistant message (weight 1)")
        if any(m.get("weight", 0) for m in msgs[:-1]):
            raise TrainError(f"{path}:{n}: only the last message may carry weight 1 (loss on the answer only)")
        clean = [{"role": m["role"], "content": m["content"]} for m in msgs]
        rows.append({"prompt": clean[:-1], "completion": clean[-1:]})
    if not rows:
        raise TrainError(f"{path}: no examples")
    return rows


def _loss_tokens(dataset) -> tuple[int, int]:
    """(tokens in the loss, all tokens) of TRL's tokenized training set: proof the prompt is masked."""
    if "labels" in dataset.column_names:  # TRL >= 1.x: -100 marks tokens left out of the loss
        labels = dataset["labels"]
        return sum(sum(1 for t in row if t != -100) for row in labels), sum(len(row) for row in labels)
    if "completion_mask" in dataset.column_names:  # older TRL: masks applied by the collator
        masks = dataset["completion_mask"]
        return sum(sum(m) for m in masks), sum(len(m) for m in masks)
    raise TrainError("TRL built no labels or completion mask: the loss would cover the prompt too")


def check_base_model(base_model: str) -> Path:
    """The base model is a local folder (config.json, weights, tokenizer): said at once, not
    after the hub's retries or as a traceback from transformers."""
    folder = Path(base_model)
    if not folder.is_dir():
        raise TrainError(f"--base-model {base_model}: no such folder; give a local folder of a chat model in "
                         f"Hugging Face format (download it first, e.g. huggingface-cli download NAME --local-dir DIR)")
    if not (folder / "config.json").is_file():
        raise TrainError(f"--base-model {base_model}: not a model folder (no config.json)")
    if not any(folder.glob("*.safetensors")) and not any(folder.glob("*.bin")):
        raise TrainError(f"--base-model {base_model}: no weights (*.safetensors or *.bin) in the folder")
    return folder


ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin", "fixit_train.json")
LIBRARIES = ("torch", "transformers", "trl", "peft", "datasets", "accelerate")


def check_out(out: str | Path) -> Path:
    """--out holds no adapter yet: a trained adapter is a result, never replaced by another training."""
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise TrainError(f"--out {out}: exists and is not a folder")
    held = [name for name in ADAPTER_FILES if (folder / name).exists()]
    if held:
        raise TrainError(f"--out {out} already holds an adapter ({held[0]}); give another --out, or remove it first")
    return folder


def library_versions() -> dict[str, str]:
    """The libraries that train (their versions decide the loss masking and when the seed is set)."""
    import importlib.metadata

    versions = {}
    for dist in LIBRARIES:
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions


def train(data: str | Path, options: TrainOptions) -> TrainResult:
    rows = load_examples(data)  # bad data is an error before the slow imports
    check_base_model(options.base_model)
    check_out(options.out)
    try:
        import torch
        from datasets import Dataset
        from peft import LoraConfig
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers import set_seed
        from trl import SFTConfig, SFTTrainer
    except ImportError as exc:
        raise TrainError(f"training needs the optional extra: pip install -e '.[train]' ({exc.name} missing)") from None

    start = time.monotonic()
    # Before anything draws: TRL releases before 1.x (pyproject allows them) build the LoRA matrices
    # before the trainer seeds itself, so the same --seed gave another adapter each time.
    set_seed(options.seed)
    try:  # local files only: a folder is what --base-model takes
        tokenizer = AutoTokenizer.from_pretrained(options.base_model, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise TrainError(f"--base-model {options.base_model}: the tokenizer could not be loaded: "
                         f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    if not tokenizer.chat_template:
        raise TrainError(f"{options.base_model}: the tokenizer has no chat template; use an instruct/chat model")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    cuda = torch.cuda.is_available()
    bf16 = cuda and torch.cuda.is_bf16_supported()
    try:
        model = AutoModelForCausalLM.from_pretrained(options.base_model, local_files_only=True,
                                                     dtype=torch.bfloat16 if bf16 else torch.float32)
    except (OSError, ValueError) as exc:
        raise TrainError(f"--base-model {options.base_model}: the model could not be loaded: "
                         f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    lora = LoraConfig(r=options.rank, lora_alpha=options.alpha or 2 * options.rank, lora_dropout=options.dropout,
                      target_modules=options.target_modules, task_type="CAUSAL_LM")
    # No truncation by TRL: it keeps the start, so a long prompt leaves the answer cut off (a kernel
    # without its end taught as the fix) or wholly out (TRL then drops the row unseen). Rows longer
    # than max_length are left out whole below, and counted.
    args = SFTConfig(
        output_dir=options.out, num_train_epochs=options.epochs, learning_rate=options.lr,
        per_device_train_batch_size=options.batch_size, gradient_accumulation_steps=options.grad_accum,
        max_length=None, completion_only_loss=True,  # the prompt is masked out of the loss
        bf16=bf16, use_cpu=not cuda, seed=options.seed, logging_steps=1, save_strategy="no",
        report_to=[], dataloader_num_workers=0)
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                         peft_config=lora)
    lengths = [len(ids) for ids in trainer.train_dataset["input_ids"]]
    keep = [i for i, n in enumerate(lengths) if n <= options.max_length]
    if not keep:
        raise TrainError(f"no example fits --max-length {options.max_length} tokens (the shortest has "
                         f"{min(lengths)}); raise --max-length")
    if len(keep) < len(lengths):
        trainer.train_dataset = trainer.train_dataset.select(keep)
    trained, total = _loss_tokens(trainer.train_dataset)
    if trained == 0:
        raise TrainError("no token of any answer is in the loss: nothing to train on")
    with contextlib.redirect_stdout(sys.stderr):  # the trainer prints its logs; stdout is for results
        output = trainer.train()
    trainer.save_model(options.out)  # the LoRA adapter (adapter_config.json + weights)
    tokenizer.save_pretrained(options.out)
    result = TrainResult(out=options.out, examples=len(keep), steps=output.global_step,
                         train_loss=float(output.training_loss) if output.training_loss is not None else None,
                         device="cuda" if cuda else "cpu", seconds=round(time.monotonic() - start, 2),
                         loss_tokens=trained, tokens=total, dropped_too_long=len(lengths) - len(keep))
    (Path(options.out) / "fixit_train.json").write_text(
        json.dumps({"options": asdict(options), "data": data_provenance(data), "result": asdict(result),
                    "versions": library_versions()}, indent=2) + "\n")
    return result
