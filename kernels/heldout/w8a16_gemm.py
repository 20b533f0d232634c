"""Weight-only int8 linear layer (W8A16), out = x @ dequant(W): the GPTQ/AWQ-style quantized
projection that LLM serving runs when the weights are int8 and the activations stay bf16.

    out[m, n] = sum_k x[m, k] * (W_q[k, n] * scales[k // GROUP_SIZE, n])

W_q holds symmetric int8 values (no zero points). Each run of GROUP_SIZE = 128 consecutive K
rows of one output column shares one scale, so ``scales`` is (cdiv(K, GROUP_SIZE), N), row-major,
in the activation dtype: the (num_groups, out_features) layout of GPTQ/AWQ checkpoints.

Layout: W is nn.Linear's weight, (N, K) row-major, which the kernel sees as a column-major
(K, N) view through its strides (as ``kernels/fp8_gemm.py`` sees its B). It is what a
serving stack gets by quantizing an nn.Linear weight in place, and the loads are K-contiguous:
each output column's slice of a W tile is BLOCK_K >= 32 contiguous bytes, whole 16-byte vectors.

Each K step loads the int8 tile, converts it to the activation dtype (exact: int8 values fit
bf16's 8 significant bits), multiplies it by the scale row of the group the step lies in and
feeds it to ``tl.dot`` with fp32 accumulation. One scale row per step requires BLOCK_K <=
GROUP_SIZE and GROUP_SIZE % BLOCK_K == 0 (checked at compile time; every config keeps to it).
The product of an int8 and a bf16 scale is rounded to bf16 once, exactly as the baseline's
``W.to(bf16) * scales`` rounds it, so kernel and baseline multiply the same dequantized
weights.

What this adds to a plain GEMM, and why it is a useful held-out kernel for the cost model
(``kernaudit_pipeline.rank``, fitted on the kernels one level up): the weight operand costs one
byte per element in DRAM and shared memory but two in the MMA, and the K loop does CUDA-core
work (convert and scale) on every BLOCK_K x BLOCK_N weight tile, work that does not shrink with
BLOCK_M. At decode sizes the kernel is bound by reading W; at prefill sizes the dequant has to
hide behind the wgmmas, and how well it does depends on warps, stages and tile width.

Programs are numbered in groups of GROUP_M tile-rows (the Triton matmul tutorial's grouped
order) so that neighbouring programs share W panels while they sit in L2.

Baseline: dequantize in PyTorch, then cuBLAS: ``W.to(bf16) * scales`` (elementwise kernels
that write the bf16 weight) and ``torch.matmul`` reading it back. Reference: the same product
with the weights dequantized in fp32 and an fp32 matmul.

Shapes: Llama-3-8B's attention output projection (K = N = 4096) at four batch-token counts M,
the buckets vLLM tunes per.

This kernel is held out from the cost model's calibration: it was added on 2026-12-06, and its
ranking is to be committed before any GPU times it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernaudit_pipeline.kernel_spec import Ptr, Shape, Tolerance

NAME = "w8a16_gemm"
DTYPE = "bf16"  # the activations and the output; the weights are int8
BASELINE_NAME = "W.to(bf16) * scales + torch.matmul (dequant + cuBLAS, unfused)"
GROUP_SIZE = 128  # K rows per weight scale
SCALE_BYTES = 2  # bf16 scales


# --------------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------------
@triton.jit
def w8a16_gemm_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr,
    M, N, K,
    stride_xm, stride_xk,
    stride_wk, stride_wn,
    stride_sg, stride_sn,
    stride_om, stride_on,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, GROUP_SIZE: tl.constexpr,
):
    # One scale row per K step: a step never straddles two groups.
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
    offs_xm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_wn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + (offs_xm[:, None] * stride_xm + offs_k[None, :] * stride_xk)
    w_ptrs = w_ptr + (offs_k[:, None] * stride_wk + offs_wn[None, :] * stride_wn)
    s_ptrs = s_ptr + offs_wn * stride_sn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_remaining = K - k * BLOCK_K
        x = tl.load(x_ptrs, mask=offs_k[None, :] < k_remaining, other=0.0)
        w_q = tl.load(w_ptrs, mask=offs_k[:, None] < k_remaining, other=0)
        # The scale row of this step's group; a K tail still lies in the last (partial) group.
        scale = tl.load(s_ptrs + ((k * BLOCK_K) // GROUP_SIZE) * stride_sg)
        # Dequantize in registers: int8 -> activation dtype (exact), times the scale (one
        # rounding). The bf16 weight never reaches memory.
        w = w_q.to(x.dtype) * scale[None, :]
        acc = tl.dot(x, w, acc)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk

    out = acc.to(out_ptr.dtype.element_ty)
    offs_om = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_on = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    out_ptrs = out_ptr + stride_om * offs_om[:, None] + stride_on * offs_on[None, :]
    out_mask = (offs_om[:, None] < M) & (offs_on[None, :] < N)
    tl.store(out_ptrs, out, mask=out_mask)


KERNEL = w8a16_gemm_kernel


# --------------------------------------------------------------------------------------------
# The launcher
# --------------------------------------------------------------------------------------------
_TRITON_DTYPE = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
                 torch.int8: "i8"}


def _ptr(t: torch.Tensor) -> Ptr:
    return Ptr(_TRITON_DTYPE[t.dtype], aligned=t.data_ptr() % 16 == 0)


def _grid(M: int, N: int, config: dict) -> tuple[int, ...]:
    return (triton.cdiv(M, config["BLOCK_M"]) * triton.cdiv(N, config["BLOCK_N"]),)


def kernel_args(inputs: dict, config: dict,
                out: torch.Tensor | None = None) -> dict[str, object]:
    """Every ``KERNEL`` argument by name; ``launch`` and ``compile_args`` both derive from it,
    so the static audit compiles exactly what the GPU runs."""
    x, w, s = inputs["x"], inputs["w"], inputs["scales"]
    M, K = x.shape
    N = w.shape[1]
    if w.shape[0] != K or s.shape != (triton.cdiv(K, GROUP_SIZE), N):
        raise ValueError(f"x {tuple(x.shape)}, W {tuple(w.shape)} and scales {tuple(s.shape)} "
                         f"do not chain (group size {GROUP_SIZE})")
    if out is None:
        out = torch.empty((M, N), device=x.device, dtype=x.dtype)
    return {
        "x_ptr": x, "w_ptr": w, "s_ptr": s, "out_ptr": out,
        "M": M, "N": N, "K": K,
        "stride_xm": x.stride(0), "stride_xk": x.stride(1),
        "stride_wk": w.stride(0), "stride_wn": w.stride(1),
        "stride_sg": s.stride(0), "stride_sn": s.stride(1),
        "stride_om": out.stride(0), "stride_on": out.stride(1),
        **{k: config[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")},
        "GROUP_SIZE": GROUP_SIZE,
    }


def launch(inputs: dict, config: dict, out: torch.Tensor | None = None) -> torch.Tensor:
    args = kernel_args(inputs, config, out)
    w8a16_gemm_kernel[_grid(args["M"], args["N"], config)](
        **args, num_warps=config["num_warps"], num_stages=config["num_stages"])
    return args["out_ptr"]


# --------------------------------------------------------------------------------------------
# Inputs, baseline, reference
# --------------------------------------------------------------------------------------------
def make_inputs(shape: Shape, device: str, seed: int,
                dtype: torch.dtype = torch.bfloat16) -> dict:
    """x ~ N(0, 1) and W ~ N(0, 1/K), quantized as a GPTQ/AWQ checkpoint holds it (round to
    nearest, per-group absmax / 127 scales), so the output is ~N(0, 1) whatever K is.

    ``w`` is the (K, N) column-major view of the (N, K) row-major int8 weight. ``dtype`` (of x
    and the scales) exists for the CPU interpreter, which cannot multiply bf16
    (triton-lang/triton#11584): the numerics tests run the same kernel on fp16.
    """
    M, N, K = shape["M"], shape["N"], shape["K"]
    groups = triton.cdiv(K, GROUP_SIZE)
    if torch.device(device).type == "meta":
        return {"x": torch.empty((M, K), device="meta", dtype=dtype),
                "w": torch.empty((N, K), device="meta", dtype=torch.int8).t(),
                "scales": torch.empty((groups, N), device="meta", dtype=dtype)}
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn((M, K), generator=gen, device=device).to(dtype)
    w = torch.randn((N, K), generator=gen, device=device) * K ** -0.5
    # Per (group, column) absmax over zero-padded groups, so a last partial group works too.
    padded = torch.nn.functional.pad(w.t(), (0, 0, 0, groups * GROUP_SIZE - K))  # (K', N)
    amax = padded.reshape(groups, GROUP_SIZE, N).abs().amax(dim=1).clamp_min(1e-8)
    scales = (amax / 127.0).to(dtype)  # (groups, N) row-major, rounded as stored
    per_k = scales.float().repeat_interleave(GROUP_SIZE, dim=0)[:K]  # (K, N)
    w_q = torch.round(w / per_k.t()).clamp(-127, 127).to(torch.int8).contiguous()  # (N, K)
    return {"x": x, "w": w_q.t(), "scales": scales}


def _dequantize(inputs: dict, dtype: torch.dtype) -> torch.Tensor:
    """The (N, K) weight in ``dtype``. Full groups broadcast their scale (no expanded scale
    tensor is written); only a K that is no multiple of GROUP_SIZE (small test shapes) expands."""
    w, s = inputs["w"].t(), inputs["scales"].t().to(dtype)  # (N, K) int8, (N, groups)
    N, K = w.shape
    if K % GROUP_SIZE == 0:
        return (w.view(N, -1, GROUP_SIZE).to(dtype) * s[:, :, None]).view(N, K)
    return w.to(dtype) * s.repeat_interleave(GROUP_SIZE, dim=1)[:, :K]


def baseline(inputs: dict) -> torch.Tensor:
    """Dequantize to bf16 (a cast and a multiply that write the K x N weight), then cuBLAS
    reads it back: x @ W^T, as nn.Linear calls it."""
    x = inputs["x"]
    return torch.matmul(x, _dequantize(inputs, x.dtype).t())


def reference(inputs: dict) -> torch.Tensor:
    return inputs["x"].float() @ _dequantize(inputs, torch.float32).t()


# Two bf16 roundings: the dequantized weight (unit roundoff 2^-8, averaged over K) and the
# output cast; the sums stay fp32.
TOLERANCE = Tolerance(max_rel_l2=1e-2, atol=2e-2, rtol=2e-2)


# --------------------------------------------------------------------------------------------
# Roofline model and the static audit's view
# --------------------------------------------------------------------------------------------
def flops(shape: Shape) -> int:
    """The product; the dequant's two operations per weight element, repeated by every
    program row, are left out."""
    return 2 * shape["M"] * shape["N"] * shape["K"]


def bytes_moved(shape: Shape) -> int:
    """x (bf16), W (int8) and its scales read once, the output (bf16) written once. Per
    element of K x N that is 1 + SCALE_BYTES / GROUP_SIZE bytes."""
    M, N, K = shape["M"], shape["N"], shape["K"]
    return 2 * M * K + K * N + triton.cdiv(K, GROUP_SIZE) * N * SCALE_BYTES + 2 * M * N


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
      registers per thread on 8 warps);
    - BLOCK_K 32 and 64 with 2 to 5 stages, 128 with 2 to 4: every BLOCK_K divides GROUP_SIZE;
    - 4 and 8 warps on every tile: the dequant of a BLOCK_K x BLOCK_N tile is the same work
      whatever BLOCK_M is, so small-M tiles get the second warp count too;
    - GROUP_M 8 from 64 rows (1 below), plus GROUP_M 1 for the 64- and 128-row tiles 128 and
      256 wide at BLOCK_K 64 and 128 on 8 warps, to see what the grouping is worth.

    Shared memory per stage is BLOCK_M * BLOCK_K * 2 + BLOCK_K * BLOCK_N bytes for the loads
    (x in bf16, W in int8), plus a buffer the compiler adds for the dequantized tile.
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

_N, _K = 4096, 4096  # o_proj output width, hidden size (32 heads x 128)
SHAPES: list[Shape] = [
    Shape(f"llama3_8b_w8a16_o_proj_m{m}", {"M": m, "N": _N, "K": _K},
          label=f"llama3-8b int8 weight-only o_proj (K,N)=({_K},{_N}) M={m} ({phase})",
          phase=phase)
    for m, phase in ((16, "decode"), (128, "decode"), (1024, "prefill"), (4096, "prefill"))
]
