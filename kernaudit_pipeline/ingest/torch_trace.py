"""torch.profiler chrome traces (``export_chrome_trace``, kineto), plain or ``.json.gz``.

A JSON object with ``traceEvents`` and, from torch 1.9, ``deviceProperties`` (older kineto:
``computeProperties``): name, compute capability, SM count and warp size per device index.
GPU kernels are complete events (``"ph": "X"``) with ``"cat": "kernel"`` (``"Kernel"`` in
kineto 2021), ``dur`` in microseconds and ``args`` carrying ``registers per thread``,
``shared memory`` (bytes), ``grid`` and ``block`` (3-vectors), ``device`` and the ``External
id`` that ties the launch to the CPU op that made it (its name and ``Input Dims``).

Kernel events are grouped by (name, device, registers, shared memory, grid, block, scope,
input shapes): a Triton function launched with four configs is four rows, and the three
input shapes of one benchmark are three rows. The scope is the innermost
``gpu_user_annotation`` span (a ``record_function`` range mirrored on the GPU timeline) that
holds the kernel's start, ``ProfilerStep#N`` excepted (a step is no scope of its own); the
capture names its ranges ``kernaudit:<kernel>:<shape>:<config_id>``.

Each row's ``latency_us`` is the mean duration of its launches, ``latency_samples`` the
number of launches, p10/p90 their spread. Traces written with whole-microsecond durations
(kineto before 2022 on V100: 636 of 8,772 launches of a ResNet-50 step read 0 us) keep
their 0 us launches in the mean, with ``timer_resolution_us`` = 1: dropping them biased a
mean of 0.034 us up to 1.0 us. A group whose every launch read 0 keeps its row with no
latency (it ran below the timer's resolution).

Vendors: a ROCm trace (device name "AMD ...", warp size 64) writes ``computeMajor`` 9 for an
MI250; that is a gfx version, so AMD rows get ``vendor`` = amd and no compute capability.
Every kernel event is either in one row or quarantined (bad duration, bad args); events of
other categories are counted as non-row records.
"""

from __future__ import annotations

import bisect
import json
import re
from pathlib import Path

import numpy as np
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, FiniteFloat, ValidationError

from kernaudit_pipeline.core.hardware import Vendor, vendor_of
from kernaudit_pipeline.ingest._common import (
    warps_from_threads,
    IngestError, Parsed, apply_range, bad, compute_capability_from_arch, kernel_fields,
)
from kernaudit_pipeline.ingest.sources import read_json

FORMAT = "torch_trace"
STEP_RE = re.compile(r"^ProfilerStep#\d+$")
AMD_WARP_SIZE = 64


class DeviceProperties(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: int
    name: str | None = None
    computeMajor: int | None = None
    computeMinor: int | None = None
    numSms: int | None = None
    warpSize: int | None = None


class ChromeTrace(BaseModel):
    model_config = ConfigDict(extra="allow")
    traceEvents: list[dict]
    deviceProperties: list[DeviceProperties] = Field(
        default_factory=list, validation_alias=AliasChoices("deviceProperties", "computeProperties"))


class KernelArgs(BaseModel):
    """The kernel event's launch facts; validated per event."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    device: int = 0
    registers_per_thread: int | None = Field(default=None, alias="registers per thread", ge=0, le=1 << 16)
    shared_memory: int | None = Field(default=None, alias="shared memory", ge=0, le=1 << 32)
    grid: tuple[int, int, int] | None = None
    block: tuple[int, int, int] | None = None
    external_id: int | None = Field(default=None, validation_alias=AliasChoices("External id", "external id"))


class KernelEvent(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1)
    dur: FiniteFloat = Field(ge=0)  # 0 is a real reading of a whole-microsecond timer
    ts: FiniteFloat | None = None
    args: KernelArgs = Field(default_factory=KernelArgs)


def is_torch_trace(data: object) -> bool:
    return isinstance(data, dict) and isinstance(data.get("traceEvents"), list)


def _is_kernel(event: object) -> bool:
    return isinstance(event, dict) and str(event.get("cat", "")).lower() == "kernel"


class _Spans:
    """GPU-side record_function spans per (pid, tid), queried by start time."""

    def __init__(self, events: list) -> None:
        spans: dict[tuple, list[tuple[float, float, str]]] = {}
        for e in events:
            if not isinstance(e, dict) or e.get("cat") != "gpu_user_annotation":
                continue
            name = str(e.get("name", ""))
            if STEP_RE.match(name):
                continue
            try:
                ts, dur = float(e["ts"]), float(e["dur"])
            except (KeyError, TypeError, ValueError):
                continue
            spans.setdefault((e.get("pid"), e.get("tid")), []).append((ts, ts + dur, name))
        self.by_stream = {k: sorted(v) for k, v in spans.items()}
        by_pid: dict[object, list] = {}
        for (pid, _), v in self.by_stream.items():
            by_pid.setdefault(pid, []).extend(v)
        self.by_pid = {k: sorted(v) for k, v in by_pid.items()}

    @staticmethod
    def _innermost(spans: list[tuple[float, float, str]], ts: float) -> str | None:
        # spans sorted by start: only those starting at or before ts can hold it
        stop = bisect.bisect_right(spans, (ts, float("inf"), "\uffff"))
        inside = [name for start, end, name in spans[:stop] if end >= ts]
        return inside[-1] if inside else None

    def scope(self, pid: object, tid: object, ts: float | None) -> str | None:
        if ts is None:
            return None
        spans = self.by_stream.get((pid, tid)) or self.by_pid.get(pid) or []
        return self._innermost(spans, ts) if spans else None


def _cpu_ops(events: list) -> dict[int, tuple[str, str | None]]:
    """External id -> (CPU op name, its input shapes as compact JSON text)."""
    out: dict[int, tuple[str, str | None]] = {}
    for e in events:
        if not isinstance(e, dict) or e.get("cat") != "cpu_op":
            continue
        args = e.get("args")
        if not isinstance(args, dict):
            continue
        ext = args.get("External id", args.get("external id"))
        if not isinstance(ext, int) or isinstance(ext, bool):
            continue
        dims = args.get("Input Dims", args.get("Input dims"))
        shapes = None
        if isinstance(dims, list) and any(d for d in dims):
            try:
                shapes = json.dumps(dims, separators=(",", ":"))
            except (TypeError, ValueError, RecursionError):
                shapes = None
        out.setdefault(ext, (str(e.get("name", "")), shapes))
    return out


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    return f"{'.'.join(map(str, err['loc']))}: {err['msg']}"


def _device_fields(dev: DeviceProperties | None) -> dict:
    if dev is None:
        return {}
    amd = (dev.warpSize == AMD_WARP_SIZE) or vendor_of(dev.name) is Vendor.AMD
    vendor = Vendor.AMD if amd else vendor_of(dev.name)
    out = {"device_name": dev.name, "sm_count": dev.numSms,
           "vendor": None if vendor is Vendor.UNKNOWN else str(vendor)}
    if not amd and dev.computeMajor is not None and dev.computeMinor is not None:
        out["compute_capability"] = compute_capability_from_arch(f"{dev.computeMajor}.{dev.computeMinor}")
    return out


def parse(path: Path, source_file: str, data: object | None = None) -> Parsed:
    if data is None:
        data = read_json(path)
    try:
        trace = ChromeTrace.model_validate(data)
    except ValidationError as exc:
        raise IngestError(f"not a chrome trace: {_first_error(exc)}") from None
    devices = {d.id: d for d in trace.deviceProperties}
    spans = _Spans(trace.traceEvents)
    ops = _cpu_ops(trace.traceEvents)
    groups: dict[tuple, dict] = {}
    quarantine: list[dict] = []
    kernel_events = other = 0
    all_whole = True
    for index, raw in enumerate(trace.traceEvents):
        if not _is_kernel(raw):
            other += 1
            continue
        kernel_events += 1
        prov = {"source_format": FORMAT, "source_file": source_file, "source_row": index}
        try:
            event = KernelEvent.model_validate(raw)
        except ValidationError as exc:
            quarantine.append(bad({**prov, "kernel_name": raw.get("name"), "raw_event": raw},
                                  f"kernel event {index}: {_first_error(exc)}"))
            continue
        a = event.args
        all_whole = all_whole and float(event.dur).is_integer()
        scope = spans.scope(raw.get("pid"), raw.get("tid"), event.ts)
        op_name, shapes = ops.get(a.external_id, (None, None)) if a.external_id is not None else (None, None)
        key = (event.name, a.device, a.registers_per_thread, a.shared_memory, a.grid, a.block, scope, shapes)
        group = groups.setdefault(key, {"first": index, "durations": [], "op": op_name})
        group["durations"].append(event.dur)

    resolution = 1.0 if all_whole and kernel_events else None
    rows: list[dict] = []
    for (name, device, regs, smem, grid, block, scope, shapes), group in groups.items():
        durations = np.asarray(group["durations"], dtype=float)
        threads = None if block is None else block[0] * block[1] * block[2]
        mean = float(durations.mean())
        row = {
            **kernel_fields(name),
            "latency_us": mean if mean > 0 else None,
            "latency_p10_us": float(np.percentile(durations, 10)),
            "latency_p90_us": float(np.percentile(durations, 90)),
            "latency_samples": int(durations.size),
            "timer_resolution_us": resolution,
            "registers_per_thread": regs,
            "shared_mem_bytes": smem,
            "threads_per_block": threads,
            "grid_size": None if grid is None else grid[0] * grid[1] * grid[2],
            "grid": None if grid is None else "x".join(map(str, grid)),
            "block": None if block is None else "x".join(map(str, block)),
            "input_shapes": shapes,
            "launch_op": group["op"],
            "source_format": FORMAT, "source_file": source_file, "source_row": group["first"],
            **_device_fields(devices.get(device)),
        }
        if mean <= 0:
            row["ingest_note"] = f"all {durations.size} launches read 0 us: below the timer's resolution"
        warps_from_threads(row)
        apply_range(row, scope)
        rows.append(row)
    note = f"{kernel_events} kernel events in {len(rows)} groups"
    if resolution:
        note += "; whole-microsecond durations: 0 us launches kept, timer_resolution_us = 1"
    return Parsed(rows=rows, quarantine=quarantine, records_in=kernel_events + other, other_records=other,
                  note=note, rows_records=sum(r["latency_samples"] for r in rows))
