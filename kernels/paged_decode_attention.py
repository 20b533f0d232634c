"""Paged decode attention: one new query token per sequence against a KV cache that lives in
fixed-size pages, as in vLLM's PagedAttention.

The cache is ``[num_pages, PAGE_SIZE, KV_H, D]`` (vLLM's flash layout); sequence ``b`` owns the
pages listed in row ``b`` of the block table and ``context_lens[b]`` tokens of them. Pages are
scattered, so every K/V block is a gather: token ``t`` of sequence ``b`` lives in page
``block_table[b, t // PAGE_SIZE]`` at slot ``t % PAGE_SIZE``.

Decode is memory-bound, so the kernel's job is to read each cached K/V byte exactly once:

* One program serves all ``H // KV_H`` query heads of one KV head (grouped-query attention):
  the group is padded to 16 rows so ``q @ K^T`` and ``P @ V`` run on the tensor cores.
* Split-KV (flash-decoding): a sequence's context is cut into PARTITION_SIZE-token partitions,
  one program each, so a batch of 8 still fills the GPU's SMs. Each program writes an
  unnormalized partial output with its running max and sum; a small reduction kernel merges the
  partitions. ``KERNEL`` is the partition kernel, where the time and the registers go;
  ``launch`` runs both kernels, so the measured latency is the whole operation.

References (``REFERENCES``): the primary is the unquantized PyTorch composition (and, in fp32,
the correctness reference): gather the pages into contiguous K/V with the block table, then
``F.scaled_dot_product_attention`` with a length mask, each KV head's query group folded into
the query-length axis so SDPA needs no GQA support. Beside it, what a serving stack would run:
FlashInfer's batch decode over the same paged cache (``flashinfer-python``, JIT-compiled with
nvcc on first use), then vLLM's Triton decode kernel or FlashAttention's paged KV where those
packages are installed; a reference that cannot run leaves a row saying why.
Context lengths must be at least 1.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernaudit_pipeline.kernel_spec import Ptr, Reference, Shape, Tolerance

NAME = "paged_decode_attention"
DTYPE = "bf16"
BASELINE_NAME = "gather+torch.nn.functional.scaled_dot_product_attention"


# --------------------------------------------------------------------------------------------
# The kernels
# --------------------------------------------------------------------------------------------
@triton.jit
def paged_decode_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_table_ptr, context_lens_ptr,
    part_o_ptr, part_m_ptr, part_l_ptr,
    sm_scale,
    stride_qb, stride_qh, stride_qd,
    stride_kp, stride_kt, stride_kh, stride_kd,
    stride_vp, stride_vt, stride_vh, stride_vd,
    stride_btb, stride_btp,
    stride_pob, stride_poh, stride_pos, stride_pod,
    stride_pmb, stride_pmh, stride_pms,
    GROUP_SIZE: tl.constexpr,   # query heads per KV head
    GROUP_PAD: tl.constexpr,    # GROUP_SIZE padded to >= 16 for tl.dot
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    PARTITION_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,      # tokens per inner iteration
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    ctx_len = tl.load(context_lens_ptr + seq)
    start = part * PARTITION_SIZE
    if start < ctx_len:  # partitions past this sequence's end have nothing to do
        end = tl.minimum(start + PARTITION_SIZE, ctx_len)
        offs_g = tl.arange(0, GROUP_PAD)
        offs_d = tl.arange(0, HEAD_DIM)
        offs_n = tl.arange(0, BLOCK_N)
        heads = kv_head * GROUP_SIZE + offs_g
        g_mask = offs_g < GROUP_SIZE

        q = tl.load(q_ptr + seq * stride_qb + heads[:, None] * stride_qh
                    + offs_d[None, :] * stride_qd, mask=g_mask[:, None], other=0.0)
        qk_scale = sm_scale * 1.4426950408889634  # log2(e): softmax in base 2

        m_i = tl.zeros([GROUP_PAD], dtype=tl.float32) - float("inf")
        l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
        acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)
        bt_row = block_table_ptr + seq.to(tl.int64) * stride_btb
        kv_head_off = kv_head * stride_kh

        for start_n in range(start, end, BLOCK_N):
            tok = start_n + offs_n
            t_mask = tok < end
            # Gather: the physical page and slot of every token in this block.
            page = tl.load(bt_row + (tok // PAGE_SIZE) * stride_btp, mask=t_mask, other=0)
            slot = tok % PAGE_SIZE
            k_off = page.to(tl.int64) * stride_kp + slot * stride_kt + kv_head_off
            v_off = page.to(tl.int64) * stride_vp + slot * stride_vt + kv_head * stride_vh
            k = tl.load(k_cache_ptr + k_off[None, :] + offs_d[:, None] * stride_kd,
                        mask=t_mask[None, :], other=0.0)            # K^T: HEAD_DIM x BLOCK_N
            qk = tl.dot(q, k) * qk_scale
            qk = tl.where(t_mask[None, :], qk, -1.0e6)
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            p = tl.math.exp2(qk - m_ij[:, None])
            alpha = tl.math.exp2(m_i - m_ij)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
            v = tl.load(v_cache_ptr + v_off[:, None] + offs_d[None, :] * stride_vd,
                        mask=t_mask[:, None], other=0.0)            # BLOCK_N x HEAD_DIM
            acc = tl.dot(p.to(v.dtype), v, acc)
            m_i = m_ij

        # This partition's unnormalized output, running max (base 2) and sum.
        po = (part_o_ptr + seq * stride_pob + heads[:, None] * stride_poh
              + part * stride_pos + offs_d[None, :] * stride_pod)
        tl.store(po, acc, mask=g_mask[:, None])
        pm = seq * stride_pmb + heads * stride_pmh + part * stride_pms
        tl.store(part_m_ptr + pm, m_i, mask=g_mask)
        tl.store(part_l_ptr + pm, l_i, mask=g_mask)


@triton.jit
def paged_decode_reduce_kernel(
    part_o_ptr, part_m_ptr, part_l_ptr, context_lens_ptr, out_ptr,
    stride_pob, stride_poh, stride_pos, stride_pod,
    stride_pmb, stride_pmh, stride_pms,
    stride_ob, stride_oh, stride_od,
    HEAD_DIM: tl.constexpr, PARTITION_SIZE: tl.constexpr, SPLITS_PAD: tl.constexpr,
):
    """Merge one (sequence, head)'s partitions: rescale each to the global max, then divide."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    n_parts = tl.cdiv(tl.load(context_lens_ptr + seq), PARTITION_SIZE)
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    s_mask = offs_s < n_parts
    pm = seq * stride_pmb + head * stride_pmh + offs_s * stride_pms
    m = tl.load(part_m_ptr + pm, mask=s_mask, other=float("-inf"))
    l = tl.load(part_l_ptr + pm, mask=s_mask, other=0.0)
    w = tl.where(s_mask, tl.math.exp2(m - tl.max(m, 0)), 0.0)
    o = tl.load(part_o_ptr + seq * stride_pob + head * stride_poh + offs_s[:, None] * stride_pos
                + offs_d[None, :] * stride_pod, mask=s_mask[:, None], other=0.0)
    res = tl.sum(o * w[:, None], 0) / tl.sum(l * w, 0)
    tl.store(out_ptr + seq * stride_ob + head * stride_oh + offs_d * stride_od,
             res.to(out_ptr.dtype.element_ty))


KERNEL = paged_decode_attention_kernel


# --------------------------------------------------------------------------------------------
# The launcher
# --------------------------------------------------------------------------------------------
_TRITON_DTYPE = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
                 torch.int32: "i32"}


def _ptr(t: torch.Tensor) -> Ptr:
    return Ptr(_TRITON_DTYPE[t.dtype], aligned=t.data_ptr() % 16 == 0)


def _num_parts(max_context_len: int, config: dict) -> int:
    return triton.cdiv(max_context_len, config["PARTITION_SIZE"])


def _grid(B: int, KV_H: int, max_context_len: int, config: dict) -> tuple[int, ...]:
    return (B, KV_H, _num_parts(max_context_len, config))


def _scratch(inputs: dict, config: dict) -> dict[str, torch.Tensor]:
    """fp32 partial outputs, maxima and sums, one slot per (sequence, head, partition)."""
    B, H, D = inputs["q"].shape
    parts = _num_parts(inputs["max_context_len"], config)
    dev = inputs["q"].device
    return {"part_o": torch.empty((B, H, parts, D), device=dev, dtype=torch.float32),
            "part_m": torch.empty((B, H, parts), device=dev, dtype=torch.float32),
            "part_l": torch.empty((B, H, parts), device=dev, dtype=torch.float32)}


def kernel_args(inputs: dict, config: dict,
                out: torch.Tensor | None = None) -> dict[str, object]:
    """Every ``KERNEL`` argument by name, allocating the fp32 partition scratch; ``launch`` and
    ``compile_args`` both derive from it. ``KERNEL`` never sees ``out``: the reduction kernel
    writes it."""
    q, kc, vc, bt = inputs["q"], inputs["k_cache"], inputs["v_cache"], inputs["block_table"]
    scratch = _scratch(inputs, config)
    po, pm, pl = scratch["part_o"], scratch["part_m"], scratch["part_l"]
    H, D = q.shape[1], q.shape[2]
    KV_H, page_size = kc.shape[2], kc.shape[1]
    if H % KV_H:
        raise ValueError(f"H={H} is not a multiple of KV_H={KV_H}")
    if config["PARTITION_SIZE"] % config["BLOCK_N"]:
        raise ValueError("PARTITION_SIZE must be a multiple of BLOCK_N")
    group = H // KV_H
    return {
        "q_ptr": q, "k_cache_ptr": kc, "v_cache_ptr": vc,
        "block_table_ptr": bt, "context_lens_ptr": inputs["context_lens"],
        "part_o_ptr": po, "part_m_ptr": pm, "part_l_ptr": pl,
        "sm_scale": inputs["sm_scale"],
        "stride_qb": q.stride(0), "stride_qh": q.stride(1), "stride_qd": q.stride(2),
        "stride_kp": kc.stride(0), "stride_kt": kc.stride(1),
        "stride_kh": kc.stride(2), "stride_kd": kc.stride(3),
        "stride_vp": vc.stride(0), "stride_vt": vc.stride(1),
        "stride_vh": vc.stride(2), "stride_vd": vc.stride(3),
        "stride_btb": bt.stride(0), "stride_btp": bt.stride(1),
        "stride_pob": po.stride(0), "stride_poh": po.stride(1),
        "stride_pos": po.stride(2), "stride_pod": po.stride(3),
        "stride_pmb": pm.stride(0), "stride_pmh": pm.stride(1), "stride_pms": pm.stride(2),
        "GROUP_SIZE": group,
        "GROUP_PAD": max(16, triton.next_power_of_2(group)),
        "HEAD_DIM": D,
        "PAGE_SIZE": page_size,
        "PARTITION_SIZE": config["PARTITION_SIZE"],
        "BLOCK_N": config["BLOCK_N"],
    }


def launch(inputs: dict, config: dict, out: torch.Tensor | None = None) -> torch.Tensor:
    q = inputs["q"]
    B, H, D = q.shape
    if out is None:
        out = torch.empty_like(q)
    args = kernel_args(inputs, config, out)
    KV_H = inputs["k_cache"].shape[2]
    paged_decode_attention_kernel[_grid(B, KV_H, inputs["max_context_len"], config)](
        **args, num_warps=config["num_warps"], num_stages=config["num_stages"])
    po, pm = args["part_o_ptr"], args["part_m_ptr"]
    paged_decode_reduce_kernel[(B, H)](
        po, pm, args["part_l_ptr"], inputs["context_lens"], out,
        po.stride(0), po.stride(1), po.stride(2), po.stride(3),
        pm.stride(0), pm.stride(1), pm.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        HEAD_DIM=D, PARTITION_SIZE=config["PARTITION_SIZE"],
        SPLITS_PAD=triton.next_power_of_2(po.shape[2]), num_warps=4)
    return out


# --------------------------------------------------------------------------------------------
# Inputs, baseline, reference
# --------------------------------------------------------------------------------------------
def context_lens(shape: Shape) -> list[int]:
    """Deterministic ragged lengths spread over [CTX_MIN, CTX_MAX] (a fixed stride through the
    range, so neighbouring sequences differ): the FLOP and byte counts depend on them."""
    B, lo, hi = shape["B"], shape["CTX_MIN"], shape["CTX_MAX"]
    if B == 1:
        return [hi]
    return [lo + ((i * 7919) % B) * (hi - lo) // (B - 1) for i in range(B)]


def make_inputs(shape: Shape, device: str, seed: int,
                dtype: torch.dtype = torch.bfloat16) -> dict:
    """q, K/V cache ~ N(0, 1); each sequence's pages are a random scatter over the cache.

    ``dtype`` exists for the CPU interpreter, which cannot multiply bf16 (it dots the raw bit
    patterns, triton-lang/triton#11584): the numerics tests run the same kernel on fp16.
    """
    B, H, KV_H, D, page = shape["B"], shape["H"], shape["KV_H"], shape["D"], shape["PAGE_SIZE"]
    lens = context_lens(shape)
    max_pages = triton.cdiv(shape["CTX_MAX"], page)
    pages_per_seq = [triton.cdiv(n, page) for n in lens]
    num_pages = sum(pages_per_seq)
    common = {"max_context_len": max(lens), "sm_scale": 1.0 / math.sqrt(D)}
    if torch.device(device).type == "meta":
        return {"q": torch.empty((B, H, D), device="meta", dtype=dtype),
                "k_cache": torch.empty((num_pages, page, KV_H, D), device="meta", dtype=dtype),
                "v_cache": torch.empty((num_pages, page, KV_H, D), device="meta", dtype=dtype),
                "block_table": torch.empty((B, max_pages), device="meta", dtype=torch.int32),
                "context_lens": torch.empty((B,), device="meta", dtype=torch.int32), **common}
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn((B, H, D), generator=gen, device=device).to(dtype)
    k_cache = torch.randn((num_pages, page, KV_H, D), generator=gen, device=device).to(dtype)
    v_cache = torch.randn((num_pages, page, KV_H, D), generator=gen, device=device).to(dtype)
    perm = torch.randperm(num_pages, generator=gen, device=device).to(torch.int32)
    block_table = torch.zeros((B, max_pages), device=device, dtype=torch.int32)
    first = 0
    for b, n in enumerate(pages_per_seq):
        block_table[b, :n] = perm[first:first + n]
        first += n
    return {"q": q, "k_cache": k_cache, "v_cache": v_cache, "block_table": block_table,
            "context_lens": torch.tensor(lens, device=device, dtype=torch.int32), **common}


def _gather(inputs: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Contiguous (B, KV_H, T, D) K and V for T = max_context_len, and a (B, T) length mask."""
    bt = inputs["block_table"].long()
    T = inputs["max_context_len"]
    B = bt.shape[0]
    k = inputs["k_cache"][bt].flatten(1, 2)[:, :T].transpose(1, 2)
    v = inputs["v_cache"][bt].flatten(1, 2)[:, :T].transpose(1, 2)
    mask = torch.arange(T, device=bt.device)[None, :] < inputs["context_lens"][:, None].long()
    return k, v, mask.view(B, 1, 1, T)


def baseline(inputs: dict) -> torch.Tensor:
    q = inputs["q"]
    B, H, D = q.shape
    k, v, mask = _gather(inputs)
    KV_H = k.shape[1]
    q4 = q.view(B, KV_H, H // KV_H, D)  # each KV head's query group as a length-G "sequence"
    out = F.scaled_dot_product_attention(q4, k, v, attn_mask=mask, scale=inputs["sm_scale"])
    return out.reshape(B, H, D)


def reference(inputs: dict) -> torch.Tensor:
    q = inputs["q"].float()
    B, H, D = q.shape
    k, v, mask = _gather(inputs)
    KV_H = k.shape[1]
    q4 = q.view(B, KV_H, H // KV_H, D)
    scores = torch.matmul(q4, k.float().transpose(-1, -2)) * inputs["sm_scale"]
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v.float()).reshape(B, H, D)


# P is rounded to bf16 before P @ V and the output is rounded to bf16.
TOLERANCE = Tolerance(max_rel_l2=2e-2, atol=1e-3, rtol=2e-2)


def _missing(module: str, package: str):
    def why() -> str | None:
        import importlib.util
        return None if importlib.util.find_spec(module) else f"{package} is not installed on this host"
    return why


def _paged_indices(inputs: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same page layout in CSR form: indptr (B+1), page ids, tokens in each last page."""
    bt, lens = inputs["block_table"], inputs["context_lens"]
    page = inputs["k_cache"].shape[1]
    pages = (lens + page - 1) // page
    indptr = torch.zeros(bt.shape[0] + 1, dtype=torch.int32, device=bt.device)
    indptr[1:] = torch.cumsum(pages, 0)
    mask = torch.arange(bt.shape[1], device=bt.device)[None, :] < pages[:, None]
    return indptr, bt[mask].to(torch.int32), (lens - (pages - 1) * page).to(torch.int32)


def flashinfer_prepare(inputs: dict) -> dict:
    """Plan FlashInfer's batch decode over the inputs' own paged cache (NHD pages, the same
    block table and lengths); the plan and the JIT compile stay outside the timed region."""
    import flashinfer

    q, k_cache = inputs["q"], inputs["k_cache"]
    B, H, D = q.shape
    indptr, indices, last = _paged_indices(inputs)
    workspace = torch.zeros(128 * 1024 * 1024, dtype=torch.uint8, device=q.device)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, kv_layout="NHD")
    wrapper.plan(indptr, indices, last, num_qo_heads=H, num_kv_heads=k_cache.shape[2], head_dim=D,
                 page_size=k_cache.shape[1], pos_encoding_mode="NONE", q_data_type=q.dtype,
                 kv_data_type=k_cache.dtype, sm_scale=inputs["sm_scale"])
    return {"wrapper": wrapper, "q": q, "kv": (k_cache, inputs["v_cache"]), "workspace": workspace}


def flashinfer_decode(prepared: dict) -> torch.Tensor:
    return prepared["wrapper"].run(prepared["q"], prepared["kv"])


def _not_wired(package: str):
    def run(prepared: dict) -> torch.Tensor:
        raise NotImplementedError(f"{package} is installed but this reference is not wired up yet")
    return run


REFERENCES = [
    Reference(key=None, name=BASELINE_NAME, backend="PyTorch gather + SDPA", fn=baseline, tolerance=TOLERANCE),
    Reference(key="flashinfer", name="flashinfer.BatchDecodeWithPagedKVCacheWrapper", backend="FlashInfer",
              fn=flashinfer_decode, tolerance=TOLERANCE, prepare=flashinfer_prepare,
              unavailable=_missing("flashinfer", "flashinfer-python")),
    # the next options the issue names; neither package is on the GPU image, so these rows say so
    Reference(key="vllm_triton", name="vllm decode_attention_fwd (Triton)", backend="vLLM Triton",
              fn=_not_wired("vllm"), tolerance=TOLERANCE, unavailable=_missing("vllm", "vllm")),
    Reference(key="flash_attn_paged", name="flash_attn.flash_attn_with_kvcache (paged)",
              backend="FlashAttention-2 (paged KV)", fn=_not_wired("flash-attn"), tolerance=TOLERANCE,
              unavailable=_missing("flash_attn", "flash-attn")),
]


# --------------------------------------------------------------------------------------------
# Roofline model and the static audit's view
# --------------------------------------------------------------------------------------------
def flops(shape: Shape) -> int:
    """q·K^T and P·V for every query head over its sequence's context: 4·H·D per token."""
    return sum(4 * shape["H"] * shape["D"] * n for n in context_lens(shape))


def bytes_moved(shape: Shape) -> int:
    """Each context token's K and V once per KV head (bf16), q and out once, the block table
    rows and lengths once."""
    B, H, KV_H, D = shape["B"], shape["H"], shape["KV_H"], shape["D"]
    kv = sum(2 * KV_H * D * 2 * n for n in context_lens(shape))
    pages = sum(triton.cdiv(n, shape["PAGE_SIZE"]) for n in context_lens(shape))
    return kv + 2 * (2 * B * H * D) + 4 * pages + 4 * B


def compile_args(shape: Shape, config: dict) -> dict[str, object]:
    args = kernel_args(make_inputs(shape, "meta", 0), config)
    return {k: _ptr(v) if isinstance(v, torch.Tensor) else v for k, v in args.items()}


def grid(shape: Shape, config: dict) -> tuple[int, ...]:
    return _grid(shape["B"], shape["KV_H"], max(context_lens(shape)), config)


# --------------------------------------------------------------------------------------------
# Config space and shapes
# --------------------------------------------------------------------------------------------
def _cfg(block_n: int, partition: int, warps: int, stages: int) -> dict:
    return {"BLOCK_N": block_n, "PARTITION_SIZE": partition,
            "num_warps": warps, "num_stages": stages}


# The K/V gathers hang off the block-table load, so Triton's pipeliner gives the page indices
# the first stages: on sm_90 K and V are single-buffered up to num_stages=4, double-buffered at
# 5 and triple-buffered at 7 (each buffer BLOCK_N x 128 x 2 bytes of K and as much of V).
CONFIGS: list[dict] = [
    _cfg(64, 512, 4, 3),
    _cfg(64, 512, 4, 5),
    _cfg(64, 1024, 8, 5),
    _cfg(128, 512, 4, 3),
    _cfg(128, 512, 4, 5),
    _cfg(128, 1024, 8, 3),
    _cfg(32, 256, 4, 5),
    _cfg(32, 512, 2, 4),
    _cfg(64, 256, 2, 3),
    _cfg(128, 2048, 4, 2),
    _cfg(64, 8192, 4, 3),   # no split at these shapes: one program per (sequence, KV head)
    # Register spills: a wide block on one or two warps holds the K^T and V fragments and the
    # 16 x BLOCK_N scores in registers for mma.sync.
    _cfg(256, 512, 2, 2),
    _cfg(128, 512, 1, 3),
    _cfg(256, 512, 1, 2),
    # Over the 227 KiB shared-memory opt-in limit.
    _cfg(256, 1024, 8, 5),  # two 256-token K/V buffers: 270 KiB
    _cfg(512, 1024, 8, 3),  # 278 KiB
    _cfg(512, 1024, 2, 2),  # 276 KiB, and it spills
]

_LLAMA3_8B_HEADS = {"H": 32, "KV_H": 8, "D": 128, "PAGE_SIZE": 16}
SHAPES: list[Shape] = [
    Shape("decode_b8_ctx2k_8k", {"B": 8, **_LLAMA3_8B_HEADS, "CTX_MIN": 2048, "CTX_MAX": 8192},
          label="llama3-8b decode, batch 8, context 2k-8k, 16-token pages", phase="decode"),
    Shape("decode_b32_ctx1k_8k", {"B": 32, **_LLAMA3_8B_HEADS, "CTX_MIN": 1024, "CTX_MAX": 8192},
          label="llama3-8b decode, batch 32, context 1k-8k, 16-token pages", phase="decode"),
    Shape("decode_b64_ctx1k_4k", {"B": 64, **_LLAMA3_8B_HEADS, "CTX_MIN": 1024, "CTX_MAX": 4096},
          label="llama3-8b decode, batch 64, context 1k-4k, 16-token pages", phase="decode"),
]
