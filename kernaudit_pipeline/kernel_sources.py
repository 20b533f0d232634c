"""The ``kernel_sources`` stage: which kernel files exist and what their bytes hash to.

The hash is the static compile cache's key and the sensor's cursor: a kernel
is re-audited exactly when its file's hash changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kernaudit_pipeline.kernel_spec import KERNELS_DIR, kernel_files, source_hash


@dataclass(frozen=True)
class KernelSource:
    module: str  # file stem, e.g. "gemm"
    path: str  # relative to the project root
    sha256: str
    size_bytes: int


def observe(kernels_dir: Path = KERNELS_DIR) -> list[KernelSource]:
    root = kernels_dir.parent
    return [
        KernelSource(module=p.stem, path=str(p.relative_to(root)), sha256=source_hash(p),
                     size_bytes=p.stat().st_size)
        for p in kernel_files(kernels_dir)
    ]


def hashes(kernels_dir: Path = KERNELS_DIR) -> dict[str, str]:
    return {s.module: s.sha256 for s in observe(kernels_dir)}
