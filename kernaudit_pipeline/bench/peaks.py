"""Measured ceilings, taken in the same run as the kernels they judge.

Datasheet rates are leads (METHOD.md); the roofline and "% of peak" use these instead:
a device-to-device copy (bytes read + written), cuBLAS bf16 ``a @ b`` at 8192^3 on random
data, and ``torch._scaled_mm`` in fp8 e4m3 at 8192^3. Each is timed with the runner's method
(L2 flush, CUDA events, the same stopping rule, the clock guard). torch only; runs in a
worker process.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

from kernaudit_pipeline.bench import stats
from kernaudit_pipeline.bench.correctness import first_line
from kernaudit_pipeline.bench.timing import time_single

COPY_BYTES = 2 * 1024**3  # 2 GiB, well past the 60 MB L2 (ANCHORS: 4.24 TB/s)
MATMUL_N = 8192


@dataclass(frozen=True)
class PeakRecord:
    record_type: str
    peak_name: str
    what: str
    peak_tflops: float | None
    peak_gb_per_s: float | None
    flops: float | None
    bytes_moved: float | None
    latency_us: float | None
    latency_p10_us: float | None
    latency_p90_us: float | None
    latency_ci_low_us: float | None
    latency_ci_high_us: float | None
    latency_samples: int | None
    samples_us: list[float] | None
    stop_reason: str | None
    sm_clock_mhz: float | None
    run_status: str
    run_message: str | None
    timing_s: float | None
    device_name: str | None
    compute_capability: str | None
    driver_version: str | None
    torch_version: str | None
    triton_version: str | None
    cuda_version: str | None


def _record(name: str, what: str, dev, timing, flops: float | None, nbytes: float | None,
            status: str = "OK", message: str | None = None) -> PeakRecord:
    dev_fields = {k: v for k, v in asdict(dev).items()
                  if k in ("device_name", "compute_capability", "driver_version",
                           "torch_version", "triton_version", "cuda_version")}
    if timing is None:
        return PeakRecord("peak", name, what, None, None, flops, nbytes, None, None, None, None,
                          None, None, None, None, None, status, message, None, **dev_fields)
    s = timing.summary
    seconds = s.median_us * 1e-6
    return PeakRecord(
        record_type="peak", peak_name=name, what=what,
        peak_tflops=(flops / seconds / 1e12) if flops else None,
        peak_gb_per_s=(nbytes / seconds / 1e9) if nbytes and not flops else None,
        flops=flops, bytes_moved=nbytes, latency_us=s.median_us, latency_p10_us=s.p10_us,
        latency_p90_us=s.p90_us, latency_ci_low_us=s.ci_low_us, latency_ci_high_us=s.ci_high_us,
        latency_samples=s.samples, samples_us=[round(x, 4) for x in timing.samples_us],
        stop_reason=timing.stop_reason, sm_clock_mhz=timing.sm_clock_mhz, run_status=status,
        run_message=message, timing_s=timing.timing_s, **dev_fields)


def measure_peaks(dev, backend, rule: stats.StopRule, mark: Callable[[str], None]) -> Iterator[PeakRecord]:
    import torch

    gen = torch.Generator(device="cuda").manual_seed(1234)

    def attempt(name: str, what: str, setup: Callable[[], Callable[[], object]],
                flops: float | None, nbytes: float | None) -> PeakRecord:
        mark(f"peak:{name}")
        t0 = time.perf_counter()
        try:
            fn = setup()
            timing = time_single(fn, backend, rule)
            return _record(name, what, dev, timing, flops, nbytes)
        except Exception as exc:  # e.g. no fp8 on this device: recorded, not fatal
            return _record(name, what, dev, None, flops, nbytes, status="ERROR",
                           message=f"{first_line(exc)} after {time.perf_counter() - t0:.1f} s")
        finally:
            torch.cuda.empty_cache()

    def copy_setup():
        src = torch.rand(COPY_BYTES // 4, device="cuda", generator=gen)
        dst = torch.empty_like(src)
        return lambda: dst.copy_(src)

    yield attempt("dram_copy_bandwidth", f"device-to-device copy of {COPY_BYTES} bytes "
                  "(bytes read + written)", copy_setup, None, 2.0 * COPY_BYTES)

    n = MATMUL_N

    def bf16_setup():
        a = torch.randn((n, n), device="cuda", generator=gen).to(torch.bfloat16)
        b = torch.randn((n, n), device="cuda", generator=gen).to(torch.bfloat16)
        c = torch.empty((n, n), device="cuda", dtype=torch.bfloat16)
        return lambda: torch.matmul(a, b, out=c)

    yield attempt("bf16_matmul_cublas", f"torch.matmul bf16 {n}x{n}x{n}, random data",
                  bf16_setup, 2.0 * n**3, 2.0 * 3 * n * n)

    def fp8_setup():
        a = torch.randn((n, n), device="cuda", generator=gen).to(torch.float8_e4m3fn)
        w = torch.randn((n, n), device="cuda", generator=gen).to(torch.float8_e4m3fn)
        one = torch.ones((), device="cuda", dtype=torch.float32)
        b = w.t()  # column-major, as _scaled_mm requires
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    yield attempt("fp8_scaled_mm", f"torch._scaled_mm fp8 e4m3 -> bf16 {n}x{n}x{n}, "
                  "tensor-wise scales, random data", fp8_setup, 2.0 * n**3, float(4 * n * n))
