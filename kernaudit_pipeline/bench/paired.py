"""Statistics of paired timing: the speedup, its confidence interval, and when to stop.

A candidate and its reference are timed in *pairs*: two samples back to back, in random order,
each after an L2 flush, so both see the same clock, temperature and power state. The pairs are
grouped in short *blocks*; the worker interleaves the blocks of every config of a shape, so one
config's blocks are spread over the whole time the shape is timed (seconds, not milliseconds).

- The speedup is exp(median over all kept pairs of log(reference / candidate)).
- Its 95 % CI is a cluster bootstrap over blocks: resample whole blocks with replacement and
  take the median of the pooled pair log-ratios. Variation between blocks (the windows) is
  what the interval measures, not the spread of samples inside one window.
- That interval is widened, in quadrature on the log scale, by a between-run component
  ``z * between_run_rsd``: what moves a paired ratio from one process (or card) to the next
  even when each run is internally tight. Its default is calibrated from the committed repeat
  captures by ``scripts/analyze_repeats.py`` (docs/benchmarks.md says how).

numpy and the standard library only; tested on recorded samples on the CPU.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from kernaudit_pipeline.bench.calibration import BETWEEN_RUN_RSD
from kernaudit_pipeline.bench.rules import PairedRule  # noqa: F401 - applied here, defined there
from kernaudit_pipeline.bench.stats import MAD_TO_SIGMA, StopReason
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0


@dataclass(frozen=True)
class PairedSummary:
    speedup: float
    ci_low: float
    ci_high: float
    ci_level: float
    pairs: int
    blocks: int
    block_speedups: tuple[float, ...]
    boot_ci_low: float
    boot_ci_high: float
    between_run_rsd: float
    rsd_blocks: float  # standard error of the mean block log-speedup


def log_ratios(candidate_us: Sequence[float], reference_us: Sequence[float]) -> np.ndarray:
    c = np.asarray(candidate_us, dtype=np.float64)
    r = np.asarray(reference_us, dtype=np.float64)
    if c.shape != r.shape or c.ndim != 1 or c.size == 0:
        raise ValueError("need two equally long, non-empty 1-D sample sequences")
    if not (np.all(np.isfinite(c)) and np.all(np.isfinite(r)) and np.all(c > 0) and np.all(r > 0)):
        raise ValueError("samples must be finite and positive")
    return np.log(r / c)


def _groups(values: np.ndarray, block_ids: Sequence[int]) -> list[np.ndarray]:
    ids = np.asarray(block_ids)
    if ids.shape != values.shape:
        raise ValueError("one block id per pair")
    return [values[ids == b] for b in dict.fromkeys(ids.tolist())]


def block_se(block_log_medians: Sequence[float]) -> float:
    """Standard error of the mean block log-speedup (inf with fewer than 2 blocks)."""
    x = np.asarray(block_log_medians, dtype=np.float64)
    if x.size < 2:
        return math.inf
    return float(x.std(ddof=1) / math.sqrt(x.size))


OUTLIER_SIGMAS = 3.5  # a block this many robust sigmas from the median block is an outlier


def robust_block_se(block_log_medians: Sequence[float]) -> float:
    """The stop rule's precision: :func:`block_se` of the blocks that are not outliers (more
    than ``OUTLIER_SIGMAS`` x 1.4826 x MAD from the median block); inf with fewer than 2
    blocks, or when the outliers are not a minority.

    The same as :func:`block_se` for well-behaved blocks, but a minority of outlying blocks
    does not hold it up, just as it does not move the estimate (the median of the pooled
    pairs) or its block bootstrap. On the H200 (2026-12-04, swiglu_gemm at M=16) a single
    block disturbed by a host-side launch delay (0.83 against 1.16 for the other 39 blocks)
    kept the mean-based error above the 0.4 % target for all 40 blocks, so hundreds of configs
    ran to the block cap; with this rule they stop once the other blocks agree, while a
    config whose blocks keep disagreeing still runs to the cap.
    """
    x = np.asarray(block_log_medians, dtype=np.float64)
    if x.size < 2:
        return math.inf
    center = float(np.median(x))
    mad = float(np.median(np.abs(x - center)))
    if mad == 0.0:
        return block_se(x)
    kept = x[np.abs(x - center) <= OUTLIER_SIGMAS * MAD_TO_SIGMA * mad]
    if kept.size < max(2, x.size // 2 + 1):
        return math.inf
    return block_se(kept)


def summarize_pairs(candidate_us: Sequence[float], reference_us: Sequence[float],
                    block_ids: Sequence[int], *, between_run_rsd: float = BETWEEN_RUN_RSD,
                    level: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES,
                    seed: int = BOOTSTRAP_SEED) -> PairedSummary:
    """The paired speedup (reference time / candidate time) and its widened CI."""
    if not 0 < level < 1:
        raise ValueError("level must be in (0, 1)")
    if between_run_rsd < 0:
        raise ValueError("between_run_rsd must be >= 0")
    r = log_ratios(candidate_us, reference_us)
    groups = _groups(r, block_ids)
    point = float(np.median(r))
    rng = np.random.default_rng(seed)
    alpha = (1.0 - level) / 2.0
    if len(groups) >= 2:
        idx = rng.integers(0, len(groups), size=(resamples, len(groups)))
        boot = np.array([np.median(np.concatenate([groups[j] for j in row])) for row in idx])
    elif r.size >= 2:  # one block: only the pairs inside it can be resampled
        idx = rng.integers(0, r.size, size=(resamples, r.size))
        boot = np.median(r[idx], axis=1)
    else:
        boot = np.array([point])
    lo, hi = np.quantile(boot, [alpha, 1.0 - alpha])
    z = NormalDist().inv_cdf(1.0 - alpha)
    extra = z * between_run_rsd
    below = math.hypot(point - float(lo), extra)
    above = math.hypot(float(hi) - point, extra)
    block_medians = [float(np.median(g)) for g in groups]
    return PairedSummary(
        speedup=math.exp(point), ci_low=math.exp(point - below), ci_high=math.exp(point + above),
        ci_level=level, pairs=int(r.size), blocks=len(groups),
        block_speedups=tuple(math.exp(m) for m in block_medians),
        boot_ci_low=math.exp(float(lo)), boot_ci_high=math.exp(float(hi)),
        between_run_rsd=between_run_rsd, rsd_blocks=block_se(block_medians))


def should_stop(block_log_medians: Sequence[float], timed_s: float, elapsed_s: float,
                rule: PairedRule) -> StopReason:
    """After each block: keep going, or why to stop."""
    n = len(block_log_medians)
    if n >= rule.max_blocks:
        return StopReason.SAMPLE_CAP
    if n >= max(rule.min_blocks, 2) and timed_s >= rule.min_time_s:
        if robust_block_se(block_log_medians) <= rule.rsd_target:
            return StopReason.RSD_REACHED
    if elapsed_s >= rule.max_seconds and n >= 2:
        return StopReason.TIME_CAP
    return StopReason.CONTINUE


def pairs_per_block(candidate_us: float, reference_us: float, flush_us: float,
                    rule: PairedRule) -> int:
    """Pairs that fill about ``rule.block_s`` of GPU time, within the rule's bounds."""
    pair_s = max((candidate_us + reference_us + 2.0 * flush_us) * 1e-6, 1e-7)
    return int(min(rule.max_pairs, max(rule.min_pairs, round(rule.block_s / pair_s))))


def order_bits(rng: np.random.Generator, pairs: int) -> list[bool]:
    """True where the candidate runs first in a pair: random, one draw per pair."""
    return [bool(b) for b in rng.integers(0, 2, size=pairs)]
