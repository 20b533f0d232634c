"""Correctness before speed: every config and every reference is checked on fresh random
inputs against the kernel module's fp32 ``reference`` before it is timed.

The output is poisoned (NaN, or the integer maximum) before the checked launch, so elements a
kernel never writes show up as non-finite. The verdict is ||out - ref|| / ||ref|| in float64
against the tolerance's ``max_rel_l2``, plus the elementwise ``atol + rtol * |ref|`` bound when
the tolerance sets one. torch is imported inside the functions: this module also holds the
error classification the parent uses, which must import without torch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from kernaudit_pipeline.bench.records import CheckResult

# Text of errors after which the CUDA context cannot be trusted: the worker must exit.
FATAL_CUDA_MARKERS = ("illegal memory access", "unspecified launch failure", "misaligned address",
                      "illegal instruction", "cuda error", "device-side assert", "an illegal")


def first_line(exc: BaseException, limit: int = 400) -> str:
    """``Type: first line of the message``, never a traceback."""
    text = f"{type(exc).__name__}: {exc}".strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return (lines[0] if lines else type(exc).__name__)[:limit]


def is_fatal_cuda(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(s in text for s in FATAL_CUDA_MARKERS)


def is_out_of_resources(exc: BaseException) -> bool:
    return type(exc).__name__ == "OutOfResources"


def is_oom(exc: BaseException) -> bool:
    return type(exc).__name__ == "OutOfMemoryError" or "out of memory" in str(exc).lower()


def poison(t) -> None:
    import torch

    if t.dtype.is_floating_point:
        t.fill_(float("nan"))
    else:
        t.fill_(torch.iinfo(t.dtype).max)


def check_outputs(out, ref, tol, seed: int, t0: float) -> CheckResult:
    """||out - ref|| / ||ref|| in float64, NaN/Inf count and the elementwise atol/rtol."""
    import torch

    if tuple(out.shape) != tuple(ref.shape):
        return CheckResult(correct=False, max_rel_error=None, max_abs_error=None,
                           nonfinite_outputs=0, elementwise_violations=None, check_seed=seed,
                           check_s=time.perf_counter() - t0)
    out_f = out.float()
    ref_f = ref.float()
    nonfinite = int((~torch.isfinite(out_f)).sum().item())
    diff = out_f - ref_f
    ref_norm = float(torch.linalg.vector_norm(ref_f, dtype=torch.float64).item())
    err_norm = float(torch.linalg.vector_norm(diff, dtype=torch.float64).item())
    rel = err_norm / ref_norm if ref_norm > 0 else (0.0 if err_norm == 0 else math.inf)
    max_abs = float(diff.abs().max().item()) if diff.numel() else 0.0
    violations = None
    if tol.atol > 0 or tol.rtol > 0:
        violations = int((diff.abs() > tol.atol + tol.rtol * ref_f.abs()).sum().item())
    correct = (nonfinite == 0 and math.isfinite(rel) and rel <= tol.max_rel_l2
               and (violations is None or violations == 0))
    return CheckResult(correct=correct, max_rel_error=rel if math.isfinite(rel) else None,
                       max_abs_error=max_abs if math.isfinite(max_abs) else None,
                       nonfinite_outputs=nonfinite, elementwise_violations=violations,
                       check_seed=seed, check_s=time.perf_counter() - t0)


def check_config(mod, shape, config: dict, seed: int, device: str, sync: Callable[[], None]) -> CheckResult:
    """Fresh inputs, a poisoned output written in place by the kernel, then the comparison."""
    t0 = time.perf_counter()
    inputs = mod.make_inputs(shape, device, seed)
    out = mod.launch(inputs, config)
    poison(out)
    out = mod.launch(inputs, config, out=out)
    sync()
    ref = mod.reference(inputs)
    return check_outputs(out, ref, mod.TOLERANCE, seed, t0)


def check_reference(reference, mod, shape, seed: int, device: str, sync: Callable[[], None]) -> CheckResult:
    """A reference on fresh inputs (prepared as it asks) against the fp32 reference, with the
    reference's own tolerance."""
    t0 = time.perf_counter()
    inputs = mod.make_inputs(shape, device, seed)
    prepared = reference.prepare(inputs) if reference.prepare is not None else inputs
    out = reference.fn(prepared)
    sync()
    ref = mod.reference(inputs)
    return check_outputs(out, ref, reference.tolerance, seed, t0)


def failure_message(check: CheckResult, tol) -> str:
    return (f"incorrect: rel err {check.max_rel_error} vs {tol.max_rel_l2}, "
            f"{check.nonfinite_outputs} non-finite, {check.elementwise_violations} elementwise "
            f"violations (atol {tol.atol}, rtol {tol.rtol})")
