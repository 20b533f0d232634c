"""Weight-only int4 linear layer (W4A16), out = x @ dequant(W): the AWQ-style quantized projection
that LLM serving runs when the weights are 4-bit and the activations stay bf16.

    out[m, n] = sum_k x[m, k] * ((W_q[k, n] - zeros[g, n]) * scales[g, n]),  g = k // GROUP_SIZE

W_q holds asymmetric 4-bit values 0..15. Each run of GROUP_SIZE = 128 consecutive K rows of one
output column shares one scale and one zero point (also 0..15), as AWQ quantizes by default
(w_bit 4, q_group_size 128, zero_point True).

Layout: AWQ's GEMM layout, as checkpoints from AutoAWQ store it and vLLM's AWQ kernels read it.
Eight 4-bit values are packed into one int32 along N:

- ``qweight`` (K, N // 8) int32, row-major: word j of row k holds columns 8j .. 8j + 7 of W_q;
- ``qzeros`` (cdiv(K, GROUP_SIZE), N // 8) int32, packed the same way;
- ``scales`` (cdiv(K, GROUP_SIZE), N), row-major, in the activation dtype.

Inside a word the nibbles are interleaved: nibble i (bits 4i .. 4i + 3) holds column
``AWQ_ORDER[i]`` = [0, 2, 4, 6, 1, 3, 5, 7][i] of its eight, so column c sits at shift
4 * ((c % 2) * 4 + c // 2). (AWQ's CUDA kernels pick this order because masking bits 0-3 and
16-19 of a word, then of the word shifted right by 4, 8 and 12, puts two neighbouring columns in
the two 16-bit halves of a register; a Triton kernel just shifts by the inverse order.) N must
be a multiple of 8. The loads are N-contiguous: each K row of a W tile is
BLOCK_N / 2 >= 16 contiguous bytes, whole 16-byte vectors.

Each K step loads the packed tile, unpacks it in registers (a shift and a mask per value, and a
reshape of the (BLOCK_K, BLOCK_N / 8, 8) nibbles into the (BLOCK_K, BLOCK_N) tile), unpacks the
zero row of the group the step lies in the same way, subtracts it, converts to the activation
dtype (exact: -15..15), multiplies by the scale row and feeds the tile to ``tl.dot`` with fp32
accumulation. One zero and scale row per step requires BLOCK_K <= GROUP_SIZE and
GROUP_SIZE % BLOCK_K == 0 (checked at compile time; every config keeps to it). The product of
(q - zero) and a bf16 scale is rounded to bf16 once, exactly as the baseline's
``(q - zeros).to(bf16) * scales`` rounds it, so kernel and baseline multiply the same
dequantized weights.

What this adds to ``w8a16_gemm.py``, and why it is a useful held-out kernel for the cost model
(``kernaudit_pipeline.rank``, fitted on the kernels one level up): the weight costs half a byte
per element in DRAM and shared memory but two in the MMA, and the K loop does more CUDA-core
work per weight element than the int8 kernel's convert and scale: a shift and a mask to unpack,
a zero-point subtract, the convert and the scale, plus the layout shuffle of the reshape, on
every BLOCK_K x BLOCK_N weight tile, work that does not shrink with BLOCK_M. At decode sizes
the kernel is bound by reading W (a quarter of the bf16 bytes); at prefill sizes the unpack
has to hide behind the wgmmas, and how well it does depends on warps, stages and tile width.

Programs are numbered in groups of GROUP_M tile-rows (the Triton matmul tutorial's grouped
order) so that neighbouring programs share W panels while they sit in L2.

Baseline: dequantize in PyTorch, then cuBLAS: unpack the words with shifts and masks,
``(q - zeros).to(bf16) * scales`` (elementwise kernels that write the bf16 weight) and
``torch.matmul`` reading it back. Reference: the same product with the weights dequantized in
fp32 and an fp32 matmul.

Shapes: Llama-3-8B's MLP down projection (K = 14336, N = 4096) at four batch-token counts M,
the buckets vLLM tunes per.

This kernel is held out from the cost model's calibration: it was added on 2026-12-06 as the
fourth held-out kernel, and its ranking is to be committed before any GPU times it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernaudit_pipeline.kernel_spec import Ptr, Shape, Tolerance

NAME = "w4a16_gemm"
DTYPE = "bf16"  # the activations and the output; the weights are packed int4
BASELINE_NAME = "unpack + (q - zeros).to(bf16) * scales + torch.matmul (dequant + cuBLAS, unfused)"
GROUP_SIZE = 128  # K rows per weight scale and zero point
PACK = 8  # int4 values per int32 word, along N
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of a word holds column AWQ_ORDER[i]
SCALE_BYTES = 2  # bf16 scales


# --------------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------------
@triton.jit
def _unpack_int4(packed, ROWS: tl.constexpr, COLS: tl.constexpr):
    """(ROWS, COLS // 8) int32 words -> (ROWS, COLS) int32 values 0..15, in column order."""
    c = tl.arange(0, 8)
    # Column c of a word sits in nibble (c % 2) * 4 + c // 2: the inverse of AWQ_ORDER.
    shifts = ((c % 2) * 4 + c // 2) * 4
    # An arithmetic shift drags the sign bit of nibble 7 along; the mask drops it.
    q = (packed[:, :, None] >> shifts[None, None, :]) & 0xF
    return tl.reshape(q, (ROWS, COLS))


@triton.jit
def w4a16_gemm_kernel(
    x_ptr, w_ptr, z_ptr, s_ptr, out_ptr,
    M, N, K,
    stride_xm, stride_xk,
    stride_wk, stride_wn,
    stride_zg, stride_zn,
    stride_sg, stride_sn,
    stride_om, stride_on,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, GROUP_SIZE: tl.constexpr,
):
    # One zero and scale row per K step: a step never straddles two groups.
    tl.static_assert(GROUP_SIZE % BLOCK_K == 0, "BLOCK_K must divide GROUP_SIZE")
    # Whole int32 words per tile row.
    tl.static_assert(BLOCK_N % 8 == 0, "BLOCK_N must be a multiple of 8")
    BLOCK_NW: tl.constexpr = BLOCK_N // 8  # packed words per tile row

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

    # Rows/columns past the edge wrap around (% M, % N, and % N // 8 for the packed words):
    # loads stay unmasked in M and N, the final store is masked instead.
    offs_xm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_sn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_wn = (pid_n * BLOCK_NW + tl.arange(0, BLOCK_NW)) % (N // 8)
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + (offs_xm[:, None] * stride_xm + offs_k[None, :] * stride_xk)
    w_ptrs = w_ptr + (offs_k[:, None] * stride_wk + offs_wn[None, :] * stride_wn)
    z_ptrs = z_ptr + offs_wn[None, :] * stride_zn  # (1, BLOCK_NW): one packed zero row
    s_ptrs = s_ptr + offs_sn * stride_sn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_remaining = K - k * BLOCK_K
        x = tl.load(x_ptrs, mask=offs_k[None, :] < k_remaining, other=0.0)
        # Masked K rows unpack to q = 0, so w = -zero * scale there; the zeroed x columns
        # make them add nothing.
        w_packed = tl.load(w_ptrs, mask=offs_k[:, None] < k_remaining, other=0)
        # The zero and scale rows of this step's group; a K tail still lies in the last
        # (partial) group.
        g = (k * BLOCK_K) // GROUP_SIZE
        z_packed = tl.load(z_ptrs + g * stride_zg)
        scale = tl.load(s_ptrs + g * stride_sg)
        # Dequantize in registers: unpack, subtract the zero point, convert to the activation
        # dtype (exact), times the scale (one rounding). The bf16 weight never reaches memory.
        q = _unpack_int4(w_packed, BLOCK_K, BLOCK_N)
        zero = _unpack_int4(z_packed, 1, BLOCK_N)
        w = (q - zero).to(x.dtype) * scale[None, :]
        acc = tl.dot(x, w, acc)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk

    out = acc.to(out_ptr.dtype.element_ty)
    offs_om = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_on = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    out_ptrs = out_ptr + stride_om * offs_om[:, None] + stride_on * offs_on[None, :]
    out_mask = (offs_om[:, None] < M) & (offs_on[None, :] < N)
    tl.store(out_ptrs, out, mask=out_mask)


KERNEL = w4a16_gemm_kernel


# --------------------------------------------------------------------------------------------
# The launcher
# --------------------------------------------------------------------------------------------
_TRITON_DTYPE = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
                 torch.int32: "i32"}


def _ptr(t: torch.Tensor) -> Ptr:
    return Ptr(_TRITON_DTYPE[t.dtype], aligned=t.data_ptr() % 16 == 0)


def _grid(M: int, N: int, config: dict) -> tuple[int, ...]:
    return (triton.cdiv(M, config["BLOCK_M"]) * triton.cdiv(N, config["BLOCK_N"]),)


def kernel_args(inputs: dict, config: dict,
                out: torch.Tensor | None = None) -> dict[str, object]:
    """Every ``KERNEL`` argument by name; ``launch`` and ``compile_args`` both derive from it,
    so the static audit compiles exactly what the GPU runs."""
    x, w, z, s = inputs["x"], inputs["qweight"], inputs["qzeros"], inputs["scales"]
    M, K = x.shape
    N = s.shape[1]
    groups = triton.cdiv(K, GROUP_SIZE)
    if (N % PACK or w.shape != (K, N // PACK) or z.shape != (groups, N // PACK)
            or s.shape != (groups, N)):
        raise ValueError(f"x {tuple(x.shape)}, qweight {tuple(w.shape)}, qzeros "
                         f"{tuple(z.shape)} and scales {tuple(s.shape)} do not chain "
                         f"(group size {GROUP_SIZE}, {PACK} values per int32)")
    if out is None:
        out = torch.empty((M, N), device=x.device, dtype=x.dtype)
    return {
        "x_ptr": x, "w_ptr": w, "z_ptr": z, "s_ptr": s, "out_ptr": out,
        "M": M, "N": N, "K": K,
        "stride_xm": x.stride(0), "stride_xk": x.stride(1),
        "stride_wk": w.stride(0), "stride_wn": w.stride(1),
        "stride_zg": z.stride(0), "stride_zn": z.stride(1),
        "stride_sg": s.stride(0), "stride_sn": s.stride(1),
        "stride_om": out.stride(0), "stride_on": out.stride(1),
        **{k: config[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")},
        "GROUP_SIZE": GROUP_SIZE,
    }


def launch(inputs: dict, config: dict, out: torch.Tensor | None = None) -> torch.Tensor:
    args = kernel_args(inputs, config, out)
    w4a16_gemm_kernel[_grid(args["M"], args["N"], config)](
        **args, num_warps=config["num_warps"], num_stages=config["num_stages"])
    return args["out_ptr"]


# --------------------------------------------------------------------------------------------
# Inputs, baseline, reference
# --------------------------------------------------------------------------------------------
def _shifts(device: torch.device) -> torch.Tensor:
    """The bit offset of column c (0..7) inside its word: 4 * AWQ_ORDER.index(c)."""
    return torch.tensor([4 * AWQ_ORDER.index(c) for c in range(PACK)], device=device,
                        dtype=torch.int32)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """(R, N) values 0..15 -> (R, N // 8) int32 words in AWQ's order."""
    R, N = q.shape
    nibbles = q.to(torch.int64).reshape(R, N // PACK, PACK)
    words = (nibbles << _shifts(q.device).to(torch.int64)).sum(-1)
    # The words are unsigned 32-bit patterns; store them as int32 two's complement.
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def unpack_int4(words: torch.Tensor) -> torch.Tensor:
    """(R, N // 8) int32 words -> (R, N) int32 values 0..15, in column order."""
    R, NW = words.shape
    return ((words[:, :, None] >> _shifts(words.device)) & 0xF).view(R, NW * PACK)


def _per_k(t: torch.Tensor, K: int) -> torch.Tensor:
    """(groups, N) -> (K, N): each group's row repeated for its GROUP_SIZE K rows."""
    return t.repeat_interleave(GROUP_SIZE, dim=0)[:K]


def make_inputs(shape: Shape, device: str, seed: int,
                dtype: torch.dtype = torch.bfloat16) -> dict:
    """x ~ N(0, 1) and W ~ N(0, 1/K), quantized as AWQ quantizes (asymmetric min/max per group
    and column: scale = (max - min) / 15, zero = round(-min / scale), q = round(w / scale) +
    zero, all clamped to 0..15), so the output is ~N(0, 1) whatever K is. The scales are rounded
    to ``dtype`` first, and the zeros and values computed from the stored scales.

    ``dtype`` (of x and the scales) exists for the CPU interpreter, which cannot multiply bf16
    (triton-lang/triton#11584): the numerics tests run the same kernel on fp16.
    """
    M, N, K = shape["M"], shape["N"], shape["K"]
    groups = triton.cdiv(K, GROUP_SIZE)
    if torch.device(device).type == "meta":
        return {"x": torch.empty((M, K), device="meta", dtype=dtype),
                "qweight": torch.empty((K, N // PACK), device="meta", dtype=torch.int32),
                "qzeros": torch.empty((groups, N // PACK), device="meta", dtype=torch.int32),
                "scales": torch.empty((groups, N), device="meta", dtype=dtype)}
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn((M, K), generator=gen, device=device).to(dtype)
    w = torch.randn((N, K), generator=gen, device=device).t() * K ** -0.5  # (K, N)
    # Per (group, column) min and max; a last partial group takes them over its real rows.
    padded = torch.cat([w, w[-1:].expand(groups * GROUP_SIZE - K, N)])  # (K', N)
    grouped = padded.view(groups, GROUP_SIZE, N)
    w_min, w_max = grouped.amin(dim=1), grouped.amax(dim=1)
    scales = ((w_max - w_min).clamp_min(1e-5) / 15.0).to(dtype)  # (groups, N), as stored
    s = scales.float()
    zeros = torch.round(-w_min / s).clamp(0, 15)  # (groups, N)
    q = (torch.round(w / _per_k(s, K)) + _per_k(zeros, K)).clamp(0, 15)  # (K, N)
    return {"x": x, "qweight": pack_int4(q), "qzeros": pack_int4(zeros), "scales": scales}


def _dequantize(inputs: dict, dtype: torch.dtype) -> torch.Tensor:
    """The (K, N) weight in ``dtype``: unpack, subtract the zero points, times the scales. Full
    groups broadcast their zero and scale rows (no expanded tensors are written); only a K that
    is no multiple of GROUP_SIZE (small test shapes) expands."""
    q, z = unpack_int4(inputs["qweight"]), unpack_int4(inputs["qzeros"])  # (K, N), (groups, N)
    s = inputs["scales"].to(dtype)
    K, N = q.shape
    if K % GROUP_SIZE == 0:
        grouped = q.view(-1, GROUP_SIZE, N) - z[:, None, :]
        return (grouped.to(dtype) * s[:, None, :]).view(K, N)
    return (q - _per_k(z, K)).to(dtype) * _per_k(s, K)


def baseline(inputs: dict) -> torch.Tensor:
    """Dequantize to bf16 (unpack, subtract, convert and multiply: elementwise kernels that
    write the K x N weight), then cuBLAS reads it back."""
    x = inputs["x"]
    return torch.matmul(x, _dequantize(inputs, x.dtype))


def reference(inputs: dict) -> torch.Tensor:
    return inputs["x"].float() @ _dequantize(inputs, torch.float32)


# Two bf16 roundings: the dequantized weight (unit roundoff 2^-8, averaged over K) and the
# output cast; the sums stay fp32. The 4-bit quantization error is in both kernel and reference.
TOLERANCE = Tolerance(max_rel_l2=1e-2, atol=2e-2, rtol=2e-2)


# --------------------------------------------------------------------------------------------
# Roofline model and the static audit's view
# --------------------------------------------------------------------------------------------
def flops(shape: Shape) -> int:
    """The product; the dequant's operations per weight element (shift, mask, subtract,
    convert, scale), repeated by every program row, are left out."""
    return 2 * shape["M"] * shape["N"] * shape["K"]


def bytes_moved(shape: Shape) -> int:
    """x (bf16), W (4 bits), its scales (bf16) and zero points (4 bits) read once, the output
    (bf16) written once. Per element of K x N that is (1 + (2 * SCALE_BYTES + 1) / GROUP_SIZE)
    / 2 bytes."""
    M, N, K = shape["M"], shape["N"], shape["K"]
    groups = triton.cdiv(K, GROUP_SIZE)
    return 2 * M * K + K * N // 2 + groups * N * SCALE_BYTES + groups * N // 2 + 2 * M * N


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


def _keep(bm: int, bn: int, bk: int, group_m: int, stages: int, warps: int) -> bool:
    """The kernel's own constraints, then the grid's conventions (those of the other held-out
    kernels)."""
    if GROUP_SIZE % bk or bn % PACK:
        return False  # one zero/scale row per K step; whole int32 words per tile row
    if bm * bn > 128 * 256:
        return False  # 256x256: its fp32 accumulator alone is 256 registers/thread on 8 warps
    if bk == 128 and stages > 4:
        return False  # BLOCK_K 128 runs 2 to 4 stages
    if group_m == (8 if bm >= 64 else 1):
        return True  # GROUP_M 8 from 64 rows, 1 below
    # GROUP_M 1 on the 64- and 128-row tiles 128 and 256 wide at BLOCK_K 64 and 128 on 8 warps
    # with 3 or 4 stages, to see what the grouping is worth.
    return (group_m == 1 and bm in (64, 128) and bn >= 128 and bk >= 64 and warps == 8
            and stages in (3, 4))


def _space() -> list[dict]:
    """A tuner's grid: the cross product of

    - BLOCK_M 16..256 and BLOCK_N 32..256 (BLOCK_N / 8 >= 4 words: 16-byte rows of W);
    - BLOCK_K 32, 64, 128: every one divides GROUP_SIZE;
    - GROUP_M 1 and 8;
    - 2 to 5 stages;
    - 4 and 8 warps on every tile: the unpack of a BLOCK_K x BLOCK_N tile is the same work
      whatever BLOCK_M is, so small-M tiles get the second warp count too;

    filtered by ``_keep``. Shared memory per stage is BLOCK_M * BLOCK_K * 2 + BLOCK_K * BLOCK_N
    / 2 bytes for the loads (x in bf16, W in 4 bits), plus whatever buffer the compiler adds to
    reshape the unpacked tile into the wgmma operand.
    """
    configs = []
    for bm in (16, 32, 64, 128, 256):
        for bn in (32, 64, 128, 256):
            for bk in (32, 64, 128):
                for group_m in (1, 8):
                    for stages in (2, 3, 4, 5):
                        for warps in (4, 8):
                            if _keep(bm, bn, bk, group_m, stages, warps):
                                configs.append(_cfg(bm, bn, bk, warps, stages, group_m))
    return configs


CONFIGS: list[dict] = _space()

_N, _K = 4096, 14336  # down_proj output width (hidden size), MLP intermediate size
SHAPES: list[Shape] = [
    Shape(f"llama3_8b_w4a16_down_proj_m{m}", {"M": m, "N": _N, "K": _K},
          label=f"llama3-8b int4 (AWQ) weight-only down_proj (K,N)=({_K},{_N}) M={m} ({phase})",
          phase=phase)
    for m, phase in ((16, "decode"), (128, "decode"), (1024, "prefill"), (4096, "prefill"))
]
