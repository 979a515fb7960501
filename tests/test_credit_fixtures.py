"""The attack fixtures of issue 42 (tests/credit_fixtures.py) compile with the real NVRTC + ptxas for
sm_90a, their manifests plan on every workload, and their SASS holds what each attack needs, in
the kernel the attack puts it in: DMMA (FP64 tensor math), ATOMG (atomics that return data, not
RED), UBLKCP (a plain bulk copy) beside a UTMALDG, and a %globaltimer read. On the H200 each must
earn no credit (tests/gpu/test_credit_gpu.py)."""
from __future__ import annotations

import pytest

from tests import credit_fixtures as fx
from tools.compile import compile_solution
from tools.launch import NOMINAL_LIMITS, plan_launches
from tools.sass import inspect

# what each fixture's side kernel must hold (base SASS opcodes), and must not
WANT = {
    "math_on_dmma": ("gemm_dmma", {"DMMA"}, {"HGMMA", "HMMA"}),
    "reads_through_atomics": ("read_by_atomics", {"ATOMG"}, {"RED", "REDG"}),
    "bulk_copy_reads": ("read_by_bulk_copy", {"UBLKCP", "UTMALDG"}, {"LDG"}),
    "dead_bulk_copy": ("read_by_bulk_copy", {"UBLKCP", "UTMALDG"}, {"LDG"}),
    "gap_sensing": ("sense_gap", set(), set()),
    # products read from a table (LDS) and added by shared-memory integer atomics: no multiply, no FFMA
    "products_by_lookup": ("gemm_by_lookup", {"LDS", "ATOMS"}, {"FFMA", "HGMMA", "HMMA", "IMMA", "DMMA"}),
    # a counter probe, not an attack: every reduction class the credit charges
    "reduction_counts": ("reduce_probe", {"REDG", "ATOM", "ATOMG", "ATOMS", "UBLKRED"}, {"HGMMA"}),
}
EXPERT_KERNEL = "gemm_bf16_tn_sm90"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = {}
    for name, make in fx.FIXTURES.items():
        sol = make(tmp_path_factory.mktemp(name))
        comp = compile_solution(sol, "sm_90a")
        assert comp.ok, (name, comp.error, [d.message for d in comp.errors()][:5])
        insp = inspect(comp, [launch.kernel for launch in sol.manifest.launches])
        if insp.status == "skipped":
            pytest.skip(f"no SASS disassembler: {insp.reason}")
        assert insp.status == "ok", (name, insp.reason)
        out[name] = (sol, comp, insp)
    return out


@pytest.mark.parametrize("name", list(fx.FIXTURES))
def test_each_attack_is_in_its_sass(built, name):
    sol, comp, insp = built[name]
    kernel, must, must_not = WANT[name]
    ops = insp.kernels[kernel].opcodes
    assert must <= ops.keys(), (name, sorted(ops))
    assert not (must_not & ops.keys()), (name, sorted(must_not & ops.keys()))
    # the decoy / the honest half: the expert's wgmma and tensor-map loads are there and launched
    assert {"HGMMA", "UTMALDG"} <= insp.kernels[EXPERT_KERNEL].opcodes.keys()
    assert insp.features["wgmma"].present and insp.features["tma"].present, insp.features
    assert not insp.uncounted_kernels, insp.uncounted_kernels


def test_the_bulk_copy_fixture_holds_a_plain_bulk_copy_the_static_check_names(built):
    """The static feature check already tells a plain bulk copy from TMA (DESIGN.md: `bulk_copy`
    is a feature of its own): the module shows both."""
    _sol, _comp, insp = built["bulk_copy_reads"]
    assert insp.features["bulk_copy"].present, insp.features["bulk_copy"]


def test_the_bulk_copy_fixtures_are_counted_exactly(built):
    """Issue 42, item 4: where a launched kernel holds a plain bulk load, the executed check counts
    every TMA-pipe instruction of the launched kernels one by one (tools.credit.exact_count_sites):
    the expert's tensor-map loads and the side kernel's bulk copy and tensor-map load."""
    from tools import credit

    for name in ("bulk_copy_reads", "dead_bulk_copy"):
        _sol, _comp, insp = built[name]
        sites = credit.exact_count_sites(insp)
        assert sites and set(sites) == {EXPERT_KERNEL, "read_by_bulk_copy"}, (name, sites)
        assert any(op.startswith("UTMALDG") for op in sites[EXPERT_KERNEL].values())
        assert sorted(op.split(".")[0] for op in sites["read_by_bulk_copy"].values()) == ["UBLKCP", "UTMALDG"]
    for name in ("math_on_dmma", "reads_through_atomics"):  # the expert alone holds TMA: nothing lumped
        assert credit.exact_count_sites(built[name][2]) is None, name


def test_the_gap_sensing_fixture_reads_the_clock_and_keeps_state(built):
    """It is what the audit flags name (tools.features.sensing): a %globaltimer read and state that
    outlives a launch; flags are never a verdict, the credit rules must make the sensing useless."""
    from tools.features import sensing

    _sol, comp, insp = built["gap_sensing"]
    found = sensing(comp.ptx)
    assert {"reads_clock", "module_state"} <= set(found), found
    assert {"HGMMA", "UTMALDG"} <= insp.kernels[EXPERT_KERNEL].opcodes.keys()
    assert "FFMA" in insp.kernels["gemm_simple"].opcodes and "HGMMA" not in insp.kernels["gemm_simple"].opcodes


@pytest.mark.parametrize("name", list(fx.FIXTURES))
def test_each_manifest_plans_on_every_workload(built, name):
    from tasks import get_task

    sol = built[name][0]
    task = get_task(fx.TASKS.get(name, fx.TASK))
    for wl in task.workloads:
        plan = plan_launches(sol.manifest, task, task.axis_values(wl), NOMINAL_LIMITS["sm_90a"])
        assert len(plan.launches) == len(sol.manifest.launches), (name, wl)
