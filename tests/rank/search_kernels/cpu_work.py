"""A kernel module for the search's CPU rehearsal on the runner's test double (no Triton, no
GPU): ``launch`` doubles its input after ``WORK`` extra passes over it, so a config's latency
grows with its WORK, and the search has a true best (WORK 1) to find among 24 configs."""

from __future__ import annotations

import torch

from kernaudit_pipeline.kernel_spec import Ptr, Reference, Shape, Tolerance

NAME = "cpu_work"
DTYPE = "fp32"
BASELINE_NAME = "torch.mul"
KERNEL = None
TOLERANCE = Tolerance(max_rel_l2=1e-6)
CONFIGS = [{"BLOCK_N": 64 * (1 + i % 4), "WORK": 1 + i, "num_warps": 4, "num_stages": 1} for i in range(24)]
SHAPES = [Shape("n262144", {"N": 262144}, label="search rehearsal"),
          Shape("n65536", {"N": 65536}, label="search rehearsal, small")]


def make_inputs(shape: Shape, device: str, seed: int) -> dict:
    gen = torch.Generator(device=device).manual_seed(seed)
    return {"x": torch.randn(shape["N"], generator=gen, device=device)}


def launch(inputs: dict, config: dict, out=None):
    x = inputs["x"]
    y = x
    for _ in range(config["WORK"]):
        y = y * 1.0
    if out is None:
        out = torch.empty_like(x)
    torch.mul(y, 2.0, out=out)
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
