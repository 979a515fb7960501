"""agent fixit: failed turns paired with their corrections, explained, balanced, deduplicated,
written as chat JSONL + data card; a teacher repairs through the real agent loop; LoRA
training runs end to end on a tiny randomly initialised model built here (nothing downloaded)."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
from agent_loop_helpers import broken_probe_reply, probe_reply
from trajectory_fixtures import ATTN, GEMM, eval_result, kernel, reply_for, write_run

from agent.fixit.build import (BuildOptions, Filters, build, error_classes, find_pairs, jaccard, load_attempts,
                               reasoning_text, shingles)
from tools.solution import extract_solution


def _c(kind: str, tag: str, speedup: float | None = None, task: str = GEMM, why: str = ""):
    s = kernel(tag)
    return (s, eval_result(kind, task=task, speedup=speedup), reply_for(s, why or f"Reasoning for {tag}."))


def _fixture_runs(root: Path) -> Path:
    # GPU run: compile error -> correct without features -> wrong numbers -> correct with features.
    write_run(root, "a", [[_c("compile", "a1")], [_c("correct_nofeat", "a2", 0.4)], [_c("numerical", "a3")],
                          [_c("correct", "a4", 1.1, why="Swapped the K loop order so the accumulator is reset.")]])
    # GPU run: a crash, then a timeout, then correct.
    write_run(root, "b", [[_c("runtime", "b1")], [_c("timeout", "b2")], [_c("correct", "b3", 0.5)]])
    # CPU run on attention: compile error -> no features -> features (unverified).
    write_run(root, "c", [[_c("compile", "c1", task=ATTN)], [_c("nofeat", "c2", task=ATTN)],
                          [_c("unverified", "c3", task=ATTN)]], task=ATTN, evaluation="skipped: no GPU")
    # The same kernels again in another run: near-duplicates of run c's pairs.
    write_run(root, "d", [[_c("compile", "c1", task=ATTN)], [_c("nofeat", "c2", task=ATTN)],
                          [_c("unverified", "c3", task=ATTN)]], task=ATTN, evaluation="skipped: no GPU")
    # Never fixed.
    write_run(root, "e", [[_c("compile", "e1")], [_c("compile", "e2")]])
    return root


def test_error_classes_and_pairs(tmp_path):
    root = _fixture_runs(tmp_path / "runs")
    a = load_attempts(root / "a")
    assert [sorted(error_classes(x)) for x in a] == [["compile"], ["features_missing"], ["numerical"], []]
    pairs, unfixed = find_pairs(a)
    got = sorted((p.error, p.failed.record.turn, p.fixed.record.turn) for p in pairs)
    # The compile error is fixed at turn 2 (it compiled); missing features and wrong numbers only at turn 4
    # (turn 3 has the features but fails the numbers turn 2 got right).
    assert got == [("compile", 1, 2), ("features_missing", 2, 4), ("numerical", 3, 4)] and not unfixed
    b_pairs, _ = find_pairs(load_attempts(root / "b"))
    # A timed-out kernel does not count as a fix of a crash.
    assert sorted((p.error, p.failed.record.turn, p.fixed.record.turn) for p in b_pairs) == \
        [("runtime", 1, 3), ("timeout", 2, 3)]
    c_pairs, _ = find_pairs(load_attempts(root / "c"))
    assert sorted(p.error for p in c_pairs) == ["compile", "features_missing"]  # no GPU: no runtime classes
    e_pairs, e_unfixed = find_pairs(load_attempts(root / "e"))
    assert not e_pairs and len(e_unfixed) == 2


def test_build_writes_chat_jsonl_and_data_card(tmp_path):
    root = _fixture_runs(tmp_path / "runs")
    out = tmp_path / "data"
    proc = subprocess.run([sys.executable, "-m", "agent.cli", "fixit", "build", str(root), "--out", str(out),
                           "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    card = json.loads(proc.stdout)
    assert card["pairs_found"] == 9 and card["dropped"]["near_duplicate"] == 2 and card["unfixed_failures"] == 2
    assert card["examples"] == 7
    assert card["by_error"] == {"compile": 2, "features_missing": 2, "numerical": 1, "runtime": 1, "timeout": 1}
    assert card["by_task"] == {ATTN: 2, GEMM: 5} and card["by_source"] == {"trajectory": 7}
    rows = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 7 and json.loads((out / "data_card.json").read_text()) == card
    assert "# Fixit data card" in (out / "data_card.md").read_text()
    for row in rows:
        msgs = row["messages"]
        assert [m["role"] for m in msgs] == ["system", "user", "assistant"]
        assert [m["weight"] for m in msgs] == [0, 0, 1]  # loss on the last message only
        assert "## Your previous attempt" in msgs[1]["content"] and "feedback for turn" in msgs[1]["content"]
        fixed = extract_solution(msgs[2]["content"])  # the answer parses as a solution, as the loop would
        assert fixed.manifest.launches[0].kernel.startswith("k_")
    numerical = next(r for r in rows if r["meta"]["error"] == "numerical")
    assert numerical["messages"][2]["content"].startswith("Swapped the K loop order")
    assert numerical["meta"]["fixed_speedup"] == 1.1 and numerical["meta"]["explanation_source"] == "reply"
    assert "k_a3" in numerical["messages"][1]["content"] and "k_a4" in numerical["messages"][2]["content"]


def test_balance_caps_filters_and_seed(tmp_path):
    root = _fixture_runs(tmp_path / "runs")
    one = build([root], tmp_path / "d1", BuildOptions(cap_per_error=1, seed=1))
    assert one.examples == 5 and set(one.card["by_error"].values()) == {1}
    build([root], tmp_path / "d2", BuildOptions(cap_per_error=1, seed=1))
    assert (tmp_path / "d1/train.jsonl").read_text() == (tmp_path / "d2/train.jsonl").read_text()
    per_task = build([root], tmp_path / "d3", BuildOptions(cap_per_task=2))
    assert per_task.card["by_task"] == {ATTN: 2, GEMM: 2} and per_task.card["dropped"]["over_cap"] == 3
    # Stratified: with two per task, GEMM keeps two different error classes, not two of one.
    rows = [json.loads(x) for x in (tmp_path / "d3/train.jsonl").read_text().splitlines()]
    assert len({r["meta"]["error"] for r in rows if r["meta"]["task"] == GEMM}) == 2
    fast = build([root], tmp_path / "d4", BuildOptions(filters=Filters(min_speedup=1.0)))
    # Only turn 4 of run a (1.1x) is timed that fast; it fixed two errors. Untimed (CPU) fixes are dropped too.
    assert fast.card["by_error"] == {"features_missing": 1, "numerical": 1}
    assert fast.card["dropped"]["below_min_speedup"] == 7


def test_near_duplicates_and_reasoning():
    a = kernel("x").source
    assert jaccard(shingles(a), shingles(a.replace("  ", "    ").replace("\n", "\n\n"))) == 1.0
    assert jaccard(shingles(a), shingles(a + "// a comment that changes nothing\n")) == 1.0
    assert jaccard(shingles(a), shingles(kernel("y").source)) < 0.5
    assert reasoning_text("Why:\n```cuda\nint x;\n```\nBecause.\n```json\n{}\n```") == "Why:\n\nBecause."


def test_explainer_model(tmp_path):
    root = tmp_path / "runs"
    write_run(root, "a", [[_c("compile", "a1")], [_c("unverified", "a2")]])
    script = tmp_path / "explainer.json"
    script.write_text(json.dumps({"replies": ["The missing semicolon stopped NVRTC; the fix adds it."]}))
    res = build([root], tmp_path / "data", BuildOptions(explainer=f"scripted:{script}"))
    row = json.loads((tmp_path / "data/train.jsonl").read_text())
    assert row["messages"][2]["content"].startswith("The missing semicolon")
    assert res.card["by_explanation_source"] == {"explainer": 1}


def test_teacher_repairs_through_the_agent_loop(tmp_path):
    """A failure no later turn fixed goes to a teacher (scripted here) through agent.run.repair: the
    chat opens with the student's broken kernel and its feedback, and the teacher's answer compiles."""
    from tools.results import CompileResult, EvalResult, InspectResult

    root = tmp_path / "runs"
    broken = broken_probe_reply()
    failed = extract_solution(broken)
    ev = EvalResult(task=GEMM, arch="sm_90a", requested_features=["wgmma", "tma"], run_reason="did not compile",
                    compile=CompileResult(status="failed", arch="sm_90a", language="cuda", error="nvrtc error"),
                    inspect=InspectResult(status="skipped", reason="did not compile", arch="sm_90a"))
    write_run(root, "student", [[(failed, ev, broken)]], context="none")
    script = tmp_path / "teacher.json"
    script.write_text(json.dumps({"replies": [probe_reply()]}))
    res = build([root], tmp_path / "data", BuildOptions(teacher=f"scripted:{script}", teacher_turns=1))
    assert res.card["by_source"] == {"teacher": 1} and res.card["unfixed_failures"] == 0
    row = json.loads((tmp_path / "data/train.jsonl").read_text())
    assert row["meta"]["fixed_run_id"] == "teacher/student/1-0" and row["meta"]["fixed_turn"] == 1
    assert "flaot d0" in row["messages"][1]["content"] and "float d0" in row["messages"][2]["content"]
    teacher_run = tmp_path / "data/teacher_runs/teacher/student/1-0"
    events = [json.loads(x) for x in (teacher_run / "events.jsonl").read_text().splitlines()]
    assert [e["turn"] for e in events if e["type"] == "llm_response"] == [1]
    # The teacher saw the student's kernel and the student's feedback before answering.
    request = next(e for e in events if e["type"] == "llm_request")
    assert "flaot d0" in request["messages"][2]["content"]
    assert "feedback for turn 1" in request["messages"][3]["content"]
    # A second build reuses the finished teacher run (the script has no reply left for a new one).
    assert build([root], tmp_path / "data", BuildOptions(teacher=f"scripted:{script}", teacher_turns=1)).examples == 1


# ---------------------------------------------------------------------------------------
# Training on a tiny model
# ---------------------------------------------------------------------------------------
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def make_tiny_model(path: Path, texts: list[str]) -> Path:
    """A 2-layer Llama (hidden 32) with a word-level tokenizer trained on `texts`: random weights."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<unk>", "<pad>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=specials, vocab_size=2000))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="<|end|>",
                                   additional_special_tokens=specials[3:])
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)
    config = LlamaConfig(vocab_size=len(fast), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=4096,
                         eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id)
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def test_train_lora_on_tiny_model(tmp_path):
    for mod in ("trl", "peft", "transformers", "datasets", "accelerate"):
        pytest.importorskip(mod)
    from agent.fixit.train import TrainOptions, train
    root = _fixture_runs(tmp_path / "runs")
    data = tmp_path / "data"
    build([root], data, BuildOptions(cap_per_error=1))
    texts = [m["content"] for line in (data / "train.jsonl").read_text().splitlines()
             for m in json.loads(line)["messages"]]
    base = make_tiny_model(tmp_path / "tiny", texts)
    out = tmp_path / "adapter"
    result = asdict(train(data, TrainOptions(base_model=str(base), out=str(out), rank=4, epochs=1, lr=1e-3,
                                             max_length=4096)))
    assert result["examples"] == 5 and result["steps"] == 5 and result["device"] == "cpu"
    assert result["train_loss"] > 0
    # Completion-only loss: the answers are a part of the tokens, not all of them.
    assert 0 < result["loss_tokens"] < result["tokens"]
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["peft_type"] == "LORA"
    assert (out / "adapter_model.safetensors").stat().st_size > 0

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), out)  # the adapter loads back
    assert sum(p.numel() for n, p in model.named_parameters() if "lora_" in n) > 0


def test_train_cli_help_and_bad_data(tmp_path):
    from agent.fixit.train import TrainError, load_examples

    proc = subprocess.run([sys.executable, "-m", "agent.cli", "fixit", "train", str(tmp_path / "none"),
                           "--base-model", "x"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no Fixit data" in proc.stderr and "Traceback" not in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "agent.cli", "fixit", "train", "--help"], capture_output=True,
                          text=True, timeout=120)
    assert "--enable-lora --lora-modules" in proc.stdout and "pip install -e '.[train]'" in proc.stdout

    (tmp_path / "train.jsonl").write_text(json.dumps({"messages": [
        {"role": "user", "content": "x", "weight": 1}, {"role": "assistant", "content": "y", "weight": 1}]}) + "\n")
    with pytest.raises(TrainError, match="only the last message"):
        load_examples(tmp_path)
    with pytest.raises(TrainError, match="no Fixit data"):
        load_examples(tmp_path / "missing")
    (tmp_path / "train.jsonl").write_text(json.dumps({"messages": [
        {"role": "user", "content": "x", "weight": 0}, {"role": "assistant", "content": "y", "weight": 1}]}) + "\n")
    assert load_examples(tmp_path) == [{"prompt": [{"role": "user", "content": "x"}],
                                        "completion": [{"role": "assistant", "content": "y"}]}]
