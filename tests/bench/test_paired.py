"""Paired timing statistics and the clock guard, on recorded H200 samples and scripted clocks."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from kernaudit_pipeline.bench import paired
from kernaudit_pipeline.bench.clocks import BlockClocks, ClockGuard, ClockSample, clock_stats, reason_names
from kernaudit_pipeline.bench.records import read_jsonl
from kernaudit_pipeline.bench.stats import StopReason
from kernaudit_pipeline.bench.timing import FakeCpuBackend, PairedSession, Timed
from kernaudit_pipeline.core.verdicts import TimingMode

# a committed H200 capture from before paired timing (it stays as it is when new captures land)
SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "h200" / "bench_h200_gemm_noprune.jsonl"


def _recorded(config_id: str, shape: str = "llama3_8b_qkv_prefill") -> np.ndarray:
    for r in read_jsonl(SAMPLE.read_text()):
        if (r.get("kernel_name"), r.get("shape_name"), r.get("config_id")) == ("gemm_bf16", shape, config_id):
            return np.asarray(r["samples_us"], dtype=float)
    raise KeyError(config_id)


def _drifting_pairs(true_speedup: float, blocks: int, pairs: int, seed: int):
    """Recorded H200 sample noise, with a clock factor per block shared by both sides of a
    pair (what pairing cancels) and a drift between blocks of up to 15 %."""
    rng = np.random.default_rng(seed)
    noise = _recorded("baseline")
    noise = noise / np.median(noise)
    cand, ref, ids = [], [], []
    for b in range(blocks):
        clock = 1.0 + 0.15 * rng.random()
        for _ in range(pairs):
            c = 600.0 * clock * rng.choice(noise)
            r = 600.0 * true_speedup * clock * rng.choice(noise)
            cand.append(c)
            ref.append(r)
            ids.append(b)
    return cand, ref, ids


def test_pairing_recovers_the_speedup_under_clock_drift():
    cand, ref, ids = _drifting_pairs(0.98, blocks=8, pairs=12, seed=1)
    s = paired.summarize_pairs(cand, ref, ids, between_run_rsd=0.0)
    assert s.pairs == 96 and s.blocks == 8 and len(s.block_speedups) == 8
    assert s.speedup == pytest.approx(0.98, rel=0.005)
    assert s.ci_low <= s.speedup <= s.ci_high and s.ci_high / s.ci_low < 1.01  # the drift cancels
    wide = paired.summarize_pairs(cand, ref, ids)  # with the default between-run component
    assert wide.ci_low < 0.98 < wide.ci_high
    # timing the two sides in different windows would have seen the drift instead
    unpaired = np.median(ref[:48]) / np.median(cand[48:])
    assert abs(unpaired - 0.98) > abs(s.speedup - 0.98)


def test_between_run_component_widens_in_quadrature():
    cand, ref, ids = _drifting_pairs(1.05, blocks=6, pairs=10, seed=2)
    tight = paired.summarize_pairs(cand, ref, ids, between_run_rsd=0.0)
    wide = paired.summarize_pairs(cand, ref, ids, between_run_rsd=0.01)
    assert (tight.boot_ci_low, tight.boot_ci_high) == (wide.boot_ci_low, wide.boot_ci_high)
    assert wide.ci_low < tight.ci_low and wide.ci_high > tight.ci_high
    below = math.log(wide.speedup) - math.log(wide.ci_low)
    boot_below = math.log(wide.speedup) - math.log(wide.boot_ci_low)
    assert below == pytest.approx(math.hypot(boot_below, 1.959964 * 0.01), rel=1e-6)


def test_calibrated_ci_covers_other_runs_medians():
    """Runs that each carry an offset of 0.6 % (the between-run spread): a 95 % CI widened by
    that amount holds another run's median far more often than 80 % of the time (the issue's
    coverage target); without the widening it does not."""
    rng = np.random.default_rng(7)
    runs = []
    for i in range(40):
        offset = math.exp(rng.normal(0.0, 0.006))
        cand, ref, ids = _drifting_pairs(0.95 * offset, blocks=6, pairs=10, seed=100 + i)
        runs.append((cand, ref, ids))
    wide = [paired.summarize_pairs(*r, between_run_rsd=0.006, resamples=400) for r in runs]
    narrow = [paired.summarize_pairs(*r, between_run_rsd=0.0, resamples=400) for r in runs]

    def coverage(sums):
        hits = total = 0
        for i, a in enumerate(sums):
            for j, b in enumerate(sums):
                if i != j:
                    total += 1
                    hits += a.ci_low <= b.speedup <= a.ci_high
        return hits / total

    assert coverage(wide) >= 0.8 > coverage(narrow)


def test_single_block_and_bad_input():
    s = paired.summarize_pairs([100.0, 101.0, 99.0], [110.0, 111.0, 109.0], [0, 0, 0], between_run_rsd=0.0)
    assert s.blocks == 1 and s.speedup == pytest.approx(1.1, rel=0.01) and math.isinf(s.rsd_blocks)
    with pytest.raises(ValueError):
        paired.summarize_pairs([1.0, -1.0], [1.0, 1.0], [0, 0])
    with pytest.raises(ValueError):
        paired.summarize_pairs([1.0], [1.0, 2.0], [0])


def test_stop_rule_needs_blocks_time_and_precision():
    rule = paired.PairedRule(min_blocks=4, max_blocks=10, min_time_s=0.1, max_seconds=1.0, rsd_target=0.004)
    steady = [0.0, 0.001, -0.001, 0.0005]
    assert paired.should_stop(steady[:3], 1.0, 0.1, rule) is StopReason.CONTINUE      # too few blocks
    assert paired.should_stop(steady, 0.05, 0.1, rule) is StopReason.CONTINUE         # too little time
    assert paired.should_stop(steady, 0.2, 0.1, rule) is StopReason.RSD_REACHED
    noisy = [0.0, 0.05, -0.05, 0.04]
    assert paired.should_stop(noisy, 0.2, 0.1, rule) is StopReason.CONTINUE
    assert paired.should_stop(noisy, 0.2, 1.5, rule) is StopReason.TIME_CAP
    assert paired.should_stop(noisy * 3, 0.2, 0.1, rule) is StopReason.SAMPLE_CAP
    assert paired.pairs_per_block(600.0, 600.0, 90.0, paired.PairedRule()) == 11
    assert paired.pairs_per_block(5.0, 5.0, 0.0, paired.PairedRule()) == 64
    assert paired.pairs_per_block(5e4, 5e4, 0.0, paired.PairedRule()) == 4


# --------------------------------------------------------------------------------------------
# the clock guard
# --------------------------------------------------------------------------------------------
def test_guard_threshold_and_reasons():
    guard = ClockGuard(max_mhz=1980.0)
    assert guard.threshold_mhz == pytest.approx(1485.0)
    assert guard.keep((ClockSample(1980.0), ClockSample(1755.0)))
    assert not guard.keep((ClockSample(1980.0), ClockSample(1440.0)))  # ANCHORS: 1,440 MHz seen
    assert guard.keep((None, None)) and ClockGuard(None).keep((ClockSample(300.0),))
    assert reason_names(0x4 | 0x20) == ("sw_power_cap", "sw_thermal_slowdown")
    assert reason_names(0x4000) == ("0x4000",)
    stats = clock_stats([BlockClocks((ClockSample(1980.0, 0x1), ClockSample(1900.0)), True, 20),
                         BlockClocks((ClockSample(1440.0, 0x4), ClockSample(1500.0)), False, 20)], guard)
    assert (stats.min_mhz, stats.max_mhz, stats.discarded_samples) == (1440.0, 1980.0, 20)
    assert stats.throttle_reasons == ("sw_power_cap",) and stats.note is None
    assert "NVML" in clock_stats([], ClockGuard(None)).note


class ScriptedClock(FakeCpuBackend):
    """The CPU test double with recorded clock readings: every third block sags to 1,440 MHz."""

    def __init__(self):
        super().__init__()
        self.guard = ClockGuard(1980.0)
        self.reads = 0

    def read_clock(self):
        self.reads += 1
        block = (self.reads - 1) // 2
        return ClockSample(1440.0 if block % 3 == 2 else 1980.0)


def test_session_discards_blocks_below_the_clock_threshold():
    backend = ScriptedClock()
    x = np.ones(20000)
    cand = Timed(lambda: x * 2.0, 1, TimingMode.EVENTS)
    ref = Timed(lambda: (x * 2.0).sum(), 1, TimingMode.EVENTS)
    rule = paired.PairedRule(min_blocks=6, max_blocks=9, min_pairs=3, max_pairs=3, min_time_s=0.0, rsd_target=0.0)
    session = PairedSession(cand, ref, backend, rule, np.random.default_rng(0), between_run_rsd=0.006)
    backend.reads = 0
    while not session.done:
        session.run_block()
    result = session.result()
    assert session.reason is StopReason.SAMPLE_CAP and len(session.clocks) == 13
    discarded = sum(not b.kept for b in session.clocks)
    assert discarded == 4 and result.clocks.discarded_samples == discarded * 6
    assert result.speedup.blocks == 9 and result.speedup.pairs == 27
    assert result.clocks.min_mhz == 1440.0 and result.clocks.threshold_mhz == pytest.approx(1485.0)


# --------------------------------------------------------------------------------------------
# the queue lead: the host out of the timed region
# --------------------------------------------------------------------------------------------
def _starved(calls: int, host_us: float, gpu_us: float, lead_us: float) -> int:
    """Calls the GPU had to wait for: the host finishes enqueuing call k at (k+1)·host_us; the
    GPU starts after ``lead_us`` and runs each call in ``gpu_us`` once it is enqueued."""
    free = lead_us
    waits = 0
    for k in range(calls):
        ready = (k + 1) * host_us
        waits += ready > free
        free = max(free, ready) + gpu_us
    return waits


@pytest.mark.parametrize("host_us,gpu_us", [(30.0, 700.0), (150.0, 140.0), (350.0, 250.0), (700.0, 250.0)])
def test_the_queue_lead_keeps_the_host_ahead_of_the_gpu(host_us, gpu_us):
    """The paged-decode case: a 67 µs kernel plus its 67 µs flush against a host that needs
    100-350 µs per launch. Without a lead the GPU waits (and its events time the host); with the
    lead sized from the host's own time it never does, even when the host is 20 % slower than
    measured."""
    from kernaudit_pipeline.bench.timing import queue_lead_us

    calls = 54
    assert host_us < gpu_us or _starved(calls, host_us, gpu_us, 0.0) > calls // 2
    lead = queue_lead_us(calls, host_us, gpu_us)
    assert _starved(calls, host_us, gpu_us, lead) == 0
    assert _starved(calls, 1.2 * host_us, gpu_us, lead) == 0
    if host_us < gpu_us:  # a fast host costs a short lead, whatever the block's length
        assert lead == queue_lead_us(4 * calls, host_us, gpu_us) < 3 * host_us + 100


def test_the_queue_lead_is_capped_and_follows_the_host():
    from kernaudit_pipeline.bench.timing import LEAD_CAP_US, QueueLead, queue_lead_us

    assert queue_lead_us(0, 100.0, 10.0) == 0.0
    assert queue_lead_us(64, 1e5, 10.0) == 5000.0  # never beyond three blocks of GPU work (5 ms floor)
    assert queue_lead_us(10_000, 1e4, 1e3) == LEAD_CAP_US

    class Host:
        flush_us = 10.0
        last_enqueue_us = 0.0

    q = QueueLead(host_us=100.0, gpu_us=200.0)
    first = q.next(8)
    Host.last_enqueue_us = 8 * 400.0  # the host slowed down: followed at once
    q.learn(Host, [190.0] * 8)
    assert q.host_us == 400.0 and q.gpu_us == 200.0 and q.next(8) > first
    Host.last_enqueue_us = 8 * 10.0  # and sped up: followed by halves
    q.learn(Host, [190.0] * 8)
    assert q.host_us == 200.0
    assert q.median_us == float(np.median(q.leads_us))


def test_session_and_single_timing_ask_for_a_lead_and_record_the_host_launch():
    from kernaudit_pipeline.bench import stats
    from kernaudit_pipeline.bench.timing import time_single

    backend = FakeCpuBackend()
    x = np.ones(20000)
    cand = Timed(lambda: x * 2.0, 1, TimingMode.EVENTS)
    ref = Timed(lambda: (x * 2.0).sum(), 1, TimingMode.EVENTS)
    rule = paired.PairedRule(min_blocks=3, max_blocks=3, min_pairs=3, max_pairs=3, min_time_s=0.0, rsd_target=0.0)
    session = PairedSession(cand, ref, backend, rule, np.random.default_rng(0), between_run_rsd=0.006)
    backend.leads_us.clear()
    while not session.done:
        session.run_block()
    result = session.result()
    assert len(backend.leads_us) == 3 and all(lead > 0 for lead in backend.leads_us)
    assert result.host_launch_us > 0 and result.reference_host_launch_us > 0
    assert result.queue_lead_us == pytest.approx(float(np.median(backend.leads_us)))
    single = time_single(cand.fn, backend, stats.StopRule(rsd_target=1.0, min_samples=2, max_seconds=0.05))
    assert single.host_launch_us > 0 and single.queue_lead_us > 0
