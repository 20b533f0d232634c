"""Timing on the device: L2 flush, CUDA events, paired blocks, CUDA graphs, the clock guard.

Every sample is one call bracketed by CUDA events, after zeroing a 256 MiB buffer to flush
the 60 MB L2 (``triton.testing.do_bench``'s practice). Two ways to time:

- :func:`time_single`: one function on its own until the RSD rule or the time cap (baseline
  rows, peaks, candidates with no usable reference);
- :class:`PairedSession`: a candidate against a reference in blocks of pairs, each pair in
  random order, with the clock read around each block (``bench/clocks.py``). The worker
  interleaves the sessions of every config of a shape, one block at a time.

``cuda_graph`` mode (opt-in, for kernels under ~20 µs where launch gaps dominate) captures
``GRAPH_CALLS`` calls into a CUDA graph; one sample is a replay divided by that count, the L2
flushed before each replay (so only its first call starts cold).

:class:`FakeCpuBackend` is the GPU's test double: the same worker code runs on the CPU with
wall-clock timing and no compile, so the supervisor, the crash handling and the pairing logic
are tested without a GPU. It is selected only by ``KERNAUDIT_BENCH_FAKE_DEVICE=cpu``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kernaudit_pipeline.bench import paired, stats
from kernaudit_pipeline.bench.clocks import BlockClocks, ClockGuard, ClockReader, clock_stats
from kernaudit_pipeline.bench.records import DeviceInfo, PairedTiming, StaticInfo, Timing
from kernaudit_pipeline.core.verdicts import TimingMode

L2_FLUSH_BYTES = 256 * 1024 * 1024  # do_bench's practice: zero 256 MiB before every sample
GRAPH_CALLS = 20


class CudaBackend:
    """The real device: CUDA events, a 256 MiB flush buffer, NVML clocks."""

    device = "cuda"

    def __init__(self, clock_fraction: float = 0.75):
        import torch

        self.torch = torch
        self.flush_buf = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        self.clock = ClockReader.open(uuid=str(getattr(props, "uuid", "") or "") or None,
                                      index=torch.cuda.current_device())
        self.guard = ClockGuard(self.clock.max_mhz if self.clock else None, clock_fraction)
        self.flush_us = self._flush_us()

    def _flush_us(self, repeats: int = 5) -> float:
        """What one L2 flush costs (it sits between the samples of a pair, outside the events)."""
        torch = self.torch
        times = []
        for _ in range(repeats):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            self.flush_buf.zero_()
            e.record()
            e.synchronize()
            times.append(1000.0 * s.elapsed_time(e))
        return float(np.median(times))

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def empty_cache(self) -> None:
        self.torch.cuda.empty_cache()

    def read_clock(self):
        return self.clock.read() if self.clock is not None else None

    def time_calls(self, fns: list[Callable[[], object]]) -> list[float]:
        """Each call after an L2 flush, bracketed by events; µs per call, one sync at the end."""
        torch = self.torch
        starts = [torch.cuda.Event(enable_timing=True) for _ in fns]
        ends = [torch.cuda.Event(enable_timing=True) for _ in fns]
        for fn, s, e in zip(fns, starts, ends):
            self.flush_buf.zero_()
            s.record()
            fn()
            e.record()
        ends[-1].synchronize()
        return [1000.0 * s.elapsed_time(e) for s, e in zip(starts, ends)]

    def graph(self, fn: Callable[[], object], calls: int = GRAPH_CALLS) -> Callable[[], object]:
        """``fn`` called ``calls`` times, captured once and replayed (warm-up on a side stream,
        as CUDA graph capture requires)."""
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(calls):
                fn()
        torch.cuda.synchronize()
        return g.replay

    def compile(self, mod, shape, config: dict, max_shared: int | None) -> tuple[StaticInfo, object]:
        from kernaudit_pipeline.bench.compile import compile_static

        return compile_static(mod, shape, config, max_shared)

    def jit_cache_size(self, kernel) -> int | None:
        from kernaudit_pipeline.bench.compile import jit_cache_size

        return jit_cache_size(kernel)

    def device_info(self, driver_version: str | None) -> DeviceInfo:
        import triton

        torch = self.torch
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        optin = getattr(props, "shared_memory_per_block_optin", None)
        return DeviceInfo(
            device_name=props.name, compute_capability=f"{props.major}.{props.minor}",
            sm_count=int(props.multi_processor_count),
            max_shared_mem_bytes=int(optin) if optin else None,
            driver_version=driver_version, cuda_version=torch.version.cuda,
            torch_version=torch.__version__, triton_version=triton.__version__)


class FakeCpuBackend:
    """The GPU's test double: synchronous CPU calls timed with ``perf_counter``.

    ``compile`` only calls the module's ``compile_args`` (so a module that hangs there hangs
    the worker, as on a GPU) and reports the resources a test module declares in
    ``FAKE_STATIC`` (config id -> StaticInfo fields)."""

    device = "cpu"
    flush_us = 0.0

    def __init__(self, clock_fraction: float = 0.75):
        self.clock = None
        self.guard = ClockGuard(None, clock_fraction)

    def sync(self) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def read_clock(self):
        return None

    def time_calls(self, fns: list[Callable[[], object]]) -> list[float]:
        out = []
        for fn in fns:
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e6)
        return out

    def graph(self, fn: Callable[[], object], calls: int = GRAPH_CALLS) -> Callable[[], object]:
        def replay():
            for _ in range(calls):
                fn()
        return replay

    def compile(self, mod, shape, config: dict, max_shared: int | None) -> tuple[StaticInfo, object]:
        from kernaudit_pipeline.core.configs import config_id

        t0 = time.perf_counter()
        mod.compile_args(shape, config)
        declared = dict(getattr(mod, "FAKE_STATIC", {}).get(config_id(config), {}))
        declared.setdefault("threads_per_block", int(config.get("num_warps", 4)) * 32)
        declared.setdefault("n_spills", 0)
        return StaticInfo(compile_s=time.perf_counter() - t0, **declared), None

    def jit_cache_size(self, kernel) -> int | None:
        return None

    def device_info(self, driver_version: str | None) -> DeviceInfo:
        import torch

        return DeviceInfo(device_name="fake-cpu (test double)", compute_capability=None,
                          sm_count=None, max_shared_mem_bytes=232448, driver_version=driver_version,
                          torch_version=torch.__version__)


def make_backend(device: str, clock_fraction: float = 0.75):
    if device == "cuda":
        return CudaBackend(clock_fraction)
    if device == "cpu":
        return FakeCpuBackend(clock_fraction)
    raise ValueError(f"unknown bench device {device!r}")


@dataclass(frozen=True)
class Timed:
    """A callable prepared for timing: one sample is one call of ``fn`` divided by ``calls``."""

    fn: Callable[[], object]
    calls: int
    mode: TimingMode


def prepare_timed(fn: Callable[[], object], backend, use_graph: bool) -> Timed:
    if use_graph:
        return Timed(backend.graph(fn, GRAPH_CALLS), GRAPH_CALLS, TimingMode.CUDA_GRAPH)
    return Timed(fn, 1, TimingMode.EVENTS)


def estimate_us(fn: Callable[[], object], backend, calls: int = 3) -> float:
    """Median µs of a few flushed calls (after one unflushed call)."""
    fn()
    backend.sync()
    return float(np.median(backend.time_calls([fn] * calls)))


def time_single(fn: Callable[[], object], backend, rule: stats.StopRule, warmup_s: float = 0.02,
                timed: Timed | None = None) -> Timing:
    """Median-of-samples timing with an L2 flush before each sample and the clock guard."""
    timed = timed or Timed(fn, 1, TimingMode.EVENTS)
    run = timed.fn
    run()
    backend.sync()
    t0 = time.perf_counter()
    warm_calls = 0
    while warm_calls < 2 or (time.perf_counter() - t0 < warmup_s and warm_calls < 1000):
        run()
        backend.sync()
        warm_calls += 1
    per_call_s = max((time.perf_counter() - t0) / warm_calls, 1e-6)
    batch = int(min(64, max(1, 0.02 // per_call_s)))
    every: list[list[float]] = []
    blocks: list[BlockClocks] = []
    start = time.perf_counter()
    while True:
        before = backend.read_clock()
        samples = [x / timed.calls for x in backend.time_calls([run] * batch)]
        after = backend.read_clock()
        blocks.append(BlockClocks((before, after), backend.guard.keep((before, after)), len(samples)))
        every.append(samples)
        kept = [x for b, xs in zip(blocks, every) if b.kept for x in xs]
        elapsed = time.perf_counter() - start
        reason = stats.should_stop(kept, elapsed, rule) if kept else (
            stats.StopReason.TIME_CAP if elapsed >= rule.max_seconds else stats.StopReason.CONTINUE)
        if reason is not stats.StopReason.CONTINUE:
            break
    note = None
    if not kept:  # every block under the threshold: keep them all, and say so
        note = "every sample was below the clock threshold: kept, not trusted"
        blocks = [BlockClocks(b.readings, True, b.samples) for b in blocks]
        kept = [x for xs in every for x in xs]
    clocks = clock_stats(blocks, backend.guard, note)
    return Timing(summary=stats.summarize(kept), samples_us=kept, stop_reason=reason.value,
                  timing_s=time.perf_counter() - start, sm_clock_mhz=clocks.median_mhz,
                  sm_clock_min_mhz=clocks.min_mhz, sm_clock_max_mhz=clocks.max_mhz,
                  mode=timed.mode, clocks=clocks)


class PairedSession:
    """One candidate against one reference, a block of pairs at a time.

    The caller interleaves sessions (``run_block`` on each in turn) so a config's blocks are
    spread over the time its whole shape is timed; ``result`` summarizes the kept blocks."""

    def __init__(self, candidate: Timed, reference: Timed, backend, rule: paired.PairedRule,
                 rng: np.random.Generator, between_run_rsd: float):
        if candidate.mode != reference.mode:
            raise ValueError("candidate and reference must be timed in the same mode")
        self.candidate, self.reference = candidate, reference
        self.backend, self.rule, self.rng = backend, rule, rng
        self.between_run_rsd = between_run_rsd
        c_us = estimate_us(candidate.fn, backend) / candidate.calls
        r_us = estimate_us(reference.fn, backend) / reference.calls
        self.pairs = paired.pairs_per_block(c_us, r_us, backend.flush_us, rule)
        self.blocks: list[tuple[list[float], list[float]]] = []  # every block, kept or not
        self.clocks: list[BlockClocks] = []
        self.block_log_medians: list[float] = []  # kept blocks only
        self.timed_s = 0.0
        self.elapsed_s = 0.0
        self.reason = stats.StopReason.CONTINUE

    @property
    def done(self) -> bool:
        return self.reason is not stats.StopReason.CONTINUE

    def run_block(self) -> None:
        t0 = time.perf_counter()
        order = paired.order_bits(self.rng, self.pairs)
        fns = []
        for cand_first in order:
            a, b = (self.candidate, self.reference) if cand_first else (self.reference, self.candidate)
            fns += [a.fn, b.fn]
        before = self.backend.read_clock()
        times = self.backend.time_calls(fns)
        after = self.backend.read_clock()
        cand, ref = [], []
        for i, cand_first in enumerate(order):
            first, second = times[2 * i], times[2 * i + 1]
            c, r = (first, second) if cand_first else (second, first)
            cand.append(max(c / self.candidate.calls, 1e-6))
            ref.append(max(r / self.reference.calls, 1e-6))
        ok = self.backend.guard.keep((before, after))
        self.clocks.append(BlockClocks((before, after), ok, 2 * len(order)))
        self.blocks.append((cand, ref))
        self.timed_s += sum(times) * 1e-6
        if ok:
            self.block_log_medians.append(float(np.median(paired.log_ratios(cand, ref))))
        self.elapsed_s += time.perf_counter() - t0
        self.reason = paired.should_stop(self.block_log_medians, self.timed_s, self.elapsed_s, self.rule)
        if self.reason is stats.StopReason.CONTINUE and len(self.clocks) >= 4 * self.rule.max_blocks:
            self.reason = stats.StopReason.SAMPLE_CAP  # the clock guard discarded nearly everything

    def result(self) -> PairedTiming:
        note = None
        use = [b.kept for b in self.clocks]
        if sum(use) < 2:  # the guard left too little: use every block, flagged
            note = "fewer than 2 blocks above the clock threshold: all blocks kept, not trusted"
            use = [True] * len(self.clocks)
            self.clocks = [BlockClocks(b.readings, True, b.samples) for b in self.clocks]
        cand, ref, ids = [], [], []
        for i, ((c, r), keep) in enumerate(zip(self.blocks, use)):
            if keep:
                cand += c
                ref += r
                ids += [i] * len(c)
        summary = paired.summarize_pairs(cand, ref, ids, between_run_rsd=self.between_run_rsd)
        return PairedTiming(
            candidate=stats.summarize(cand), reference=stats.summarize(ref),
            speedup=summary, samples_us=cand, reference_samples_us=ref,
            stop_reason=self.reason.value, timing_s=self.elapsed_s, mode=self.candidate.mode,
            clocks=clock_stats(self.clocks, self.backend.guard, note))
