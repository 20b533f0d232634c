"""Compile one (config, shape) through the JIT's own ``warmup`` and read its resources.

``warmup`` specializes exactly as the launch will (dtype and 16-byte alignment of each
pointer, integers equal to 1, divisibility by 16), so the kernel whose registers, stack frame
and shared memory are read is the kernel that is timed; the worker checks that the launch
reused it (``launch_matches_compile``). Runs only in worker processes.
"""

from __future__ import annotations

import time
from dataclasses import replace

from kernaudit_pipeline.bench.records import StaticInfo
from kernaudit_pipeline.kernel_spec import Ptr

_TORCH_DTYPES = {
    "bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64",
    "fp8e4nv": "float8_e4m3fn", "fp8e5": "float8_e5m2", "fp8e4b15": "float8_e4m3fn",
    "i8": "int8", "u8": "uint8", "i16": "int16", "i32": "int32", "i64": "int64", "i1": "bool",
}


def _materialize(value: object, keep: list, device: str) -> object:
    """A real (tiny) tensor for a ``Ptr``: the JIT specializes on dtype and 16-byte alignment
    only, so warming up with it compiles exactly the kernel the launch will run."""
    import torch

    if not isinstance(value, Ptr):
        return value
    dtype = getattr(torch, _TORCH_DTYPES.get(value.dtype, value.dtype))
    base = torch.empty(64, dtype=dtype, device=device)
    keep.append(base)
    return base if value.aligned else base[1:]


def jit_cache_size(kernel) -> int | None:
    import torch

    try:
        return len(kernel.device_caches[torch.cuda.current_device()][0])
    except Exception:  # another triton version's layout: the row says null
        return None


def compile_static(mod, shape, config: dict, max_shared: int | None, load: bool = True,
                   device: str = "cuda") -> tuple[StaticInfo, object]:
    """Compile through ``KERNEL.warmup`` and read the resources. Raises on compile errors and
    on OutOfResources from loading; shared memory over ``max_shared`` returns before loading
    (registers and the stack frame then stay unknown)."""
    keep: list = []
    args = {k: _materialize(v, keep, device) for k, v in mod.compile_args(shape, config).items()}
    options = {k: v for k, v in config.items() if k.islower()}
    t0 = time.perf_counter()
    compiled = mod.KERNEL.warmup(**args, grid=(1,), **options)
    compile_s = time.perf_counter() - t0
    meta = compiled.metadata
    num_warps = getattr(meta, "num_warps", config.get("num_warps"))
    info = StaticInfo(shared_mem_bytes=int(meta.shared), threads_per_block=int(num_warps) * 32,
                      compiled_name=getattr(compiled, "name", None),
                      compiled_hash=getattr(compiled, "hash", None), compile_s=compile_s)
    if max_shared is not None and info.shared_mem_bytes > max_shared:
        return info, compiled  # the caller records OUT_OF_RESOURCES without loading it
    if load:
        init = getattr(compiled, "_init_handles", None)
        if init is not None:
            init()
        else:  # older layout: the ``run`` property loads the binary
            _ = compiled.run
        info = replace(info, registers_per_thread=int(compiled.n_regs),
                       n_spills=int(compiled.n_spills))
    return info, compiled
