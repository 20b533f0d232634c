"""Int8 W8A8 linear layer with per-token and per-channel scales, out = (x_q @ W_q^T) * s_x * s_w + b:
the projection that serving stacks run for checkpoints quantized to int8 weights and int8 dynamic
activations (compressed-tensors "W8A8-INT8", SmoothQuant-style), as vLLM's Triton
``triton_scaled_mm`` computes it.

    out[m, n] = (sum_k x_q[m, k] * W_q[n, k]) * x_scale[m] * w_scale[n] + b[n]

x_q is int8 (M, K), quantized per token: ``x_scale`` is (M, 1) fp32, one scale per row. W_q is
int8 in nn.Linear's (N, K) layout, as checkpoints store it, with one fp32 scale per output
channel: ``w_scale`` is (N,). Both are symmetric (no zero points). The bias is bf16 (N,), the
output bf16.

Layout: W is read K-major, as ``bias_gelu_gemm.py`` and ``fp8_block_gemm.py`` read theirs: its
(BLOCK_K, BLOCK_N) tile is addressed as ``w_ptr + offs_n[None, :] * stride_wn + offs_k[:, None]
* stride_wk`` with ``stride_wk`` = 1, so each output column's slice of a tile is BLOCK_K >= 64
contiguous bytes. Hopper's int8 wgmma (``wgmma ... .s32.s8.s8``), like its fp8 one, takes both
operands K-major from shared memory only; that is the layout the checkpoint already has, so no
transposed copy of the weight is ever made.

Each program computes one BLOCK_M x BLOCK_N tile with an int32 accumulator over K: ``tl.dot`` of
int8 operands with ``out_dtype=tl.int32`` (wgmma s8 on sm_90 from BLOCK_M = 64, mma.sync
m16n8k32 below; both need K steps of 32, so BLOCK_K is 64 to 256; ``num_stages`` sets the depth
of the asynchronous global->shared pipeline). The integer sums are exact: |x_q|, |W_q| <= 127, so
a sum over K is at most 127^2 K = 2.2e8 at K = 13824, far inside int32 (it would take K > 133,000
to overflow). The epilogue runs once per tile on the finished accumulator: convert it to fp32,
multiply by the row scale and the column scale, add the bias (converted to fp32), round once to
bf16 and store. vLLM adds its bias after rounding to the output type (two roundings); this
kernel adds it in fp32 before the one rounding, which is the same cost and never less accurate.
The bias is always part of the kernel (vLLM passes one for the layers that have it; at a
row-parallel layer, on tensor-parallel rank 0).

Programs are numbered in groups of GROUP_M tile-rows (the Triton matmul tutorial's grouped
order), so that neighbouring programs share W panels while they sit in L2. vLLM's kernel uses
plain row-major order (GROUP_M = 1 here), in which every tile-row streams the whole weight: the
config space sweeps GROUP_M to see what the grouping is worth.

Edges: rows and columns past M and N wrap around (``% M``, ``% N``) in the loads of x, W and the
scales and bias, as in the Triton tutorial and the other held-out kernels, so those loads stay
unmasked in M and N and the final store is masked instead; the K tail is masked in both operand
loads (``other=0``, adding nothing to the sum).

What this adds to the kernels the cost model (``kernaudit_pipeline.rank``) was fitted on: the
int8 tensor cores (twice the bf16 MMA rate on Hopper, the fp8 rate), one-byte operands in DRAM
and shared memory (so a stage costs half its bf16 bytes and deeper pipelines fit), an int32
accumulator converted in the epilogue, and a per-tile epilogue that loads BLOCK_M + BLOCK_N
scales and BLOCK_N biases, all at a shape whose int8 weight (70.8 MB) is larger than the 50 MB
L2 of an H100 or H200. At decode sizes the kernel is bound by reading W once (one byte per
element); at prefill sizes it is an int8 tensor-core GEMM with a short epilogue.

Baseline: what a plain PyTorch serving path without a fused kernel runs (torchao's int8 dynamic
quantization in eager mode, for one): ``torch._int_mm(x_q, W_q.t())``, cuBLAS's int8 GEMM to an
int32 (M, N) matrix (W_q.t() is the column-major view cuBLAS takes as is), then the scaling, the
bias and the cast to bf16 as separate elementwise kernels, each reading and writing an M x N
fp32 intermediate. On CUDA ``_int_mm`` requires more than 16 rows and K, N multiples of 8
(``_int_mm_out_cuda``). So at M <= 16 (the M = 16 decode bucket) the baseline pads x with zero
rows to 32, multiplies and slices the first M rows back (an extra copy of x, 0.2 MB at M = 16,
and a GEMM twice as tall, still bound by reading the same weight); where K or N is no multiple of
8 (small test shapes only, never a declared shape) it pads K and N with zeros the same way. It
does so on every device, so the CPU runs what the GPU runs.

Reference: exact. The int8 product in float64 (every product is below 2^14 and every sum below
2^53, so the float64 matmul is the integer product), times both scales and plus the bias in
float64, returned as fp32.

Shapes: Qwen2.5-32B's MLP ``down_proj`` (hidden 5120, intermediate 27648; int8 W8A8 checkpoints
of it are common) under tensor parallelism 2 (row-parallel: each rank holds half the input
features), so K = 13824 and N = 5120, at four batch-token counts M, the buckets vLLM tunes per.
Qwen2.5's MLP has no bias: the kernel takes one anyway (the layers that do, such as its qkv_proj,
are too small for this purpose: 18 MB of int8 weight at TP2), and its cost, BLOCK_N bf16 loads
per tile, is 0.01 % of the bytes at M = 16.

This kernel is held out from the cost model's calibration: it was written by a helper that
never ran the model, and its config space was designed as a tuning sweep for this kernel, not
around any model.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernaudit_pipeline.kernel_spec import Ptr, Reference, Shape, Tolerance

NAME = "w8a8_int8_gemm"
DTYPE = "int8"  # x and W; the scales are fp32, the bias and the output bf16
BASELINE_NAME = ("torch._int_mm(x, W.t()) + PyTorch elementwise scaling, bias and bf16 cast "
                 "(cuBLAS int8 GEMM, unfused; M <= 16 padded to 32 rows and sliced)")
SCALE_BYTES = 4  # fp32 scales
INT_MM_MIN_ROWS = 17  # torch._int_mm on CUDA wants more than 16 rows ...
INT_MM_ALIGN = 8  # ... and K, N multiples of 8
INT_MM_PAD_ROWS = 32  # what the baseline pads a short x to


# --------------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------------
@triton.jit
def w8a8_int8_gemm_kernel(
    x_ptr, w_ptr, xs_ptr, ws_ptr, b_ptr, out_ptr,
    M, N, K,
    stride_xm, stride_xk,
    stride_wn, stride_wk,  # W is (N, K) row-major: stride_wk = 1, read K-major
    stride_om, stride_on,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    # Grouped ordering: walk GROUP_M tile-rows down one tile-column before moving right, so a
    # wave of programs reuses the same W panels from L2.
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    # Rows/columns past the edge wrap around (% M, % N): the loads stay unmasked in M and N,
    # the final store is masked instead. The W tile is (BLOCK_K, BLOCK_N), K-contiguous.
    offs_xm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_wn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + (offs_xm[:, None] * stride_xm + offs_k[None, :] * stride_xk)
    w_ptrs = w_ptr + (offs_wn[None, :] * stride_wn + offs_k[:, None] * stride_wk)

    # int8 x int8 -> int32 on the tensor cores; the sums are exact.
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_remaining = K - k * BLOCK_K
        x = tl.load(x_ptrs, mask=offs_k[None, :] < k_remaining, other=0)
        w = tl.load(w_ptrs, mask=offs_k[:, None] < k_remaining, other=0)
        acc = tl.dot(x, w, acc, out_dtype=tl.int32)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk

    # Epilogue in fp32, once per tile: the token scales (one per row), the channel scales and
    # the bias (one per column, wrapped like the W columns), then one rounding to the output.
    x_scale = tl.load(xs_ptr + offs_xm)
    w_scale = tl.load(ws_ptr + offs_wn)
    bias = tl.load(b_ptr + offs_wn).to(tl.float32)
    y = acc.to(tl.float32) * x_scale[:, None] * w_scale[None, :] + bias[None, :]

    out = y.to(out_ptr.dtype.element_ty)
    offs_om = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_on = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    out_ptrs = out_ptr + stride_om * offs_om[:, None] + stride_on * offs_on[None, :]
    out_mask = (offs_om[:, None] < M) & (offs_on[None, :] < N)
    tl.store(out_ptrs, out, mask=out_mask)


KERNEL = w8a8_int8_gemm_kernel


# --------------------------------------------------------------------------------------------
# The launcher
# --------------------------------------------------------------------------------------------
_TRITON_DTYPE = {torch.int8: "i8", torch.bfloat16: "bf16", torch.float16: "fp16",
                 torch.float32: "fp32"}


def _ptr(t: torch.Tensor) -> Ptr:
    return Ptr(_TRITON_DTYPE[t.dtype], aligned=t.data_ptr() % 16 == 0)


def _grid(M: int, N: int, config: dict) -> tuple[int, ...]:
    return (triton.cdiv(M, config["BLOCK_M"]) * triton.cdiv(N, config["BLOCK_N"]),)


def kernel_args(inputs: dict, config: dict,
                out: torch.Tensor | None = None) -> dict[str, object]:
    """Every ``KERNEL`` argument by name; ``launch`` and ``compile_args`` both derive from it,
    so the static audit compiles exactly what the GPU runs. The output takes the bias's dtype
    (bf16; fp32 in the interpreter tests that check the epilogue to float precision)."""
    x, w = inputs["x"], inputs["w"]
    xs, ws, b = inputs["x_scale"], inputs["w_scale"], inputs["b"]
    M, K = x.shape
    N = w.shape[0]
    if (x.dtype != torch.int8 or w.dtype != torch.int8 or w.shape[1] != K
            or tuple(xs.shape) != (M, 1) or not xs.is_contiguous() or xs.dtype != torch.float32
            or tuple(ws.shape) != (N,) or ws.stride() != (1,) or ws.dtype != torch.float32
            or tuple(b.shape) != (N,) or b.stride() != (1,)):
        raise ValueError(f"x {tuple(x.shape)} {x.dtype}, W {tuple(w.shape)} {w.dtype}, x_scale "
                         f"{tuple(xs.shape)}, w_scale {tuple(ws.shape)} and b {tuple(b.shape)} "
                         f"do not chain (int8 x (M, K) and W (N, K), fp32 x_scale a contiguous "
                         f"(M, 1) and w_scale an (N,), b a contiguous (N,))")
    if out is None:
        out = torch.empty((M, N), device=x.device, dtype=b.dtype)
    return {
        "x_ptr": x, "w_ptr": w, "xs_ptr": xs, "ws_ptr": ws, "b_ptr": b, "out_ptr": out,
        "M": M, "N": N, "K": K,
        "stride_xm": x.stride(0), "stride_xk": x.stride(1),
        "stride_wn": w.stride(0), "stride_wk": w.stride(1),
        "stride_om": out.stride(0), "stride_on": out.stride(1),
        **{k: config[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")},
    }


def launch(inputs: dict, config: dict, out: torch.Tensor | None = None) -> torch.Tensor:
    args = kernel_args(inputs, config, out)
    w8a8_int8_gemm_kernel[_grid(args["M"], args["N"], config)](
        **args, num_warps=config["num_warps"], num_stages=config["num_stages"])
    return args["out_ptr"]


# --------------------------------------------------------------------------------------------
# Inputs, baseline, reference
# --------------------------------------------------------------------------------------------
def _magnitudes(n: int, gen: torch.Generator, device: str) -> torch.Tensor:
    """A factor 2^U(-1, 1) per row: up to 4x between tokens (or output channels)."""
    return 2.0 ** (torch.rand((n, 1), generator=gen, device=device) * 2 - 1)


def quantize(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per row of an (R, C) tensor, as a W8A8-INT8 checkpoint stores its weight
    (per output channel) and vLLM quantizes activations on the fly (per token): the scale maps
    the row's absolute max to 127, the values round to nearest. Returns int8 (R, C) and fp32
    scales (R, 1)."""
    scale = (t.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127.0).float()
    q = torch.round(t / scale).clamp(-127, 127).to(torch.int8)
    return q, scale


def make_inputs(shape: Shape, device: str, seed: int,
                dtype: torch.dtype = torch.bfloat16) -> dict:
    """What a quantized layer sees: x ~ N(0, 1) and W ~ N(0, 1/K), each row given a magnitude
    2^U(-1, 1) (tokens and output channels differ by up to 4x, so a kernel that applied another
    row's or column's scale would break the tolerance), then quantized per token and per output
    channel to int8 as above: int8 values bell-shaped with each row's extreme at +-127, and
    scales of realistic size (about 4 / 127 for a token, 4 / (127 sqrt(K)) for a channel). The
    outputs are of order 1 whatever K is, and the bias b ~ N(0, 1/4) moves every one of them by a
    visible amount, so a kernel that dropped or misplaced it would fail the tolerance as well.

    ``dtype`` is that of the bias and so of the output: bf16 as served; the interpreter tests
    also run fp32 to check the integer sums and the epilogue to float precision.
    """
    M, N, K = shape["M"], shape["N"], shape["K"]
    if torch.device(device).type == "meta":
        return {"x": torch.empty((M, K), device="meta", dtype=torch.int8),
                "x_scale": torch.empty((M, 1), device="meta", dtype=torch.float32),
                "w": torch.empty((N, K), device="meta", dtype=torch.int8),
                "w_scale": torch.empty((N,), device="meta", dtype=torch.float32),
                "b": torch.empty((N,), device="meta", dtype=dtype)}
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn((M, K), generator=gen, device=device) * _magnitudes(M, gen, device)
    w = torch.randn((N, K), generator=gen, device=device) * K ** -0.5
    w = w * _magnitudes(N, gen, device)
    b = (torch.randn((N,), generator=gen, device=device) * 0.5).to(dtype)
    x_q, x_scale = quantize(x)
    w_q, w_scale = quantize(w)
    return {"x": x_q, "x_scale": x_scale, "w": w_q, "w_scale": w_scale.view(N), "b": b}


def _pad(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    return torch.nn.functional.pad(t, (0, cols - t.shape[1], 0, rows - t.shape[0]))


def int_mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``torch._int_mm(x, w.t())`` (cuBLAS int8 GEMM to int32 on CUDA), with zero padding where
    CUDA's ``_int_mm`` refuses the shape: x padded to INT_MM_PAD_ROWS rows when M <= 16, K and
    N to multiples of 8 (test shapes only); the padded rows and columns are sliced off and the
    zero K columns add nothing."""
    M, K = x.shape
    N = w.shape[0]
    rows = M if M >= INT_MM_MIN_ROWS else INT_MM_PAD_ROWS
    k_pad = -(-K // INT_MM_ALIGN) * INT_MM_ALIGN
    n_pad = -(-N // INT_MM_ALIGN) * INT_MM_ALIGN
    if (rows, k_pad) != (M, K):
        x = _pad(x, rows, k_pad)
    if (n_pad, k_pad) != (N, K):
        w = _pad(w, n_pad, k_pad)
    acc = torch._int_mm(x, w.t())
    return acc[:M, :N] if (rows, n_pad) != (M, N) else acc


def baseline(inputs: dict) -> torch.Tensor:
    """The unfused layer: cuBLAS's int8 GEMM to int32, then four elementwise kernels: times the
    token scales (int32 * fp32 -> fp32), times the channel scales, plus the bias (in fp32), cast
    to the output type (one rounding, as in the kernel)."""
    acc = int_mm(inputs["x"], inputs["w"])
    y = acc * inputs["x_scale"]
    y = y * inputs["w_scale"]
    y = y + inputs["b"]
    return y.to(inputs["b"].dtype)


def reference(inputs: dict) -> torch.Tensor:
    """Exact arithmetic: the int8 product in float64 (exact: products below 2^14, sums below
    2^53), both scales and the bias in float64, returned as fp32."""
    acc = inputs["x"].double() @ inputs["w"].double().t()
    y = acc * inputs["x_scale"].double() * inputs["w_scale"].double() + inputs["b"].double()
    return y.float()


# One bf16 rounding of the output: at most 2^-9 = 0.2 % relative on the GPU (round to nearest),
# 2^-8 under the CPU interpreter (which truncates), so rtol = 1 % leaves at least 2.5x of room
# per element and the relative L2 error (about 0.1 %, 0.2 % truncated) is far below 1 %. Before
# the rounding the kernel's error is that of a few fp32 operations (the integer sums are exact);
# atol covers outputs that cancel to near zero. Dropping the bias (~N(0, 1/4) on outputs of
# order 1), a scale (factors of 30 to 10^4), or taking another row's or column's scale (up to 4x)
# moves the output far past this.
TOLERANCE = Tolerance(max_rel_l2=1e-2, atol=1e-2, rtol=1e-2)

# The one reference the runner times every config against: the unfused PyTorch layer. The
# runner profiles it and records the kernels that actually ran (cuBLAS's int8 GEMM, or
# cuBLASLt's, and PyTorch's elementwise kernels).
REFERENCES = [Reference(key=None, name=BASELINE_NAME,
                        backend="cuBLAS int8 GEMM (torch._int_mm) + PyTorch elementwise scaling",
                        fn=baseline, tolerance=TOLERANCE)]


# --------------------------------------------------------------------------------------------
# Roofline model and the static audit's view
# --------------------------------------------------------------------------------------------
def flops(shape: Shape) -> int:
    """The product, 2 * K integer operations per output element; the epilogue's conversion,
    two multiplies and the bias add (4 per output element against 2 * K = 27,648) are left
    out."""
    return 2 * shape["M"] * shape["N"] * shape["K"]


def bytes_moved(shape: Shape) -> int:
    """x and W (int8) read once, their fp32 scales and the bf16 bias read once, the output
    (bf16) written once. The int32 product never reaches memory (the baseline writes it and
    then reads and writes fp32 intermediates: about 28 * M * N bytes more)."""
    M, N, K = shape["M"], shape["N"], shape["K"]
    return M * K + N * K + SCALE_BYTES * (M + N) + 2 * N + 2 * M * N


def compile_args(shape: Shape, config: dict) -> dict[str, object]:
    args = kernel_args(make_inputs(shape, "meta", 0), config)
    return {k: _ptr(v) if isinstance(v, torch.Tensor) else v for k, v in args.items()}


def grid(shape: Shape, config: dict) -> tuple[int, ...]:
    return _grid(shape["M"], shape["N"], config)


# --------------------------------------------------------------------------------------------
# Config space and shapes
# --------------------------------------------------------------------------------------------
def _cfg(bm: int, bn: int, bk: int, group_m: int, warps: int, stages: int) -> dict:
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m,
            "num_warps": warps, "num_stages": stages}


def _smem(bm: int, bn: int, bk: int, stages: int) -> int:
    """Bytes of the pipelined x and W tiles (int8, one byte an element)."""
    return stages * (bm + bn) * bk


SMEM_CAP = 256 * 1024  # a little over the 227 KiB opt-in limit, so some configs exceed it
# BLOCK_K 64 (64 bytes a row, as shallow as a bf16 BLOCK_K of 32) with 3 to 5 stages, 128 with
# 2 to 5, 256 with 2 to 4: one-byte tiles let the pipeline go deeper than in bf16.
K_STAGES = {64: (3, 4, 5), 128: (2, 3, 4, 5), 256: (2, 3, 4)}
BASE_GROUP_M = 8  # the Triton matmul tutorial's default
GROUP_MS = (1, 8, 16, 32, 64)
SWEEP_BLOCK_K, SWEEP_STAGES = 128, 4  # where GROUP_M is swept


def _space() -> list[dict]:
    """A Triton-autotune / vLLM-benchmark style sweep (BLOCK_M 16..256, BLOCK_N 32..256,
    BLOCK_K 64..256, GROUP_M 1/8/16/32/64, 4 and 8 warps, 2 to 5 stages), subsampled:

    - every tile except 256 x 256 (its int32 accumulator alone is 256 registers per thread on 8
      warps); 128 x 256 and 256 x 128 on 4 warps spill;
    - the BLOCK_K and stage pairs of K_STAGES, and no pipeline over SMEM_CAP (``_smem``), which
      leaves some over the opt-in limit;
    - 4 and 8 warps on every tile;
    - GROUP_M 8 on all of the above (at M = 16 there is one tile-row, and it changes nothing);
    - and a GROUP_M sweep: the other four of 1/8/16/32/64 on every tile 64 to 256 wide (every
      BLOCK_M, 256 x 256 still left out) at BLOCK_K 128 and 4 stages, 4 warps up to 32 rows and
      8 from 64. GROUP_M 1 is vLLM's own row-major order, in which each tile-row streams the
      whole weight.
    """
    configs = []
    for bm in (16, 32, 64, 128, 256):
        for bn in (32, 64, 128, 256):
            if bm * bn > 128 * 256:
                continue
            for bk, stage_range in K_STAGES.items():
                for stages in stage_range:
                    if _smem(bm, bn, bk, stages) > SMEM_CAP:
                        continue
                    for warps in (4, 8):
                        configs.append(_cfg(bm, bn, bk, BASE_GROUP_M, warps, stages))
    for bm in (16, 32, 64, 128, 256):
        for bn in (64, 128, 256):
            if bm * bn > 128 * 256:
                continue
            for group_m in GROUP_MS:
                if (group_m != BASE_GROUP_M
                        and _smem(bm, bn, SWEEP_BLOCK_K, SWEEP_STAGES) <= SMEM_CAP):
                    configs.append(_cfg(bm, bn, SWEEP_BLOCK_K, group_m, 4 if bm <= 32 else 8,
                                        SWEEP_STAGES))
    return configs


CONFIGS: list[dict] = _space()

# down_proj's input features on one of 2 tensor-parallel ranks (27648 / 2), hidden size
_K, _N = 27648 // 2, 5120
SHAPES: list[Shape] = [
    Shape(f"qwen2_5_32b_tp2_down_proj_m{m}", {"M": m, "N": _N, "K": _K},
          label=f"qwen2.5-32b int8 W8A8 (per-token x, per-channel W) MLP down_proj + bias, "
                f"TP2 (K,N)=({_K},{_N}) M={m} tokens ({phase})",
          phase=phase)
    for m, phase in ((16, "decode"), (128, "decode"), (1024, "prefill"), (4096, "prefill"))
]
