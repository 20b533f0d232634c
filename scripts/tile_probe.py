#!/usr/bin/env python3
"""Why is bias_gelu_gemm's 128 x 256 tile slower than its 256 x 128 tile on an H100?

An experiment, not part of the product (docs/benchmarks.md, "The seventh held-out kernel on
an H100"): the cost model put 128 x 256 first at M = 1024 and 4096, and every 128 x 256 config
measured 1.25-1.38x slower than the same config at 256 x 128, though the static audit sees the
same registers, shared memory, occupancy and waves. This times variants that each leave one
suspect out, paired and interleaved in rounds on one GPU:

- ``kmajor``: the held-out kernel as it is (W in nn.Linear's (N, K) layout, read K-major);
- ``nmajor``: the same kernel on a W stored (K, N) and passed through its strides, so the
  weight tile is N-contiguous (the layout kernels/gemm.py reads);
- ``noepi``: the same main loop with no bias and no GELU (the accumulator stored as is);

    python3 scripts/tile_probe.py time [--m 4096] [--rounds 3] > probe.jsonl
    python3 scripts/tile_probe.py launch --variant kmajor --config BK64_BM128_BN256_GM8_s3_w8

``launch`` runs one config a few times, for ``ncu --clock-control none -k regex:...``.
Needs torch and triton on a GPU; imports the kernel from kernels/heldout.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "kernels" / "heldout"))

import bias_gelu_gemm as bg  # noqa: E402

CONFIGS = ["BK64_BM256_BN128_GM8_s3_w8", "BK64_BM128_BN256_GM8_s3_w8",
           "BK64_BM256_BN128_GM8_s4_w8", "BK64_BM128_BN256_GM8_s4_w8",
           "BK64_BM128_BN128_GM8_s4_w8"]
VARIANTS = ["kmajor", "nmajor", "noepi"]


@triton.jit
def gemm_noepi_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K, stride_xm, stride_xk,
                      stride_wn, stride_wk, stride_om, stride_on,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      GROUP_M: tl.constexpr):
    """bias_gelu_gemm_kernel's order and main loop, with the epilogue left out."""
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    offs_xm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_wn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + (offs_xm[:, None] * stride_xm + offs_k[None, :] * stride_xk)
    w_ptrs = w_ptr + (offs_wn[None, :] * stride_wn + offs_k[:, None] * stride_wk)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_remaining = K - k * BLOCK_K
        x = tl.load(x_ptrs, mask=offs_k[None, :] < k_remaining, other=0.0)
        w = tl.load(w_ptrs, mask=offs_k[:, None] < k_remaining, other=0.0)
        acc = tl.dot(x, w, acc)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
    out = acc.to(out_ptr.dtype.element_ty)
    offs_om = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_on = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    out_ptrs = out_ptr + stride_om * offs_om[:, None] + stride_on * offs_on[None, :]
    tl.store(out_ptrs, out, mask=(offs_om[:, None] < M) & (offs_on[None, :] < N))


def parse(config_id: str) -> dict:
    f = dict(re.findall(r"(BK|BM|BN|GM|s|w)(\d+)", config_id))
    return {"BLOCK_M": int(f["BM"]), "BLOCK_N": int(f["BN"]), "BLOCK_K": int(f["BK"]),
            "GROUP_M": int(f["GM"]), "num_warps": int(f["w"]), "num_stages": int(f["s"])}


def inputs_for(m: int) -> dict:
    shape = next(s for s in bg.SHAPES if s["M"] == m)
    inputs = bg.make_inputs(shape, "cuda", 20240602)
    # The same weight stored (K, N): a (N, K) view with strides (1, N).
    inputs["w_nmajor"] = inputs["w"].t().contiguous().t()
    return inputs


def launcher(variant: str, inputs: dict, config: dict):
    w = inputs["w_nmajor"] if variant == "nmajor" else inputs["w"]
    args = bg.kernel_args({**inputs, "w": w}, config)
    kernel = gemm_noepi_kernel if variant == "noepi" else bg.bias_gelu_gemm_kernel
    grid = bg._grid(args["M"], args["N"], config)

    def run():
        kernel[grid](**args, num_warps=config["num_warps"], num_stages=config["num_stages"])
    return run, args["out_ptr"]


def cmd_time(ns) -> None:
    inputs = inputs_for(ns.m)
    ref = bg.reference(inputs).float()
    cases = [(v, c) for v in VARIANTS for c in CONFIGS]
    fns = {}
    for variant, cid in cases:
        run, out = launcher(variant, inputs, parse(cid))
        run()
        torch.cuda.synchronize()
        err = None
        if variant != "noepi":
            err = float((out.float() - ref).norm() / ref.norm())
        fns[(variant, cid)] = (run, err)
    for rnd in range(ns.rounds):
        order = cases if rnd % 2 == 0 else cases[::-1]
        for variant, cid in order:
            run, err = fns[(variant, cid)]
            us = triton.testing.do_bench(run, warmup=25, rep=ns.rep_ms, return_mode="median") * 1e3
            print(json.dumps({"m": ns.m, "round": rnd, "variant": variant, "config_id": cid,
                              "median_us": round(us, 2), "rel_l2": err}), flush=True)


def cmd_launch(ns) -> None:
    inputs = inputs_for(ns.m)
    run, _ = launcher(ns.variant, inputs, parse(ns.config))
    for _ in range(ns.count):
        run()
    torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("time")
    t.add_argument("--m", type=int, default=4096)
    t.add_argument("--rounds", type=int, default=3)
    t.add_argument("--rep-ms", type=int, default=200)
    la = sub.add_parser("launch")
    la.add_argument("--m", type=int, default=4096)
    la.add_argument("--variant", choices=VARIANTS, default="kmajor")
    la.add_argument("--config", required=True)
    la.add_argument("--count", type=int, default=3)
    ns = ap.parse_args()
    if ns.cmd == "time":
        cmd_time(ns)
    else:
        cmd_launch(ns)


if __name__ == "__main__":
    main()
