"""Load layouts read from the TTGIR of real sm_90 compiles (no GPU needed): which dimension of
each loop tile the compiler made contiguous, and how many 128-byte lines the loads touch."""

from __future__ import annotations

import pytest

from kernaudit_pipeline import static_resources as sr
from kernaudit_pipeline.kernel_spec import KERNELS_DIR, load_kernel_module, specialize
from kernaudit_pipeline.static_resources.ttgir_loads import loop_loads
from tests.static.test_static_resources import FIXTURE, _cfg


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KERNAUDIT_DATA_DIR", str(root))
        mp.setenv("TRITON_CACHE_DIR", str(root / "triton_cache"))
        yield root


def _compile(module, cfg):
    spec = specialize(module.KERNEL, module.compile_args(module.SHAPES[0], cfg))
    return sr.compile_specialized(module.KERNEL, spec, 90, cfg["num_warps"], cfg["num_stages"])


def test_row_major_operands_read_k_runs_of_a_and_n_runs_of_b(data_dir):
    """The tiny matmul takes A (M, K) and B (K, N) row-major: A's tile is contiguous along K
    (BLOCK_K x 2 bytes per row), B's along N. At BLOCK_K = 32 each A row is 64 bytes, half a
    line; at BLOCK_K = 64 every run fills whole lines."""
    tiny = load_kernel_module(FIXTURE)
    narrow = _compile(tiny, _cfg(64, 64, 32, 4, 3)).loads
    runs = sorted((t.shape, t.run_bytes) for t in narrow.loads)
    assert runs == [((32, 64), 128), ((64, 32), 64)]
    assert narrow.load_bytes == (64 * 32 + 32 * 64) * 2
    assert narrow.line_bytes == 64 * 128 + 32 * 128  # A: 64 rows, one line each; B: 32 full lines
    assert {t.shape: t.advances_along_run for t in narrow.loads} == {(64, 32): True, (32, 64): False}
    # a narrow N tile of B: 64-byte runs too, but across the loop, not along it (the rest of
    # each line is the neighbouring programs' columns), so its lines count as its bytes
    slim = _compile(tiny, _cfg(64, 32, 64, 4, 3)).loads
    b = next(t for t in slim.loads if t.shape == (64, 32))
    assert b.run_bytes == 64 and not b.advances_along_run and b.line_bytes == b.bytes
    wide = _compile(tiny, _cfg(128, 256, 64, 8, 3)).loads
    assert wide.line_bytes == wide.load_bytes == (128 * 64 + 64 * 256) * 2
    assert min(t.run_bytes for t in wide.loads) == 128


def test_a_k_major_weight_is_read_in_block_k_runs(data_dir):
    """fp8_gemm's weight is (N, K) row-major, read K-major as Hopper's fp8 wgmma wants: the
    (BLOCK_K, BLOCK_N) tile is contiguous along its first dimension, BLOCK_K bytes per column.
    The same compile's numbers carry the two totals the cost model reads."""
    fp8 = load_kernel_module(KERNELS_DIR / "fp8_gemm.py")
    cfg = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}
    res = _compile(fp8, cfg)
    by_shape = {t.shape: t for t in res.loads.loads}
    assert by_shape[(64, 128)].contiguous_dim == 0 and by_shape[(64, 128)].run_bytes == 64
    assert by_shape[(128, 64)].contiguous_dim == 1 and by_shape[(128, 64)].run_bytes == 64
    assert res.numbers()["loop_line_bytes"] == 2 * res.numbers()["loop_load_bytes"]


def test_text_without_a_loop_or_layouts_says_nothing():
    assert loop_loads("") is None
    assert loop_loads("tt.func @k() {\n  tt.return\n}\n") is None
    # a loop whose load has a layout the reader does not know is left out, not guessed
    text = ("scf.for %i = %c0 to %c8 step %c1 {\n"
            "  %x = tt.load %p : tensor<64x32x!tt.ptr<bf16>, #linear>\n"
            "} loc(#loc1)\n")
    assert loop_loads(text).loads == ()


def test_a_loop_that_loads_before_it_steps_is_matched_after_reading_it():
    """Without a pipeline the loop loads from its iteration's pointer and steps it afterwards;
    the step is a constant equal to the run (K contiguous), so the load advances along it. A
    step by a runtime stride (K not contiguous) does not."""
    head = ("#blocked = #ttg.blocked<{sizePerThread = [1, 8], threadsPerWarp = [8, 4], "
            "warpsPerCTA = [4, 1], order = [1, 0]}>\n"
            "%cst = arith.constant dense<32> : tensor<64x32xi32, #blocked>\n")
    body = ("%r = scf.for %i = %c0 to %c8 step %c1 iter_args(%p = %p0) -> (tensor<64x32x!tt.ptr<bf16>, #blocked>) {\n"
            "  %x = tt.load %p : tensor<64x32x!tt.ptr<bf16>, #blocked>\n"
            "  %q = tt.addptr %p, {step} : tensor<64x32x!tt.ptr<bf16>, #blocked>, tensor<64x32xi32, #blocked>\n"
            "  scf.yield %q : tensor<64x32x!tt.ptr<bf16>, #blocked>\n"
            "} loc(#loc1)\n")
    along = loop_loads(head + body.replace("{step}", "%cst"))
    assert along.load_bytes == 64 * 32 * 2 and along.line_bytes == 64 * 128
    across = loop_loads(head + body.replace("{step}", "%runtime"))
    assert across.line_bytes == across.load_bytes
