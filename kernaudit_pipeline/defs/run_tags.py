"""The run tags kernaudit reads and writes, and the kernel selection they carry.

A run audits every kernel in ``kernels/`` unless its tag ``kernaudit/kernel_module``
names some (comma-separated module stems, e.g. ``gemm``). The kernel sensor sets it
for the kernel whose source changed, ``kernaudit audit --kernel`` sets it, and a run
launched from the UI can carry it too (Launchpad → tags). Both the static compile and
the GPU runner follow it, on purpose: the run audits those kernels, nothing else.
Tags are Dagster's public way to label a run; the run's config stays the audit's
settings.
"""

from __future__ import annotations

from collections.abc import Mapping

TRIGGER_TAG = "kernaudit/trigger"
KERNEL_TAG = "kernaudit/kernel"             # the audited kernels' names (gemm_bf16), for people
KERNEL_MODULE_TAG = "kernaudit/kernel_module"  # their module stems (gemm), what the steps read
HASH_TAG = "kernaudit/kernel_sha256"


def selected_modules(tags: Mapping[str, str]) -> list[str] | None:
    """The kernel modules this run is restricted to, or None for every kernel."""
    text = tags.get(KERNEL_MODULE_TAG, "")
    modules = [m.strip() for m in text.split(",") if m.strip()]
    return modules or None


def selection_tags(modules: list[str], names: list[str] | None = None) -> dict[str, str]:
    """The tags that restrict a run to ``modules`` (``names``: their kernel names)."""
    if not modules:
        return {}
    return {KERNEL_MODULE_TAG: ",".join(modules), KERNEL_TAG: ",".join(names or modules)}
