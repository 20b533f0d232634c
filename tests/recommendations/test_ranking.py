"""One rule picks each group's config and decides: eligibility, pooling, ties, decisions."""

from __future__ import annotations

import pandas as pd
import pytest

from kernaudit_pipeline.comparisons import build_comparisons
from kernaudit_pipeline.core.verdicts import DataKind, DecisionKind
from kernaudit_pipeline.recommendations.ranking import (
    TIE_BREAK, UNPAIRED_NOISE_BAND, decide, decide_all, rank_group, rank_groups,
)

H200 = "NVIDIA H200"
BASE = dict(kernel_name="gemm_x", shape_name="s", device_name=H200, m=4096, n=4096, k=4096,
            block_k=64, group_m=8, num_warps=8, num_stages=3, baseline_us=120.0, correct=True,
            run_status="OK", source_format="runner_jsonl", baseline_name="torch.matmul")


def _frame(*rows: dict) -> pd.DataFrame:
    return build_comparisons(pd.DataFrame([BASE | r for r in rows]))


def _paired(speedup: float, half: float = 0.005, **kw) -> dict:
    """A runner row with a paired speedup (the latencies alone would say something else)."""
    return dict(kw, latency_us=100.0, speedup=speedup, speedup_ci_low=speedup - half,
                speedup_ci_high=speedup + half, timing_pairs=40)


def _one(frame: pd.DataFrame):
    (g,) = rank_groups(frame).values()
    return g, decide(g)


def test_paired_speedups_are_used_as_is_and_decide():
    g, d = _one(_frame(_paired(1.10, block_m=128, block_n=256, registers_per_thread=220),
                       _paired(0.95, block_m=64, block_n=64, registers_per_thread=64)))
    assert g.chosen.config_id == "BK64_BM128_BN256_GM8_s3_w8" and g.chosen.paired
    assert d.decision == DecisionKind.SHIP_CONFIG
    assert (d.speedup, d.speedup_ci_low, d.speedup_ci_high) == pytest.approx((1.10, 1.095, 1.105))
    assert d.baseline_name == "torch.matmul" and d.data_kind == DataKind.MEASURED
    assert d.evidence["registers_per_thread"] == 220 and d.evidence["speedup_source"] == "paired"
    assert "beats torch.matmul" in d.reason and "paired interval is above 1 + 2%" in d.reason


def test_keep_baseline_when_the_best_correct_config_is_clearly_slower():
    g, d = _one(_frame(_paired(0.93, block_m=128, block_n=256), _paired(0.80, block_m=64, block_n=64),
                       dict(block_m=256, block_n=256, latency_us=10.0, correct=False)))  # fast and wrong
    assert d.decision == DecisionKind.KEEP_BASELINE and d.config_id == "BK64_BM128_BN256_GM8_s3_w8"
    assert "clearly slower" in d.reason and d.evidence["not_ranked"] == {"FAILED": 1}


def test_no_decision_inside_the_noise_band_says_so():
    g, d = _one(_frame(_paired(1.01, half=0.004, block_m=128, block_n=256)))
    assert d.decision == DecisionKind.NO_DECISION and d.reason.startswith("within noise")
    assert d.config_id is not None  # the best config is still named


def test_unpaired_ratios_decide_on_the_wider_band():
    # 1.07x from two medians timed apart is inside the 10 % run-to-run spread ANCHORS measured
    g, d = _one(_frame(dict(block_m=128, block_n=256, latency_us=112.0, latency_ci_low_us=111.0,
                            latency_ci_high_us=113.0, baseline_ci_low_us=119.0, baseline_ci_high_us=121.0)))
    assert not g.chosen.paired and d.decision == DecisionKind.NO_DECISION
    assert f"±{UNPAIRED_NOISE_BAND:.0%}" in d.reason and "unpaired" in d.reason
    g, d = _one(_frame(dict(block_m=128, block_n=256, latency_us=90.0)))  # 1.33x, no interval
    assert d.decision == DecisionKind.SHIP_CONFIG


@pytest.mark.parametrize(("rows", "start"), [
    ([dict(block_m=128, block_n=256, latency_us=None, run_status="PRUNED_SPILL"),
      dict(block_m=256, block_n=256, latency_us=None, run_status="OUT_OF_RESOURCES")],
     "nothing timed correctly: 1 OUT_OF_RESOURCES, 1 PRUNED_SPILL"),
    ([dict(block_m=128, block_n=256, latency_us=50.0, correct=False),
      dict(block_m=64, block_n=64, latency_us=60.0, run_status="TIMEOUT")], "nothing correct: 2 FAILED"),
    ([dict(block_m=128, block_n=256, latency_us=90.0, baseline_us=None)], "no baseline to compare with"),
    ([dict(block_m=128, block_n=256, latency_us=1e-300)], "nothing timed correctly: 1 INCONCLUSIVE"),
])
def test_no_decision_reasons(rows, start):
    g, d = _one(_frame(*rows))
    assert d.decision == DecisionKind.NO_DECISION and d.reason.startswith(start), d.reason


def test_ties_are_broken_by_the_stated_criterion():
    # three configs within 2 %: the spilling one is fastest, then fewer registers win
    g, d = _one(_frame(_paired(1.200, block_m=128, block_n=256, num_warps=4, registers_per_thread=255,
                               spill_stores_bytes=72),
                       _paired(1.190, block_m=128, block_n=128, registers_per_thread=200, shared_mem_bytes=98_304),
                       _paired(1.185, block_m=128, block_n=128, num_stages=4, registers_per_thread=200,
                               shared_mem_bytes=131_072),
                       _paired(1.100, block_m=64, block_n=64, registers_per_thread=64)))
    assert g.fastest.config_id == "BK64_BM128_BN256_GM8_s3_w4"
    assert g.chosen.config_id == "BK64_BM128_BN128_GM8_s3_w8"
    assert {c.config_id for c in g.tied} == {"BK64_BM128_BN256_GM8_s3_w4", "BK64_BM128_BN128_GM8_s4_w8"}
    assert TIE_BREAK in g.tie_reason and d.tied_with
    assert g.fastest.speedup / g.chosen.speedup <= 1.02


def test_a_tie_never_trades_a_ship_decision_for_no_decision():
    # the fastest ships, its tied neighbour (fewer registers) would not: the neighbour is not chosen
    g, d = _one(_frame(_paired(1.030, half=0.003, block_m=128, block_n=256, registers_per_thread=220),
                       _paired(1.015, half=0.003, block_m=128, block_n=128, registers_per_thread=120)))
    assert d.decision == DecisionKind.SHIP_CONFIG and g.chosen.config_id == "BK64_BM128_BN256_GM8_s3_w8"


def test_repeats_pool_into_one_candidate_whose_interval_spans_them():
    g, d = _one(_frame(_paired(1.10, block_m=128, block_n=256), _paired(1.06, block_m=128, block_n=256),
                       _paired(1.08, block_m=128, block_n=256)))
    (c,) = g.candidates
    assert c.rows == 3 and c.speedup == pytest.approx(1.08)
    assert (c.ci_low, c.ci_high) == pytest.approx((1.055, 1.105))


def test_groups_are_per_kernel_shape_device():
    frame = _frame(_paired(1.1, block_m=128, block_n=256), _paired(1.2, block_m=64, block_n=64,
                                                                   device_name="NVIDIA H100 80GB HBM3"),
                   _paired(1.3, block_m=16, block_n=64, shape_name="decode", m=16))
    got = {k: d.config_id for k, d in decide_all(rank_groups(frame)).items()}
    assert got == {("gemm_x", "s", H200): "BK64_BM128_BN256_GM8_s3_w8",
                   ("gemm_x", "s", "NVIDIA H100 80GB HBM3"): "BK64_BM64_BN64_GM8_s3_w8",
                   ("gemm_x", "decode", H200): "BK64_BM16_BN64_GM8_s3_w8"}


def test_modelled_and_predicted_data_are_labelled_and_never_outrank_measurements():
    frame = _frame(dict(block_m=128, block_n=256, latency_us=90.0),
                   dict(block_m=64, block_n=64, latency_us=30.0, source_format="synthetic"),
                   dict(block_m=32, block_n=32, latency_us=20.0, data_kind="predicted"))
    g, d = _one(frame)
    assert d.data_kind == DataKind.MEASURED and d.config_id == "BK64_BM128_BN256_GM8_s3_w8"
    assert d.evidence["ignored_data_kinds"] == ["modelled", "predicted"]
    (key, rows), = [(k, frame) for k in [("gemm_x", "s", H200)]]
    predicted = rank_group(key, build_comparisons(pd.DataFrame([BASE | dict(block_m=32, block_n=32, latency_us=20.0,
                                                                          data_kind="predicted")])))
    d = decide(predicted)
    assert d.data_kind == DataKind.PREDICTED and "predicted by the static cost model; no GPU timed it" in d.reason
    assert "measured" not in d.reason
