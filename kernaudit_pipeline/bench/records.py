"""The runner's JSONL record schema: one JSON object per line, ``record_type`` says which kind.

Standard library only (plus ``kernaudit_pipeline.core`` and ``kernel_spec``), so that the ingest
side imports the same definitions the GPU side writes instead of re-declaring them.

``run`` and ``baseline`` lines (one per (config, shape), one per reference and shape) hold the
``kernel_runs`` columns under their own names, null where unknown, plus richer fields:

- identity: ``config`` (the config dict), ``dims`` (the shape's named sizes), ``shape_label``,
  ``kernel_module`` (file stem), ``baseline_variant`` (baseline rows: null for the primary
  reference, else the reference's key);
- compile: ``registers_per_thread``, ``n_spills`` and ``stack_frame_bytes`` = 4 * n_spills.
  The JIT reports one figure, the driver's local memory per thread, which is the stack frame;
  it is not a count of spill stores (ptxas ``-v`` reports those, and the static audit reads
  them), so the runner leaves ``spill_stores_bytes`` and ``spill_loads_bytes`` null.
  ``compiled_name``, ``compiled_hash``, ``launch_matches_compile``, ``max_shared_mem_bytes``;
- correctness: ``correct``, ``max_rel_error``, ``check_seed``, ``max_abs_error``,
  ``nonfinite_outputs``, ``elementwise_violations``, ``tolerance_rel_l2``;
- timing (paired, see ``bench/paired.py``): the candidate's ``latency_*`` and every kept
  sample in ``samples_us``; the primary reference's latency from the same pairs in
  ``baseline_us``/``baseline_ci_*`` and ``baseline_samples_us``; ``speedup`` with its 95 %
  ``speedup_ci_low``/``speedup_ci_high``, ``timing_pairs``, ``timing_blocks``,
  ``timing_mode`` (:class:`~kernaudit_pipeline.core.verdicts.TimingMode`), the block speedups,
  the bootstrap-only CI and the between-run component it was widened by; ``host_launch_us``
  and ``baseline_host_launch_us`` (host time to enqueue one call of each side: above the
  latency, the call is launch-bound when run eagerly) and ``queue_lead_us`` (the GPU spin
  ahead of each block that keeps the host out of the timed region);
- clock guard: ``sm_clock_mhz`` (median), ``sm_clock_min_mhz``, ``sm_clock_max_mhz``,
  ``clock_threshold_mhz``, ``clock_discarded_samples``, ``throttle_reasons``;
- references: ``baseline_backend`` (what the primary reference ran, e.g. "cuBLAS"),
  ``reference_speedups`` (JSON text: :class:`~kernaudit_pipeline.core.verdicts.BaselineResult`
  dicts of the other references, timed paired against the best configs), ``backend_kernels``;
- cost: ``compile_s``, ``check_s``, ``timing_s``, ``worker_attempt``; device: ``driver_version``,
  ``cuda_version``, ``sm_count``.

``peak`` lines: measured ceilings (``bench/peaks.py``). ``summary`` (last line): the sweep's
cost, status counts, the best config per (kernel, shape) and the options it ran with.

Files written before paired timing (no ``speedup``, ``timing_*``; ``spill_stores_bytes`` set to
4 * n_spills) still ingest: ``ingest/runner_jsonl.py`` reads both.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from enum import Enum, StrEnum
from typing import Any

from kernaudit_pipeline.core.configs import config_id, kernel_config_to_columns, shape_columns
from kernaudit_pipeline.core.values import json_safe
from kernaudit_pipeline.core.verdicts import RunStatus, TimingMode
from kernaudit_pipeline.kernel_spec import Shape

STACK_FRAME_SOURCE = ("4*n_spills: the driver's local memory per thread (the stack frame) from "
                      "the JIT's compiled kernel; ptxas -v spill counts are not available here")
# What older runner files wrote into spill_stores_bytes (the same 4*n_spills figure).
LEGACY_SPILL_SOURCE_PREFIX = "4*n_spills"
PRIMARY_LABEL = "baseline"
# Progress label (after "<shape>|") while a non-primary reference is timed against the best
# configs; a worker that dies there blames the reference, not a config.
REF_TIMING_MARK = "reference~"


class RecordType(StrEnum):
    RUN = "run"
    BASELINE = "baseline"
    PEAK = "peak"
    SUMMARY = "summary"


ROW_RECORD_TYPES = frozenset({RecordType.RUN, RecordType.BASELINE})


@dataclass(frozen=True)
class DeviceInfo:
    device_name: str | None = None
    compute_capability: str | None = None
    sm_count: int | None = None
    max_shared_mem_bytes: int | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    torch_version: str | None = None
    triton_version: str | None = None


@dataclass(frozen=True)
class StaticInfo:
    """What the compile says about one (config, shape) specialization."""

    registers_per_thread: int | None = None
    n_spills: int | None = None
    shared_mem_bytes: int | None = None
    threads_per_block: int | None = None
    compiled_name: str | None = None
    compiled_hash: str | None = None
    compile_s: float | None = None

    @property
    def stack_frame_bytes(self) -> int | None:
        return None if self.n_spills is None else 4 * self.n_spills


@dataclass(frozen=True)
class CheckResult:
    correct: bool
    max_rel_error: float | None
    max_abs_error: float | None
    nonfinite_outputs: int
    elementwise_violations: int | None
    check_seed: int
    check_s: float


@dataclass(frozen=True)
class ClockStats:
    """What the clock guard saw over one timed config (see ``bench/clocks.py``)."""

    median_mhz: float | None = None
    min_mhz: float | None = None
    max_mhz: float | None = None
    threshold_mhz: float | None = None
    discarded_samples: int = 0
    throttle_reasons: tuple[str, ...] = ()
    note: str | None = None


@dataclass(frozen=True)
class Timing:
    """One function timed on its own (baseline rows, peaks, unpaired candidates).

    ``summary`` is a :class:`kernaudit_pipeline.bench.stats.SampleSummary` (numpy side)."""

    summary: Any
    samples_us: list[float]
    stop_reason: str
    timing_s: float
    sm_clock_mhz: float | None = None
    sm_clock_min_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    mode: TimingMode = TimingMode.EVENTS
    clocks: ClockStats | None = None
    host_launch_us: float | None = None  # host time to enqueue one timed call (bench/timing.py)
    queue_lead_us: float | None = None   # median GPU spin ahead of each block of samples


@dataclass(frozen=True)
class PairedTiming:
    """A candidate timed against a reference in alternating, randomly ordered pairs.

    ``candidate`` and ``reference`` summarize the kept samples of each side; ``speedup`` is a
    :class:`kernaudit_pipeline.bench.paired.PairedSummary`."""

    candidate: Any
    reference: Any
    speedup: Any
    samples_us: list[float]
    reference_samples_us: list[float]
    stop_reason: str
    timing_s: float
    mode: TimingMode
    clocks: ClockStats
    host_launch_us: float | None = None
    reference_host_launch_us: float | None = None
    queue_lead_us: float | None = None


@dataclass(frozen=True)
class KernelInfo:
    """The parts of a kernel a record needs, from the kernel's plan (never its import)."""

    module: str
    name: str
    dtype: str
    baseline_name: str
    source_hash: str
    tolerance_rel_l2: float


@dataclass(frozen=True)
class RunRecord:
    """One ``run`` or ``baseline`` line; the first block is the kernel_runs columns."""

    record_type: str
    kernel_name: str
    config_id: str | None = None
    block_m: int | None = None
    block_n: int | None = None
    block_k: int | None = None
    group_m: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    shape_name: str | None = None
    phase: str | None = None
    m: int | None = None
    n: int | None = None
    k: int | None = None
    batch: int | None = None
    num_heads: int | None = None
    num_kv_heads: int | None = None
    seq_len: int | None = None
    head_dim: int | None = None
    causal: bool | None = None
    dtype: str | None = None
    registers_per_thread: int | None = None
    spill_stores_bytes: int | None = None
    spill_loads_bytes: int | None = None
    stack_frame_bytes: int | None = None
    shared_mem_bytes: int | None = None
    threads_per_block: int | None = None
    grid_size: int | None = None
    latency_us: float | None = None
    latency_p10_us: float | None = None
    latency_p90_us: float | None = None
    latency_ci_low_us: float | None = None
    latency_ci_high_us: float | None = None
    latency_samples: int | None = None
    baseline_name: str | None = None
    baseline_us: float | None = None
    baseline_ci_low_us: float | None = None
    baseline_ci_high_us: float | None = None
    speedup: float | None = None
    speedup_ci_low: float | None = None
    speedup_ci_high: float | None = None
    timing_pairs: int | None = None
    timing_blocks: int | None = None
    timing_mode: str | None = None
    clock_discarded_samples: int | None = None
    sm_clock_min_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    baseline_backend: str | None = None
    reference_speedups: str | None = None
    correct: bool | None = None
    max_rel_error: float | None = None
    run_status: str | None = None
    run_message: str | None = None
    flops: float | None = None
    bytes_moved: float | None = None
    device_name: str | None = None
    compute_capability: str | None = None
    sm_clock_mhz: float | None = None
    triton_version: str | None = None
    torch_version: str | None = None
    kernel_source_hash: str | None = None
    # richer fields
    kernel_module: str | None = None
    config: dict | None = None
    dims: dict | None = None
    shape_label: str | None = None
    baseline_variant: str | None = None
    n_spills: int | None = None
    spill_bytes_source: str | None = None
    compiled_name: str | None = None
    compiled_hash: str | None = None
    launch_matches_compile: bool | None = None
    max_shared_mem_bytes: int | None = None
    check_seed: int | None = None
    max_abs_error: float | None = None
    nonfinite_outputs: int | None = None
    elementwise_violations: int | None = None
    tolerance_rel_l2: float | None = None
    samples_us: list[float] | None = None
    baseline_samples_us: list[float] | None = None
    latency_mean_us: float | None = None
    latency_min_us: float | None = None
    latency_max_us: float | None = None
    rsd_samples: float | None = None
    rsd_median: float | None = None
    stop_reason: str | None = None
    ci_level: float | None = None
    block_speedups: list[float] | None = None
    speedup_boot_ci_low: float | None = None
    speedup_boot_ci_high: float | None = None
    between_run_rsd: float | None = None
    clock_threshold_mhz: float | None = None
    throttle_reasons: list[str] | None = None
    clock_note: str | None = None
    backend_kernels: list[str] | None = None
    host_launch_us: float | None = None
    baseline_host_launch_us: float | None = None
    queue_lead_us: float | None = None
    compile_s: float | None = None
    check_s: float | None = None
    timing_s: float | None = None
    worker_attempt: int | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    sm_count: int | None = None


RUN_RECORD_FIELDS = frozenset(RunRecord.__dataclass_fields__)


def _finite(value: object) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def grid_size(grid: Iterable[int]) -> int:
    total = 1
    for g in grid:
        total *= int(g)
    return total


def shape_fields(shape: Shape) -> dict:
    return {"shape_name": shape.name, "phase": shape.phase, "causal": shape.causal,
            "dims": dict(shape.dims), "shape_label": shape.label or None,
            **{k: int(v) for k, v in shape_columns(shape.dims).items()}}


def config_fields(config: Mapping[str, int]) -> dict:
    return {"config_id": config_id(config), "config": dict(config),
            **{k: int(v) for k, v in kernel_config_to_columns(config).items()}}


def reference_config_id(variant: str | None) -> str:
    """``baseline`` for the primary reference, ``baseline[<key>]`` for the others."""
    return PRIMARY_LABEL if variant is None else f"{PRIMARY_LABEL}[{variant}]"


def _timing_fields(timing: Timing) -> dict:
    s = timing.summary
    clocks = timing.clocks
    return {
        "latency_us": s.median_us, "latency_p10_us": s.p10_us, "latency_p90_us": s.p90_us,
        "latency_ci_low_us": s.ci_low_us, "latency_ci_high_us": s.ci_high_us,
        "latency_samples": s.samples, "latency_mean_us": s.mean_us,
        "latency_min_us": s.min_us, "latency_max_us": s.max_us,
        "rsd_samples": _finite(s.rsd_samples), "rsd_median": _finite(s.rsd_median),
        "ci_level": s.ci_level, "stop_reason": timing.stop_reason,
        "samples_us": [round(x, 4) for x in timing.samples_us],
        "timing_s": _finite(timing.timing_s), "timing_mode": str(timing.mode),
        "sm_clock_mhz": _finite(timing.sm_clock_mhz),
        "sm_clock_min_mhz": _finite(timing.sm_clock_min_mhz),
        "sm_clock_max_mhz": _finite(timing.sm_clock_max_mhz),
        "host_launch_us": _finite(timing.host_launch_us), "queue_lead_us": _finite(timing.queue_lead_us),
        **(_clock_fields(clocks) if clocks is not None else {}),
    }


def _clock_fields(clocks: ClockStats) -> dict:
    return {"sm_clock_mhz": _finite(clocks.median_mhz), "sm_clock_min_mhz": _finite(clocks.min_mhz),
            "sm_clock_max_mhz": _finite(clocks.max_mhz),
            "clock_threshold_mhz": _finite(clocks.threshold_mhz),
            "clock_discarded_samples": int(clocks.discarded_samples),
            "throttle_reasons": list(clocks.throttle_reasons), "clock_note": clocks.note}


def _paired_fields(paired: PairedTiming) -> dict:
    c, r, sp = paired.candidate, paired.reference, paired.speedup
    return {
        "latency_us": c.median_us, "latency_p10_us": c.p10_us, "latency_p90_us": c.p90_us,
        "latency_ci_low_us": c.ci_low_us, "latency_ci_high_us": c.ci_high_us,
        "latency_samples": c.samples, "latency_mean_us": c.mean_us,
        "latency_min_us": c.min_us, "latency_max_us": c.max_us,
        "rsd_samples": _finite(c.rsd_samples), "rsd_median": _finite(c.rsd_median),
        "ci_level": sp.ci_level, "stop_reason": paired.stop_reason,
        "samples_us": [round(x, 4) for x in paired.samples_us],
        "baseline_us": r.median_us, "baseline_ci_low_us": r.ci_low_us,
        "baseline_ci_high_us": r.ci_high_us,
        "baseline_samples_us": [round(x, 4) for x in paired.reference_samples_us],
        "speedup": _finite(sp.speedup), "speedup_ci_low": _finite(sp.ci_low),
        "speedup_ci_high": _finite(sp.ci_high), "timing_pairs": int(sp.pairs),
        "timing_blocks": int(sp.blocks), "block_speedups": [round(x, 5) for x in sp.block_speedups],
        "speedup_boot_ci_low": _finite(sp.boot_ci_low), "speedup_boot_ci_high": _finite(sp.boot_ci_high),
        "between_run_rsd": _finite(sp.between_run_rsd),
        "timing_s": _finite(paired.timing_s), "timing_mode": str(paired.mode),
        "host_launch_us": _finite(paired.host_launch_us),
        "baseline_host_launch_us": _finite(paired.reference_host_launch_us),
        "queue_lead_us": _finite(paired.queue_lead_us),
        **_clock_fields(paired.clocks),
    }


@dataclass(frozen=True)
class RecordParts:
    """Everything optional that goes into one run/baseline line."""

    config: Mapping[str, int] | None = None
    message: str | None = None
    static: StaticInfo | None = None
    grid: tuple[int, ...] | None = None
    check: CheckResult | None = None
    timing: Timing | None = None
    paired: PairedTiming | None = None
    flops: float | None = None
    bytes_moved: float | None = None
    baseline_name: str | None = None
    baseline_variant: str | None = None
    baseline_backend: str | None = None
    backend_kernels: tuple[str, ...] = ()
    reference_speedups: tuple[Mapping[str, object], ...] | None = None
    launch_matches_compile: bool | None = None
    attempt: int | None = None
    extra: Mapping[str, object] = field(default_factory=dict)


def build_record(record_type: RecordType, kernel: KernelInfo, shape: Shape, device: DeviceInfo,
                 status: RunStatus, parts: RecordParts = RecordParts()) -> RunRecord:
    """One run/baseline line from its parts; pure, so tests build real rows on a CPU."""
    p = parts
    cols: dict = {
        "record_type": record_type.value, "kernel_name": kernel.name,
        "kernel_module": kernel.module, "dtype": kernel.dtype,
        "kernel_source_hash": kernel.source_hash, "tolerance_rel_l2": kernel.tolerance_rel_l2,
        "baseline_name": p.baseline_name or kernel.baseline_name,
        "baseline_variant": p.baseline_variant, "baseline_backend": p.baseline_backend,
        "backend_kernels": list(p.backend_kernels) or None,
        "run_status": str(status), "run_message": p.message,
        "flops": None if p.flops is None else float(p.flops),
        "bytes_moved": None if p.bytes_moved is None else float(p.bytes_moved),
        "worker_attempt": p.attempt, "launch_matches_compile": p.launch_matches_compile,
        **shape_fields(shape), **asdict(device),
    }
    if record_type is RecordType.BASELINE:
        cols["config_id"] = reference_config_id(p.baseline_variant)
    if p.config is not None:
        cols.update(config_fields(p.config))
    if p.grid is not None:
        cols["grid_size"] = grid_size(p.grid)
    if p.static is not None:
        s = p.static
        cols.update({
            "registers_per_thread": s.registers_per_thread, "n_spills": s.n_spills,
            "stack_frame_bytes": s.stack_frame_bytes,
            "spill_bytes_source": STACK_FRAME_SOURCE if s.n_spills is not None else None,
            "shared_mem_bytes": s.shared_mem_bytes, "threads_per_block": s.threads_per_block,
            "compiled_name": s.compiled_name, "compiled_hash": s.compiled_hash,
            "compile_s": _finite(s.compile_s),
        })
    if p.check is not None:
        c = p.check
        cols.update({
            "correct": c.correct, "max_rel_error": _finite(c.max_rel_error),
            "max_abs_error": _finite(c.max_abs_error), "nonfinite_outputs": c.nonfinite_outputs,
            "elementwise_violations": c.elementwise_violations, "check_seed": c.check_seed,
            "check_s": _finite(c.check_s),
        })
    if p.timing is not None:
        cols.update(_timing_fields(p.timing))
        if record_type is RecordType.BASELINE:
            s = p.timing.summary
            cols.update({"baseline_us": s.median_us, "baseline_ci_low_us": s.ci_low_us,
                         "baseline_ci_high_us": s.ci_high_us})
    if p.paired is not None:
        cols.update(_paired_fields(p.paired))
    if p.reference_speedups is not None:
        cols["reference_speedups"] = json.dumps(json_safe([dict(r) for r in p.reference_speedups]))
    cols.update(p.extra)
    return RunRecord(**{k: v for k, v in cols.items() if k in RUN_RECORD_FIELDS})


def to_json_line(record: object) -> str:
    """One JSONL line; non-finite floats become null (JSON has no NaN)."""
    data = asdict(record) if hasattr(record, "__dataclass_fields__") else dict(record)
    return json.dumps(_clean(data), allow_nan=False)


def _clean(value: object) -> object:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def read_jsonl(text: str) -> list[dict]:
    """Every JSON object line of a runner file; a line cut short by a crash is skipped."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            rows.append(obj)
    return rows
