"""Kernels of someone else's: keyed, and paired with a baseline when the file holds one.

A profiler row whose kernel matches no module in ``kernels/`` (a foreign row: empty
``kernel_module``) is a candidate of its own in the audit. It is keyed by what its file
gives:

- ``config_id``: the launch configuration, ``grid<g>_block<b>_regs<r>_smem<s>`` with whatever
  parts are known (``as_profiled`` when the file gives none: a Proton leaf);
- ``shape_name``: where it ran, its scope (the parent scope when the scope is a path, so a
  kernel and its baseline in sibling scopes share it) and its input shapes.

A baseline is taken from the same file only where the file says which one it is: a
Proton/NVTX scope path ``P/X`` holding the candidate whose parent ``P`` has exactly one
other child scope ``Y`` holding only library kernels (tritonbench writes
``x_val_[4096, 256]/triton_softmax/softmax_kernel`` beside ``x_val_[4096, 256]/naive_softmax``
and its five ATen kernels). The baseline latency is the sum of ``Y``'s per-call latencies
(one call of the reference op), ``baseline_name`` is ``Y``, and ``Y``'s rows become
``config_id = "baseline"`` rows of the candidate's shape. Nothing else is guessed: a
foreign candidate without such a sibling stays baseline-less, and its group ends in
NO_DECISION with that reason.

Library kernels are recognised by their names (cuBLAS/cuBLASLt, cuDNN, CUTLASS, ATen, FBGEMM,
NCCL, rocBLAS/Tensile, MIOpen, hipBLASLt); everything else may be a candidate.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable

from kernaudit_pipeline.core.values import is_missing

AS_PROFILED = "as_profiled"
BASELINE = "baseline"
# Kernel-name markers of vendor and framework libraries (case-insensitive).
LIBRARY_RE = re.compile(
    r"(at::native|_ZN2at6native|\bat_cuda_detail|cublas|cublaslt|\bgemv|gemmSN|gemmk1|splitKreduce"
    r"|\bnvjet|xmma|cutlass|cudnn|cask_|\bampere_|\bvolta_|\bturing_|\bsm\d{2,3}_xmma|sm90_|sm80_"
    r"|fbgemm|nccl|\bCijk_|rocblas|miopen|hipblaslt|\bnaive_conv|implicit_convolve)",
    re.IGNORECASE)
BASELINE_HINT_RE = re.compile(r"(torch|aten|eager|naive|cublas|baseline|reference|\bref\b)", re.IGNORECASE)


def is_library_kernel(name: object) -> bool:
    return isinstance(name, str) and LIBRARY_RE.search(name) is not None


def is_foreign(row: dict) -> bool:
    module = row.get("kernel_module")
    return is_missing(module) or not str(module).strip()


def _text(value: object) -> str | None:
    return None if is_missing(value) or value == "" else str(value)


def launch_config_id(row: dict) -> str:
    """The launch facts the row has, as an id (never a kernel config: see core.configs)."""
    parts = []
    grid = _text(row.get("grid")) or _text(row.get("grid_size"))
    block = _text(row.get("block")) or _text(row.get("threads_per_block"))
    for label, value in (("grid", grid), ("block", block), ("regs", _text(row.get("registers_per_thread"))),
                         ("smem", _text(row.get("shared_mem_bytes")))):
        if value is not None:
            parts.append(f"{label}{value.removesuffix('.0')}")
    if row.get("ptxas_target"):
        parts.append(str(row["ptxas_target"]))
    return "_".join(parts) or AS_PROFILED


def _scope_parts(row: dict) -> list[str]:
    scope = _text(row.get("scope"))
    return [p for p in scope.split("/") if p] if scope else []


def shape_of(row: dict) -> str | None:
    parts = _scope_parts(row)
    where = "/".join(parts[:-1]) if len(parts) > 1 else (parts[0] if parts else None)
    shapes = _text(row.get("input_shapes"))
    named = [p for p in (where, shapes) if p]
    return " ".join(named) if named else None


def key_rows(rows: Iterable[dict]) -> None:
    """``config_id`` and ``shape_name`` of foreign rows that have none (in place)."""
    for row in rows:
        if not is_foreign(row):
            continue
        if is_missing(row.get("config_id")):
            row["config_id"] = launch_config_id(row)
        if is_missing(row.get("shape_name")):
            row["shape_name"] = shape_of(row)


def pair_baselines(rows: list[dict]) -> int:
    """Give foreign candidates the sibling-scope baseline their file holds (in place);
    returns how many candidates were paired."""
    children: dict[tuple[str, ...], dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        parts = _scope_parts(row)
        if len(parts) >= 2 and is_foreign(row):
            children[tuple(parts[:-1])][parts[-1]].append(row)
    paired = 0
    for parent, scopes in children.items():
        library = {name: members for name, members in scopes.items()
                   if members and all(is_library_kernel(r.get("profiler_kernel_name") or r.get("kernel_name"))
                                      for r in members)}
        for name, members in scopes.items():
            candidates = [r for r in members if not is_library_kernel(r.get("profiler_kernel_name")
                                                                     or r.get("kernel_name"))]
            if not candidates or name in library:
                continue
            options = {n: m for n, m in library.items() if n != name}
            if len(options) > 1:
                hinted = {n: m for n, m in options.items() if BASELINE_HINT_RE.search(n)}
                options = hinted if len(hinted) == 1 else {}
            if len(options) != 1:
                continue
            base_name, base_rows = next(iter(options.items()))
            latencies = [r.get("latency_us") for r in base_rows]
            if any(is_missing(v) or not isinstance(v, (int, float)) for v in latencies):
                continue
            total = float(sum(latencies))
            shape = "/".join(parent) or None
            for row in candidates:
                row["baseline_us"] = total
                row["baseline_name"] = base_name
                row["baseline_backend"] = f"{len(base_rows)} library kernel{'s' if len(base_rows) > 1 else ''}"
                row["shape_name"] = shape if is_missing(row.get("shape_name")) else row["shape_name"]
                paired += 1
            for row in base_rows:
                row["config_id"] = BASELINE
                row["baseline_of"] = ", ".join(sorted({str(r["kernel_name"]) for r in candidates}))
                row["shape_name"] = shape
    return paired


def prepare(rows: list[dict]) -> int:
    """Pair, then key, a file's rows; returns the number of paired candidates."""
    paired = pair_baselines(rows)
    key_rows(rows)
    return paired
