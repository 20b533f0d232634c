"""A kernel module for the runner's fault tests on the CPU test double (no Triton, no GPU).

``launch`` doubles its input; the config's ``FAULT`` code makes it misbehave the way a real
kernel can: 1 wrong results, 2 raise, 3 segfault, 4 hang, 5 a fatal CUDA error.
"""

from __future__ import annotations

import os
import signal
import time

import torch

from kernaudit_pipeline.kernel_spec import Ptr, Reference, Shape, Tolerance

NAME = "fault_double"
DTYPE = "fp32"
BASELINE_NAME = "torch.mul"
KERNEL = None
TOLERANCE = Tolerance(max_rel_l2=1e-6)
OK, WRONG, RAISE, SEGFAULT, HANG, FATAL = range(6)


def _cfg(fault: int, block: int = 64) -> dict:
    return {"BLOCK_N": block, "FAULT": fault, "num_warps": 4, "num_stages": 1}


CONFIGS = [_cfg(OK), _cfg(OK, 256), _cfg(OK, 128), _cfg(WRONG), _cfg(RAISE), _cfg(SEGFAULT), _cfg(FATAL),
           _cfg(HANG)]
SHAPES = [Shape("n65536", {"N": 65536}, label="fault test")]
# what the CPU test double reports as compile-time resources (a spilling config is pruned)
FAKE_STATIC = {"BN128_FAULT0_s1_w4": {"n_spills": 10, "registers_per_thread": 255}}


def make_inputs(shape: Shape, device: str, seed: int) -> dict:
    gen = torch.Generator(device=device).manual_seed(seed)
    return {"x": torch.randn(shape["N"], generator=gen, device=device)}


def launch(inputs: dict, config: dict, out=None):
    fault = config["FAULT"]
    if fault == RAISE:
        raise ValueError("this config always raises")
    if fault == SEGFAULT:
        os.kill(os.getpid(), signal.SIGSEGV)
    if fault == HANG:
        time.sleep(3600)
    if fault == FATAL:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    if out is None:
        out = torch.empty_like(inputs["x"])
    torch.mul(inputs["x"], 3.0 if fault == WRONG else 2.0, out=out)
    return out


def baseline(inputs: dict):
    return inputs["x"] * 2.0


def _slow(inputs: dict):
    y = inputs["x"] * 1.0
    for _ in range(3):
        y = y + 0.0
    return y * 2.0


REFERENCES = [
    Reference(key=None, name=BASELINE_NAME, backend="torch (CPU)", fn=baseline, tolerance=TOLERANCE),
    Reference(key="slow", name="torch add chain", backend="torch (CPU)", fn=_slow, tolerance=TOLERANCE,
              prepare=lambda inputs: {"x": inputs["x"].clone()}),
    Reference(key="absent", name="a library this host lacks", backend=None, fn=baseline,
              tolerance=TOLERANCE, unavailable=lambda: "absent_library is not installed"),
]


def reference(inputs: dict):
    return inputs["x"].double() * 2.0


def flops(shape: Shape) -> int:
    return shape["N"]


def bytes_moved(shape: Shape) -> int:
    return 8 * shape["N"]


def compile_args(shape: Shape, config: dict) -> dict:
    return {"x": Ptr("fp32"), "out": Ptr("fp32"), "N": shape["N"], **config}


def grid(shape: Shape, config: dict) -> tuple[int, ...]:
    return (shape["N"] // config["BLOCK_N"],)
