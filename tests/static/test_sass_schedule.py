"""The loop-body scheduler: cycles per iteration from the SASS's own dependencies, issue slots,
the conversion pipe and barriers (listings follow cuobjdump's layout, as in test_sass_loop)."""

from __future__ import annotations

from kernaudit_pipeline.static_resources import sass_schedule as ss
from kernaudit_pipeline.static_resources.sass_loop import hot_loop


def _body(lines: list[str]) -> list[ss.Instruction]:
    pairs = []
    for text in lines:
        guard = ""
        if text.startswith("@"):
            guard, _, text = text.partition(" ")
        op, _, args = text.partition(" ")
        pairs.append((f"{guard} {op}" if guard else op, args))
    return ss.parse_body(pairs)


INDEPENDENT = [f"IADD3 R{10 + i}, R{10 + i}, 0x1, RZ" for i in range(12)]
CHAIN = [f"IADD3 R{11 + i}, R{10 + i}, 0x1, RZ" for i in range(12)]


def test_independent_work_issues_back_to_back_and_warps_share_the_slots():
    assert ss.iteration_cycles(_body(INDEPENDENT), 1) == 12
    assert ss.iteration_cycles(_body(INDEPENDENT), 2) == 24


def test_a_dependent_chain_waits_its_latency_and_a_second_warp_fills_the_gaps():
    one = ss.iteration_cycles(_body(CHAIN), 1)
    assert one == 11 * ss.ALU_CYCLES + 1
    # Two warps run the same chain interleaved: barely longer than one, far below 2x.
    assert one < ss.iteration_cycles(_body(CHAIN), 2) <= one + 2


def test_a_global_load_in_the_chain_costs_its_latency_and_one_off_the_chain_does_not():
    on_chain = _body(["LDG.E.U16 R47, desc[UR44][R46.64]", "HMUL2.BF16 R48, R47, R49", "STS [R50], R48"])
    off_chain = _body(["LDG.E.U16 R47, desc[UR44][R46.64]", "HMUL2.BF16 R48, R51, R49", "STS [R50], R48"])
    assert ss.iteration_cycles(on_chain, 1) > ss.GLOBAL_LOAD_CYCLES
    assert ss.iteration_cycles(off_chain, 1) < 10


def test_conversions_share_the_quarter_rate_pipe():
    converts = _body([f"I2F.BF16 R{20 + i}, R{10 + i}" for i in range(4)])
    assert ss.iteration_cycles(converts, 1) == 3 * ss.CONVERT_PIPE_CYCLES + 1
    # Twice the warps, twice the pipe time: the pipe, not the issue slots, is the limit.
    assert ss.iteration_cycles(converts, 2) == 7 * ss.CONVERT_PIPE_CYCLES + 1


def test_a_barrier_holds_every_warp_until_the_last_arrives():
    before = _body([*CHAIN[:6], "BAR.SYNC.DEFER_BLOCKING 0x0", "IADD3 R40, R41, 0x1, RZ"])
    t = ss.iteration_cycles(before, 2)
    assert t >= 5 * ss.ALU_CYCLES + ss.BARRIER_CYCLES


def test_registers_predicates_and_pairs_are_read_and_written_as_the_sass_names_them():
    ins = _body(["IADD3 R36, P0, R23, UR8, RZ"])[0]
    assert ss._reads_writes(ins) == (["R23", "UR8"], ["R36", "P0"])
    ld = _body(["@!P1 LDS.128 R4, [R2.64+0x10]"])[0]
    assert ss._reads_writes(ld) == (["P1", "R2", "R3"], ["R4", "R5", "R6", "R7"])
    store = _body(["STS.64 [R50+0x10], R48"])[0]
    assert ss._reads_writes(store)[1] == []
    mma = _body(["HGMMA.64x32x16.F32.BF16 R24, gdesc[UR8], R24, gsb0"])[0]
    assert len(ss._reads_writes(mma)[1]) == 16  # 64 x 32 fp32 over 128 threads
    # A carry-in predicate is read, not written.
    assert ss._reads_writes(_body(["IADD3.X R13, R13, UR9, RZ, P2, !PT"])[0])[1] == ["R13"]


def test_the_hot_loop_carries_its_schedule_for_the_block_size():
    lines = ["MOV R1, c[0x0][0x28]", *CHAIN, "@P0 BRA 0x10", "EXIT"]
    out = ["\tcode for sm_90", "\t\tFunction : k"]
    for i, text in enumerate(lines):
        out.append(f"        /*{16 * i:04x}*/                   {text} ;   /* 0x000fe20000000000 */")
    sass = "\n".join(out)
    four, eight = hot_loop(sass, 4), hot_loop(sass, 8)
    assert four.cycles == ss.iteration_cycles(_body([*CHAIN, "@P0 BRA 0x10"]), 1)
    assert eight.cycles > four.cycles  # two warps per scheduler
    assert four.numbers()["loop_cycles"] == four.cycles
