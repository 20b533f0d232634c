"""The ``comparisons`` stage: candidate against baseline, with a verdict.

speedup = baseline_us / latency_us (> 1 means the candidate is faster), the
TritonBench convention. The status is decided by documented rules:

1. INCONCLUSIVE when the latency or the baseline is missing, non-positive
   or NaN: nothing can be said.
2. FAILED when the run is incorrect or did not complete: a fast wrong
   kernel is never IMPROVED.
3. NEUTRAL when the speedup lies inside the noise band (default ±2 %).
4. With confidence intervals on both latencies, IMPROVED or REGRESSION only
   when the speedup interval excludes 1.0; otherwise INCONCLUSIVE.
5. Without intervals (seed-format rows), the point estimate decides.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

import pandas as pd

DEFAULT_NOISE_BAND = 0.02

# run_status values that mean "this config did not produce a trustworthy result"
FAILED_RUN_STATUSES = frozenset({
    "FAILED_CORRECTNESS", "CRASHED", "TIMEOUT", "OOM", "COMPILE_ERROR",
    "COMPILE_TIMEOUT", "OUT_OF_RESOURCES", "ERROR",
})
# run_status values for configs that were deliberately not timed
SKIPPED_RUN_STATUSES = frozenset({"PRUNED_SPILL", "PRUNED_SMEM", "PRUNED", "NOT_RUN"})


class Status(StrEnum):
    IMPROVED = "IMPROVED"
    REGRESSION = "REGRESSION"
    NEUTRAL = "NEUTRAL"
    FAILED = "FAILED"
    INCONCLUSIVE = "INCONCLUSIVE"


@dataclass(frozen=True)
class Verdict:
    status: Status
    reason: str
    speedup: float | None
    speedup_ci_low: float | None = None
    speedup_ci_high: float | None = None

    @property
    def pct_change(self) -> float | None:
        """Percentage speedup (+) or regression (−) of the candidate."""
        return None if self.speedup is None else (self.speedup - 1.0) * 100.0


def _num(value: object) -> float | None:
    """A finite float, or None for anything missing, non-numeric or NaN."""
    if value is None or isinstance(value, bool):
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def compare(
    latency_us: object,
    baseline_us: object,
    *,
    correct: object = None,
    run_status: object = None,
    latency_ci_us: tuple[object, object] | None = None,
    baseline_ci_us: tuple[object, object] | None = None,
    noise_band: float = DEFAULT_NOISE_BAND,
) -> Verdict:
    lat, base = _num(latency_us), _num(baseline_us)
    status_text = None if run_status is None or (isinstance(run_status, float) and math.isnan(run_status)) else str(run_status)
    if status_text in SKIPPED_RUN_STATUSES:
        return Verdict(Status.INCONCLUSIVE, f"not timed ({status_text})", None)
    if status_text in FAILED_RUN_STATUSES:
        return Verdict(Status.FAILED, f"run did not complete correctly ({status_text})", None)
    if correct is False or (correct is not None and not pd.isna(correct) and not bool(correct)):
        return Verdict(Status.FAILED, "output does not match the reference", None)
    if lat is None or lat <= 0:
        return Verdict(Status.INCONCLUSIVE, f"invalid latency_us ({latency_us!r})", None)
    if base is None or base <= 0:
        return Verdict(Status.INCONCLUSIVE, f"invalid baseline_us ({baseline_us!r})", None)
    speedup = base / lat
    lo = hi = None
    if latency_ci_us and baseline_ci_us:
        lat_lo, lat_hi = (_num(v) for v in latency_ci_us)
        base_lo, base_hi = (_num(v) for v in baseline_ci_us)
        if None not in (lat_lo, lat_hi, base_lo, base_hi) and lat_lo > 0 and lat_hi > 0:
            lo, hi = base_lo / lat_hi, base_hi / lat_lo
    if abs(speedup - 1.0) <= noise_band:
        return Verdict(Status.NEUTRAL, f"speedup {speedup:.3f} inside the ±{noise_band:.0%} noise band",
                       speedup, lo, hi)
    if lo is not None and hi is not None and lo <= 1.0 <= hi:
        return Verdict(Status.INCONCLUSIVE,
                       f"speedup {speedup:.3f} but its 95% interval [{lo:.3f}, {hi:.3f}] includes 1.0",
                       speedup, lo, hi)
    if speedup > 1.0:
        return Verdict(Status.IMPROVED, f"{(speedup - 1) * 100:.1f}% faster than the baseline", speedup, lo, hi)
    return Verdict(Status.REGRESSION, f"{(1 - speedup) * 100:.1f}% slower than the baseline", speedup, lo, hi)


def compare_row(row: dict | pd.Series, noise_band: float = DEFAULT_NOISE_BAND) -> Verdict:
    get = row.get
    return compare(
        get("latency_us"), get("baseline_us"),
        correct=get("correct"), run_status=get("run_status"),
        latency_ci_us=(get("latency_ci_low_us"), get("latency_ci_high_us")),
        baseline_ci_us=(get("baseline_ci_low_us"), get("baseline_ci_high_us")),
        noise_band=noise_band,
    )


def build_comparisons(kernel_runs: pd.DataFrame, noise_band: float = DEFAULT_NOISE_BAND) -> pd.DataFrame:
    """One verdict per kernel_runs row, keeping the row's columns beside it."""
    verdicts = [compare_row(row, noise_band) for _, row in kernel_runs.iterrows()]
    out = kernel_runs.copy()
    out["speedup"] = [v.speedup for v in verdicts]
    out["speedup_ci_low"] = [v.speedup_ci_low for v in verdicts]
    out["speedup_ci_high"] = [v.speedup_ci_high for v in verdicts]
    out["pct_change"] = [v.pct_change for v in verdicts]
    out["status"] = [str(v.status) for v in verdicts]
    out["status_reason"] = [v.reason for v in verdicts]
    for col in ("speedup", "speedup_ci_low", "speedup_ci_high", "pct_change"):
        out[col] = pd.to_numeric(out[col], errors="coerce").astype(float)
    return out
