"""The GPU spec table: read-only, dense peaks, lookups by torch's and ncu's device names."""

from __future__ import annotations

import dataclasses

import pytest

from kernaudit_pipeline.core.hardware import (
    SPECS, Vendor, canonical_dtype, lookup, resources_for, sm_resources, vendor_of,
)


@pytest.mark.parametrize("name, key", [
    ("NVIDIA H200", "H200-SXM-141GB"),  # torch.cuda.get_device_name and ncu's display name
    ("NVIDIA H100 80GB HBM3", "H100-SXM5-80GB"),
    ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA B200", "B200"),
    ("h200-sxm-141gb", "H200-SXM-141GB"),
    ("Tesla V100-SXM2-16GB", "V100-SXM2"),  # torch.profiler's deviceProperties names
    ("Tesla V100-DGXS-32GB", "V100-SXM2"),
    ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"),
    ("NVIDIA A10", "A10"),
    ("NVIDIA L40", "L40"),
    ("NVIDIA H100 PCIe", "H100-PCIe-80GB"),
    ("NVIDIA GeForce RTX 5090", "RTX-5090"),
])
def test_lookup_by_device_names(name, key):
    spec = lookup(name)
    assert spec is not None and spec.name == key


@pytest.mark.parametrize("name", ["NVIDIA H100 NVL", "NVIDIA GeForce RTX 4090", "NVIDIA A100-PG509-200",
                                  "AMD Radeon Graphics", "", None, float("nan")])
def test_unknown_gpus_are_none(name):
    assert lookup(name) is None


def test_table_is_read_only():
    with pytest.raises(TypeError):
        SPECS["X"] = SPECS["L40S"]  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        SPECS["L40S"].sm_count = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        SPECS["L40S"].peak_tflops["bf16"] = 1.0  # type: ignore[index]


def test_required_gpus_and_fields():
    assert {"V100-SXM2", "A100-SXM4-80GB", "A10", "L40", "H100-SXM5-80GB", "H200-SXM-141GB", "L40S", "B200",
            "RTX-5090"} <= set(SPECS)
    ccs = {spec.compute_capability for spec in SPECS.values()}
    assert {"7.0", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0"} <= ccs
    for spec in SPECS.values():
        assert spec.sm_count > 0 and spec.l2_bytes > 0 and spec.mem_bandwidth_bytes_per_s > 1e11
        assert spec.regs_per_sm == 65_536 and spec.max_regs_per_thread == 255
        assert spec.sm.reg_alloc_unit == 256
        ampere_or_later = float(spec.compute_capability) >= 8.0
        # the 1 KiB per-block driver reserve and 128-byte granules start with CC 8.0
        assert spec.sm.smem_reserved_per_block_bytes == (1024 if ampere_or_later else 0)
        assert spec.sm.smem_alloc_granule_bytes == (128 if ampere_or_later else 256)
        assert spec.smem_per_block_optin_bytes <= spec.smem_per_sm_bytes
        assert "fp32" in spec.peak_tflops
        if spec.compute_capability in ("8.0", "8.6", "8.9", "9.0", "10.0"):
            assert {"bf16", "fp16", "tf32", "fp32"} <= set(spec.peak_tflops)
    assert set(lookup("Tesla V100-SXM2-32GB").peak_tflops) == {"fp16", "fp32"}  # Volta: no bf16/tf32/fp8


def test_peaks_are_dense_not_sparse():
    h200, h100 = lookup("NVIDIA H200"), lookup("NVIDIA H100 80GB HBM3")
    assert h200.peak_tflops_for("bf16") == pytest.approx(989, rel=0.01)
    assert h200.peak_tflops_for("fp8e4m3") == pytest.approx(1979, rel=0.01)
    assert h100.peak_tflops_for("fp16") == pytest.approx(989, rel=0.01)  # not the 1,979 sparse figure
    # the measured cuBLAS rate (ANCHORS: 701 TFLOP/s bf16) must sit under the dense peak
    assert 701 < h200.peak_tflops_for("bf16")
    assert lookup("NVIDIA A100-SXM4-80GB").peak_tflops_for("fp8") is None  # no fp8 on Ampere
    # int8 tensor cores: the same dense rate as fp8 on Hopper, twice bf16 on Ampere (datasheets'
    # sparse TOPS halved); a kernel on int8 operands is held to this ceiling, not to bf16's
    assert h200.peak_tflops_for("torch.int8") == pytest.approx(1979, rel=0.01)
    assert h100.peak_tflops_for("s8") == h100.peak_tflops_for("fp8")
    assert lookup("NVIDIA A100-SXM4-80GB").peak_tflops_for("int8") == pytest.approx(624)
    assert lookup("NVIDIA B200").peak_tflops_for("int8") is None  # not checked: left out
    assert lookup("Tesla V100-SXM2-32GB").peak_tflops_for("int8") is None
    assert h200.smem_per_sm_bytes == 233_472 and h200.smem_per_block_optin_bytes == 232_448
    assert h200.sm_count == 132 and h200.l2_bytes == 62_914_560  # ncu device attributes on the H200


def test_sm_resources_by_compute_capability():
    assert sm_resources("sm_90a").max_blocks_per_sm == 32
    assert sm_resources("90") is sm_resources("9.0") is sm_resources(9.0)
    assert sm_resources("8.9").max_warps_per_sm == 48
    assert sm_resources("6.0") is None and sm_resources(None) is None
    assert sm_resources("7.0").smem_per_sm_bytes == 96 * 1024 and sm_resources("7.5").max_warps_per_sm == 32
    assert sm_resources("8.6").max_blocks_per_sm == 16 and sm_resources("12.0").smem_per_block_optin_bytes == 99 * 1024
    assert resources_for("NVIDIA L40S", "9.0").compute_capability == "8.9"  # the device wins
    assert resources_for("unknown card", "9.0").compute_capability == "9.0"
    assert canonical_dtype("fp8e4nv") == "fp8" and canonical_dtype("int4") is None
    assert canonical_dtype("INT8") == canonical_dtype("i8") == "int8" and canonical_dtype("uint8") is None


@pytest.mark.parametrize("name, arch, backend, vendor", [
    ("AMD Radeon Graphics", None, None, Vendor.AMD),  # a ROCm torch.profiler trace of an MI250
    ("AMD Instinct MI300X", None, None, Vendor.AMD),
    (None, "gfx90a", None, Vendor.AMD),  # Proton's HIP metadata
    (None, None, "HIP", Vendor.AMD),
    ("Tesla V100-SXM2-16GB", None, None, Vendor.NVIDIA),
    ("NVIDIA A100-PG509-200", None, None, Vendor.NVIDIA),
    (None, "90", "CUDA", Vendor.NVIDIA),
    (None, None, None, Vendor.UNKNOWN),
])
def test_vendor_of(name, arch, backend, vendor):
    assert vendor_of(name, arch, backend) is vendor


def test_amd_rows_get_no_nvidia_resources():
    # torch.profiler on ROCm writes computeMajor 9 / computeMinor 0 for an MI250 (a gfx9 part)
    assert resources_for("AMD Radeon Graphics", "9.0") is None
    assert resources_for(None, "9.0", vendor="amd") is None
    assert resources_for(None, "9.0", vendor="nvidia").compute_capability == "9.0"
