"""Read-only GPU specification table: per-SM resources and DENSE peak rates.

Peaks are the vendors' dense figures (the datasheets print the 2:4-sparse
number first for tensor cores; those are halved here). SM resources are the
CUDA occupancy calculator's (``cuda_occupancy.h``) and the CUDA C
Programming Guide's "Technical Specifications per Compute Capability" table.
Where a figure was read off a real device by this project, the comment says
so. An unknown GPU is ``None``: callers say "unknown GPU" and still compute
everything that needs no spec.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Mapping

KIB = 1024
MB = 1_000_000


@dataclass(frozen=True)
class SMResources:
    """What one SM of a compute capability offers; all an occupancy calculation needs."""

    compute_capability: str
    regs_per_sm: int = 65_536
    regs_per_block: int = 65_536
    max_regs_per_thread: int = 255
    reg_alloc_unit: int = 256  # registers are allocated per warp in units of 256
    sub_partitions: int = 4  # register file split over 4 schedulers (SMSPs)
    warp_size: int = 32
    max_warps_per_sm: int = 64
    max_blocks_per_sm: int = 32
    max_threads_per_block: int = 1024
    smem_per_sm_bytes: int = 228 * KIB
    smem_per_block_optin_bytes: int = 227 * KIB
    smem_per_block_default_bytes: int = 48 * KIB
    smem_reserved_per_block_bytes: int = 1 * KIB  # the driver's reserve, CC >= 8.0
    smem_alloc_granule_bytes: int = 128
    # Shared-memory carveouts the driver may configure per SM (KiB), smallest first.
    smem_carveouts_kib: tuple[int, ...] = (0, 8, 16, 32, 64, 100, 132, 164, 196, 228)


# CUDA C Programming Guide (CUDA 12.8), "Technical Specifications per Compute Capability"
# (Table 23/24: resident blocks, warps, registers and shared memory per SM) and
# cuda_occupancy.h (CUDA 13.0, the allocation granules and carveouts):
# - CC 7.0 (V100): 64 warps, 32 blocks, 96 KB smem/SM, 96 KB opt-in per block, carveouts
#   0/8/16/32/64/96 KB, no per-block driver reserve (that starts with CC 8.0);
# - CC 7.5 (T4, RTX 20): 32 warps, 16 blocks, 64 KB smem/SM and opt-in, carveouts 0/32/64 KB;
# - CC 8.0 (A100): 64 warps, 32 blocks, 164 KB smem/SM, 163 KB opt-in;
# - CC 8.6 (A10, RTX 30) and 8.9 (L40, RTX 40): 48 warps, 16 (8.6) / 24 (8.9) blocks,
#   100 KB smem/SM, 99 KB opt-in;
# - CC 9.0 (H100, H200) and 10.0 (B200): 64 warps, 32 blocks, 228 KB smem/SM, 227 KB opt-in;
# - CC 12.0 (RTX 50, RTX PRO Blackwell): 48 warps, 32 blocks, 128 KB smem/SM, 99 KB opt-in.
# Every CC here: 65,536 registers per SM and per block, 255 per thread, 1,024 threads per block.
SM_RESOURCES: Mapping[str, SMResources] = MappingProxyType({
    "7.0": SMResources("7.0", smem_per_sm_bytes=96 * KIB, smem_per_block_optin_bytes=96 * KIB,
                       smem_reserved_per_block_bytes=0, smem_alloc_granule_bytes=256,
                       smem_carveouts_kib=(0, 8, 16, 32, 64, 96)),
    "7.5": SMResources("7.5", max_warps_per_sm=32, max_blocks_per_sm=16,
                       smem_per_sm_bytes=64 * KIB, smem_per_block_optin_bytes=64 * KIB,
                       smem_reserved_per_block_bytes=0, smem_alloc_granule_bytes=256,
                       smem_carveouts_kib=(0, 32, 64)),
    "8.0": SMResources("8.0", smem_per_sm_bytes=164 * KIB, smem_per_block_optin_bytes=163 * KIB,
                       smem_carveouts_kib=(0, 8, 16, 32, 64, 100, 132, 164)),
    "8.6": SMResources("8.6", max_warps_per_sm=48, max_blocks_per_sm=16,
                       smem_per_sm_bytes=100 * KIB, smem_per_block_optin_bytes=99 * KIB,
                       smem_carveouts_kib=(0, 8, 16, 32, 64, 100)),
    "8.9": SMResources("8.9", max_warps_per_sm=48, max_blocks_per_sm=24,
                       smem_per_sm_bytes=100 * KIB, smem_per_block_optin_bytes=99 * KIB,
                       smem_carveouts_kib=(0, 8, 16, 32, 64, 100)),
    # Read off an H200 by ncu 2025.3.1 (device__attribute_*): 65,536 registers, 64 warps,
    # 32 blocks, 233,472 B smem per SM, 232,448 B opt-in per block, 1,024 B driver reserve.
    "9.0": SMResources("9.0"),
    # A public ncu 2025 capture of a CUTLASS sm100 kernel shows "Shared Memory Configuration
    # Size" 233,472 B and "Driver Shared Memory Per Block" 1,024 B: the same as CC 9.0.
    "10.0": SMResources("10.0"),
    "12.0": SMResources("12.0", max_warps_per_sm=48, max_blocks_per_sm=32,
                        smem_per_sm_bytes=128 * KIB, smem_per_block_optin_bytes=99 * KIB,
                        smem_carveouts_kib=(0, 128)),  # the guide lists only the maximum
})


class Vendor(StrEnum):
    """Who made the GPU. Compute capabilities and the tables here are NVIDIA's only."""

    NVIDIA = "nvidia"
    AMD = "amd"
    UNKNOWN = "unknown"


_AMD_NAME = re.compile(r"\b(amd|radeon|instinct|mi\d{2,3}x?|gfx\d+[a-z]?)\b", re.IGNORECASE)
_NVIDIA_NAME = re.compile(r"\b(nvidia|tesla|geforce|quadro|rtx|titan|[abhlt]\d{1,3}|b200|gb200|gh200)\b",
                          re.IGNORECASE)


def vendor_of(device_name: object = None, arch: object = None, backend: object = None) -> Vendor:
    """The vendor from what a trace says: the backend (``CUDA``/``HIP``/``ROCm``), the arch
    (``gfx90a`` is AMD, ``sm_90``/``9.0`` NVIDIA) or the device name."""
    b = "" if backend is None else str(backend).strip().lower()
    if b in ("hip", "rocm", "amd"):
        return Vendor.AMD
    if b in ("cuda", "nvidia"):
        return Vendor.NVIDIA
    a = "" if arch is None else str(arch).strip().lower()
    if a.startswith("gfx"):
        return Vendor.AMD
    name = "" if device_name is None else str(device_name)
    if _AMD_NAME.search(name):
        return Vendor.AMD
    if _NVIDIA_NAME.search(name) or lookup(name) is not None:
        return Vendor.NVIDIA
    if a.startswith("sm_") or re.fullmatch(r"\d+(\.\d)?[af]?", a):
        return Vendor.NVIDIA
    return Vendor.UNKNOWN


class Dtype:
    """Canonical dtype names of the peak table."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    INT8 = "int8"  # integer tensor-core operands (int32 accumulate); the peak is in TOPS
    TF32 = "tf32"
    FP32 = "fp32"


_DTYPE_ALIASES = {
    "bf16": Dtype.BF16, "bfloat16": Dtype.BF16, "torch.bfloat16": Dtype.BF16,
    "fp16": Dtype.FP16, "float16": Dtype.FP16, "half": Dtype.FP16, "torch.float16": Dtype.FP16,
    "fp8": Dtype.FP8, "fp8e4m3": Dtype.FP8, "fp8e4nv": Dtype.FP8, "fp8e5": Dtype.FP8,
    "fp8e5m2": Dtype.FP8, "float8_e4m3fn": Dtype.FP8, "float8_e5m2": Dtype.FP8,
    "e4m3": Dtype.FP8, "e5m2": Dtype.FP8, "torch.float8_e4m3fn": Dtype.FP8,
    "int8": Dtype.INT8, "i8": Dtype.INT8, "s8": Dtype.INT8, "torch.int8": Dtype.INT8,
    "tf32": Dtype.TF32, "fp32": Dtype.FP32, "float32": Dtype.FP32, "float": Dtype.FP32,
    "torch.float32": Dtype.FP32,
}


def canonical_dtype(dtype: object) -> str | None:
    """``"fp8e4m3"`` -> ``"fp8"``; None for anything the peak table does not know."""
    if dtype is None:
        return None
    key = str(dtype).strip().lower()
    return _DTYPE_ALIASES.get(key)


@dataclass(frozen=True)
class GPUSpec:
    name: str
    compute_capability: str
    sm_count: int
    l2_bytes: int
    mem_bandwidth_bytes_per_s: float
    # Dense tensor-core peaks (fp32: the non-tensor FMA rate), TFLOP/s. A dtype the chip
    # has no tensor path for is absent (A100 has no fp8).
    peak_tflops: Mapping[str, float]
    aliases: tuple[str, ...] = ()

    @property
    def sm(self) -> SMResources:
        return SM_RESOURCES[self.compute_capability]

    # Flat accessors: the recommendation rules read these names.
    @property
    def regs_per_sm(self) -> int:
        return self.sm.regs_per_sm

    @property
    def max_regs_per_thread(self) -> int:
        return self.sm.max_regs_per_thread

    @property
    def max_warps_per_sm(self) -> int:
        return self.sm.max_warps_per_sm

    @property
    def max_blocks_per_sm(self) -> int:
        return self.sm.max_blocks_per_sm

    @property
    def smem_per_sm_bytes(self) -> int:
        return self.sm.smem_per_sm_bytes

    @property
    def smem_per_block_optin_bytes(self) -> int:
        return self.sm.smem_per_block_optin_bytes

    @property
    def smem_reserved_per_block_bytes(self) -> int:
        return self.sm.smem_reserved_per_block_bytes

    @property
    def mem_bandwidth_gb_per_s(self) -> float:
        return self.mem_bandwidth_bytes_per_s / 1e9

    def peak_tflops_for(self, dtype: object) -> float | None:
        key = canonical_dtype(dtype)
        return None if key is None else self.peak_tflops.get(key)


def _peaks(**kw: float) -> Mapping[str, float]:
    return MappingProxyType(dict(kw))


SPECS: Mapping[str, GPUSpec] = MappingProxyType({
    # NVIDIA Tesla V100 datasheet (SXM2): 125 TFLOPS tensor (fp16 in, fp32 accumulate; Volta
    # has no sparsity and no bf16/tf32/fp8), FP32 15.7 TFLOPS, HBM2 900 GB/s; 80 SMs and 6 MB
    # L2 (Volta whitepaper). The DGX Station's "V100-DGXS" is the same SXM2 part.
    "V100-SXM2": GPUSpec(
        "V100-SXM2", "7.0", sm_count=80, l2_bytes=6 * KIB * KIB,
        mem_bandwidth_bytes_per_s=900e9,
        peak_tflops=_peaks(fp16=125.0, fp32=15.7),
        aliases=("Tesla V100-SXM2-16GB", "Tesla V100-SXM2-32GB", "Tesla V100-DGXS-16GB",
                 "Tesla V100-DGXS-32GB", "V100-SXM2-16GB", "V100-SXM2-32GB")),
    # NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB): FP16/BF16 312 TFLOPS dense
    # (624 sparse), TF32 156 (312 sparse), FP32 19.5, HBM2e 2,039 GB/s; 40 MB L2, 108 SMs
    # (A100 whitepaper). INT8 tensor 624 TOPS dense (1,248 sparse). No fp8.
    "A100-SXM4-80GB": GPUSpec(
        "A100-SXM4-80GB", "8.0", sm_count=108, l2_bytes=40 * KIB * KIB,
        mem_bandwidth_bytes_per_s=2_039e9,
        peak_tflops=_peaks(bf16=312.0, fp16=312.0, int8=624.0, tf32=156.0, fp32=19.5),
        aliases=("NVIDIA A100-SXM4-80GB", "A100 SXM4 80GB", "A100-SXM-80GB")),
    # Same datasheet, SXM4 40GB: the same compute, HBM2 1,555 GB/s.
    "A100-SXM4-40GB": GPUSpec(
        "A100-SXM4-40GB", "8.0", sm_count=108, l2_bytes=40 * KIB * KIB,
        mem_bandwidth_bytes_per_s=1_555e9,
        peak_tflops=_peaks(bf16=312.0, fp16=312.0, int8=624.0, tf32=156.0, fp32=19.5),
        aliases=("NVIDIA A100-SXM4-40GB", "A100 SXM4 40GB", "A100-SXM-40GB")),
    # NVIDIA A10 datasheet: BF16/FP16 tensor 125 TFLOPS dense (250 sparse), TF32 62.5 dense,
    # INT8 250 TOPS dense (500 sparse), FP32 31.2, GDDR6 600 GB/s; GA102 with 72 SMs and 6 MB
    # L2 (Ampere GA102 whitepaper).
    "A10": GPUSpec(
        "A10", "8.6", sm_count=72, l2_bytes=6 * KIB * KIB,
        mem_bandwidth_bytes_per_s=600e9,
        peak_tflops=_peaks(bf16=125.0, fp16=125.0, int8=250.0, tf32=62.5, fp32=31.2),
        aliases=("NVIDIA A10",)),
    # NVIDIA L40 datasheet: BF16/FP16 181.05 TFLOPS dense (362.1 sparse), FP8 362 dense
    # (724 sparse), INT8 362 TOPS dense (724 sparse), TF32 90.5 dense, FP32 90.5, GDDR6
    # 864 GB/s; 142 SMs, 96 MB L2 (AD102).
    "L40": GPUSpec(
        "L40", "8.9", sm_count=142, l2_bytes=96 * KIB * KIB,
        mem_bandwidth_bytes_per_s=864e9,
        peak_tflops=_peaks(bf16=181.05, fp16=181.05, fp8=362.0, int8=362.0, tf32=90.5, fp32=90.5),
        aliases=("NVIDIA L40",)),
    # NVIDIA L40S datasheet: FP16/BF16 362.05 TFLOPS dense (733 sparse), FP8 733 dense
    # (1,466 sparse), INT8 733 TOPS dense (1,466 sparse), TF32 183 dense (366 sparse), FP32
    # 91.6; GDDR6 864 GB/s; 142 SMs; 96 MB L2 (Ada whitepaper, AD102).
    "L40S": GPUSpec(
        "L40S", "8.9", sm_count=142, l2_bytes=96 * KIB * KIB,
        mem_bandwidth_bytes_per_s=864e9,
        peak_tflops=_peaks(bf16=362.05, fp16=362.05, fp8=733.0, int8=733.0, tf32=183.0, fp32=91.6),
        aliases=("NVIDIA L40S",)),
    # NVIDIA H100 datasheet (SXM5): FP16/BF16 1,979 TFLOPS and FP8 3,958 "with sparsity",
    # so dense 989.4 and 1,978.9; INT8 3,958 TOPS sparse -> 1,978.9 dense; TF32 494.7 dense;
    # FP32 67; HBM3 3.35 TB/s; 50 MB L2 (H100 whitepaper), 132 SMs.
    "H100-SXM5-80GB": GPUSpec(
        "H100-SXM5-80GB", "9.0", sm_count=132, l2_bytes=50 * KIB * KIB,
        mem_bandwidth_bytes_per_s=3.35e12,
        peak_tflops=_peaks(bf16=989.4, fp16=989.4, fp8=1978.9, int8=1978.9, tf32=494.7, fp32=67.0),
        aliases=("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM5 80GB", "H100 SXM5", "H100-SXM")),
    # Same datasheet, H100 PCIe: BF16/FP16 1,513 and FP8 3,026 with sparsity -> 756.5 /
    # 1,513 dense, INT8 3,026 TOPS sparse -> 1,513 dense, TF32 378 dense, FP32 51, HBM2e
    # 2.0 TB/s; 114 SMs, 50 MB L2.
    "H100-PCIe-80GB": GPUSpec(
        "H100-PCIe-80GB", "9.0", sm_count=114, l2_bytes=50 * KIB * KIB,
        mem_bandwidth_bytes_per_s=2.0e12,
        peak_tflops=_peaks(bf16=756.5, fp16=756.5, fp8=1513.0, int8=1513.0, tf32=378.0, fp32=51.0),
        aliases=("NVIDIA H100 PCIe", "H100 PCIe")),
    # NVIDIA H200 datasheet (SXM): same GH100 compute as H100 SXM (BF16 1,979 / FP8 3,958
    # sparse -> 989 / 1,979 dense; INT8 3,958 TOPS sparse -> 1,979 dense), HBM3e 4.8 TB/s.
    # Read off this project's H200 by ncu 2025.3.1: 132 SMs, device__attribute_l2_cache_size
    # 62,914,560 B (60 MiB).
    "H200-SXM-141GB": GPUSpec(
        "H200-SXM-141GB", "9.0", sm_count=132, l2_bytes=60 * KIB * KIB,
        mem_bandwidth_bytes_per_s=4.8e12,
        peak_tflops=_peaks(bf16=989.4, fp16=989.4, fp8=1978.9, int8=1978.9, tf32=494.7, fp32=67.0),
        aliases=("NVIDIA H200", "NVIDIA H200 SXM 141GB", "H200 SXM", "H200")),
    # NVIDIA HGX B200 datasheet (per GPU): FP8 9 PFLOPS and FP16/BF16 4.5 PFLOPS with
    # sparsity -> 4,500 / 2,250 dense; TF32 2.2 PF sparse -> 1,100 dense; FP32 75 TFLOPS;
    # HBM3e 7.7 TB/s (HGX B200 figure). 148 SMs. L2 126 MB is the device-query figure
    # published for B200, not a datasheet line. INT8 is left out: not checked here.
    "B200": GPUSpec(
        "B200", "10.0", sm_count=148, l2_bytes=126 * KIB * KIB,
        mem_bandwidth_bytes_per_s=7.7e12,
        peak_tflops=_peaks(bf16=2250.0, fp16=2250.0, fp8=4500.0, tf32=1100.0, fp32=75.0),
        aliases=("NVIDIA B200",)),
    # GeForce RTX 5090 (GB202, compute capability 12.0), NVIDIA's product specifications:
    # 21,760 CUDA cores in 170 SMs, GDDR7 on a 512-bit bus at 28 Gbps = 1,792 GB/s, 96 MB L2.
    # FP32 is 21,760 x 2 x 2.41 GHz boost = 104.8 TFLOPS. Its tensor peaks with fp32
    # accumulate (what a Triton kernel uses) are not a datasheet line for GeForce parts, so
    # none are listed: the roofline uses ncu's SOL or the bandwidth ceiling only.
    "RTX-5090": GPUSpec(
        "RTX-5090", "12.0", sm_count=170, l2_bytes=96 * KIB * KIB,
        mem_bandwidth_bytes_per_s=1_792e9,
        peak_tflops=_peaks(fp32=104.8),
        aliases=("NVIDIA GeForce RTX 5090", "GeForce RTX 5090", "RTX 5090")),
})


def _norm(name: str) -> str:
    text = name.strip().lower().replace("_", " ").replace("-", " ")
    text = re.sub(r"\bnvidia\b", " ", text)
    return re.sub(r"\s+", " ", text).strip()


_INDEX: Mapping[str, str] = MappingProxyType({
    _norm(alias): key for key, spec in SPECS.items() for alias in (key, *spec.aliases)
})


def lookup(device_name: object) -> GPUSpec | None:
    """A spec by torch's device name, ncu's display name, or this table's key.

    Exact (normalized) names only: an H100 PCIe (114 SMs) must not pass for an H100 SXM.
    """
    if device_name is None:
        return None
    text = str(device_name)
    if not text.strip() or text.strip().lower() == "nan":
        return None
    key = _INDEX.get(_norm(text))
    return None if key is None else SPECS[key]


def sm_resources(compute_capability: object) -> SMResources | None:
    """Per-SM resources by compute capability ("9.0", "90", "sm_90a", 9.0)."""
    if compute_capability is None:
        return None
    text = str(compute_capability).strip().lower().removeprefix("sm_").rstrip("a").rstrip("f")
    if not text or text == "nan":
        return None
    if "." not in text and text.isdigit() and len(text) >= 2:
        text = f"{text[:-1]}.{text[-1]}"
    try:
        text = f"{float(text):.1f}"
    except ValueError:
        return None
    return SM_RESOURCES.get(text)


def resources_for(device_name: object = None, compute_capability: object = None,
                  vendor: object = None) -> SMResources | None:
    """SM resources from the device when known, else from the compute capability.

    None for a device that is not NVIDIA's (an AMD row's "9.0" from a ROCm trace is a gfx
    version, not a compute capability) or unknown to this table.
    """
    if vendor_of(device_name, backend=vendor) is Vendor.AMD or str(vendor or "").lower() == Vendor.AMD:
        return None
    spec = lookup(device_name)
    if spec is not None:
        return spec.sm
    return sm_resources(compute_capability)
