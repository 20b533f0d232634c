"""torch.profiler chrome traces (``export_chrome_trace``).

A JSON object with ``traceEvents`` and, from torch 2.x, ``deviceProperties``
(name, compute capability, SM count per device index). GPU kernels are
complete events (``"ph": "X"``) with ``"cat": "kernel"``, ``dur`` in
microseconds and ``args`` carrying ``registers per thread``, ``shared
memory`` (bytes), ``grid`` and ``block`` (3-vectors) and ``device``.

Kernel events are grouped by (name, device, registers, shared memory, grid,
block, enclosing range): a Triton function launched with four configs is four
rows, not one. The enclosing range is the ``gpu_user_annotation`` event (a
``record_function`` range mirrored on the GPU timeline) on the same device
and stream whose span holds the kernel's start; the capture names those
``kernaudit:<kernel>:<shape>:<config_id>``.
Each row's ``latency_us`` is the mean duration of its launches,
``latency_samples`` the number of launches, p10/p90 their spread. Every
kernel event is either in one row or quarantined (bad duration, bad args);
events of other categories are counted as non-row records.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kernaudit_pipeline.ingest._common import (
    IngestError, Parsed, apply_range, bad, compute_capability_from_arch, kernel_fields,
)
from kernaudit_pipeline.ingest.ncu_raw import VALID_WARPS

FORMAT = "torch_trace"


class DeviceProperties(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    id: int
    name: str | None = None
    computeMajor: int | None = None
    computeMinor: int | None = None
    numSms: int | None = None


class TraceEvent(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = ""
    ph: str | None = None
    cat: str | None = None
    dur: float | None = None
    args: dict | None = None


class ChromeTrace(BaseModel):
    model_config = ConfigDict(extra="allow")
    traceEvents: list[dict]
    deviceProperties: list[DeviceProperties] = Field(default_factory=list)


class KernelArgs(BaseModel):
    """The kernel event's launch facts; validated per event."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    device: int = 0
    registers_per_thread: int | None = Field(default=None, alias="registers per thread", ge=0)
    shared_memory: int | None = Field(default=None, alias="shared memory", ge=0)
    grid: tuple[int, int, int] | None = None
    block: tuple[int, int, int] | None = None


class KernelEvent(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1)
    dur: float = Field(gt=0)
    args: KernelArgs = Field(default_factory=KernelArgs)


def is_torch_trace(data: object) -> bool:
    return isinstance(data, dict) and isinstance(data.get("traceEvents"), list)


def _annotations(events: list[dict]) -> dict[tuple, list[tuple[float, float, str]]]:
    """GPU-side record_function spans per (pid, tid), sorted by start."""
    spans: dict[tuple, list[tuple[float, float, str]]] = {}
    for e in events:
        if not isinstance(e, dict) or e.get("cat") != "gpu_user_annotation":
            continue
        try:
            ts, dur = float(e["ts"]), float(e["dur"])
        except (KeyError, TypeError, ValueError):
            continue
        spans.setdefault((e.get("pid"), e.get("tid")), []).append((ts, ts + dur, str(e.get("name", ""))))
    for key in spans:
        spans[key].sort()
    return spans


def _enclosing(spans: list[tuple[float, float, str]], ts: float) -> str | None:
    """The innermost (latest-starting) span holding ``ts``."""
    inside = [name for start, end, name in spans if start <= ts <= end]
    return inside[-1] if inside else None


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    return f"{'.'.join(map(str, err['loc']))}: {err['msg']}"


def parse(path: Path, source_file: str, data: object | None = None) -> Parsed:
    if data is None:
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise IngestError(f"not a readable JSON trace ({exc})") from None
    try:
        trace = ChromeTrace.model_validate(data)
    except ValidationError as exc:
        raise IngestError(f"not a chrome trace: {_first_error(exc)}") from None
    devices = {d.id: d for d in trace.deviceProperties}
    spans = _annotations(trace.traceEvents)
    groups: dict[tuple, dict] = {}
    quarantine: list[dict] = []
    kernel_events = other = 0
    for index, raw in enumerate(trace.traceEvents):
        if not isinstance(raw, dict) or str(raw.get("cat", "")).lower() != "kernel":
            other += 1
            continue
        kernel_events += 1
        prov = {"source_format": FORMAT, "source_file": source_file, "source_row": index}
        try:
            event = KernelEvent.model_validate(raw)
        except ValidationError as exc:
            quarantine.append(bad({**prov, "kernel_name": raw.get("name"), "raw_event": raw},
                                  f"kernel event: {_first_error(exc)}"))
            continue
        a = event.args
        try:
            ts = float(raw.get("ts"))
        except (TypeError, ValueError):
            ts = None
        scope = _enclosing(spans.get((raw.get("pid"), raw.get("tid")), []), ts) if ts is not None else None
        key = (event.name, a.device, a.registers_per_thread, a.shared_memory, a.grid, a.block, scope)
        group = groups.setdefault(key, {"first": index, "durations": []})
        group["durations"].append(event.dur)

    rows: list[dict] = []
    for (name, device, regs, smem, grid, block, scope), group in groups.items():
        durations = np.asarray(group["durations"], dtype=float)
        threads = None if block is None else block[0] * block[1] * block[2]
        row = {
            **kernel_fields(name),
            "latency_us": float(durations.mean()),
            "latency_p10_us": float(np.percentile(durations, 10)),
            "latency_p90_us": float(np.percentile(durations, 90)),
            "latency_samples": int(durations.size),
            "registers_per_thread": regs,
            "shared_mem_bytes": smem,
            "threads_per_block": threads,
            "grid_size": None if grid is None else grid[0] * grid[1] * grid[2],
            "source_format": FORMAT, "source_file": source_file, "source_row": group["first"],
        }
        dev = devices.get(device)
        if dev is not None:
            row["device_name"] = dev.name
            if dev.computeMajor is not None and dev.computeMinor is not None:
                row["compute_capability"] = compute_capability_from_arch(f"{dev.computeMajor}.{dev.computeMinor}")
            row["sm_count"] = dev.numSms
        if "kernel_module" in row and threads and threads % 32 == 0 and threads // 32 in VALID_WARPS:
            row["num_warps"] = threads // 32
        apply_range(row, scope)
        rows.append(row)
    return Parsed(rows=rows, quarantine=quarantine, records_in=kernel_events + other, other_records=other,
                  note=f"{kernel_events} kernel events in {len(rows)} groups")
