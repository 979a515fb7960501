"""The one expert GEMM shipped for every GEMM task (scripts/gemm_experts.py): the copies match
the seed task's, and for every task and every workload (held-out included) the manifest plans a
launch whose stream-K schedule covers each tile's K range exactly once with every partial in a
`ws` slot that exists and every counter in range. The schedule below mirrors the kernel's
`for_each_work` and fix-up (tasks/gemm_n7168_k5120/expert/kernel.cu), so a manifest expression
that gives the kernel too small a ws, too few counters, or a grid past the SMs fails here, on any
shape, without a GPU."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tasks import get_task
from tasks.families.gemm import GEMM_SHAPES, SEED_SHAPE
from tools.launch import NOMINAL_LIMITS, plan_launches
from tools.solution import Solution

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from gemm_experts import WITHHELD  # noqa: E402

# a withheld shape ships no expert (the script says why): the rest must all ship it
TASKS = [t for t in dict.fromkeys(f"gemm_n{n}_k{k}" for n, k in [SEED_SHAPE, *GEMM_SHAPES]) if t not in WITHHELD]
PARTIAL_FLOATS = 128 * 256  # one fp32 128x256 tile (kernel.cu)


def test_every_gemm_task_ships_the_seed_expert():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gemm_experts.py"), "--check"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    for task in TASKS:
        assert (ROOT / "tasks" / task / "expert" / "kernel.cu").is_file(), task
    for task in WITHHELD:
        assert not (ROOT / "tasks" / task / "expert").exists(), task


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def schedule(M: int, N: int, K: int, ctas: int, sk_tiles: int, bn: int = 256):
    """kernel.cu's work list: {tile: [(kb0, kb1), ...]}, the partial slots written per tile, and
    for each stream-K tile the contributors the fix-up counts and reads (tiles 128 x bn)."""
    bn = 128 if bn == 128 else 256  # the kernel's reading of its `bn` argument
    num_m, num_n, num_k = cdiv(M, 128), cdiv(N, bn), cdiv(K, 64)
    tiles = num_m * num_n
    sk_tiles = min(max(sk_tiles, 0), tiles)
    dp = tiles - sk_tiles
    total = sk_tiles * num_k
    quot, rem = divmod(total, ctas)
    start = lambda c: c * quot + min(c, rem)  # noqa: E731  (Schedule::sk_start)

    def owner(i: int) -> int:  # Schedule::sk_owner
        big = rem * (quot + 1)
        return i // (quot + 1) if i < big else rem + (i - big) // quot

    cover: dict[int, list] = {t: [] for t in range(tiles)}
    written: dict[int, set] = {}
    for c in range(ctas):
        for t in range(c, dp, ctas):
            cover[t].append((0, num_k))
        it, end, slot = start(c), start(c + 1), 0
        while it < end:
            u = it // num_k
            kb0 = it - u * num_k
            kb1 = min(num_k, kb0 + end - it)
            cover[dp + u].append((kb0, kb1))
            if (kb0, kb1) != (0, num_k):
                written.setdefault(u, set()).add((c, slot))
            it, slot = it + kb1 - kb0, 1
    read: dict[int, set] = {}
    for u in written:  # the fix-up's contributors: the owners of the tile's first and last iteration, and between
        lo, hi = u * num_k, (u + 1) * num_k
        read[u] = {(c, 0 if start(c) >= lo else 1) for c in range(owner(lo), owner(hi - 1) + 1)}
    return cover, written, read, num_k, tiles


@pytest.mark.parametrize("task_name", TASKS)
def test_manifest_schedule_covers_every_tile_once(task_name):
    check_schedule(get_task(task_name), Solution.from_dir(ROOT / "tasks" / task_name / "expert"))


# expert_dev's variants that choose another tile width or schedule: each must plan a correct
# schedule on every task too before it can be measured (and shipped)
SCHEDULE_VARIANTS = ["bn128", "bn128_red", "bn_auto", "bn128_lt", "bn128_p4", "bn256", "bn_even", "sk16", "red16", "sk_k32",
                     "sk_even", "v4", "bn_even4", "sk_wave", "nowave", "bal6"]


@pytest.mark.parametrize("name", SCHEDULE_VARIANTS)
def test_variant_schedules_cover_every_tile_once(name, tmp_path):
    from expert_dev import variant

    for task_name in TASKS + list(WITHHELD):
        check_schedule(get_task(task_name), variant("gemm_n7168_k5120", name, tmp_path / task_name))


def check_schedule(task, sol) -> None:
    limits = NOMINAL_LIMITS["sm_90a"]
    for w in task.workloads:
        plan = plan_launches(sol.manifest, task, w.axes, limits)
        (lp,) = plan.launches
        axes = task.axis_values(w.axes)
        M, N, K = axes["M"], axes["N"], axes["K"]
        ctas = lp.grid[0]
        sk_tiles = next(a.value for a in lp.args if a.name == "sk_tiles")
        bn = next(a.value for a in lp.args if a.name == "bn")
        assert bn in (128, 256), (w.name, bn)
        (tm_b,) = [tm for tm in plan.tensor_maps if tm.name == "tmB"]
        assert tm_b.box == (bn, 64), (w.name, "tmB's box must be [bn, 64]: the kernel expects that many bytes")
        assert 1 <= ctas <= limits.num_sms, (w.name, ctas)
        cover, written, read, num_k, tiles = schedule(M, N, K, ctas, sk_tiles, bn)
        for t, ranges in cover.items():  # each tile's K slices exactly once
            ranges.sort()
            assert ranges[0][0] == 0 and ranges[-1][1] == num_k, (w.name, t, ranges)
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:])), (w.name, t, ranges)
        buffers = {b.name: b for b in plan.buffers}
        if lp.cluster is not None and lp.cluster[0] == 2:  # the DSMEM fix-up (kernel.cu's sch.pair): no ws, no counters
            assert lp.cluster == (2, 1, 1) and sk_tiles == tiles and ctas == 2 * tiles and num_k % 2 == 0, w.name
            for u in range(tiles):  # tile u: CTA 2u (cluster rank 0) the first half of K, CTA 2u + 1 the second
                assert sorted(cover[u]) == [(0, num_k // 2), (num_k // 2, num_k)], (w.name, u, cover[u])
                assert written[u] == {(2 * u, 0), (2 * u + 1, 0)}, (w.name, u)
            continue
        assert lp.cluster in (None, (1, 1, 1)), (w.name, lp.cluster)
        assert buffers["counters"].zero or not written, (w.name, "the fix-up's counters must start at zero")
        slots = buffers["ws"].shape[0] * buffers["ws"].shape[1] // PARTIAL_FLOATS
        red = "#define FIXUP_RED 1" in sol.source  # partials summed into one ws tile per stream-K tile
        for u, wrote in written.items():
            assert read[u] == wrote, (w.name, u)  # the fix-up reads exactly the partials written
            assert (u if red else max(c * 2 + s for c, s in wrote)) < slots, (w.name, "ws too small")
            assert u < buffers["counters"].shape[0], (w.name, "counter out of range")
        if written:  # every slot any CTA writes is distinct: no two partials share one
            all_slots = [s for wrote in written.values() for s in wrote]
            assert len(all_slots) == len(set(all_slots))
        assert tiles >= 1


def test_manifest_gives_the_kernel_its_shared_memory():
    """kernel.cu's shared-memory layout (1 KiB alignment slack, the ring of STAGES 128x256 stages, the
    epilogue's staging, a full and an empty mbarrier per stage of the deeper of its two rings, the
    fix-up flag, a work item per stage, the DSMEM fix-up's two mbarriers) fits the manifest's dynamic shared memory, and the 128-wide
    ring (STAGES128 stages of 32 KiB) fits the 256-wide one's bytes."""
    import re

    src = (ROOT / "tasks" / "gemm_n7168_k5120" / "expert" / "kernel.cu").read_text()
    knob = lambda name: int(re.search(rf"#define {name} (\d+)", src).group(1))  # noqa: E731
    stages, stages128 = knob("STAGES"), knob("STAGES128")
    ring = stages * (128 * 64 * 2 + 256 * 64 * 2)
    assert stages128 * (128 * 64 * 2 + 128 * 64 * 2) <= ring
    deepest = max(stages, stages128)
    need = 1024 + ring + 4 * 64 * 64 * 2 + 8 * 2 * deepest + 16 + 32 * deepest + 16 * knob("FIXUP_DSMEM")
    manifest = Solution.from_dir(ROOT / "tasks" / "gemm_n7168_k5120" / "expert").manifest
    for launch in manifest.launches:  # the same kernel, in clusters of 2 or not
        assert need <= launch.shared_bytes <= 232448, (need, launch.shared_bytes)


@pytest.mark.parametrize("ctas", [1, 3, 28, 132])
def test_schedule_is_exact_for_any_split(ctas):
    """Any grid and any stream-K tile count, including more CTAs than K iterations (empty CTAs)
    and K not a multiple of 64: every tile's K range once, the fix-up reads what was written."""
    for M, N, K in [(1, 128, 64), (70, 7168, 5120), (93, 128, 2048), (901, 256, 7168), (2379, 2048, 100)]:
        tiles = cdiv(M, 128) * cdiv(N, 256)
        for sk in {0, 1, tiles, tiles % ctas + ctas, tiles + 5}:
            cover, written, read, num_k, _ = schedule(M, N, K, ctas, sk)
            for t, ranges in cover.items():
                ranges.sort()
                assert ranges[0][0] == 0 and ranges[-1][1] == num_k, (M, N, K, sk, t, ranges)
                assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:])), (M, N, K, sk, t, ranges)
            assert read == written, (M, N, K, sk)


def fixup_sum(partials: list, me: int, first: int):
    """kernel.cu's stream-K fix-up with FIXUP_ORDERED run by contributor `me` of a tile whose contributors
    are first .. first + len(partials) - 1: its own partial in hand, the others read from ws."""
    last = first + len(partials) - 1
    restart = me >= first + 2
    res = partials[0] if restart else partials[me - first]
    for c in range(first + restart, last + 1):
        if c == me and not restart:
            continue
        res = res + partials[c - first]
    return res


@pytest.mark.parametrize("contributors", [2, 3, 4, 34])
def test_the_fixup_sums_in_one_order_whoever_arrives_last(contributors):
    """Whichever contributor arrives last and sums a stream-K tile, the fp32 sum has the same bits
    (float32 addition, values spread over many magnitudes so any change of order shows)."""
    import numpy as np

    rng = np.random.default_rng(contributors)
    partials = list((rng.standard_normal((contributors, 4096)) * 10.0 ** rng.integers(-3, 4, (contributors, 1)))
                    .astype(np.float32))
    first = 5
    sums = [fixup_sum(partials, me, first) for me in range(first, first + contributors)]
    for s in sums[1:]:
        assert np.array_equal(s.view(np.int32), sums[0].view(np.int32))
    in_order = partials[0]
    for p in partials[1:]:
        in_order = in_order + p
    assert np.array_equal(sums[0].view(np.int32), in_order.view(np.int32))
    if contributors >= 3:  # an arrival-order sum would differ: the test can tell
        arrival = partials[-1]
        for p in partials[:-1]:
            arrival = arrival + p
        assert not np.array_equal(arrival.view(np.int32), in_order.view(np.int32))
