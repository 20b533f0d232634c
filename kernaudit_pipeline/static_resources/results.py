"""What one static compile concludes: the result record, the launch verdict and its views.

A compile yields numbers (registers, spills, shared memory); whether the block could launch is
decided here against the target's per-block limits, which live in ``core.hardware`` (Triton
only raises OutOfResources when loading on a GPU, so a CPU compile has to compute it).
"""

from __future__ import annotations

import dataclasses
import enum
import json
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from kernaudit_pipeline.core.configs import config_id, kernel_config_to_columns
from kernaudit_pipeline.core.hardware import SM_RESOURCES, SMResources

MAX_TMEM_COLUMNS = 512  # Blackwell tensor memory per CTA, the limit Triton checks at load


class CompileStatus(enum.StrEnum):
    OK = "OK"
    COMPILE_ERROR = "COMPILE_ERROR"
    COMPILE_TIMEOUT = "COMPILE_TIMEOUT"
    # Compiled, but the launch would be refused (shared memory over the opt-in limit, or too
    # many threads). Triton only raises OutOfResources when loading on a GPU, so it is computed.
    OUT_OF_RESOURCES = "OUT_OF_RESOURCES"


@dataclass(frozen=True)
class ArchSpec:
    """A compile target: its name for people (``sm_90``), Triton's capability and its SM."""

    name: str
    capability: int
    sm: SMResources

    @property
    def smem_per_block_optin_bytes(self) -> int:
        return self.sm.smem_per_block_optin_bytes

    @property
    def compute_capability(self) -> str:
        return self.sm.compute_capability


def _arch_name(cc: str) -> str:
    major, minor = cc.split(".")
    return f"sm_{major}{minor}"


# Every target core.hardware knows the SM of.
ARCHS: MappingProxyType[str, ArchSpec] = MappingProxyType({
    _arch_name(cc): ArchSpec(_arch_name(cc), int(cc.replace(".", "")), sm)
    for cc, sm in SM_RESOURCES.items()
})


@dataclass(frozen=True)
class StaticResult:
    """One compiled (kernel, config, shape, arch)."""

    kernel_name: str
    config_id: str
    config: dict[str, Any]
    shape_name: str
    arch: str
    status: CompileStatus
    message: str
    registers_per_thread: int | None
    spill_stores_bytes: int | None
    spill_loads_bytes: int | None
    stack_frame_bytes: int | None
    shared_mem_static_bytes: int | None
    shared_mem_dynamic_bytes: int | None
    shared_mem_bytes: int | None
    shared_mem_limit_bytes: int
    threads_per_block: int | None
    tmem_columns: int | None  # Blackwell tensor memory columns
    # Wall time of triton.compile when this row was computed; small when Triton's own cache
    # (under the data folder) already held the binary.
    compile_seconds: float | None
    triton_version: str
    kernel_source_hash: str
    cached: bool
    # ptxas diagnostics on sm_90's asynchronous MMA (None before sm_90 or when unknown)
    wgmma_serialized: bool | None = None
    wgmma_waits_injected: bool | None = None
    # the hot loop from the cubin's SASS, per warp and iteration (``sass_loop``; None when unread)
    loop_instructions: int | None = None
    loop_mma_ops: int | None = None
    loop_local_ops: int | None = None
    # the loop's tile loads per program and iteration: bytes, and the 128-byte lines they touch
    # (``ttgir_loads``; None when unread)
    loop_load_bytes: int | None = None
    loop_line_bytes: int | None = None

    @property
    def spills(self) -> bool | None:
        if self.spill_stores_bytes is None:
            return None
        return self.spill_stores_bytes > 0 or (self.spill_loads_bytes or 0) > 0


# The numbers a compile yields (and the cache stores), with the types a cache entry may hold.
NUMBER_FIELDS: MappingProxyType[str, tuple[type, ...]] = MappingProxyType({
    "registers_per_thread": (int,), "spill_stores_bytes": (int,), "spill_loads_bytes": (int,),
    "stack_frame_bytes": (int,), "shared_mem_static_bytes": (int,),
    "shared_mem_dynamic_bytes": (int,), "shared_mem_bytes": (int,), "threads_per_block": (int,),
    "tmem_columns": (int,), "compile_seconds": (int, float),
    "wgmma_serialized": (int,), "wgmma_waits_injected": (int,),
    "loop_instructions": (int,), "loop_mma_ops": (int,), "loop_local_ops": (int,),
    "loop_load_bytes": (int,), "loop_line_bytes": (int,),
})


def make_result(*, kernel_name: str, config: dict, shape_name: str, arch: ArchSpec,
                status: CompileStatus, message: str, numbers: dict[str, Any], triton_version: str,
                kernel_source_hash: str, cached: bool) -> StaticResult:
    """The row for one compile outcome, with the launch verdict applied."""
    n = {name: numbers.get(name) for name in NUMBER_FIELDS}
    reserve = arch.sm.smem_reserved_per_block_bytes
    if arch.capability >= 90 and (n.get("shared_mem_static_bytes") or 0) >= reserve:
        # The cubin's SHARED on sm_90+ includes the 1 KiB the driver reserves per block
        # (cudaDevAttrReservedSharedMemoryPerBlock); ncu reports it as static 0, and the
        # occupancy arithmetic adds the reserve itself, so it is taken out here.
        n["shared_mem_static_bytes"] -= reserve
        if n.get("shared_mem_bytes") is not None:
            n["shared_mem_bytes"] -= reserve
    limit = arch.smem_per_block_optin_bytes
    if status is CompileStatus.OK:
        if n["shared_mem_bytes"] is not None and n["shared_mem_bytes"] > limit:
            status = CompileStatus.OUT_OF_RESOURCES
            message = (f"shared memory {n['shared_mem_bytes']} B (static {n['shared_mem_static_bytes']}"
                       f" + dynamic {n['shared_mem_dynamic_bytes']}) exceeds the {limit} B per-block"
                       f" opt-in limit of {arch.name}")
        elif n["threads_per_block"] is not None and n["threads_per_block"] > arch.sm.max_threads_per_block:
            status = CompileStatus.OUT_OF_RESOURCES
            message = f"{n['threads_per_block']} threads per block exceed {arch.sm.max_threads_per_block}"
        elif n["tmem_columns"] is not None and n["tmem_columns"] > MAX_TMEM_COLUMNS:
            status = CompileStatus.OUT_OF_RESOURCES
            message = f"{n['tmem_columns']} tensor-memory columns exceed {MAX_TMEM_COLUMNS}"
    return StaticResult(
        kernel_name=kernel_name, config_id=config_id(config), config=config,
        shape_name=shape_name, arch=arch.name, status=status, message=message,
        registers_per_thread=n["registers_per_thread"], spill_stores_bytes=n["spill_stores_bytes"],
        spill_loads_bytes=n["spill_loads_bytes"], stack_frame_bytes=n["stack_frame_bytes"],
        shared_mem_static_bytes=n["shared_mem_static_bytes"],
        shared_mem_dynamic_bytes=n["shared_mem_dynamic_bytes"],
        shared_mem_bytes=n["shared_mem_bytes"], shared_mem_limit_bytes=limit,
        threads_per_block=n["threads_per_block"], tmem_columns=n["tmem_columns"],
        compile_seconds=n["compile_seconds"], triton_version=triton_version,
        kernel_source_hash=kernel_source_hash, cached=cached,
        wgmma_serialized=None if n["wgmma_serialized"] is None else bool(n["wgmma_serialized"]),
        wgmma_waits_injected=None if n["wgmma_waits_injected"] is None else bool(n["wgmma_waits_injected"]),
        loop_instructions=n["loop_instructions"], loop_mma_ops=n["loop_mma_ops"],
        loop_local_ops=n["loop_local_ops"],
        loop_load_bytes=n["loop_load_bytes"], loop_line_bytes=n["loop_line_bytes"],
    )


def to_records(results: list[StaticResult]) -> list[dict]:
    """Plain dicts with ``kernel_runs`` column names (config flattened, arch as cc)."""
    records = []
    for r in results:
        rec = dataclasses.asdict(r)
        rec["status"] = r.status.value
        rec["config"] = json.dumps(r.config, sort_keys=True)
        rec.update({col: None for col in ("block_m", "block_n", "block_k", "group_m",
                                          "num_warps", "num_stages")})
        rec.update(kernel_config_to_columns(r.config))
        rec["compute_capability"] = ARCHS[r.arch].compute_capability
        records.append(rec)
    return records


def to_frame(results: list[StaticResult]):
    """A pandas frame of :func:`to_records`."""
    import pandas as pd  # noqa: PLC0415 - the GPU host imports this package without pandas

    return pd.DataFrame.from_records(to_records(results))


def _fmt(value: Any) -> str:
    return "-" if value is None else str(value)


def format_table(results: list[StaticResult]) -> str:
    header = ["kernel", "config_id", "status", "regs", "spill_st_B", "spill_ld_B", "stack_B",
              "smem_B", "smem/limit", "compile_s"]
    lines = [header]
    for r in results:
        ratio = "-" if r.shared_mem_bytes is None else f"{100 * r.shared_mem_bytes / r.shared_mem_limit_bytes:.0f}%"
        secs = "-" if r.compile_seconds is None else f"{r.compile_seconds:.2f}" + (" (cached)" if r.cached else "")
        lines.append([r.kernel_name, r.config_id, r.status.value, _fmt(r.registers_per_thread),
                      _fmt(r.spill_stores_bytes), _fmt(r.spill_loads_bytes),
                      _fmt(r.stack_frame_bytes), _fmt(r.shared_mem_bytes), ratio, secs])
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    numeric = set(range(3, len(header)))
    return "\n".join("  ".join(c.rjust(w) if i in numeric else c.ljust(w)
                               for i, (c, w) in enumerate(zip(row, widths))).rstrip()
                     for row in lines)


def summary(results: list[StaticResult]) -> str:
    by = {s: sum(1 for r in results if r.status is s) for s in CompileStatus}
    spilling = sum(1 for r in results if r.spills)
    arch = results[0].arch if results else "-"
    return (f"{len(results)} rows for {arch}: {by[CompileStatus.OK]} ok, {spilling} spilling, "
            f"{by[CompileStatus.OUT_OF_RESOURCES]} out of resources, "
            f"{by[CompileStatus.COMPILE_ERROR]} compile errors, {by[CompileStatus.COMPILE_TIMEOUT]} timeouts")
