"""The ``kernel_sources`` stage: which kernel files exist, what they are called and what their bytes hash to.

The hash is the static compile cache's key and the sensor's cursor: a kernel
is re-audited exactly when its file's hash changes. The kernel's audit name
(``NAME = "gemm_bf16"`` in ``kernels/gemm.py``) is read from the source without
importing it, so the sensor can name kernels without loading Triton.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from kernaudit_pipeline.kernel_spec import KERNELS_DIR, kernel_files, source_hash


@dataclass(frozen=True)
class KernelSource:
    module: str  # file stem, e.g. "gemm"
    kernel_name: str  # the module's NAME, e.g. "gemm_bf16" (the stem when NAME is not a literal)
    path: str  # relative to the project root
    sha256: str
    size_bytes: int


def declared_name(path: Path) -> str | None:
    """The string assigned to ``NAME`` at module level, or None (no NAME, not a literal, not Python)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=path.name)
    except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "NAME" for t in node.targets):
            value = node.value
            if isinstance(value, ast.Constant) and isinstance(value.value, str) and value.value.strip():
                return value.value.strip()
    return None


def observe(kernels_dir: Path = KERNELS_DIR) -> list[KernelSource]:
    root = kernels_dir.parent
    return [
        KernelSource(module=p.stem, kernel_name=declared_name(p) or p.stem, path=str(p.relative_to(root)),
                     sha256=source_hash(p), size_bytes=p.stat().st_size)
        for p in kernel_files(kernels_dir)
    ]


def hashes(kernels_dir: Path = KERNELS_DIR) -> dict[str, str]:
    return {s.module: s.sha256 for s in observe(kernels_dir)}
