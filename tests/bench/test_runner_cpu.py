"""The runner's CPU-side pieces: JSONL rows built from real kernel modules validate against
``kernel_runs``, failures become rows, and the CLI refuses cleanly without a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from kernaudit_pipeline.bench import runner, stats
from kernaudit_pipeline.kernel_runs import COLUMNS, normalize
from kernaudit_pipeline.kernel_spec import kernel_files, load_kernel_module

REPO = Path(__file__).resolve().parents[2]

# The columns the issue asks the runner to write.
REQUIRED = (
    "kernel_name config_id block_m block_n block_k group_m num_warps num_stages shape_name "
    "phase m n k batch num_heads num_kv_heads seq_len head_dim causal dtype "
    "registers_per_thread spill_stores_bytes spill_loads_bytes shared_mem_bytes "
    "threads_per_block grid_size latency_us latency_p10_us latency_p90_us latency_ci_low_us "
    "latency_ci_high_us latency_samples baseline_name baseline_us baseline_ci_low_us "
    "baseline_ci_high_us correct max_rel_error run_status run_message flops bytes_moved "
    "device_name compute_capability sm_clock_mhz triton_version torch_version "
    "kernel_source_hash"
).split()

DEVICE = runner.DeviceInfo(device_name="NVIDIA H200", compute_capability="9.0", sm_count=132,
                           max_shared_mem_bytes=232448, driver_version="580.159.04",
                           cuda_version="13.0", torch_version="2.11.0+cu130",
                           triton_version="3.6.0")


def _timing(center_us: float, seed: int) -> runner.Timing:
    samples = list(np.random.default_rng(seed).normal(center_us, center_us * 0.01, size=25))
    return runner.Timing(summary=stats.summarize(samples), samples_us=samples,
                         stop_reason=stats.StopReason.RSD_REACHED.value, timing_s=0.05,
                         sm_clock_mhz=1980.0, sm_clock_min_mhz=1965.0, sm_clock_max_mhz=1980.0)


def _rows_for(path: Path) -> list[dict]:
    """Every kind of row the runner writes, for one real kernel module."""
    mod = load_kernel_module(path)
    kinfo = runner.KernelInfo.of(mod)
    shape = mod.SHAPES[0]
    cfg = mod.CONFIGS[0]
    grid = tuple(mod.grid(shape, cfg))
    common = dict(flops=float(mod.flops(shape)), bytes_moved=float(mod.bytes_moved(shape)),
                  attempt=0)
    static = runner.StaticInfo(registers_per_thread=168, n_spills=0, shared_mem_bytes=98304,
                               threads_per_block=cfg["num_warps"] * 32, compile_s=1.5)
    spilling = runner.StaticInfo(registers_per_thread=255, n_spills=202, shared_mem_bytes=147456,
                                 threads_per_block=128, compile_s=3.0)
    check = runner.CheckResult(correct=True, max_rel_error=2.3e-3, max_abs_error=0.01,
                               nonfinite_outputs=0, elementwise_violations=0, check_seed=5,
                               check_s=0.2)
    wrong = runner.CheckResult(correct=False, max_rel_error=None, max_abs_error=None,
                               nonfinite_outputs=1024, elementwise_violations=None,
                               check_seed=6, check_s=0.2)
    base = runner.build_record(runner.RecordType.BASELINE, kinfo, shape, DEVICE,
                               status=runner.RunStatus.OK, check=check, timing=_timing(300.0, 1),
                               **common)
    records = [
        base,
        runner.build_record(runner.RecordType.RUN, kinfo, shape, DEVICE, config=cfg,
                            status=runner.RunStatus.OK, static=static, grid=grid, check=check,
                            timing=_timing(310.0, 2), launch_matches_compile=True, **common),
        runner.build_record(runner.RecordType.RUN, kinfo, shape, DEVICE, config=cfg,
                            status=runner.RunStatus.PRUNED_SPILL, static=spilling, grid=grid,
                            message="pruned: 808 spill bytes > threshold 0", **common),
        runner.build_record(runner.RecordType.RUN, kinfo, shape, DEVICE, config=cfg,
                            status=runner.RunStatus.FAILED_CORRECTNESS, static=static,
                            grid=grid, check=wrong, message="not timed", **common),
        runner.build_record(runner.RecordType.RUN, kinfo, shape, DEVICE, config=cfg,
                            status=runner.RunStatus.TIMEOUT, grid=grid,
                            message="step ran over 180 s", **common),
    ]
    lines = [runner.to_json_line(r) for r in records]
    rows = [json.loads(line) for line in lines]
    rows[1] = runner.with_baseline(rows[1], rows[0])
    return rows


KERNEL_FILES = kernel_files()


@pytest.mark.parametrize("path", KERNEL_FILES, ids=[p.stem for p in KERNEL_FILES])
def test_rows_normalize_with_nothing_quarantined(path):
    rows = _rows_for(path)
    for i, row in enumerate(rows):
        row.update(source_format="runner_jsonl", source_file="bench.jsonl", source_row=i)
    result = normalize(rows)
    assert len(result.quarantine) == 0, result.quarantine["reason"].tolist()
    assert len(result.kernel_runs) == len(rows)
    ok = result.kernel_runs.iloc[1]
    assert ok["run_status"] == "OK" and ok["baseline_us"] == pytest.approx(rows[0]["latency_us"])
    assert ok["latency_ci_low_us"] <= ok["latency_us"] <= ok["latency_ci_high_us"]
    pruned = result.kernel_runs.iloc[2]
    assert pruned["spill_stores_bytes"] == 808 and pd_isna(pruned["latency_us"])


def pd_isna(value) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value)) or str(value) in ("<NA>", "nan")


def test_rows_carry_every_required_column_and_valid_json():
    rows = _rows_for(KERNEL_FILES[0])
    names = {f.name for f in fields(runner.RunRecord)}
    missing = [c for c in REQUIRED if c not in names]
    assert not missing
    assert set(REQUIRED) <= set(COLUMNS)  # the names are kernel_runs' own
    ok = rows[1]
    assert ok["record_type"] == "run" and ok["latency_samples"] == 25
    assert len(ok["samples_us"]) == 25
    assert ok["spill_bytes_source"] and ok["config"]["num_warps"] == ok["num_warps"]
    # NaN/inf never reach the JSON: the incorrect row's unknown error is null
    assert rows[3]["max_rel_error"] is None and rows[3]["correct"] is False


def test_shape_columns_map_named_dims():
    gemm = load_kernel_module("gemm")
    cols = runner.shape_columns(gemm.SHAPES[0])
    assert (cols["m"], cols["n"], cols["k"]) == tuple(gemm.SHAPES[0].dims[d] for d in "MNK")
    attn = load_kernel_module("flash_attention")
    cols = runner.shape_columns(attn.SHAPES[0])
    dims = attn.SHAPES[0].dims
    assert (cols["batch"], cols["num_heads"], cols["num_kv_heads"], cols["seq_len"],
            cols["head_dim"]) == (dims["B"], dims["H"], dims["KV_H"], dims["S"], dims["D"])


def test_best_picks_fastest_correct_run_only():
    rows = [
        {"record_type": "run", "run_status": "OK", "kernel_name": "k", "shape_name": "s",
         "config_id": "a", "latency_us": 10.0, "baseline_us": 12.0},
        {"record_type": "run", "run_status": "FAILED_CORRECTNESS", "kernel_name": "k",
         "shape_name": "s", "config_id": "fast_but_wrong", "latency_us": 1.0},
        {"record_type": "run", "run_status": "OK", "kernel_name": "k", "shape_name": "s",
         "config_id": "b", "latency_us": 11.0, "baseline_us": 12.0},
    ]
    (best,) = runner._best(rows)
    assert best["config_id"] == "a" and best["speedup"] == pytest.approx(1.2)


def test_exit_classification():
    status, msg = runner._classify_exit("[bench] BM128\ntorch.OutOfMemoryError: CUDA out of memory",
                                        None, 1)
    assert status is runner.RunStatus.OOM and "out of memory" in msg
    status, msg = runner._classify_exit("RuntimeError: CUDA error: an illegal memory access", None, 1)
    assert status is runner.RunStatus.CRASHED and "illegal memory access" in msg
    status, _ = runner._classify_exit("", "step 'BM64' ran over 5 s", -9)
    assert status is runner.RunStatus.TIMEOUT


def _run_cli(*args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO))
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "kernaudit_pipeline.bench.runner", *args],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=120)


def test_cli_without_gpu_exits_2_with_one_line(tmp_path):
    proc = _run_cli("gemm", "--quick", "--out", str(tmp_path / "x.jsonl"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA GPU" in lines[0]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "x.jsonl").exists()


@pytest.mark.parametrize("args,needle", [
    (("nosuch_kernel",), "unknown kernel"),
    (("--rsd-target", "0"), "must be positive"),
    (("--bogus",), "unrecognized arguments"),
    (("gemm", "--shapes", "no_such_shape"), "no (kernel, shape) pairs"),
])
def test_cli_bad_input_is_one_line_exit_2(args, needle):
    proc = _run_cli(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr


SAMPLE = REPO / "samples" / "h200" / "bench_h200.jsonl"


@pytest.mark.skipif(not SAMPLE.exists(), reason="committed H200 sample not present")
def test_committed_h200_rows_normalize_and_are_consistent():
    """The real H200 sweep: every run/baseline row validates, the file ends with a summary,
    and no incorrect config carries an OK status."""
    lines = SAMPLE.read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    assert records[-1]["record_type"] == "summary"
    rows = [dict(r, source_format="runner_jsonl", source_file=SAMPLE.name, source_row=i)
            for i, r in enumerate(records) if r["record_type"] in ("run", "baseline")]
    result = normalize(rows)
    assert len(result.quarantine) == 0, result.quarantine["reason"].head().tolist()
    assert len(result.kernel_runs) == len(rows)
    for r in rows:
        assert r["run_status"] in {s.value for s in runner.RunStatus}
        if r["run_status"] == "OK":
            assert r["correct"] is True and r["latency_samples"] == len(r["samples_us"])
        if r["correct"] is False:
            assert r["run_status"] == "FAILED_CORRECTNESS"
        if r["run_status"] == "PRUNED_SPILL":
            assert r["spill_stores_bytes"] > 0 and r["latency_us"] is None
    peaks = {r["peak_name"] for r in records if r["record_type"] == "peak"}
    assert peaks == {"dram_copy_bandwidth", "bf16_matmul_cublas", "fp8_scaled_mm"}
