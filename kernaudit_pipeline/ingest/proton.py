"""Proton (``triton.profiler``) hatchet JSON.

The file is a JSON array: the call tree's root node, then a metadata object
(``{"CUDA": {"0": {"arch": "90", "num_sms": 132, ...}}}``). A node is
``{"frame": {"name", "type"}, "metrics": {...}, "children": [...]}``; a kernel
is a leaf whose metrics hold ``time (ns)`` (summed over its launches),
``count`` (launches) and ``device_id``. Older Proton writes the root object
alone. Each leaf becomes one row: ``latency_us = time (ns) / count / 1000``,
the per-call average, with the scope path (``ROOT/…``) kept beside it; a
``kernaudit:<kernel>:<shape>:<config_id>`` scope names the launch's config. Inner
nodes (scopes, the root) are non-row records. A leaf without a positive time
and count is quarantined.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kernaudit_pipeline.ingest._common import (
    RANGE_PREFIX, IngestError, Parsed, apply_range, bad, compute_capability_from_arch, kernel_fields,
)

FORMAT = "proton"
TIME_KEY = "time (ns)"


class Frame(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    type: str | None = None


class Node(BaseModel):
    model_config = ConfigDict(extra="allow")
    frame: Frame
    metrics: dict[str, Any] = Field(default_factory=dict)
    children: list[Node] = Field(default_factory=list)


class Leaf(BaseModel):
    """What a kernel leaf must carry to become a row."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    time_ns: float = Field(alias=TIME_KEY, gt=0)
    count: int = Field(gt=0)
    device_id: str | int | None = None


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
                        out[str(dev_id)] = {"backend": backend, **info}
    return out


def parse(path: Path, source_file: str, data: object | None = None) -> Parsed:
    if data is None:
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise IngestError(f"not a readable JSON file ({exc})") from None
    root_raw, meta = (data[0], data[1] if len(data) > 1 else None) if isinstance(data, list) else (data, None)
    try:
        root = Node.model_validate(root_raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise IngestError(f"not a Proton hatchet tree: {'.'.join(map(str, err['loc']))}: {err['msg']}") from None
    devices = _devices(meta)
    rows: list[dict] = []
    quarantine: list[dict] = []
    inner = 0
    leaf_index = 0

    def walk(node: Node, scope: list[str]) -> None:
        nonlocal inner, leaf_index
        if node.children:
            inner += 1
            for child in node.children:
                walk(child, [*scope, node.frame.name])
            return
        prov = {"source_format": FORMAT, "source_file": source_file, "source_row": leaf_index}
        leaf_index += 1
        base = {**kernel_fields(node.frame.name), "proton_scope": "/".join(scope), **prov}
        try:
            leaf = Leaf.model_validate(node.metrics)
        except ValidationError as exc:
            err = exc.errors()[0]
            quarantine.append(bad({**base, "metrics": node.metrics},
                                  f"leaf {node.frame.name!r}: {'.'.join(map(str, err['loc']))}: {err['msg']}"))
            return
        row = {**base, "latency_us": leaf.time_ns / leaf.count / 1000.0, "latency_samples": leaf.count,
               "proton_total_time_ns": leaf.time_ns}
        dev = devices.get(str(leaf.device_id)) if leaf.device_id is not None else None
        if dev is not None:
            row["compute_capability"] = compute_capability_from_arch(dev.get("arch"))
            row["sm_count"] = dev.get("num_sms")
        ours = [name for name in scope if name.startswith(RANGE_PREFIX)]
        apply_range(row, ours[-1] if ours else None)
        rows.append(row)

    walk(root, [])
    return Parsed(rows=rows, quarantine=quarantine, records_in=leaf_index + inner, other_records=inner,
                  note=f"{leaf_index} kernel leaves")
