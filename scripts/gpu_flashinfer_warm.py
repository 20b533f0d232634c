"""JIT-compile FlashInfer's batch decode for the paged decode kernel's layout, ahead of the sweep.

FlashInfer compiles each (dtype, head_dim, page layout) variant with nvcc on first use, into
its cache (``FLASHINFER_WORKSPACE_BASE``). ``gpu_collect.sh main`` runs this in the background
while the other kernels are timed, so the sweep's paged decode worker finds the module built.
It also checks the result on a small batch against the fp32 reference and prints one line.
GPU host only; exit 0 even when FlashInfer cannot run (the sweep then records why).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    import torch

    from kernaudit_pipeline.bench.correctness import check_reference, first_line
    from kernaudit_pipeline.bench.references import references_of
    from kernaudit_pipeline.kernel_spec import Shape, load_kernel_module

    mod = load_kernel_module("paged_decode_attention")
    ref = next(r for r in references_of(mod) if r.key == "flashinfer")
    why = ref.unavailable() if ref.unavailable else None
    if why:
        print(f"[flashinfer] not run: {why}", flush=True)
        return 0
    dims = dict(mod.SHAPES[0].dims)
    shape = Shape("jit_warmup", {**dims, "B": 2, "CTX_MIN": 100, "CTX_MAX": 300}, phase="decode")
    t0 = time.perf_counter()
    try:
        import flashinfer

        check = check_reference(ref, mod, shape, 1, "cuda", torch.cuda.synchronize)
    except Exception as exc:  # the sweep records the same failure as a baseline row
        print(f"[flashinfer] failed after {time.perf_counter() - t0:.1f} s: {first_line(exc, 600)}", flush=True)
        return 0
    print(f"[flashinfer] {flashinfer.__version__}: JIT and check in {time.perf_counter() - t0:.1f} s, "
          f"correct={check.correct}, rel err {check.max_rel_error}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
