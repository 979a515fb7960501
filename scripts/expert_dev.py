"""The development harness of the expert kernels (tasks/<task>/expert): build their variants and
check them on a GPU, through the project's own compile, SASS inspection and evaluator.

A variant is the expert's kernel.cu with some of its `#ifndef` knobs defined (STAGES, CLUSTER_M,
PINGPONG, ...) and, where a knob changes what the host must launch, the manifest's main launch
(the one with the most dynamic shared memory) overridden to match.

    python scripts/expert_dev.py build TASK [VARIANT ...]    # CPU: registers, smem, spills, ptxas
                                                             # warnings, requested features in the SASS
    python scripts/expert_dev.py check TASK [VARIANT ...] [--workloads all]
                                                             # GPU: correctness and speedup against the
                                                             # library, the evaluator's own verdict
Tasks with variants: see VARIANTS (the causal folders share their non-causal kernel's knobs; "gemm" is
every gemm_n*_k* task). `--only M70,M8192` checks those workloads only.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.solution import Solution, strip_jsonc  # noqa: E402

# The GEMM expert's schedule knobs are manifest expressions. The variants written for v3 (T: its
# 128x256 tiles) pin the tile width to 256 (_BN256); the bn_* variants choose it.
_T = "(cdiv(M, 128) * cdiv(N, 256))"  # parenthesised: it is spliced into larger expressions
_SK_GRID = f"min(num_sms, max({_T}, {_T} * cdiv(K, 64) // 8))"


def _gemm_sk(when: str, sk_tiles: str) -> dict:
    """Stream-K on `sk_tiles` tiles wherever `when` holds (grid and ws to match), else data-parallel."""
    return {"grid": [f"{_SK_GRID} if {when} else min(num_sms, {_T})"],
            "args": {"sk_tiles": f"{sk_tiles} if {when} else 0", "bn": "256"},
            "box": {"tmB": [256, 64]},
            "buffers": {"ws": [f"2 * num_sms if {when} else 1", 32768], "counters": [_T]}}


def _gemm_bn(bn: str, red: bool = False, sk: str = "2 * {t} <= num_sms",
             sk_grid: str = "min(num_sms, max({t}, {t} * cdiv(K, 64) // 8))") -> tuple[dict, dict]:
    """The GEMM expert with tiles `bn` wide (an expression: 128 or 256), stream-K on `sk_grid` CTAs
    where `sk` holds (default: those tiles fill at most half the SMs); tmB's box, the counters and the
    tile count follow."""
    t = f"(cdiv(M, 128) * cdiv(N, {bn}))"
    sk, sk_grid = sk.format(t=t), sk_grid.format(t=t)
    over = {"grid": [f"{sk_grid} if {sk} else min(num_sms, {t})"],
            "args": {"sk_tiles": f"{t} if {sk} else 0", "bn": bn},
            "box": {"tmB": [bn, 64]},
            "buffers": {"counters": [t],
                        "ws": ({"shape": [f"{t} if {sk} else 1", 32768], "zero": True} if red
                               else [f"2 * num_sms if {sk} else 1", 32768])}}
    return ({"FIXUP_RED": 1} if red else {}), over


# 128-wide tiles where 256-wide ones would be half empty (N <= 128) or too few to fill half the SMs
_BN_AUTO = "(128 if N <= 128 else (128 if 2 * cdiv(M, 128) * cdiv(N, 256) <= num_sms else 256))"


def _gemm_wave(wave: str = "({t} > num_sms) * ({t} % num_sms > 0)") -> dict:
    """The shipped schedule at small M, and where `wave` holds (by default: the tiles fill more than
    one wave, the last one partly), stream-K over that last wave's tiles (on every CTA: each streams a
    share of their K iterations after its whole tiles), so no SM idles through the last wave."""
    t = f"(cdiv(M, 128) * cdiv(N, {_BN_AUTO}))"
    small, wave = f"2 * {t} <= num_sms", wave.format(t=t)
    return {"grid": [f"{t} * max(1, min(num_sms // {t}, cdiv(K, 64) // 8)) if {small} else min(num_sms, {t})"],
            "args": {"sk_tiles": f"{t} if {small} else ({t} % num_sms if {wave} else 0)"},
            "buffers": {"ws": [f"2 * num_sms if {small} else (2 * num_sms if {wave} else 1)", 32768]}}


def _bwd_smem(stages: int = 2, comp: int = 0, tma: int = 1) -> int:
    """The backward's main kernel: 1 KiB alignment slack, K, V, STAGES x (Q, dO, LSE/Delta), dS
    (twice with DQ_COMP), the dQ staging tile (DQ_TMA), barriers (the ring's, DQ_WARP's and DQ_FUSE's)
    and DQ_FUSE's mailbox (DQ_HEADCONV's flag); rounded up to 128 bytes."""
    raw = 1024 + 65536 + stages * 33280 + 32768 * (1 + comp) + 32768 * tma + 8 * (1 + 2 * stages + 8) + 8
    return -(-raw // 128) * 128


def _bwd_ring(r: str) -> dict:
    """DQ_RING's manifest: dQacc holds `r` heads (an expression), dQcnt one count per head and one generation per
    slot, and both kernels take `ring`."""
    ring = {"name": "ring", "type": "i32", "value": r}
    return {"buffers": {"dQacc": [r, "S", "D"], "dQcnt": [f"B * H + {r}"]}, "args_add": [ring],
            "launch_args_add": {"attn_bwd_pre_sm90": [ring]}, "view": {"tmdQacc": [r, "S", "D"]}}


def _dq_launch(when: str = "True") -> dict:
    """The dQ conversion launch of v5 and earlier (attn_bwd_dq_sm90): every head where `when` holds, else a launch
    with nothing to do (v6 dropped it: the main kernel converts or stores dQ itself, DQ_DIRECT)."""
    return {"kernel": "attn_bwd_dq_sm90", "block": [256],
            "grid": ["min(cdiv(B * H * S * D // 4, 256), num_sms * 16)" if when == "True"
                     else f"min(cdiv(B * H * S * D // 4, 256), num_sms * 16) if {when} else 1"],
            "args": ["dQacc", "dQ", {"name": "n4", "type": "i32",
                                     "value": "B * H * S * D // 4" if when == "True" else f"B * H * S * D // 4 if {when} else 0"},
                     "sm_scale"]}


_PRE_V5_ARGS = ["O", "dO", "LSE", "Delta", "LSE2", "dQacc", {"name": "rows", "type": "i32", "value": "B * H * S"},
                "S", {"name": "Spad", "type": "i32", "value": "cdiv(S, 64) * 64"}]
# Before v6 (DQ_DIRECT) the pre kernel left the padding of Delta and LSE2 unwritten: zeroed scratch (two timed memsets).
_ZEROED_LD = {"buffers": {"Delta": {"zero": True}, "LSE2": {"zero": True}}}
# v5's manifest (DQ_HEADCONV, before DQ_DIRECT): the pre kernel without `conv`, the dQ launch for heads of one key block.
_BWD_V5 = {"launch_over": {"attn_bwd_pre_sm90": {"args": _PRE_V5_ARGS + ["dQcnt"]}},
           "launches_add": [_dq_launch("cdiv(S, 128) == 1")], **_ZEROED_LD}
# v4's manifest (before DQ_HEADCONV): the main launch without dQ, dQcnt and conv; the dQ launch converts every
# head. Every variant measured before v5 is spelled on it (v4_base), so it measures what it did then.
_BWD_V4 = {"args": ["tmQ", "tmK", "tmV", "tmdO", "tmLSE2", "tmDelta", "tmdK", "tmdV", "tmdQacc", "dQacc", "S",
                    {"name": "scale_log2", "type": "f32", "value": "sm_scale * 1.4426950408889634"}, "sm_scale"],
           "buffers_drop": ["dQcnt"],
           "launch_over": {"attn_bwd_pre_sm90": {"args": _PRE_V5_ARGS}},
           "launches_add": [_dq_launch()], **_ZEROED_LD}


def _v4(knobs: dict | None = None, over: dict | None = None) -> tuple[dict, dict]:
    """A backward variant on v4 (DQ_HEADCONV off, v4's manifest) with these knobs and overrides."""
    return {"DQ_HEADCONV": 0, **(knobs or {})}, {**_BWD_V4, **(over or {})}


# DQ_FUSE: the main kernel takes dQ and one zeroed int32 counter per (head, query block); no dQ launch.
_BWD_FUSE = {"buffers_add": [{"name": "dQcnt", "dtype": "int32", "shape": ["B * H", "cdiv(S, 64)"], "zero": True}],
             "args_add": ["dQ", "dQcnt"], "drop_launches": ["attn_bwd_dq_sm90"]}
_FWD_ST2 = {"shared_bytes": 1024 + 32768 * 5 + 256}
_FWD = {
    "shipped": ({}, {}),  # kernel.cu defaults: PINGPONG=1, STAGES=3
    "pp": ({"STAGES": 2}, _FWD_ST2),
    "base": ({"PINGPONG": 0, "STAGES": 2}, _FWD_ST2),  # no ping-pong between the two consumer warpgroups
    "split": ({"PINGPONG": 0, "STAGES": 2, "PV_SPLIT": 1}, _FWD_ST2),  # P V as two n64 wgmmas
}
_BWD = {
    # kernel.cu defaults: DQ_TMA=1, DQ_DEFER=1, STAGES=2, DQ_WARP=1, CAUSAL_GROUP=8 (v4), DQ_HEADCONV=1 (v5)
    "shipped": ({}, {}),
    "v5": ({"DQ_DIRECT": 0}, _BWD_V5),  # the kernel shipped before v6 (three launches, Delta/LSE2 zeroed scratch)
    # dQacc as a ring of R head slots (R: twice the heads a wave holds, plus 8), re-zeroed by each head's converting
    # CTA for the head R later: the pre kernel zeroes R heads' dQacc, not all of them
    "ring": ({"DQ_RING": 1}, _bwd_ring("min(B * H, cdiv(2 * num_sms, cdiv(S, 128)) + 8)")),
    # the pre kernel with four rows a warp (16-byte loads, half a warp per row): more bytes in flight
    "pre4": ({"PRE_ROWS": 4}, {"launch_over": {"attn_bwd_pre_sm90": {"grid": ["cdiv(B * H * S, 32)"]}}}),
    "ring_pre4": ({"DQ_RING": 1, "PRE_ROWS": 4}, {**_bwd_ring("min(B * H, cdiv(2 * num_sms, cdiv(S, 128)) + 8)"),
                                                   "launch_over": {"attn_bwd_pre_sm90": {"grid": ["cdiv(B * H * S, 32)"]}}}),
    # causal: a head's CTAs spread over more time (longest first in groups of 8 heads): more slots
    "ring_c": ({"DQ_RING": 1}, _bwd_ring("min(B * H, cdiv(4 * num_sms, cdiv(S, 128)) + 24)")),
    "v4": _v4(),  # the kernel shipped before v5
    "v3": _v4({"DQ_WARP": 0, "CAUSAL_GROUP": 0}),  # the kernel shipped before v4
    "st3": _v4({"STAGES": 3}, {"shared_bytes": _bwd_smem(stages=3)}),
    "tma": _v4({"DQ_DEFER": 0, "STAGES": 2}, {"shared_bytes": _bwd_smem()}),  # TMA reduce-add of a staged dQ tile
    "defer": _v4({"DQ_TMA": 0, "STAGES": 2}, {"shared_bytes": _bwd_smem(tma=0)}),  # per-thread reds, drained later
    "v2": _v4({"DQ_TMA": 0, "DQ_DEFER": 0, "STAGES": 2}, {"shared_bytes": _bwd_smem(tma=0)}),
    "comp": _v4({"DQ_COMP": 1, "STAGES": 2}, {"shared_bytes": _bwd_smem(comp=1)}),  # dQ from dS = hi + lo
    "kreg": _v4({"AREG": 1}),  # K's A fragments in registers: S^T = K Q^T as an RS wgmma
    "vreg": _v4({"AREG": 2}),  # V's A fragments in registers: dP^T = V dO^T as an RS wgmma
    "kreg4": _v4({"AREG": 1, "AREG_KK": 4}),  # half of K's head dim from registers (16 registers)
    "kreg2": _v4({"AREG": 1, "AREG_KK": 2}),
    "vreg4": _v4({"AREG": 2, "AREG_KK": 4}),
    "late": _v4({"DV_LATE": 1}),
    "latek": _v4({"DV_LATE": 1, "AREG": 1}),
    "latek4": _v4({"DV_LATE": 1, "AREG": 1, "AREG_KK": 4}),
    "latev": _v4({"DV_LATE": 1, "AREG": 2}),
    "poly2": _v4({"EXP_POLY": 2}),  # a quarter of P^T's exp2 on the FMA pipe
    "poly4": _v4({"EXP_POLY": 4}),  # half
    "g4": _v4({"CAUSAL_GROUP": 4}),  # causal: longest key blocks first within groups of 4 heads
    "g8": _v4({"CAUSAL_GROUP": 8}),
    "g16": _v4({"CAUSAL_GROUP": 16}),
    "dqw": _v4({"DQ_WARP": 1, "CAUSAL_GROUP": 0}),  # a producer warp issues the dQ reduce-adds (mbarrier hand-over)
    # dqw, and the CTA whose reduce-add completes a query block converts it to bf16 (no dQ launch)
    "fuse": _v4({"DQ_WARP": 1, "DQ_FUSE": 1}, _BWD_FUSE),
    "stag": _v4({"QSTAGGER": 1}),  # non-causal: key blocks start their query sweep at staggered blocks
    "stm": _v4({"DS_STMATRIX": 1}),  # dS^T stored by stmatrix
    "carry": _v4({"DK_CARRY": 1}),  # a step's dK left in flight: the next S^T and dP^T queue behind it
    "carry3": _v4({"DK_CARRY": 1, "STAGES": 3}, {"shared_bytes": _bwd_smem(stages=3)}),
    # v5 (DQ_HEADCONV) variants, on v5's manifest
    "hc8": ({"HC_UNROLL": 8, "DQ_DIRECT": 0}, _BWD_V5),  # 8 loads in flight per converting thread (W1's hconv), not 16
    "carryh": ({"DK_CARRY": 1, "DQ_DIRECT": 0}, _BWD_V5),
    "carryh3": ({"DK_CARRY": 1, "STAGES": 3, "DQ_DIRECT": 0}, {"shared_bytes": _bwd_smem(stages=3), **_BWD_V5}),
}
_FP8_SPLITS_C2 = "max(1, min(8, num_sms // (2 * cdiv(m, 256) * (n // 256))))"
_FP8_SPLITS_MAX4 = "max(1, min(4, num_sms // (cdiv(m, 128) * (n // 256))))"
_FP8_SPLITS128 = "max(1, min(8, num_sms // (cdiv(m, 128) * (n // 128))))"
_FP8_BN128 = {"box": {"tmB": [128, 128]}, "shared_bytes": 1024 + 6 * 32768 + 32768 + 112,
              "grid": [f"min(num_sms, cdiv(m, 128) * (n // 128) * ({_FP8_SPLITS128}))"],
              "args": ["tmA", "tmB", "tmD", "SF_A", "SF_B", "ws", "counters", "m", "n", "k",
                       {"name": "splits", "type": "i32", "value": _FP8_SPLITS128}]}
_FP8 = {
    "shipped": ({}, {}),  # kernel.cu defaults: BN=256 (two 128-column passes per K block), STAGES=4, GROUP_M=8, SPLIT_RED=1
    # 128x128 tiles, one pass per K block; the manifest's ws (sized for BN=256's splits) is large enough.
    "bn128": ({"BN": 128, "STAGES": 6}, _FP8_BN128),
    # bn128 with two partials: K block kb+1's wgmmas run while kb is promoted (192 accumulator registers)
    "pipe": ({"BN": 128, "STAGES": 6, "PIPE": 1}, _FP8_BN128),
    "g16": ({"GROUP_M": 16}, {}),  # tiles visited in groups of 16 rows of tiles (shipped before 2026-12-03 W1)
    # split K at most 4 ways (M = 70: 16 tiles x 4 instead of x 8; the fix-up reads 3 partials, not 7)
    "s4": ({}, {"grid": [f"min(num_sms, cdiv(m, 128) * (n // 256) * ({_FP8_SPLITS_MAX4}))"],
                "args": ["tmA", "tmB", "tmD", "SF_A", "SF_B", "ws", "counters", "m", "n", "k",
                         {"name": "splits", "type": "i32", "value": _FP8_SPLITS_MAX4}]}),
    # clusters of 2 CTAs on vertically adjacent tiles, each loading half of B for both (multicast)
    "c2": ({"CLUSTER_M": 2}, {"cluster": [2, 1, 1], "box": {"tmB": [128, 128]},
                              "grid": [f"min(num_sms // 2 * 2, 2 * cdiv(m, 256) * (n // 256) * ({_FP8_SPLITS_C2}))"],
                              "args": ["tmA", "tmB", "tmD", "SF_A", "SF_B", "ws", "counters", "m", "n", "k",
                                       {"name": "splits", "type": "i32", "value": _FP8_SPLITS_C2}]}),
}


# GDN decode. The shipped manifest (gdn8) launches gdn_decode_tma (one CTA per 16-row tile, 64 registers) from 64 to
# num_sms (sequence, value head) pairs (its `let` one_tile) and gdn_decode_ring (a persistent grid, a ring of TMA
# stages: rc_mix32) elsewhere. Every variant below that names a kernel is one launch on every workload (variant()'s
# "kernel"): the ring variants launch gdn_decode_ring, `tile` and the variants built on it the first expert
# gdn_decode_tma (one CTA per tile of 16 or 32 rows) at ptxas's own registers (TILE_MIN_BLOCKS 0: 40), as measured.
def _gdn_ring(rows: int = 16, stages: int = 4, per_sm: int = 3, tma_store: int = 0, warps: int = 4,
              side: int = 0) -> tuple[dict, dict]:
    """The persistent kernel gdn_decode_ring: the state rows through TMA, a ring of `stages` tiles in
    flight per CTA, `per_sm` CTAs per SM, the tiles split evenly over the grid. `side`: how k, q, v and
    the gates come (kernel.cu's RING_SIDE): 0 TMA, 1 cp.async on the state's barrier, 2 on their own."""
    tiles = f"(batch_size * num_v_heads * head_size // {rows})"
    per_cta = f"cdiv({tiles}, num_sms * {per_sm})"
    stage_bytes = rows * 512 + 256 + 256 + 5 * 128  # kernel.cu's ring::STAGE_BYTES
    rows_view = ["batch_size * num_v_heads * head_size", "head_size"]
    maps = [
        {"name": "tmState", "tensor": "state", "view": rows_view, "box": [rows, "head_size"], "l2_promotion": "256B"},
        {"name": "tmNewState", "tensor": "new_state", "view": rows_view, "box": [rows, "head_size"]},
        {"name": "tmQ", "tensor": "q", "view": ["batch_size * num_q_heads", "head_size"], "box": [1, "head_size"]},
        {"name": "tmK", "tensor": "k", "view": ["batch_size * num_q_heads", "head_size"], "box": [1, "head_size"]},
        {"name": "tmV", "tensor": "v", "view": ["batch_size * num_v_heads", "head_size"], "box": [1, rows]},
        # the gate inputs as rows of 16 bytes (num_v_heads is a multiple of 8)
        {"name": "tmA", "tensor": "a", "view": ["batch_size * num_v_heads // 8", 8], "box": [1, 8]},
        {"name": "tmB", "tensor": "b", "view": ["batch_size * num_v_heads // 8", 8], "box": [1, 8]},
        {"name": "tmAlog", "tensor": "A_log", "view": ["num_v_heads // 4", 4], "box": [1, 4]},
        {"name": "tmDt", "tensor": "dt_bias", "view": ["num_v_heads // 4", 4], "box": [1, 4]},
    ]
    side_args = ["q", "k", "v", "A_log", "a", "dt_bias", "b"] if side else ["tmQ", "tmK", "tmV", "tmA", "tmB", "tmAlog", "tmDt"]
    return ({"RING_ROWS": rows, "RING_STAGES": stages, "RING_STORE_TMA": tma_store, "RING_WARPS": warps, "RING_SIDE": side,
             "RING_ROWS_SMALL": 0, "RING_TILE_BODY": 0, "RING_MIN_BLOCKS": 0},
            {"tensor_maps": maps[:2] if side else maps, "kernel": "gdn_decode_ring", "grid": [f"cdiv({tiles}, {per_cta})"],
             "block": [32 * warps], "shared_bytes": stages * stage_bytes + 128,
             "args": ["tmState", "tmNewState", *side_args, "output",
                      "new_state", "num_q_heads", "num_v_heads", {"type": "i32", "value": tiles}, "scale",
                      {"type": "i32", "value": str(rows)}]})


def _gdn_mix(small: str, rows: int = 16, small_rows: int = 8, stages: int = 5, per_sm: int = 4, small_per_sm: int = 6,
             side: int = 2, small_warps: int = 2, small_stages: int | None = None, warps: int = 4,
             big_per_cta: int | None = None, tile_body: bool | str = False) -> tuple[dict, dict]:
    """gdn_decode_ring with two tile heights in one module, chosen per workload by the manifest: `small_rows`
    (`small_warps` warps, `small_per_sm` CTAs per SM, at most `small_stages` stages) where the expression `small`
    holds, else `rows` (`warps` warps, `per_sm`, `stages`); side inputs as _gdn_ring's `side`; never more stages
    than a CTA has tiles. `big_per_cta`: with `rows`, at most that many tiles per CTA (a grid of several waves,
    which the hardware balances over the SMs as CTAs retire), not the persistent share."""
    small_stages = stages if small_stages is None else small_stages
    r = f"({small_rows} if {small} else {rows})"
    tiles = f"(batch_size * num_v_heads * head_size // {r})"
    per_cta = f"cdiv({tiles}, num_sms * ({small_per_sm} if {small} else {per_sm}))"
    if big_per_cta:
        per_cta = f"({per_cta} if {small} else min({big_per_cta}, {per_cta}))"
    if tile_body is True:  # where `small` holds, a CTA per tile: the kernel then runs gdn_decode_tma's body
        per_cta = f"(1 if {small} else {per_cta})"  # (RING_TILE_BODY)
    elif tile_body:  # the same where `small` and the expression `tile_body` hold (expressions have no `and`)
        per_cta = f"((1 if {tile_body} else {per_cta}) if {small} else {per_cta})"
    defines, over = _gdn_ring(rows, max(stages, small_stages), per_sm, warps=warps, side=side)
    defines.update({"RING_ROWS_SMALL": small_rows, "RING_WARPS_SMALL": small_warps, "RING_TILE_BODY": int(bool(tile_body))})
    for tm in over["tensor_maps"]:
        if tm["name"] in ("tmState", "tmNewState"):
            tm["box"] = [r, "head_size"]
        elif tm["name"] == "tmV":
            tm["box"] = [1, r]
    over.update({"grid": [f"cdiv({tiles}, {per_cta})"], "block": [f"32 * ({small_warps} if {small} else {warps})"],
                 "shared_bytes": f"min({small_stages} if {small} else {stages}, {per_cta}) * ({r} * 512 + 1152) + 128"})
    over["args"] = over["args"][:-3] + [{"type": "i32", "value": tiles}, "scale", {"type": "i32", "value": r}]
    return defines, over


_TILE_ROWS = "(32 if batch_size * num_v_heads >= 256 else 16)"


def _gdn_tile(rows: int | str = _TILE_ROWS, warps: int = 4, load_box: int | str | None = None) -> dict:
    """The first expert, gdn_decode_tma: one CTA per tile of `rows` state rows (by default 32 from 256
    heads up, else 16), one TMA load of `load_box` rows (default: the tile) per mbarrier."""
    rows_view = ["batch_size * num_v_heads * head_size", "head_size"]
    return {"tensor_maps": [
                {"name": "tmState", "tensor": "state", "view": rows_view, "box": [load_box or rows, "head_size"],
                 "l2_promotion": "256B"},
                {"name": "tmNewState", "tensor": "new_state", "view": rows_view, "box": [rows, "head_size"]}],
            "kernel": "gdn_decode_tma", "grid": [f"batch_size * num_v_heads * (head_size // {rows})"],
            "block": [32 * warps], "shared_bytes": f"{rows} * 512 + 128",
            "args": ["tmState", "tmNewState", "q", "k", "v", "A_log", "a", "dt_bias", "b", "output", "new_state",
                     "num_q_heads", "num_v_heads", {"type": "i32", "value": str(rows)}, "scale"]}


_RC32_ARGS = ("batch_size * num_v_heads < 256",)
_RC32_KW = dict(rows=32, stages=3, small_rows=16, small_stages=5, small_per_sm=4, small_warps=4, side=1)
_RC32 = _gdn_mix(*_RC32_ARGS, **_RC32_KW)  # rc_mix32: shipped alone until gdn8, now the ring's launch

_GDN_DECODE = {
    "shipped": ({}, {}),  # the folder as is (gdn8): the one-tile entry from 64 to num_sms heads, rc_mix32 elsewhere
    # the shipped choice with the one-tile entry at ptxas's own 40 registers (12 CTAs per SM, not 8)
    "tile40": ({"TILE_MIN_BLOCKS": 0}, {}),
    # the shipped entries with other thresholds: batch_size <= 8 (qk4 B1-B8, qk8 B1-B8); every workload below 256
    # heads (rc_tb8's split, but the ring at its own registers)
    "one_b8": ({}, {"let": {"one_tile": "batch_size <= 8"}}),
    "one_lt256": ({}, {"let": {"one_tile": "heads < 256"}}),
    "ring": _gdn_ring(),  # R=16, 4 stages, 3 CTAs per SM: 3 x 4 x 8 KiB in flight per SM
    "ring_ts": _gdn_ring(tma_store=1),  # the same, new_state through TMA stores
    "ring32": _gdn_ring(32, 3, 2),  # R=32, 3 stages, 2 CTAs per SM
    "ring32x4": _gdn_ring(32, 3, 4),  # R=32, 3 stages, 4 CTAs per SM: 192 KiB in flight per SM
    "ring_s7": _gdn_ring(16, 7, 3),  # R=16, 7 stages, 3 CTAs per SM: 168 KiB in flight per SM
    "ring_s6": _gdn_ring(16, 6, 2),  # R=16, 6 stages, 2 CTAs per SM
    "ring_s2": _gdn_ring(16, 2, 6),  # R=16, 2 stages, 6 CTAs per SM
    "ring8": _gdn_ring(8, 4, 6, warps=2),  # fla's tile height (4 KiB tiles), 2 warps: 128 CTAs at B=1 (qk4)
    "ring_big": _gdn_ring(16, 5, 4),  # 160 KiB in flight per SM (= ring_prev, shipped until rc_mix32)
    "ring_big_ts": _gdn_ring(16, 5, 4, tma_store=1),
    "ring_chunk": ({**_gdn_ring(16, 5, 4)[0], "RING_CHUNKED": 1}, _gdn_ring(16, 5, 4)[1]),  # contiguous runs of tiles
    "ring_small": _gdn_ring(16, 2, 3),  # 48 KiB in flight per SM
    # k, q, v and the gates by cp.async (2 LDGSTS per warp-0 lane per tile, not 8 TMA loads): one TMA load a tile
    "rc": _gdn_ring(16, 5, 4, side=1),
    "rcs": _gdn_ring(16, 5, 4, side=2),  # ... on a barrier of their own: gates and k.q while the state lands
    "rcs32": _gdn_ring(32, 3, 4, side=2),  # R=32, 3 stages, 4 CTAs per SM: 192 KiB in flight per SM
    "rcs8": _gdn_ring(8, 4, 6, side=2, warps=2),  # R=8, 2 warps, 4 stages, 6 CTAs per SM
    "rcs_s8": _gdn_ring(16, 8, 3, side=2),  # R=16, 8 stages, 3 CTAs per SM: 192 KiB
    # rcs with 8-row tiles (2 warps, 6 CTAs per SM) up to 64 heads (qk4 B <= 8, qk8 B <= 4), 16-row tiles above
    "rcs_mix": _gdn_mix("batch_size * num_v_heads <= 64"),
    "rcs_mix1t": _gdn_mix("batch_size * num_v_heads <= 64", small_per_sm=8),  # one 8-row tile per CTA at 64 heads
    "rcs_mixw1": _gdn_mix("batch_size * num_v_heads <= 64", small_per_sm=16, small_warps=1),  # fla's shape: 1 warp, 8 rows
    # rc (k, q, v, gates by cp.async on the state's barrier) with 32-row tiles (3 stages) from 256 heads up, 16-row
    # tiles (5 stages) below; 4 warps and 4 CTAs per SM in both: shipped 2026-12-03 (gdn6), the ring's launch since gdn8
    "rc_mix32": _gdn_mix("batch_size * num_v_heads < 256", rows=32, stages=3, small_rows=16, small_stages=5,
                         small_per_sm=4, small_warps=4, side=1),
    # rc_mix32 with at most N 32-row tiles per CTA (a grid of waves the hardware balances as CTAs retire, not a
    # persistent share per CTA: the slowest SM no longer sets the end), RING_MIN_BLOCKS CTAs per SM for the registers
    "rc_t1": ({**_RC32[0], "RING_MIN_BLOCKS": 8}, _gdn_mix(*_RC32_ARGS, **{**_RC32_KW, "big_per_cta": 1})[1]),
    "rc_t2": ({**_RC32[0], "RING_MIN_BLOCKS": 6}, _gdn_mix(*_RC32_ARGS, **{**_RC32_KW, "big_per_cta": 2})[1]),
    "rc_t3": _gdn_mix(*_RC32_ARGS, **{**_RC32_KW, "big_per_cta": 3}),
    # rc_mix32, and below 256 heads a CTA per 16-row tile running the first expert's body (gates and k.q computed
    # while the state lands (gdn7, 2026-12-04; W2: 3% faster at qk4 B8, 10% slower at qk8 B8 where its 1024 CTAs
    # need two waves at 5 per SM)
    "rc_tb": _gdn_mix(*_RC32_ARGS, **{**_RC32_KW, "tile_body": True}),  # 94 registers: 5 CTAs per SM
    # rc_tb only where its one-tile CTAs fit the SMs at once (5 per SM at 94 registers: qk4 B8's 512, not qk8 B8's
    # 1024, which keeps the ring)
    "rc_tbf": _gdn_mix(*_RC32_ARGS, **{**_RC32_KW, "tile_body": "batch_size * num_v_heads * 8 <= 5 * num_sms"}),
    # rc_tb with 64 registers (8 CTAs per SM: qk8 B8's 1024 one-tile CTAs in one wave; 94 registers allow 5 per SM).
    # W2: 7% / 3% faster than rc_mix32 at qk8 / qk4 B8, 13% slower at B64 (the ring at 64 registers)
    "rc_tb8": ({**_gdn_mix(*_RC32_ARGS, **{**_RC32_KW, "tile_body": True})[0], "RING_MIN_BLOCKS": 8},
               _gdn_mix(*_RC32_ARGS, **{**_RC32_KW, "tile_body": True})[1]),
    # rc_mix32 with at least 48 KiB of shared memory per CTA, so at most 4 CTAs fit on an SM (the registers allow
    # 5): the grid (<= 4 num_sms CTAs) then lands as evenly as it can, never 5 CTAs' tiles on one SM
    "rc_cap4": (_RC32[0], {**_RC32[1], "shared_bytes": f"max({_RC32[1]['shared_bytes']}, 49152)"}),
    "rc_t4": _gdn_mix(*_RC32_ARGS, **{**_RC32_KW, "big_per_cta": 4}),
    # the same with 64-row tiles (2 CTAs per SM, 3 stages: 204 KiB) from 256 heads up
    "rc_mix64": _gdn_mix("batch_size * num_v_heads < 256", rows=64, stages=3, per_sm=2, small_rows=16, small_stages=5,
                         small_per_sm=4, small_warps=4, side=1),
    "ring_prev": _gdn_ring(16, 5, 4),  # the kernel shipped before rc_mix32 (every input by TMA): ring_big
    "flat16": _gdn_ring(16, 1, 1000),  # one tile per CTA (the grid is the tile count): the layout alone
    # L2 policies: state loads evict-first (read once), new_state stores evict-last or evict-first
    "ring_ef": ({**_gdn_ring()[0], "LOAD_EVICT_FIRST": 1}, _gdn_ring()[1]),
    "ring_el": ({**_gdn_ring()[0], "RING_STORE_HINT": 1}, _gdn_ring()[1]),
    "ring_efel": ({**_gdn_ring()[0], "LOAD_EVICT_FIRST": 1, "RING_STORE_HINT": 1}, _gdn_ring()[1]),
    "ring_sef": ({**_gdn_ring()[0], "RING_STORE_HINT": 2}, _gdn_ring()[1]),
    # the first expert (gdn_decode_tma) and its knobs
    "tile": ({}, _gdn_tile()),  # tiles of 32 rows from 256 heads up, else 16 (shipped until 2026-12-03 W1)
    "r16": ({}, _gdn_tile(16)),
    "r32": ({}, _gdn_tile(32)),
    "r64": ({}, _gdn_tile(64)),
    "cs": ({"STORE_CS": 1}, _gdn_tile()),  # new_state stored with st.global.cs
    "tmastore": ({"STORE_TMA": 1}, _gdn_tile()),  # new_state through one TMA store per tile
    "r64w8": ({"WARPS": 8}, _gdn_tile(64, 8)),
    "r32w2": ({"WARPS": 2}, _gdn_tile(32, 2)),
    "r8w2": ({"WARPS": 2}, _gdn_tile(8, 2)),  # fla's tile: 8 rows (4 KiB), here 2 warps
    "ef": ({"LOAD_EVICT_FIRST": 1}, _gdn_tile()),  # state loads hinted L2 evict-first
    # one TMA load and mbarrier per warp's rows (the load box a quarter of the tile)
    "split": ({"SPLIT_TMA": 1}, _gdn_tile(load_box=f"{_TILE_ROWS} // 4")),
    "splitcs": ({"SPLIT_TMA": 1, "STORE_CS": 1}, _gdn_tile(load_box=f"{_TILE_ROWS} // 4")),
    "splitef": ({"SPLIT_TMA": 1, "LOAD_EVICT_FIRST": 1}, _gdn_tile(load_box=f"{_TILE_ROWS} // 4")),
    "split16": ({"SPLIT_TMA": 1}, _gdn_tile(16, load_box=4)),
}
for _defines, _over in _GDN_DECODE.values():  # the first expert's variants: its build as measured (no register floor)
    if _over.get("kernel") == "gdn_decode_tma":
        _defines.setdefault("TILE_MIN_BLOCKS", 0)

VARIANTS: dict[str, dict[str, tuple[dict[str, int], dict]]] = {
    "fp8_gemm_nt_1d2d_n4096_k7168": _FP8,
    "gemm": {  # every gemm_n*_k* task (one kernel and manifest: scripts/gemm_experts.py)
        # v5: 128-wide tiles for N <= 128 or small M (a 6-deep ring), stream-K when the tiles fill at most
        # half the SMs with each stream-K tile cut into equal splits, and over the last wave's tiles where
        # that wave is 1/3 to 3/5 full
        "shipped": ({}, {}),
        "v4": ({"STAGES128": 4}, _gemm_bn(_BN_AUTO)[1]),  # v4: 4-deep ring at 128 wide, balanced stream-K ranges
        "bn_even4": ({"STAGES128": 4}, {}),  # v5 with v4's 4-deep ring at 128 wide
        "st128_5": ({"STAGES128": 5}, {}),
        "bal6": ({}, _gemm_bn(_BN_AUTO)[1]),  # v4's balanced stream-K ranges (every SM) with the 6-deep ring
        "nowave": ({}, _gemm_wave("0")),  # v5 without stream-K over the last wave
        "sk_wave": ({}, _gemm_wave()),  # stream-K over every partial last wave, however full
        "b_l2_none": ({}, {"l2_promotion": {"tmB": "none"}}),  # B streamed without L2 promotion
        "ordered": ({"FIXUP_ORDERED": 1}, {}),  # stream-K partials summed in contributor order (same bits every run)
        "sk_wave_ordered": ({"FIXUP_ORDERED": 1}, _gemm_wave()),
        "direct": ({"EPI_TMA": 0}, {}),  # C stored from registers, not through a TMA store
        "nodefer": ({"EPI_DEFER": 0}, {}),  # v5's epilogue: a tile staged and stored before the next tile's wgmmas
        "g8": ({"GROUP_M": 8}, {}),  # tiles visited in groups of 8 rows of tiles (L2 reuse)
        "dp": ({}, _gemm_sk("False", "0")),  # never stream-K
        "sk_lt": ({}, _gemm_sk(f"{_T} < num_sms", _T)),  # stream-K whenever the tiles are fewer than the SMs
        # stream-K also for the last partial wave at large M (plus one full wave, as CUTLASS's hybrid)
        "sk_tail": ({}, _gemm_sk(f"{_T} % num_sms > 0", f"{_T} if {_T} < 2 * num_sms else {_T} % num_sms + num_sms")),
        "b_l2_128": ({}, {"l2_promotion": {"tmB": "128B"}}),  # B's L2 promotion 128 B, not 256 B
        # stream-K partials summed by red.add into one zeroed fp32 tile per stream-K tile
        "red": _gemm_bn("256", red=True),
        # fewer stream-K CTAs: at least 32 K iterations each (fewer partials), or whole equal splits
        "sk_k32": _gemm_bn("256", sk_grid="min(num_sms, max({t}, {t} * cdiv(K, 64) // 32))"),
        "sk_even": _gemm_bn("256", sk_grid="{t} * (num_sms // {t})"),
        # at least 16 K iterations a CTA (between the shipped 8 and sk_k32): fewer partials per tile
        "sk16": _gemm_bn("256", sk_grid="min(num_sms, max({t}, {t} * cdiv(K, 64) // 16))"),
        # red's L2 sums with sk16's grid (many contributors per tile: N = 256)
        "red16": _gemm_bn("256", red=True, sk_grid="min(num_sms, max({t}, {t} * cdiv(K, 64) // 16))"),
        "bn128": _gemm_bn("128"),  # 128x128 tiles everywhere
        "bn128_red": _gemm_bn("128", red=True),
        # 128-wide tiles also where they save a 256-wide last wave under 1/3 full: the manifest's own `bn` since v7
        # (NOTES.md v7 gives the rule and its margin), kept under its name for the figures measured before
        "bn_wave": ({}, {}),
        "bn_v6": ({}, {"let": {"bn": _BN_AUTO}}),  # v6's tile width: 256 wherever the tiles fill more than half the SMs
        "nopair": ({}, {"let": {"pair": "0"}}),  # v6's fix-up through ws and counters (and their memset) at M = 70 too
        "bn_auto": _gemm_bn(_BN_AUTO),  # 128x128 tiles for N <= 128 and small M, else 128x256 (shipped since v4)
        "bn256": _gemm_bn("256"),  # 128x256 tiles everywhere (v3's manifest)
        # bn_auto with every stream-K tile cut into the same number of splits (as sk_even: a CTA's range
        # is one tile's segment, not two), at most num_sms // T and at least ~8 K iterations each
        "bn_even": _gemm_bn(_BN_AUTO, sk_grid="{t} * max(1, min(num_sms // {t}, cdiv(K, 64) // 8))"),
        "bn128_lt": _gemm_bn("128", sk="{t} < num_sms"),  # 128x128, stream-K whenever the tiles are fewer than the SMs
        # 128x128 with the accumulator added into an fp32 total every 4 / 8 K slices (accuracy at large K)
        "bn128_p4": ({"PROMOTE": 4}, _gemm_bn("128")[1]),
        "bn128_p8": ({"PROMOTE": 8}, _gemm_bn("128")[1]),
    },
    "mha_fwd_d128": _FWD, "mha_fwd_d128_causal": _FWD, "mha_bwd_d128": _BWD, "mha_bwd_d128_causal": _BWD,
    "gdn_decode_qk4_v8_d128_k_last": _GDN_DECODE, "gdn_decode_qk8_v16_d128_k_last": _GDN_DECODE,
}


def _family(task: str) -> str:
    return "gemm" if task.startswith("gemm_n") else task


def variant(task: str, name: str, into: Path) -> Solution:
    """The expert of `task` with variant `name`'s knobs and launch overrides, as a solution folder."""
    # every GEMM task's expert is the seed's (scripts/gemm_experts.py), withheld shapes included
    expert = ROOT / "tasks" / ("gemm_n7168_k5120" if _family(task) == "gemm" else task) / "expert"
    defines, over = VARIANTS[_family(task)][name]
    src = "".join(f"#define {k} {v}\n" for k, v in defines.items()) + (expert / "kernel.cu").read_text()
    manifest = json.loads(strip_jsonc((expert / "launch.json").read_text()))
    # (a shared_bytes given as an expression counts as 0 here: such manifests have one launch)
    if _family(task) == "gemm" and set(over) - {"let"}:
        # a variant that changes the launch was written for one launch: the clusters of 2 (`pair`, the DSMEM
        # fix-up, v7) are left out, so its overrides reach the one launch every workload then runs
        manifest["let"]["pair"] = "0"
    main = max(manifest["launches"], key=lambda launch: launch.get("shared_bytes", 0)
               if isinstance(launch.get("shared_bytes", 0), int) else 0)
    for key, value in over.items():
        if key in ("box", "l2_promotion", "view"):  # per tensor map
            for tm in manifest.get("tensor_maps", []):
                if tm["name"] in value:
                    tm[key] = value[tm["name"]]
        elif key == "args" and isinstance(value, list):  # the whole argument list
            main["args"] = value
        elif key == "drop_launches":  # kernels this variant does not launch
            manifest["launches"] = [launch for launch in manifest["launches"] if launch["kernel"] not in value]
        elif key == "args_add":  # arguments appended to the main launch's
            main["args"] = main["args"] + value
        elif key == "buffers_add":
            manifest["buffers"] = manifest.get("buffers", []) + value
        elif key == "buffers_drop":  # scratch buffers this variant does not use
            manifest["buffers"] = [b for b in manifest.get("buffers", []) if b["name"] not in value]
        elif key == "launch_over":  # fields of other launches than the main one, by kernel name
            for launch in manifest["launches"]:
                launch.update(value.get(launch["kernel"], {}))
        elif key == "launch_args_add":  # arguments appended to other launches than the main one, by kernel name
            for launch in manifest["launches"]:
                launch["args"] = launch["args"] + value.get(launch["kernel"], [])
        elif key == "launches_add":  # whole launches appended after the shipped ones
            manifest["launches"] = manifest["launches"] + [json.loads(json.dumps(launch)) for launch in value]
        elif key == "buffers":  # by buffer name: a shape, or the buffer's fields to change
            for b in manifest.get("buffers", []):
                if b["name"] in value:
                    v = value[b["name"]]
                    b.update(v if isinstance(v, dict) else {"shape": v})
        elif key == "args" and isinstance(value, dict):  # by-value arguments' expressions, by name
            for a in main["args"]:
                if isinstance(a, dict) and a.get("name") in value:
                    a["value"] = value[a["name"]]
        elif key == "tensor_maps":  # the whole list (a variant that loads more through TMA)
            manifest["tensor_maps"] = value
        elif key == "kernel":  # a whole launch of its own (GDN decode): it runs on every workload, in place of
            main["kernel"] = value  # all the launches the manifest picks per workload by their `when`
            main.pop("when", None)
            manifest["launches"] = [main]
        elif key == "let":  # the manifest's named sizes to change (or add), by name; the others stay
            manifest["let"] = {**manifest.get("let", {}), **value}
        else:
            main[key] = value
    folder = into / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kernel.cu").write_text(src)
    (folder / "launch.json").write_text(json.dumps(manifest, indent=1))
    return Solution.from_dir(folder)


def build(task: str, names: list[str]) -> int:
    from tasks import get_task
    from tools.evaluator import Evaluator

    wanted = get_task(task).features_for("sm_90a")
    with tempfile.TemporaryDirectory(prefix="expert-dev-") as tmp:
        for name in names:
            comp, insp = Evaluator.compile_and_inspect(variant(task, name, Path(tmp)), "sm_90a")
            print(f"== {task} {name}: {comp.status}" + (f" ({comp.error})" if comp.error else ""))
            for kernel, k in (comp.kernels or {}).items():
                print(f"   {kernel}: {k.registers} registers, {k.shared_bytes} B static smem, "
                      f"{k.spill_stores}/{k.spill_loads} B spilled, {k.stack_frame} B stack")
            for d in comp.diagnostics:
                if d.code in ("C7515", "C7508") or d.severity == "warning":
                    print(f"   ptxas {d.severity} {d.code or ''}: {d.message}")
            if insp.status == "ok":
                print(f"   requested in the SASS: {', '.join(f'{f} {insp.feature_present(f)}' for f in wanted)}; "
                      f"flags {dict(insp.flags)}")
    return 0


def check(task: str, names: list[str], workloads: str, only: list[str] | None = None, ev=None,
          executed: bool = False) -> int:
    """Evaluate each variant; one line per variant and workload as it finishes (a run cut short
    keeps what it printed). `ev`: an Evaluator to reuse across calls (one worker start);
    `executed`: also count the executed instructions (the credit verdict, correct_with_arch)."""
    from tasks import get_task
    from tools.evaluator import Evaluator

    t = get_task(task)
    if only:  # a development shortcut: these workloads only, whatever their split
        t = t.model_copy(update={"workloads": [w for w in t.workloads if w.name in only]})
        workloads = "all"
    ok = True
    with tempfile.TemporaryDirectory(prefix="expert-dev-") as tmp, contextlib.ExitStack() as stack:
        ev = ev or stack.enter_context(Evaluator())
        for name in names:
            r = ev.evaluate(variant(task, name, Path(tmp)), t, "sm_90a", workloads=workloads, executed_check=executed)
            ok = ok and bool(r.correct)
            if executed:
                print(f"{task:<22} {name:<10} correct_with_arch {r.correct_with_arch} "
                      f"{(r.executed.notes if r.executed else '') or ''}", flush=True)
            if not r.workloads:
                print(f"{task:<22} {name:<10} {r.run_status}: {r.run_reason or ''} {r.compile.error or ''}", flush=True)
            for w in r.workloads:
                ms = f"{w.timing.median_ms:.4g} ms" if w.timing else ""
                base = f"{w.baseline.median_ms:.4g} ms" if w.baseline else ""
                sp = f"{w.speedup:.3f}" if w.speedup else ""
                print(f"{task:<22} {name:<10} {w.workload:<7} {w.status:<8} {sp:<7} {ms:<11} lib {base:<11} "
                      f"{w.reason or ''} {(w.detail or '')[:300]}", flush=True)
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("verb", choices=["build", "check"])
    ap.add_argument("task", help="a task with variants: " + ", ".join(sorted(VARIANTS)) + " (gemm: any gemm_n*_k*)")
    ap.add_argument("variants", nargs="*", help="default: every variant of the task")
    ap.add_argument("--workloads", default="visible", choices=["visible", "held_out", "all"])
    ap.add_argument("--only", "--workload", default="", help="check: only these workloads, comma-separated (e.g. M70,M8192)")
    ap.add_argument("--executed", action="store_true", help="check: also the executed-instruction credit")
    args = ap.parse_args()
    family = _family(args.task)
    if family not in VARIANTS or not (family == "gemm" or (ROOT / "tasks" / args.task / "expert").is_dir()):
        ap.error(f"no expert variants for {args.task!r} (tasks with variants: {', '.join(sorted(VARIANTS))}, "
                 "and gemm_n*_k* with an expert folder)")
    names = args.variants or list(VARIANTS[family])
    unknown = [n for n in names if n not in VARIANTS[family]]
    if unknown:
        ap.error(f"unknown variant(s) {', '.join(unknown)} of {args.task} (known: {', '.join(VARIANTS[family])})")
    if args.verb == "check":
        from tools.evaluator import require_gpu

        require_gpu("scripts/expert_dev.py check")
    if args.verb == "build":
        return build(args.task, names)
    return check(args.task, names, args.workloads, [w for w in args.only.split(",") if w] or None,
                 executed=args.executed)


if __name__ == "__main__":
    sys.exit(main())
