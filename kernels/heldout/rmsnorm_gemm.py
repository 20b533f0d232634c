"""RMSNorm fused into the projection that follows it, out = rmsnorm(x; g) @ W: the input norm of
a Llama attention block and its QKV projection, in one kernel.

RMSNorm scales each row of x by r = 1 / sqrt(mean(x^2) + eps) and each column by the norm
weight g. Both factor out of the product: rmsnorm(x; g) @ W = r * ((x * g) @ W), with r one
number per output row. So each program streams its x tile along K once, multiplies it by g and
feeds it to ``tl.dot``, and on the way sums the squares of the same tile into a per-row fp32
accumulator; after the K loop it scales its output rows by r and stores once. The normalized x
never reaches memory, and no second pass over x is needed.

What this adds to a plain GEMM, and why it is a useful held-out kernel for the cost model
(``kernaudit_pipeline.rank``, fitted on the kernels one level up): the K loop does CUDA-core work
beside the tensor-core MMA (a square-and-sum and a scaling of every x element, and a load of g),
so how well a config hides that work behind its wgmmas (warps, stages, tile width) matters in a
way the calibration kernels do not show. Its traffic is a GEMM's plus one K-vector.

Programs are numbered in groups of GROUP_M tile-rows (the Triton matmul tutorial's grouped
order) so that neighbouring programs share W panels while they sit in L2.

Baseline: the unfused PyTorch composition ``F.rms_norm(x, (K,), g, eps) @ W`` in bf16: one norm
kernel that writes the normalized x, then cuBLAS (``torch.matmul``) reading it back. Reference:
the same composition in fp32.

Shapes: Llama-3-8B's fused QKV projection (hidden K = 4096; N = 4096 + 2 x 1024 = 6144 for 32
query heads and 8 KV heads of 128) at four batch-token counts M, the buckets vLLM tunes per.

This kernel is held out from the cost model's calibration: its ranking
(``samples/rank/rmsnorm_gemm.ranking.json``) was made on a CPU before any GPU timed it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernaudit_pipeline.kernel_spec import Ptr, Shape, Tolerance

NAME = "rmsnorm_gemm"
DTYPE = "bf16"
BASELINE_NAME = "F.rms_norm + torch.matmul (cuBLAS, unfused)"
EPS = 1e-5  # Llama-3's rms_norm_eps


# --------------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------------
@triton.jit
def rmsnorm_gemm_kernel(
    x_ptr, g_ptr, w_ptr, out_ptr,
    M, N, K, eps,
    stride_xm, stride_xk,
    stride_wk, stride_wn,
    stride_om, stride_on,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    # Grouped ordering: walk GROUP_M tile-rows down one tile-column before moving right.
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    # Rows/columns past the edge wrap around (% M, % N): loads stay unmasked in M and N, the
    # final store is masked instead.
    offs_xm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_wn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + (offs_xm[:, None] * stride_xm + offs_k[None, :] * stride_xk)
    w_ptrs = w_ptr + (offs_k[:, None] * stride_wk + offs_wn[None, :] * stride_wn)
    g_ptrs = g_ptr + offs_k

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    sum_sq = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_remaining = K - k * BLOCK_K
        x = tl.load(x_ptrs, mask=offs_k[None, :] < k_remaining, other=0.0)
        g = tl.load(g_ptrs, mask=offs_k < k_remaining, other=0.0)
        w = tl.load(w_ptrs, mask=offs_k[:, None] < k_remaining, other=0.0)
        xf = x.to(tl.float32)
        # The norm's statistic from the tile already in registers: no second pass over x.
        sum_sq += tl.sum(xf * xf, axis=1)
        xg = (xf * g.to(tl.float32)[None, :]).to(w.dtype)
        acc = tl.dot(xg, w, acc)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
        g_ptrs += BLOCK_K

    # r = 1 / sqrt(mean(x^2) + eps), one per row, applied to the fp32 product before the one cast.
    r = 1.0 / tl.sqrt(sum_sq / K + eps)
    out = (acc * r[:, None]).to(out_ptr.dtype.element_ty)
    offs_om = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_on = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    out_ptrs = out_ptr + stride_om * offs_om[:, None] + stride_on * offs_on[None, :]
    out_mask = (offs_om[:, None] < M) & (offs_on[None, :] < N)
    tl.store(out_ptrs, out, mask=out_mask)


KERNEL = rmsnorm_gemm_kernel


# --------------------------------------------------------------------------------------------
# The launcher
# --------------------------------------------------------------------------------------------
_TRITON_DTYPE = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def _ptr(t: torch.Tensor) -> Ptr:
    return Ptr(_TRITON_DTYPE[t.dtype], aligned=t.data_ptr() % 16 == 0)


def _grid(M: int, N: int, config: dict) -> tuple[int, ...]:
    return (triton.cdiv(M, config["BLOCK_M"]) * triton.cdiv(N, config["BLOCK_N"]),)


def kernel_args(inputs: dict, config: dict,
                out: torch.Tensor | None = None) -> dict[str, object]:
    """Every ``KERNEL`` argument by name; ``launch`` and ``compile_args`` both derive from it,
    so the static audit compiles exactly what the GPU runs."""
    x, g, w = inputs["x"], inputs["g"], inputs["w"]
    M, K = x.shape
    N = w.shape[1]
    if w.shape[0] != K or g.shape != (K,):
        raise ValueError(f"x {tuple(x.shape)}, g {tuple(g.shape)} and W {tuple(w.shape)} do not chain")
    if out is None:
        out = torch.empty((M, N), device=x.device, dtype=x.dtype)
    return {
        "x_ptr": x, "g_ptr": g, "w_ptr": w, "out_ptr": out,
        "M": M, "N": N, "K": K, "eps": float(inputs["eps"]),
        "stride_xm": x.stride(0), "stride_xk": x.stride(1),
        "stride_wk": w.stride(0), "stride_wn": w.stride(1),
        "stride_om": out.stride(0), "stride_on": out.stride(1),
        **{k: config[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")},
    }


def launch(inputs: dict, config: dict, out: torch.Tensor | None = None) -> torch.Tensor:
    args = kernel_args(inputs, config, out)
    rmsnorm_gemm_kernel[_grid(args["M"], args["N"], config)](
        **args, num_warps=config["num_warps"], num_stages=config["num_stages"])
    return args["out_ptr"]


# --------------------------------------------------------------------------------------------
# Inputs, baseline, reference
# --------------------------------------------------------------------------------------------
def make_inputs(shape: Shape, device: str, seed: int,
                dtype: torch.dtype = torch.bfloat16) -> dict:
    """x ~ N(0, 4) (the norm takes any scale out), g ~ 1 + N(0, 0.1^2) as a trained norm weight
    looks, W ~ N(0, 1/K): the output is ~N(0, 1) whatever K is.

    ``dtype`` exists for the CPU interpreter, which cannot multiply bf16 (triton-lang/triton#11584):
    the numerics tests run the same kernel on fp16.
    """
    M, N, K = shape["M"], shape["N"], shape["K"]
    if torch.device(device).type == "meta":
        return {"x": torch.empty((M, K), device="meta", dtype=dtype),
                "g": torch.empty((K,), device="meta", dtype=dtype),
                "w": torch.empty((K, N), device="meta", dtype=dtype), "eps": EPS}
    gen = torch.Generator(device=device).manual_seed(seed)
    x = (torch.randn((M, K), generator=gen, device=device) * 2.0).to(dtype)
    g = (1.0 + 0.1 * torch.randn((K,), generator=gen, device=device)).to(dtype)
    w = (torch.randn((K, N), generator=gen, device=device) * K ** -0.5).to(dtype)
    return {"x": x, "g": g, "w": w, "eps": EPS}


def baseline(inputs: dict) -> torch.Tensor:
    """The norm as its own kernel (normalized x written out in bf16), then one cuBLAS matmul."""
    x = inputs["x"]
    return torch.matmul(F.rms_norm(x, (x.shape[1],), inputs["g"], inputs["eps"]), inputs["w"])


def reference(inputs: dict) -> torch.Tensor:
    x = inputs["x"].float()
    r = torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True) + inputs["eps"])
    return (x * r * inputs["g"].float()) @ inputs["w"].float()


# Two bf16 roundings: x * g before the MMA (unit roundoff 2^-8, averaged over K) and the output
# cast; the norm's statistic and the sums stay fp32.
TOLERANCE = Tolerance(max_rel_l2=1e-2, atol=2e-2, rtol=2e-2)


# --------------------------------------------------------------------------------------------
# Roofline model and the static audit's view
# --------------------------------------------------------------------------------------------
def flops(shape: Shape) -> int:
    """The product; the norm's three operations per x element, counted once per program column
    in the kernel, are left out (under 0.1 % at N = 6144)."""
    return 2 * shape["M"] * shape["N"] * shape["K"]


def bytes_moved(shape: Shape) -> int:
    """x, g and W read once, the output written once, all bf16."""
    M, N, K = shape["M"], shape["N"], shape["K"]
    return 2 * (M * K + K + K * N + M * N)


def compile_args(shape: Shape, config: dict) -> dict[str, object]:
    args = kernel_args(make_inputs(shape, "meta", 0), config)
    return {k: _ptr(v) if isinstance(v, torch.Tensor) else v for k, v in args.items()}


def grid(shape: Shape, config: dict) -> tuple[int, ...]:
    return _grid(shape["M"], shape["N"], config)


# --------------------------------------------------------------------------------------------
# Config space and shapes
# --------------------------------------------------------------------------------------------
def _space() -> list[dict]:
    """A tuner's grid for one accumulator and a CUDA-core side job in the K loop.

    - BLOCK_M 16..256 by BLOCK_N 64..256 (and 32 for the decode tiles of 16 and 32 rows), except
      256x256: its fp32 accumulator alone is 256 registers per thread on 8 warps;
    - BLOCK_K 32 and 64 with 2 to 5 stages, 128 with 2 to 4;
    - 2 and 4 warps on 16-row tiles (mma.sync, where fewer warps leave more registers each),
      4 on 32-row tiles, 4 and 8 from 64 rows (one wgmma warpgroup per 64 rows);
    - GROUP_M 8 from 64 rows (1 below), plus GROUP_M 1 and 4 for the 64- and 128-row tiles
      128 and 256 wide at BLOCK_K 64 on 8 warps, to see what the grouping is worth.
    """
    k_stages = ((32, (2, 3, 4, 5)), (64, (2, 3, 4, 5)), (128, (2, 3, 4)))
    warps_for = {16: (2, 4), 32: (4,), 64: (4, 8), 128: (4, 8), 256: (4, 8)}
    configs = []
    for bm, warp_options in warps_for.items():
        widths = (32, 64, 128, 256) if bm <= 32 else (64, 128, 256)
        for bn in widths:
            if bm * bn > 128 * 256:
                continue
            for bk, stage_range in k_stages:
                for warps in warp_options:
                    for stages in stage_range:
                        configs.append({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk,
                                        "GROUP_M": 8 if bm >= 64 else 1,
                                        "num_warps": warps, "num_stages": stages})
    for bm in (64, 128):
        for bn in (128, 256):
            for group_m in (1, 4):
                for stages in (3, 4):
                    configs.append({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 64, "GROUP_M": group_m,
                                    "num_warps": 8, "num_stages": stages})
    return configs


CONFIGS: list[dict] = _space()

_N, _K = 4096 + 2 * 1024, 4096  # q + k + v output width, hidden size
SHAPES: list[Shape] = [
    Shape(f"llama3_8b_norm_qkv_m{m}", {"M": m, "N": _N, "K": _K},
          label=f"llama3-8b input RMSNorm + QKV (K,N)=({_K},{_N}) M={m} ({phase})", phase=phase)
    for m, phase in ((16, "decode"), (128, "decode"), (1024, "prefill"), (4096, "prefill"))
]
