"""The ``kernel_runs`` table: every benchmark or profiler row, normalized.

Whatever the source (runner JSONL, Nsight Compute CSV, torch.profiler trace,
seed JSON, synthetic generator), rows end here in one schema, validated by a
pandera ``DataFrameModel``. A row that fails validation goes to the
``quarantine`` table with the reason; no row is dropped silently, so
``len(rows_in) == len(kernel_runs) + len(quarantine)`` always holds.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pandas as pd
import pandera.pandas as pa
from pandera.typing import Series

# The seed's input fields keep the seed's names; everything else states its unit.
SEED_FIELDS = (
    "kernel_name", "block_m", "block_n", "registers_per_thread",
    "spill_stores_bytes", "latency_us", "baseline_us",
)


class KernelRuns(pa.DataFrameModel):
    """One measured or compiled (kernel, config, shape, device) row."""

    # identity and config
    kernel_name: Series[str] = pa.Field(str_length={"min_value": 1})
    config_id: Series[str] = pa.Field(nullable=True)
    block_m: Series[pd.Int64Dtype] = pa.Field(nullable=True, gt=0)
    block_n: Series[pd.Int64Dtype] = pa.Field(nullable=True, gt=0)
    block_k: Series[pd.Int64Dtype] = pa.Field(nullable=True, gt=0)
    group_m: Series[pd.Int64Dtype] = pa.Field(nullable=True, gt=0)
    num_warps: Series[pd.Int64Dtype] = pa.Field(nullable=True, isin=[1, 2, 4, 8, 16, 32])
    num_stages: Series[pd.Int64Dtype] = pa.Field(nullable=True, ge=1)
    # problem shape
    shape_name: Series[str] = pa.Field(nullable=True)
    phase: Series[str] = pa.Field(nullable=True)
    m: Series[pd.Int64Dtype] = pa.Field(nullable=True, gt=0)
    n: Series[pd.Int64Dtype] = pa.Field(nullable=True, gt=0)
    k: Series[pd.Int64Dtype] = pa.Field(nullable=True, gt=0)
    batch: Series[pd.Int64Dtype] = pa.Field(nullable=True, gt=0)
    num_heads: Series[pd.Int64Dtype] = pa.Field(nullable=True, gt=0)
    num_kv_heads: Series[pd.Int64Dtype] = pa.Field(nullable=True, gt=0)
    seq_len: Series[pd.Int64Dtype] = pa.Field(nullable=True, gt=0)
    head_dim: Series[pd.Int64Dtype] = pa.Field(nullable=True, gt=0)
    causal: Series[pd.BooleanDtype] = pa.Field(nullable=True)
    dtype: Series[str] = pa.Field(nullable=True)
    # compile-time resources
    registers_per_thread: Series[pd.Int64Dtype] = pa.Field(nullable=True, ge=0, le=255)
    spill_stores_bytes: Series[pd.Int64Dtype] = pa.Field(nullable=True, ge=0)
    spill_loads_bytes: Series[pd.Int64Dtype] = pa.Field(nullable=True, ge=0)
    stack_frame_bytes: Series[pd.Int64Dtype] = pa.Field(nullable=True, ge=0)
    shared_mem_static_bytes: Series[pd.Int64Dtype] = pa.Field(nullable=True, ge=0)
    shared_mem_dynamic_bytes: Series[pd.Int64Dtype] = pa.Field(nullable=True, ge=0)
    shared_mem_bytes: Series[pd.Int64Dtype] = pa.Field(nullable=True, ge=0)
    threads_per_block: Series[pd.Int64Dtype] = pa.Field(nullable=True, gt=0)
    grid_size: Series[pd.Int64Dtype] = pa.Field(nullable=True, gt=0)
    # measurements (microseconds)
    latency_us: Series[float] = pa.Field(nullable=True, gt=0)
    latency_p10_us: Series[float] = pa.Field(nullable=True, gt=0)
    latency_p90_us: Series[float] = pa.Field(nullable=True, gt=0)
    latency_ci_low_us: Series[float] = pa.Field(nullable=True, gt=0)
    latency_ci_high_us: Series[float] = pa.Field(nullable=True, gt=0)
    latency_samples: Series[pd.Int64Dtype] = pa.Field(nullable=True, ge=0)
    baseline_name: Series[str] = pa.Field(nullable=True)
    baseline_us: Series[float] = pa.Field(nullable=True, gt=0)
    baseline_ci_low_us: Series[float] = pa.Field(nullable=True, gt=0)
    baseline_ci_high_us: Series[float] = pa.Field(nullable=True, gt=0)
    # paired timing (runner): candidate and primary reference alternated in the same window
    speedup: Series[float] = pa.Field(nullable=True, gt=0)
    speedup_ci_low: Series[float] = pa.Field(nullable=True, gt=0)
    speedup_ci_high: Series[float] = pa.Field(nullable=True, gt=0)
    timing_pairs: Series[pd.Int64Dtype] = pa.Field(nullable=True, ge=0)
    timing_blocks: Series[pd.Int64Dtype] = pa.Field(nullable=True, ge=0)
    timing_mode: Series[str] = pa.Field(nullable=True, isin=["events", "cuda_graph"])
    clock_discarded_samples: Series[pd.Int64Dtype] = pa.Field(nullable=True, ge=0)
    sm_clock_min_mhz: Series[float] = pa.Field(nullable=True, gt=0)
    sm_clock_max_mhz: Series[float] = pa.Field(nullable=True, gt=0)
    baseline_backend: Series[str] = pa.Field(nullable=True)
    reference_speedups: Series[str] = pa.Field(nullable=True)  # JSON list of BaselineResult dicts
    correct: Series[pd.BooleanDtype] = pa.Field(nullable=True)
    max_rel_error: Series[float] = pa.Field(nullable=True, ge=0)
    run_status: Series[str] = pa.Field(nullable=True)
    run_message: Series[str] = pa.Field(nullable=True)
    # roofline model
    flops: Series[float] = pa.Field(nullable=True, ge=0)
    bytes_moved: Series[float] = pa.Field(nullable=True, ge=0)
    # profiler (Nsight Compute) evidence
    local_spill_requests: Series[float] = pa.Field(nullable=True, ge=0)
    local_memory_bytes: Series[float] = pa.Field(nullable=True, ge=0)
    stall_lg_throttle_pct: Series[float] = pa.Field(nullable=True, ge=0)
    stall_long_scoreboard_pct: Series[float] = pa.Field(nullable=True, ge=0)
    sm_throughput_pct: Series[float] = pa.Field(nullable=True, ge=0)
    memory_throughput_pct: Series[float] = pa.Field(nullable=True, ge=0)
    achieved_occupancy_pct: Series[float] = pa.Field(nullable=True, ge=0)
    ncu_occupancy_limit_registers: Series[pd.Int64Dtype] = pa.Field(nullable=True, ge=0)
    ncu_occupancy_limit_shared_mem: Series[pd.Int64Dtype] = pa.Field(nullable=True, ge=0)
    ncu_occupancy_limit_warps: Series[pd.Int64Dtype] = pa.Field(nullable=True, ge=0)
    ncu_occupancy_limit_blocks: Series[pd.Int64Dtype] = pa.Field(nullable=True, ge=0)
    # the carveout the driver picked for that launch; ncu's shared-memory limit depends on it
    ncu_shared_mem_config_bytes: Series[pd.Int64Dtype] = pa.Field(nullable=True, ge=0)
    # device and software
    device_name: Series[str] = pa.Field(nullable=True)
    compute_capability: Series[str] = pa.Field(nullable=True)
    sm_clock_mhz: Series[float] = pa.Field(nullable=True, gt=0)
    triton_version: Series[str] = pa.Field(nullable=True)
    torch_version: Series[str] = pa.Field(nullable=True)
    kernel_source_hash: Series[str] = pa.Field(nullable=True)
    # provenance: measured (a GPU timed it), modelled (the synthetic generator) or predicted (the
    # static cost model); empty means the source format says (comparisons.data_kind_of)
    data_kind: Series[str] = pa.Field(nullable=True, isin=["measured", "modelled", "predicted"])
    source_format: Series[str] = pa.Field(str_length={"min_value": 1})
    source_file: Series[str] = pa.Field(str_length={"min_value": 1})
    source_row: Series[pd.Int64Dtype] = pa.Field(ge=0)

    class Config:
        coerce = True
        strict = "filter"  # unknown columns are dropped after being reported by the caller

    @pa.dataframe_check
    def ci_brackets_median(cls, df: pd.DataFrame) -> Series[bool]:
        """A confidence interval that excludes its own median is corrupt."""
        lo, hi, med = df["latency_ci_low_us"], df["latency_ci_high_us"], df["latency_us"]
        ok = (lo.isna() | hi.isna() | med.isna()) | ((lo <= med * 1.0001) & (med <= hi * 1.0001))
        return ok

    @pa.dataframe_check
    def speedup_ci_brackets_speedup(cls, df: pd.DataFrame) -> Series[bool]:
        """A paired speedup outside its own CI is corrupt."""
        lo, hi, sp = df["speedup_ci_low"], df["speedup_ci_high"], df["speedup"]
        return (lo.isna() | hi.isna() | sp.isna()) | ((lo <= sp * 1.0001) & (sp <= hi * 1.0001))

    @pa.dataframe_check
    def spill_loads_need_stores(cls, df: pd.DataFrame) -> Series[bool]:
        """ptxas never reports spill loads without spill stores."""
        st, ld = df["spill_stores_bytes"], df["spill_loads_bytes"]
        return st.isna() | ld.isna() | ~((ld > 0) & (st == 0))


COLUMNS: tuple[str, ...] = tuple(KernelRuns.to_schema().columns)
QUARANTINE_COLUMNS = ("source_format", "source_file", "source_row", "reason", "raw_json")


@dataclass(frozen=True)
class Normalized:
    """The result of validating a batch of rows."""

    kernel_runs: pd.DataFrame
    quarantine: pd.DataFrame

    @property
    def rows_in(self) -> int:
        return len(self.kernel_runs) + len(self.quarantine)


def _json_default(value: object) -> object:
    if isinstance(value, float) and math.isnan(value):
        return None
    if pd.isna(value):  # pd.NA, NaT
        return None
    return str(value)


def _raw_json(row: dict) -> str:
    clean = {k: (None if (not isinstance(v, (list, dict)) and pd.isna(v)) else v) for k, v in row.items()}
    return json.dumps(clean, default=_json_default, sort_keys=True)


def empty_kernel_runs() -> pd.DataFrame:
    return KernelRuns.validate(pd.DataFrame({c: pd.Series(dtype="object") for c in COLUMNS}))


def empty_quarantine() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="object") for c in QUARANTINE_COLUMNS})


def quarantine_row(row: dict, reason: str) -> dict:
    return {
        "source_format": row.get("source_format") or "unknown",
        "source_file": row.get("source_file") or "unknown",
        "source_row": row.get("source_row"),
        "reason": reason,
        "raw_json": _raw_json(row),
    }


def normalize(rows: list[dict]) -> Normalized:
    """Validate a batch; every row ends in exactly one of the two tables.

    The whole frame is validated lazily; rows named in the failure cases are
    quarantined with their own reasons and the rest is validated again (a bad
    value can hide behind a failed coercion of its column). If pandera reports
    a failure it cannot tie to a row, the batch falls back to row-by-row.
    """
    records = [{c: row.get(c) for c in COLUMNS} for row in rows]
    reasons: dict[int, list[str]] = {}
    remaining = list(range(len(records)))
    for _ in range(4):
        if not remaining:
            break
        frame = pd.DataFrame([records[i] for i in remaining], columns=list(COLUMNS), index=remaining)
        try:
            validated = KernelRuns.validate(frame, lazy=True)
        except pa.errors.SchemaErrors as exc:
            cases = exc.failure_cases
            if cases["index"].isna().any():
                return _normalize_row_by_row(rows)
            for idx, group in cases.groupby("index"):
                reasons.setdefault(int(idx), []).append(_reason_from_cases(group))
            remaining = [i for i in remaining if i not in reasons]
            continue
        good = validated.reset_index(drop=True)
        break
    else:  # pragma: no cover - four rounds of new failures means something is badly off
        return _normalize_row_by_row(rows)
    if not remaining:
        good = empty_kernel_runs()
    bad = [quarantine_row(rows[i], "; ".join(reasons[i])) for i in sorted(reasons)]
    quarantine = pd.DataFrame(bad, columns=list(QUARANTINE_COLUMNS)) if bad else empty_quarantine()
    return Normalized(kernel_runs=good, quarantine=quarantine)


def _normalize_row_by_row(rows: list[dict]) -> Normalized:
    good: list[dict] = []
    bad: list[dict] = []
    for row in rows:
        frame = pd.DataFrame([{c: row.get(c) for c in COLUMNS}])
        try:
            KernelRuns.validate(frame, lazy=True)
        except (pa.errors.SchemaErrors, pa.errors.SchemaError) as exc:
            bad.append(quarantine_row(row, _reason(exc)))
            continue
        except (TypeError, ValueError) as exc:
            bad.append(quarantine_row(row, f"coercion failed: {exc}"))
            continue
        good.append({c: row.get(c) for c in COLUMNS})
    runs = (KernelRuns.validate(pd.DataFrame(good, columns=list(COLUMNS)))
            if good else empty_kernel_runs())
    quarantine = pd.DataFrame(bad, columns=list(QUARANTINE_COLUMNS)) if bad else empty_quarantine()
    return Normalized(kernel_runs=runs.reset_index(drop=True), quarantine=quarantine)


def _reason(exc: Exception) -> str:
    cases = getattr(exc, "failure_cases", None)
    if cases is None or len(cases) == 0:
        return str(exc).splitlines()[0]
    return _reason_from_cases(cases)


def _reason_from_cases(cases: pd.DataFrame) -> str:
    """One clause per failed check: ``column: check (value)``, or ``row: check``."""
    parts = []
    for _, case in cases.iterrows():
        if case.get("schema_context") == "DataFrameSchema":
            parts.append(f"row: failed {case.get('check')}")
        else:
            parts.append(f"{case.get('column')}: failed {case.get('check')} (value {case.get('failure_case')!r})")
    return "; ".join(dict.fromkeys(parts))


STATIC_FILL_COLUMNS = (
    "registers_per_thread", "spill_stores_bytes", "spill_loads_bytes", "stack_frame_bytes",
    "shared_mem_static_bytes", "shared_mem_dynamic_bytes", "shared_mem_bytes", "threads_per_block",
)


def attach_static_resources(runs: pd.DataFrame, static: pd.DataFrame | None) -> pd.DataFrame:
    """Fill a run's missing compile-time resources from the static audit of the
    same (kernel, config). Measured values are never overwritten."""
    if static is None or static.empty or runs.empty:
        return runs
    ok = static[static.get("status", "OK").astype(str) == "OK"] if "status" in static else static
    keyed = ok.drop_duplicates(["kernel_name", "config_id"]).set_index(["kernel_name", "config_id"])
    out = runs.copy()
    index = pd.MultiIndex.from_frame(out[["kernel_name", "config_id"]].astype(object))
    for col in STATIC_FILL_COLUMNS:
        if col not in keyed.columns:
            continue
        fill = keyed[col].reindex(index).to_numpy()
        out[col] = out[col].astype(object).where(out[col].notna(), fill)
    return KernelRuns.validate(out)
