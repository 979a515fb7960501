"""Audit 6 of `agent fixit train`: an adapter is a result, kept with what made it.

- A second training into a folder that holds an adapter replaced it (weights, tokenizer and its
  fixit_train.json) without a word: a trained adapter, hours of GPU, lost to a repeated command or
  the default --out. Refused, the adapter left as it was.
- Training is reproducible from its record: the same data, base model and --seed give the same
  adapter (the LoRA matrices are drawn before the trainer seeds itself in older TRL releases that
  pyproject allows, so the seed is set before the model is built), and fixit_train.json names the
  libraries that trained it (their versions decide the masking and the seeding).

Real TRL + PEFT on the tiny random Llama of tests/test_fixit.py, on CPU.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_fixit import _fixture_runs, make_tiny_model

from agent.fixit.build import BuildOptions, build


def _data_and_model(tmp_path: Path) -> tuple[Path, Path]:
    for mod in ("trl", "peft", "transformers", "datasets", "accelerate"):
        pytest.importorskip(mod)
    runs, data = _fixture_runs(tmp_path / "runs"), tmp_path / "data"
    build([runs], data, BuildOptions(cap_per_error=1))
    rows = [json.loads(line) for line in (data / "train.jsonl").read_text().splitlines()]
    base = make_tiny_model(tmp_path / "tiny", [m["content"] for r in rows for m in r["messages"]])
    return data, base


def _options(base: Path, out: Path, **kw):
    from agent.fixit.train import TrainOptions

    return TrainOptions(base_model=str(base), out=str(out), rank=4, lr=1e-3, max_length=4096, **kw)


def test_training_into_a_folder_holding_an_adapter_is_refused(tmp_path):
    from agent.fixit.train import TrainError, train

    data, base = _data_and_model(tmp_path)
    out = tmp_path / "adapter"
    train(data, _options(base, out))
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    with pytest.raises(TrainError, match="already holds an adapter"):
        train(data, _options(base, out, epochs=2.0))
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    # the CLI says it in one line, exit 2
    from agent_loop_helpers import agent_cli

    p = agent_cli("fixit", "train", str(data), "--base-model", str(base), "--out", str(out), "--rank", "4")
    assert p.returncode == 2 and "already holds an adapter" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_the_same_seed_gives_the_same_adapter_and_the_record_names_the_libraries(tmp_path):
    from agent.fixit.train import train

    data, base = _data_and_model(tmp_path)  # skips without the train extra, which brings safetensors
    from safetensors.torch import load_file

    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for out, seed in ((a, 3), (b, 3), (c, 4)):
        train(data, _options(base, out, seed=seed))
    wa, wb, wc = (load_file(str(x / "adapter_model.safetensors")) for x in (a, b, c))
    assert wa.keys() == wb.keys() and all((wa[k] == wb[k]).all() for k in wa)
    assert any(not (wa[k] == wc[k]).all() for k in wa)  # the seed is what decides them
    record = json.loads((a / "fixit_train.json").read_text())
    assert record["options"]["seed"] == 3
    assert {"torch", "transformers", "trl", "peft"} <= set(record["versions"]), record.get("versions")
