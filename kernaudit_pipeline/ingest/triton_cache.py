"""Triton cache directories (``~/.triton/cache`` or ``TRITON_CACHE_DIR``).

Each compiled kernel sits in its own hash directory: ``<name>.json`` (the
metadata: ``name``, ``num_warps``, ``num_stages``, ``shared`` = dynamic shared
memory in bytes, ``target.arch``, ``triton_version``), the ``.cubin``, the
``.ptx`` and intermediate IRs, plus ``__grp__<name>.json`` listing them.
Directories holding only a launcher or utility ``.so`` are not kernels.

Resources come from the cubin through the ``cuobjdump -res-usage`` that the
triton wheel ships (``triton/backends/nvidia/bin``): ``REG`` and ``STACK``.
Its ``SHARED`` figure is static shared memory; on sm_90 cubins it includes the
driver's 1 KiB per-block reserve (cuobjdump printed ``SHARED:1024`` for a
kernel that ncu reported with 0 B static and 1.02 KB driver shared memory),
so that reserve is taken off. Spill bytes are not in the cubin's resource
table: a kernel without a stack frame has none (spills live in the stack
frame); with a stack frame, the bundled ptxas recompiles the cached ``.ptx``
with ``-v`` and its spill figures are kept when its stack frame equals the
cubin's, i.e. it reproduced the same compile. Triton >= 3.2 does not write
the constexpr values (BLOCK_M ...) into the metadata; when a metadata file
has ``constants`` keyed by name they are used.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kernaudit_pipeline.core.hardware import Vendor
from kernaudit_pipeline.ingest._common import (
    IngestError, Parsed, bad, compute_capability_from_arch, kernel_fields,
)
from kernaudit_pipeline.ingest.sources import read_json
from kernaudit_pipeline.ingest.ptxas_log import FRAME_RE

FORMAT = "triton_cache"
TOOL_TIMEOUT_S = 120
RES_RE = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")
SM90_RESERVED_SMEM = 1024
CONSTANT_COLUMNS = {"BLOCK_M": "block_m", "BLOCK_N": "block_n", "BLOCK_K": "block_k", "GROUP_M": "group_m"}


class Target(BaseModel):
    model_config = ConfigDict(extra="allow")
    backend: str | None = None
    arch: int | str | None = None


class KernelMetadata(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1)
    num_warps: int = Field(gt=0)
    num_stages: int | None = None
    shared: int = Field(ge=0)
    target: Target | None = None
    triton_version: str | None = None
    constants: dict[str, object] | None = None


def _tool(name: str) -> Path | None:
    try:
        import triton  # noqa: PLC0415
        candidate = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
        if candidate.exists():
            return candidate
    except ImportError:
        pass
    found = shutil.which(name)
    return Path(found) if found else None


def _subdirs(root: Path) -> list[Path]:
    try:
        return sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return []


def _cubins(d: Path) -> list[Path]:
    try:
        return sorted(p for p in d.glob("*.cubin") if p.is_file())
    except OSError:
        return []


def kernel_dirs(root: Path) -> list[Path]:
    """Hash directories that hold a compiled kernel, i.e. a ``.cubin`` (``root`` included).
    A cubin without its metadata JSON is still a kernel: it is quarantined, never dropped."""
    candidates = [root, *_subdirs(root)] if root.is_dir() else []
    return [d for d in candidates if _cubins(d)]


def _metadata_file(d: Path) -> Path | None:
    """The ``<name>.json`` beside a ``<name>.cubin`` that is a regular file."""
    for cubin in _cubins(d):
        meta = cubin.with_suffix(".json")
        if meta.is_file():
            return meta
    return None


def is_cache_dir(path: Path) -> bool:
    return path.is_dir() and bool(kernel_dirs(path))


def res_usage(cubin: Path) -> dict[str, int] | None:
    tool = _tool("cuobjdump")
    if tool is None:
        return None
    try:
        out = subprocess.run([str(tool), "-res-usage", str(cubin)], capture_output=True, text=True,
                             timeout=TOOL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = RES_RE.search(out.stdout)
    if match is None:
        return None
    reg, stack, shared, local = (int(g) for g in match.groups())
    return {"REG": reg, "STACK": stack, "SHARED": shared, "LOCAL": local}


def ptxas_spills(ptx: Path, arch: str) -> dict[str, int] | None:
    tool = _tool("ptxas")
    if tool is None or not ptx.exists():
        return None
    try:
        out = subprocess.run([str(tool), "-v", f"--gpu-name={arch}", str(ptx), "-o", "/dev/null"],
                             capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = FRAME_RE.search(out.stderr + out.stdout)
    if match is None:
        return None
    stack, stores, loads = (int(g) for g in match.groups())
    return {"stack": stack, "stores": stores, "loads": loads}


def _ptxas_arch(arch: int | str | None) -> str | None:
    if arch is None:
        return None
    digits = re.sub(r"\D", "", str(arch))
    if not digits:
        return None
    # Triton compiles sm_90 kernels for sm_90a (wgmma); other targets are plain.
    return f"sm_{digits}a" if digits in ("90", "100") else f"sm_{digits}"


def parse(root: Path, source_file: str) -> Parsed:
    dirs = kernel_dirs(root)
    others = [p for p in _subdirs(root) if p not in dirs] if root.is_dir() else []
    rows: list[dict] = []
    quarantine: list[dict] = []
    for index, d in enumerate(dirs):
        meta_path = _metadata_file(d)
        rel = source_file if d == root else f"{source_file.rstrip('/')}/{d.name}"
        if meta_path is None:
            cubin = _cubins(d)[0]
            prov = {"source_format": FORMAT, "source_file": f"{rel}/{cubin.name}", "source_row": index}
            beside = cubin.with_suffix(".json")
            what = "is not a regular file" if beside.exists() else "is missing"
            quarantine.append(bad(prov, f"{cubin.name}: its metadata {beside.name} {what}"))
            continue
        prov = {"source_format": FORMAT, "source_file": f"{rel}/{meta_path.name}", "source_row": index}
        try:
            meta = KernelMetadata.model_validate(read_json(meta_path))
        except IngestError as exc:
            quarantine.append(bad(prov, f"metadata JSON unreadable: {exc}"))
            continue
        except ValidationError as exc:
            err = exc.errors()[0]
            quarantine.append(bad(prov, f"metadata: {'.'.join(map(str, err['loc']))}: {err['msg']}"))
            continue
        arch = meta.target.arch if meta.target else None
        row = {**kernel_fields(meta.name), **prov,
               "num_warps": meta.num_warps, "num_stages": meta.num_stages,
               "threads_per_block": 32 * meta.num_warps,
               "shared_mem_dynamic_bytes": meta.shared, "triton_version": meta.triton_version,
               "compute_capability": compute_capability_from_arch(arch), "triton_cache_key": d.name,
               "vendor": str(Vendor.AMD if str(arch or "").startswith("gfx") else Vendor.NVIDIA)}
        for key, column in CONSTANT_COLUMNS.items():
            value = (meta.constants or {}).get(key)
            if isinstance(value, int) and value > 0:
                row[column] = value
        notes: list[str] = []
        usage = res_usage(meta_path.with_suffix(".cubin"))
        if usage is None:
            notes.append("cuobjdump unavailable or unreadable cubin: no registers")
        else:
            reserved = SM90_RESERVED_SMEM if float(compute_capability_from_arch(arch) or 0) >= 9.0 else 0
            static = max(0, usage["SHARED"] - reserved)
            row.update(registers_per_thread=usage["REG"], stack_frame_bytes=usage["STACK"],
                       shared_mem_static_bytes=static, shared_mem_bytes=static + meta.shared)
            if usage["STACK"] == 0:
                row.update(spill_stores_bytes=0, spill_loads_bytes=0)
                notes.append("no stack frame, hence no spills")
            else:
                spills = ptxas_spills(meta_path.with_suffix(".ptx"), _ptxas_arch(arch) or "sm_90a")
                if spills is not None and spills["stack"] == usage["STACK"]:
                    row.update(spill_stores_bytes=spills["stores"], spill_loads_bytes=spills["loads"])
                    notes.append("spill bytes from the bundled ptxas -v on the cached .ptx")
                else:
                    notes.append(f"{usage['STACK']} B stack frame (spills) but spill bytes not reproduced")
        row["ingest_note"] = "; ".join(notes)
        rows.append(row)
    return Parsed(rows=rows, quarantine=quarantine, records_in=len(dirs) + len(others),
                  other_records=len(others), note=f"{len(dirs)} compiled kernels")
