"""The compile-time resource audit on real sm_90 compiles (no GPU needed).

Reference figures (ANCHORS.md, tutorial-style matmul, 128x256x64, 3 stages): 4 warps give 255
registers and spills, 8 warps give ~220 registers, no spills and 147,456 bytes of shared memory.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from kernaudit_pipeline import static_resources as sr
from kernaudit_pipeline.cli import main
from kernaudit_pipeline.kernel_spec import KERNELS_DIR, Ptr, Specialization, config_id, load_kernel_module, specialize
from kernaudit_pipeline.static_resources import CompileStatus
from kernaudit_pipeline.static_resources import audit as sweep_mod

FIXTURE = Path(__file__).parent / "fixtures" / "tiny_matmul.py"
GEMM = KERNELS_DIR / "gemm.py"


def _cfg(bm: int, bn: int, bk: int, warps: int, stages: int) -> dict:
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8,
            "num_warps": warps, "num_stages": stages}


SMALL = _cfg(64, 64, 32, 4, 3)
SPILL = _cfg(128, 256, 64, 4, 3)
CLEAN = _cfg(128, 256, 64, 8, 3)
SMEM_OVER = _cfg(128, 256, 128, 8, 3)  # 3 x (128+256) x 128 x 2 B = 288 KiB > 227 KiB


def _tile_bytes(cfg: dict, elem_bytes: int = 2) -> int:
    return (cfg["BLOCK_M"] + cfg["BLOCK_N"]) * cfg["BLOCK_K"] * elem_bytes


def _numbers(r: sr.StaticResult) -> dict:
    d = asdict(r)
    d.pop("cached")
    return d


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KERNAUDIT_DATA_DIR", str(root))
        mp.setenv("TRITON_CACHE_DIR", str(root / "triton_cache"))  # in-process compiles
        yield root


@pytest.fixture(scope="module")
def tiny(data_dir):
    return load_kernel_module(FIXTURE)


@pytest.fixture(scope="module")
def tiny_results(tiny) -> dict[str, sr.StaticResult]:
    results = sr.audit_kernel(tiny, max_workers=2, progress=False)
    return {r.config_id: r for r in results}


# ------------------------------------------------------------------------------------------
# Real compiles
# ------------------------------------------------------------------------------------------
def test_known_spilling_config_spills_and_clean_ones_do_not(tiny_results):
    spill = tiny_results[config_id(SPILL)]
    clean = tiny_results[config_id(CLEAN)]
    small = tiny_results[config_id(SMALL)]
    for r in (spill, clean, small):
        assert r.status is CompileStatus.OK, r.message
        assert r.arch == "sm_90" and r.triton_version and len(r.kernel_source_hash) == 64
        assert r.shared_mem_bytes == r.shared_mem_static_bytes + r.shared_mem_dynamic_bytes
    assert spill.registers_per_thread == 255
    assert spill.spill_stores_bytes > 0 and spill.spill_loads_bytes > 0 and spill.stack_frame_bytes > 0
    assert spill.spills and spill.threads_per_block == 128
    assert not clean.spills and clean.stack_frame_bytes == 0
    assert 180 <= clean.registers_per_thread < 255  # ANCHORS: 220 with triton 3.6
    assert clean.shared_mem_dynamic_bytes == 147_456 == 3 * _tile_bytes(CLEAN)
    assert clean.threads_per_block == 256
    assert not small.spills and small.registers_per_thread < 128
    assert small.shared_mem_dynamic_bytes == 3 * _tile_bytes(SMALL)


def test_ptxas_log_agrees_with_the_cubin(tiny):
    """Triton's own ptxas log, a ptxas re-run on the cached PTX, and the cubin's resource usage
    must tell the same story (on a spilling config, where there is a story to tell)."""
    spec = specialize(tiny.KERNEL, tiny.compile_args(tiny.SHAPES[0], SPILL))
    fresh = sr.compile_specialized(tiny.KERNEL, spec, 90, 4, 3, force=True)
    cached = sr.compile_specialized(tiny.KERNEL, spec, 90, 4, 3)
    assert (fresh.ptxas_log_source, cached.ptxas_log_source) == ("triton", "rerun")
    for res in (fresh, cached):
        assert res.ptxas.registers == res.cubin.registers == 255
        assert res.ptxas.stack_frame_bytes == res.cubin.stack_bytes > 0
        assert res.ptxas.spill_stores_bytes > 0
    assert fresh.ptxas == cached.ptxas and fresh.cubin == cached.cubin
    assert fresh.shared_mem_dynamic_bytes == cached.shared_mem_dynamic_bytes == 3 * _tile_bytes(SPILL)


def test_specialization_matters(tiny, tiny_results):
    """A bare signature (no divisibility, strides not constexpr 1) compiles a different kernel:
    no cp.async pipeline, so a single stage of shared memory. Ours must be the pipelined one."""
    args = tiny.compile_args(tiny.SHAPES[0], SMALL)
    ours = specialize(tiny.KERNEL, args)
    assert ours.constexprs["stride_ak"] == 1 and ours.attrs  # what the JIT would mark
    bare_sig, bare_const = {}, {}
    for p in tiny.KERNEL.params:
        value = args[p.name]
        if p.is_constexpr:
            bare_sig[p.name], bare_const[p.name] = "constexpr", value
        else:
            bare_sig[p.name] = f"*{value.dtype}" if isinstance(value, Ptr) else "i32"
    bare = sr.compile_specialized(tiny.KERNEL, Specialization(bare_sig, bare_const, {}), 90, 4, 3)
    audited = tiny_results[config_id(SMALL)]
    assert bare.shared_mem_dynamic_bytes == _tile_bytes(SMALL)
    assert audited.shared_mem_dynamic_bytes == SMALL["num_stages"] * _tile_bytes(SMALL)
    assert bare.cubin.registers != audited.registers_per_thread


def test_cache_hit_does_not_compile(tiny, tiny_results, data_dir, monkeypatch):
    before = sorted((data_dir / "static_cache").glob("*.json"))
    assert len(before) == len(tiny.CONFIGS)

    def no_compiles(*args, **kwargs):
        raise AssertionError("a cache hit must not start a compile")

    monkeypatch.setattr(sweep_mod, "_compile", no_compiles)
    again = sr.audit_kernel(tiny, max_workers=2, progress=False)
    assert all(r.cached for r in again)
    assert not any(r.cached for r in tiny_results.values())
    assert {r.config_id: _numbers(r) for r in again} == {k: _numbers(r) for k, r in tiny_results.items()}
    assert sorted((data_dir / "static_cache").glob("*.json")) == before


def test_all_shapes_compiles_each_distinct_specialization(tiny, tiny_results, data_dir):
    rows = sr.audit_kernel(tiny, configs=[config_id(SMALL)], all_shapes=True, progress=False)
    by_shape = {r.shape_name: r for r in rows}
    assert list(by_shape) == ["sq1024", "odd_m", "sq2048"]
    # sq2048 specializes like sq1024 (already cached); M=1000 loses tt.divisibility on M.
    assert by_shape["sq1024"].cached and by_shape["sq2048"].cached
    assert not by_shape["odd_m"].cached and by_shape["odd_m"].status is CompileStatus.OK
    assert len(list((data_dir / "static_cache").glob("*.json"))) == len(tiny.CONFIGS) + 1


def test_compile_error_is_recorded_and_the_sweep_goes_on(tiny, tiny_results):
    bad = _cfg(64, 64, 8, 4, 3)  # tl.dot needs K >= 16
    rows = sr.audit_kernel(tiny, configs=[bad, SMALL], max_workers=1, progress=False)
    assert [r.status for r in rows] == [CompileStatus.COMPILE_ERROR, CompileStatus.OK]
    assert "K >= 16" in rows[0].message and "\n" not in rows[0].message
    assert rows[0].registers_per_thread is None and rows[1].cached


def test_compile_timeout_is_recorded_and_not_cached(tiny, tmp_path, monkeypatch):
    """A compile past its deadline is COMPILE_TIMEOUT and never cached. (The pool's start-up
    deadline follows --timeout-s too, so the compile deadline alone is shortened here: the
    workers start and describe the module, then no compile can finish in 10 ms.)"""
    monkeypatch.setenv("KERNAUDIT_DATA_DIR", str(tmp_path))  # cold caches: a real compile
    real = sweep_mod._compile
    monkeypatch.setattr(sweep_mod, "_compile",
                        lambda tasks, pool, cache, timeout_s, arch, progress:
                        real(tasks, pool, cache, 0.01, arch, progress))
    rows = sr.audit_kernel(tiny, configs=[SMALL, CLEAN, SPILL], max_workers=2, progress=False)
    assert [r.config_id for r in rows] == [config_id(c) for c in (SMALL, CLEAN, SPILL)]
    assert all(r.status is CompileStatus.COMPILE_TIMEOUT for r in rows)
    assert all("timeout" in r.message and r.registers_per_thread is None for r in rows)
    assert not list((tmp_path / "static_cache").glob("*.json"))


def test_a_dying_worker_is_recorded_not_fatal(data_dir):
    """A module whose import kills the worker (os._exit) is a one-line failure for that module,
    never a hang or a crash of the sweep; the other modules are still audited."""
    report = sr.sweep_report([sr.PlanItem(FIXTURE.with_name("crashing_matmul.py")),
                              sr.PlanItem(FIXTURE, configs=[config_id(SMALL)])],
                             max_workers=1, progress=False)
    assert [f.module for f in report.failures] == ["crashing_matmul.py"]
    assert "exit code 3" in report.failures[0].reason
    assert [r.config_id for r in report.results] == [config_id(SMALL)]
    with pytest.raises(sr.KernelLoadError, match="crashing_matmul.py"):
        sr.audit_kernel(FIXTURE.with_name("crashing_matmul.py"), max_workers=1, progress=False)


def test_hangs_at_import_or_in_compile_args_end_at_the_timeout(data_dir):
    """The parent never imports a kernel module: one that hangs at import or in compile_args
    costs --timeout-s and becomes a failure, and the other modules are still audited."""
    report = sr.sweep_report([sr.PlanItem(FIXTURE.with_name("hanging_import.py")),
                              sr.PlanItem(FIXTURE.with_name("hanging_compile_args.py")),
                              sr.PlanItem(FIXTURE, configs=[config_id(SMALL)])],
                             timeout_s=20, max_workers=3, progress=False)
    assert sorted(f.module for f in report.failures) == ["hanging_compile_args.py", "hanging_import.py"]
    assert all("did not finish within 20 s" in f.reason for f in report.failures)
    assert [r.status for r in report.results] == [CompileStatus.OK]
    assert "kernaudit_kernels.hanging_import" not in sys.modules


def test_cli_names_a_hanging_module_in_one_line(data_dir, capsys):
    rc = main(["static", str(FIXTURE.with_name("hanging_compile_args.py")), "--timeout-s", "15"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err[0].startswith("kernaudit static: hanging_compile_args.py: import or compile_args "
                             "did not finish within 15 s")


def test_to_frame_rows_validate_as_kernel_runs(tiny_results):
    from kernaudit_pipeline.kernel_runs import normalize

    frame = sr.to_frame(list(tiny_results.values()))
    frame = frame.assign(source_format="static", source_file="static_cache",
                         source_row=range(len(frame)))
    out = normalize(frame.to_dict("records"))
    assert len(out.quarantine) == 0
    runs = out.kernel_runs
    assert list(runs["block_m"]) == [c["BLOCK_M"] for c in (SMALL, SPILL, CLEAN)]
    assert list(runs["registers_per_thread"]) == [r.registers_per_thread for r in tiny_results.values()]
    assert list(runs["spill_stores_bytes"]) == [r.spill_stores_bytes for r in tiny_results.values()]
    assert set(runs["compute_capability"]) == {"9.0"}


# ------------------------------------------------------------------------------------------
# The real bf16 GEMM in kernels/
# ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gemm_results(data_dir) -> dict[str, sr.StaticResult]:
    rows = sr.audit_kernel("gemm_bf16", configs=[config_id(c) for c in (CLEAN, SPILL, SMEM_OVER)],
                           max_workers=2, progress=False)
    return {r.config_id: r for r in rows}


def test_gemm_spills_fits_and_overflows(gemm_results):
    gemm = load_kernel_module(GEMM)
    clean, spill, over = (gemm_results[config_id(c)] for c in (CLEAN, SPILL, SMEM_OVER))
    assert all(r.kernel_name == gemm.NAME and r.shape_name == gemm.SHAPES[0].name
               for r in gemm_results.values())
    assert clean.status is CompileStatus.OK and not clean.spills
    assert clean.shared_mem_dynamic_bytes == 147_456
    assert spill.status is CompileStatus.OK and spill.spills and spill.registers_per_thread == 255
    assert over.status is CompileStatus.OUT_OF_RESOURCES
    assert over.shared_mem_bytes > over.shared_mem_limit_bytes == 232_448
    assert "232448" in over.message


def test_cli_json(gemm_results, capsys):
    rc = main(["static", "gemm_bf16", "--json", "--configs", config_id(CLEAN)])
    out = capsys.readouterr().out
    assert rc == 0
    rows = json.loads(out)
    assert len(rows) == 1 and rows[0]["config_id"] == config_id(CLEAN)
    assert rows[0]["status"] == "OK" and rows[0]["cached"] is True
    assert rows[0]["shared_mem_dynamic_bytes"] == 147_456
    assert rows[0]["registers_per_thread"] == gemm_results[config_id(CLEAN)].registers_per_thread


def test_cli_table(gemm_results, capsys):
    rc = main(["static", "gemm", "--configs", f"{config_id(SPILL)},{config_id(SMEM_OVER)}"])
    out = capsys.readouterr().out.splitlines()
    assert rc == 0
    assert out[0].split()[:4] == ["kernel", "config_id", "status", "regs"]
    assert "OUT_OF_RESOURCES" in out[2]
    assert out[-1].startswith("2 rows for sm_90: 1 ok, 1 spilling, 1 out of resources")


@pytest.mark.parametrize("argv, needle", [
    (["no_such_kernel"], "unknown kernel 'no_such_kernel'"),
    (["gemm_bf16", "--configs", "BK1_nope"], "unknown config id"),
    (["--arch", "sm_61"], "invalid choice"),  # sm_70 is known since core.hardware lists V100
    (["gemm_bf16", "--timeout-s", "0"], "must be positive"),
])
def test_cli_bad_input_is_one_line_exit_2(argv, needle, capsys):
    assert main(["static", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0]


def test_a_module_that_breaks_the_contract_is_refused(data_dir, tmp_path):
    bad = tmp_path / "no_kernel.py"
    bad.write_text("NAME = 'x'\nCONFIGS = []\nSHAPES = []\n")
    report = sr.sweep_report([sr.PlanItem(bad)], max_workers=1, progress=False)
    assert not report.results
    assert report.failures[0].reason.endswith("breaks the kernel contract: no KERNEL, compile_args")


@pytest.mark.parametrize("dims, shown", [
    ('{"M": 0, "N": 64, "K": 64}', "M=0"), ('{"M": -5, "N": 64, "K": 64}', "M=-5"),
    ('{"M": 64.0, "N": 64, "K": 64}', "M=64.0"), ('{"M": True, "N": 64, "K": 64}', "M=True"),
    ('{"M": "64", "N": 64, "K": 64}', "M='64'"), ('{"M": 2**41, "N": 64, "K": 64}', f"M={2**41}"),
    ("{}", "has no dims"),
])
def test_a_shape_with_a_dimension_no_gpu_runs_breaks_the_contract(data_dir, tmp_path, dims, shown):
    """M=0 or a negative M was ranked (at 2e12 us, labelled predicted); each is now refused in
    one line naming the shape and dimension."""
    source = FIXTURE.read_text().replace('{"M": 1024, "N": 1024, "K": 1024}', dims, 1)
    assert source != FIXTURE.read_text()
    bad = tmp_path / "bad_shape.py"
    bad.write_text(source)
    report = sr.sweep_report([sr.PlanItem(bad)], max_workers=1, progress=False)
    assert not report.results and len(report.failures) == 1
    reason = report.failures[0].reason
    assert "breaks the kernel contract: shape 'sq1024'" in reason and shown in reason


def test_hot_loop_is_read_from_the_cubin(tiny, tiny_results):
    """The K loop of the tiny matmul, from the SASS of the cubin the audit built: wgmma tiles
    issue HGMMAs in it, the loop carries more than the MMAs (address arithmetic, barriers, async
    copies), and the result rows and cache entries carry the same figures."""
    spec = specialize(tiny.KERNEL, tiny.compile_args(tiny.SHAPES[0], CLEAN))
    res = sr.compile_specialized(tiny.KERNEL, spec, 90, 8, 3)
    assert res.loop is not None and res.loop.loops >= 1
    assert 0 < res.loop.mma_ops < res.loop.instructions < res.loop.total_instructions
    row = tiny_results[config_id(CLEAN)]
    assert (row.loop_instructions, row.loop_mma_ops, row.loop_local_ops) == (
        res.loop.instructions, res.loop.mma_ops, res.loop.local_ops)
    # A deeper K tile does twice the MMA work per iteration, in twice the HGMMAs.
    deeper = dict(CLEAN, BLOCK_K=128, num_stages=2)
    res2 = sr.compile_specialized(tiny.KERNEL, specialize(tiny.KERNEL, tiny.compile_args(tiny.SHAPES[0], deeper)), 90, 8, 2)
    assert res2.loop.mma_ops == 2 * res.loop.mma_ops


def test_spilling_config_reloads_spilled_registers_somewhere(tiny_results):
    """128x256 on 4 warps spills (255 registers): its local-memory traffic is in the SASS; the
    clean 8-warp tile has none in its loop."""
    assert tiny_results[config_id(CLEAN)].loop_local_ops == 0
    assert tiny_results[config_id(SPILL)].loop_instructions > 0


@pytest.mark.parametrize("old, new, shown", [
    ('Shape("odd_m"', 'Shape("sq1024"', "shape 'sq1024' is declared twice"),
    ("    _cfg(128, 256, 64, 4, 3),   # ANCHORS: 255 registers and spills",
     "    _cfg(64, 64, 32, 4, 3),", "config BK32_BM64_BN64_GM8_s3_w4 is declared twice"),
    ("_cfg(64, 64, 32, 4, 3),     # clean, 24 KiB on sm_90", "_cfg(64, 64, 32, 3, 3),", "num_warps=3 is not one of"),
    ("_cfg(64, 64, 32, 4, 3),     # clean, 24 KiB on sm_90", "_cfg(64, 64, 32, 4, -1),", "num_stages=-1 is not a whole number >= 0"),
    ('NAME = "tiny_matmul_fp16"', "NAME = 7", "NAME must be a non-empty string, not 7"),
])
def test_declarations_every_consumer_keys_rows_by_are_checked(data_dir, tmp_path, old, new, shown):
    """The same check the GPU runner makes (``kernel_spec.check_declarations``): two shapes or
    configs of one id would give rows no one can tell apart, and a launch value Triton cannot
    take is refused for the module in one line, not per compile."""
    source = FIXTURE.read_text()
    assert source.count(old) == 1
    bad = tmp_path / "bad_decl.py"
    bad.write_text(source.replace(old, new))
    report = sr.sweep_report([sr.PlanItem(bad)], max_workers=1, progress=False)
    assert not report.results and len(report.failures) == 1
    assert "breaks the kernel contract" in report.failures[0].reason and shown in report.failures[0].reason


def test_num_stages_zero_is_a_config_triton_compiles(data_dir, tmp_path):
    """num_stages=0 (no software pipelining) compiles for sm_90, so the check lets it through."""
    source = FIXTURE.read_text().replace("_cfg(64, 64, 32, 4, 3),     # clean, 24 KiB on sm_90", "_cfg(64, 64, 32, 4, 0),", 1)
    mod = tmp_path / "stages0.py"
    mod.write_text(source)
    report = sr.sweep_report([sr.PlanItem(mod, configs=["BK32_BM64_BN64_GM8_s0_w4"])], max_workers=1, progress=False)
    assert not report.failures
    assert [r.status for r in report.results] == ["OK"] and report.results[0].registers_per_thread > 0
