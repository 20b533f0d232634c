"""ptxas ``-v`` logs (``nvcc -Xptxas -v`` or ``ptxas -v``, also Triton's bundled ptxas).

For each entry function ptxas prints::

    ptxas info    : Compiling entry function 'gemm_kernel' for 'sm_90a'
    ptxas info    : Function properties for gemm_kernel
        784 bytes stack frame, 1972 bytes spill stores, 1460 bytes spill loads
    ptxas info    : Used 255 registers, used 1 barriers, 784 bytes cumulative stack size

and, when it uses shared memory, ``..., 16384 bytes smem, 400 bytes cmem[0]``
(older ptxas: ``16384+0 bytes smem``, static + reserved). One row per entry
function and target. An entry without its ``Used N registers`` line (a
truncated log) is quarantined. ``Function properties`` blocks of non-entry
(device) functions are not rows.

A log says nothing about the config it was compiled for. The capture writes
a ``ptxas_manifest.json`` beside its logs (``ptxas_log``, ``kernel_name``,
``shape_name``, ``config_id``, ``compiled_name`` per log); when one lists the
log, its entry function gets that shape and config.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from kernaudit_pipeline.core.hardware import Vendor
from kernaudit_pipeline.core.toolchain import PTXAS_FRAME_RE, parse_ptxas_log
from kernaudit_pipeline.ingest._common import (
    IngestError, Parsed, apply_range, bad, compute_capability_from_arch, kernel_fields,
)
from kernaudit_pipeline.ingest.sources import read_json, read_text

FORMAT = "ptxas_log"
FRAME_RE = PTXAS_FRAME_RE  # the parser lives in core.toolchain; triton_cache reads this name


MANIFEST = "ptxas_manifest.json"
LOOKS_RE = re.compile(r"^ptxas info\s*: (Compiling entry function '|Used \d+ registers)", re.MULTILINE)


class ManifestEntry(BaseModel):
    model_config = ConfigDict(extra="allow")
    ptxas_log: str
    kernel_name: str
    shape_name: str | None = None
    config_id: str | None = None
    compiled_name: str | None = None


def looks_like(text: str) -> bool:
    return LOOKS_RE.search(text) is not None


def manifest_entry(path: Path) -> tuple[ManifestEntry | None, str]:
    """The sidecar manifest's entry for this log, and a note when the manifest is unusable."""
    manifest = path.parent / MANIFEST
    if not manifest.is_file():
        return None, ""
    try:
        entries = TypeAdapter(list[ManifestEntry]).validate_python(read_json(manifest))
    except (IngestError, ValidationError) as exc:
        return None, f"{MANIFEST} unusable ({type(exc).__name__})"
    return next((e for e in entries if e.ptxas_log == path.name), None), ""


def parse(path: Path, source_file: str) -> Parsed:
    text = read_text(path)
    entries = [{"func": u.function, "arch": u.target, "line": u.line + 1, "regs": u.registers,
                "stack": u.stack_frame_bytes, "stores": u.spill_stores_bytes,
                "loads": u.spill_loads_bytes, "smem": u.smem_bytes}
               for u in parse_ptxas_log(text) if u.is_entry]
    if not entries:
        raise IngestError("a ptxas log with no 'Compiling entry function' line")
    entry, note = manifest_entry(path)
    rows: list[dict] = []
    quarantine: list[dict] = []
    for index, e in enumerate(entries):
        prov = {"source_format": FORMAT, "source_file": source_file, "source_row": index}
        if not e["func"].strip():
            quarantine.append(bad({"ptxas_target": e["arch"], **prov},
                                  f"entry function with an empty name (log line {e['line']})"))
            continue
        base = {**kernel_fields(e["func"]), "compute_capability": compute_capability_from_arch(e["arch"]),
                "ptxas_target": e["arch"], "vendor": str(Vendor.NVIDIA), **prov}
        if e["regs"] is None:
            quarantine.append(bad(base, f"entry {e['func']!r} (log line {e['line']}): no 'Used N registers' line"))
            continue
        row = {**base, "registers_per_thread": e["regs"],
               "stack_frame_bytes": e.get("stack"), "spill_stores_bytes": e.get("stores"),
               "spill_loads_bytes": e.get("loads"), "shared_mem_static_bytes": e["smem"] or 0}
        if entry is not None and entry.config_id and entry.compiled_name in (None, e["func"]):
            apply_range(row, f"kernaudit:{entry.kernel_name}:{entry.shape_name or ''}:{entry.config_id}")
        rows.append(row)
    return Parsed(rows=rows, quarantine=quarantine, records_in=len(entries),
                  note="; ".join(x for x in (f"{len(entries)} entry functions", note) if x))
