"""A kernel module for the sweep's chunk and deadline tests on the runner's CPU test double (no
Triton, no GPU): ``launch`` doubles its input after a random pause of up to ``NOISE_US``, so
its paired timing never settles and each config runs until its time cap, which makes a sweep
of many configs long enough to be cut by a deadline. On the shape ``n4096_hang`` (4,160
elements instead of 4,096) the config with ``HANG`` = 1 hangs, to test that a worker killed
mid-shape loses only its open chunk."""

from __future__ import annotations

import random
import time

import torch

from kernaudit_pipeline.kernel_spec import Ptr, Reference, Shape, Tolerance

NAME = "noisy_double"
DTYPE = "fp32"
BASELINE_NAME = "torch.mul"
KERNEL = None
TOLERANCE = Tolerance(max_rel_l2=1e-6)
# 40 configs (three chunks of the sweep); the 21st hangs on the hang shape
HANG_N = 4160
CONFIGS = [{"BLOCK_N": 64, "NOISE_US": 100 + 10 * i, "HANG": int(i == 20), "num_warps": 4, "num_stages": 1}
           for i in range(40)]
SHAPES = [Shape("n4096", {"N": 4096}, label="deadline test"),
          Shape("n4096_hang", {"N": HANG_N}, label="worker killed mid-shape")]
_rng = random.Random(0)


def make_inputs(shape: Shape, device: str, seed: int) -> dict:
    gen = torch.Generator(device=device).manual_seed(seed)
    return {"x": torch.randn(shape["N"], generator=gen, device=device)}


def launch(inputs: dict, config: dict, out=None):
    if config["HANG"] and inputs["x"].numel() == HANG_N:
        time.sleep(3600)
    time.sleep(_rng.random() * config["NOISE_US"] * 1e-6)
    if out is None:
        out = torch.empty_like(inputs["x"])
    torch.mul(inputs["x"], 2.0, out=out)
    return out


def baseline(inputs: dict):
    return inputs["x"] * 2.0


REFERENCES = [Reference(key=None, name=BASELINE_NAME, backend="torch (CPU)", fn=baseline, tolerance=TOLERANCE)]


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
