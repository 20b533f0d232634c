"""Statistics of latency samples: the runner's stopping rule and what it reports.

numpy and the standard library only, so the GPU host can import it and the CPU
tests can check it on synthetic streams. All latencies are in microseconds.

The stopping rule follows nvbench's practice (ANCHORS.md): keep sampling until
the relative standard deviation is at or under a target, after a minimum number
of samples, or until a time cap. The relative standard deviation used is that
of the *median estimate*, from the robust spread (1.4826 * MAD) and the normal
approximation of the median's standard error (sqrt(pi/2) * sigma / sqrt(n)),
or that of the samples themselves, whichever reaches the target first.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kernaudit_pipeline.bench.rules import StopRule  # noqa: F401 - applied here, defined there

# sigma = 1.4826 * MAD for a normal distribution.
MAD_TO_SIGMA = 1.4826
# Standard error of the sample median of a normal: sqrt(pi / 2) * sigma / sqrt(n).
MEDIAN_SE_FACTOR = math.sqrt(math.pi / 2.0)
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0


class StopReason(enum.Enum):
    CONTINUE = "CONTINUE"
    RSD_REACHED = "RSD_REACHED"
    TIME_CAP = "TIME_CAP"
    SAMPLE_CAP = "SAMPLE_CAP"
    DEADLINE = "DEADLINE"  # the sweep's deadline ended the timing early (bench/sweep.py)


@dataclass(frozen=True)
class SampleSummary:
    """What the runner reports for one timed function."""

    samples: int
    median_us: float
    p10_us: float
    p90_us: float
    mean_us: float
    std_us: float
    min_us: float
    max_us: float
    rsd_samples: float
    rsd_median: float
    ci_low_us: float
    ci_high_us: float
    ci_level: float


def _array(samples: Sequence[float]) -> np.ndarray:
    x = np.asarray(samples, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError("need a non-empty 1-D sequence of samples")
    if not np.all(np.isfinite(x)):
        raise ValueError("samples must be finite")
    return x


def median(samples: Sequence[float]) -> float:
    return float(np.median(_array(samples)))


def percentile(samples: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, ``q`` in [0, 100]."""
    return float(np.percentile(_array(samples), q))


def rsd_samples(samples: Sequence[float]) -> float:
    """Sample standard deviation over the mean (inf with fewer than 2 samples)."""
    x = _array(samples)
    if x.size < 2:
        return math.inf
    mean = float(x.mean())
    return float(x.std(ddof=1)) / mean if mean > 0 else math.inf


def rsd_median(samples: Sequence[float]) -> float:
    """Relative standard error of the median, from the MAD (robust to the
    occasional slow sample that a mean-based figure would chase)."""
    x = _array(samples)
    if x.size < 2:
        return math.inf
    med = float(np.median(x))
    if med <= 0:
        return math.inf
    sigma = MAD_TO_SIGMA * float(np.median(np.abs(x - med)))
    return MEDIAN_SE_FACTOR * sigma / math.sqrt(x.size) / med


def bootstrap_median_ci(samples: Sequence[float], level: float = 0.95,
                        resamples: int = BOOTSTRAP_RESAMPLES,
                        seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """Percentile bootstrap CI of the median; a fixed seed makes reruns identical."""
    x = _array(samples)
    if not 0 < level < 1:
        raise ValueError("level must be in (0, 1)")
    if x.size == 1:
        return float(x[0]), float(x[0])
    rng = np.random.default_rng(seed)
    # Resample in chunks so that thousands of samples never build a huge index matrix.
    meds = np.empty(resamples, dtype=np.float64)
    chunk = max(1, 4_000_000 // x.size)
    for start in range(0, resamples, chunk):
        stop = min(resamples, start + chunk)
        idx = rng.integers(0, x.size, size=(stop - start, x.size))
        meds[start:stop] = np.median(x[idx], axis=1)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(meds, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def should_stop(samples: Sequence[float], elapsed_s: float, rule: StopRule) -> StopReason:
    """The stopping rule; ``elapsed_s`` is the wall time spent sampling so far."""
    n = len(samples)
    if n >= rule.max_samples:
        return StopReason.SAMPLE_CAP
    if n >= max(rule.min_samples, 2):
        if min(rsd_median(samples), rsd_samples(samples)) <= rule.rsd_target:
            return StopReason.RSD_REACHED
    if elapsed_s >= rule.max_seconds and n >= 1:
        return StopReason.TIME_CAP
    return StopReason.CONTINUE


def summarize(samples: Sequence[float], level: float = 0.95,
              resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> SampleSummary:
    x = _array(samples)
    lo, hi = bootstrap_median_ci(x, level=level, resamples=resamples, seed=seed)
    return SampleSummary(
        samples=int(x.size),
        median_us=float(np.median(x)),
        p10_us=float(np.percentile(x, 10)),
        p90_us=float(np.percentile(x, 90)),
        mean_us=float(x.mean()),
        std_us=float(x.std(ddof=1)) if x.size > 1 else 0.0,
        min_us=float(x.min()),
        max_us=float(x.max()),
        rsd_samples=rsd_samples(x) if x.size > 1 else math.inf,
        rsd_median=rsd_median(x) if x.size > 1 else math.inf,
        ci_low_us=lo,
        ci_high_us=hi,
        ci_level=level,
    )
