"""One ahead-of-time compile and the resources it yields (runs inside a worker, or in-process).

Where each number comes from:

- registers, stack frame, static shared memory: ``cuobjdump -res-usage`` on the very cubin Triton
  built (what the driver loads);
- spill store and spill load bytes: the ``ptxas -v`` log of that build. Triton prints it when
  asked (``TRITON_DUMP_PTXAS_LOG``); when Triton's own cache served the cubin, ptxas is re-run
  on the cached PTX with Triton's flags and checked against the cubin;
- dynamic shared memory: ``metadata.shared``, what the launch requests;
- whether ptxas serialized the wgmmas or injected waits on their accumulators (its
  "Potential Performance Loss" diagnostics in the same log): the cost model reads these;
- the hot loop's instructions per warp and iteration, and how many of them are tensor-core
  ops or local-memory (spill) traffic: ``cuobjdump -sass`` on the same cubin (``sass_loop``),
  for the cost model too. A cubin whose SASS cannot be read leaves them None;
- the bytes the loop's tile loads bring per iteration and the 128-byte lines they touch (short
  contiguous runs touch more lines than bytes): the load layouts the compiler chose, in the
  same compile's TTGIR (``ttgir_loads``), for the cost model.

The tools are found and their output parsed by ``core.toolchain``.
"""

from __future__ import annotations

import contextlib
import io
import os
import time
from dataclasses import dataclass
from typing import Any, Iterator

from kernaudit_pipeline.core.toolchain import (
    CubinUsage, PtxasUsage, ToolError, WgmmaDiagnostics, cubin_res_usage, cubin_sass, ptxas_usage,
    run_ptxas, wgmma_diagnostics,
)
from kernaudit_pipeline.kernel_spec import Specialization
from kernaudit_pipeline.static_resources.sass_loop import LoopProfile, hot_loop
from kernaudit_pipeline.static_resources.ttgir_loads import LoopLoads, loop_loads

WARP_SIZE = 32


@dataclass(frozen=True)
class Resources:
    """Everything one compile yields, with both sources kept for cross-checking."""

    kernel_function: str
    ptxas: PtxasUsage
    cubin: CubinUsage
    ptxas_log_source: str  # "triton" (Triton's own ptxas run) or "rerun" (re-run on cached PTX)
    shared_mem_dynamic_bytes: int
    threads_per_block: int
    tmem_columns: int | None
    compile_seconds: float
    wgmma: WgmmaDiagnostics
    loop: LoopProfile | None = None
    loads: LoopLoads | None = None

    def numbers(self) -> dict[str, int | float | None]:
        """The StaticResult fields; the cubin is authoritative for what the driver loads."""
        return {
            "registers_per_thread": self.cubin.registers,
            "spill_stores_bytes": self.ptxas.spill_stores_bytes,
            "spill_loads_bytes": self.ptxas.spill_loads_bytes,
            "stack_frame_bytes": self.cubin.stack_bytes,
            "shared_mem_static_bytes": self.cubin.shared_bytes,
            "shared_mem_dynamic_bytes": self.shared_mem_dynamic_bytes,
            "shared_mem_bytes": self.cubin.shared_bytes + self.shared_mem_dynamic_bytes,
            "threads_per_block": self.threads_per_block,
            "tmem_columns": self.tmem_columns,
            "compile_seconds": self.compile_seconds,
            "wgmma_serialized": int(self.wgmma.serialized),
            "wgmma_waits_injected": int(self.wgmma.waits_injected),
            **(self.loop.numbers() if self.loop else {}),
            **(self.loads.numbers() if self.loads else {}),
        }


def _loop_profile(cubin: bytes) -> LoopProfile | None:
    try:
        return hot_loop(cubin_sass(cubin))
    except ToolError:
        return None


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _ptxas_rerun(ptx: str, metadata: Any, capability: int) -> str:
    """ptxas -v on the PTX with the flags Triton's ``make_cubin`` uses (line info, fmad,
    register-allocation level, ``ptx_options``); only needed when Triton's cache skipped ptxas."""
    from triton import knobs  # noqa: PLC0415
    from triton.backends.nvidia.compiler import sm_arch_from_capability  # noqa: PLC0415

    fmad = [] if getattr(metadata, "enable_fp_fusion", True) else ["--fmad=false"]
    extra = metadata.ptx_options.split(" ") if getattr(metadata, "ptx_options", None) else []
    debug = ["-g"] if knobs.nvidia.disable_ptxas_opt else ["-lineinfo"]
    opt = ["--opt-level", "0"] if knobs.nvidia.disable_ptxas_opt else []
    error: ToolError | None = None
    for reg_alloc in (["--regAllocOptLevel=2"], []):  # the flag Triton >= 3.7 passes
        try:
            return run_ptxas(ptx, sm_arch_from_capability(capability),
                             [*debug, *fmad, *opt, *reg_alloc, *extra], capability=capability)
        except ToolError as exc:
            error = exc
    raise RuntimeError(f"ptxas re-run failed: {error}")


def compile_specialized(kernel: Any, spec: Specialization, capability: int, num_warps: int,
                        num_stages: int, *, force: bool = False) -> Resources:
    """Compile one specialization for ``cuda:capability`` and read its resources."""
    import triton  # noqa: PLC0415
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415
    from triton.compiler import ASTSource  # noqa: PLC0415

    src = ASTSource(fn=kernel, signature=dict(spec.signature), constexprs=dict(spec.constexprs),
                    attrs=dict(spec.attrs))
    target = GPUTarget("cuda", capability, WARP_SIZE)
    options = {"num_warps": num_warps, "num_stages": num_stages}
    env = {"TRITON_DUMP_PTXAS_LOG": "1"}
    if force:
        env["TRITON_ALWAYS_COMPILE"] = "1"
    printed = io.StringIO()
    start = time.perf_counter()
    with _environ(**env), contextlib.redirect_stdout(printed):
        ck = triton.compile(src, target=target, options=options)
    seconds = time.perf_counter() - start
    name = ck.metadata.name
    cubin_usage = cubin_res_usage(ck.asm["cubin"]).get(name)
    if cubin_usage is None:
        raise RuntimeError(f"cuobjdump lists no function {name!r}")
    log_source = "triton"
    log = printed.getvalue()
    usage = ptxas_usage(log, name)
    if usage is None or usage.registers is None:  # Triton's cache served the cubin
        log_source = "rerun"
        log = _ptxas_rerun(ck.asm["ptx"], ck.metadata, capability)
        usage = ptxas_usage(log, name)
        agrees = (usage is not None and usage.registers == cubin_usage.registers
                  and usage.stack_frame_bytes == cubin_usage.stack_bytes)
        if not agrees and not force:
            return compile_specialized(kernel, spec, capability, num_warps, num_stages, force=True)
    if usage is None or usage.spill_stores_bytes is None:
        raise RuntimeError(f"ptxas log has no figures for {name!r}")
    return Resources(
        kernel_function=name,
        ptxas=usage,
        cubin=cubin_usage,
        ptxas_log_source=log_source,
        shared_mem_dynamic_bytes=int(ck.metadata.shared),
        threads_per_block=int(ck.metadata.num_warps) * int(ck.metadata.num_ctas) * WARP_SIZE,
        tmem_columns=getattr(ck.metadata, "tmem_size", None),
        compile_seconds=seconds,
        wgmma=wgmma_diagnostics(log),
        loop=_loop_profile(ck.asm["cubin"]),
        loads=loop_loads(ck.asm.get("ttgir") or ""),
    )


def error_message(exc: BaseException, output: str = "") -> str:
    """One line. Triton's CompilationError puts the location first, a source excerpt in the
    middle and the reason last; MLIR failures print their diagnostic to stderr instead."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    kind = type(exc).__name__
    if not lines:
        text = kind
    elif len(lines) == 1:
        text = f"{kind}: {lines[0]}"
    elif lines[0].startswith("at "):
        text = f"{kind} {lines[0]} {lines[-1]}"
    else:
        text = f"{kind}: {lines[0]}"
        detail = next((ln for ln in lines[1:] if "error" in ln.lower() or "fatal" in ln.lower()), None)
        if detail:
            text = f"{text}: {detail}"
    diagnostics = [ln.strip() for ln in output.splitlines() if "error:" in ln]
    if diagnostics and diagnostics[0] not in text:
        text = f"{text} ({diagnostics[0]})"
    return text[:500]
