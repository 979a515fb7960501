"""ptxas names PTX lines, also inside its messages (C7519 "warpgroup.arrive is injected in around
line 4917"): from CUDA each is mapped to a kernel.cu line through the PTX's `.loc` line table
(NVRTC -lineinfo) and called a PTX line in the text, so the model is never pointed at a line its
kernel.cu does not have (issue 41). Real NVRTC and ptxas on the shipped example's turn-2 kernel."""
from __future__ import annotations

import re

import pytest
from agent_loop_helpers import REPO

from agent import feedback as fb
from tools.compile import compile_source, parse_ptxas_output
from tools.results import CompileResult, EvalResult, InspectResult

TURN_2 = REPO / "runs" / "examples" / "attn_bwd_human" / "candidates" / "2-0" / "kernel.cu"


def _section(c: CompileResult) -> str:
    ev = EvalResult(task="mha_bwd_d128", arch="sm_90a", compile=c, inspect=InspectResult(status="skipped", arch="sm_90a"))
    return fb.compile_section(ev, "cuda" if c.language == "cuda" else "ptx")


def kernel_cu_lines_cited(text: str) -> list[int]:
    """Every `line N` that does not say it is a PTX line."""
    return [int(m[1]) for m in re.finditer(r"(?<![Pp][Tt][Xx] )\bline (\d+)", text)]


@pytest.fixture(scope="module")
def turn_2() -> CompileResult:
    return compile_source(TURN_2.read_text(), "cuda", "sm_90a")


def test_the_shipped_example_s_feedback_cites_only_lines_its_kernel_has(turn_2):
    source = TURN_2.read_text().splitlines()
    assert turn_2.ok
    around = [d for d in turn_2.diagnostics if d.code == "C7519"]
    assert around, "the example's kernel no longer draws C7519; pick a kernel that does"
    for d in around:
        assert d.ptx_line and d.ptx_line > len(source)  # the PTX line ptxas named (1508 ... 5441)
        assert f"around PTX line {d.ptx_line}" in d.message
        # the line of the asm statement that holds the wgmma (NVRTC's .loc names the statement's last line)
        assert d.line is not None and any("wgmma.mma_async" in s for s in source[d.line - 6:d.line]), d
    text = _section(turn_2)
    cited = kernel_cu_lines_cited(text)
    assert cited and max(cited) <= len(source), (cited, text)
    assert "`PTX line N`" in text  # the header says what the other numbers are


def test_raw_ptx_keeps_ptxas_s_line_as_the_user_s_own(turn_2):
    """Written as PTX, the user's file is the PTX: the number stays and is their line."""
    raw = compile_source(turn_2.ptx, "ptx", "sm_90a")
    around = [d for d in raw.diagnostics if d.code == "C7519"]
    assert around
    for d in around:
        assert d.line == d.ptx_line and f"around line {d.line}" in d.message


def test_an_unmapped_ptx_line_is_shown_as_a_ptx_line_and_quoted():
    ptx = "\n".join(f"  mov.u32 %r{i}, {i};" for i in range(1, 11))
    diags, _ = parse_ptxas_output("ptxas info    : (C7519) warpgroup.arrive is injected in around line 7 by compiler "
                                  "to allow use of registers in GMMA in function 'k'", line_map=[None] * 10)
    (d,) = diags
    assert (d.line, d.ptx_line) == (None, 7)
    c = CompileResult(status="ok", arch="sm_90a", language="cuda", ptx=ptx, diagnostics=diags)
    text = _section(c)
    assert "lines refer to your kernel.cu" not in text and "[ptx: mov.u32 %r7, 7;]" in text
    assert kernel_cu_lines_cited(text) == [] or all(n != 7 for n in kernel_cu_lines_cited(text)), text
