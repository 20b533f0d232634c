"""The references a kernel is timed against, and which library actually ran each one.

A kernel module declares ``REFERENCES`` (see :class:`kernaudit_pipeline.kernel_spec.Reference`);
a module without it has one primary reference, its ``baseline``. What a call *names* is not
what runs: SDPA picks cuDNN, FLASH or memory-efficient attention by itself, and
``torch._scaled_mm`` dispatches to cuBLAS or CUTLASS by scale layout. So the runner profiles
one call of each reference with ``torch.profiler`` and labels the backend from the GPU kernels
that took the time (:func:`classify_kernels`, pure, tested on recorded kernel names). A
composite reference names each library with a real share of its GPU time: PyTorch's gather +
SDPA is "PyTorch (ATen) + cuDNN" when the gather takes as long as the attention.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType

from kernaudit_pipeline.kernel_spec import Reference

# (substring of a lower-cased kernel name, the library it belongs to), most specific first.
KERNEL_LIBRARIES: tuple[tuple[str, str], ...] = (
    ("f8f8bf16_rowwise", "CUTLASS (f8f8bf16_rowwise)"),
    ("flashinfer", "FlashInfer"),
    ("batchdecodewithpagedkvcache", "FlashInfer"),
    ("cudnn", "cuDNN"),
    ("flash_fwd", "FlashAttention-2 (SDPA FLASH)"),
    ("pytorch_flash", "FlashAttention-2 (SDPA FLASH)"),
    ("fmha_cutlass", "CUTLASS memory-efficient attention"),
    ("cutlassf", "CUTLASS memory-efficient attention"),
    ("efficient_attention", "CUTLASS memory-efficient attention"),
    ("nvjet", "cuBLAS (nvjet)"),
    ("cublas", "cuBLAS"),
    ("xmma_gemm", "cuBLAS"),
    ("sm90_xmma", "cuBLAS"),
    ("sm80_xmma", "cuBLAS"),
    ("ampere_", "cuBLAS"),
    ("cutlass", "CUTLASS"),
    ("triton", "Triton"),
    ("at::native", "PyTorch (ATen)"),
)
# Driver copies and fills (cuBLAS and cuDNN launch a memset beside their GEMM): never a library.
DRIVER_OPS = ("memset", "memcpy")
# A library is named beside the largest when its kernels took at least this share of the time.
MIN_SHARE = 0.10


def references_of(mod: ModuleType) -> list[Reference]:
    """The module's references, primary first; ``baseline`` alone when it declares none."""
    declared = list(getattr(mod, "REFERENCES", None) or [])
    if not declared:
        return [Reference(key=None, name=mod.BASELINE_NAME, backend=None, fn=mod.baseline,
                          tolerance=mod.TOLERANCE)]
    primary = [r for r in declared if r.key is None]
    if len(primary) != 1:
        raise ValueError(f"{mod.NAME}: REFERENCES needs exactly one primary (key=None), "
                         f"found {len(primary)}")
    keys = [r.key for r in declared]
    if len(set(keys)) != len(keys):
        raise ValueError(f"{mod.NAME}: duplicate reference keys {keys}")
    return primary + [r for r in declared if r.key is not None]


def library_of(kernel_name: str) -> str | None:
    """The library a kernel belongs to; None for driver copies and fills; the name itself
    (shortened) when no library claims it, so a row still says what ran."""
    lower = kernel_name.lower()
    if any(lower.startswith(op) for op in DRIVER_OPS):
        return None
    for needle, library in KERNEL_LIBRARIES:
        if needle in lower:
            return library
    return kernel_name[:80]


def classify_kernels(kernel_times: Sequence[tuple[str, float]], min_share: float = MIN_SHARE) -> str | None:
    """What ran, from (kernel name, GPU time) pairs: the libraries that took at least
    ``min_share`` of the time, largest first, joined by " + " (the largest alone otherwise)."""
    totals: dict[str, float] = {}
    for name, us in kernel_times:
        library = library_of(name)
        if library is not None:
            totals[library] = totals.get(library, 0.0) + max(float(us), 0.0)
    if not totals:
        return None
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])
    whole = sum(totals.values())
    named = [lib for lib, us in ranked if whole > 0 and us >= min_share * whole] or [ranked[0][0]]
    return " + ".join(named)


def profile_kernels(fn: Callable[[], object], calls: int = 2) -> list[tuple[str, float]]:
    """GPU kernels (name, total µs) of ``calls`` calls of ``fn``, largest first."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    totals: dict[str, float] = {}
    for event in prof.events():
        if getattr(event, "device_type", None) is None or "CUDA" not in str(event.device_type):
            continue
        us = float(getattr(event, "device_time_total", 0.0) or getattr(event, "cuda_time_total", 0.0) or 0.0)
        totals[event.name] = totals.get(event.name, 0.0) + us
    return sorted(totals.items(), key=lambda kv: -kv[1])
