"""Which library ran: kernel names from a recorded H200 torch.profiler trace, and the
``REFERENCES`` contract of the kernel modules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernaudit_pipeline.bench.references import classify_kernels, references_of
from kernaudit_pipeline.kernel_spec import kernel_files, load_kernel_module

REPO = Path(__file__).resolve().parents[2]
TRACE = REPO / "samples" / "h200" / "torch_trace.json"


def _trace_kernels() -> dict[str, float]:
    totals: dict[str, float] = {}
    for e in json.loads(TRACE.read_text())["traceEvents"]:
        if e.get("cat") == "kernel":
            totals[e["name"]] = totals.get(e["name"], 0.0) + float(e.get("dur", 0.0))
    return totals


@pytest.mark.skipif(not TRACE.exists(), reason="committed H200 trace not present")
def test_recorded_h200_kernel_names_are_classified():
    names = _trace_kernels()
    by_prefix = {n.split("_")[0]: n for n in names}
    cudnn = next(n for n in names if n.startswith("cudnn_generated"))
    assert classify_kernels([(cudnn, 1.0)]) == "cuDNN"
    nvjet = [n for n in names if n.startswith("nvjet")]
    assert nvjet and all(classify_kernels([(n, 1.0)]) == "cuBLAS (nvjet)" for n in nvjet)
    # a name no library claims (here the Triton GEMM's own) is reported as it is
    assert classify_kernels([(by_prefix["gemm"], 1.0)]) == by_prefix["gemm"]
    # the largest kernel decides: a gather plus SDPA is attention, not the gather
    gather = next(n for n in names if "gather" in n)
    assert classify_kernels([(gather, 10.0), (cudnn, 900.0)]) == "cuDNN"


def test_classify_known_libraries_and_unknown_names():
    assert classify_kernels([("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>", 5.0)]) \
        == "FlashAttention-2 (SDPA FLASH)"
    assert classify_kernels([("void fbgemm_gpu::f8f8bf16_rowwise_impl<...>", 5.0)]) == "CUTLASS (f8f8bf16_rowwise)"
    assert classify_kernels([("BatchDecodeWithPagedKVCacheKernel<...>", 5.0)]) == "FlashInfer"
    assert classify_kernels([("my_custom_kernel", 1.0)]) == "my_custom_kernel"
    assert classify_kernels([]) is None


@pytest.mark.parametrize("path", kernel_files(), ids=[p.stem for p in kernel_files()])
def test_every_kernel_declares_a_primary_reference_first(path):
    refs = references_of(load_kernel_module(path))
    assert refs[0].key is None and all(r.key for r in refs[1:])
    assert len({r.key for r in refs}) == len(refs)
    assert all(r.tolerance.max_rel_l2 > 0 and r.name for r in refs)


def test_references_contract_is_enforced():
    import types

    from kernaudit_pipeline.kernel_spec import Reference, Tolerance

    tol = Tolerance(1e-2)
    mod = types.SimpleNamespace(NAME="m", BASELINE_NAME="b", baseline=lambda x: x, TOLERANCE=tol,
                                REFERENCES=[Reference("a", "a", None, lambda x: x, tol)])
    with pytest.raises(ValueError, match="exactly one primary"):
        references_of(mod)
    mod.REFERENCES = [Reference(None, "p", None, lambda x: x, tol), Reference("a", "a", None, lambda x: x, tol),
                      Reference("a", "b", None, lambda x: x, tol)]
    with pytest.raises(ValueError, match="duplicate"):
        references_of(mod)


@pytest.mark.skipif(not TRACE.exists(), reason="committed H200 trace not present")
def test_kernels_are_attributed_to_their_profiler_ranges():
    """The committed trace's baseline ranges: cuBLAS for both GEMM references (row-wise fp8
    ``_scaled_mm`` ran cuBLASLt's outer-vector-scaled nvjet kernel with torch 2.11 + CUDA 13.0,
    not a CUTLASS one), cuDNN for SDPA's default dispatch."""
    from kernaudit_pipeline.bench.capture import _kernels_by_range

    ranges = _kernels_by_range(json.loads(TRACE.read_text()))
    ran = {name.split(":")[1]: classify_kernels(k) for name, k in ranges.items() if name.endswith(":baseline")}
    assert ran["gemm_bf16"] == ran["fused_fp8_gemm"] == "cuBLAS (nvjet)"
    assert ran["flash_attention_fwd"] == "cuDNN"
    fp8 = next(k for name, k in ranges.items() if name.startswith("kernaudit:fused_fp8_gemm") and name.endswith("baseline"))
    assert "ovscale" in fp8[0][0]
    assert any(name.endswith("BK64_BM128_BN256_GM8_s3_w8") and k[0][0] == "gemm_kernel" for name, k in ranges.items())
