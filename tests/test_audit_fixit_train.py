"""Audit of `agent fixit train`: an example longer than --max-length is left out and counted, never
trained on as a prompt with its answer cut off (or dropped silently while the result still counts
it); when no example fits, training refuses instead of training on nothing. Real TRL + PEFT on the
tiny random Llama of tests/test_fixit.py, on CPU."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_fixit import _fixture_runs, make_tiny_model
from trajectory_fixtures import eval_result, kernel, reply_for, write_run

from agent.fixit.build import BuildOptions, build


def _needs_the_train_extra() -> None:
    for mod in ("trl", "peft", "transformers", "datasets", "accelerate"):
        pytest.importorskip(mod)


def _data_and_model(tmp_path: Path) -> tuple[Path, Path, list[int]]:
    _needs_the_train_extra()
    from transformers import AutoTokenizer

    runs, data = _fixture_runs(tmp_path / "runs"), tmp_path / "data"
    # Two more runs whose corrections are long (a few hundred extra tokens): lengths spread apart.
    for tag in ("long1", "long2"):
        big = kernel(tag + "b", body=" ".join(f"out[{i}] += {i}.0f;" for i in range(60 * len(tag))))
        write_run(runs, tag, [[(kernel(tag), eval_result("compile"), reply_for(kernel(tag), "First."))],
                              [(big, eval_result("unverified"), reply_for(big, "Fixed."))]],
                  evaluation="skipped: no GPU")
    build([runs], data, BuildOptions())
    rows = [json.loads(line) for line in (data / "train.jsonl").read_text().splitlines()]
    base = make_tiny_model(tmp_path / "tiny", [m["content"] for r in rows for m in r["messages"]])
    tok = AutoTokenizer.from_pretrained(base)
    texts = [tok.apply_chat_template([{"role": m["role"], "content": m["content"]} for m in r["messages"]],
                                     tokenize=False) for r in rows]
    lengths = [len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
    return data, base, lengths


def test_examples_longer_than_max_length_are_left_out_and_counted(tmp_path):
    from agent.fixit.train import TrainOptions, train

    data, base, lengths = _data_and_model(tmp_path)
    ordered = sorted(lengths)
    # A limit in the widest gap between two example lengths: some fit whole, the others not at all.
    gap, i = max((ordered[k + 1] - ordered[k], k) for k in range(len(ordered) - 1))
    assert gap > 8, ordered
    limit = ordered[i] + gap // 2
    fit = sum(n <= limit for n in lengths)
    out = tmp_path / "adapter"
    result = train(data, TrainOptions(base_model=str(base), out=str(out), rank=4, lr=1e-3, max_length=limit))
    assert (result.examples, result.dropped_too_long) == (fit, len(lengths) - fit)
    assert result.steps == fit
    recorded = json.loads((out / "fixit_train.json").read_text())["result"]
    assert recorded["examples"] == fit and recorded["dropped_too_long"] == len(lengths) - fit


def test_no_example_fits_is_an_error_not_an_empty_training(tmp_path):
    from agent.fixit.train import TrainError, TrainOptions, train

    data, base, lengths = _data_and_model(tmp_path)
    with pytest.raises(TrainError, match="--max-length"):
        train(data, TrainOptions(base_model=str(base), out=str(tmp_path / "adapter"), rank=4,
                                 max_length=min(lengths) - 1))
    assert not (tmp_path / "adapter" / "adapter_model.safetensors").exists()


def test_the_adapter_records_which_data_and_split_it_was_trained_on(tmp_path):
    """An adapter evaluated on held-out tasks means something only if its data left them out:
    fixit_train.json names the data (path, sha256 of train.jsonl) and the data card's split."""
    _needs_the_train_extra()  # it trains a tiny model: the `train` extra (.[train]), as CI installs
    import hashlib

    from agent.fixit.train import TrainOptions, train

    runs, data = _fixture_runs(tmp_path / "runs"), tmp_path / "data"
    build([runs], data, BuildOptions(cap_per_error=1, split="train"))
    rows = [json.loads(line) for line in (data / "train.jsonl").read_text().splitlines()]
    base = make_tiny_model(tmp_path / "tiny", [m["content"] for r in rows for m in r["messages"]])
    out = tmp_path / "adapter"
    train(data, TrainOptions(base_model=str(base), out=str(out), rank=4, lr=1e-3, max_length=4096))
    recorded = json.loads((out / "fixit_train.json").read_text())["data"]
    assert recorded["path"] == str(data / "train.jsonl")
    assert recorded["sha256"] == hashlib.sha256((data / "train.jsonl").read_bytes()).hexdigest()
    card = json.loads((data / "data_card.json").read_text())
    assert recorded["split"] == "train" and recorded["runs_left_out"] == card["runs_left_out"]
    assert recorded["examples"] == card["examples"] == 5
