"""core.toolchain: the one ptxas/cuobjdump lookup and parser, on logs captured from Triton 3.7.1's
ptxas and cuobjdump, and on the real tools bundled with Triton."""

from __future__ import annotations

import pytest

from kernaudit_pipeline.core import toolchain
from kernaudit_pipeline.core.toolchain import Tool, ToolError

PTXAS_LOG = """\
ptxas info    : (C7511) Potential Performance Loss: wgmma.mma_async instructions are serialized
ptxas info    : 0 bytes gmem
ptxas info    : Function properties for helper_fn
    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Compiling entry function 'gemm_kernel' for 'sm_90a'
ptxas info    : Function properties for gemm_kernel
    792 bytes stack frame, 1992 bytes spill stores, 1480 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 792 bytes cumulative stack size
ptxas info    : Compile time = 462.601 ms
ptxas info    : Compiling entry function 'other' for 'sm_80'
ptxas info    : Function properties for other
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, 16384+0 bytes smem, 416 bytes cmem[0]
ptxas info    : Used 99 registers
ptxas info    : Compiling entry function '' for 'sm_90a'
"""

RES_USAGE = """
Resource usage:
 Common:
  GLOBAL:0
 Function gemm_kernel:
  REG:255 STACK:792 SHARED:1024 LOCAL:0 CONSTANT[0]:592 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function broken:
  REG:12 SHARED:0
"""


def test_ptxas_log_keeps_entries_and_device_functions_apart():
    usage = toolchain.parse_ptxas_log(PTXAS_LOG)
    assert [u.function for u in usage] == ["gemm_kernel", "other", "", "helper_fn"]
    k, other, unnamed, helper = usage
    assert (k.registers, k.stack_frame_bytes, k.spill_stores_bytes, k.spill_loads_bytes) == (255, 792, 1992, 1480)
    assert k.is_entry and k.target == "sm_90a" and k.line == 4 and k.smem_bytes is None
    # the first "Used" line after an entry is its own; "16384+0" is static + reserved
    assert other.registers == 40 and other.smem_bytes == 16384 and other.target == "sm_80"
    # an entry with an empty name is still an entry (a row to quarantine, never a lost one)
    assert unnamed.is_entry and unnamed.registers is None
    assert not helper.is_entry and helper.spill_stores_bytes == 8 and helper.registers is None
    assert toolchain.ptxas_usage(PTXAS_LOG, "gemm_kernel") == k
    assert toolchain.ptxas_usage(PTXAS_LOG, "helper_fn") is None


def test_res_usage_skips_incomplete_lines():
    usage = toolchain.parse_res_usage(RES_USAGE)
    assert list(usage) == ["gemm_kernel"]
    u = usage["gemm_kernel"]
    assert (u.registers, u.stack_bytes, u.shared_bytes, u.local_bytes) == (255, 792, 1024, 0)


def test_tools_are_found_where_triton_keeps_them():
    import triton

    for tool in Tool:
        path = toolchain.find_tool(tool)
        assert path is not None and path.exists(), tool
        assert str(path) == getattr(triton.knobs.nvidia, tool.value).path


def test_run_ptxas_reads_back_its_own_log():
    ptx = """
.version 8.0
.target sm_90a
.address_size 64
.visible .entry tiny_entry(.param .u64 p)
{
    .reg .b64 %rd<2>;
    .reg .b32 %r<2>;
    ld.param.u64 %rd1, [p];
    mov.u32 %r1, 7;
    st.global.u32 [%rd1], %r1;
    ret;
}
"""
    log = toolchain.run_ptxas(ptx, "sm_90a")
    usage = toolchain.ptxas_usage(log, "tiny_entry")
    assert usage is not None and usage.registers is not None and usage.spill_stores_bytes == 0
    with pytest.raises(ToolError, match="ptxas failed"):
        toolchain.run_ptxas("this is not ptx", "sm_90a")


def test_cuobjdump_on_garbage_is_a_tool_error():
    with pytest.raises(ToolError, match="cuobjdump failed"):
        toolchain.cubin_res_usage(b"not a cubin")


def test_ingest_reads_ptxas_logs_through_the_same_parser(tmp_path):
    from kernaudit_pipeline.ingest import ptxas_log

    path = tmp_path / "k.log"
    path.write_text(PTXAS_LOG)
    parsed = ptxas_log.parse(path, "k.log")
    assert parsed.records_in == 3
    assert [r["registers_per_thread"] for r in parsed.rows] == [255, 40]
    assert parsed.rows[1]["shared_mem_static_bytes"] == 16384
    assert len(parsed.quarantine) == 1
