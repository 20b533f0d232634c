"""Verdicts with confidence intervals, and profiler rows joined as evidence."""

import pandas as pd

from kernaudit_pipeline.comparisons import RowRole, Status, build_comparisons, compare, row_role
from kernaudit_pipeline.kernel_runs import normalize


def test_interval_that_includes_one_is_inconclusive():
    v = compare(90.0, 100.0, latency_ci_us=(80.0, 120.0), baseline_ci_us=(95.0, 105.0))
    assert v.status == Status.INCONCLUSIVE and v.speedup_ci_low < 1 < v.speedup_ci_high


def test_tight_intervals_decide():
    v = compare(90.0, 100.0, latency_ci_us=(89.0, 91.0), baseline_ci_us=(99.0, 101.0))
    assert v.status == Status.IMPROVED and round(v.pct_change, 2) == 11.11


def test_unlaunchable_config_is_not_called_incorrect():
    assert compare(None, 10.0, run_status="OUT_OF_RESOURCES").status == Status.INCONCLUSIVE
    assert compare(5.0, 10.0, run_status="FAILED_CORRECTNESS").status == Status.FAILED


def _row(i, **kw):
    r = {"kernel_name": "gemm_bf16", "shape_name": "s", "config_id": "A", "source_format": "runner_jsonl",
         "source_file": "b.jsonl", "source_row": i, "latency_us": 10.0, "baseline_us": 12.0}
    r.update(kw)
    return r


def test_profiler_rows_become_evidence_not_candidates():
    rows = [_row(0), _row(1, config_id="baseline[torch.matmul]", latency_us=12.0),
            _row(2, source_format="ncu_raw", source_file="n.csv", baseline_us=None, latency_us=11.0,
                 local_spill_requests=100.0, stall_lg_throttle_pct=30.0),
            _row(3, source_format="ncu_raw", source_file="n.csv", baseline_us=None, latency_us=11.0,
                 local_spill_requests=300.0, stall_lg_throttle_pct=40.0),
            _row(4, config_id="B", local_spill_requests=0.0)]
    runs = normalize(rows).kernel_runs
    assert [row_role(r) for _, r in runs.iterrows()] == [RowRole.CANDIDATE, RowRole.BASELINE, RowRole.PROFILER,
                                                          RowRole.PROFILER, RowRole.CANDIDATE]
    out = build_comparisons(runs).set_index("config_id")
    assert list(out.index) == ["A", "B"]
    assert out.loc["A", "local_spill_requests"] == 200.0  # median of the two launches
    assert out.loc["A", "stall_lg_throttle_pct"] == 35.0 and out.loc["A", "evidence_sources"] == "n.csv"
    assert out.loc["B", "local_spill_requests"] == 0.0 and pd.isna(out.loc["B", "evidence_sources"])
