"""Seed-format JSON: an array of ``{"input": {...}}`` items (or bare input objects).

The seed's fields (``kernel_name``, ``block_m``, ``block_n``,
``registers_per_thread``, ``spill_stores_bytes``, ``latency_us``,
``baseline_us``) are kernel_runs columns already. An item that is not an
object is quarantined; ``expected_output`` is not an input and is left out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from kernaudit_pipeline.ingest._common import IngestError, Parsed, bad
from kernaudit_pipeline.ingest.sources import read_json

FORMAT = "seed_json"
# A bare item names a kernel and at least one measured or compiled figure of the seed's.
SEED_FIGURES = frozenset({"latency_us", "baseline_us", "registers_per_thread", "spill_stores_bytes"})


class SeedItem(BaseModel):
    model_config = ConfigDict(extra="allow")
    input: dict[str, Any] | None = None


def is_seed(data: object) -> bool:
    if not isinstance(data, list) or not data:
        return False
    first = next((x for x in data if isinstance(x, dict)), None)
    if first is None:
        return False
    return isinstance(first.get("input"), dict) or ("kernel_name" in first and bool(SEED_FIGURES & set(first)))


def parse(path: Path, source_file: str, data: object | None = None) -> Parsed:
    if data is None:
        data = read_json(path)
    if not isinstance(data, list):
        raise IngestError(f"expected a JSON array of seed items, got {type(data).__name__}")
    rows: list[dict] = []
    quarantine: list[dict] = []
    for i, raw in enumerate(data):
        prov = {"source_format": FORMAT, "source_file": source_file, "source_row": i}
        if not isinstance(raw, dict):
            quarantine.append(bad({**prov, "raw_item": raw}, f"item {i} is {type(raw).__name__}, not an object"))
            continue
        try:
            item = SeedItem.model_validate(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            quarantine.append(bad({**prov}, f"item {i}: {'.'.join(map(str, err['loc']))}: {err['msg']}"))
            continue
        fields = item.input if item.input is not None else {k: v for k, v in raw.items() if k != "expected_output"}
        rows.append({**fields, **prov})
    return Parsed(rows=rows, quarantine=quarantine, records_in=len(data))
