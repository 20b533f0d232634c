"""The runner's CPU-side pieces: JSONL rows built from the real kernel modules' plans validate
against ``kernel_runs``, old runner files still ingest, and the CLI refuses cleanly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from kernaudit_pipeline.bench import paired, stats
from kernaudit_pipeline.bench.plan import KernelPlan, plan_module
from kernaudit_pipeline.bench.records import (
    STACK_FRAME_SOURCE, CheckResult, ClockStats, DeviceInfo, PairedTiming, RecordParts, RecordType,
    RunRecord, StaticInfo, Timing, build_record, read_jsonl, to_json_line,
)
from kernaudit_pipeline.bench.summary import best
from kernaudit_pipeline.bench.supervisor import Kill, classify_exit
from kernaudit_pipeline.core.verdicts import RunStatus, TimingMode
from kernaudit_pipeline.ingest import ingest_paths, validate
from kernaudit_pipeline.kernel_runs import COLUMNS, normalize
from kernaudit_pipeline.kernel_spec import Shape, ShapeError, kernel_files, load_kernel_module

REPO = Path(__file__).resolve().parents[2]
# Committed H200 files from before paired timing, which stay as they are when new captures land.
SAMPLE = REPO / "samples" / "h200" / "bench_h200_gemm_noprune.jsonl"
LEGACY = REPO / "samples" / "h200" / "bench_h200_fp8_before_fix.jsonl"
SWEEP_KERNELS = Path(__file__).resolve().parent / "sweep_kernels"

# The columns the runner writes for kernel_runs, paired timing included.
REQUIRED = (
    "kernel_name config_id block_m block_n block_k group_m num_warps num_stages shape_name "
    "phase m n k batch num_heads num_kv_heads seq_len head_dim causal dtype "
    "registers_per_thread stack_frame_bytes shared_mem_bytes threads_per_block grid_size "
    "latency_us latency_p10_us latency_p90_us latency_ci_low_us latency_ci_high_us "
    "latency_samples baseline_name baseline_us baseline_ci_low_us baseline_ci_high_us speedup "
    "speedup_ci_low speedup_ci_high timing_pairs timing_blocks timing_mode "
    "clock_discarded_samples sm_clock_min_mhz sm_clock_max_mhz baseline_backend "
    "reference_speedups correct max_rel_error run_status run_message flops bytes_moved "
    "device_name compute_capability sm_clock_mhz triton_version torch_version kernel_source_hash"
).split()

DEVICE = DeviceInfo(device_name="NVIDIA H200", compute_capability="9.0", sm_count=132,
                    max_shared_mem_bytes=232448, driver_version="580.159.04", cuda_version="13.0",
                    torch_version="2.11.0+cu130", triton_version="3.6.0")


def _recorded(kernel: str, shape: str, config_id: str) -> list[float]:
    for r in read_jsonl(SAMPLE.read_text()):
        if (r.get("kernel_name"), r.get("shape_name"), r.get("config_id")) == (kernel, shape, config_id):
            return r["samples_us"]
    raise KeyError((kernel, shape, config_id))


def _paired_timing(cand: list[float], ref: list[float], blocks: int = 5) -> PairedTiming:
    n = min(len(cand), len(ref))
    ids = [i * blocks // n for i in range(n)]
    clocks = ClockStats(median_mhz=1980.0, min_mhz=1755.0, max_mhz=1980.0, threshold_mhz=1485.0,
                        discarded_samples=4, throttle_reasons=("sw_power_cap",))
    return PairedTiming(candidate=stats.summarize(cand[:n]), reference=stats.summarize(ref[:n]),
                        speedup=paired.summarize_pairs(cand[:n], ref[:n], ids), samples_us=cand[:n],
                        reference_samples_us=ref[:n], stop_reason="RSD_REACHED", timing_s=0.2,
                        mode=TimingMode.EVENTS, clocks=clocks)


def _rows_for(path: Path) -> list[dict]:
    """Every kind of row the runner writes, for one real kernel module (its plan, as a worker
    writes it)."""
    mod = load_kernel_module(path)
    plan = KernelPlan.from_json(plan_module(path, mod).to_json())
    sp = plan.shapes[0]
    cfg = plan.configs[0]
    common = dict(flops=sp.flops, bytes_moved=sp.bytes_moved, attempt=0)
    grid = sp.grids[next(iter(sp.grids))]
    static = StaticInfo(registers_per_thread=168, n_spills=0, shared_mem_bytes=98304,
                        threads_per_block=cfg["num_warps"] * 32, compile_s=1.5)
    spilling = StaticInfo(registers_per_thread=255, n_spills=202, shared_mem_bytes=147456,
                          threads_per_block=128, compile_s=3.0)
    check = CheckResult(correct=True, max_rel_error=2.3e-3, max_abs_error=0.01, nonfinite_outputs=0,
                        elementwise_violations=0, check_seed=5, check_s=0.2)
    wrong = CheckResult(correct=False, max_rel_error=None, max_abs_error=None, nonfinite_outputs=1024,
                        elementwise_violations=None, check_seed=6, check_s=0.2)
    base_samples = _recorded("gemm_bf16", "llama3_8b_qkv_prefill", "baseline")
    cand_samples = _recorded("gemm_bf16", "llama3_8b_qkv_prefill", "BK64_BM128_BN256_GM8_s3_w8")
    timing = Timing(summary=stats.summarize(base_samples), samples_us=base_samples,
                    stop_reason="RSD_REACHED", timing_s=0.05, sm_clock_mhz=1980.0)
    refs = ({"name": "other", "backend": "cuDNN", "speedup": 0.9, "speedup_ci_low": 0.88,
             "speedup_ci_high": 0.92, "primary": False, "run_status": "OK"},)
    records = [
        build_record(RecordType.BASELINE, plan.info, sp.shape, DEVICE, RunStatus.OK,
                     RecordParts(check=check, timing=timing, baseline_backend="cuBLAS", **common)),
        build_record(RecordType.RUN, plan.info, sp.shape, DEVICE, RunStatus.OK, RecordParts(
            config=cfg, static=static, grid=grid, check=check, baseline_backend="cuBLAS",
            paired=_paired_timing(cand_samples, base_samples), reference_speedups=refs,
            launch_matches_compile=True, **common)),
        build_record(RecordType.RUN, plan.info, sp.shape, DEVICE, RunStatus.PRUNED_SPILL, RecordParts(
            config=cfg, static=spilling, grid=grid, message="pruned", **common)),
        build_record(RecordType.RUN, plan.info, sp.shape, DEVICE, RunStatus.FAILED_CORRECTNESS,
                     RecordParts(config=cfg, static=static, grid=grid, check=wrong, message="x", **common)),
        build_record(RecordType.RUN, plan.info, sp.shape, DEVICE, RunStatus.TIMEOUT,
                     RecordParts(config=cfg, grid=grid, message="step ran over 180 s", **common)),
    ]
    return [json.loads(to_json_line(r)) for r in records]


KERNEL_FILES = kernel_files()


@pytest.mark.parametrize("path", KERNEL_FILES, ids=[p.stem for p in KERNEL_FILES])
def test_rows_normalize_with_nothing_quarantined(path):
    rows = _rows_for(path)
    for i, row in enumerate(rows):
        row.update(source_format="runner_jsonl", source_file="bench.jsonl", source_row=i)
    result = normalize(rows)
    assert len(result.quarantine) == 0, result.quarantine["reason"].tolist()
    ok = result.kernel_runs.iloc[1]
    assert ok["run_status"] == "OK" and ok["timing_mode"] == "events" and ok["baseline_backend"] == "cuBLAS"
    assert ok["speedup_ci_low"] <= ok["speedup"] <= ok["speedup_ci_high"]
    assert ok["speedup"] == pytest.approx(rows[1]["speedup"]) and ok["clock_discarded_samples"] == 4
    assert json.loads(ok["reference_speedups"])[0]["backend"] == "cuDNN"
    pruned = result.kernel_runs.iloc[2]
    # the JIT's local memory is the stack frame; ptxas spill counts are not the runner's to write
    assert pruned["stack_frame_bytes"] == 808 and pd_isna(pruned["spill_stores_bytes"])
    assert pd_isna(pruned["latency_us"])


def pd_isna(value) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value)) or str(value) in ("<NA>", "nan")


def test_rows_carry_every_required_column_and_valid_json():
    rows = _rows_for(KERNEL_FILES[0])
    names = {f.name for f in fields(RunRecord)}
    assert not [c for c in REQUIRED if c not in names]
    assert set(REQUIRED) <= set(COLUMNS)  # the names are kernel_runs' own
    ok = rows[1]
    assert ok["record_type"] == "run" and ok["timing_pairs"] == len(ok["samples_us"]) == len(ok["baseline_samples_us"])
    assert ok["timing_blocks"] == 5 and len(ok["block_speedups"]) == 5
    assert ok["spill_bytes_source"] == STACK_FRAME_SOURCE and ok["config"]["num_warps"] == ok["num_warps"]
    assert ok["speedup_boot_ci_low"] >= ok["speedup_ci_low"]  # the between-run part only widens
    assert rows[3]["max_rel_error"] is None and rows[3]["correct"] is False  # no NaN in JSON


def test_plan_round_trips_and_holds_grids_and_references():
    path = REPO / "kernels" / "gemm.py"
    plan = plan_module(path, load_kernel_module(path))
    again = KernelPlan.from_json(plan.to_json())
    assert again == plan
    assert again.references[0].key is None and again.shape(plan.shapes[0].shape.name).flops > 0
    cid = next(iter(plan.shapes[0].grids))
    assert plan.config(cid)["num_warps"] in (4, 8)


@pytest.mark.skipif(not LEGACY.exists(), reason="committed H200 sample not present")
def test_committed_pre_paired_file_still_ingests_with_its_stack_frames():
    """A committed capture from before paired timing still ingests, nothing quarantined, and its
    4*n_spills figures land in stack_frame_bytes, not in the ptxas spill columns."""
    result = ingest_paths([LEGACY])
    (summary,) = result.summaries
    assert summary.quarantined == 0 and summary.rows > 100
    checked = validate(result)
    assert checked.quarantine.empty
    runs = checked.kernel_runs
    pruned = runs[runs["run_status"] == "PRUNED_SPILL"]
    assert len(pruned) and (pruned["stack_frame_bytes"] > 0).all() and pruned["spill_stores_bytes"].isna().all()
    assert runs["speedup"].isna().all()  # no paired fields in that file


def test_best_prefers_the_paired_speedup_and_ignores_incorrect_rows():
    rows = [
        {"record_type": "run", "run_status": "OK", "kernel_name": "k", "shape_name": "s",
         "config_id": "a", "latency_us": 10.0, "baseline_us": 12.0, "speedup": 1.15},
        {"record_type": "run", "run_status": "FAILED_CORRECTNESS", "kernel_name": "k",
         "shape_name": "s", "config_id": "fast_but_wrong", "latency_us": 1.0, "speedup": 9.0},
        {"record_type": "run", "run_status": "OK", "kernel_name": "k", "shape_name": "s",
         "config_id": "b", "latency_us": 10.5, "baseline_us": 12.6, "speedup": 1.2},
    ]
    (b,) = best(rows)
    assert b["config_id"] == "b" and b["speedup"] == 1.2


def test_exit_classification():
    status, msg = classify_exit("[bench] BM128\ntorch.OutOfMemoryError: CUDA out of memory", None, 1)
    assert status is RunStatus.OOM and "out of memory" in msg
    status, msg = classify_exit("RuntimeError: CUDA error: an illegal memory access", None, 3)
    assert status is RunStatus.CRASHED and "illegal memory access" in msg
    status, msg = classify_exit("", None, -11)
    assert status is RunStatus.CRASHED and "SIGSEGV" in msg
    status, _ = classify_exit("", Kill("step 'BM64' ran over 5 s"), -9)
    assert status is RunStatus.TIMEOUT
    # the sweep running out of time is not the config's fault
    status, msg = classify_exit("", Kill("sweep deadline reached during 'n|BM64'", at_deadline=True), -9)
    assert status is RunStatus.NOT_RUN and "deadline" in msg


def _run_cli(*args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO))
    env.pop("KERNAUDIT_BENCH_FAKE_DEVICE", None)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "kernaudit_pipeline.bench.runner", *args],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=300)


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
    (("--clock-fraction", "1.5"), "--clock-fraction"),
    (("--bogus",), "unrecognized arguments"),
    (("gemm", "--shapes", "no_such_shape"), "no (kernel, shape) pairs"),
])
def test_cli_bad_input_is_one_line_exit_2(args, needle):
    proc = _run_cli(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr


@pytest.mark.parametrize("dims, shown", [
    ({"N": 0}, "N=0"), ({"N": -4096}, "N=-4096"), ({"N": 4096.0}, "N=4096.0"), ({"N": True}, "N=True"),
    ({"N": "4096"}, "N='4096'"), ({"N": 2**40 + 1}, f"N={2**40 + 1}"), ({}, "has no dims"), (None, "has no dims"),
])
def test_a_shape_no_gpu_runs_cannot_be_made(dims, shown):
    """The check lives in ``kernel_spec`` (which the runner may import), so a module declaring
    such a shape fails to load everywhere: the runner, ``kernaudit static`` and ``rank``."""
    with pytest.raises(ShapeError) as err:
        Shape("s", dims)
    assert str(err.value).startswith("breaks the kernel contract: shape 's'") and shown in str(err.value)
    assert Shape("s", {"N": 1, "M": 2**40}).dims == {"N": 1, "M": 2**40}  # both ends are allowed


def test_the_runner_refuses_a_module_whose_shape_is_empty(tmp_path):
    """The runner timed N=0 on its test double, called the empty output correct and exited 0.
    Now the module cannot be planned: one CRASHED row says why (in = kept + quarantined once
    ingested), and with nothing left to time the run exits 1 with one line."""
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    source = (SWEEP_KERNELS / "noisy_double.py").read_text()
    bad = source.replace('Shape("n4096", {"N": 4096}', 'Shape("n4096", {"N": 0}', 1)
    assert bad != source
    (kernels / "noisy_double.py").write_text(bad)
    out = tmp_path / "rows.jsonl"
    proc = _run_cli("noisy_double", "--kernels-dir", str(kernels), "--out", str(out), "--no-peaks",
                    env_extra={"KERNAUDIT_BENCH_FAKE_DEVICE": "cpu"})
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "nothing to time" in lines[0] and "Traceback" not in proc.stderr
    runs = [r for r in read_jsonl(out.read_text()) if r["record_type"] == "run"]
    assert [r["run_status"] for r in runs] == ["CRASHED"]
    assert "shape 'n4096' dimension N=0 is not a whole number" in runs[0]["run_message"]
    assert not any(r["record_type"] == "baseline" for r in read_jsonl(out.read_text()))
