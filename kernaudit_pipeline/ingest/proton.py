"""Proton (``triton.profiler``) hatchet JSON, plain or ``.gz``.

The file is a JSON array: the call tree's root node, then a metadata object
(``{"CUDA": {"0": {"arch": "90", "num_sms": 132, ...}}}``, or ``"HIP"`` with ``"arch":
"gfx90a"`` on AMD). A node is ``{"frame": {"name", "type"}, "metrics": {...}, "children":
[...]}``; a kernel is a leaf whose metrics hold ``time (ns)`` (summed over its launches),
``count`` (launches), ``device_id`` and ``device_type``. Older Proton writes the root
object alone.

Each leaf becomes one row: ``latency_us = time (ns) / count / 1000``, the per-call average,
and ``scope`` = the path of the scopes above it without ``ROOT`` (tritonbench writes
``x_val_[4096, 256]/triton_softmax`` over a softmax kernel: one row per input shape, not
three indistinguishable ones). A ``kernaudit:<kernel>:<shape>:<config_id>`` scope names the
launch's config. FLOP and byte metrics (``flops``, ``flops8``/``16``/``32``/``64``,
``bytes``), summed over launches like the time, become per-call ``flops`` and
``bytes_moved``; metrics set on a scope that holds exactly one timed leaf (a Triton launch
hook's ``launch_metadata``) belong to that leaf. Inner nodes are non-row records. A leaf
without a positive time and count is quarantined. The tree is walked without recursion.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat, ValidationError

from kernaudit_pipeline.core.hardware import Vendor, vendor_of
from kernaudit_pipeline.ingest._common import (
    RANGE_PREFIX, IngestError, Parsed, apply_range, bad, compute_capability_from_arch, kernel_fields,
)
from kernaudit_pipeline.ingest.sources import read_json

FORMAT = "proton"
TIME_KEY = "time (ns)"
ROOT_NAME = "ROOT"
FLOP_KEYS = ("flops", "flops8", "flops16", "flops32", "flops64")
BYTE_KEYS = ("bytes",)
MAX_DEPTH = 150


class Frame(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    type: str | None = None


class Node(BaseModel):
    """One node, shallow: its children are validated when they are visited."""

    model_config = ConfigDict(extra="allow")
    frame: Frame
    metrics: dict[str, Any] = Field(default_factory=dict)
    children: list[dict] = Field(default_factory=list)


class Leaf(BaseModel):
    """What a kernel leaf must carry to become a row."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    time_ns: FiniteFloat = Field(alias=TIME_KEY, gt=0)
    count: int = Field(gt=0, lt=1 << 62)
    device_id: str | int | None = None
    device_type: str | None = None


class Work(BaseModel):
    """FLOP and byte metrics of a node (summed over launches)."""

    model_config = ConfigDict(extra="allow")
    flops: FiniteFloat | None = Field(default=None, ge=0)
    flops8: FiniteFloat | None = Field(default=None, ge=0)
    flops16: FiniteFloat | None = Field(default=None, ge=0)
    flops32: FiniteFloat | None = Field(default=None, ge=0)
    flops64: FiniteFloat | None = Field(default=None, ge=0)
    bytes: FiniteFloat | None = Field(default=None, ge=0)

    def total_flops(self) -> float | None:
        values = [getattr(self, k) for k in FLOP_KEYS if getattr(self, k) is not None]
        return sum(values) if values else None


def is_proton(data: object) -> bool:
    if isinstance(data, list) and data and isinstance(data[0], dict):
        data = data[0]
    return isinstance(data, dict) and "frame" in data and "metrics" in data


def _devices(meta: object) -> dict[str, dict]:
    out: dict[str, dict] = {}
    if isinstance(meta, dict):
        for backend, devices in meta.items():
            if isinstance(devices, dict):
                for dev_id, info in devices.items():
                    if isinstance(info, dict):
                        out[f"{backend}:{dev_id}".lower()] = {"backend": backend, **info}
                        out.setdefault(str(dev_id), {"backend": backend, **info})
    return out


def _err(exc: ValidationError) -> str:
    err = exc.errors()[0]
    return f"{'.'.join(map(str, err['loc']))}: {err['msg']}"


def _work(metrics: dict) -> Work | None:
    if not any(k in metrics for k in (*FLOP_KEYS, *BYTE_KEYS)):
        return None
    return Work.model_validate(metrics)


def parse(path: Path, source_file: str, data: object | None = None) -> Parsed:
    if data is None:
        data = read_json(path)
    root_raw, meta = (data[0], data[1] if len(data) > 1 else None) if isinstance(data, list) else (data, None)
    devices = _devices(meta)
    rows: list[dict] = []
    quarantine: list[dict] = []
    inner = 0
    leaf_index = 0
    # (raw node, scope path above it, the work of the enclosing scope when it has one timed leaf)
    stack: list[tuple[object, tuple[str, ...], Work | None]] = [(root_raw, (), None)]
    while stack:
        raw, scope, inherited = stack.pop()
        if len(scope) > MAX_DEPTH:
            raise IngestError(f"a Proton tree deeper than {MAX_DEPTH} scopes")
        try:
            node = Node.model_validate(raw)
        except ValidationError as exc:
            if not scope:
                raise IngestError(f"not a Proton hatchet tree: {_err(exc)}") from None
            prov = {"source_format": FORMAT, "source_file": source_file, "source_row": leaf_index}
            leaf_index += 1
            quarantine.append(bad({**prov, "scope": "/".join(scope)}, f"node under {'/'.join(scope)!r}: {_err(exc)}"))
            continue
        if node.children:
            inner += 1
            path = scope if (not scope and node.frame.name == ROOT_NAME) else (*scope, node.frame.name)
            try:
                work = _work(node.metrics)
            except ValidationError:
                work = None
            timed = [c for c in node.children if isinstance(c, dict) and not c.get("children")]
            passed = work if (work is not None and len(timed) == 1) else None
            for child in reversed(node.children):  # keep the file's order
                stack.append((child, path, passed if (timed and child is timed[0]) else None))
            continue
        rows_or_bad = _leaf(node, scope, inherited, devices, source_file, leaf_index)
        leaf_index += 1
        (rows if "reason" not in rows_or_bad else quarantine).append(rows_or_bad)
    return Parsed(rows=rows, quarantine=quarantine, records_in=leaf_index + inner, other_records=inner,
                  note=f"{leaf_index} kernel leaves")


def _leaf(node: Node, scope: tuple[str, ...], inherited: Work | None, devices: dict[str, dict],
          source_file: str, index: int) -> dict:
    prov = {"source_format": FORMAT, "source_file": source_file, "source_row": index}
    scope_text = "/".join(scope) or None
    base = {**kernel_fields(node.frame.name), "scope": scope_text, **prov}
    try:
        leaf = Leaf.model_validate(node.metrics)
        work = _work(node.metrics) or inherited
    except ValidationError as exc:
        return bad({**base, "metrics": node.metrics}, f"leaf {node.frame.name!r}: {_err(exc)}")
    row = {**base, "latency_us": leaf.time_ns / leaf.count / 1000.0, "latency_samples": leaf.count,
           "proton_total_time_ns": leaf.time_ns}
    if work is not None:
        flops = work.total_flops()
        row["flops"] = None if flops is None else flops / leaf.count
        row["bytes_moved"] = None if work.bytes is None else work.bytes / leaf.count
    dev = None
    if leaf.device_id is not None:
        dev = devices.get(f"{leaf.device_type}:{leaf.device_id}".lower()) or devices.get(str(leaf.device_id))
    backend = (dev or {}).get("backend") or leaf.device_type
    arch = (dev or {}).get("arch")
    vendor = vendor_of(arch=arch, backend=backend)
    row["vendor"] = None if vendor is Vendor.UNKNOWN else str(vendor)
    if dev is not None:
        if vendor is not Vendor.AMD:
            row["compute_capability"] = compute_capability_from_arch(arch)
        row["sm_count"] = dev.get("num_sms")
        if vendor is Vendor.AMD and arch:
            row["ingest_note"] = f"AMD {arch}"
    ours = [name for name in scope if name.startswith(RANGE_PREFIX)]
    apply_range(row, ours[-1] if ours else None)
    row["scope"] = scope_text
    return row
