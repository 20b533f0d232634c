"""The runner's statistics on synthetic sample streams (numpy only, no GPU)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kernaudit_pipeline.bench import stats


def test_median_and_percentiles_match_definitions():
    xs = [5.0, 1.0, 4.0, 2.0, 3.0, 100.0]
    assert stats.median(xs) == 3.5
    # linear interpolation: p10 of 1..5,100 sits between 1 and 2
    assert stats.percentile(xs, 10) == pytest.approx(1.5)
    assert stats.percentile(xs, 90) == pytest.approx(52.5)
    s = stats.summarize(xs)
    assert (s.samples, s.median_us, s.min_us, s.max_us) == (6, 3.5, 1.0, 100.0)
    assert s.p10_us <= s.median_us <= s.p90_us


def test_bad_samples_are_rejected():
    with pytest.raises(ValueError):
        stats.summarize([])
    with pytest.raises(ValueError):
        stats.summarize([1.0, float("nan")])


def test_bootstrap_ci_is_deterministic_and_brackets_the_median():
    rng = np.random.default_rng(3)
    xs = rng.lognormal(mean=math.log(100.0), sigma=0.05, size=41)
    lo1, hi1 = stats.bootstrap_median_ci(xs)
    lo2, hi2 = stats.bootstrap_median_ci(xs)
    assert (lo1, hi1) == (lo2, hi2)  # fixed seed
    assert lo1 <= float(np.median(xs)) <= hi1
    assert lo1 < hi1


def test_bootstrap_ci_covers_true_median_at_about_nominal_rate():
    """Over repeated draws from a known skewed distribution, the 95 % CI of the median must
    contain the true median (exp(mu) for a lognormal) about 95 % of the time."""
    true_median = 50.0
    rng = np.random.default_rng(12345)
    reps, n = 300, 60
    hits = 0
    for _ in range(reps):
        xs = rng.lognormal(mean=math.log(true_median), sigma=0.2, size=n)
        lo, hi = stats.bootstrap_median_ci(xs, resamples=1000)
        hits += lo <= true_median <= hi
    coverage = hits / reps
    assert 0.88 <= coverage <= 0.99, coverage


def test_narrow_ci_for_wider_level_is_wider():
    xs = np.random.default_rng(1).normal(10.0, 1.0, size=200)
    lo90, hi90 = stats.bootstrap_median_ci(xs, level=0.90)
    lo99, hi99 = stats.bootstrap_median_ci(xs, level=0.99)
    assert lo99 <= lo90 and hi90 <= hi99


def _stream(rng: np.random.Generator, rsd: float, center: float = 100.0):
    while True:
        yield float(center * (1.0 + rsd * rng.standard_normal()))


def _run_rule(rule: stats.StopRule, rsd: float, seconds_per_sample: float):
    """Feed a synthetic stream through the rule with a simulated clock."""
    rng = np.random.default_rng(7)
    samples: list[float] = []
    gen = _stream(rng, rsd)
    while True:
        samples.append(next(gen))
        reason = stats.should_stop(samples, len(samples) * seconds_per_sample, rule)
        if reason is not stats.StopReason.CONTINUE:
            return reason, samples


def test_stopping_rule_stops_early_on_a_quiet_stream():
    rule = stats.StopRule(rsd_target=0.01, min_samples=10, max_seconds=1.0)
    reason, samples = _run_rule(rule, rsd=0.002, seconds_per_sample=0.001)
    assert reason is stats.StopReason.RSD_REACHED
    assert len(samples) == 10  # never before the minimum


def test_stopping_rule_hits_the_time_cap_on_a_noisy_stream():
    rule = stats.StopRule(rsd_target=0.01, min_samples=10, max_seconds=0.5)
    reason, samples = _run_rule(rule, rsd=0.5, seconds_per_sample=0.001)
    assert reason is stats.StopReason.TIME_CAP
    assert len(samples) == 500


def test_stopping_rule_respects_the_sample_cap():
    rule = stats.StopRule(rsd_target=1e-9, min_samples=2, max_seconds=1e9, max_samples=50)
    reason, samples = _run_rule(rule, rsd=0.1, seconds_per_sample=0.0)
    assert reason is stats.StopReason.SAMPLE_CAP and len(samples) == 50


def test_rsd_of_median_shrinks_with_more_samples():
    rng = np.random.default_rng(0)
    xs = rng.normal(100.0, 5.0, size=4000)
    few, many = stats.rsd_median(xs[:40]), stats.rsd_median(xs)
    assert many < few
    # sqrt(pi/2) * 0.05 / sqrt(4000) ~ 0.099 %
    assert many == pytest.approx(math.sqrt(math.pi / 2) * 0.05 / math.sqrt(4000), rel=0.15)
