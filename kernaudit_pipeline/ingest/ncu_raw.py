"""Nsight Compute ``--csv --page raw``: one row per kernel launch.

Layout (ncu 2025.3, checked on this project's H200 capture): a header row of
fixed columns (``ID``, ``Process ID``, ``Process Name``, ``Host Name``,
``Kernel Name``, ``Context``, ``Stream``, ``Block Size``, ``Grid Size``,
``Device``, ``CC``) then one column per metric; a units row (blank under the
fixed columns, ``us``/``Kbyte/block``/``%``/``register/thread`` under the
metrics); then one row per launch. Numbers carry thousands separators
(``"3,411,968"``); missing values read ``n/a`` or ``no data``. Any subset of
metrics may be present. Lines before the header that ncu itself printed
(``==PROF==``, ``==WARNING==``) are skipped.

Stall shares: ncu's WarpStateStats rule states a reason's share as its
``smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio`` over
``smsp__average_warp_latency_per_inst_issued.ratio`` ("This stall type
represents about 40.5% of the total average of 19.6 cycles"). That is the
same quantity as ``smsp__warp_issue_stalled_<reason>_per_warp_active.pct``
(stall cycles over active warp cycles), which is read directly when present;
otherwise the ratio over the total, or, without the total, over the sum of
the stall ratios present (only when more than two are).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from kernaudit_pipeline.core.hardware import Vendor
from kernaudit_pipeline.ingest._common import (
    warps_from_threads,
    IngestError, Parsed, apply_range, bad, kernel_fields, nvtx_range_text, strip_range_prefix,
)
from kernaudit_pipeline.ingest.sources import read_text
from kernaudit_pipeline.ingest.units import (
    BadValue, as_int, bytes_from, dims_product, freq_to_mhz, parse_number, time_to_us,
)

FORMAT = "ncu_raw"
FIXED_COLUMNS = ("ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Kernel Time", "Context",
                 "Stream", "Block Size", "Grid Size", "Device", "CC")
# With ``--nvtx`` ncu adds the open ranges: "thread Domain:Push/Pop_Range:..." and
# "Id:Domain:Start/Stop_Range:...".
NVTX_MARK = "Domain:"


def fixed_columns(header: list[str]) -> list[str]:
    return [c for c in header if c in FIXED_COLUMNS or NVTX_MARK in c]


def launch_range(fixed: dict[str, str]) -> str | None:
    """The capture's range of a launch: from the NVTX columns, or a renamed kernel's prefix."""
    for column, cell in fixed.items():
        if NVTX_MARK in column:
            text = nvtx_range_text(cell)
            if text:
                return text
    return strip_range_prefix((fixed.get("Kernel Name") or "").strip())[1]
SECTOR_BYTES = 32

TIME_METRICS = ("gpu__time_duration.sum", "gpu__time_duration.avg")
STALL_PREFIX = "smsp__average_warps_issue_stalled_"
STALL_SUFFIX = "_per_issue_active.ratio"
STALL_TOTAL = "smsp__average_warp_latency_per_inst_issued.ratio"
PLAIN = {  # metric -> kernel_runs column, unit-free (counts, %, blocks)
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_throughput_pct",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "memory_throughput_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occupancy_pct",
    "derived__local_spilling_requests": "local_spill_requests",
}
INTEGER = {
    "launch__registers_per_thread": "registers_per_thread",
    "launch__occupancy_limit_registers": "ncu_occupancy_limit_registers",
    "launch__occupancy_limit_shared_mem": "ncu_occupancy_limit_shared_mem",
    "launch__occupancy_limit_warps": "ncu_occupancy_limit_warps",
    "launch__occupancy_limit_blocks": "ncu_occupancy_limit_blocks",
    "launch__block_size": "threads_per_block",
    "launch__grid_size": "grid_size",
}
BYTES = {
    "launch__shared_mem_per_block_static": "shared_mem_static_bytes",
    "launch__shared_mem_per_block_dynamic": "shared_mem_dynamic_bytes",
}
# Beside the kernel_runs columns, kept on the row for occupancy checks and the report.
EXTRA_PLAIN = {
    "launch__registers_per_thread_allocated": "ncu_registers_per_thread_allocated",
    "sm__maximum_warps_per_active_cycle_pct": "ncu_theoretical_occupancy_pct",
    "launch__waves_per_multiprocessor": "ncu_waves_per_sm",
    "launch__sm_count": "ncu_sm_count",
    "device__attribute_multiprocessor_count": "ncu_sm_count",
    STALL_TOTAL: "ncu_warp_cycles_per_issued_inst",
}
EXTRA_BYTES = {
    "launch__shared_mem_config_size": "ncu_shared_mem_config_bytes",
    "launch__shared_mem_per_block_driver": "ncu_shared_mem_driver_bytes",
    "dram__bytes_read.sum": "ncu_dram_read_bytes",
    "dram__bytes_write.sum": "ncu_dram_write_bytes",
}
LOCAL_SECTORS = ("l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum", "l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum")
CLOCK = "sm__cycles_elapsed.avg.per_second"


def find_header(rows: list[list[str]]) -> int:
    """Index of the ``"ID",...,"Kernel Name",...`` row (the profiled program may print first)."""
    for i, row in enumerate(rows):
        if len(row) >= 5 and row[0].strip() == "ID" and "Kernel Name" in row:
            return i
    raise IngestError("no Nsight Compute CSV header (a row starting with \"ID\" and naming \"Kernel Name\")")


def read_csv(path: Path) -> tuple[list[list[str]], list[int]]:
    """The CSV records and, for each, the 1-based line of the file it ends on (a quoted
    cell may span lines), so quarantine reasons name the line a user opens."""
    text = read_text(path)
    rows: list[list[str]] = []
    lines: list[int] = []
    reader = csv.reader(io.StringIO(text))
    try:
        for row in reader:
            rows.append(row)
            lines.append(reader.line_num)
    except csv.Error as exc:
        raise IngestError(f"unreadable CSV at line {reader.line_num} ({exc})") from None
    return rows, lines


def duplicate_columns(header: list[str]) -> dict[str, list[int]]:
    """Metric names the header holds more than once, with their positions."""
    seen: dict[str, list[int]] = {}
    for i, name in enumerate(header):
        seen.setdefault(name, []).append(i)
    return {name: idx for name, idx in seen.items() if len(idx) > 1 and name}


def record_of(header: list[str], cells: list[str], dups: dict[str, list[int]]) -> dict[str, str]:
    """The row as ``{column: cell}``; a duplicated column must agree with itself, or the
    launch is refused (never one copy silently preferred)."""
    for name, positions in dups.items():
        values = {cells[i].strip() for i in positions}
        if len(values) > 1:
            shown = " vs ".join(repr(cells[i].strip()[:20]) for i in positions)
            raise BadValue(f"column {name!r} appears {len(positions)} times with different values ({shown})")
    return dict(zip(header, cells))


def stall_shares(metrics: dict[str, float | None]) -> dict[str, float]:
    """Per-reason share (%) of the warp cycles between issued instructions."""
    ratios = {name[len(STALL_PREFIX):-len(STALL_SUFFIX)]: value for name, value in metrics.items()
              if name.startswith(STALL_PREFIX) and name.endswith(STALL_SUFFIX)
              and "not_issued" not in name and value is not None}
    total = metrics.get(STALL_TOTAL)
    if total is None or total <= 0:
        total = sum(ratios.values()) if len(ratios) > 2 else None
    if not total:
        return {}
    return {reason: 100.0 * value / total for reason, value in ratios.items()}


def launch_row(metrics: dict[str, float | str | None], units: dict[str, str], fixed: dict[str, str]) -> dict:
    """kernel_runs fields from one launch's metrics; raises BadValue on unconvertible values."""
    row: dict = {"vendor": str(Vendor.NVIDIA)}  # Nsight Compute profiles NVIDIA GPUs only
    row.update(kernel_fields(fixed["Kernel Name"]))
    row["ncu_launch_id"] = as_int(parse_number(fixed.get("ID")))
    cc = (fixed.get("CC") or "").strip()
    if cc and cc.lower() != "n/a":
        row["compute_capability"] = cc

    def num(metric: str) -> float | None:
        value = metrics.get(metric)
        try:
            return parse_number(value)
        except BadValue as exc:
            raise BadValue(f"{metric}: {exc}") from None

    for metric in TIME_METRICS:
        if metric in metrics:
            try:
                row["latency_us"] = time_to_us(num(metric), units.get(metric, ""))
            except BadValue as exc:
                raise BadValue(f"{metric}: {exc}") from None
            break
    for metric, column in PLAIN.items():
        if metric in metrics:
            row[column] = num(metric)
    for metric, column in INTEGER.items():
        if metric in metrics:
            row[column] = as_int(num(metric))
    for table in (BYTES, EXTRA_BYTES):
        for metric, column in table.items():
            if metric in metrics:
                try:
                    value = bytes_from(num(metric), units.get(metric, ""))
                except BadValue as exc:
                    raise BadValue(f"{metric}: {exc}") from None
                row[column] = as_int(value) if table is BYTES else value
    for metric, column in EXTRA_PLAIN.items():
        if metric in metrics and row.get(column) is None:
            row[column] = num(metric)
    if CLOCK in metrics:
        try:
            row["sm_clock_mhz"] = freq_to_mhz(num(CLOCK), units.get(CLOCK, ""))
        except BadValue as exc:
            raise BadValue(f"{CLOCK}: {exc}") from None
    sectors = [num(m) for m in LOCAL_SECTORS if m in metrics]
    if sectors and all(s is not None for s in sectors):
        row["local_memory_bytes"] = sum(sectors) * SECTOR_BYTES
    numeric_stalls = {}
    for name in metrics:
        if (name.startswith(STALL_PREFIX) and name.endswith(STALL_SUFFIX)) or name == STALL_TOTAL:
            numeric_stalls[name] = num(name)
    shares = stall_shares(numeric_stalls)
    for reason in ("lg_throttle", "long_scoreboard"):
        direct = f"smsp__warp_issue_stalled_{reason}_per_warp_active.pct"
        value = num(direct) if direct in metrics else None
        if value is None:
            value = shares.get(reason)
        if value is not None:
            row[f"stall_{reason}_pct"] = value
    name = metrics.get("device__attribute_display_name")
    if isinstance(name, str) and name.strip() and name.strip().lower() not in ("n/a", "no data"):
        row["device_name"] = name.strip()
    if row.get("compute_capability") is None:
        major = num("device__attribute_compute_capability_major") if "device__attribute_compute_capability_major" in metrics else None
        minor = num("device__attribute_compute_capability_minor") if "device__attribute_compute_capability_minor" in metrics else None
        if major is not None and minor is not None:
            row["compute_capability"] = f"{int(major)}.{int(minor)}"
    if row.get("threads_per_block") is None and fixed.get("Block Size"):
        row["threads_per_block"] = dims_product(fixed["Block Size"])
    if row.get("grid_size") is None and fixed.get("Grid Size"):
        row["grid_size"] = dims_product(fixed["Grid Size"])
    st, dy = row.get("shared_mem_static_bytes"), row.get("shared_mem_dynamic_bytes")
    if st is not None and dy is not None:
        row["shared_mem_bytes"] = st + dy
    warps_from_threads(row)
    apply_range(row, launch_range(fixed))
    return row


def parse(path: Path, source_file: str) -> Parsed:
    table, line_of = read_csv(path)
    h = find_header(table)
    header = [c.strip() for c in table[h]]
    if "Metric Name" in header:
        raise IngestError("this is an Nsight Compute details page (--page details), not raw")
    body = list(zip(table[h + 1:], line_of[h + 1:]))
    units: dict[str, str] = {}
    if body and body[0][0] and body[0][0][0].strip() == "" and len(body[0][0]) == len(header):
        units = {name: unit.strip() for name, unit in zip(header, body[0][0])}
        body = body[1:]
    fixed_present = fixed_columns(header)
    dups = duplicate_columns(header)
    rows: list[dict] = []
    quarantine: list[dict] = []
    records = 0
    for cells, line in body:
        if not cells or not any(c.strip() for c in cells):
            continue  # blank line: not a record
        prov = {"source_format": FORMAT, "source_file": source_file, "source_row": records}
        records += 1
        if len(cells) != len(header):
            quarantine.append(bad({**prov, "raw_line": ",".join(cells)[:500]},
                                  f"line {line}: garbled row: {len(cells)} fields, header has {len(header)}"))
            continue
        fixed = {c: cells[header.index(c)] for c in fixed_present}
        if not (fixed.get("Kernel Name") or "").strip():
            quarantine.append(bad({**prov, "raw_line": ",".join(cells)[:500]}, f"line {line}: missing Kernel Name"))
            continue
        try:
            record = record_of(header, cells, dups)
            if parse_number(fixed.get("ID")) is None:
                raise BadValue("missing launch ID")
            metrics = {k: v for k, v in record.items() if k not in fixed_present}
            row = launch_row(metrics, units, fixed)
        except BadValue as exc:
            quarantine.append(bad({**prov, "kernel_name": fixed.get("Kernel Name")}, f"line {line}: {exc}"))
            continue
        rows.append({**row, **prov})
    note = "" if units else "no units row: values read as base units"
    return Parsed(rows=rows, quarantine=quarantine, records_in=records, note=note)
