"""The sparse judge faults of issue 42, item 6, at a reduced size on the CPU.

GDN prefill: with a floor of 0.3 of a typical row, a row whose gate and beta wiped the state could
be zeroed (or replaced by another input's row) and pass. Its rows now have no floor: output rows
are held to the norm of max(|o|, rss), rss the root-sum-square of the products scale*S_t[v,k]q_t[k]
(tasks.reference.term_scales), state rows to their own norm. Here: the term scale is that rss
(checked against a float64 recurrence of its own), every output and state row, zeroed or taken
from other inputs, fails (every row tried: tests/judge_power.sparse_resolution), and the least
precise honest emulation (chunked, bf16 tensor-core operands, fp32 state) passes whole, with margin.
The full-size run is tests/gpu/test_judge_power_gpu.py::test_sparse_faults_fail_on_every_workload."""
from __future__ import annotations

import torch

from tasks import get_task
from tasks.generators import generate_inputs
from tasks.reference import run_reference, term_scales
from tests.judge_power import as_written, honest_variants, sparse_resolution
from tests.test_gdn import _gates64
from tools.correctness import compare

QK8 = "gdn_prefill_qk8_v16_d128_k_last"


def _prefill(name: str, total: int, seqs: int, seed: int = 7):
    task = get_task(name)
    axes = task.axis_values({"total_seq_len": total, "num_seqs": seqs, "len_cu_seqlens": seqs + 1})
    return task, axes, generate_inputs(task, axes, seed=seed)


def test_gdn_prefill_output_terms_are_the_rss_of_its_products():
    task, _, x = _prefill(QK8, 11, 2)
    scale = task.scalar_values(task.axis_values({"total_seq_len": 11, "num_seqs": 2, "len_cu_seqlens": 3}))["scale"]
    g, beta = _gates64(x)
    HV, HQ = x["v"].shape[1], x["q"].shape[1]
    cu = x["cu_seqlens"].tolist()
    want = torch.zeros(11, HV, 128, dtype=torch.float64)
    for n in range(len(cu) - 1):
        for h in range(HV):
            hq = h // (HV // HQ)
            S = x["state"][n, h].double()  # [V, K]
            for t in range(cu[n], cu[n + 1]):
                k, q, v = x["k"][t, hq].double(), x["q"][t, hq].double(), x["v"][t, h].double()
                S = g[t, h] * S
                S = S + torch.outer(beta[t, h] * (v - S @ k), k)
                want[t, h] = scale * ((S * q[None, :]) ** 2).sum(-1).sqrt()
    got = term_scales(task, x)
    assert set(got) == {"output"} and task.tolerance.scale == "terms"
    torch.testing.assert_close(got["output"].double(), want, rtol=1e-4, atol=1e-7)


def test_gdn_prefill_rows_have_no_floor():
    for name in (QK8, "gdn_prefill_qk4_v8_d128_k_last"):
        rows = get_task(name).tolerance.rows
        assert rows["output"].floor == 0 and rows["new_state"].floor == 0


def test_every_zeroed_or_stale_gdn_prefill_row_fails_and_honest_passes():
    task, axes, x = _prefill(QK8, 150, 3)
    expected = run_reference(task, x)
    scales = term_scales(task, x)
    stale = as_written(task, run_reference(task, generate_inputs(task, axes, seed=8)))
    res = sparse_resolution(task, expected, as_written(task, expected), stale, scales)
    for out in ("output", "new_state"):
        for fault in ("zeroed_row", "stale_row"):
            least, passing, rows = res[out][fault]
            assert passing == 0 and least > 2, (out, fault, least, passing, rows)
        assert res[out]["as_written"][0] < 0.5, (out, res[out]["as_written"])  # rounding to the dtype alone
    honest = as_written(task, honest_variants(task, x)["chunked_bf16_mma_fp32_state"]())
    for out in ("output", "new_state"):
        m = compare(out, honest[out], expected[out], task.tolerance, scales.get(out))
        assert m.passed and m.row_ratio < 0.8, (out, m.describe(), m.row_ratio)
