"""Two things every kernel test file does, in one place: run its interpreter cases in a child
process, and compile one of its configs ahead of time for sm_90.

The interpreter cases need ``TRITON_INTERPRET=1`` set before the kernel module is imported, and
the rest of the test session keeps compiled kernels, so each test file runs itself as a script
in a child process that prints one JSON object per line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kernaudit_pipeline.core.hardware import sm_resources

REPO = Path(__file__).resolve().parents[2]
# sm_90's opt-in shared memory per block (227 KiB), from the project's hardware table
SMEM_OPTIN_LIMIT_BYTES = sm_resources("9.0").smem_per_block_optin_bytes


def interpreter_child(script: str, *args: str, timeout_s: float = 600) -> list[dict]:
    """Run ``script`` (a test file's path) with ``args`` under Triton's CPU interpreter, with the
    repository on the path, and return the JSON objects it printed, one per line. A child that
    fails fails the calling test with the end of its stderr."""
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, script, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, f"{Path(script).name} {' '.join(args)}:\n{proc.stderr[-4000:]}"
    return [json.loads(line) for line in proc.stdout.splitlines()]


def aot_compile_sm90(mod, cfg: dict, shape):
    """``mod.KERNEL`` compiled for sm_90 at ``shape`` with ``cfg``, specialized as the JIT
    would at launch (``kernel_spec.specialize``): what the static audit compiles."""
    import triton  # noqa: PLC0415
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415
    from triton.compiler import ASTSource  # noqa: PLC0415

    from kernaudit_pipeline.kernel_spec import specialize  # noqa: PLC0415

    spec = specialize(mod.KERNEL, mod.compile_args(shape, cfg))
    src = ASTSource(fn=mod.KERNEL, signature=spec.signature, constexprs=spec.constexprs,
                    attrs=spec.attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]})
