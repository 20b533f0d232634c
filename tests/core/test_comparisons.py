"""Verdicts that say what happened, paired speedups, and profiler rows joined as evidence."""

import pandas as pd
import pytest

from kernaudit_pipeline.comparisons import (
    RowRole, SpeedupSource, Status, build_comparisons, compare, compare_row, row_role, status_counts,
)
from kernaudit_pipeline.kernel_runs import normalize


def test_interval_that_includes_one_is_noisy():
    v = compare(90.0, 100.0, latency_ci_us=(80.0, 120.0), baseline_ci_us=(95.0, 105.0))
    assert v.status == Status.NOISY and v.speedup_ci_low < 1 < v.speedup_ci_high
    assert v.source == SpeedupSource.UNPAIRED


@pytest.mark.parametrize(("run_status", "status"), [
    ("PRUNED_SPILL", Status.PRUNED_SPILL), ("OUT_OF_RESOURCES", Status.OUT_OF_RESOURCES),
    ("PRUNED_SMEM", Status.OUT_OF_RESOURCES), ("NOT_RUN", Status.NOT_RUN),
    ("TIMEOUT", Status.FAILED), ("FAILED_CORRECTNESS", Status.FAILED),
])
def test_untimed_configs_say_why(run_status, status):
    v = compare(None, 10.0, run_status=run_status)
    assert v.status == status and run_status in v.reason and v.speedup is None


@pytest.mark.parametrize("latency", [1e-300, 1e-4, 4e9, float("inf"), -1.0, 0.0, None, "fast"])
def test_inconclusive_is_only_a_missing_or_invalid_measurement(latency):
    v = compare(latency, 10.0)
    assert v.status == Status.INCONCLUSIVE and v.speedup is None


def test_a_paired_speedup_is_used_as_the_runner_measured_it():
    row = dict(latency_us=100.0, baseline_us=98.0, speedup=1.05, speedup_ci_low=1.04, speedup_ci_high=1.06,
               timing_pairs=40)
    v = compare_row(row)
    assert v.status == Status.IMPROVED and v.source == SpeedupSource.PAIRED
    assert (v.speedup, v.speedup_ci_low, v.speedup_ci_high) == (1.05, 1.04, 1.06)
    # a bare "speedup" field in a seed item is not trusted over its latencies
    v = compare_row(dict(latency_us=48.2, baseline_us=35.1, speedup=2.0))
    assert v.source == SpeedupSource.UNPAIRED and round(v.speedup, 2) == 0.73
    bad = compare_row(dict(row, speedup_ci_low=1.2))  # an interval that excludes its own point
    assert bad.status == Status.INCONCLUSIVE


def test_status_counts_cover_every_row():
    frame = build_comparisons(pd.DataFrame([
        dict(kernel_name="k", source_format="runner", latency_us=lat, baseline_us=10.0, run_status=rs)
        for lat, rs in ((5.0, "OK"), (20.0, "OK"), (10.0, "OK"), (None, "PRUNED_SPILL"), (None, "OUT_OF_RESOURCES"),
                        (3.0, "TIMEOUT"), (1e-300, "OK"))]))
    counts = status_counts(frame)
    assert sum(counts.values()) == len(frame) == 7
    assert counts["IMPROVED"] == counts["REGRESSION"] == counts["NEUTRAL"] == counts["FAILED"] == 1
    assert counts["PRUNED_SPILL"] == counts["OUT_OF_RESOURCES"] == counts["INCONCLUSIVE"] == 1
    assert counts["NOISY"] == counts["NOT_RUN"] == 0
    assert set(frame["data_kind"]) == {"measured"}


def test_tight_intervals_decide():
    v = compare(90.0, 100.0, latency_ci_us=(89.0, 91.0), baseline_ci_us=(99.0, 101.0))
    assert v.status == Status.IMPROVED and round(v.pct_change, 2) == 11.11


def test_unlaunchable_config_is_not_called_incorrect():
    assert compare(None, 10.0, run_status="OUT_OF_RESOURCES").status == Status.OUT_OF_RESOURCES
    assert compare(5.0, 10.0, run_status="FAILED_CORRECTNESS").status == Status.FAILED


def _row(i, **kw):
    r = {"kernel_name": "gemm_bf16", "shape_name": "s", "config_id": "A", "source_format": "runner_jsonl",
         "source_file": "b.jsonl", "source_row": i, "latency_us": 10.0, "baseline_us": 12.0}
    r.update(kw)
    return r


def test_profiler_rows_become_evidence_not_candidates():
    rows = [_row(0), _row(1, config_id="baseline[torch.matmul]", latency_us=12.0),
            _row(2, source_format="ncu_raw", source_file="n.csv", baseline_us=None, latency_us=11.0,
                 local_spill_requests=100.0, stall_lg_throttle_pct=30.0, kernel_module="gemm_bf16"),
            _row(3, source_format="ncu_raw", source_file="n.csv", baseline_us=None, latency_us=11.0,
                 local_spill_requests=300.0, stall_lg_throttle_pct=40.0, kernel_module="gemm_bf16"),
            _row(4, config_id="B", local_spill_requests=0.0)]
    runs = normalize(rows).kernel_runs
    assert [row_role(r) for _, r in runs.iterrows()] == [RowRole.CANDIDATE, RowRole.BASELINE, RowRole.PROFILER,
                                                          RowRole.PROFILER, RowRole.CANDIDATE]
    out = build_comparisons(runs).set_index("config_id")
    assert list(out.index) == ["A", "B"]
    assert out.loc["A", "local_spill_requests"] == 200.0  # median of the two launches
    assert out.loc["A", "stall_lg_throttle_pct"] == 35.0 and out.loc["A", "evidence_sources"] == "n.csv"
    assert out.loc["B", "local_spill_requests"] == 0.0 and pd.isna(out.loc["B", "evidence_sources"])


def test_profiler_rows_of_a_foreign_kernel_are_candidates_of_their_own():
    row = _row(0, source_format="torch_trace", source_file="t.json", kernel_name="triton_poi_fused_add_0",
               config_id="grid1x1x1_block128x1x1_regs16_smem0", baseline_us=None)
    runs = normalize([row]).kernel_runs
    assert row_role(runs.iloc[0]) is RowRole.CANDIDATE
    assert list(build_comparisons(runs)["kernel_name"]) == ["triton_poi_fused_add_0"]
