"""The judge's GDN prefill reference (tasks.families.gdn.prefill_chunked): the same results as the task's
reference text, which it replaces in the judge only where the text is ours and unchanged.

The oracle is the recurrence token by token in float64 (`stepped`, written here from the task's statement:
decay first, the delta rule, read with the updated state); the text itself (fp32) is held to it too, so the
chunked form is checked against both what the task says and what the spec computes."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tasks import get_task
from tasks.families.gdn import JUDGE_CHUNK, PREFILL_REFERENCE, prefill_chunked
from tasks.generators import generate_inputs
from tasks.reference import judge_equivalent, reference_function, run_reference, term_scales

QK4, QK8 = "gdn_prefill_qk4_v8_d128_k_last", "gdn_prefill_qk8_v16_d128_k_last"
ARGS = ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b", "cu_seqlens")


def inputs(name: str, bounds: list[int], seed: int = 3, total: int | None = None) -> dict[str, torch.Tensor]:
    """The task's generated inputs for `total` tokens (default: the last bound, or one a sequence where
    that is fewer: the generator cuts no empty sequence), cut at `bounds`."""
    task = get_task(name)
    total = max(bounds[-1], len(bounds) - 1) if total is None else total
    axes = task.axis_values({"total_seq_len": total, "num_seqs": len(bounds) - 1, "len_cu_seqlens": len(bounds)})
    return generate_inputs(task, axes, seed=seed) | {"cu_seqlens": torch.tensor(bounds)}


def stepped(x: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """Token by token in float64 from the fp32 gates: the output, the final states, the output's term scales
    (on the inputs' device: tests/gpu/test_gdn_gpu.py holds the full-size term scales to it too)."""
    HV, HQ = x["v"].shape[1], x["q"].shape[1]
    g = torch.exp(-torch.exp(x["A_log"].float()) * F.softplus(x["a"].float() + x["dt_bias"].float())).double()
    beta = torch.sigmoid(x["b"].float()).double()
    T, V = x["v"].shape[0], x["v"].shape[2]
    out = torch.zeros(T, HV, V, dtype=torch.float64, device=x["v"].device)
    rss = torch.zeros(T, HV, V, dtype=torch.float64, device=x["v"].device)
    state = x["state"].double().clone()
    bounds = x["cu_seqlens"].tolist()
    for n in range(len(bounds) - 1):
        S = state[n]  # [HV, V, K]
        for t in range(bounds[n], bounds[n + 1]):
            q, k = (x[a][t].double().repeat_interleave(HV // HQ, dim=0) for a in "qk")
            S = g[t, :, None, None] * S
            S = S + (beta[t, :, None] * (x["v"][t].double() - torch.einsum("hvk,hk->hv", S, k)))[:, :, None] * k[:, None, :]
            out[t] = scale * torch.einsum("hvk,hk->hv", S, q)
            rss[t] = abs(scale) * (S * q[:, None, :]).square().sum(-1).sqrt()
        state[n] = S
    return {"output": out, "new_state": state, "terms": rss}


def chunked(x: dict, scale: float, terms: bool = False) -> dict[str, torch.Tensor]:
    return prefill_chunked(**{n: x[n] for n in ARGS}, scale=scale, terms=terms)


def assert_near(got: torch.Tensor, want: torch.Tensor, rel: float, what: str) -> None:
    """Every element within rel of the output's largest magnitude."""
    err = (got.double() - want).abs().max().item()
    top = want.abs().max().item()
    assert err <= rel * max(top, 1e-30), f"{what}: max error {err:.3g} against max |value| {top:.3g}"


SCALE = 1 / math.sqrt(128)
# sequences of 1 token, of several chunks, ending mid-chunk, exactly one chunk, and empty
CASES = [(QK8, [0, 1, 150, 150, 214]), (QK4, [0, 64, 65, 200]), (QK8, [0, 3]), (QK4, [0, 130]),
         (QK8, [0, 1, 1, 2, 3])]  # (the last: no sequence longer than one token)


@pytest.mark.parametrize("name,bounds", CASES)
def test_chunks_give_the_token_by_token_results(name, bounds):
    x = inputs(name, bounds)
    want = stepped(x, SCALE)
    got = chunked(x, SCALE)
    assert got["output"].dtype == got["new_state"].dtype == torch.float32
    assert_near(got["output"], want["output"], 1e-6, "output")  # fp32 rounding of the result, nothing else
    assert_near(got["new_state"], want["new_state"], 1e-6, "new_state")
    terms = chunked(x, SCALE, terms=True)
    assert set(terms) == {"output"}  # the term scales of the output alone: the judge reads a scale per key
    assert_near(terms["output"], want["terms"], 1e-6, "term scales")
    spec = reference_function(get_task(name))(**{n: x[n].float() if x[n].is_floating_point() else x[n] for n in ARGS},
                                              scale=SCALE)
    assert_near(spec["output"], want["output"], 1e-4, "the text's output")  # the text's own fp32 rounding
    assert_near(spec["new_state"], want["new_state"], 1e-4, "the text's new_state")


def test_a_reset_inside_a_chunk_and_a_frozen_head():
    """g = 0 exactly (softplus large: the state wiped, log g = -inf) and g = 1 with beta = 0 (a head
    that neither decays nor writes): ratios of cumulative decays stay finite and exact."""
    x = inputs(QK8, [0, 90, 180])
    x["dt_bias"][3] = 200.0           # head 3: softplus(a + 200) ~ 200, g = exp(-exp(A_log) * 200) = 0 in fp32
    x["A_log"][5] = -200.0            # head 5: exp(A_log) = 0, g = 1
    x["b"][:, 5] = -200.0             # and beta = sigmoid(-200) = 0
    want = stepped(x, SCALE)
    got = chunked(x, SCALE)
    g3 = torch.exp(-torch.exp(x["A_log"][3]) * F.softplus(x["a"][:, 3].float() + x["dt_bias"][3]))
    assert bool((g3 == 0).all())
    for n in ("output", "new_state"):
        assert bool(torch.isfinite(got[n]).all()), n
        assert_near(got[n], want[n], 1e-6, n)
    torch.testing.assert_close(got["new_state"][:, 5], x["state"][:, 5])  # frozen: the initial state, exactly


def test_tokens_outside_every_sequence_stay_zero():
    x = inputs(QK4, [2, 40, 70], total=75)  # tokens 0-1 and 70-74 belong to no sequence
    got = chunked(x, SCALE)
    want = stepped(x, SCALE)
    assert_near(got["output"], want["output"], 1e-6, "output")
    assert not got["output"][:2].any() and not got["output"][70:].any()


def test_no_sequences():
    x = inputs(QK8, [0, 2])
    x = {n: (t[:0] if n not in ("A_log", "dt_bias") else t) for n, t in x.items()} | {"cu_seqlens": torch.tensor([0])}
    got = chunked(x, SCALE)
    assert got["output"].shape == (0, 16, 128) and got["new_state"].shape == (0, 16, 128, 128)
    terms = chunked(x, SCALE, terms=True)
    assert set(terms) == {"output"} and terms["output"].shape == (0, 16, 128)


def test_the_judge_runs_the_equivalent_only_for_the_text_it_was_written_for():
    task = get_task(QK8)
    assert task.reference == PREFILL_REFERENCE and judge_equivalent(task) is prefill_chunked
    changed = task.model_copy(update={"reference": PREFILL_REFERENCE.replace("token by token", "token after token")})
    assert judge_equivalent(changed) is None  # any edit: its own text runs
    for other in ("gdn_decode_qk4_v8_d128_k_last", "gdn_mtp_qk8_v16_d128_k_last", "gemm_n7168_k5120"):
        assert judge_equivalent(get_task(other)) is None
    x = inputs(QK8, [0, 70, 71])
    fast, text = run_reference(task, x), run_reference(task, x, text=True)
    for n in ("output", "new_state"):
        torch.testing.assert_close(fast[n], text[n], rtol=1e-4, atol=1e-4)
    # the term scales the judge reads are the chunked states' too
    assert_near(term_scales(task, x)["output"], stepped(x, task.scalar_values(
        task.axis_values({"total_seq_len": 71, "num_seqs": 2, "len_cu_seqlens": 3}))["scale"])["terms"], 1e-6, "terms")


def test_the_judge_runs_the_equivalent_by_default_and_the_text_when_asked(monkeypatch):
    from tasks.families import gdn

    ran = []

    def recorded(*a, **k):
        ran.append("equivalent")
        return prefill_chunked(*a, **k)

    monkeypatch.setattr(gdn, "prefill_chunked", recorded)
    task, x = get_task(QK4), inputs(QK4, [0, 5, 9])
    run_reference(task, x)
    assert ran == ["equivalent"]
    run_reference(task, x, text=True)
    assert ran == ["equivalent"]  # the text ran


def test_the_chunk_is_the_prefill_kernels():
    assert JUDGE_CHUNK == 64  # a sequence longer than one chunk crosses a boundary in every case above
    assert any(b[-1] - b[-2] > JUDGE_CHUNK or b[2] - b[1] > JUDGE_CHUNK for _, b in CASES if len(b) > 2)


@pytest.mark.parametrize("seed", range(4))
def test_random_packings_and_gates(seed):
    """Random packings (empty sequences, one-token ones, lengths across chunk boundaries, tokens left
    outside) and gates pushed to their ends on random heads: the chunks give the token loop's results."""
    import random

    r = random.Random(seed)
    name = (QK4, QK8)[seed % 2]
    lens = [r.choice([0, 1, r.randint(2, 63), 64, r.randint(65, 200)]) for _ in range(r.randint(1, 5))]
    first = r.randint(0, 3)
    bounds = [first]
    for n in lens:
        bounds.append(bounds[-1] + n)
    x = inputs(name, bounds, seed=100 + seed, total=bounds[-1] + r.randint(0, 3))
    hv = x["v"].shape[1]
    for h in r.sample(range(hv), 2):  # a fast-forgetting head and a nearly frozen one
        x["dt_bias"][h] = r.choice([50.0, -50.0])
    x["b"][:, r.randrange(hv)] *= 40  # beta at 0 or 1 on one head
    want = stepped(x, SCALE)
    got = chunked(x, SCALE)
    for n in ("output", "new_state"):
        assert bool(torch.isfinite(got[n]).all()), n
        assert_near(got[n], want[n], 1e-6, f"{n} (lengths {lens}, first token {first})")
    assert_near(chunked(x, SCALE, terms=True)["output"], want["terms"], 1e-6, "term scales")
