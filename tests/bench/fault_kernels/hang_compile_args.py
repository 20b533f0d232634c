"""A kernel module whose ``compile_args`` hangs: the runner must time the step out, in the
worker, and record it."""

from __future__ import annotations

import time

import torch

from kernaudit_pipeline.kernel_spec import Shape, Tolerance

NAME = "hang_in_compile_args"
DTYPE = "fp32"
BASELINE_NAME = "torch.mul"
KERNEL = None
TOLERANCE = Tolerance(max_rel_l2=1e-6)
CONFIGS = [{"BLOCK_N": 64, "num_warps": 4, "num_stages": 1}]
SHAPES = [Shape("n1024", {"N": 1024})]


def make_inputs(shape, device, seed):
    return {"x": torch.randn(shape["N"], generator=torch.Generator().manual_seed(seed))}


def launch(inputs, config, out=None):
    return inputs["x"] * 2.0


def baseline(inputs):
    return inputs["x"] * 2.0


def reference(inputs):
    return inputs["x"].double() * 2.0


def flops(shape):
    return shape["N"]


def bytes_moved(shape):
    return 8 * shape["N"]


def compile_args(shape, config):
    time.sleep(3600)


def grid(shape, config):
    return (1,)
