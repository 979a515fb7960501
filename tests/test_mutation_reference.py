"""tasks/reference.py at its edges, on tiny shapes against plain torch (issue 46): how a reference is
loaded and called (which arguments, widened how, in IEEE fp32 without autograd, the process's TF32
settings put back), which outputs it may return and how they are checked, and each op type's term
scales against a float64 computation of its own. The full-size arithmetic (float64 autograd, every
family) is tests/test_tasks.py's, test_fp8_*.py's and test_judge_sparse_rows.py's."""
from __future__ import annotations

import math

import pytest
import torch

from tasks import get_task, reference
from tasks.generators import generate_inputs
from tasks.families.gdn import prefill_chunked
from tasks.reference import (BrokenReference, _widen, reference_function, run_reference,
                             term_scales)
from tasks.schema import Task
from tests.test_gdn import _gates64


def toy(reference: str, outputs=("o",), scalars=None, name: str = "toy") -> Task:
    """A task over x [N, C] (bf16), y [C] (fp16), i [N] (int32), f [1] (fp32), C fixed at 3, N free."""
    return Task.model_validate({
        "name": name, "op_type": "toy",
        "axes": {"N": {"type": "var"}, "C": {"type": "const", "value": 3}, "one": {"type": "const", "value": 1}},
        "inputs": {"x": {"shape": ["N", "C"], "dtype": "bfloat16"}, "y": {"shape": ["C"], "dtype": "float16"},
                   "i": {"shape": ["N"], "dtype": "int32"}, "f": {"shape": ["one"], "dtype": "float32"}},
        "outputs": {o: {"shape": ["N", "C"], "dtype": "float32"} for o in outputs},
        "scalars": scalars or {}, "reference": reference})


def toy_inputs(n: int = 2) -> dict[str, torch.Tensor]:
    return {"x": torch.arange(n * 3, dtype=torch.bfloat16).reshape(n, 3), "y": torch.tensor([1, 2, 3], dtype=torch.float16),
            "i": torch.arange(n, dtype=torch.int32), "f": torch.tensor([0.5])}


@pytest.fixture(autouse=True)
def fresh_compiles(monkeypatch):
    """An empty compile cache: every source is compiled here, not found compiled by an earlier test (or,
    under mutmut, by the un-mutated run its forked runs inherit)."""
    monkeypatch.setattr(reference, "_COMPILED", {})


# ------------------------------------------------------------------ loading

def test_a_reference_is_compiled_once_per_source_under_the_tasks_name():
    source = "def run(x):\n    return x\n"
    run = reference_function(toy(source, name="toy_a"))
    assert run.__module__ == "ptxbench_reference_toy_a" and run.__code__.co_filename == "<reference of toy_a>"
    assert reference_function(toy(source, name="toy_a")) is run  # another Task object, the same source
    assert reference_function(toy(source + "\n", name="toy_a")) is not run


def test_a_reference_that_does_not_load_or_has_no_run_is_broken():
    with pytest.raises(BrokenReference, match=r"^reference of toy_b does not load: SyntaxError: "):
        reference_function(toy("def run(:\n", name="toy_b"))
    with pytest.raises(BrokenReference, match=r"^reference of toy_b does not load: NameError: name 'nope' is"):
        reference_function(toy("nope()\n", name="toy_b"))
    for source in ("run = 3\n", "def other(x):\n    return x\n"):
        with pytest.raises(BrokenReference, match=r"^reference of toy_b defines no run\(\.\.\.\) function$"):
            reference_function(toy(source, name="toy_b"))


# ------------------------------------------------------------------ calling

SEEN_SOURCE = """import torch
SEEN = []
def run(x, y, i, f, alpha):
    SEEN.append({"dtypes": (x.dtype, y.dtype, i.dtype, f.dtype), "alpha": alpha, "grad": torch.is_grad_enabled(),
                 "tf32": (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32),
                 "precision": torch.get_float32_matmul_precision()})
    if alpha < 0:
        raise ZeroDivisionError("asked to")
    return x * y + i[:, None] * f * alpha
"""


@pytest.fixture
def tf32_on():
    """The process as a training script leaves it: TF32 on for matmuls and cuDNN; put back to IEEE after."""
    old_cudnn = torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("medium")
    torch.backends.cudnn.allow_tf32 = True
    yield
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = old_cudnn


def _tf32_state():
    return (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision())


def test_a_reference_gets_widened_inputs_and_its_scalars_in_ieee_fp32_without_grad(tf32_on):
    task = toy(SEEN_SOURCE, scalars={"alpha": "N * 2"}, name="toy_c")
    x = toy_inputs(2)
    before = _tf32_state()
    assert before == (True, True, "medium")
    out = run_reference(task, {**x, "unused": torch.ones(1)})  # an extra entry is ignored
    seen = reference_function(task).__globals__["SEEN"][-1]
    assert seen == {"dtypes": (torch.float32, torch.float32, torch.int32, torch.float32), "alpha": 4.0, "grad": False,
                    "tf32": (False, False), "precision": "highest"}
    want = x["x"].double() * x["y"].double() + x["i"].double()[:, None] * 0.5 * 4
    assert set(out) == {"o"} and out["o"].dtype == torch.float32
    torch.testing.assert_close(out["o"].double(), want)
    assert _tf32_state() == before  # put back
    with pytest.raises(ZeroDivisionError):  # and put back when the reference raises
        run_reference(toy(SEEN_SOURCE, scalars={"alpha": "-N"}, name="toy_c"), x)
    assert _tf32_state() == before


def test_only_the_parameters_a_reference_names_are_passed_unless_it_takes_keywords():
    x = toy_inputs(2)
    named = toy("def run(x, f):\n    return x * f\n", scalars={"alpha": "C"})
    torch.testing.assert_close(run_reference(named, x)["o"], x["x"].float() * 0.5)
    keywords = toy("KW = []\ndef run(x, **rest):\n    KW.append(sorted(rest))\n    return x * rest['alpha']\n",
                   scalars={"alpha": "C"})
    torch.testing.assert_close(run_reference(keywords, {**x, "unused": x["f"]})["o"], x["x"].float() * 3)
    assert reference_function(keywords).__globals__["KW"][-1] == ["alpha", "f", "i", "y"]


def test_only_16_bit_floats_are_widened():
    for dtype in (torch.bfloat16, torch.float16):
        assert _widen(torch.ones(2, dtype=dtype)).dtype == torch.float32
    for dtype in (torch.float64, torch.int32, torch.float8_e4m3fn):
        t = torch.ones(2, dtype=dtype)
        assert _widen(t) is t


def test_axes_are_read_off_the_inputs_and_checked():
    task, x = toy("def run(x):\n    return x\n"), toy_inputs(2)
    with pytest.raises(ValueError, match=r"^input 'i' of task toy is missing$"):
        run_reference(task, {n: t for n, t in x.items() if n != "i"})
    with pytest.raises(ValueError, match=r"^input 'y' of task toy has rank 2, expected 1$"):
        run_reference(task, {**x, "y": x["y"][None]})
    with pytest.raises(ValueError, match=r"^input 'x' of task toy: axis C is 4, expected 3$"):  # a const axis
        run_reference(task, {**x, "x": torch.zeros(2, 4, dtype=torch.bfloat16)})
    with pytest.raises(ValueError, match=r"^input 'i' of task toy: axis N is 3, expected 2$"):  # read off x first
        run_reference(task, {**x, "i": torch.zeros(3, dtype=torch.int32)})
    assert run_reference(task, toy_inputs(5))["o"].shape == (5, 3)  # N is free


# ------------------------------------------------------------------ outputs

def test_a_reference_may_return_a_dict_a_tensor_a_tuple_or_a_list():
    x = toy_inputs(2)
    xf = x["x"].float()
    for ret in ("{'p': x + 1, 'o': x, 'extra': x}", "(x, x + 1)", "[x, x + 1]"):
        out = run_reference(toy(f"def run(x):\n    return {ret}\n", outputs=("o", "p")), x)
        assert list(out) == ["o", "p"]
        torch.testing.assert_close(out["o"], xf)
        torch.testing.assert_close(out["p"], xf + 1)
    for ret in ("x", "x.to(torch.bfloat16)", "x.double()"):  # in fp32, whatever the reference returns
        out = run_reference(toy(f"import torch\ndef run(x):\n    return {ret}\n"), x)["o"]
        assert out.dtype == torch.float32 and torch.equal(out, xf)


@pytest.mark.parametrize("ret,message", [
    ("{'o': x}", r"^reference of toy returned no p$"),
    ("{}", r"^reference of toy returned no o, p$"),
    ("(x,)", r"^reference of toy must return a dict, a tensor or a tuple of 2 tensors \(o, p\)$"),
    ("x", r"^reference of toy must return a dict, a tensor or a tuple of 2 tensors \(o, p\)$"),
    ("(x, x, x)", r"^reference of toy must return a dict, a tensor or a tuple of 2 tensors \(o, p\)$"),
    ("None", r"^reference of toy must return a dict, a tensor or a tuple of 2 tensors \(o, p\)$"),
    ("(x, x.T)", r"^reference of toy: output p has shape \(3, 2\), expected \(2, 3\)$"),
])
def test_a_reference_that_returns_the_wrong_outputs_is_broken(ret, message):
    with pytest.raises(BrokenReference, match=message):
        run_reference(toy(f"def run(x):\n    return {ret}\n", outputs=("o", "p")), toy_inputs(2))


# ------------------------------------------------------------------ term scales against float64

def small(name: str, B: int = 2, H: int = 2) -> Task:
    task = get_task(name).model_copy(deep=True)
    task.axes["B"].value, task.axes["H"].value = B, H
    return task


def _softmax64(q, k, causal: bool) -> torch.Tensor:
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        S = s.shape[-1]
        s = s.masked_fill(~torch.ones(S, S, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(s, -1)


def chunk_heads(monkeypatch, heads: int | None, S: int) -> None:
    """Attention's term scales `heads` heads at a time (of B*H = 4), as at S=8192 4 of 192; None: all at once."""
    if heads:
        monkeypatch.setattr(reference, "_SCORES_PER_CHUNK", heads * S * S)


@pytest.mark.parametrize("heads", [None, 3])
@pytest.mark.parametrize("name", ["attn_fwd", "attn_fwd_causal", "fp8_mha_with_lse_d64", "fp8_mha_with_lse_d128_causal"])
def test_attention_forward_term_scales(name, heads, monkeypatch):
    """O[i] = sum_j P[i,j] V[j]: rss sqrt(sum_j P^2 V^2); FP8's LSE: sqrt(sum_j P^2); bf16's LSE: none."""
    chunk_heads(monkeypatch, heads, 6)
    task = small(name)
    fp8 = task.op_type == "fp8_mha_fwd"
    x = generate_inputs(task, {"L" if fp8 else "S": 6}, seed=3)
    q, k, v = (x[n].double() * (x[f"descale_{n.lower()}"].double() if fp8 else 1) for n in "QKV")
    p = _softmax64(q, k, "causal" in task.tags)
    want = {"O": ((p**2) @ (v**2)).sqrt()} | ({"LSE": (p**2).sum(-1).sqrt()} if fp8 else {})
    got = term_scales(task, x)
    assert set(got) == set(want)
    for n, w in want.items():
        assert got[n].dtype == torch.float32
        torch.testing.assert_close(got[n].double(), w, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("heads", [None, 3])
@pytest.mark.parametrize("name", ["attn_bwd", "attn_bwd_causal"])
def test_attention_backward_term_scales(name, heads, monkeypatch):
    chunk_heads(monkeypatch, heads, 5)
    task = small(name)
    x = generate_inputs(task, {"S": 5}, seed=4)
    q, k, v, o, do = (x[n].double() for n in ("Q", "K", "V", "O", "dO"))
    scale = 1 / math.sqrt(q.shape[-1])
    s = q @ k.transpose(-1, -2) * scale - x["LSE"].double()[..., None]
    p = torch.exp(s) * _softmax64(q, k, "causal" in task.tags).gt(0)
    ds = p * (do @ v.transpose(-1, -2) - (do * o).sum(-1, keepdim=True))
    want = {"dQ": ((ds**2) @ (k**2)).sqrt() * scale, "dK": ((ds**2).transpose(-1, -2) @ (q**2)).sqrt() * scale,
            "dV": ((p**2).transpose(-1, -2) @ (do**2)).sqrt()}
    got = term_scales(task, x)
    assert set(got) == set(want)
    for n, w in want.items():
        torch.testing.assert_close(got[n].double(), w, rtol=1e-4, atol=1e-6)


GDN = "gdn_prefill_qk8_v16_d128_k_last"


def test_gdn_prefill_terms_over_uneven_and_empty_sequences():
    """Four sequences of 1, 4, 0 and 2 tokens: the batch of live sequences shrinks as each one ends."""
    task = get_task(GDN)
    bounds = [0, 1, 5, 5, 7]
    axes = task.axis_values({"total_seq_len": 7, "num_seqs": 4, "len_cu_seqlens": 5})
    x = generate_inputs(task, axes, seed=2) | {"cu_seqlens": torch.tensor(bounds)}
    g, beta = _gates64(x)
    HV, HQ = x["v"].shape[1], x["q"].shape[1]
    want = torch.zeros(7, HV, x["v"].shape[2], dtype=torch.float64)
    for n in range(4):
        S = x["state"][n].double()  # [HV, V, K]
        for t in range(bounds[n], bounds[n + 1]):
            q, k = (x[a][t].double().repeat_interleave(HV // HQ, dim=0) for a in "qk")
            S = g[t, :, None, None] * S
            S = S + (beta[t, :, None] * (x["v"][t].double() - torch.einsum("hvk,hk->hv", S, k)))[:, :, None] * k[:, None, :]
            want[t] = (S * q[:, None, :]).square().sum(-1).sqrt() / math.sqrt(128)
    got = term_scales(task, x)["output"]
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-7)
    # the scale's sign cannot make a root-sum-square negative
    args = {n: x[n] for n in ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b", "cu_seqlens")}
    torch.testing.assert_close(prefill_chunked(**args, scale=-1 / math.sqrt(128), terms=True)["output"], got)


def test_a_gdn_prefill_batch_without_sequences_has_no_terms():
    task = get_task(GDN)
    x = generate_inputs(task, task.axis_values({"total_seq_len": 2, "num_seqs": 1, "len_cu_seqlens": 2}), seed=2)
    empty = {n: t[:0] for n, t in x.items() if n not in ("A_log", "dt_bias")} | {"cu_seqlens": torch.tensor([0])}
    got = term_scales(task, {**x, **empty})["output"]
    assert got.shape == (0, 16, 128) and got.dtype == torch.float32


def test_an_op_type_without_term_scales_is_refused():
    with pytest.raises(BrokenReference, match=r"^no term scales are known for op type 'toy' \(task toy\); "
                                              r"use tolerance.scale = \"ref\"$"):
        term_scales(toy("def run(x):\n    return x\n"), toy_inputs(2))
