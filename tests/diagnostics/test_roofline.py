"""Roofline classification on ANCHORS.md's H200 measurements."""

from __future__ import annotations

import pytest

from kernaudit_pipeline.core.hardware import lookup
from kernaudit_pipeline.spill_diagnostics.roofline import Bottleneck, MeasuredPeak, SolSource, peak_from_record, roofline

H200 = lookup("NVIDIA H200")


def gemm(m, n, k, elem=2):
    return 2 * m * n * k, elem * (m * k + k * n) + 2 * m * n


def test_cublas_8192_cubed_is_compute_bound_against_the_dense_peak():
    flops, nbytes = gemm(8192, 8192, 8192)
    p = roofline(flops=flops, bytes_moved=nbytes, latency_us=1569.0, dtype="bf16", spec=H200,
                 device_name="NVIDIA H200", grid_size=4096)
    assert p.achieved_tflops == pytest.approx(700.8, rel=1e-3)  # ANCHORS: 701 TFLOP/s
    assert p.compute_sol_pct == pytest.approx(100 * 700.8 / 989.4, rel=1e-3)
    assert p.arithmetic_intensity == pytest.approx(flops / nbytes)
    assert p.bottleneck is Bottleneck.COMPUTE and p.sol_source is SolSource.MODEL
    assert p.headroom_pct == pytest.approx(100 - p.efficiency_pct) and not p.at_roofline
    assert p.ceilings.compute_source == "spec:H200-SXM-141GB"


def test_measured_ceiling_wins_over_the_datasheet():
    flops, nbytes = gemm(8192, 8192, 8192)
    peak = MeasuredPeak("bf16_matmul_8192", "NVIDIA H200", "bf16", tflops=701.0)
    p = roofline(flops=flops, bytes_moved=nbytes, latency_us=1569.0, dtype="bf16", spec=H200,
                 peaks=[peak], device_name="NVIDIA H200")
    assert p.ceilings.compute_source == "measured:bf16_matmul_8192"
    assert p.compute_sol_pct == pytest.approx(99.97, abs=0.05) and p.at_roofline
    other_device = MeasuredPeak("bf16_matmul_8192", "NVIDIA H100 80GB HBM3", "bf16", tflops=650.0)
    assert roofline(flops=flops, latency_us=1569.0, dtype="bf16", spec=H200, peaks=[other_device],
                    device_name="NVIDIA H200").ceilings.compute_source.startswith("spec:")


def test_decode_gemm_is_memory_bound():
    flops, nbytes = gemm(16, 28672, 4096)
    p = roofline(flops=flops, bytes_moved=nbytes, latency_us=68.5, dtype="bf16", spec=H200, grid_size=448)
    assert p.achieved_gbps == pytest.approx(3440, rel=0.01)  # ANCHORS: about 3.4 TB/s of weights
    assert p.bottleneck is Bottleneck.MEMORY and p.memory_sol_pct > p.compute_sol_pct


def test_fp8_is_measured_against_the_fp8_peak():
    flops, nbytes = gemm(8192, 8192, 8192, elem=1)
    p = roofline(flops=flops, bytes_moved=nbytes, latency_us=866.0, dtype="fp8e4m3", spec=H200)
    assert p.achieved_tflops == pytest.approx(1270, rel=0.01)
    assert p.compute_sol_pct == pytest.approx(100 * 1270 / 1978.9, rel=0.01)  # not 128 % of bf16


def test_ncu_sol_is_preferred_when_present():
    # ncu on the H200, 128x256x64 w8 GEMM: SM 70.7 %, memory 50.6 %
    p = roofline(flops=1.0, bytes_moved=1.0, latency_us=25.9, spec=H200, sm_throughput_pct=70.69,
                 memory_throughput_pct=50.60, grid_size=128)
    assert p.sol_source is SolSource.NCU and p.bottleneck is Bottleneck.COMPUTE
    assert p.efficiency_pct == pytest.approx(70.69) and p.headroom_pct == pytest.approx(29.31)


@pytest.mark.parametrize("grid, latency, expected", [
    (4096, 400.0, Bottleneck.UNDERUTILIZED),
    (64, 400.0, Bottleneck.LATENCY),  # fewer blocks than half the 132 SMs
    (4096, 3.0, Bottleneck.LATENCY),  # shorter than 5 us
])
def test_low_sol_is_latency_or_underutilized(grid, latency, expected):
    p = roofline(latency_us=latency, spec=H200, sm_throughput_pct=11.2, memory_throughput_pct=49.0, grid_size=grid)
    assert p.bottleneck is expected


def test_unknown_gpu_still_gives_what_needs_no_spec():
    flops, nbytes = gemm(4096, 4096, 4096)
    p = roofline(flops=flops, bytes_moved=nbytes, latency_us=200.0, dtype="bf16", spec=lookup("Mystery GPU"),
                 device_name="Mystery GPU")
    assert p.achieved_tflops == pytest.approx(flops / 200e-6 / 1e12)
    assert p.compute_sol_pct is None and p.bottleneck is None and "unknown GPU" in p.note
    with_ncu = roofline(latency_us=200.0, device_name="Mystery GPU", sm_throughput_pct=80.0, memory_throughput_pct=20.0)
    assert with_ncu.bottleneck is Bottleneck.COMPUTE


def test_peak_records_from_the_runner():
    p = peak_from_record({"record_type": "peak", "peak_name": "cublas_bf16_8192", "peak_tflops": 701.0,
                          "device_name": "NVIDIA H200"})
    assert p.dtype == "bf16" and p.tflops == 701.0
    bw = peak_from_record({"peak_name": "d2d_copy_2GiB", "peak_gb_per_s": 4240.0})
    assert bw.gb_per_s == 4240.0 and bw.dtype is None
    assert peak_from_record({"peak_name": "x"}) is None
