"""The static audit's compile cache: one JSON file per compile key under the data folder.

The key covers what decides the binary: the kernel source, the config, the specialization the
shape produces, the target and the Triton version. Shapes enter only through their
specialization, so shapes that specialize alike share one entry. A missing, unreadable or
malformed entry is a miss (and is rewritten); entries are written atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernaudit_pipeline.kernel_spec import Specialization
from kernaudit_pipeline.static_resources.results import NUMBER_FIELDS, CompileStatus

CACHE_SCHEMA = 5  # 2: ptxas wgmma diagnostics; 3: the hot loop from the SASS; 5: load layouts


@dataclass(frozen=True)
class CachedOutcome:
    status: CompileStatus
    message: str
    numbers: dict[str, Any]


def jsonable_spec(spec: Specialization) -> dict:
    return {
        "signature": spec.signature,
        "constexprs": {k: repr(v) for k, v in spec.constexprs.items()},
        "attrs": sorted([list(k), v] for k, v in spec.attrs.items()),
    }


def cache_key(kernel_source_hash: str, config: dict, spec: Specialization, arch: str,
              triton_version: str) -> str:
    blob = json.dumps({
        "schema": CACHE_SCHEMA, "kernel_source_hash": kernel_source_hash,
        "config": config, "specialization": jsonable_spec(spec), "arch": arch,
        "triton_version": triton_version,
    }, sort_keys=True, default=repr)
    return hashlib.sha256(blob.encode()).hexdigest()


def read_entry(path: Path) -> CachedOutcome | None:
    try:
        if not path.is_file():
            return None
        payload = json.loads(path.read_text())
        status = CompileStatus(payload["status"])
        message = payload["message"]
        numbers = payload["numbers"]
        if payload.get("schema") != CACHE_SCHEMA or not isinstance(message, str) or not isinstance(numbers, dict):
            return None
        for name, value in numbers.items():
            if name not in NUMBER_FIELDS or not (value is None or (
                    isinstance(value, NUMBER_FIELDS[name]) and not isinstance(value, bool))):
                return None
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    return CachedOutcome(status, message, numbers)


def write_entry(path: Path, outcome: CachedOutcome, key_fields: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"schema": CACHE_SCHEMA, "status": outcome.status.value, "message": outcome.message,
               "numbers": outcome.numbers, "key": key_fields}
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, indent=1, sort_keys=True, default=repr))
    tmp.replace(path)
