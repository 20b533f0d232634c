"""Grouped expert GEMM of a Mixture-of-Experts layer (the w13 gate_up projection), computed the way
vLLM's ``fused_moe_kernel`` computes it on its bf16 path without quantization.

Each of M tokens is routed to TOP_K of E experts. Pair p = t * TOP_K + j is token t's j-th
choice, expert ``topk_ids[t, j]``, and its output row is

    out[p, n] = sum_k x[t, k] * W[topk_ids[t, j], n, k],    t = p // TOP_K

so ``out`` is (M * TOP_K, N): vLLM's (M, TOP_K, N) intermediate cache, flattened. There is no
routed-weight multiply here: vLLM applies the router weights in the second (w2, down) GEMM.

Layout: the weights are (E, N, K) row-major, as checkpoints store them. The kernel reads each
expert's slice as a column-major (K, N) view through its strides (``stride_bk`` = 1), so the
loads of a W tile are K-contiguous and the wgmma takes it K-major, as in ``fp8_block_gemm.py``.

Routing metadata (vLLM's ``moe_align_block_size``, here ``align_block_size`` in torch):

- ``sorted_ids``: the pair ids grouped by expert (in pair order within an expert), each
  expert's group padded to a multiple of BLOCK_M with the sentinel M * TOP_K, which no pair
  has. Its length is vLLM's upper bound EM = M * TOP_K + E * (BLOCK_M - 1), whatever the
  routing, so the grid depends only on shape and config.
- ``expert_ids``: one expert per BLOCK_M block of ``sorted_ids`` (-1 past the last block).
- ``num_post``: the padded total, a one-element tensor the kernel loads.

Each program takes one BLOCK_M block of ``sorted_ids`` and one BLOCK_N tile of N. A block at or
past ``num_post`` holds only sentinels, and its program returns before loading anything (the
grid is sized for the worst case: at M = 16 and BLOCK_M = 64 it has 128 block-rows, and the
~82 experts hit use one each). Otherwise it loads its BLOCK_M pair ids, gathers the
token rows ``p // TOP_K`` of x (sentinel rows masked to zero), multiplies them by its expert's
W tile over K with fp32 accumulation, and writes rows p of ``out`` (sentinel rows masked).

The alignment is computed on the inputs' device outside the timed launch: ``make_inputs``
computes it for every BLOCK_M of the config space and caches it in the inputs dict (under
``"_align"``, keyed by BLOCK_M; ``launch`` computes and caches any other BLOCK_M on first use).
So ``launch`` only launches the kernel. In vLLM the alignment is a separate small kernel that
runs once per layer call and is shared by the w13 and w2 GEMMs.

What this adds to a dense GEMM, and why it is a useful held-out kernel for the cost model
(``kernaudit_pipeline.rank``, fitted on the kernels one level up): the A rows are a gather
through an index load, every block-row reads another expert's weights, so the B panels are
shared only between the N tiles of one block-row, and the tiles are ragged: a BLOCK_M block
of an expert with few pairs is mostly padding (at M = 16 each hit expert gets 1.6 pairs on
average, so a 64-row block does about 40 times the useful MMA work). At decode sizes the kernel
is bound by reading the hit experts' weights; at prefill sizes (64 to 256 pairs per expert) it
is a tensor-core GEMM per expert, with a padding waste set by BLOCK_M.

Programs are numbered in groups of GROUP_M block-rows (the Triton matmul tutorial's grouped
order, as vLLM numbers them), over the whole upper-bound grid.

Baseline: the serving-grade alternative in plain PyTorch. The pairs sorted by expert (order and
group offsets computed in ``make_inputs``, outside the timed call), the token rows gathered in
that order, ``torch._grouped_mm`` (a CUTLASS grouped GEMM on sm_90) over the expert groups and
its rows gathered back into pair order. Where ``_grouped_mm`` is missing or raises, ``baseline``
falls back to a per-expert loop of ``torch.matmul`` (cuBLAS) and remembers that per device;
``baseline_name(device)`` reports which one ran. Reference: the fp32 product per pair.

Shapes: Qwen3-30B-A3B's expert gate_up projection (E = 128 experts, TOP_K = 8, hidden K = 2048,
N = 2 x moe_intermediate_size 768 = 1536) at four token counts M, the buckets vLLM tunes per.

This kernel is held out from the cost model's calibration: it was added on 2026-12-06/07 as the
sixth held-out kernel, and its ranking is to be committed before any GPU times it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernaudit_pipeline.kernel_spec import Ptr, Reference, Shape, Tolerance

NAME = "fused_moe_gemm"
DTYPE = "bf16"
GROUPED_MM = "torch._grouped_mm (CUTLASS grouped GEMM) over the expert-sorted tokens"
PER_EXPERT = "per-expert torch.matmul loop (cuBLAS) over the expert-sorted tokens"
BASELINE_NAME = GROUPED_MM
BLOCK_MS = (16, 32, 64, 128, 256)  # every BLOCK_M of the config space: aligned in make_inputs


# --------------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------------
@triton.jit
def fused_moe_gemm_kernel(
    a_ptr, b_ptr, out_ptr,
    sorted_ids_ptr, expert_ids_ptr, num_post_ptr,
    N, K, EM, num_valid,
    stride_am, stride_ak,
    stride_be, stride_bk, stride_bn,
    stride_om, stride_on,
    TOP_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    # Grouped ordering over the upper-bound grid: GROUP_M block-rows down one tile-column
    # before moving right.
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(EM, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    # Blocks past the padded total hold only sentinels: nothing to load, nothing to write.
    num_post = tl.load(num_post_ptr)
    if pid_m * BLOCK_M >= num_post:
        return

    # This block's pairs (in bounds: num_post is a multiple of BLOCK_M and at most EM) and its
    # expert. Sentinel pairs (== num_valid) are masked in the loads of x and in the store.
    offs_id = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(sorted_ids_ptr + offs_id)
    pair_mask = pairs < num_valid
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)

    # Gather the token rows; the expert's W slice is a column-major (K, N) view. Columns past
    # N wrap around (% N): the W loads stay unmasked in N, the store is masked instead.
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + ((pairs // TOP_K)[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = (b_ptr + expert * stride_be
              + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn))

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_remaining = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=pair_mask[:, None] & (offs_k[None, :] < k_remaining),
                    other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_remaining, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    # Scatter: row p of out is pair p, wherever it sits in the sorted order.
    out = acc.to(out_ptr.dtype.element_ty)
    offs_on = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    out_ptrs = out_ptr + stride_om * pairs[:, None] + stride_on * offs_on[None, :]
    out_mask = pair_mask[:, None] & (offs_on[None, :] < N)
    tl.store(out_ptrs, out, mask=out_mask)


KERNEL = fused_moe_gemm_kernel


# --------------------------------------------------------------------------------------------
# Routing metadata and the launcher
# --------------------------------------------------------------------------------------------
def max_sorted_len(num_pairs: int, num_experts: int, block_m: int) -> int:
    """vLLM's bound on the padded length: every expert wastes at most BLOCK_M - 1 slots."""
    return num_pairs + num_experts * (block_m - 1)


def align_block_size(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> dict:
    """``moe_align_block_size`` in torch, on ``topk_ids``' device: ``sorted_ids`` (EM int32,
    pair ids by expert, each expert's group padded to a multiple of ``block_m`` with the
    sentinel M * TOP_K), ``expert_ids`` (cdiv(EM, block_m) int32, -1 past the last block) and
    ``num_post`` (one int32, the padded total). On the meta device: shapes only."""
    num_pairs = topk_ids.numel()
    em = max_sorted_len(num_pairs, num_experts, block_m)
    dev = topk_ids.device
    if dev.type == "meta":
        return {"sorted_ids": torch.empty(em, device=dev, dtype=torch.int32),
                "expert_ids": torch.empty(triton.cdiv(em, block_m), device=dev,
                                          dtype=torch.int32),
                "num_post": torch.empty(1, device=dev, dtype=torch.int32)}
    flat = topk_ids.flatten().to(torch.int64)
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    order = torch.argsort(flat, stable=True)  # pair ids by expert, in pair order within one
    expert_of = flat[order]
    rank = torch.arange(num_pairs, device=dev) - (torch.cumsum(counts, 0) - counts)[expert_of]
    sorted_ids = torch.full((em,), num_pairs, device=dev, dtype=torch.int32)
    sorted_ids[(padded_end - padded)[expert_of] + rank] = order.to(torch.int32)
    # Block b belongs to the expert whose padded range holds b * block_m (empty experts have
    # empty ranges and own no block); blocks past the total get -1.
    starts = torch.arange(triton.cdiv(em, block_m), device=dev) * block_m
    expert_ids = torch.searchsorted(padded_end, starts, right=True)
    expert_ids = torch.where(starts < padded_end[-1], expert_ids, -1).to(torch.int32)
    return {"sorted_ids": sorted_ids, "expert_ids": expert_ids,
            "num_post": padded_end[-1:].to(torch.int32)}


def aligned(inputs: dict, block_m: int) -> dict:
    """The alignment for ``block_m``, cached in ``inputs``."""
    cache = inputs.setdefault("_align", {})
    if block_m not in cache:
        cache[block_m] = align_block_size(inputs["topk_ids"], inputs["w"].shape[0], block_m)
    return cache[block_m]


_TRITON_DTYPE = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
                 torch.int32: "i32"}


def _ptr(t: torch.Tensor) -> Ptr:
    return Ptr(_TRITON_DTYPE[t.dtype], aligned=t.data_ptr() % 16 == 0)


def _grid(num_pairs: int, num_experts: int, N: int, config: dict) -> tuple[int, ...]:
    em = max_sorted_len(num_pairs, num_experts, config["BLOCK_M"])
    return (triton.cdiv(em, config["BLOCK_M"]) * triton.cdiv(N, config["BLOCK_N"]),)


def kernel_args(inputs: dict, config: dict,
                out: torch.Tensor | None = None) -> dict[str, object]:
    """Every ``KERNEL`` argument by name; ``launch`` and ``compile_args`` both derive from it,
    so the static audit compiles exactly what the GPU runs."""
    x, w, ids = inputs["x"], inputs["w"], inputs["topk_ids"]
    M, K = x.shape
    E, N = w.shape[:2]
    top_k = ids.shape[1]
    if w.shape[2] != K or ids.shape[0] != M:
        raise ValueError(f"x {tuple(x.shape)}, w {tuple(w.shape)} and topk_ids "
                         f"{tuple(ids.shape)} do not chain")
    al = aligned(inputs, config["BLOCK_M"])
    if out is None:
        out = torch.empty((M * top_k, N), device=x.device, dtype=x.dtype)
    return {
        "a_ptr": x, "b_ptr": w, "out_ptr": out,
        "sorted_ids_ptr": al["sorted_ids"], "expert_ids_ptr": al["expert_ids"],
        "num_post_ptr": al["num_post"],
        "N": N, "K": K, "EM": al["sorted_ids"].shape[0], "num_valid": M * top_k,
        "stride_am": x.stride(0), "stride_ak": x.stride(1),
        # (E, N, K) row-major, read as (K, N) column-major per expert
        "stride_be": w.stride(0), "stride_bk": w.stride(2), "stride_bn": w.stride(1),
        "stride_om": out.stride(0), "stride_on": out.stride(1),
        "TOP_K": top_k,
        **{k: config[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")},
    }


def launch(inputs: dict, config: dict, out: torch.Tensor | None = None) -> torch.Tensor:
    args = kernel_args(inputs, config, out)
    grid = _grid(args["num_valid"], inputs["w"].shape[0], args["N"], config)
    fused_moe_gemm_kernel[grid](**args, num_warps=config["num_warps"],
                                num_stages=config["num_stages"])
    return args["out_ptr"]


# --------------------------------------------------------------------------------------------
# Inputs, baseline, reference
# --------------------------------------------------------------------------------------------
def route(x: torch.Tensor, num_experts: int, top_k: int, gen: torch.Generator) -> torch.Tensor:
    """A router's choice: random logits, softmax, the top_k experts (distinct) per token."""
    logits = torch.randn((x.shape[0], num_experts), generator=gen, device=x.device)
    return torch.topk(torch.softmax(logits, dim=-1), top_k, dim=-1).indices.to(torch.int32)


def by_expert(inputs: dict) -> dict:
    """The baseline's routing metadata, cached in ``inputs``: the pair ids sorted by expert,
    their token rows, the inverse permutation, the group ends (int32 offsets, as
    ``_grouped_mm`` takes them) and the group sizes as Python ints (for the loop)."""
    if "_by_expert" not in inputs:
        flat = inputs["topk_ids"].flatten().to(torch.int64)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=inputs["w"].shape[0])
        inputs["_by_expert"] = {
            "rows": order // inputs["topk_ids"].shape[1], "inverse": torch.argsort(order),
            "offs": torch.cumsum(counts, 0).to(torch.int32), "counts": counts.tolist()}
    return inputs["_by_expert"]


def make_inputs(shape: Shape, device: str, seed: int,
                dtype: torch.dtype = torch.bfloat16) -> dict:
    """x ~ N(0, 1) and W ~ N(0, 1/K), so every output is ~N(0, 1) whatever K is, and a seeded
    routing (``route``). The alignment for every BLOCK_M of the space and the baseline's
    sorted order are computed here, outside any timed launch.

    ``dtype`` exists for the CPU interpreter, which cannot multiply bf16 (it dots the raw bit
    patterns, triton-lang/triton#11584): the numerics tests run the same kernel on fp16.
    """
    M, N, K, E, top_k = shape["M"], shape["N"], shape["K"], shape["E"], shape["TOP_K"]
    if torch.device(device).type == "meta":
        return {"x": torch.empty((M, K), device="meta", dtype=dtype),
                "w": torch.empty((E, N, K), device="meta", dtype=dtype),
                "topk_ids": torch.empty((M, top_k), device="meta", dtype=torch.int32)}
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn((M, K), generator=gen, device=device).to(dtype)
    w = (torch.randn((E, N, K), generator=gen, device=device) * K ** -0.5).to(dtype)
    inputs = {"x": x, "w": w, "topk_ids": route(x, E, top_k, gen)}
    for block_m in BLOCK_MS:
        aligned(inputs, block_m)
    by_expert(inputs)
    return inputs


def grouped_mm(inputs: dict) -> torch.Tensor:
    """Gather the rows in expert order, one CUTLASS grouped GEMM, back to pair order."""
    s = by_expert(inputs)
    ys = torch._grouped_mm(inputs["x"][s["rows"]], inputs["w"].transpose(1, 2), offs=s["offs"])
    return ys[s["inverse"]]


def per_expert_matmul(inputs: dict) -> torch.Tensor:
    """The same with one cuBLAS call per expert that has pairs."""
    s, w = by_expert(inputs), inputs["w"]
    xs = inputs["x"][s["rows"]]
    ys = torch.empty((xs.shape[0], w.shape[1]), device=xs.device, dtype=xs.dtype)
    start = 0
    for e, count in enumerate(s["counts"]):
        if count:
            torch.matmul(xs[start:start + count], w[e].t(), out=ys[start:start + count])
        start += count
    return ys[s["inverse"]]


_BASELINE_RAN: dict[str, str] = {}  # device -> GROUPED_MM or PER_EXPERT


def baseline(inputs: dict) -> torch.Tensor:
    """``torch._grouped_mm`` when this torch and device can run it, else the per-expert loop.

    The first failure on a device is remembered, so a timing loop never pays for the exception
    again; ``baseline_name`` reports the path taken."""
    device = str(inputs["x"].device)
    if hasattr(torch, "_grouped_mm") and _BASELINE_RAN.get(device) != PER_EXPERT:
        try:
            out = grouped_mm(inputs)
            _BASELINE_RAN[device] = GROUPED_MM
            return out
        except (RuntimeError, NotImplementedError, TypeError, ValueError):
            pass
    _BASELINE_RAN[device] = PER_EXPERT
    return per_expert_matmul(inputs)


def baseline_name(device: str = "cuda") -> str:
    """The baseline ``baseline`` runs on ``device``, probing with a small call if it has not
    run there yet."""
    key = str(torch.empty(0, device=device).device)  # "cuda" -> "cuda:0", as tensors report
    if key not in _BASELINE_RAN:
        probe = Shape("probe", {"M": 16, "N": 64, "K": 64, "E": 4, "TOP_K": 2})
        baseline(make_inputs(probe, device, 0))
    return _BASELINE_RAN[key]


def reference(inputs: dict) -> torch.Tensor:
    """fp32, pair by pair: each expert's fp32 weights times the fp32 rows of its tokens."""
    x, w, ids = inputs["x"].float(), inputs["w"], inputs["topk_ids"]
    top_k = ids.shape[1]
    flat = ids.flatten().to(torch.int64)
    out = torch.empty((flat.numel(), w.shape[1]), device=x.device, dtype=torch.float32)
    for e in torch.unique(flat).tolist():
        pairs = torch.nonzero(flat == e).flatten()
        out[pairs] = x[pairs // top_k] @ w[e].float().t()
    return out


# The GEMM's tolerance: fp32 sums, one bf16 rounding of the output (x and W are exact in
# the reference).
TOLERANCE = Tolerance(max_rel_l2=1e-2, atol=2e-2, rtol=2e-2)

# The one reference the runner times every config against, paired: the grouped GEMM PyTorch
# ships (CUTLASS on sm_90), or the per-expert cuBLAS loop where it cannot run. The runner
# profiles the reference and records the kernels that actually ran, which tells the two apart.
REFERENCES = [Reference(key=None, name=BASELINE_NAME,
                        backend="CUTLASS (torch._grouped_mm; cuBLAS per expert if it raises)",
                        fn=baseline, tolerance=TOLERANCE)]


# --------------------------------------------------------------------------------------------
# Roofline model and the static audit's view
# --------------------------------------------------------------------------------------------
def flops(shape: Shape) -> int:
    """The useful product, 2 * K per pair and output column; the padding rows of each expert's
    last block, which the kernel multiplies too, are left out."""
    return 2 * shape["M"] * shape["TOP_K"] * shape["N"] * shape["K"]


def expected_experts_hit(shape: Shape) -> float:
    """Distinct experts hit by M tokens under uniform routing (each token picks TOP_K distinct
    experts at random, so an expert escapes one token with probability 1 - TOP_K / E)."""
    E = shape["E"]
    return E * (1.0 - (1.0 - shape["TOP_K"] / E) ** shape["M"])


def bytes_moved(shape: Shape) -> int:
    """x read once (its gather reads each token TOP_K times, from L2 at best), the weights of
    the experts hit read once, and out (M * TOP_K rows) written once, all bf16. A shape has no
    routing, so the experts hit are the expected number under uniform routing
    (``expected_experts_hit``: 82.4 of 128 at M = 16, all 128 from M = 128). The int32
    routing metadata (4 bytes per pair, against 2 * N bytes of output) is left out."""
    M, N, K, top_k = shape["M"], shape["N"], shape["K"], shape["TOP_K"]
    weights = expected_experts_hit(shape) * N * K * 2
    return round(2 * M * K + weights + 2 * M * top_k * N)


def compile_args(shape: Shape, config: dict) -> dict[str, object]:
    args = kernel_args(make_inputs(shape, "meta", 0), config)
    return {k: _ptr(v) if isinstance(v, torch.Tensor) else v for k, v in args.items()}


def grid(shape: Shape, config: dict) -> tuple[int, ...]:
    """The upper-bound grid the kernel is launched with; programs of blocks past the routing's
    padded total return at once."""
    return _grid(shape["M"] * shape["TOP_K"], shape["E"], shape["N"], config)


# --------------------------------------------------------------------------------------------
# Config space and shapes
# --------------------------------------------------------------------------------------------
def _cfg(bm: int, bn: int, bk: int, group_m: int, warps: int, stages: int) -> dict:
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m,
            "num_warps": warps, "num_stages": stages}


def _smem(bm: int, bn: int, bk: int, stages: int) -> int:
    """Bytes of the pipelined x and W tiles (bf16)."""
    return stages * (bm + bn) * bk * 2


SMEM_CAP = 256 * 1024  # a little over the 227 KiB opt-in limit, so some configs exceed it
K_STAGES = {32: (3, 4), 64: (2, 3, 4, 5), 128: (2, 3, 4), 256: (2, 3)}


def _space() -> list[dict]:
    """vLLM's ``benchmark_moe.py`` tuning space (BLOCK_M 16..256, BLOCK_N 32..256, BLOCK_K,
    GROUP_M 1/16/32/64, 4 and 8 warps, 2 to 5 stages), subsampled:

    - every tile except 256 x 256 (its fp32 accumulator alone is 256 registers per thread on 8
      warps); 128 x 256 and 256 x 128 on 4 warps spill;
    - BLOCK_K 32 with 3 or 4 stages, 64 with 2 to 5, 128 with 2 to 4, 256 with 2 or 3, and no
      pipeline over SMEM_CAP (``_smem``), which leaves some over the opt-in limit;
    - 4 and 8 warps on every tile;
    - GROUP_M 1 for BLOCK_M <= 32 (decode tiles), 16 from 64;
    - and a GROUP_M sweep: the other three of 1/16/32/64 for BLOCK_M 16..128 by BLOCK_N
      64..256 at BLOCK_K 64 and 128, 3 stages, 4 warps up to 32 rows and 8 from 64.
    """
    def base_group(bm: int) -> int:
        return 1 if bm <= 32 else 16

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
                        configs.append(_cfg(bm, bn, bk, base_group(bm), warps, stages))
    for bm in (16, 32, 64, 128):
        for bn in (64, 128, 256):
            for bk in (64, 128):
                for group_m in (1, 16, 32, 64):
                    if group_m != base_group(bm) and _smem(bm, bn, bk, 3) <= SMEM_CAP:
                        configs.append(_cfg(bm, bn, bk, group_m, 4 if bm <= 32 else 8, 3))
    return configs


CONFIGS: list[dict] = _space()

_E, _TOP_K, _N, _K = 128, 8, 1536, 2048  # experts, per token, 2 x moe_intermediate_size, hidden
SHAPES: list[Shape] = [
    Shape(f"qwen3_30b_a3b_moe_gate_up_m{m}",
          {"M": m, "N": _N, "K": _K, "E": _E, "TOP_K": _TOP_K},
          label=f"qwen3-30b-a3b MoE experts gate_up (w13) E={_E} top_k={_TOP_K} "
                f"(K,N)=({_K},{_N}) M={m} tokens ({phase})",
          phase=phase)
    for m, phase in ((16, "decode"), (128, "decode"), (1024, "prefill"), (4096, "prefill"))
]
