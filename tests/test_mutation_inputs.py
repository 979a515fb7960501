"""tasks/stress.py, tasks/generators.py and the family generators they call (fp8_gemm.py's block scales,
gdn.py's inputs): the inputs every verdict is judged on (mutation pass 8).

The judge's power rests on them: a generator that returned zeros, one input's tensor for another, the same
values for two seeds, a narrower range or outliers never drawn would let a wrong kernel pass. Here, for every
generator a task names (the list is checked against the registry, so a new generator joins these tests): each
input as declared, fresh per seed and the same for one seed, independent of its neighbours, made on the device
asked for; the FP8 per-tensor recipe value for value; the timed runs' fast attention-backward inputs against
the fp32 forward; the FP8 block magnitudes' spread, GDN's gate ranges, sequence cuts and state slots; the
refusals' texts. The stress distribution's moments and outlier rate: tests/test_tasks.py; the families' other
properties: test_fp8_gemm.py, test_fp8_attention.py, test_gdn.py."""
from __future__ import annotations

import contextlib
from typing import Iterator

import pytest
import torch

from tasks import TASKS, get_task, reference
from tasks.families.fp8_gemm import fp8_gemm_task
from tasks.families.gemm import gemm_task
from tasks.generators import E4M3_MAX, _bf16_attention_forward, generate_inputs
from tasks.reference import run_reference
from tasks.schema import Task
from tasks.stress import stress
from tests.test_tasks import small

E4M3 = torch.float8_e4m3fn


def _values(x: torch.Tensor) -> torch.Tensor:
    """fp64 values of any input (e4m3 included), for statistics."""
    return x.double()


def _bits(x: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes, so that torch.equal compares e4m3 tensors bit for bit (and NaN with NaN)."""
    return x.contiguous().view(torch.uint8)


def _correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    """Of the two tensors' elements in memory order, over the shorter one's length."""
    n = min(a.numel(), b.numel())
    return torch.corrcoef(torch.stack([_values(a).flatten()[:n], _values(b).flatten()[:n]]))[0, 1].item()


# Small tasks covering every generator (and each GDN input kind), their axes, and the inputs each draws (O and
# LSE are the forward's outputs, the descales and the GDN gates' few values derived or drawn per head:
# seed-dependent but too few to correlate).
CASES = {
    "gemm": (lambda: gemm_task(n=256, k=512), {"M": 96}, ("A", "B")),
    "attn_bwd": (lambda: small(get_task("attn_bwd_causal")), {"S": 40}, ("Q", "K", "V", "dO")),
    "fp8_attn": (lambda: small(get_task("fp8_mha_with_lse_d64")), {"L": 48}, ("Q", "K", "V")),
    "fp8_gemm": (lambda: fp8_gemm_task(n=256, k=512), {"m": 40}, ("A", "B")),
    "gdn_prefill": (lambda: get_task("gdn_prefill_qk4_v8_d128_k_last"),
                    {"total_seq_len": 23, "num_seqs": 3, "len_cu_seqlens": 4}, ("q", "k", "v", "state")),
    "gdn_mtp": (lambda: get_task("gdn_mtp_qk4_v8_d128_k_last"), {"batch_size": 6, "pool_size": 64},
                ("q", "k", "v", "initial_state")),
}


def _kind(task: Task) -> str:
    return task.generator.partition(":")[0]


def test_every_generator_a_task_names_is_tested_here():
    assert {_kind(task) for task in TASKS.values()} == {_kind(make()) for make, _, _ in CASES.values()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_input_as_declared_fresh_per_seed_and_the_same_for_one_seed(case):
    make, given, drawn = CASES[case]
    task = make()
    axes = task.axis_values(given)
    x = generate_inputs(task, axes, seed=5)
    again, other = generate_inputs(task, axes, seed=5), generate_inputs(task, axes, seed=6)
    assert set(x) == set(task.inputs)
    for name, spec in task.inputs.items():
        t = x[name]
        assert t.shape == task.shape(name, axes) and str(t.dtype) == f"torch.{spec.dtype}" and t.is_contiguous(), name
        assert t.device.type == "cpu" and torch.isfinite(_values(t)).all(), name
        assert torch.equal(_bits(t), _bits(again[name])), name  # one seed, one draw
        if name != "cu_seqlens":  # the only input fixed per workload (tasks/families/gdn.py: cu_seqlens_for)
            assert not torch.equal(_bits(t), _bits(other[name])), name
    for name in drawn:
        assert _values(x[name]).std() > 0.01, name  # no constant, no zeros
        assert abs(_correlation(x[name], other[name])) < 0.1, name  # the next seed is a new draw, not a shift
    for i, a in enumerate(drawn):  # no input is another's tensor, or drawn from the same place of the stream
        for b in drawn[i + 1:]:
            assert abs(_correlation(x[a], x[b])) < 0.1, (a, b)


@contextlib.contextmanager
def _torch_defaults_elsewhere() -> Iterator[None]:
    """torch's default device and dtype other than the ones asked for (meta, float64), as on a GPU worker the
    inputs' device (CUDA) is not the default (CPU): a tensor made without its device or dtype shows."""
    torch.set_default_dtype(torch.float64)
    try:
        with torch.device("meta"):
            yield
    finally:
        torch.set_default_dtype(torch.float32)


def test_stress_follows_its_arguments_and_nothing_else():
    """Two generators seeded alike draw alike, whatever the global generator or torch's defaults; seeded apart,
    apart; fp32 on the device asked for."""
    def draw(seed: int) -> torch.Tensor:
        return stress((256, 64), torch.Generator().manual_seed(seed), "cpu")

    first = draw(3)
    torch.randn(1000)  # the global generator moves: nothing here reads it
    with _torch_defaults_elsewhere():
        elsewhere = draw(3)
    assert torch.equal(first, draw(3)) and first.dtype == torch.float32
    assert elsewhere.device.type == "cpu" and elsewhere.dtype == torch.float32 and torch.equal(first, elsewhere)
    assert abs(_correlation(first, draw(4))) < 0.05


@pytest.mark.parametrize("case", sorted(CASES))
def test_inputs_are_made_on_the_device_asked_for_whatever_torchs_defaults(case):
    """The same tensors, on the device and in the dtypes asked for, with torch's defaults elsewhere."""
    make, given, _ = CASES[case]
    task = make()
    axes = task.axis_values(given)
    want = generate_inputs(task, axes, seed=2, device="cpu")
    with _torch_defaults_elsewhere():
        got = generate_inputs(task, axes, seed=2, device="cpu")
    assert set(got) == set(want)
    for name, t in got.items():
        assert t.device.type == "cpu" and t.dtype == want[name].dtype and torch.equal(_bits(t), _bits(want[name])), name


# ------------------------------------------------------------------ FP8 per tensor

def _fp8_toy(n: int, *, with_descale: bool = True) -> Task:
    """A bf16 input y and an e4m3 input x of n elements, x's descale declared FIRST (order must not matter)."""
    inputs = {"descale_x": {"shape": ["one"], "dtype": "float32"}} if with_descale else {}
    inputs |= {"y": {"shape": ["N"], "dtype": "bfloat16"}, "x": {"shape": ["N"], "dtype": "float8_e4m3fn"}}
    return Task.model_validate({
        "name": "fp8_toy", "op_type": "toy", "generator": "stress_fp8_per_tensor", "inputs": inputs,
        "axes": {"N": {"type": "var"}, "one": {"type": "const", "value": 1}},
        "outputs": {"o": {"shape": ["N"], "dtype": "float32"}}, "reference": "def run(x, y):\n    return y\n"})


@pytest.mark.parametrize("n,seed", [(4096, 1), (2, 0)])
def test_fp8_inputs_are_bf16_stress_values_scaled_by_their_own_amax(n, seed):
    """scale = 448 / amax(|x|) of the bf16 stress values, X = x * scale in e4m3, descale = amax / 448, in the
    declared order of the drawn inputs (y, then x; the descale draws nothing). At n = 2 (this seed) amax < 1:
    the scale is still the tensor's own."""
    task = _fp8_toy(n)
    out = generate_inputs(task, {"N": n}, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    y = stress((n,), gen, "cpu").to(torch.bfloat16)
    x = stress((n,), gen, "cpu").to(torch.bfloat16).float()
    amax = x.abs().amax()
    assert (amax < 1) == (n == 2)
    assert list(out) == ["y", "x", "descale_x"] and out["y"].dtype == torch.bfloat16 and torch.equal(out["y"], y)
    assert torch.equal(_bits(out["x"]), _bits((x * (E4M3_MAX / amax)).to(E4M3)))
    assert out["descale_x"].dtype == torch.float32 and out["descale_x"].shape == (1,)
    assert out["descale_x"].item() == (amax / E4M3_MAX).item()
    assert _values(out["x"]).abs().max().item() == E4M3_MAX  # the amax element on e4m3's largest value


def test_an_fp8_input_without_its_descale_is_refused():
    with pytest.raises(ValueError, match=r"^task fp8_toy: fp8 input 'x' has no 'descale_x' input$"):
        generate_inputs(_fp8_toy(8, with_descale=False), {"N": 8}, seed=0)


# ------------------------------------------------------------------ refusals

def test_the_stress_generator_refuses_integer_inputs_and_unknown_generators_are_named():
    task = gemm_task(n=8, k=8).model_copy(deep=True)
    task.inputs["A"].dtype = "int32"
    with pytest.raises(ValueError, match=r"^task gemm_n8_k8: the stress generator makes floating-point inputs only; "
                                         r"input 'A' is int32 and needs a task-specific generator$"):
        generate_inputs(task, {"M": 2}, seed=0)
    with pytest.raises(ValueError) as e:
        generate_inputs(task.model_copy(update={"generator": "uniform"}), {"M": 2}, seed=0)
    assert str(e.value) == ("task gemm_n8_k8: unknown input generator 'uniform' (known: stress, stress_with_forward:"
                            "<forward task>, gdn, stress_fp8_per_tensor, fp8_block_scaled)")


# ------------------------------------------------------------------ the timed runs' backward inputs

@pytest.mark.parametrize("name", ["attn_bwd", "attn_bwd_causal"])
def test_fast_backward_inputs_are_the_bf16_forward_of_the_same_q_k_v(name, monkeypatch):
    """fast (every timed run): Q, K, V, dO as the checks draw them; O and LSE the bf16 forward of those Q, K, V
    with the forward task's scale and mask, within bf16 accuracy of the fp32 reference's (which the checks use)."""
    task = small(get_task(name))
    forward = small(get_task(task.generator.partition(":")[2]))
    axes = task.axis_values({"S": 40})
    fast, exact = generate_inputs(task, axes, seed=3, fast=True), generate_inputs(task, axes, seed=3)
    assert all(torch.equal(fast[n], exact[n]) for n in ("Q", "K", "V", "dO"))
    fwd = run_reference(forward, {n: exact[n] for n in "QKV"})
    assert torch.equal(exact["O"], fwd["O"].to(torch.bfloat16)) and torch.equal(exact["LSE"], fwd["LSE"])
    bf16 = _bf16_attention_forward(exact["Q"], exact["K"], exact["V"], float(axes["D"]) ** -0.5, "causal" in task.tags)
    assert torch.equal(fast["O"], bf16["O"].to(torch.bfloat16)) and torch.equal(fast["LSE"], bf16["LSE"])
    assert fast["O"].dtype == torch.bfloat16 and fast["LSE"].dtype == torch.float32
    err = (fast["O"].float() - fwd["O"]).norm() / fwd["O"].norm()
    assert err < 2e-2 and (fast["LSE"] - fwd["LSE"]).abs().max() < 0.1
    # a few heads at a time (as at long S) gives the same values
    monkeypatch.setattr(reference, "_SCORES_PER_CHUNK", 2 * 40 * 40)
    chunked = generate_inputs(task, axes, seed=3, fast=True)
    assert torch.equal(chunked["O"], fast["O"]) and torch.equal(chunked["LSE"], fast["LSE"])


# ------------------------------------------------------------------ FP8 block scales (tasks/families/fp8_gemm.py)

def test_block_magnitudes_span_two_to_the_uniform_minus_3_to_3():
    """Each 1x128 block of A is stress values times 2^U(-3, 3): log2(448 * SF_A) is the block's stress amax
    (log2 ~1.5 for 128 samples, more with an outlier) plus the magnitude, so its 5-95% range spans ~5.5 octaves
    around ~1.5 (measured: -1.2 to 4.4, median 1.4-1.8 over three seeds). A scale that varied less would let a
    kernel that applies a neighbouring block's scale pass."""
    task = fp8_gemm_task(n=128, k=2048)
    x = generate_inputs(task, {"m": 64}, seed=4)
    octaves = torch.log2(x["SF_A"] * E4M3_MAX).flatten()  # 1024 blocks
    low, median, high = torch.quantile(octaves, torch.tensor([0.05, 0.5, 0.95])).tolist()
    assert 4.5 < high - low < 6.5 and 0.5 < median < 2.5


def _block_toy(inputs: dict) -> Task:
    return Task.model_validate({
        "name": "block_toy", "op_type": "toy", "generator": "fp8_block_scaled", "inputs": inputs,
        "axes": {"m": {"type": "var"}, "k": {"type": "const", "value": 200}, "kb": {"type": "const", "value": 2}},
        "outputs": {"D": {"shape": ["m"], "dtype": "float32"}}, "reference": "def run(A, SF_A):\n    return A\n"})


def test_a_ragged_last_block_has_its_own_amax():
    """k = 200 in blocks of 128: the last block is 72 wide, padded with zeros for its amax (never raised by them),
    and each block, the short one too, reaches e4m3's largest value; the scales expand back to k = 200."""
    from tasks.families.fp8_gemm import dequantize

    task = _block_toy({"A": {"shape": ["m", "k"], "dtype": "float8_e4m3fn"},
                       "SF_A": {"shape": ["m", "kb"], "dtype": "float32"}})
    x = generate_inputs(task, {"m": 5}, seed=1)
    a = x["A"].double().abs()
    assert torch.equal(a[:, :128].amax(1), torch.full((5,), E4M3_MAX, dtype=torch.float64))
    assert torch.equal(a[:, 128:].amax(1), torch.full((5,), E4M3_MAX, dtype=torch.float64))
    d = dequantize(x["A"], x["SF_A"])
    assert d.shape == (5, 200) and torch.equal(d[:, 128:], x["A"][:, 128:].float() * x["SF_A"][:, 1:])


def test_the_block_scaled_generator_refuses_what_it_cannot_make():
    from tasks.families.fp8_gemm import scale_blocks

    a = {"A": {"shape": ["m", "k"], "dtype": "float8_e4m3fn"}}
    with pytest.raises(ValueError, match=r"^task block_toy: fp8 input 'A' has no scale input 'SF_A'$"):
        generate_inputs(_block_toy(a), {"m": 2}, seed=0)
    extra = a | {"SF_A": {"shape": ["m", "kb"], "dtype": "float32"}, "bias": {"shape": ["k"], "dtype": "float32"},
                 "mask": {"shape": ["k"], "dtype": "float32"}}
    with pytest.raises(ValueError, match=r"^task block_toy: the fp8_block_scaled generator makes e4m3 inputs and "
                                         r"their SF_ scales only; bias, mask would need another generator$"):
        generate_inputs(_block_toy(extra), {"m": 2}, seed=0)
    with pytest.raises(ValueError, match=r"^scale rank 1 differs from the tensor's 2$"):
        scale_blocks((4, 256), (2,))
    with pytest.raises(ValueError, match=r"^scale shape \(4, 3\) does not tile \(4, 256\) in blocks of 1 or 128$"):
        scale_blocks((4, 256), (4, 3))


# ------------------------------------------------------------------ GDN (tasks/families/gdn.py)

def test_gdn_gates_follow_the_models_initialisation_ranges():
    """4096 heads of gates at once: A_log = log(U(1, 16)), softplus(dt_bias) log-uniform in [1e-3, 0.1], a and b
    N(0, 1) without outliers (module docstring: Mamba2/GDN's initialisation ranges)."""
    task = Task.model_validate({
        "name": "gates", "op_type": "toy", "generator": "gdn",
        "axes": {"T": {"type": "const", "value": 8}, "num_v_heads": {"type": "const", "value": 4096}},
        "inputs": {"A_log": {"shape": ["num_v_heads"], "dtype": "float32"},
                   "dt_bias": {"shape": ["num_v_heads"], "dtype": "float32"},
                   "a": {"shape": ["T", "num_v_heads"], "dtype": "bfloat16"},
                   "b": {"shape": ["T", "num_v_heads"], "dtype": "bfloat16"}},
        "outputs": {"o": {"shape": ["T"], "dtype": "float32"}}, "reference": "def run(a):\n    return a\n"})
    x = generate_inputs(task, {}, seed=3)
    u = torch.exp(x["A_log"].double())
    assert 1 <= u.min() < 1.02 and 15.98 < u.max() < 16
    dt = torch.nn.functional.softplus(x["dt_bias"].double()).log10()
    assert -3.0001 <= dt.min() < -2.99 and -1.01 < dt.max() <= -0.9999
    for name in ("a", "b"):
        v = x[name].double()
        assert abs(v.std().item() - 1) < 0.02 and abs(v.mean().item()) < 0.02 and v.abs().max() < 6
    with pytest.raises(ValueError, match=r"^task gates: the gdn generator does not know input 'bias'$"):
        generate_inputs(task.model_copy(update={"inputs": task.inputs | {"bias": task.inputs["A_log"]}}), {}, seed=0)


def test_sequence_boundaries_cut_every_way_into_non_empty_sequences():
    """cu_seqlens_for: 0, strictly increasing cuts, total; from one sequence to one token each; every cut point
    reachable; fixed per (total, num_seqs); anything else refused."""
    from tasks.families.gdn import cu_seqlens_for

    total, seen = 12, set()
    for num_seqs in range(1, total + 1):
        cu = cu_seqlens_for(total, num_seqs)
        assert cu.dtype == torch.int64 and cu.device.type == "cpu" and cu.shape == (num_seqs + 1,)
        assert cu[0] == 0 and cu[-1] == total and bool((cu[1:] > cu[:-1]).all()), cu
        assert torch.equal(cu, cu_seqlens_for(total, num_seqs))
        seen |= set(cu[1:-1].tolist())
    assert seen == set(range(1, total))
    for bad in ((total, total + 1), (total, 0)):
        with pytest.raises(ValueError, match=rf"^cannot cut {bad[0]} tokens into {bad[1]} non-empty sequences$"):
            cu_seqlens_for(*bad)


def test_mtp_state_slots_are_distinct_inside_the_pool_and_fresh_per_draw():
    task = get_task("gdn_mtp_qk4_v8_d128_k_last")
    axes = task.axis_values({"batch_size": 48, "pool_size": 49})
    slots = [generate_inputs(task, axes, seed=s)["initial_state_indices"] for s in (1, 2)]
    for idx in slots:
        assert idx.dtype == torch.int32 and len(set(idx.tolist())) == 48 and 0 <= idx.min() and idx.max() < 49
    assert not torch.equal(*slots)
