"""Flash-attention forward (prefill), causal or not, with grouped-query heads.

One program owns BLOCK_M query rows of one (batch, query head). It streams the keys and values
of that head's KV head (head ``h // (H // KV_H)``) in BLOCK_N blocks and keeps a running max,
a running sum and an fp32 accumulator: the online softmax of FlashAttention-2, so the S x S
score matrix never leaves registers. The softmax runs in base 2: log2(e) is folded into the
scale once, and every exponential is an ``exp2``.

Causal attention splits the key loop in two, as the Triton fused-attention tutorial does:
blocks strictly left of the diagonal need no mask at all, and only the BLOCK_M / BLOCK_N
blocks that straddle the diagonal pay for one. Causal programs are launched heaviest first
(the last query block does the most work) so the tail of the grid is short.

References (``REFERENCES``): ``F.scaled_dot_product_attention(q, k, v, is_causal=...,
enable_gqa=True)`` as SDPA dispatches it by itself (the primary; on an H200 it picks cuDNN), and
the same call pinned with ``torch.nn.attention.sdpa_kernel`` to the FLASH backend
(FlashAttention-2) and to cuDNN. The runner profiles each and records the library that ran.
Correctness reference: the same attention in fp32 with the KV heads expanded.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernaudit_pipeline.kernel_spec import Ptr, Reference, Shape, Tolerance

NAME = "flash_attention_fwd"
DTYPE = "bf16"
BASELINE_NAME = "torch.nn.functional.scaled_dot_product_attention"


# --------------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------------
@triton.jit
def _attn_fwd_inner(
    acc, l_i, m_i, q,
    k_base, v_base, stride_kn, stride_kk, stride_vn, stride_vk,
    offs_m, offs_n, offs_d, qk_scale, SEQ,
    lo, hi,
    DIAG: tl.constexpr, CHECK_N: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Fold key/value blocks [lo, hi) into the running softmax state. ``DIAG`` applies the
    causal mask, ``CHECK_N`` the sequence-end mask; off-diagonal blocks take neither."""
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        # K^T tile (HEAD_DIM x BLOCK_N), head_dim contiguous: K-major for the tensor cores.
        k_ptrs = k_base + offs_d[:, None] * stride_kk + cols[None, :] * stride_kn
        v_ptrs = v_base + cols[:, None] * stride_vn + offs_d[None, :] * stride_vk
        if CHECK_N:
            k = tl.load(k_ptrs, mask=cols[None, :] < SEQ, other=0.0)
        else:
            k = tl.load(k_ptrs)
        qk = tl.dot(q, k)
        if DIAG or CHECK_N:
            keep = cols[None, :] < SEQ
            if DIAG:
                keep = keep & (offs_m[:, None] >= cols[None, :])
            qk = qk * qk_scale + tl.where(keep, 0.0, -1.0e6)
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            qk = qk - m_ij[:, None]
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            qk = qk * qk_scale - m_ij[:, None]
        p = tl.math.exp2(qk)
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if CHECK_N:
            v = tl.load(v_ptrs, mask=cols[:, None] < SEQ, other=0.0)
        else:
            v = tl.load(v_ptrs)
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def flash_attention_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr,
    sm_scale,
    stride_qz, stride_qh, stride_qm, stride_qk,
    stride_kz, stride_kh, stride_kn, stride_kk,
    stride_vz, stride_vh, stride_vn, stride_vk,
    stride_oz, stride_oh, stride_om, stride_ok,
    H, SEQ,
    GROUP_SIZE: tl.constexpr,  # query heads per KV head, H // KV_H
    HEAD_DIM: tl.constexpr,
    CAUSAL: tl.constexpr,
    EVEN_S: tl.constexpr,      # SEQ divisible by BLOCK_M and BLOCK_N: no bounds masks
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    if CAUSAL:
        start_m = tl.num_programs(0) - 1 - tl.program_id(0)  # heaviest blocks first
    else:
        start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    off_z = off_hz // H
    off_h = off_hz % H
    off_kvh = off_h // GROUP_SIZE

    q_base = q_ptr + off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh
    k_base = k_ptr + off_z.to(tl.int64) * stride_kz + off_kvh.to(tl.int64) * stride_kh
    v_base = v_ptr + off_z.to(tl.int64) * stride_vz + off_kvh.to(tl.int64) * stride_vh
    o_base = o_ptr + off_z.to(tl.int64) * stride_oz + off_h.to(tl.int64) * stride_oh

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.4426950408889634  # log2(e): softmax in base 2

    q_ptrs = q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qk
    if EVEN_S:
        q = tl.load(q_ptrs)
    else:
        q = tl.load(q_ptrs, mask=offs_m[:, None] < SEQ, other=0.0)

    if CAUSAL:
        # Stage 1: key blocks entirely left of the diagonal, no masking.
        acc, l_i, m_i = _attn_fwd_inner(
            acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kk, stride_vn, stride_vk,
            offs_m, offs_n, offs_d, qk_scale, SEQ, 0, start_m * BLOCK_M,
            DIAG=False, CHECK_N=False, BLOCK_N=BLOCK_N)
        # Stage 2: the blocks on the diagonal, causally masked.
        acc, l_i, m_i = _attn_fwd_inner(
            acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kk, stride_vn, stride_vk,
            offs_m, offs_n, offs_d, qk_scale, SEQ, start_m * BLOCK_M, (start_m + 1) * BLOCK_M,
            DIAG=True, CHECK_N=not EVEN_S, BLOCK_N=BLOCK_N)
    else:
        if EVEN_S:
            acc, l_i, m_i = _attn_fwd_inner(
                acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kk, stride_vn, stride_vk,
                offs_m, offs_n, offs_d, qk_scale, SEQ, 0, SEQ,
                DIAG=False, CHECK_N=False, BLOCK_N=BLOCK_N)
        else:
            full = (SEQ // BLOCK_N) * BLOCK_N
            acc, l_i, m_i = _attn_fwd_inner(
                acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kk, stride_vn, stride_vk,
                offs_m, offs_n, offs_d, qk_scale, SEQ, 0, full,
                DIAG=False, CHECK_N=False, BLOCK_N=BLOCK_N)
            acc, l_i, m_i = _attn_fwd_inner(
                acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kk, stride_vn, stride_vk,
                offs_m, offs_n, offs_d, qk_scale, SEQ, full, SEQ,
                DIAG=False, CHECK_N=True, BLOCK_N=BLOCK_N)

    acc = acc / l_i[:, None]
    o_ptrs = o_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_ok
    if EVEN_S:
        tl.store(o_ptrs, acc.to(o_ptr.dtype.element_ty))
    else:
        tl.store(o_ptrs, acc.to(o_ptr.dtype.element_ty), mask=offs_m[:, None] < SEQ)


KERNEL = flash_attention_fwd_kernel


# --------------------------------------------------------------------------------------------
# The launcher
# --------------------------------------------------------------------------------------------
_TRITON_DTYPE = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def _ptr(t: torch.Tensor) -> Ptr:
    return Ptr(_TRITON_DTYPE[t.dtype], aligned=t.data_ptr() % 16 == 0)


def _grid(B: int, H: int, S: int, config: dict) -> tuple[int, ...]:
    return (triton.cdiv(S, config["BLOCK_M"]), B * H)


def kernel_args(inputs: dict, config: dict,
                out: torch.Tensor | None = None) -> dict[str, object]:
    """Every ``KERNEL`` argument by name (allocating the output unless given); ``launch`` and
    ``compile_args`` both derive from it, so the static audit compiles what the GPU runs."""
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    if out is None:
        out = torch.empty_like(q)
    B, H, S, D = q.shape
    KV_H = k.shape[1]
    bm, bn = config["BLOCK_M"], config["BLOCK_N"]
    if H % KV_H:
        raise ValueError(f"H={H} is not a multiple of KV_H={KV_H}")
    if bm % bn:
        raise ValueError(f"BLOCK_M={bm} must be a multiple of BLOCK_N={bn} (causal diagonal)")
    return {
        "q_ptr": q, "k_ptr": k, "v_ptr": v, "o_ptr": out,
        "sm_scale": inputs["sm_scale"],
        "stride_qz": q.stride(0), "stride_qh": q.stride(1),
        "stride_qm": q.stride(2), "stride_qk": q.stride(3),
        "stride_kz": k.stride(0), "stride_kh": k.stride(1),
        "stride_kn": k.stride(2), "stride_kk": k.stride(3),
        "stride_vz": v.stride(0), "stride_vh": v.stride(1),
        "stride_vn": v.stride(2), "stride_vk": v.stride(3),
        "stride_oz": out.stride(0), "stride_oh": out.stride(1),
        "stride_om": out.stride(2), "stride_ok": out.stride(3),
        "H": H, "SEQ": S,
        "GROUP_SIZE": H // KV_H,
        "HEAD_DIM": D,
        "CAUSAL": bool(inputs["causal"]),
        "EVEN_S": S % bm == 0 and S % bn == 0,
        "BLOCK_M": bm, "BLOCK_N": bn,
    }


def launch(inputs: dict, config: dict, out: torch.Tensor | None = None) -> torch.Tensor:
    args = kernel_args(inputs, config, out)
    B, H, S, _ = inputs["q"].shape
    flash_attention_fwd_kernel[_grid(B, H, S, config)](
        **args, num_warps=config["num_warps"], num_stages=config["num_stages"])
    return args["o_ptr"]


# --------------------------------------------------------------------------------------------
# Inputs, baseline, reference
# --------------------------------------------------------------------------------------------
def make_inputs(shape: Shape, device: str, seed: int,
                dtype: torch.dtype = torch.bfloat16) -> dict:
    """Q, K, V ~ N(0, 1) in (batch, heads, seq, head_dim) layout.

    ``dtype`` exists for the CPU interpreter, which cannot multiply bf16 (it dots the raw bit
    patterns, triton-lang/triton#11584): the numerics tests run the same kernel on fp16.
    """
    B, H, KV_H, S, D = shape["B"], shape["H"], shape["KV_H"], shape["S"], shape["D"]
    causal = bool(shape.causal)
    common = {"sm_scale": 1.0 / math.sqrt(D), "causal": causal}
    if torch.device(device).type == "meta":
        return {"q": torch.empty((B, H, S, D), device="meta", dtype=dtype),
                "k": torch.empty((B, KV_H, S, D), device="meta", dtype=dtype),
                "v": torch.empty((B, KV_H, S, D), device="meta", dtype=dtype), **common}
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn((B, H, S, D), generator=gen, device=device).to(dtype)
    k = torch.randn((B, KV_H, S, D), generator=gen, device=device).to(dtype)
    v = torch.randn((B, KV_H, S, D), generator=gen, device=device).to(dtype)
    return {"q": q, "k": k, "v": v, **common}


def baseline(inputs: dict) -> torch.Tensor:
    return F.scaled_dot_product_attention(
        inputs["q"], inputs["k"], inputs["v"], is_causal=inputs["causal"],
        scale=inputs["sm_scale"], enable_gqa=True)


def baseline_pinned(inputs: dict, backend: str = "FLASH_ATTENTION") -> torch.Tensor:
    """``baseline`` restricted to one SDPA backend (an ``SDPBackend`` member name); raises when
    that backend cannot run these inputs, rather than falling back to another."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(getattr(SDPBackend, backend)):
        return baseline(inputs)


def sdpa_flash(inputs: dict) -> torch.Tensor:
    return baseline_pinned(inputs, "FLASH_ATTENTION")


def sdpa_cudnn(inputs: dict) -> torch.Tensor:
    return baseline_pinned(inputs, "CUDNN_ATTENTION")


def reference(inputs: dict) -> torch.Tensor:
    q, k, v = inputs["q"].float(), inputs["k"].float(), inputs["v"].float()
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=inputs["causal"],
                                          scale=inputs["sm_scale"])


# P is rounded to bf16 before the P @ V product and O is rounded to bf16 on the way out.
TOLERANCE = Tolerance(max_rel_l2=2e-2, atol=5e-3, rtol=2e-2)

# Every SDPA backend rounds P and O to bf16 as the kernel does: the same tolerance holds.
REFERENCES = [
    Reference(key=None, name=f"{BASELINE_NAME} (default dispatch)", backend="SDPA's choice (profiled)",
              fn=baseline, tolerance=TOLERANCE),
    Reference(key="sdpa_flash", name=f"{BASELINE_NAME} pinned to FLASH_ATTENTION",
              backend="FlashAttention-2 (SDPA FLASH)", fn=sdpa_flash, tolerance=TOLERANCE),
    Reference(key="sdpa_cudnn", name=f"{BASELINE_NAME} pinned to CUDNN_ATTENTION",
              backend="cuDNN", fn=sdpa_cudnn, tolerance=TOLERANCE),
]


# --------------------------------------------------------------------------------------------
# Roofline model and the static audit's view
# --------------------------------------------------------------------------------------------
def flops(shape: Shape) -> int:
    """4·B·H·S²·D (QK^T and PV), halved for causal."""
    total = 4 * shape["B"] * shape["H"] * shape["S"] ** 2 * shape["D"]
    return total // 2 if shape.causal else total


def bytes_moved(shape: Shape) -> int:
    """Q and O once per query head, K and V once per KV head, 2 bytes each."""
    B, H, KV_H, S, D = shape["B"], shape["H"], shape["KV_H"], shape["S"], shape["D"]
    return 2 * (2 * B * H * S * D + 2 * B * KV_H * S * D)


def compile_args(shape: Shape, config: dict) -> dict[str, object]:
    args = kernel_args(make_inputs(shape, "meta", 0), config)
    return {k: _ptr(v) if isinstance(v, torch.Tensor) else v for k, v in args.items()}


def grid(shape: Shape, config: dict) -> tuple[int, ...]:
    return _grid(shape["B"], shape["H"], shape["S"], config)


# --------------------------------------------------------------------------------------------
# Config space and shapes
# --------------------------------------------------------------------------------------------
def _cfg(bm: int, bn: int, warps: int, stages: int) -> dict:
    return {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": warps, "num_stages": stages}


# Shared memory (head_dim 128, from sm_90 compiles): the Q tile (BLOCK_M x 128 x 2 bytes) plus
# num_stages buffers of one K and one V block (2 x BLOCK_N x 128 x 2 bytes each); 128x64 s3 is
# 128 KiB, 128x128 s3 is 224 KiB, just under the 227 KiB opt-in limit.
CONFIGS: list[dict] = [
    _cfg(128, 64, 8, 3),
    _cfg(128, 64, 8, 4),
    _cfg(128, 128, 8, 3),
    _cfg(128, 64, 8, 5),
    _cfg(128, 32, 4, 4),
    _cfg(64, 64, 4, 3),
    _cfg(64, 64, 4, 4),
    _cfg(64, 32, 4, 4),
    # Register spills (head_dim 128): the BLOCK_M x BLOCK_N score tile, its bf16 copy and the
    # BLOCK_M x 128 accumulator do not fit 255 registers per thread on too few warps.
    _cfg(128, 64, 4, 3),
    _cfg(128, 128, 4, 3),
    _cfg(256, 64, 8, 3),
    _cfg(256, 128, 4, 2),
    # Over the 227 KiB shared-memory opt-in limit: too many K/V stages of wide blocks.
    _cfg(128, 128, 8, 4),
    _cfg(256, 128, 8, 4),
    _cfg(128, 64, 8, 7),
]

_LLAMA3_8B = "llama3-8b"
SHAPES: list[Shape] = [
    Shape("b4_h32_kv8_s4096_d128", {"B": 4, "H": 32, "KV_H": 8, "S": 4096, "D": 128},
          label=f"{_LLAMA3_8B} heads (GQA 32/8), ANCHORS B4 H32 S4096 D128", causal=False),
    Shape("b4_h32_kv8_s4096_d128_causal", {"B": 4, "H": 32, "KV_H": 8, "S": 4096, "D": 128},
          label=f"{_LLAMA3_8B} heads (GQA 32/8), ANCHORS B4 H32 S4096 D128", causal=True),
    Shape("b4_h32_kv8_s4096_d64_causal", {"B": 4, "H": 32, "KV_H": 8, "S": 4096, "D": 64},
          label="head_dim 64 (GQA 32/8), causal", causal=True),
    Shape("b8_h32_kv8_s1024_d128_causal", {"B": 8, "H": 32, "KV_H": 8, "S": 1024, "D": 128},
          label=f"{_LLAMA3_8B} prefill of 8 prompts x 1k tokens", causal=True),
]
