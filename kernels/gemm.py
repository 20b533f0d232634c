"""bf16 GEMM, C = A @ B, with grouped tile order: the dense projection at the heart of every
transformer layer (QKV, O, gate/up and down projections of Llama-3-8B).

Each program computes one BLOCK_M x BLOCK_N tile of C, accumulating in fp32 over K in
BLOCK_K steps. Programs are numbered in groups of GROUP_M tile-rows so that neighbouring
programs share B's columns and A's rows while they sit in L2 (the "super-grouping" of the Triton
matmul tutorial). On sm_90 ``tl.dot`` lowers to wgmma and ``num_stages`` sets the depth of the
asynchronous global->shared pipeline.

Baseline: ``torch.matmul`` (cuBLAS). Reference: the same product in fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernaudit_pipeline.kernel_spec import Ptr, Reference, Shape, Tolerance

NAME = "gemm_bf16"
DTYPE = "bf16"
BASELINE_NAME = "torch.matmul"


# --------------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------------
@triton.jit
def gemm_kernel(
    a_ptr, b_ptr, c_ptr,
    M, N, K,
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    # Grouped ordering: walk GROUP_M tile-rows down one tile-column before moving right, so a
    # wave of programs reuses the same panels of A and B from L2.
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    # Rows/columns past the edge wrap around (% M, % N): the loads stay unmasked in M and N and
    # the final store is masked instead.
    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_remaining = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_remaining, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_remaining, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    c = acc.to(c_ptr.dtype.element_ty)
    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    tl.store(c_ptrs, c, mask=c_mask)


KERNEL = gemm_kernel


# --------------------------------------------------------------------------------------------
# The launcher
# --------------------------------------------------------------------------------------------
_TRITON_DTYPE = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def _ptr(t: torch.Tensor) -> Ptr:
    return Ptr(_TRITON_DTYPE[t.dtype], aligned=t.data_ptr() % 16 == 0)


def _tile_args(config: dict) -> dict[str, int]:
    return {k: config[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")}


def _grid(M: int, N: int, config: dict) -> tuple[int, ...]:
    return (triton.cdiv(M, config["BLOCK_M"]) * triton.cdiv(N, config["BLOCK_N"]),)


def _empty_out(inputs: dict) -> torch.Tensor:
    a, b = inputs["a"], inputs["b"]
    return torch.empty((a.shape[0], b.shape[1]), device=a.device, dtype=a.dtype)


def kernel_args(inputs: dict, config: dict,
                out: torch.Tensor | None = None) -> dict[str, object]:
    """Every ``KERNEL`` argument by name; ``launch`` and ``compile_args`` both derive from it,
    so the static audit compiles exactly what the GPU runs."""
    a, b = inputs["a"], inputs["b"]
    M, K = a.shape
    N = b.shape[1]
    if out is None:
        out = _empty_out(inputs)
    return {
        "a_ptr": a, "b_ptr": b, "c_ptr": out,
        "M": M, "N": N, "K": K,
        "stride_am": a.stride(0), "stride_ak": a.stride(1),
        "stride_bk": b.stride(0), "stride_bn": b.stride(1),
        "stride_cm": out.stride(0), "stride_cn": out.stride(1),
        **_tile_args(config),
    }


def launch(inputs: dict, config: dict, out: torch.Tensor | None = None) -> torch.Tensor:
    args = kernel_args(inputs, config, out)
    gemm_kernel[_grid(args["M"], args["N"], config)](
        **args, num_warps=config["num_warps"], num_stages=config["num_stages"])
    return args["c_ptr"]


# --------------------------------------------------------------------------------------------
# Inputs, baseline, reference
# --------------------------------------------------------------------------------------------
def make_inputs(shape: Shape, device: str, seed: int,
                dtype: torch.dtype = torch.bfloat16) -> dict:
    """A, B ~ N(0, K^-1/2) so that every entry of C is ~N(0, 1) whatever K is.

    ``dtype`` exists for the CPU interpreter, which cannot multiply bf16 (it dots the raw
    bit patterns, triton-lang/triton#11584): the numerics tests run the same kernel on fp16.
    """
    M, N, K = shape["M"], shape["N"], shape["K"]
    if torch.device(device).type == "meta":
        return {"a": torch.empty((M, K), device="meta", dtype=dtype),
                "b": torch.empty((K, N), device="meta", dtype=dtype)}
    gen = torch.Generator(device=device).manual_seed(seed)
    scale = K ** -0.25
    a = (torch.randn((M, K), generator=gen, device=device) * scale).to(dtype)
    b = (torch.randn((K, N), generator=gen, device=device) * scale).to(dtype)
    return {"a": a, "b": b}


def baseline(inputs: dict) -> torch.Tensor:
    return torch.matmul(inputs["a"], inputs["b"])


def reference(inputs: dict) -> torch.Tensor:
    return torch.matmul(inputs["a"].float(), inputs["b"].float())


# Output rounding to bf16 (unit roundoff 2^-8) dominates: about 2.3e-3 relative RMS error.
TOLERANCE = Tolerance(max_rel_l2=1e-2, atol=2e-2, rtol=2e-2)

# The one reference: what a serving stack runs for an unfused bf16 linear layer. The runner
# profiles it and records the library that ran (cuBLAS's nvjet kernels on an H200).
REFERENCES = [Reference(key=None, name=BASELINE_NAME, backend="cuBLAS", fn=baseline, tolerance=TOLERANCE)]


# --------------------------------------------------------------------------------------------
# Roofline model and the static audit's view
# --------------------------------------------------------------------------------------------
def flops(shape: Shape) -> int:
    return 2 * shape["M"] * shape["N"] * shape["K"]


def bytes_moved(shape: Shape) -> int:
    M, N, K = shape["M"], shape["N"], shape["K"]
    return 2 * (M * K + K * N + M * N)


def compile_args(shape: Shape, config: dict) -> dict[str, object]:
    args = kernel_args(make_inputs(shape, "meta", 0), config)
    return {k: _ptr(v) if isinstance(v, torch.Tensor) else v for k, v in args.items()}


def grid(shape: Shape, config: dict) -> tuple[int, ...]:
    return _grid(shape["M"], shape["N"], config)


# --------------------------------------------------------------------------------------------
# Config space and shapes
# --------------------------------------------------------------------------------------------
def _cfg(bm: int, bn: int, bk: int, warps: int, stages: int, group_m: int = 8) -> dict:
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m,
            "num_warps": warps, "num_stages": stages}


# Shared memory (sm_90 compiles): num_stages buffers of (BLOCK_M + BLOCK_N) * BLOCK_K * 2 bytes
# on the wgmma path (BLOCK_M >= 64), num_stages - 1 buffers on the mma.sync path that small-M
# tiles take. A block may opt in to 227 KiB (232,448 bytes).
CONFIGS: list[dict] = [
    # Strong Hopper configs (ANCHORS: 128x256x64 w8 s3 reached 0.97x cuBLAS at 8192^3).
    _cfg(128, 256, 64, 8, 3),   # 144 KiB
    _cfg(128, 256, 64, 8, 4),   # 192 KiB
    _cfg(256, 128, 64, 8, 3),   # 144 KiB
    _cfg(256, 128, 64, 8, 4),   # 192 KiB
    _cfg(128, 128, 64, 4, 4),   # 128 KiB
    _cfg(128, 128, 64, 8, 4),   # 128 KiB
    _cfg(128, 128, 64, 4, 3),   # 96 KiB
    _cfg(128, 128, 128, 8, 3),  # 192 KiB
    _cfg(128, 64, 64, 4, 4),    # 96 KiB
    _cfg(64, 128, 64, 4, 4),    # 96 KiB
    _cfg(64, 64, 32, 4, 3),     # 24 KiB, small tile: low arithmetic intensity (0.46x in ANCHORS)
    # Small-M tiles for the memory-bound decode shape (M=16): stream B with deep K steps.
    _cfg(16, 64, 256, 4, 4, group_m=1),   # 120 KiB
    _cfg(32, 64, 128, 4, 4, group_m=1),   # 72 KiB
    _cfg(64, 64, 128, 4, 4, group_m=1),   # 128 KiB
    # Register spills: the fp32 accumulator alone needs BLOCK_M*BLOCK_N/(32*num_warps)
    # registers per thread, 256 for 128x256 on 4 warps and 256x256 on 8, above the 255 cap.
    _cfg(128, 256, 64, 4, 3),   # 144 KiB, ANCHORS: 255 regs, 808 B local memory
    _cfg(256, 256, 64, 8, 3),   # 192 KiB, ANCHORS: 255 regs, spills
    _cfg(256, 256, 64, 4, 3),   # 192 KiB, ANCHORS: 255 regs, heavy spills
    # Over the 227 KiB shared-memory opt-in limit: the launch fails with OutOfResources.
    _cfg(256, 256, 64, 8, 4),   # 256 KiB
    _cfg(128, 256, 128, 8, 3),  # 288 KiB
    _cfg(256, 256, 64, 8, 5),   # 320 KiB
]

_LLAMA3_8B = "llama3-8b"
SHAPES: list[Shape] = [
    Shape("llama3_8b_qkv_prefill", {"M": 4096, "N": 6144, "K": 4096},
          label=f"{_LLAMA3_8B} qkv_proj prefill (K,N)=(4096,6144)", phase="prefill"),
    Shape("llama3_8b_o_prefill", {"M": 4096, "N": 4096, "K": 4096},
          label=f"{_LLAMA3_8B} o_proj prefill (K,N)=(4096,4096)", phase="prefill"),
    Shape("llama3_8b_gate_up_prefill", {"M": 4096, "N": 28672, "K": 4096},
          label=f"{_LLAMA3_8B} gate_up_proj prefill (K,N)=(4096,28672)", phase="prefill"),
    Shape("llama3_8b_down_prefill", {"M": 4096, "N": 4096, "K": 14336},
          label=f"{_LLAMA3_8B} down_proj prefill (K,N)=(14336,4096)", phase="prefill"),
    Shape("llama3_8b_gate_up_decode", {"M": 16, "N": 28672, "K": 4096},
          label=f"{_LLAMA3_8B} gate_up_proj decode batch 16 (memory-bound)", phase="decode"),
]
