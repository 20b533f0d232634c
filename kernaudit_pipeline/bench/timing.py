"""Timing on the device: L2 flush, CUDA events, paired blocks, CUDA graphs, the clock guard.

Every sample is one call bracketed by CUDA events, after zeroing a 256 MiB buffer to flush
the 60 MB L2 (``triton.testing.do_bench``'s practice). Two ways to time:

- :func:`time_single`: one function on its own until the RSD rule or the time cap (baseline
  rows, peaks, candidates with no usable reference);
- :class:`PairedSession`: a candidate against a reference in blocks of pairs, each pair in
  random order, with the clock read around each block (``bench/clocks.py``). The worker
  interleaves the sessions of every config of a shape, one block at a time.

**The host stays out of the timed region.** A sample's events bracket the GPU's work only while
the host keeps ahead of the GPU. A call whose host-side launch takes longer than its GPU work
(Triton's launcher with dozens of arguments, scratch allocations, a PyTorch composition of several
ops) lets the queue drain, and its events then time the host as well: on the H200, a 67 µs
paged-decode kernel read 150-250 µs whenever the host fell behind. So each block starts behind a
*queue lead*: a GPU spin (``torch.cuda._sleep``) long enough for the host to enqueue the whole
block first (:func:`queue_lead_us`, sized from the host time the previous block took), as
nvbench's blocking kernel does. The rows record the host launch time of each side.

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
from dataclasses import dataclass, field

import numpy as np

from kernaudit_pipeline.bench import paired, stats
from kernaudit_pipeline.bench.clocks import BlockClocks, ClockGuard, ClockReader, clock_stats
from kernaudit_pipeline.bench.records import DeviceInfo, PairedTiming, StaticInfo, Timing
from kernaudit_pipeline.core.verdicts import TimingMode

L2_FLUSH_BYTES = 256 * 1024 * 1024  # do_bench's practice: zero 256 MiB before every sample
GRAPH_CALLS = 20
# The queue lead (see the module docstring): host time is noisy, so it is over-estimated by
# LEAD_SAFETY; LEAD_FLOOR_US covers the first launches; the cap keeps a queue that blocks the
# host (a block longer than the driver's launch queue) from feeding an ever longer lead.
LEAD_SAFETY = 1.5
LEAD_FLOOR_US = 50.0
LEAD_CAP_US = 200_000.0
DEFAULT_SM_MHZ = 2000.0  # cycles per µs for the spin when NVML gives no maximum clock


def queue_lead_us(calls: int, host_us_per_call: float, gpu_us_per_call: float, *,
                  safety: float = LEAD_SAFETY, floor_us: float = LEAD_FLOOR_US,
                  cap_us: float = LEAD_CAP_US) -> float:
    """GPU idle time before a block of ``calls`` flushed calls so that the host, enqueuing one
    call per ``host_us_per_call``, stays ahead of a GPU that runs one per ``gpu_us_per_call``
    (flush included) until the block's last call.

    Call k is enqueued at about k·h (h = safety × host time) and reached by the GPU at
    lead + (k-1)·g, so lead >= max over k of k·h - (k-1)·g: n·(h - g) + g when the host is the
    slower, h + g at most otherwise; two host calls plus a floor cover the first launches."""
    if calls <= 0:
        return 0.0
    h = max(float(host_us_per_call), 0.0) * safety
    g = max(float(gpu_us_per_call), 0.0)
    lead = max(0.0, calls * (h - g)) + 2.0 * h + floor_us
    return float(min(lead, cap_us, max(3.0 * calls * g, 5000.0)))


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
        self.cycles_per_us = float(self.clock.max_mhz) if self.clock and self.clock.max_mhz else DEFAULT_SM_MHZ
        self.last_enqueue_us = 0.0
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

    def time_calls(self, fns: list[Callable[[], object]], lead_us: float = 0.0) -> list[float]:
        """Each call after an L2 flush, bracketed by events; µs per call, one sync at the end.

        ``lead_us``: a GPU spin enqueued first, so the host can enqueue every call before the
        GPU reaches it (:func:`queue_lead_us`); ``last_enqueue_us`` is what enqueuing took."""
        torch = self.torch
        starts = [torch.cuda.Event(enable_timing=True) for _ in fns]
        ends = [torch.cuda.Event(enable_timing=True) for _ in fns]
        if lead_us > 0:
            torch.cuda._sleep(int(lead_us * self.cycles_per_us))
        t0 = time.perf_counter()
        for fn, s, e in zip(fns, starts, ends):
            self.flush_buf.zero_()
            s.record()
            fn()
            e.record()
        self.last_enqueue_us = (time.perf_counter() - t0) * 1e6
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
        self.last_enqueue_us = 0.0
        self.leads_us: list[float] = []  # what the timing code asked for (a CPU cannot wait)

    def sync(self) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def read_clock(self):
        return None

    def time_calls(self, fns: list[Callable[[], object]], lead_us: float = 0.0) -> list[float]:
        self.leads_us.append(lead_us)
        out = []
        for fn in fns:
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e6)
        self.last_enqueue_us = sum(out)
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

        from kernaudit_pipeline.core.hardware import SM_RESOURCES

        return DeviceInfo(device_name="fake-cpu (test double)", compute_capability=None, sm_count=None,
                          max_shared_mem_bytes=SM_RESOURCES["9.0"].smem_per_block_optin_bytes,
                          driver_version=driver_version, torch_version=torch.__version__)


def make_backend(device: str, clock_fraction: float = 0.75):
    if device == "cuda":
        return CudaBackend(clock_fraction)
    if device == "cpu":
        return FakeCpuBackend(clock_fraction)
    raise ValueError(f"unknown bench device {device!r}")


@dataclass
class QueueLead:
    """The lead of each next block, learned from what enqueuing the last block took: it follows
    a slower host at once and a faster one by halves. Per call: ``host_us`` to enqueue it,
    ``gpu_us`` to run it with its flush."""

    host_us: float
    gpu_us: float
    leads_us: list[float] = field(default_factory=list)

    def next(self, calls: int) -> float:
        lead = queue_lead_us(calls, self.host_us, self.gpu_us)
        self.leads_us.append(lead)
        return lead

    def learn(self, backend, times_us: list[float]) -> None:
        calls = max(len(times_us), 1)
        self.host_us = max(backend.last_enqueue_us / calls, 0.5 * self.host_us)
        self.gpu_us = sum(times_us) / calls + backend.flush_us

    @property
    def median_us(self) -> float | None:
        return float(np.median(self.leads_us)) if self.leads_us else None


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


def estimate(fn: Callable[[], object], backend, calls: int = 3) -> tuple[float, float]:
    """(GPU µs, host µs) of one flushed call: the median of a few calls' events, and the host
    time it took to enqueue them (the GPU idle, so the host never waits), after one unflushed
    call."""
    fn()
    backend.sync()
    gpu = float(np.median(backend.time_calls([fn] * calls)))
    return gpu, backend.last_enqueue_us / calls


def estimate_us(fn: Callable[[], object], backend, calls: int = 3) -> float:
    """Median GPU µs of a few flushed calls (after one unflushed call)."""
    return estimate(fn, backend, calls)[0]


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
    gpu_us, host_us = estimate(run, backend)
    lead = QueueLead(host_us, gpu_us + backend.flush_us)
    every: list[list[float]] = []
    blocks: list[BlockClocks] = []
    start = time.perf_counter()
    while True:
        before = backend.read_clock()
        times = backend.time_calls([run] * batch, lead_us=lead.next(batch))
        after = backend.read_clock()
        lead.learn(backend, times)
        samples = [x / timed.calls for x in times]
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
                  mode=timed.mode, clocks=clocks, host_launch_us=host_us, queue_lead_us=lead.median_us)


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
        c_gpu, self.candidate_host_us = estimate(candidate.fn, backend)
        r_gpu, self.reference_host_us = estimate(reference.fn, backend)
        c_us, r_us = c_gpu / candidate.calls, r_gpu / reference.calls
        self.pairs = paired.pairs_per_block(c_us, r_us, backend.flush_us, rule)
        self.lead = QueueLead((self.candidate_host_us + self.reference_host_us) / 2.0,
                              (c_gpu + r_gpu) / 2.0 + backend.flush_us)
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
        times = self.backend.time_calls(fns, lead_us=self.lead.next(len(fns)))
        after = self.backend.read_clock()
        self.lead.learn(self.backend, times)
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
            clocks=clock_stats(self.clocks, self.backend.guard, note),
            host_launch_us=self.candidate_host_us, reference_host_launch_us=self.reference_host_us,
            queue_lead_us=self.lead.median_us)
