"""The hot-loop reader on SASS text: loops are backward branches, the hot loop is the longest
innermost one, and what it counts (these listings follow cuobjdump's layout)."""

from __future__ import annotations

from kernaudit_pipeline.static_resources.sass_loop import hot_loop


def _sass(lines: list[str]) -> str:
    out = ["\tcode for sm_90", "\t\tFunction : k", "\t.headerflags\t@\"EF_CUDA_SM90\""]
    for i, text in enumerate(lines):
        out.append(f"        /*{16 * i:04x}*/                   {text} ;   /* 0x000fe20000000000 */")
        out.append("                                                  /* 0x000fe20000000000 */")
    return "\n".join(out)


def test_no_loop_is_a_profile_of_zeros():
    prof = hot_loop(_sass(["MOV R1, c[0x0][0x28]", "FADD R2, R3, R4", "EXIT", "BRA 0x30"]))
    # "BRA 0x30" at 0x30 jumps to itself: the trailing self-loop every kernel ends with is
    # still a backward-or-equal branch, so it must not count as a hot loop
    assert prof is not None and prof.total_instructions == 4
    assert prof.instructions == 0 and prof.loops == 0


def test_innermost_longest_loop_is_profiled():
    lines = ["MOV R1, c[0x0][0x28]",          # 0x00
             "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24",  # 0x10  outer loop start
             "LDL R2, [R1]",                  # 0x20  inner loop start
             "FFMA R3, R2, R2, R3",           # 0x30
             "STL [R1], R3",                  # 0x40
             "@P0 BRA 0x20",                  # 0x50  inner back edge (4 instructions)
             "SHFL.BFLY PT, R5, R3, 0x1, 0x1f",  # 0x60
             "@!P1 BRA 0x10",                 # 0x70  outer back edge
             "EXIT"]
    prof = hot_loop(_sass(lines))
    assert (prof.loops, prof.instructions, prof.local_ops, prof.mma_ops) == (2, 4, 2, 0)


def test_mma_ops_are_counted_in_the_loop():
    lines = ["MOV R1, c[0x0][0x28]", "LDSM.16.M88.4 R4, [R2]", "HMMA.16816.F32.BF16 R8, R4, R6, R8",
             "HMMA.16816.F32.BF16 R12, R4, R7, R12", "@P0 BRA 0x10", "EXIT"]
    prof = hot_loop(_sass(lines))
    assert (prof.instructions, prof.mma_ops, prof.local_ops) == (4, 2, 0)


def test_text_without_instructions_has_no_profile():
    assert hot_loop("cuobjdump info    : File 'k.cubin' does not contain device code") is None
    assert hot_loop("") is None
