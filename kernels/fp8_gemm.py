"""Fused fp8 GEMM: e4m3 activations and weights, per-token and per-channel scales applied in
the epilogue, bf16 out. This is the W8A8 "fp8 dynamic per-token" linear layer that vLLM serves.

    C[m, n] = a_scale[m] * b_scale[n] * sum_k A[m, k] * B[k, n]

A (M x K) is row-major with one fp32 scale per token (row). B (K x N) is column-major, i.e.
the weight matrix W (N x K) stored row-major with one fp32 scale per output channel: Hopper's
fp8 wgmma wants both operands K-major in shared memory, and ``torch._scaled_mm`` wants the same
layout. The scales cost nothing in the main loop: they multiply the fp32 accumulator once,
before the cast to bf16.

Hopper's fp8 wgmma does not add into its fp32 accumulator at full precision: the running sum
keeps only about 13 or 14 mantissa bits (the SageAttention2 paper and DeepSeek-V3's report
measured it). Triton leaves that chain unbroken on sm_90 unless told otherwise (its default
``max_num_imprecise_acc`` there is 2**30), so the error grows with K: on an H200, 3 to 50 of the
8192^3 and K=14336 outputs broke the tolerance that ``torch._scaled_mm`` meets. The kernel
therefore lets at most ``PROMOTE_K`` products accumulate in the tensor core, then adds the
partial sum into an fp32 total with ordinary fp32 adds, as cuBLAS (fast accumulation off) and
CUTLASS's two-accumulator fp8 mainloop do:

- ``PROMOTE_K == BLOCK_K`` (the default): ``tl.dot(..., max_num_imprecise_acc=BLOCK_K)``, and
  Triton promotes inside each dot, waiting for the wgmmas every K step.
- ``PROMOTE_K`` a larger multiple of BLOCK_K: the loop keeps its own partial accumulator and
  promotes it every ``PROMOTE_K // BLOCK_K`` steps; in between the wgmmas stay asynchronous.

Either way a second accumulator tile is live, which costs registers and decides the config space.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernaudit_pipeline.kernel_spec import Ptr, Reference, Shape, Tolerance

NAME = "fused_fp8_gemm"
DTYPE = "fp8e4m3"
BF16_MATMUL = "torch.matmul (bf16, unquantized)"
SCALED_MM = "torch._scaled_mm (row-wise scales)"
BASELINE_NAME = BF16_MATMUL
FP8_MAX = 448.0  # largest finite e4m3fn value


# --------------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------------
@triton.jit
def fp8_gemm_kernel(
    a_ptr, b_ptr, c_ptr,
    a_scale_ptr, b_scale_ptr,
    M, N, K,
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, PROMOTE_K: tl.constexpr,
):
    # Grouped tile order, as in the bf16 GEMM: GROUP_M tile-rows share B panels in L2.
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)

    # fp8 x fp8 -> fp32 on the tensor cores; nothing is dequantized inside the loop. At most
    # PROMOTE_K products accumulate in the tensor core's reduced precision before they are
    # promoted into `acc` with full fp32 adds (see the module docstring).
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    STEPS_PER_PROMOTION: tl.constexpr = PROMOTE_K // BLOCK_K
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_remaining = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_remaining, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_remaining, other=0.0)
        if STEPS_PER_PROMOTION == 1:
            acc = tl.dot(a, b, acc, max_num_imprecise_acc=BLOCK_K)
        else:
            part = tl.dot(a, b, part)
            if k % STEPS_PER_PROMOTION == STEPS_PER_PROMOTION - 1:
                acc += part
                part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if STEPS_PER_PROMOTION > 1:
        acc += part  # the K steps after the last promotion

    # Epilogue: per-token (row) and per-channel (column) scales on the fp32 accumulator.
    a_scale = tl.load(a_scale_ptr + offs_am)
    b_scale = tl.load(b_scale_ptr + offs_bn)
    acc = acc * a_scale[:, None] * b_scale[None, :]

    c = acc.to(c_ptr.dtype.element_ty)
    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    tl.store(c_ptrs, c, mask=c_mask)


KERNEL = fp8_gemm_kernel


# --------------------------------------------------------------------------------------------
# The launcher
# --------------------------------------------------------------------------------------------
_TRITON_DTYPE = {torch.float8_e4m3fn: "fp8e4nv", torch.bfloat16: "bf16", torch.float16: "fp16",
                 torch.float32: "fp32"}


def _ptr(t: torch.Tensor) -> Ptr:
    return Ptr(_TRITON_DTYPE[t.dtype], aligned=t.data_ptr() % 16 == 0)


def promote_k(config: dict) -> int:
    """Products per fp32 promotion: ``PROMOTE_K`` where a config sets it, else every BLOCK_K
    step (the precise default, so a config written without the key stays correct)."""
    value = config.get("PROMOTE_K", config["BLOCK_K"])
    if value < config["BLOCK_K"] or value % config["BLOCK_K"]:
        raise ValueError(f"PROMOTE_K={value} must be a multiple of BLOCK_K={config['BLOCK_K']}")
    return value


def _grid(M: int, N: int, config: dict) -> tuple[int, ...]:
    return (triton.cdiv(M, config["BLOCK_M"]) * triton.cdiv(N, config["BLOCK_N"]),)


def _empty_out(inputs: dict) -> torch.Tensor:
    a, b = inputs["a"], inputs["b"]
    return torch.empty((a.shape[0], b.shape[1]), device=a.device, dtype=torch.bfloat16)


def kernel_args(inputs: dict, config: dict,
                out: torch.Tensor | None = None) -> dict[str, object]:
    """Every ``KERNEL`` argument by name; ``launch`` and ``compile_args`` both derive from it."""
    a, b = inputs["a"], inputs["b"]
    M, K = a.shape
    N = b.shape[1]
    if out is None:
        out = _empty_out(inputs)
    return {
        "a_ptr": a, "b_ptr": b, "c_ptr": out,
        "a_scale_ptr": inputs["a_scale"], "b_scale_ptr": inputs["b_scale"],
        "M": M, "N": N, "K": K,
        "stride_am": a.stride(0), "stride_ak": a.stride(1),
        "stride_bk": b.stride(0), "stride_bn": b.stride(1),
        "stride_cm": out.stride(0), "stride_cn": out.stride(1),
        "BLOCK_M": config["BLOCK_M"], "BLOCK_N": config["BLOCK_N"],
        "BLOCK_K": config["BLOCK_K"], "GROUP_M": config["GROUP_M"],
        "PROMOTE_K": promote_k(config),
    }


def launch(inputs: dict, config: dict, out: torch.Tensor | None = None) -> torch.Tensor:
    args = kernel_args(inputs, config, out)
    fp8_gemm_kernel[_grid(args["M"], args["N"], config)](
        **args, num_warps=config["num_warps"], num_stages=config["num_stages"])
    return args["c_ptr"]


# --------------------------------------------------------------------------------------------
# Inputs, baseline, reference
# --------------------------------------------------------------------------------------------
def _quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-row e4m3 quantization: each row's absolute max maps to 448."""
    scale = x.abs().amax(dim=1).clamp(min=1e-12) / FP8_MAX
    q = (x / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale.float()


def make_inputs(shape: Shape, device: str, seed: int) -> dict:
    """Activations with a spread of per-token magnitudes (0.25x..4x) and N(0, K^-1/2) weights,
    quantized the way a serving stack quantizes them, so that C is ~N(0, 1)."""
    M, N, K = shape["M"], shape["N"], shape["K"]
    if torch.device(device).type == "meta":
        w_q = torch.empty((N, K), device="meta", dtype=torch.float8_e4m3fn)
        return {"a": torch.empty((M, K), device="meta", dtype=torch.float8_e4m3fn),
                "b": w_q.t(),
                "a_scale": torch.empty((M,), device="meta", dtype=torch.float32),
                "b_scale": torch.empty((N,), device="meta", dtype=torch.float32)}
    gen = torch.Generator(device=device).manual_seed(seed)
    token_mag = 2.0 ** (torch.rand((M, 1), generator=gen, device=device) * 4 - 2)
    x = torch.randn((M, K), generator=gen, device=device) * token_mag
    w = torch.randn((N, K), generator=gen, device=device) * K ** -0.5
    a, a_scale = _quantize_rows(x)
    w_q, b_scale = _quantize_rows(w)
    # B = W^T: a (K, N) view of the (N, K) row-major weight, i.e. column-major.
    return {"a": a, "b": w_q.t(), "a_scale": a_scale, "b_scale": b_scale}


def bf16_operands(inputs: dict) -> dict:
    """The same GEMM unquantized: A and W dequantized once into bf16 (W row-major, B = W^T as
    a linear layer holds it). Runs outside any timed region."""
    a = (inputs["a"].float() * inputs["a_scale"][:, None]).to(torch.bfloat16)
    w = (inputs["b"].t().float() * inputs["b_scale"][:, None]).to(torch.bfloat16)
    return {"a": a, "b": w.t()}


def bf16_matmul(prepared: dict) -> torch.Tensor:
    return torch.matmul(prepared["a"], prepared["b"])


def scaled_mm(inputs: dict) -> torch.Tensor:
    """fp8 x fp8 -> bf16 with per-token and per-channel fp32 scales, as vLLM's W8A8 layer calls it."""
    return torch._scaled_mm(inputs["a"], inputs["b"], scale_a=inputs["a_scale"].view(-1, 1),
                            scale_b=inputs["b_scale"].view(1, -1), out_dtype=torch.bfloat16)


def baseline(inputs: dict) -> torch.Tensor:
    """The primary reference on the kernel's own inputs (dequantizing them first)."""
    return bf16_matmul(bf16_operands(inputs))


def reference(inputs: dict) -> torch.Tensor:
    a = inputs["a"].float() * inputs["a_scale"][:, None]
    b = inputs["b"].float() * inputs["b_scale"][None, :]
    return torch.matmul(a, b)


# The quantized operands are exact in the reference, and the accumulator is promoted to fp32
# every PROMOTE_K products, so what remains is mostly the bf16 output rounding: a relative L2
# error of about 1.7e-3, as for torch._scaled_mm. Without the promotion, Hopper's
# reduced-precision wgmma accumulation broke the elementwise bound at K >= 8192.
TOLERANCE = Tolerance(max_rel_l2=2e-2, atol=3e-2, rtol=3e-2)

# The references, each checked against the fp32 reference above on the same quantized values:
# - primary: the unquantized layer the fused kernel replaces, bf16 torch.matmul (cuBLAS) on the
#   dequantized operands; rounding the operands to bf16 adds about 3e-3 relative error;
# - torch._scaled_mm with row-wise scales, the fp8 GEMM vLLM's W8A8 layer calls: on sm_90
#   PyTorch dispatches it to a CUTLASS kernel (f8f8bf16_rowwise) or to cuBLASLt's fp8 GEMM with
#   outer-vector scales, by version (the committed H200 trace, torch 2.11 + CUDA 13.0, shows
#   cuBLASLt's nvjet_sm90_qqtst_..._ovscale kernel); the runner profiles it and records the
#   kernel that actually ran.
REFERENCES = [
    # Rounding both operands to bf16 (unit roundoff 2^-9 each) leaves an absolute error of
    # about 2^-8 * |a_row| * |b_col| per output, not proportional to the output itself: near-zero
    # outputs of the 4x-magnitude tokens then miss an atol of 3e-2 (78 of 67M elements did on the
    # H200 at 8192^3, rel L2 2.9e-3). atol is sized for those rows; rel L2 stays as strict.
    Reference(key=None, name=BF16_MATMUL, backend="cuBLAS", fn=bf16_matmul,
              tolerance=Tolerance(max_rel_l2=2e-2, atol=1e-1, rtol=3e-2), prepare=bf16_operands),
    Reference(key="scaled_mm_rowwise", name=SCALED_MM, backend="_scaled_mm's choice (profiled)",
              fn=scaled_mm, tolerance=TOLERANCE),
]


# --------------------------------------------------------------------------------------------
# Roofline model and the static audit's view
# --------------------------------------------------------------------------------------------
def flops(shape: Shape) -> int:
    return 2 * shape["M"] * shape["N"] * shape["K"]


def bytes_moved(shape: Shape) -> int:
    """fp8 A and B once, the fp32 scales once, bf16 C once."""
    M, N, K = shape["M"], shape["N"], shape["K"]
    return M * K + K * N + 4 * (M + N) + 2 * M * N


def compile_args(shape: Shape, config: dict) -> dict[str, object]:
    args = kernel_args(make_inputs(shape, "meta", 0), config)
    return {k: _ptr(v) if isinstance(v, torch.Tensor) else v for k, v in args.items()}


def grid(shape: Shape, config: dict) -> tuple[int, ...]:
    return _grid(shape["M"], shape["N"], config)


# --------------------------------------------------------------------------------------------
# Config space and shapes
# --------------------------------------------------------------------------------------------
def _cfg(bm: int, bn: int, bk: int, warps: int, stages: int, group_m: int = 8,
         promote_k: int | None = None) -> dict:
    cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m,
           "num_warps": warps, "num_stages": stages}
    if promote_k is not None:  # absent: promote every BLOCK_K, and the config id says nothing
        cfg["PROMOTE_K"] = promote_k
    return cfg


# Shared memory (sm_90 compiles): num_stages buffers of (BLOCK_M + BLOCK_N) * BLOCK_K bytes
# (1-byte operands) on the wgmma path, num_stages - 1 on the mma.sync path of BLOCK_M < 64,
# against the 227 KiB opt-in limit. With 1-byte operands BLOCK_K=128 moves as many bytes per
# stage as BLOCK_K=64 does in bf16, so it is the natural fp8 default.
#
# Registers decide the rest: the promotion keeps a second accumulator live.
# - Promotion inside the dot (PROMOTE_K = BLOCK_K) needs fewer: 256x128 on 8 warps (two 64-row
#   wgmma tiles per warp group) fits in 255 registers, though ptxas serializes its wgmmas (its
#   warning C7514). 128x256 on 8 warps (128 + 128 accumulator registers per thread) spills.
# - The loop's own partial (PROMOTE_K > BLOCK_K) is a whole second tile: 128x128 on 8 warps
#   (64 + 64 registers) fits, 256x128 on 8 warps spills.
# Measured on an H200, the outputs' relative L2 error is 1.66e-3 promoting every BLOCK_K (as
# torch._scaled_mm), 1.69e-3 every 512 products and 1.74e-3 every 1024; the fewer waits and adds
# made the 128x128 tile promoted every 512 or 1024 the fastest at every prefill shape.
CONFIGS: list[dict] = [
    # Promotion inside the dot, every BLOCK_K.
    _cfg(256, 128, 128, 8, 4),   # 192 KiB
    _cfg(256, 128, 128, 8, 3),   # 144 KiB
    _cfg(128, 128, 256, 8, 3),   # 192 KiB
    _cfg(128, 128, 128, 8, 4),   # 128 KiB
    _cfg(128, 128, 128, 4, 3),   # 96 KiB, two blocks per SM
    _cfg(64, 256, 128, 8, 4),    # 160 KiB
    _cfg(64, 128, 128, 4, 3),    # 72 KiB, three blocks per SM
    _cfg(64, 64, 128, 4, 4),     # 64 KiB
    # The loop's own partial, promoted every 512 or 1024 products.
    _cfg(128, 128, 128, 8, 4, promote_k=512),    # 128 KiB
    _cfg(128, 128, 128, 8, 3, promote_k=512),    # 96 KiB
    _cfg(128, 128, 128, 8, 4, promote_k=1024),   # 128 KiB
    _cfg(128, 128, 256, 8, 3, promote_k=512),    # 192 KiB
    _cfg(64, 256, 128, 8, 4, promote_k=512),     # 160 KiB
    _cfg(64, 128, 128, 4, 3, promote_k=512),     # 72 KiB
    # Small-M tiles for the memory-bound decode shape (M=16). BLOCK_M < 64 runs mma.sync, which
    # widens fp8 to fp16 and accumulates in full fp32: Triton emits no promotion there.
    _cfg(16, 64, 256, 4, 4, group_m=1),   # 60 KiB
    _cfg(64, 64, 256, 4, 3, group_m=1),   # 96 KiB
    # Register spills. 128x256 on 8 warps was the fastest tile before the promotion (1.015x
    # torch._scaled_mm at 8192^3, with wrong outputs); its two 128-register accumulators no
    # longer fit. 256x128 fits only with the promotion inside the dot; 256x256 never fits.
    _cfg(128, 256, 128, 8, 3),   # 144 KiB
    _cfg(256, 128, 128, 8, 4, promote_k=512),   # 192 KiB
    _cfg(256, 256, 128, 8, 3),   # 192 KiB
    _cfg(256, 256, 128, 4, 2),   # 128 KiB, heavy spills
    # Over the 227 KiB shared-memory opt-in limit.
    _cfg(256, 256, 128, 8, 4),   # 256 KiB
    _cfg(128, 256, 256, 8, 3),   # 288 KiB
    _cfg(256, 128, 256, 8, 4),   # 384 KiB
]

_LLAMA3_8B = "llama3-8b"
SHAPES: list[Shape] = [
    Shape("square_8192", {"M": 8192, "N": 8192, "K": 8192},
          label="8192^3 (ANCHORS: _scaled_mm 0.866 ms on H200)", phase="prefill"),
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
