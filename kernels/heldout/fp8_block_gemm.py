"""Block-scaled FP8 linear layer (W8A8, DeepSeek-V3 style), out = dequant(A) @ dequant(W)^T: the
fp8 projection that serving stacks run for checkpoints quantized with 128 x 128 weight blocks,
computed as vLLM's ``w8a8_block_fp8_matmul`` Triton kernel computes it.

    out[m, n] = sum_k (A[m, k] * a_scale[m, k // 128]) * (W[n, k] * b_scale[n // 128, k // 128])

Both operands are float8 e4m3fn. The activations are quantized per token and per GROUP_SIZE =
128 consecutive K: ``a_scale`` is (M, cdiv(K, 128)) fp32, row-major. The weights carry one fp32
scale per 128 x 128 block: ``b_scale`` is (cdiv(N, 128), cdiv(K, 128)), row-major (the
``weight_scale_inv`` of a DeepSeek-V3 checkpoint, a multiplier despite its name). The output is
bf16, the sums fp32.

Layout: W is the checkpoint's weight, (N, K) row-major, and its scales are indexed (N block, K
block) as the checkpoint stores them. The kernel sees W as a column-major (K, N) view through its
strides, as ``kernels/fp8_gemm.py`` sees its B: Hopper's fp8 wgmma wants both operands K-major
in shared memory, and the loads are K-contiguous (BLOCK_K >= 32 bytes per column of a tile,
whole 16-byte vectors). A (K, N) row-major weight would be N-major, which fp8 wgmma cannot read
directly (its transpose flags are for 16-bit types only).

Each K step loads the A and W tiles, multiplies them with ``tl.dot`` into a fresh fp32 partial
product (fp8 wgmmas, k = 32 each, so one to four per step), loads the scales of the 128-wide K
group the step lies in (one per tile row from ``a_scale``, one per tile column from ``b_scale``)
and adds ``partial * a_scale[:, None] * b_scale[None, :]`` into the accumulator. One K group per
step requires GROUP_SIZE % BLOCK_K == 0 (checked at compile time; every config keeps to it). The
weight scale is looked up per column (``offs_n // 128``, as vLLM does), so any BLOCK_N is right:
a 256-wide tile spans two weight blocks, a 32-wide one shares its block with three neighbours.
Because the tensor core only ever sums BLOCK_K <= 128 products before they are scaled and added
in fp32, the reduced-precision fp8 wgmma accumulation that ``kernels/fp8_gemm.py`` has to
promote by hand is promoted here by construction (DeepSeek-V3 promotes every 128 as well).

What this adds to a plain fp8 GEMM, and why it is a useful held-out kernel for the cost model
(``kernaudit_pipeline.rank``, fitted on the kernels one level up): every K step does CUDA-core
work on the whole BLOCK_M x BLOCK_N accumulator (an fp32 multiply and a fused multiply-add per
element) and loads BLOCK_M + BLOCK_N scales. In operations that is 1 / BLOCK_K of the step's
MMA work whatever the tile, but on units far slower than the fp8 tensor cores: it does not
shrink with BLOCK_M as the dequant of ``w8a16_gemm.py`` does, and BLOCK_K, capped at 128 by the
scale group, is the only lever. The partial product must be complete before it is scaled, so
the loop waits for its wgmmas every step and keeps a second fp32 tile live beside the
accumulator (registers: 256 x 128 on 8 warps spills). At decode sizes the kernel is bound by
reading W (one byte per element); at prefill sizes the fp8 tensor cores run against the
per-step scaling, and how well the two overlap depends on warps, stages and tile shape.

Programs are numbered in groups of GROUP_M tile-rows (the Triton matmul tutorial's grouped
order) so that neighbouring programs share W panels while they sit in L2.

Baseline: dequantize in PyTorch, then cuBLAS: A and W converted to fp32, times their block
scales and rounded once to bf16 (elementwise kernels that write both bf16 operands), and
``torch.matmul`` reading them back. It stays with portable PyTorch ops. Reference: the same
product with both operands dequantized in fp32 and an fp32 matmul.

Shapes: DeepSeek-V3's shared-expert gate_up projection (gate and up fused: K = 7168, N = 2 x
2048 = 4096), which every MoE layer runs on every token, at four batch-token counts M, the
buckets vLLM tunes per.

This kernel is held out from the cost model's calibration: it was added on 2026-12-06 as the
fifth held-out kernel, and its ranking is to be committed before any GPU times it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernaudit_pipeline.kernel_spec import Ptr, Shape, Tolerance

NAME = "fp8_block_gemm"
DTYPE = "fp8e4m3"  # A and W; the scales are fp32, the output bf16
BASELINE_NAME = ("(fp8 -> fp32) * block scales -> bf16 for A and W + torch.matmul "
                 "(dequant + cuBLAS, unfused)")
GROUP_SIZE = 128  # K per activation scale; the side of a weight scale block (128 x 128)
FP8_MAX = 448.0  # largest finite e4m3fn value
SCALE_BYTES = 4  # fp32 scales


# --------------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------------
@triton.jit
def fp8_block_gemm_kernel(
    a_ptr, b_ptr, as_ptr, bs_ptr, out_ptr,
    M, N, K,
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_asm, stride_asg,
    stride_bsn, stride_bsg,
    stride_om, stride_on,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, GROUP_SIZE: tl.constexpr,
):
    # One K group per step: a step never straddles two activation or weight scales.
    tl.static_assert(GROUP_SIZE % BLOCK_K == 0, "BLOCK_K must divide GROUP_SIZE")

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
    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
    # One activation scale per tile row; one weight scale per tile column, from the 128-wide
    # N block the column lies in.
    as_ptrs = as_ptr + offs_am * stride_asm
    bs_ptrs = bs_ptr + (offs_bn // GROUP_SIZE) * stride_bsn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_remaining = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_remaining, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_remaining, other=0.0)
        # The scales of this step's K group; a K tail still lies in the last (partial) group.
        g = (k * BLOCK_K) // GROUP_SIZE
        a_s = tl.load(as_ptrs + g * stride_asg)
        b_s = tl.load(bs_ptrs + g * stride_bsg)
        # fp8 x fp8 -> a fresh fp32 partial (at most GROUP_SIZE products in the tensor core),
        # scaled per row and column and added with full fp32 arithmetic.
        acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    out = acc.to(out_ptr.dtype.element_ty)
    offs_om = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_on = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    out_ptrs = out_ptr + stride_om * offs_om[:, None] + stride_on * offs_on[None, :]
    out_mask = (offs_om[:, None] < M) & (offs_on[None, :] < N)
    tl.store(out_ptrs, out, mask=out_mask)


KERNEL = fp8_block_gemm_kernel


# --------------------------------------------------------------------------------------------
# The launcher
# --------------------------------------------------------------------------------------------
_TRITON_DTYPE = {torch.float8_e4m3fn: "fp8e4nv", torch.bfloat16: "bf16", torch.float16: "fp16",
                 torch.float32: "fp32"}


def _ptr(t: torch.Tensor) -> Ptr:
    return Ptr(_TRITON_DTYPE[t.dtype], aligned=t.data_ptr() % 16 == 0)


def _grid(M: int, N: int, config: dict) -> tuple[int, ...]:
    return (triton.cdiv(M, config["BLOCK_M"]) * triton.cdiv(N, config["BLOCK_N"]),)


def kernel_args(inputs: dict, config: dict,
                out: torch.Tensor | None = None) -> dict[str, object]:
    """Every ``KERNEL`` argument by name; ``launch`` and ``compile_args`` both derive from it,
    so the static audit compiles exactly what the GPU runs."""
    a, b, a_s, b_s = inputs["a"], inputs["b"], inputs["a_scale"], inputs["b_scale"]
    M, K = a.shape
    N = b.shape[1]
    groups = triton.cdiv(K, GROUP_SIZE)
    if (b.shape[0] != K or a_s.shape != (M, groups)
            or b_s.shape != (triton.cdiv(N, GROUP_SIZE), groups)):
        raise ValueError(f"A {tuple(a.shape)}, W {tuple(b.shape)}, a_scale {tuple(a_s.shape)} "
                         f"and b_scale {tuple(b_s.shape)} do not chain (group size {GROUP_SIZE})")
    if out is None:
        out = torch.empty((M, N), device=a.device, dtype=torch.bfloat16)
    return {
        "a_ptr": a, "b_ptr": b, "as_ptr": a_s, "bs_ptr": b_s, "out_ptr": out,
        "M": M, "N": N, "K": K,
        "stride_am": a.stride(0), "stride_ak": a.stride(1),
        "stride_bk": b.stride(0), "stride_bn": b.stride(1),
        "stride_asm": a_s.stride(0), "stride_asg": a_s.stride(1),
        "stride_bsn": b_s.stride(0), "stride_bsg": b_s.stride(1),
        "stride_om": out.stride(0), "stride_on": out.stride(1),
        **{k: config[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")},
        "GROUP_SIZE": GROUP_SIZE,
    }


def launch(inputs: dict, config: dict, out: torch.Tensor | None = None) -> torch.Tensor:
    args = kernel_args(inputs, config, out)
    fp8_block_gemm_kernel[_grid(args["M"], args["N"], config)](
        **args, num_warps=config["num_warps"], num_stages=config["num_stages"])
    return args["out_ptr"]


# --------------------------------------------------------------------------------------------
# Inputs, baseline, reference
# --------------------------------------------------------------------------------------------
def _expand(scale: torch.Tensor, block_rows: int, R: int, C: int) -> torch.Tensor:
    """Block scales -> one per element of the (R, C) operand."""
    per_row = scale.repeat_interleave(block_rows, dim=0)[:R]
    return per_row.repeat_interleave(GROUP_SIZE, dim=1)[:, :C]


def quantize(x: torch.Tensor, block_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, C) -> e4m3 values and (cdiv(R, block_rows), cdiv(C, GROUP_SIZE)) fp32 scales, one
    per block_rows x GROUP_SIZE block, whose absolute max maps to 448: per token and K group
    with ``block_rows`` 1 (activations), per 128 x 128 block with 128 (weights). Partial blocks
    at the edges take the max over their real elements."""
    R, C = x.shape
    rb, cb = triton.cdiv(R, block_rows), triton.cdiv(C, GROUP_SIZE)
    padded = torch.nn.functional.pad(x, (0, cb * GROUP_SIZE - C, 0, rb * block_rows - R))
    amax = padded.view(rb, block_rows, cb, GROUP_SIZE).abs().amax(dim=(1, 3))
    scale = (amax.clamp_min(1e-12) / FP8_MAX).float()
    q = (x / _expand(scale, block_rows, R, C)).clamp(-FP8_MAX, FP8_MAX)
    return q.to(torch.float8_e4m3fn), scale


def _magnitudes(R: int, C: int, block_rows: int, gen: torch.Generator,
                device: str) -> torch.Tensor:
    """A factor 2^U(-1, 1) per block_rows x GROUP_SIZE block, one per element of (R, C)."""
    shape = (triton.cdiv(R, block_rows), triton.cdiv(C, GROUP_SIZE))
    exps = torch.rand(shape, generator=gen, device=device) * 2 - 1
    return _expand(2.0 ** exps, block_rows, R, C)


def make_inputs(shape: Shape, device: str, seed: int) -> dict:
    """x ~ N(0, 1) and W ~ N(0, 1/K), with magnitudes that differ by up to 4x between the
    (token, K group) blocks of x and the 128 x 128 blocks of W (what the fine-grained scales are
    for: a kernel that applied a neighbouring block's scale would break the tolerance),
    quantized as a block-scaled FP8 checkpoint and its serving stack quantize them. The
    outputs are of order 1 whatever K is.

    ``b`` is the (K, N) column-major view of the (N, K) row-major e4m3 weight.
    """
    M, N, K = shape["M"], shape["N"], shape["K"]
    groups = triton.cdiv(K, GROUP_SIZE)
    if torch.device(device).type == "meta":
        return {"a": torch.empty((M, K), device="meta", dtype=torch.float8_e4m3fn),
                "a_scale": torch.empty((M, groups), device="meta", dtype=torch.float32),
                "b": torch.empty((N, K), device="meta", dtype=torch.float8_e4m3fn).t(),
                "b_scale": torch.empty((triton.cdiv(N, GROUP_SIZE), groups), device="meta",
                                       dtype=torch.float32)}
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn((M, K), generator=gen, device=device) * _magnitudes(M, K, 1, gen, device)
    w = torch.randn((N, K), generator=gen, device=device) * K ** -0.5
    w = w * _magnitudes(N, K, GROUP_SIZE, gen, device)
    a, a_scale = quantize(x, 1)
    w_q, b_scale = quantize(w, GROUP_SIZE)
    return {"a": a, "a_scale": a_scale, "b": w_q.t(), "b_scale": b_scale}


def dequantize(q: torch.Tensor, scale: torch.Tensor, block_rows: int,
               dtype: torch.dtype) -> torch.Tensor:
    """The (R, C) operand in ``dtype``: e4m3 -> fp32, times its block scales, rounded once.
    Whole blocks broadcast their scale (no expanded scale tensor is written); only sizes that
    are no multiple of the blocks (small test shapes) expand."""
    R, C = q.shape
    if R % block_rows == 0 and C % GROUP_SIZE == 0:
        blocks = q.view(R // block_rows, block_rows, C // GROUP_SIZE, GROUP_SIZE)
        return (blocks.to(torch.float32) * scale[:, None, :, None]).to(dtype).view(R, C)
    return (q.to(torch.float32) * _expand(scale, block_rows, R, C)).to(dtype)


def baseline(inputs: dict) -> torch.Tensor:
    """Dequantize both operands to bf16 (elementwise kernels that write the M x K and N x K
    operands), then cuBLAS reads them back: x @ W^T, as nn.Linear calls it."""
    x = dequantize(inputs["a"], inputs["a_scale"], 1, torch.bfloat16)
    w = dequantize(inputs["b"].t(), inputs["b_scale"], GROUP_SIZE, torch.bfloat16)
    return torch.matmul(x, w.t())


def reference(inputs: dict) -> torch.Tensor:
    x = dequantize(inputs["a"], inputs["a_scale"], 1, torch.float32)
    w = dequantize(inputs["b"].t(), inputs["b_scale"], GROUP_SIZE, torch.float32)
    return x @ w.t()


# The quantized operands are exact in the reference, and the tensor core sums at most 128
# products before they are scaled and added in fp32, so what remains is mostly the bf16 output
# rounding: the tolerance of fp8_gemm. The baseline's bf16 operands (unit roundoff 2^-9 each)
# add an absolute error of about 3e-3 (one standard deviation; the outputs' is about 1.35): at
# M = 4096, computed on a CPU, its worst element stayed 0.014 inside the elementwise bound.
TOLERANCE = Tolerance(max_rel_l2=2e-2, atol=3e-2, rtol=3e-2)


# --------------------------------------------------------------------------------------------
# Roofline model and the static audit's view
# --------------------------------------------------------------------------------------------
def flops(shape: Shape) -> int:
    """The product; the scaling's multiplies and adds on the accumulator, repeated every
    K step, are left out."""
    return 2 * shape["M"] * shape["N"] * shape["K"]


def bytes_moved(shape: Shape) -> int:
    """A and W (e4m3) and their fp32 scales read once, the output (bf16) written once. Per
    element of M x K that is 1 + SCALE_BYTES / GROUP_SIZE bytes, per element of K x N
    1 + SCALE_BYTES / GROUP_SIZE^2."""
    M, N, K = shape["M"], shape["N"], shape["K"]
    groups = triton.cdiv(K, GROUP_SIZE)
    scales = M * groups + triton.cdiv(N, GROUP_SIZE) * groups
    return M * K + K * N + scales * SCALE_BYTES + 2 * M * N


def compile_args(shape: Shape, config: dict) -> dict[str, object]:
    args = kernel_args(make_inputs(shape, "meta", 0), config)
    return {k: _ptr(v) if isinstance(v, torch.Tensor) else v for k, v in args.items()}


def grid(shape: Shape, config: dict) -> tuple[int, ...]:
    return _grid(shape["M"], shape["N"], config)


# --------------------------------------------------------------------------------------------
# Config space and shapes
# --------------------------------------------------------------------------------------------
def _cfg(bm: int, bn: int, bk: int, warps: int, stages: int, group_m: int) -> dict:
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m,
            "num_warps": warps, "num_stages": stages}


def _space() -> list[dict]:
    """A tuner's grid, built like the other held-out kernels' grids.

    - BLOCK_M 16..256 by BLOCK_N 32..256, except 256x256 (its fp32 accumulator alone is 256
      registers per thread on 8 warps, before the partial product beside it);
    - BLOCK_K 32 and 64 with 2 to 5 stages, 128 with 2 to 4: every BLOCK_K divides GROUP_SIZE,
      and 32 is one fp8 wgmma deep, so it scales the accumulator after every wgmma;
    - 4 and 8 warps on every tile: the per-step scaling is work per accumulator element, which
      more warps spread thinner, so small-M tiles get the second warp count too;
    - GROUP_M 8 from 64 rows (1 below), plus GROUP_M 1 for the 64- and 128-row tiles 128 and
      256 wide at BLOCK_K 64 and 128 on 8 warps, to see what the grouping is worth.

    Shared memory per stage is (BLOCK_M + BLOCK_N) * BLOCK_K bytes for the loads (both in
    e4m3): with one-byte operands a stage costs half what it does in bf16.
    """
    k_stages = ((32, (2, 3, 4, 5)), (64, (2, 3, 4, 5)), (128, (2, 3, 4)))
    assert all(bk <= GROUP_SIZE and GROUP_SIZE % bk == 0 for bk, _ in k_stages)
    configs = []
    for bm in (16, 32, 64, 128, 256):
        for bn in (32, 64, 128, 256):
            if bm * bn > 128 * 256:
                continue
            for bk, stage_range in k_stages:
                for warps in (4, 8):
                    for stages in stage_range:
                        configs.append(_cfg(bm, bn, bk, warps, stages, 8 if bm >= 64 else 1))
    for bm in (64, 128):
        for bn in (128, 256):
            for bk in (64, 128):
                for stages in (3, 4):
                    configs.append(_cfg(bm, bn, bk, 8, stages, 1))
    return configs


CONFIGS: list[dict] = _space()

_N, _K = 4096, 7168  # shared expert's gate and up (2 x moe_intermediate_size 2048), hidden size
SHAPES: list[Shape] = [
    Shape(f"deepseek_v3_fp8_block_shared_gate_up_m{m}", {"M": m, "N": _N, "K": _K},
          label=f"deepseek-v3 fp8 block-scaled (128x128) shared-expert gate_up_proj "
                f"(K,N)=({_K},{_N}) M={m} ({phase})",
          phase=phase)
    for m, phase in ((16, "decode"), (128, "decode"), (1024, "prefill"), (4096, "prefill"))
]
