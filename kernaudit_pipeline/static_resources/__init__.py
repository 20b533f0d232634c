"""Compile-time resource audit: registers, spills and shared memory per config, no GPU needed.

Triton compiles for a ``GPUTarget`` on a CPU-only machine. The figures only match what the GPU
runs when the compile reproduces the JIT's launch-time specialization (pointer and integer
divisibility, stride-1 arguments as constexpr 1): :func:`kernel_spec.specialize` does that
from each kernel module's ``compile_args``. Without it registers and spills are over-reported
and the software pipeline collapses to a single stage.

The package, in the order a sweep uses it:

- :mod:`.describe`: a kernel module as data (configs, shapes, specializations, grids), read in a
  worker so the parent never runs kernel code;
- :mod:`.workers`: spawned worker processes, every task (and every start-up) under a deadline;
- :mod:`.tasks`: what a worker does (describe a module, compile a config);
- :mod:`.compile`: one compile and the resources it yields (cuobjdump, ptxas via ``core.toolchain``);
- :mod:`.cache`: one JSON file per compile key under the data folder;
- :mod:`.results`: the row, the launch verdict against ``core.hardware``'s limits, its views;
- :mod:`.audit`: plans and sweeps; the ``kernaudit static`` command lives in ``cli/static.py``.

Standard library only at import: the GPU host imports this.
"""

from __future__ import annotations

from kernaudit_pipeline.static_resources.cache import CACHE_SCHEMA, cache_key
from kernaudit_pipeline.static_resources.compile import Resources, compile_specialized, error_message
from kernaudit_pipeline.static_resources.describe import KernelDescription, Pair
from kernaudit_pipeline.static_resources.results import (
    ARCHS, ArchSpec, CompileStatus, StaticResult, format_table, summary, to_frame, to_records,
)
from kernaudit_pipeline.static_resources.audit import (
    DEFAULT_TIMEOUT_S, KernelFailure, KernelLoadError, PlanItem, SweepReport, UnknownKernel,
    audit_all, audit_kernel, describe_kernels, resolve_kernel, sweep, sweep_report,
)

__all__ = [
    "ARCHS", "ArchSpec", "CACHE_SCHEMA", "CompileStatus", "DEFAULT_TIMEOUT_S", "KernelDescription",
    "KernelFailure", "KernelLoadError", "Pair", "PlanItem", "Resources", "StaticResult",
    "SweepReport", "UnknownKernel", "audit_all", "audit_kernel", "cache_key", "compile_specialized",
    "describe_kernels", "error_message", "format_table", "resolve_kernel", "summary", "sweep",
    "sweep_report", "to_frame", "to_records",
]
