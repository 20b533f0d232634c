"""The ``comparisons`` stage: candidate against baseline, with a verdict that says what happened.

speedup = baseline_us / latency_us (> 1 means the candidate is faster), the TritonBench
convention. When the runner timed the candidate and its baseline interleaved in the same window
it writes the paired ``speedup`` and its interval itself; that paired figure is used as is
(``speedup_source = "paired"``). Otherwise the speedup is derived from the two medians and its
interval from the two latency intervals (``"unpaired"``): they were timed at different moments,
so their ratio moves with the clock and the power state between the two.

The status is decided by documented rules, first match wins:

1. Configs that were never timed say why: PRUNED_SPILL (pruned because the static compile
   spills), OUT_OF_RESOURCES (shared memory or registers over the device's limit), NOT_RUN.
2. FAILED when the run is incorrect or did not complete: a fast wrong kernel is never IMPROVED.
3. INCONCLUSIVE only for a missing or invalid measurement: a latency or baseline that is missing,
   not a number, non-positive, or outside physical bounds (under 1 ns or over 1 h), or a paired
   interval that does not bracket its own speedup.
4. NEUTRAL when the speedup lies inside the noise band (default ±2 %).
5. NOISY when the speedup's interval straddles 1.0 although the point estimate is outside the
   band: the difference is real-looking but not established.
6. IMPROVED or REGRESSION otherwise (the seed's rows, with no interval, decide on the point).

Every row also gets ``data_kind``: ``measured`` (a GPU timed it), ``modelled`` (the synthetic
generator) or ``predicted`` (the static cost model), from the row itself or its source format.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import pandas as pd

from kernaudit_pipeline.core.values import finite_float as _num
from kernaudit_pipeline.core.values import is_missing
from kernaudit_pipeline.core.verdicts import FAILED_RUN_STATUSES as _FAILED
from kernaudit_pipeline.core.verdicts import DataKind, RunStatus, Status
from kernaudit_pipeline.kernel_runs import MAX_LATENCY_US, MIN_LATENCY_US

DEFAULT_NOISE_BAND = 0.02
# Physical bounds of one kernel launch (1 ns to 1 h): kernel_runs' schema holds them.

# run_status values that mean "this config did not produce a trustworthy result"
FAILED_RUN_STATUSES = frozenset(str(s) for s in _FAILED)
# run_status values for configs that were not timed, and the status each becomes
NOT_TIMED: dict[str, Status] = {
    RunStatus.PRUNED_SPILL: Status.PRUNED_SPILL,
    RunStatus.PRUNED_SMEM: Status.OUT_OF_RESOURCES,
    RunStatus.OUT_OF_RESOURCES: Status.OUT_OF_RESOURCES,
    RunStatus.NOT_RUN: Status.NOT_RUN,
    "PRUNED": Status.NOT_RUN,
}
SKIPPED_RUN_STATUSES = frozenset(NOT_TIMED)
NOT_TIMED_REASONS = {
    Status.PRUNED_SPILL: "pruned before timing: the static compile spills registers",
    Status.OUT_OF_RESOURCES: "cannot launch: over the device's shared memory or register limit",
    Status.NOT_RUN: "not run",
}
# Statuses of a row that was timed correctly (eligible to be ranked).
TIMED_STATUSES = frozenset({Status.IMPROVED, Status.REGRESSION, Status.NEUTRAL, Status.NOISY})
# source_format -> data kind, where a row does not say
_SOURCE_KIND = {"synthetic": DataKind.MODELLED, "rank": DataKind.PREDICTED, "predicted": DataKind.PREDICTED}


class SpeedupSource(StrEnum):
    PAIRED = "paired"      # candidate and baseline interleaved in one window (the runner's own figure)
    UNPAIRED = "unpaired"  # the ratio of two medians timed at different moments


@dataclass(frozen=True)
class Verdict:
    status: Status
    reason: str
    speedup: float | None
    speedup_ci_low: float | None = None
    speedup_ci_high: float | None = None
    source: SpeedupSource | None = None

    @property
    def pct_change(self) -> float | None:
        """Percentage speedup (+) or regression (−) of the candidate."""
        return None if self.speedup is None else (self.speedup - 1.0) * 100.0


def _bad_time(value: object, name: str) -> str | None:
    """Why a latency cannot be used, or None."""
    v = _num(value)
    if v is None and name == "baseline_us" and is_missing(value):
        return "no baseline: the source timed none for this kernel"
    if v is None:
        return f"invalid {name} ({value!r})"
    if v <= 0:
        return f"invalid {name} ({v!r}): not positive"
    if v < MIN_LATENCY_US or v > MAX_LATENCY_US:
        return (f"{name} {v:.3g} us is outside physical bounds ({MIN_LATENCY_US:g} us to "
                f"{MAX_LATENCY_US:.3g} us)")
    return None


def data_kind_of(row: dict | pd.Series) -> DataKind:
    """The row's own ``data_kind`` when valid, else what its source format implies."""
    value = row.get("data_kind")
    if not is_missing(value):
        try:
            return DataKind(str(value).strip().lower())
        except ValueError:
            pass
    return _SOURCE_KIND.get(str(row.get("source_format") or ""), DataKind.MEASURED)


def _paired(speedup: object, ci_low: object, ci_high: object, pairs: object) -> tuple[float, float | None, float | None] | None:
    """The runner's paired speedup, when the row carries one (a CI or a pair count says it was
    timed paired; a bare ``speedup`` field in a seed item is not trusted over the latencies)."""
    s, lo, hi = _num(speedup), _num(ci_low), _num(ci_high)
    if s is None or (lo is None or hi is None) and not (_num(pairs) or 0) > 0:
        return None
    return s, lo, hi


def compare(
    latency_us: object,
    baseline_us: object,
    *,
    correct: object = None,
    run_status: object = None,
    latency_ci_us: tuple[object, object] | None = None,
    baseline_ci_us: tuple[object, object] | None = None,
    paired_speedup: tuple[object, object, object] | None = None,
    timing_pairs: object = None,
    noise_band: float = DEFAULT_NOISE_BAND,
) -> Verdict:
    status_text = None if is_missing(run_status) else str(run_status)
    if status_text in NOT_TIMED:
        status = NOT_TIMED[status_text]
        return Verdict(status, f"{NOT_TIMED_REASONS[status]} ({status_text})", None)
    if status_text in FAILED_RUN_STATUSES:
        return Verdict(Status.FAILED, f"run did not complete correctly ({status_text})", None)
    if correct is not None and not is_missing(correct) and not bool(correct):
        return Verdict(Status.FAILED, "output does not match the reference", None)
    problem = _bad_time(latency_us, "latency_us")
    paired = _paired(*(paired_speedup or (None, None, None)), timing_pairs)
    if problem is None and paired is None:
        problem = _bad_time(baseline_us, "baseline_us")
    if problem:
        return Verdict(Status.INCONCLUSIVE, problem, None)
    if paired is not None:
        speedup, lo, hi = paired
        source = SpeedupSource.PAIRED
        if speedup <= 0 or (lo is not None and hi is not None and not lo <= speedup <= hi):
            return Verdict(Status.INCONCLUSIVE, f"invalid paired speedup {speedup!r} with interval "
                           f"[{lo!r}, {hi!r}]", None)
    else:
        speedup = float(_num(baseline_us)) / float(_num(latency_us))
        source = SpeedupSource.UNPAIRED
        lo = hi = None
        if latency_ci_us and baseline_ci_us:
            lat_lo, lat_hi = (_num(v) for v in latency_ci_us)
            base_lo, base_hi = (_num(v) for v in baseline_ci_us)
            if None not in (lat_lo, lat_hi, base_lo, base_hi) and lat_lo > 0 and lat_hi > 0:
                lo, hi = base_lo / lat_hi, base_hi / lat_lo
    if abs(speedup - 1.0) <= noise_band:
        return Verdict(Status.NEUTRAL, f"speedup {speedup:.3f} inside the ±{noise_band:.0%} noise band",
                       speedup, lo, hi, source)
    if lo is not None and hi is not None and lo <= 1.0 <= hi:
        return Verdict(Status.NOISY,
                       f"speedup {speedup:.3f} but its 95% interval [{lo:.3f}, {hi:.3f}] includes 1.0",
                       speedup, lo, hi, source)
    if speedup > 1.0:
        return Verdict(Status.IMPROVED, f"{(speedup - 1) * 100:.1f}% faster than the baseline", speedup, lo, hi,
                       source)
    return Verdict(Status.REGRESSION, f"{(1 - speedup) * 100:.1f}% slower than the baseline", speedup, lo, hi,
                   source)


def compare_row(row: dict | pd.Series, noise_band: float = DEFAULT_NOISE_BAND) -> Verdict:
    get = row.get
    return compare(
        get("latency_us"), get("baseline_us"),
        correct=get("correct"), run_status=get("run_status"),
        latency_ci_us=(get("latency_ci_low_us"), get("latency_ci_high_us")),
        baseline_ci_us=(get("baseline_ci_low_us"), get("baseline_ci_high_us")),
        paired_speedup=(get("speedup"), get("speedup_ci_low"), get("speedup_ci_high")),
        timing_pairs=get("timing_pairs"),
        noise_band=noise_band,
    )


def status_counts(frame: pd.DataFrame) -> dict[str, int]:
    """Rows per status, every status listed (zeros too); the counts sum to ``len(frame)``."""
    counts = {str(s): 0 for s in Status}
    if len(frame) and "status" in frame:
        for value, n in frame["status"].astype(str).value_counts().items():
            counts[value] = counts.get(value, 0) + int(n)
    return counts


# Sources that describe a launch but time no baseline: their rows are evidence
# for the benchmark row of the same (kernel, shape, config), not candidates.
PROFILER_FORMATS = frozenset({"ncu_raw", "ncu_details", "ncu_rep", "torch_trace", "proton", "ptxas_log",
                              "triton_cache"})
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
    # A profiler row of a kernels/ module is evidence for that module's benchmark row; a
    # profiler row of someone else's kernel (no kernel_module) is a candidate of its own.
    module = row.get("kernel_module")
    if str(row.get("source_format")) in PROFILER_FORMATS and isinstance(module, str) and module.strip():
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
    out["speedup_source"] = [None if v.source is None else str(v.source) for v in verdicts]
    out["pct_change"] = [v.pct_change for v in verdicts]
    out["status"] = [str(v.status) for v in verdicts]
    out["status_reason"] = [v.reason for v in verdicts]
    out["data_kind"] = [str(data_kind_of(row)) for _, row in candidates.iterrows()]
    for col in ("speedup", "speedup_ci_low", "speedup_ci_high", "pct_change"):
        out[col] = pd.to_numeric(out[col], errors="coerce").astype(float)
    return out
