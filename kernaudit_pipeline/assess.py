"""``kernaudit assess FILE.json``: the seed's per-item contract, on the same rules as the pipeline.

Input: a JSON array whose items are ``{"input": {...}}`` or a bare input object with the seed's
fields. Output: one JSON object per item, in order, with the seed's ``status``,
``spill_detected``, ``speedup_ratio`` (rounded to 2 places) and ``recommendation``, plus richer
fields. Items are never dropped:

- an item that is not an object, or whose fields are unusable (a kernel name that is not a short
  single-line string, a number that is not a number or is absurdly large, a value nested where a
  number belongs, a tile that is not a positive power of two, num_warps outside
  {1, 2, 4, 8, 16, 32}) comes out INCONCLUSIVE with ``reject_invalid_input`` and its reasons,
  and nothing is recommended from it;
- an item that fails the ``kernel_runs`` schema is still assessed (it can only come out
  INCONCLUSIVE or FAILED) and its validation errors are listed;
- a latency or baseline outside physical bounds (under 1 ns, over 1 h) is INCONCLUSIVE.

The file itself is refused, with one line, when it is not a regular file (a FIFO, a device, a
directory), is over 64 MiB, is compressed, is not UTF-8 (or UTF-16/32 with a BOM), is not JSON,
nests deeper than 64 levels, or holds no object at all.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kernaudit_pipeline.comparisons import DEFAULT_NOISE_BAND, compare_row
from kernaudit_pipeline.core.files import FileRefused, read_bounded
from kernaudit_pipeline.kernel_runs import normalize
from kernaudit_pipeline.recommendations.rules import config_problem, diagnose_row
from kernaudit_pipeline.spill_diagnostics import diagnose_record, spill_detected

MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_DEPTH = 64
MAX_NAME_CHARS = 200
MAX_NUMBER = 1e18  # larger is a corrupt field, not a measurement (and overflows int64 columns)
TILE_FIELDS = ("block_m", "block_n", "block_k", "group_m", "split_k", "num_warps", "num_stages")
TEXT_FIELDS = ("kernel_name", "shape_name", "device_name", "dtype", "config_id", "baseline_name", "run_status",
               "compute_capability", "phase")
REJECT_CODE = "reject_invalid_input"
BRIEF_KEYS = ("status", "spill_detected", "speedup_ratio", "recommendation")


class InputError(ValueError):
    """The file as a whole cannot be assessed: one line, exit code 2."""


def _decode(raw: bytes, path: Path) -> str:
    if raw[:2] == b"\x1f\x8b":
        raise InputError(f"{path}: gzip-compressed; decompress it first")
    for bom, codec in ((b"\xef\xbb\xbf", "utf-8-sig"), (b"\xff\xfe\x00\x00", "utf-32"), (b"\x00\x00\xfe\xff", "utf-32"),
                       (b"\xff\xfe", "utf-16"), (b"\xfe\xff", "utf-16")):
        if raw.startswith(bom):
            try:
                return raw.decode(codec)
            except UnicodeDecodeError:
                raise InputError(f"{path}: not valid {codec.upper()} text despite its byte-order mark") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})") from None


def _depth(value: object) -> int:
    """Nesting depth, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            return deepest
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest


def read_file(path: Path) -> list[Any]:
    """The file's JSON array; InputError (one line) for anything that is not one."""
    try:
        raw = read_bounded(path, MAX_FILE_BYTES)
    except FileRefused as exc:
        raise InputError(str(exc)) from None
    text = _decode(raw, path)
    if not text.strip():
        raise InputError(f"{path}: empty file")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise InputError(f"{path}: JSON nested deeper than this reader allows") from None
    except ValueError as exc:  # e.g. an integer literal beyond Python's digit limit
        raise InputError(f"{path}: unreadable JSON value ({str(exc).splitlines()[0][:120]})") from None
    if not isinstance(data, list):
        raise InputError(f"{path}: expected a JSON array of items, got {type(data).__name__}")
    if _depth(data) > MAX_DEPTH:
        raise InputError(f"{path}: JSON nested deeper than {MAX_DEPTH} levels")
    if data and not any(isinstance(item, dict) for item in data):
        raise InputError(f"{path}: no seed items: item 0 is {type(data[0]).__name__}, expected an object")
    return data


def item_fields(raw: object) -> tuple[dict[str, Any] | None, list[str]]:
    """(the item's input fields, or None, and why it cannot be assessed)."""
    if not isinstance(raw, dict):
        return None, [f"item is {type(raw).__name__}, expected an object"]
    fields = raw.get("input", raw) if "input" in raw else raw
    if not isinstance(fields, dict):
        return None, [f"input is {type(fields).__name__}, expected an object"]
    problems: list[str] = []
    bad: set[str] = set()
    for key, value in fields.items():
        if isinstance(value, (dict, list)):
            problems.append(f"{key}: a nested {type(value).__name__} where a value belongs")
        elif isinstance(value, bool) and key not in ("correct", "causal", "spill_detected"):
            problems.append(f"{key}: a boolean where a number or text belongs")
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_NUMBER:
            problems.append(f"{key}: an integer of {len(str(abs(value)))} digits is too large to be a measurement")
        elif isinstance(value, float) and math.isfinite(value) and abs(value) > MAX_NUMBER:
            problems.append(f"{key}: {value:.3g} is too large to be a measurement")
        else:
            continue
        bad.add(key)
    name = fields.get("kernel_name")
    if "kernel_name" not in bad and (not isinstance(name, str) or not name.strip()):
        problems.append(f"kernel_name: {'empty' if isinstance(name, str) else type(name).__name__}, "
                        "expected a non-empty string")
    for key in TEXT_FIELDS:
        value = fields.get(key)
        if isinstance(value, str) and (len(value) > MAX_NAME_CHARS or any(ord(c) < 32 for c in value)):
            problems.append(f"{key}: not a single-line name of at most {MAX_NAME_CHARS} characters")
    tiles = {k: fields[k] for k in TILE_FIELDS if fields.get(k) is not None and k not in bad}
    for key, value in list(tiles.items()):
        if not isinstance(value, (int, float)):
            problems.append(f"{key}: {type(value).__name__}, expected a number")
            tiles.pop(key)
    if (problem := config_problem(tiles)) is not None:
        problems.append(problem)
    return fields, problems


def _rejected(fields: dict[str, Any] | None, problems: list[str], noise_band: float) -> dict[str, Any]:
    name = None if fields is None else fields.get("kernel_name")
    return {
        "status": "INCONCLUSIVE", "spill_detected": None, "speedup_ratio": None, "recommendation": REJECT_CODE,
        "kernel_name": name if isinstance(name, str) and len(name) <= MAX_NAME_CHARS else None,
        "pct_change": None, "status_reason": "invalid input: " + "; ".join(problems), "noise_band": noise_band,
        "action": "remeasure", "new_config": None, "rationale": "nothing is recommended from an invalid item",
        "evidence": [], "validation_errors": problems, "diagnostics": {},
    }


def assess_item(fields: dict[str, Any], *, source_file: str, row: int,
                noise_band: float = DEFAULT_NOISE_BAND) -> dict[str, Any]:
    record = dict(fields, source_format="seed_json", source_file=source_file, source_row=row)
    checked = normalize([record])
    validation_errors = [] if checked.quarantine.empty else list(checked.quarantine["reason"])
    verdict = compare_row(record, noise_band)
    record.update(status=str(verdict.status), status_reason=verdict.reason, speedup=verdict.speedup)
    if validation_errors and verdict.status in ("IMPROVED", "REGRESSION", "NEUTRAL", "NOISY"):
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


def assess(items: list[Any], source_file: str, noise_band: float = DEFAULT_NOISE_BAND) -> list[dict[str, Any]]:
    """One result per item, in order; an unusable item is rejected on its own."""
    out = []
    for i, raw in enumerate(items):
        fields, problems = item_fields(raw)
        if problems or fields is None:
            out.append(_rejected(fields, problems, noise_band))
        else:
            out.append(assess_item(fields, source_file=source_file, row=i, noise_band=noise_band))
    return out


def assess_file(path: Path, noise_band: float = DEFAULT_NOISE_BAND, brief: bool = False) -> list[dict[str, Any]]:
    results = assess(read_file(path), str(path), noise_band)
    if brief:
        results = [{k: r[k] for k in BRIEF_KEYS} for r in results]
    return results
