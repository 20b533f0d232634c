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
from kernaudit_pipeline.core.values import finite_float as _num

DEFAULT_NOISE_BAND = 0.02

# run_status values that mean "this config did not produce a trustworthy result"
FAILED_RUN_STATUSES = frozenset({
    "FAILED_CORRECTNESS", "CRASHED", "TIMEOUT", "OOM", "COMPILE_ERROR", "COMPILE_TIMEOUT", "ERROR",
})
# run_status values for configs that were not timed: pruned on purpose, or unable to
# launch (shared memory over the limit is a config to change, not an incorrect kernel)
SKIPPED_RUN_STATUSES = frozenset({"PRUNED_SPILL", "PRUNED_SMEM", "PRUNED", "NOT_RUN", "OUT_OF_RESOURCES"})


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


# Sources that describe a launch but time no baseline: their rows are evidence
# for the benchmark row of the same (kernel, shape, config), not candidates.
PROFILER_FORMATS = frozenset({"ncu_raw", "ncu_details", "torch_trace", "proton", "ptxas_log", "triton_cache"})
EVIDENCE_COLUMNS = (
    "local_spill_requests", "local_memory_bytes", "stall_lg_throttle_pct", "stall_long_scoreboard_pct",
    "sm_throughput_pct", "memory_throughput_pct", "achieved_occupancy_pct", "ncu_occupancy_limit_registers",
    "ncu_occupancy_limit_shared_mem", "ncu_occupancy_limit_warps", "ncu_occupancy_limit_blocks",
    "ncu_shared_mem_config_bytes",
)


class RowRole(StrEnum):
    CANDIDATE = "candidate"
    BASELINE = "baseline"
    PROFILER = "profiler"


def row_role(row: dict | pd.Series) -> RowRole:
    if str(row.get("source_format")) in PROFILER_FORMATS:
        return RowRole.PROFILER
    if str(row.get("config_id") or "").startswith("baseline"):
        return RowRole.BASELINE
    return RowRole.CANDIDATE


def merge_profiler_evidence(candidates: pd.DataFrame, profiler: pd.DataFrame) -> pd.DataFrame:
    """Fill a candidate's missing profiler columns from profiler rows of the same
    (kernel, shape, config); ``evidence_sources`` names the files used. Values
    the candidate already has are never overwritten."""
    out = candidates.copy()
    out["evidence_sources"] = None
    usable = profiler.dropna(subset=["config_id"]) if len(profiler) else profiler
    if out.empty or usable.empty:
        return out
    keys = ["kernel_name", "shape_name", "config_id"]
    columns = [c for c in EVIDENCE_COLUMNS if c in usable]
    # several launches of one config (warm-up, repeats): their median
    grouped = usable.groupby(keys, dropna=False)
    evidence = grouped[columns].median(numeric_only=True)
    sources = grouped["source_file"].agg(lambda s: ", ".join(sorted(set(map(str, s)))))
    index = pd.MultiIndex.from_frame(out[keys].astype(object))
    found = sources.reindex(index)
    for col in evidence.columns:
        fill = evidence[col].reindex(index).to_numpy()
        out[col] = out[col].where(out[col].notna(), fill)
    out["evidence_sources"] = found.to_numpy()
    return out


def build_comparisons(kernel_runs: pd.DataFrame, noise_band: float = DEFAULT_NOISE_BAND) -> pd.DataFrame:
    """One verdict per candidate row, with profiler evidence merged in.

    Baseline rows are the reference, not candidates; profiler rows (ncu,
    torch.profiler, Proton, ptxas, Triton cache) are evidence joined onto the
    candidate they describe. Both stay in ``kernel_runs``.
    """
    roles = kernel_runs.apply(row_role, axis=1) if len(kernel_runs) else pd.Series(dtype=object)
    candidates = kernel_runs[roles == RowRole.CANDIDATE] if len(kernel_runs) else kernel_runs
    profiler = kernel_runs[roles == RowRole.PROFILER] if len(kernel_runs) else kernel_runs
    candidates = merge_profiler_evidence(candidates.reset_index(drop=True), profiler)
    verdicts = [compare_row(row, noise_band) for _, row in candidates.iterrows()]
    out = candidates.copy()
    out["speedup"] = [v.speedup for v in verdicts]
    out["speedup_ci_low"] = [v.speedup_ci_low for v in verdicts]
    out["speedup_ci_high"] = [v.speedup_ci_high for v in verdicts]
    out["pct_change"] = [v.pct_change for v in verdicts]
    out["status"] = [str(v.status) for v in verdicts]
    out["status_reason"] = [v.reason for v in verdicts]
    for col in ("speedup", "speedup_ci_low", "speedup_ci_high", "pct_change"):
        out[col] = pd.to_numeric(out[col], errors="coerce").astype(float)
    return out
