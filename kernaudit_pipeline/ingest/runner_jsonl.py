"""The GPU runner's JSONL (``kernaudit bench``; the schema is ``bench/records.py``, shared).

One JSON object per line with ``record_type``: ``run`` and ``baseline`` lines
already use the kernel_runs column names and become rows (the baseline rows
carry ``config_id`` ``baseline[...]``); ``peak`` lines are measured ceilings
that the roofline prefers over the datasheet, and ``summary`` closes the
sweep. Peaks and summaries are non-row records: counted, never dropped.
A line that is not a JSON object, or has no known ``record_type``, is
quarantined with its line number.

Files from before paired timing still ingest: their rows simply have no
``speedup``/``timing_*`` fields. They also wrote the JIT's local-memory figure
(4 * n_spills, the stack frame) into ``spill_stores_bytes`` and
``spill_loads_bytes``; those rows are read with it in ``stack_frame_bytes`` only,
the one column that figure means.

Reading goes through :mod:`kernaudit_pipeline.ingest.jsonl` (bulk DuckDB reads of clean
lines, exact line-by-line reads from the first doubtful one): :func:`parse_chunks` streams
a large file in batches of rows, :func:`parse` gathers them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pydantic_core
from pydantic import BaseModel, ConfigDict, ValidationError

from kernaudit_pipeline.bench.records import LEGACY_SPILL_SOURCE_PREFIX, STACK_FRAME_SOURCE, RecordType
from kernaudit_pipeline.ingest.jsonl import Kind, Line, line_numbers, stream
from kernaudit_pipeline.ingest._common import Parsed, bad
from kernaudit_pipeline.kernel_runs import COLUMNS, NUMERIC_COLUMNS, STRING_COLUMNS

FORMAT = "runner_jsonl"
# Kept beside the kernel_runs columns: the richer fields later stages can use.
EXTRA_FIELDS = ("record_type", "kernel_module", "sm_count", "max_shared_mem_bytes", "baseline_variant",
                "samples_us", "n_spills", "spill_bytes_source", "launch_matches_compile", "config", "dims",
                "baseline_samples_us", "block_speedups", "between_run_rsd", "clock_threshold_mhz",
                "throttle_reasons", "backend_kernels")


def legacy_spill_fix(row: dict) -> dict:
    """Rows of older runner files: their spill columns held the stack frame (4 * n_spills)."""
    source = row.get("spill_bytes_source")
    if not isinstance(source, str) or not source.startswith(LEGACY_SPILL_SOURCE_PREFIX) or source == STACK_FRAME_SOURCE:
        return row
    frame = row.get("stack_frame_bytes")
    if frame is None:
        frame = row.get("spill_stores_bytes")
    return {**row, "stack_frame_bytes": frame, "spill_stores_bytes": None, "spill_loads_bytes": None,
            "spill_bytes_source": STACK_FRAME_SOURCE}


def legacy_spill_fix_frame(rows: pd.DataFrame) -> pd.DataFrame:
    """:func:`legacy_spill_fix` on a bulk batch (same rule, column-wise)."""
    source = rows["spill_bytes_source"].astype(object)
    legacy = source.map(lambda s: isinstance(s, str) and s.startswith(LEGACY_SPILL_SOURCE_PREFIX)
                        and s != STACK_FRAME_SOURCE).astype(bool)
    if not legacy.any():
        return rows
    out = rows.copy()
    frame = out["stack_frame_bytes"].where(out["stack_frame_bytes"].notna(), out["spill_stores_bytes"])
    out.loc[legacy, "stack_frame_bytes"] = frame[legacy]
    out.loc[legacy, ["spill_stores_bytes", "spill_loads_bytes"]] = float("nan")
    out.loc[legacy, "spill_bytes_source"] = STACK_FRAME_SOURCE
    return out


class RunnerLine(BaseModel):
    model_config = ConfigDict(extra="allow")
    record_type: RecordType


PROVENANCE = ("source_format", "source_file", "source_row")
PEAK_FIELDS = {"peak_name": Kind.TEXT, "name": Kind.TEXT, "what": Kind.TEXT,
               "peak_tflops": Kind.NUMBER, "peak_gb_per_s": Kind.NUMBER}
# What the bulk reader reads: the kernel_runs columns, the record type, the peak fields.
BULK_COLUMNS: dict[str, Kind] = {
    "record_type": Kind.TEXT,
    **{c: (Kind.NUMBER if c in NUMERIC_COLUMNS else Kind.TEXT if c in STRING_COLUMNS
           else Kind.BOOL) for c in COLUMNS if c not in PROVENANCE},
    **{k: v for k, v in PEAK_FIELDS.items() if k not in COLUMNS},
    "spill_bytes_source": Kind.TEXT,
}
ROW_TYPES = (RecordType.RUN, RecordType.BASELINE)


def looks_like(first_line: str) -> bool:
    try:
        obj = pydantic_core.from_json(first_line)
    except ValueError:
        return False
    return isinstance(obj, dict) and "record_type" in obj


def parse(path: Path, source_file: str) -> Parsed:
    """The whole file as one :class:`Parsed`, rows as dicts (``record_type`` included): the
    form callers of one file want. ``kernaudit ingest`` streams :func:`parse_chunks` instead."""
    parts = list(parse_chunks(path, source_file))
    rows: list[dict] = []
    for p in parts:
        rows += p.rows
        if p.frame is not None:
            rows += [_plain(r) for r in p.frame.to_dict("records")]
    rows.sort(key=lambda r: r["source_row"])
    return Parsed(rows=rows, quarantine=[q for p in parts for q in p.quarantine],
                  records_in=sum(p.records_in for p in parts), other_records=sum(p.other_records for p in parts),
                  peaks=[k for p in parts for k in p.peaks],
                  note=f"{sum(len(p.peaks) for p in parts)} peak records")


def parse_chunks(path: Path, source_file: str, *, bulk: bool = True,
                 batch_rows: int | None = None) -> Iterator[Parsed]:
    """The file in batches: rows, quarantine, peaks and counts of each batch."""
    for batch in stream(path, BULK_COLUMNS, bulk=bulk, batch_rows=batch_rows):
        if batch.frame is not None:
            yield _from_frame(batch.frame, path, source_file)
        else:
            yield _from_lines(batch.lines, source_file)


def _plain(record: dict) -> dict:
    return {k: (None if isinstance(v, float) and v != v else v) for k, v in record.items()}


def _from_frame(frame: pd.DataFrame, path: Path, source_file: str) -> Parsed:
    kinds = frame["record_type"]
    is_row = kinds.isin([str(t) for t in ROW_TYPES])
    known = kinds.isin([str(t) for t in RecordType])
    rows = legacy_spill_fix_frame(frame.loc[is_row, [c for c in COLUMNS if c in frame.columns]
                                            + ["record_type", "spill_bytes_source"]])
    rows["source_format"] = FORMAT
    rows["source_file"] = source_file
    rows["source_row"] = frame.loc[is_row, "_record"].to_numpy()
    peaks = [{**{k: v for k, v in _plain(r).items() if k != "_record"}, "source_format": FORMAT,
              "source_file": source_file, "source_row": r["_record"]}
             for r in frame.loc[kinds == str(RecordType.PEAK)].to_dict("records")]
    unknown = frame.loc[~known]
    quarantine: list[dict] = []
    if len(unknown):
        lines = line_numbers(path, set(int(i) for i in unknown["_record"]))
        for r in unknown.to_dict("records"):
            record = int(r["_record"])
            value = r["record_type"]
            why = "record_type: Field required" if value is None else f"record_type: {value!r} is not a record type"
            quarantine.append(bad({**_plain(r), "source_format": FORMAT, "source_file": source_file,
                                   "source_row": record}, f"line {lines.get(record, '?')}: {why}"))
    other = int((known & ~is_row).sum())
    return Parsed(rows=[], frame=rows.reset_index(drop=True), quarantine=quarantine, records_in=len(frame),
                  other_records=other, peaks=peaks)


def _from_lines(lines: tuple[Line, ...], source_file: str) -> Parsed:
    rows: list[dict] = []
    quarantine: list[dict] = []
    peaks: list[dict] = []
    other = 0
    for line in lines:
        prov = {"source_format": FORMAT, "source_file": source_file, "source_row": line.record}
        if line.obj is None:
            quarantine.append(bad({**prov, "raw_line": line.raw}, line.error or f"line {line.line}: unreadable"))
            continue
        obj = line.obj
        try:
            record = RunnerLine.model_validate(obj)
        except ValidationError as exc:
            err = exc.errors()[0]
            quarantine.append(bad({**obj, **prov}, f"line {line.line}: {'.'.join(map(str, err['loc']))}: {err['msg']}"))
            continue
        if record.record_type in ROW_TYPES:
            row = {k: obj.get(k) for k in COLUMNS if k in obj}
            row.update({k: obj[k] for k in EXTRA_FIELDS if k in obj})
            rows.append({**legacy_spill_fix(row), **prov, "_line": line.line})
        else:
            other += 1
            if record.record_type is RecordType.PEAK:
                peaks.append({**obj, **prov})
    return Parsed(rows=rows, quarantine=quarantine, records_in=len(lines), other_records=other, peaks=peaks)
