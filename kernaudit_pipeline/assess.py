"""``kernaudit assess FILE.json``: the seed's contract, on the same rules as the pipeline.

Input: a JSON array whose items are ``{"input": {...}}`` or a bare input
object with the seed's fields. Output: one JSON object per item with the
seed's ``status``, ``spill_detected``, ``speedup_ratio`` (rounded to 2
places) and ``recommendation``, plus richer fields. Items are never dropped:
an item that fails the ``kernel_runs`` schema is still assessed (it can only
come out INCONCLUSIVE or FAILED) and its validation errors are listed.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from kernaudit_pipeline.comparisons import DEFAULT_NOISE_BAND, compare_row
from kernaudit_pipeline.kernel_runs import normalize
from kernaudit_pipeline.recommendations.rules import diagnose_row
from kernaudit_pipeline.spill_diagnostics import diagnose_record, spill_detected


class SeedItem(BaseModel):
    """An item of the seed's array; ``input`` wraps the fields when present."""

    model_config = ConfigDict(extra="allow")
    input: dict[str, Any] | None = None


class InputError(ValueError):
    """Bad input file: reported as one line, exit code 2."""


def load_items(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    if not isinstance(data, list):
        raise InputError(f"{path}: expected a JSON array of items, got {type(data).__name__}")
    items = []
    for i, raw in enumerate(data):
        if not isinstance(raw, dict):
            raise InputError(f"{path}: item {i} is {type(raw).__name__}, expected an object")
        try:
            item = SeedItem.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise InputError(f"{path}: item {i}: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
        items.append(item.input if item.input is not None else raw)
    return items


def assess_item(fields: dict[str, Any], *, source_file: str, row: int,
                noise_band: float = DEFAULT_NOISE_BAND) -> dict[str, Any]:
    record = dict(fields, source_format="seed_json", source_file=source_file, source_row=row)
    checked = normalize([record])
    validation_errors = [] if checked.quarantine.empty else list(checked.quarantine["reason"])
    verdict = compare_row(record, noise_band)
    record.update(status=str(verdict.status), status_reason=verdict.reason, speedup=verdict.speedup)
    if validation_errors and verdict.status in ("IMPROVED", "REGRESSION", "NEUTRAL"):
        # A row that fails the schema never gets a performance verdict.
        record.update(status="INCONCLUSIVE", status_reason=f"invalid input: {validation_errors[0]}")
    record["spill_detected"] = spill_detected(record)
    rec = diagnose_row(record)
    # occupancy, SRAM, roofline and the spill evidence chain, where the item has the fields
    diagnostics = {k: v for k, v in diagnose_record(record).items() if v is not None}
    return {
        "status": record["status"],
        "spill_detected": record["spill_detected"],
        "speedup_ratio": None if verdict.speedup is None else round(verdict.speedup, 2),
        "recommendation": rec.code,
        "kernel_name": fields.get("kernel_name"),
        "pct_change": None if verdict.pct_change is None else round(verdict.pct_change, 2),
        "status_reason": record["status_reason"],
        "noise_band": noise_band,
        "action": str(rec.action),
        "new_config": rec.new_config,
        "rationale": rec.rationale,
        "evidence": [asdict(e) for e in rec.evidence],
        "validation_errors": validation_errors,
        "diagnostics": diagnostics,
    }


def assess(items: list[dict[str, Any]], source_file: str,
           noise_band: float = DEFAULT_NOISE_BAND) -> list[dict[str, Any]]:
    return [assess_item(fields, source_file=source_file, row=i, noise_band=noise_band)
            for i, fields in enumerate(items)]


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kernaudit assess", description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path, help="JSON array of seed-format items")
    parser.add_argument("--noise-band", type=float, default=DEFAULT_NOISE_BAND,
                        help="relative speedup band treated as NEUTRAL (default 0.02)")
    parser.add_argument("--brief", action="store_true", help="print only the seed's four fields")
    args = parser.parse_args(argv)
    try:
        items = load_items(args.file)
    except InputError as exc:
        print(f"kernaudit assess: {exc}", file=sys.stderr)
        return 2
    results = assess(items, str(args.file), args.noise_band)
    if args.brief:
        keys = ("status", "spill_detected", "speedup_ratio", "recommendation")
        results = [{k: r[k] for k in keys} for r in results]
    print(json.dumps(results, indent=2))
    return 0
