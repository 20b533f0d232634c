"""Dense linear layer with a fused bias + GELU epilogue, out = gelu_tanh(x @ W^T + b): the first
projection of a GPT-2-style MLP (``c_fc``) as a serving stack stores and runs it.

    out[m, n] = gelu_tanh(sum_k x[m, k] * W[n, k] + b[n])
    gelu_tanh(z) = 0.5 * z * (1 + tanh(sqrt(2 / pi) * (z + 0.044715 * z^3)))

which is ``F.gelu(..., approximate="tanh")`` (Hugging Face's ``gelu_pytorch_tanh``).

Layout: x is (M, K) row-major; W is nn.Linear's weight, (N, K) row-major, as checkpoints store
it; b is (N,). The kernel reads W K-major: its (BLOCK_K, BLOCK_N) tile is addressed as
``w_ptr + offs_n[None, :] * stride_wn + offs_k[:, None] * stride_wk`` with ``stride_wk`` = 1,
so each output column's slice of a tile is BLOCK_K contiguous elements and the wgmma takes
the operand K-major, as in ``fused_moe_gemm.py`` and ``fp8_block_gemm.py``. No transposed copy
of the weight is ever made.

Each program computes one BLOCK_M x BLOCK_N tile of the output with an fp32 accumulator over
K (``tl.dot``, wgmma on sm_90 from BLOCK_M = 64, mma.sync below; ``num_stages`` sets the
depth of the asynchronous global->shared pipeline). The epilogue runs in fp32 registers on
the finished accumulator: add the bias row, apply GELU, then one rounding to bf16 and one
store. So the pre-activation (M, N) never reaches memory, where the unfused baseline writes
it and reads it back.

GELU uses the identity 0.5 * (1 + tanh(u)) = sigmoid(2u), so gelu_tanh(z) = z * sigmoid(2u):
the same function in exact arithmetic (the two differ by float rounding only), built from
``tl.sigmoid`` (one exp and one reciprocal) with no libdevice call, so the same kernel runs
under Triton's CPU interpreter. For large |z| it saturates cleanly: sigmoid goes to 0 or 1,
never NaN.

Programs are numbered in groups of GROUP_M tile-rows (the Triton matmul tutorial's grouped
order), so that neighbouring programs share W panels while they sit in L2. That can matter
even at decode sizes here: at M = 128 on 16-row tiles there are 8 tile-rows, and with
GROUP_M = 1 (row-major order) each of them streams the whole 151 MB weight in turn, three
times what an H100's or H200's 50 MB L2 can keep for the next.

Edges: rows and columns past M and N wrap around (``% M``, ``% N``) in the loads, as in the
Triton tutorial and the other held-out kernels, so the x, W and bias loads stay unmasked in M
and N and the final store is masked instead; the K tail is masked in both operand loads
(``other=0``, adding nothing to the sum).

What this adds to a plain GEMM, as a held-out kernel for the cost model
(``kernaudit_pipeline.rank``, fitted on the kernels one level up): a K-major weight read from
an nn.Linear layout at a shape whose weight (N x K = 12288 x 6144, 151 MB in bf16) is much
larger than L2, and an epilogue of elementwise math (about a dozen fp32 operations, one exp
and one reciprocal per output element) plus a bias load, paid once per tile and not per K
step. At decode sizes the kernel is bound by reading W; at prefill sizes it is a tensor-core
GEMM with a short epilogue.

Baseline: ``F.gelu(F.linear(x, W, b), approximate="tanh")`` in bf16, what StarCoder2's eager
PyTorch MLP runs: cuBLAS addmm (x @ W^T + b, the bias in the GEMM's epilogue where cuBLASLt
takes it), which writes the bf16 pre-activation, then an elementwise GELU kernel that reads it
back. Reference: the same composition in fp32.

Shapes: StarCoder2-15B's MLP ``c_fc`` (hidden 6144, intermediate 24576, ``gelu_pytorch_tanh``,
biases on) under tensor parallelism 2 (column-parallel: each rank holds half the output
features), so K = 6144 and N = 12288, at four batch-token counts M, the buckets vLLM tunes per.

This kernel is held out from the cost model's calibration: it was written by a helper that
never ran the model, and its config space was designed as a tuning sweep for this kernel, not
around any model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernaudit_pipeline.kernel_spec import Ptr, Reference, Shape, Tolerance

NAME = "bias_gelu_gemm"
DTYPE = "bf16"
BASELINE_NAME = 'F.gelu(F.linear(x, W, b), approximate="tanh") (cuBLAS addmm + GELU, unfused)'


# --------------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------------
@triton.jit
def bias_gelu_gemm_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr,
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

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_remaining = K - k * BLOCK_K
        x = tl.load(x_ptrs, mask=offs_k[None, :] < k_remaining, other=0.0)
        w = tl.load(w_ptrs, mask=offs_k[:, None] < k_remaining, other=0.0)
        acc = tl.dot(x, w, acc)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk

    # Epilogue in fp32: the bias row (one load per tile, wrapped like the W columns), then
    # GELU, then one rounding to the output type.
    bias = tl.load(b_ptr + offs_wn).to(tl.float32)
    z = acc + bias[None, :]
    # gelu_tanh(z) = 0.5 z (1 + tanh(u)) = z * sigmoid(2u), u = sqrt(2/pi) (z + 0.044715 z^3);
    # 1.5957691216057308 = 2 * sqrt(2 / pi).
    two_u = 1.5957691216057308 * (z + 0.044715 * z * z * z)
    h = z * tl.sigmoid(two_u)

    out = h.to(out_ptr.dtype.element_ty)
    offs_om = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_on = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    out_ptrs = out_ptr + stride_om * offs_om[:, None] + stride_on * offs_on[None, :]
    out_mask = (offs_om[:, None] < M) & (offs_on[None, :] < N)
    tl.store(out_ptrs, out, mask=out_mask)


KERNEL = bias_gelu_gemm_kernel


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
    x, w, b = inputs["x"], inputs["w"], inputs["b"]
    M, K = x.shape
    N = w.shape[0]
    if w.shape[1] != K or tuple(b.shape) != (N,) or b.stride() != (1,):
        raise ValueError(f"x {tuple(x.shape)}, W {tuple(w.shape)} and b {tuple(b.shape)} "
                         f"do not chain (W is (N, K), b a contiguous (N,))")
    if out is None:
        out = torch.empty((M, N), device=x.device, dtype=x.dtype)
    return {
        "x_ptr": x, "w_ptr": w, "b_ptr": b, "out_ptr": out,
        "M": M, "N": N, "K": K,
        "stride_xm": x.stride(0), "stride_xk": x.stride(1),
        "stride_wn": w.stride(0), "stride_wk": w.stride(1),
        "stride_om": out.stride(0), "stride_on": out.stride(1),
        **{k: config[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")},
    }


def launch(inputs: dict, config: dict, out: torch.Tensor | None = None) -> torch.Tensor:
    args = kernel_args(inputs, config, out)
    bias_gelu_gemm_kernel[_grid(args["M"], args["N"], config)](
        **args, num_warps=config["num_warps"], num_stages=config["num_stages"])
    return args["out_ptr"]


# --------------------------------------------------------------------------------------------
# Inputs, baseline, reference
# --------------------------------------------------------------------------------------------
def make_inputs(shape: Shape, device: str, seed: int,
                dtype: torch.dtype = torch.bfloat16) -> dict:
    """x ~ N(0, 1), W ~ N(0, 1/K) in nn.Linear's (N, K) layout and b ~ N(0, 1/4), so the
    pre-activation is ~N(0, 1.25) whatever K is: it spans GELU's curved region (roughly -3 to
    3), and the bias moves every output by a visible amount, so a kernel that dropped or
    misplaced it would fail the tolerance.

    ``dtype`` exists for the CPU interpreter, which cannot multiply bf16 (it dots the raw bit
    patterns, triton-lang/triton#11584): the numerics tests run the same kernel on fp16, and on
    fp32 to check the GELU itself more tightly than a 16-bit output can.
    """
    M, N, K = shape["M"], shape["N"], shape["K"]
    if torch.device(device).type == "meta":
        return {"x": torch.empty((M, K), device="meta", dtype=dtype),
                "w": torch.empty((N, K), device="meta", dtype=dtype),
                "b": torch.empty((N,), device="meta", dtype=dtype)}
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn((M, K), generator=gen, device=device).to(dtype)
    w = (torch.randn((N, K), generator=gen, device=device) * K ** -0.5).to(dtype)
    b = (torch.randn((N,), generator=gen, device=device) * 0.5).to(dtype)
    return {"x": x, "w": w, "b": b}


def baseline(inputs: dict) -> torch.Tensor:
    """What StarCoder2's eager PyTorch MLP runs: nn.Linear (addmm: x @ W^T + b, cuBLAS), which
    writes the pre-activation, then GELU (tanh) as an elementwise kernel that reads it back."""
    return F.gelu(F.linear(inputs["x"], inputs["w"], inputs["b"]), approximate="tanh")


def reference(inputs: dict) -> torch.Tensor:
    """The same composition in fp32."""
    z = F.linear(inputs["x"].float(), inputs["w"].float(), inputs["b"].float())
    return F.gelu(z, approximate="tanh")


# The GEMM's tolerance: fp32 sums and epilogue, one bf16 rounding of the output. The baseline
# rounds twice (the pre-activation, then the GELU output), which stays well inside it.
TOLERANCE = Tolerance(max_rel_l2=1e-2, atol=2e-2, rtol=2e-2)

# The one reference the runner times every config against: the unfused eager layer. The
# runner profiles it and records which kernels actually ran (cuBLAS or cuBLASLt for the
# addmm, PyTorch's elementwise GELU).
REFERENCES = [Reference(key=None, name=BASELINE_NAME,
                        backend="cuBLAS (addmm) + PyTorch elementwise GELU",
                        fn=baseline, tolerance=TOLERANCE)]


# --------------------------------------------------------------------------------------------
# Roofline model and the static audit's view
# --------------------------------------------------------------------------------------------
def flops(shape: Shape) -> int:
    """The product, 2 * K per output element; the epilogue's bias add and GELU (about a dozen
    operations per output element against 2 * K = 12,288 for the product) are left out,
    about 0.1 % at K = 6144."""
    return 2 * shape["M"] * shape["N"] * shape["K"]


def bytes_moved(shape: Shape) -> int:
    """x, W and b read once, the output written once, all bf16. The pre-activation never
    reaches memory (the baseline writes and reads it: 4 * M * N bytes more)."""
    M, N, K = shape["M"], shape["N"], shape["K"]
    return 2 * (M * K + N * K + N + M * N)


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
    """Bytes of the pipelined x and W tiles (bf16)."""
    return stages * (bm + bn) * bk * 2


SMEM_CAP = 256 * 1024  # a little over the 227 KiB opt-in limit, so some configs exceed it
K_STAGES = {32: (3, 4), 64: (2, 3, 4, 5), 128: (2, 3, 4), 256: (2, 3)}
BASE_GROUP_M = 8  # the Triton matmul tutorial's default
GROUP_MS = (1, 8, 16, 32, 64)


def _space() -> list[dict]:
    """A Triton-autotune / vLLM-benchmark style sweep (BLOCK_M 16..256, BLOCK_N 32..256,
    BLOCK_K 32..256, GROUP_M 1/8/16/32/64, 4 and 8 warps, 2 to 5 stages), subsampled:

    - every tile except 256 x 256 (its fp32 accumulator alone is 256 registers per thread on 8
      warps); 128 x 256 and 256 x 128 on 4 warps spill;
    - BLOCK_K 32 with 3 or 4 stages, 64 with 2 to 5, 128 with 2 to 4, 256 with 2 or 3, and no
      pipeline over SMEM_CAP (``_smem``), which leaves some over the opt-in limit;
    - 4 and 8 warps on every tile;
    - GROUP_M 8 on all of the above (at M = 16 there is one tile-row, and it changes nothing);
    - and a GROUP_M sweep: the other four of 1/8/16/32/64 on every tile 64 to 256 wide (every
      BLOCK_M, 256 x 256 still left out) at BLOCK_K 64 and 3 stages, 4 warps up to 32 rows and
      8 from 64. GROUP_M 1 is the plain row-major order, in which each tile-row streams the
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
                if group_m != BASE_GROUP_M and _smem(bm, bn, 64, 3) <= SMEM_CAP:
                    configs.append(_cfg(bm, bn, 64, group_m, 4 if bm <= 32 else 8, 3))
    return configs


CONFIGS: list[dict] = _space()

_N, _K = 24576 // 2, 6144  # c_fc's output features on one of 2 tensor-parallel ranks, hidden
SHAPES: list[Shape] = [
    Shape(f"starcoder2_15b_tp2_fc1_m{m}", {"M": m, "N": _N, "K": _K},
          label=f"starcoder2-15b MLP c_fc + bias + gelu_tanh, TP2 (K,N)=({_K},{_N}) "
                f"M={m} tokens ({phase})",
          phase=phase)
    for m, phase in ((16, "decode"), (128, "decode"), (1024, "prefill"), (4096, "prefill"))
]
