"""Well-formed inputs the project itself produces: seed items and the runner's own records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernaudit_pipeline.bench import stats
from kernaudit_pipeline.bench.peaks import _record as peak_record
from kernaudit_pipeline.bench.records import (
    DeviceInfo, KernelInfo, RecordParts, RecordType, StaticInfo, Timing, build_record, to_json_line,
)
from kernaudit_pipeline.core.verdicts import RunStatus
from kernaudit_pipeline.ingest import SourceFormat, ingest_paths, parse_path, validate
from kernaudit_pipeline.kernel_spec import load_kernel_module

ROOT = Path(__file__).resolve().parents[2]


def test_seed_starter_items():
    fmt, parsed = parse_path(ROOT / "examples" / "seed_starter.json")
    assert fmt is SourceFormat.SEED_JSON and len(parsed.rows) == 2 and not parsed.quarantine
    assert parsed.rows[0]["spill_stores_bytes"] == 2048 and "expected_output" not in parsed.rows[0]
    assert [r["source_row"] for r in parsed.rows] == [0, 1]


@pytest.fixture(scope="module")
def runner_file(tmp_path_factory) -> Path:
    """A JSONL written by the runner's own record builders (no GPU needed to build records)."""
    gemm = load_kernel_module("gemm")
    kernel = KernelInfo(module="gemm", name=gemm.NAME, dtype=gemm.DTYPE, baseline_name=gemm.BASELINE_NAME,
                        source_hash="0" * 64, tolerance_rel_l2=gemm.TOLERANCE.max_rel_l2)
    shape = gemm.SHAPES[0]
    device = DeviceInfo(device_name="NVIDIA H200", compute_capability="9.0", sm_count=132)
    samples = [286.0, 287.5, 286.2, 288.1, 285.9, 286.4, 287.0, 286.8, 286.1, 287.2]
    timing = Timing(summary=stats.summarize(samples), samples_us=samples, stop_reason="rsd", timing_s=1.0)
    config = gemm.CONFIGS[0]
    base = build_record(RecordType.BASELINE, kernel, shape, device, RunStatus.OK, RecordParts(
        timing=timing, flops=gemm.flops(shape), bytes_moved=gemm.bytes_moved(shape)))
    run = build_record(RecordType.RUN, kernel, shape, device, RunStatus.OK, RecordParts(
        config=config, static=StaticInfo(registers_per_thread=220, n_spills=0, shared_mem_bytes=147_456,
                                         threads_per_block=256), grid=gemm.grid(shape, config), timing=timing,
        flops=gemm.flops(shape), bytes_moved=gemm.bytes_moved(shape)))
    pruned = build_record(RecordType.RUN, kernel, shape, device, RunStatus.PRUNED_SPILL, RecordParts(
        config=gemm.CONFIGS[1], static=StaticInfo(registers_per_thread=255, n_spills=202, shared_mem_bytes=147_456,
                                                  threads_per_block=128)))
    peak = peak_record("bf16_matmul_cublas", "torch.matmul bf16", device, timing, 2.0 * 8192**3, None)
    path = tmp_path_factory.mktemp("runner") / "bench.jsonl"
    lines = [to_json_line(r) for r in (base, run, pruned, peak)] + [json.dumps({"record_type": "summary"})]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_runner_records_become_rows_and_peaks(runner_file):
    result = ingest_paths([runner_file])
    (summary,) = result.summaries
    assert summary.source_format == "runner_jsonl"
    assert (summary.records_in, summary.rows, summary.quarantined, summary.other_records) == (5, 3, 0, 2)
    assert len(result.peaks) == 1 and result.peaks[0]["peak_tflops"] > 0
    checked = validate(result)
    assert len(checked.kernel_runs) == 3 and checked.quarantine.empty, checked.quarantine
    runs = checked.kernel_runs.set_index("config_id")
    assert runs.loc["baseline", "latency_us"] == pytest.approx(runs.loc["baseline", "baseline_us"])
    pruned = runs[runs["run_status"] == "PRUNED_SPILL"].iloc[0]
    assert pruned["stack_frame_bytes"] == 808 and pruned["registers_per_thread"] == 255
    assert set(runs["source_format"]) == {"runner_jsonl"}
