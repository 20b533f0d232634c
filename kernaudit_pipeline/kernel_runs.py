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

from kernaudit_pipeline.core.hardware import SM_RESOURCES, Vendor

# Physical bounds of a kernel's duration: below 1 ns no launch completes, above 1 h it is a
# unit error (1e308 ms), not a kernel. Outside them a row is quarantined.
MIN_LATENCY_US = 1e-3
MAX_LATENCY_US = 3.6e9
LATENCY_BOUNDS = {"ge": MIN_LATENCY_US, "le": MAX_LATENCY_US}
POWERS_OF_TWO = [1 << i for i in range(17)]

# The seed's input fields keep the seed's names; everything else states its unit.
SEED_FIELDS = (
    "kernel_name", "block_m", "block_n", "registers_per_thread",
    "spill_stores_bytes", "latency_us", "baseline_us",
)


# the most registers a thread can hold on any GPU in the spec table (255 on every NVIDIA part)
_MAX_REGS_PER_THREAD = max(r.max_regs_per_thread for r in SM_RESOURCES.values())

class KernelRuns(pa.DataFrameModel):
    """One measured or compiled (kernel, config, shape, device) row."""

    # identity and config
    kernel_name: Series[str] = pa.Field(str_length={"min_value": 1})
    # the kernels/ module the row's kernel belongs to; empty for a kernel of someone else's
    # (a foreign row: it becomes a candidate of its own, keyed by what its file gives)
    kernel_module: Series[str] = pa.Field(nullable=True)
    config_id: Series[str] = pa.Field(nullable=True)
    # Triton tiles are powers of two (tl.arange needs them), at most 2^16
    block_m: Series[pd.Int64Dtype] = pa.Field(nullable=True, isin=POWERS_OF_TWO)
    block_n: Series[pd.Int64Dtype] = pa.Field(nullable=True, isin=POWERS_OF_TWO)
    block_k: Series[pd.Int64Dtype] = pa.Field(nullable=True, isin=POWERS_OF_TWO)
    group_m: Series[pd.Int64Dtype] = pa.Field(nullable=True, gt=0)
    num_warps: Series[pd.Int64Dtype] = pa.Field(nullable=True, isin=[1, 2, 4, 8, 16, 32])
    num_stages: Series[pd.Int64Dtype] = pa.Field(nullable=True, ge=1)
    # problem shape
    shape_name: Series[str] = pa.Field(nullable=True)
    # where the launch sat: Proton scope path, NVTX range, torch annotation (a/b/c)
    scope: Series[str] = pa.Field(nullable=True)
    # the launching op's input shapes as the file gave them (torch.profiler "Input Dims")
    input_shapes: Series[str] = pa.Field(nullable=True)
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
    registers_per_thread: Series[pd.Int64Dtype] = pa.Field(nullable=True, ge=0, le=_MAX_REGS_PER_THREAD)
    spill_stores_bytes: Series[pd.Int64Dtype] = pa.Field(nullable=True, ge=0)
    spill_loads_bytes: Series[pd.Int64Dtype] = pa.Field(nullable=True, ge=0)
    stack_frame_bytes: Series[pd.Int64Dtype] = pa.Field(nullable=True, ge=0)
    shared_mem_static_bytes: Series[pd.Int64Dtype] = pa.Field(nullable=True, ge=0)
    shared_mem_dynamic_bytes: Series[pd.Int64Dtype] = pa.Field(nullable=True, ge=0)
    shared_mem_bytes: Series[pd.Int64Dtype] = pa.Field(nullable=True, ge=0)
    threads_per_block: Series[pd.Int64Dtype] = pa.Field(nullable=True, gt=0)
    grid_size: Series[pd.Int64Dtype] = pa.Field(nullable=True, gt=0)
    # measurements (microseconds), within physical bounds: 1 ns to 1 h
    latency_us: Series[float] = pa.Field(nullable=True, **LATENCY_BOUNDS)
    latency_p10_us: Series[float] = pa.Field(nullable=True, ge=0, le=MAX_LATENCY_US)
    latency_p90_us: Series[float] = pa.Field(nullable=True, ge=0, le=MAX_LATENCY_US)
    latency_ci_low_us: Series[float] = pa.Field(nullable=True, **LATENCY_BOUNDS)
    latency_ci_high_us: Series[float] = pa.Field(nullable=True, **LATENCY_BOUNDS)
    latency_samples: Series[pd.Int64Dtype] = pa.Field(nullable=True, ge=0)
    # the trace's clock step: 1.0 for traces that print whole microseconds, whose 0 us
    # launches are kept (dropping them would bias the mean up)
    timer_resolution_us: Series[float] = pa.Field(nullable=True, gt=0)
    baseline_name: Series[str] = pa.Field(nullable=True)
    baseline_us: Series[float] = pa.Field(nullable=True, **LATENCY_BOUNDS)
    baseline_ci_low_us: Series[float] = pa.Field(nullable=True, **LATENCY_BOUNDS)
    baseline_ci_high_us: Series[float] = pa.Field(nullable=True, **LATENCY_BOUNDS)
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
    vendor: Series[str] = pa.Field(nullable=True, isin=[str(v) for v in Vendor])
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


RAW_JSON_LIMIT = 4000  # characters of a quarantined record kept in raw_json


def _json_default(value: object) -> object:
    if isinstance(value, float) and math.isnan(value):
        return None
    if pd.isna(value):  # pd.NA, NaT
        return None
    return str(value)


def _raw_json(row: dict) -> str:
    """The record as JSON text, bounded: a 3,000-deep or 100 MB record must not fail here."""
    clean = {k: (None if (not isinstance(v, (list, dict)) and pd.isna(v)) else v) for k, v in row.items()}
    try:
        text = json.dumps(clean, default=_json_default, sort_keys=True)
    except (RecursionError, ValueError, TypeError):
        text = json.dumps({k: (v if isinstance(v, (str, int, float, bool)) or v is None else
                               f"<{type(v).__name__} not shown>") for k, v in clean.items()},
                          default=_json_default, sort_keys=True)
    return text if len(text) <= RAW_JSON_LIMIT else text[:RAW_JSON_LIMIT] + "...(truncated)"


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


_SCHEMA = KernelRuns.to_schema()
NUMERIC_COLUMNS: tuple[str, ...] = tuple(
    name for name, col in _SCHEMA.columns.items() if str(col.dtype) in ("float64", "Int64"))
STRING_COLUMNS: tuple[str, ...] = tuple(name for name, col in _SCHEMA.columns.items() if str(col.dtype) == "str")
# The same model with the text columns' dtype check left to :func:`_text_columns`: pandera
# checks ``str`` cell by cell in Python (40 % of the time on 50,000 rows); converting the
# non-null cells to ``str`` first, as pandera's coercion would, makes the check redundant.
_BULK_SCHEMA = _SCHEMA.update_columns({c: {"dtype": None} for c in STRING_COLUMNS})


def _text_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """Non-null cells of the text columns as ``str`` (what ``coerce=True`` does to them)."""
    out = frame.copy()
    for column in STRING_COLUMNS:
        series = out[column]
        present = series.notna()
        if present.any() and not series[present].map(type).eq(str).all():
            out[column] = series.astype(object).where(~present, series[present].astype(str))
    return out


def _bad_number(value: object) -> str | None:
    """Why a cell of a numeric column is no number pandera should coerce (None when fine)."""
    if value is None or isinstance(value, str):
        return None  # missing, or text that coercion will name
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return f"boolean {value!r} is not a number"
    if isinstance(value, int):
        return None if abs(value) < 2**63 else f"integer with {len(str(abs(value)))} digits is out of range"
    if isinstance(value, float) and math.isinf(value):
        return f"{value!r} is not a finite number"
    if isinstance(value, (list, dict, tuple)):
        return f"a {type(value).__name__} is not a number"
    return None


def prevalidate(frame: pd.DataFrame) -> dict[int, list[str]]:
    """Values pandera's coercion would silently accept: booleans (True -> 1.0), infinities,
    integers beyond int64, containers. Per row label, one clause per bad cell."""
    reasons: dict[int, list[str]] = {}
    for column in NUMERIC_COLUMNS:
        series = frame[column]
        if series.dtype == bool:
            hits = series.index[series.notna()]
            for idx in hits:
                reasons.setdefault(idx, []).append(f"{column}: boolean {series[idx]!r} is not a number")
            continue
        if series.dtype.kind == "f":
            bad = series.index[series.abs() == math.inf]
            for idx in bad:
                reasons.setdefault(idx, []).append(f"{column}: {series[idx]!r} is not a finite number")
            continue
        if series.dtype == object:
            for idx, value in series.items():
                why = _bad_number(value)
                if why is not None:
                    reasons.setdefault(idx, []).append(f"{column}: {why}")
    return reasons


def as_frame(rows: list[dict] | pd.DataFrame) -> pd.DataFrame:
    """The kernel_runs columns of ``rows`` (dicts or a frame), in order, with a 0..n-1 index."""
    if isinstance(rows, pd.DataFrame):
        return rows.reindex(columns=list(COLUMNS)).reset_index(drop=True)
    return records_frame(rows)


def records_frame(rows: list[dict]) -> pd.DataFrame:
    """Dict rows as a frame of kernel_runs columns, each cell kept as given (object columns):
    inference would raise on a 400-digit integer and turn ``True`` into a number."""
    return pd.DataFrame({c: pd.Series([row.get(c) for row in rows], dtype=object) for c in COLUMNS})


def _row_dict(rows: list[dict] | pd.DataFrame, i: int) -> dict:
    return rows[i] if not isinstance(rows, pd.DataFrame) else rows.iloc[i].to_dict()


def normalize(rows: list[dict] | pd.DataFrame) -> Normalized:
    """Validate a batch; every row ends in exactly one of the two tables.

    Values coercion would silently accept (``True`` as 1.0, ``inf``) are refused first. The
    rest of the frame is validated lazily; rows named in the failure cases are quarantined
    with their own reasons and the others are validated again (a bad value can hide behind
    a failed coercion of its column). If pandera reports a failure it cannot tie to a row,
    the batch falls back to row-by-row.
    """
    frame = as_frame(rows)
    reasons = prevalidate(frame)
    remaining = [i for i in range(len(frame)) if i not in reasons]
    good = None
    for _ in range(4):
        if not remaining:
            break
        try:
            validated = _BULK_SCHEMA.validate(_text_columns(frame.loc[remaining]), lazy=True)
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
    if good is None:
        good = empty_kernel_runs()
    bad = [quarantine_row(_row_dict(rows, i), "; ".join(reasons[i])) for i in sorted(reasons)]
    quarantine = pd.DataFrame(bad, columns=list(QUARANTINE_COLUMNS)) if bad else empty_quarantine()
    return Normalized(kernel_runs=good, quarantine=quarantine)


def _normalize_row_by_row(rows: list[dict] | pd.DataFrame) -> Normalized:
    good: list[dict] = []
    bad: list[dict] = []
    for i in range(len(rows)):
        row = _row_dict(rows, i)
        frame = pd.DataFrame([{c: row.get(c) for c in COLUMNS}])
        early = prevalidate(frame)
        if early:
            bad.append(quarantine_row(row, "; ".join(early[0])))
            continue
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
