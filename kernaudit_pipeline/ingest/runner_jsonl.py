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
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from kernaudit_pipeline.bench.records import LEGACY_SPILL_SOURCE_PREFIX, STACK_FRAME_SOURCE, RecordType
from kernaudit_pipeline.ingest._common import IngestError, Parsed, bad
from kernaudit_pipeline.kernel_runs import COLUMNS

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


class RunnerLine(BaseModel):
    model_config = ConfigDict(extra="allow")
    record_type: RecordType


def looks_like(first_line: str) -> bool:
    try:
        obj = json.loads(first_line)
    except json.JSONDecodeError:
        return False
    return isinstance(obj, dict) and "record_type" in obj


def parse(path: Path, source_file: str) -> Parsed:
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise IngestError(f"not a readable JSONL file ({exc})") from None
    rows: list[dict] = []
    quarantine: list[dict] = []
    peaks: list[dict] = []
    other = records = 0
    for line_no, line in enumerate(lines):
        if not line.strip():
            continue
        prov = {"source_format": FORMAT, "source_file": source_file, "source_row": records}
        records += 1
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            quarantine.append(bad({**prov, "raw_line": line[:500]}, f"line {line_no + 1}: not JSON ({exc.msg})"))
            continue
        if not isinstance(obj, dict):
            quarantine.append(bad({**prov, "raw_line": line[:500]}, f"line {line_no + 1}: not a JSON object"))
            continue
        try:
            record = RunnerLine.model_validate(obj)
        except ValidationError as exc:
            err = exc.errors()[0]
            quarantine.append(bad({**obj, **prov}, f"line {line_no + 1}: {'.'.join(map(str, err['loc']))}: {err['msg']}"))
            continue
        if record.record_type in (RecordType.RUN, RecordType.BASELINE):
            row = {k: obj.get(k) for k in COLUMNS if k in obj}
            row.update({k: obj[k] for k in EXTRA_FIELDS if k in obj})
            rows.append({**legacy_spill_fix(row), **prov})
        else:
            other += 1
            if record.record_type is RecordType.PEAK:
                peaks.append({**obj, **prov})
    return Parsed(rows=rows, quarantine=quarantine, records_in=records, other_records=other, peaks=peaks,
                  note=f"{len(peaks)} peak records")
