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
# every reference of the 2026-12-04 main capture under torch.profiler, kernels attributed per range
REF_KERNELS = REPO / "samples" / "h200" / "references_trace.kernels.json"


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


@pytest.mark.skipif(not REF_KERNELS.exists(), reason="committed references listing not present")
def test_every_reference_of_the_h200_capture_is_named_by_what_ran():
    """The 2026-12-04 listing: row-wise ``_scaled_mm`` ran cuBLASLt's nvjet kernel (no CUTLASS
    anywhere), the gather + SDPA composition names both of its libraries, FlashInfer its own."""
    listing = json.loads(REF_KERNELS.read_text())
    ran = {label: classify_kernels(v["kernels"]) for label, v in listing.items()}
    fp8 = "kernaudit:fused_fp8_gemm:square_8192:"
    assert ran[fp8 + "baseline"] == ran[fp8 + "baseline[scaled_mm_rowwise]"] == "cuBLAS (nvjet)"
    assert "ovscale" in listing[fp8 + "baseline[scaled_mm_rowwise]"]["kernels"][0][0]
    assert not any("cutlass" in (r or "").lower() for r in ran.values())
    decode = "kernaudit:paged_decode_attention:decode_b8_ctx2k_8k:"
    assert ran[decode + "baseline"] == "cuDNN + PyTorch (ATen)"  # the gather takes ~40 % of the time
    assert ran[decode + "baseline[flashinfer]"] == "FlashInfer"
    attn = "kernaudit:flash_attention_fwd:b4_h32_kv8_s4096_d128:"
    assert ran[attn + "baseline"] == ran[attn + "baseline[sdpa_cudnn]"] == "cuDNN"
    assert ran[attn + "baseline[sdpa_flash]"] == "FlashAttention-2 (SDPA FLASH)"
    # what the runner wrote into the committed capture agrees with the listing
    rows = [json.loads(line) for line in (REPO / "samples" / "h200" / "bench_h200.jsonl").read_text().splitlines()]
    base = {(r["kernel_name"], r["shape_name"], r.get("baseline_variant")): r["baseline_backend"]
            for r in rows if r.get("record_type") == "baseline" and r.get("run_status") == "OK"}
    assert base[("fused_fp8_gemm", "square_8192", "scaled_mm_rowwise")] == "cuBLAS (nvjet)"
    assert base[("paged_decode_attention", "decode_b8_ctx2k_8k", None)] == ran[decode + "baseline"]
    assert not any("cutlass" in str(v).lower() or str(v).startswith("void ") for v in base.values())


def test_composite_references_name_every_library_with_a_real_share():
    gather = "void at::native::vectorized_gather_kernel<16, long>(char*, char*, long*, int, long)"
    cudnn = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128"
    assert classify_kernels([(gather, 500.0), (cudnn, 300.0)]) == "PyTorch (ATen) + cuDNN"
    assert classify_kernels([(gather, 5.0), (cudnn, 300.0)]) == "cuDNN"  # under 10 %: not named
    # driver fills beside a GEMM are no library, however long
    assert classify_kernels([("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", 10.0),
                             ("Memset (Device)", 30.0)]) == "cuBLAS (nvjet)"
    assert classify_kernels([("Memset (Device)", 3.0)]) is None


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
