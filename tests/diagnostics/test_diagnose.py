"""``diagnose`` on frames: seed rows (all optional columns NaN), profiler rows, unknown GPUs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kernaudit_pipeline.comparisons import build_comparisons
from kernaudit_pipeline.ingest import ingest_paths, validate
from kernaudit_pipeline.kernel_runs import normalize
from kernaudit_pipeline.spill_diagnostics import DIAG_COLUMNS, diagnose, diagnose_record

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "examples" / "seed_starter.json"
FIXTURES = ROOT / "tests" / "fixtures"


def _seed_frame() -> pd.DataFrame:
    items = [item["input"] for item in json.loads(SEED.read_text())]
    rows = [dict(x, source_format="seed_json", source_file="seed", source_row=i) for i, x in enumerate(items)]
    return build_comparisons(normalize(rows).kernel_runs)


def test_seed_rows_keep_the_seed_contract_and_gain_nan_safe_columns():
    out = diagnose(_seed_frame())
    assert list(out["spill_detected"]) == [True, False]  # the seed's expected spill_detected
    assert set(DIAG_COLUMNS) <= set(out.columns)
    assert list(out["spill_causes_stalls"]) == [False, False]  # spill bytes alone are no stall evidence
    assert out["occupancy_pct"].isna().all() and out["bottleneck"].isna().all()
    ev = json.loads(out.loc[0, "spill_evidence"])
    assert ev == [{"metric": "spill_stores_bytes", "value": 2048.0, "op": ">", "threshold": 0, "met": True}]
    assert json.loads(out.loc[1, "spill_evidence"])[0]["met"] is False


def test_every_optional_column_nan():
    frame = pd.DataFrame({"kernel_name": ["k"], "latency_us": [np.nan], "device_name": [np.nan]})
    out = diagnose(frame)
    assert not out.loc[0, "spill_detected"] and not out.loc[0, "spill_causes_stalls"]
    assert out.loc[0, "diag_notes"]


def test_empty_frame():
    out = diagnose(pd.DataFrame({"kernel_name": pd.Series(dtype=str)}))
    assert out.empty and set(DIAG_COLUMNS) <= set(out.columns)


def test_unknown_gpu_is_said_and_the_rest_still_computed():
    row = {"kernel_name": "k", "device_name": "Mystery GPU", "latency_us": 100.0, "flops": 2e9, "bytes_moved": 1e9,
           "registers_per_thread": 128, "threads_per_block": 256, "shared_mem_bytes": 65536}
    fields = diagnose_record(row)
    assert "unknown GPU 'Mystery GPU'" in fields["diag_notes"]
    assert fields["achieved_tflops"] == pytest.approx(20.0) and fields["arithmetic_intensity"] == pytest.approx(2.0)
    assert fields["achieved_gbps"] == pytest.approx(10_000.0)
    assert fields["occupancy_pct"] is None and fields["bottleneck"] is None
    # the compute capability still gives the SM's resources
    assert diagnose_record({**row, "compute_capability": "9.0"})["occupancy_limiter"] == "registers"


def test_profiler_rows_through_ingest_validate_and_diagnose():
    result = ingest_paths([FIXTURES / "ncu_raw_garbled.csv", FIXTURES / "runner_bad.jsonl"])
    runs = validate(result).kernel_runs
    # profiler rows are evidence for candidates in comparisons; diagnose reads any kernel_runs frame
    out = diagnose(runs, peaks=list(result.peaks))
    assert not (build_comparisons(runs)["source_format"] == "ncu_raw").any()
    ncu = out[out["source_format"] == "ncu_raw"].iloc[0]
    assert ncu["blocks_per_sm"] == 1 and ncu["occupancy_limiters"] == "registers,shared_mem"
    assert ncu["gpu_spec"] == "H200-SXM-141GB"
    assert out["occupancy_matches_ncu"].isna().all()  # the fixture has no ncu limit columns
    assert out["blocks_per_sm"].dtype == "Int64" and out["occupancy_pct"].dtype == float


def test_empty_and_sparse_frames_are_normal_cases():
    """A foreign trace may give a name and a duration only; an audit may have no rows at all."""
    empty = diagnose(pd.DataFrame())
    assert empty.empty and empty["spill_detected"].dtype == bool
    assert empty[empty["spill_detected"]].columns.tolist() == empty.columns.tolist()  # a mask, not a column pick
    sparse = diagnose(pd.DataFrame([{"kernel_name": "someone_elses_kernel", "latency_us": 3.0}]))
    row = sparse.iloc[0]
    assert not row["spill_detected"] and pd.isna(row["occupancy_pct"]) and pd.isna(row["efficiency_pct"])
    assert "occupancy: no registers" in row["diag_notes"]
