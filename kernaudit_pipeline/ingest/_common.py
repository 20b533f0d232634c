"""What every parser shares: the parse result, kernel names, capture ranges, provenance.

Numbers and units live in :mod:`.units`, file access in :mod:`.sources`.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import pandas as pd

from kernaudit_pipeline.core.configs import VALID_NUM_WARPS
from kernaudit_pipeline.ingest.sources import IngestError, UnknownFormat
from kernaudit_pipeline.ingest.units import BadValue, as_int, parse_number
from kernaudit_pipeline.kernel_spec import KERNELS_DIR, kernel_files
from kernaudit_pipeline.kernel_runs import quarantine_row


@dataclass(frozen=True)
class Parsed:
    """One file's yield. ``records_in`` counts the file's records in the unit the format has
    (launches, kernel events, leaves, entries, lines, items); every record is in exactly one
    of: the rows (``rows_records`` of them), the quarantine, or ``other_records`` (records
    that are no kernel row by nature: peaks, summaries, scopes, non-kernel events).
    A large file gives its rows as ``frame`` (kernel_runs columns) instead of ``rows``."""

    rows: list[dict]
    quarantine: list[dict]
    records_in: int
    other_records: int = 0
    rules: list[dict] = field(default_factory=list)
    peaks: list[dict] = field(default_factory=list)
    note: str = ""
    frame: pd.DataFrame | None = None
    rows_records: int | None = None  # records the rows stand for (default: one per row)

    @property
    def row_count(self) -> int:
        return len(self.rows) + (0 if self.frame is None else len(self.frame))

    @property
    def accounted(self) -> bool:
        """records in = kept + quarantined + non-row."""
        kept = self.row_count if self.rows_records is None else self.rows_records
        return self.records_in == kept + len(self.quarantine) + self.other_records


def compute_capability_from_arch(arch: object) -> str | None:
    """``90`` / ``"sm_90a"`` / ``"9.0"`` -> ``"9.0"``; an AMD ``gfx90a`` is no compute capability."""
    if arch is None:
        return None
    s = str(arch).strip().lower()
    if s.startswith("gfx"):
        return None
    s = s.removeprefix("sm_").rstrip("af")
    if not s:
        return None
    if re.fullmatch(r"\d+\.\d+", s):
        return s
    if s.isdigit() and len(s) >= 2:
        return f"{s[:-1]}.{s[-1]}"
    return None


# ---------------------------------------------------------------------------------------------
# Kernel names: a Triton function name back to its kernaudit module's NAME
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KernelIdentity:
    kernel_name: str  # the module's NAME
    module: str  # file stem
    dtype: str | None


def _module_identity(path: Path) -> tuple[str, KernelIdentity] | None:
    """Read NAME, DTYPE and KERNEL's function name without importing torch/triton.

    Falls back to importing the module (``load_kernel_module``) when KERNEL is not
    a plain name bound to a ``def`` in the module.
    """
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except (OSError, SyntaxError):
        return None
    consts: dict[str, object] = {}
    defs: set[str] = set()
    kernel_target: str | None = None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            defs.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if not isinstance(target, ast.Name) or node.value is None:
                    continue
                if target.id == "KERNEL" and isinstance(node.value, ast.Name):
                    kernel_target = node.value.id
                elif isinstance(node.value, ast.Constant):
                    consts[target.id] = node.value.value
    name, dtype = consts.get("NAME"), consts.get("DTYPE")
    func = kernel_target if kernel_target in defs else None
    if func is None or not isinstance(name, str):
        try:
            from kernaudit_pipeline.kernel_spec import load_kernel_module  # noqa: PLC0415

            module = load_kernel_module(path)
            func, name, dtype = module.KERNEL.__name__, module.NAME, getattr(module, "DTYPE", None)
        except Exception:  # noqa: BLE001 - a broken kernel module only loses the name mapping
            return None
    return func, KernelIdentity(kernel_name=str(name), module=path.stem,
                                dtype=None if dtype is None else str(dtype))


@lru_cache(maxsize=4)
def kernel_identities(kernels_dir: Path = KERNELS_DIR) -> dict[str, KernelIdentity]:
    """Function name -> identity, for names that exactly one module declares."""
    found: dict[str, list[KernelIdentity]] = {}
    for path in kernel_files(kernels_dir):
        got = _module_identity(path)
        if got is not None:
            found.setdefault(got[0], []).append(got[1])
    return {func: ids[0] for func, ids in found.items() if len(ids) == 1}


def module_of(kernel_name: str) -> str | None:
    """The ``kernels/`` module stem that declares ``NAME = kernel_name``."""
    for ident in kernel_identities().values():
        if ident.kernel_name == kernel_name:
            return ident.module
    return None


def identify(raw_name: str) -> KernelIdentity | None:
    """A profiler's kernel name (Triton prints the bare function name) to a module."""
    key = raw_name.strip()
    ids = kernel_identities()
    if key in ids:
        return ids[key]
    # ncu may print a demangled signature for non-Triton kernels: never guess a module for those.
    return None


def strip_range_prefix(name: str) -> tuple[str, str | None]:
    """ncu ``--rename-kernels`` with NVTX prints ``<range>/<kernel>``: split the range off."""
    if name.startswith(RANGE_PREFIX) and "/" in name:
        head, _, tail = name.partition("/")
        return tail, head
    return name, None


def kernel_fields(raw_name: str) -> dict:
    """kernel_name (mapped or raw), the raw profiler name, and the module's dtype."""
    raw_name, _ = strip_range_prefix(raw_name.strip())
    ident = identify(raw_name)
    if ident is None:
        return {"kernel_name": raw_name, "profiler_kernel_name": raw_name}
    return {"kernel_name": ident.kernel_name, "profiler_kernel_name": raw_name,
            "kernel_module": ident.module, "dtype": ident.dtype}


def warps_from_threads(row: dict) -> None:
    """``num_warps`` of a launch of a ``kernels/`` Triton kernel (a Triton block is
    ``32 * num_warps`` threads); never guessed for other kernels (a cuDNN block is no config)."""
    threads = row.get("threads_per_block")
    name = row.get("profiler_kernel_name")
    if (isinstance(name, str) and identify(name) is not None and isinstance(threads, int) and threads > 0
            and threads % 32 == 0 and threads // 32 in VALID_NUM_WARPS):
        row["num_warps"] = threads // 32


def bad(row: dict, reason: str) -> dict:
    return quarantine_row(row, reason)


# ---------------------------------------------------------------------------------------------
# Ranges: the capture names each target ``kernaudit:<kernel>:<shape>:<config_id>``
# (an NVTX range for ncu, a record_function for torch.profiler, a scope for Proton)
# ---------------------------------------------------------------------------------------------
RANGE_PREFIX = "kernaudit:"
# config_id() short names -> kernel_runs columns
_CONFIG_TOKENS = (("BKV", None), ("BM", "block_m"), ("BN", "block_n"), ("BK", "block_k"), ("GM", "group_m"),
                  ("BD", None), ("PS", None), ("w", "num_warps"), ("s", "num_stages"))
_TOKEN_RE = re.compile(r"^([A-Za-z]+?)(\d+)$")


@dataclass(frozen=True)
class RangeInfo:
    kernel_name: str
    shape_name: str
    config_id: str

    @property
    def is_baseline(self) -> bool:
        return self.config_id.startswith("baseline")


def parse_range(text: object) -> RangeInfo | None:
    """``kernaudit:gemm_bf16:llama3_8b_qkv_prefill:BK64_BM128_BN256_GM8_s3_w8`` -> its parts."""
    if not isinstance(text, str):
        return None
    start = text.rfind(RANGE_PREFIX)
    if start < 0:
        return None
    parts = text[start + len(RANGE_PREFIX):].split(":")
    if len(parts) < 3 or not all(parts[:3]):
        return None
    return RangeInfo(kernel_name=parts[0], shape_name=parts[1], config_id=parts[2])


def config_from_id(config_id: str) -> dict[str, int]:
    """``BK64_BM128_BN256_GM8_s3_w8`` -> block_k, block_m, block_n, group_m, num_stages, num_warps."""
    out: dict[str, int] = {}
    for token in config_id.split("_"):
        match = _TOKEN_RE.match(token)
        if not match:
            continue
        key, value = match.group(1), int(match.group(2))
        column = dict(_CONFIG_TOKENS).get(key)
        if column and value > 0:
            out[column] = value
    return out


def apply_range(row: dict, range_text: str | None) -> None:
    """Attach the capture's range to a launch: shape for every launch in it; the config only
    to the audited kernel itself (a helper kernel or a library baseline kernel keeps none)."""
    if not range_text:
        return
    row["capture_range"] = range_text
    if row.get("scope") is None:
        row["scope"] = range_text
    info = parse_range(range_text)
    if info is None:
        return
    row["shape_name"] = info.shape_name
    if not row.get("kernel_module"):
        # a launch inside a module's capture (its baseline, a helper kernel) is evidence of
        # that module's audit, never a foreign candidate of its own
        row["kernel_module"] = module_of(info.kernel_name)
    if info.is_baseline:
        row["baseline_of"] = info.kernel_name
        return
    if row.get("kernel_name") != info.kernel_name:
        return
    row["config_id"] = info.config_id
    config = config_from_id(info.config_id)
    warps = config.get("num_warps")
    threads = row.get("threads_per_block")
    if warps is not None and threads is not None and threads != 32 * warps:
        row["ingest_note"] = f"range says {warps} warps, launch has {threads} threads"
        config.pop("num_warps")
    for column, value in config.items():
        if row.get(column) is None:
            row[column] = value


_QUOTED_RE = re.compile(r'"([^"]*)"')
NVTX_PAYLOAD_FIELDS = 6  # PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg after the range name


def nvtx_range_text(cell: object) -> str | None:
    """The innermost range of ncu's NVTX column.

    ncu writes ``<tid>  "<domain>:<range>:<PL_Type>:<PL_Value>:<CLR_Type>:<Color>:<Msg_Type>:<Msg>"``
    per open range (``thread Domain:Push/Pop_Range:...`` header); the domain and the six
    payload fields are dropped, the range name kept.
    """
    if not isinstance(cell, str) or not cell.strip():
        return None
    quoted = _QUOTED_RE.findall(cell) or [cell.strip()]
    ours = [q for q in quoted if RANGE_PREFIX in q]
    text = (ours or quoted)[-1]
    parts = text.split(":")
    if len(parts) > NVTX_PAYLOAD_FIELDS + 1:
        parts = parts[:-NVTX_PAYLOAD_FIELDS]
    if parts and parts[0].startswith("<") and parts[0].endswith(">"):
        parts = parts[1:]  # "<default domain>"
    return ":".join(parts) or None
