"""``kernaudit bench``: time each kernel's configs against its PyTorch baseline on a GPU.

Runs as ``python -m kernaudit_pipeline.bench.runner [KERNEL ...] [options]`` on any GPU host
that has torch, triton and numpy: nothing else is imported. For each kernel module in
``kernels/`` and each shape, a worker subprocess (timeout per config, global deadline) checks
and times the baseline, then each config:

1. compile through the JIT's own ``warmup`` (same specialization as the launch) and read the
   compiled kernel's resources: ``n_regs``, ``n_spills`` (spill bytes = 4 * n_spills) and
   ``metadata.shared``; shared memory over the device's opt-in limit is OUT_OF_RESOURCES;
2. prune (default): a config that spills more than ``--spill-threshold-bytes`` is PRUNED_SPILL,
   recorded with its resources but never launched (``--no-prune`` times it);
3. correctness: fresh random inputs (a new seed per check), output poisoned with NaN, compared
   with the module's higher-precision ``reference`` by ||out - ref|| / ||ref|| and the
   elementwise atol/rtol; an incorrect config is FAILED_CORRECTNESS and is not timed;
4. timing: L2 flushed (256 MiB zeroed) before every sample, warm-up, CUDA events per sample,
   samples added until the RSD reaches ``--rsd-target`` after ``--min-samples`` or the time cap
   (``stats.should_stop``); median, p10, p90 and a 95 % bootstrap CI of the median.

A hang, an illegal address or an OOM ends only its worker: the parent records a TIMEOUT,
CRASHED or OOM row for the config in flight and starts a new worker for the rest.

JSONL schema (one JSON object per line; ``record_type`` says which of the four kinds)
----------------------------------------------------------------------------------
``run`` and ``baseline`` (one per timed config / per baseline and shape): the ``kernel_runs``
columns ``kernel_name, config_id, block_m, block_n, block_k, group_m, num_warps, num_stages,
shape_name, phase, m, n, k, batch, num_heads, num_kv_heads, seq_len, head_dim, causal, dtype,
registers_per_thread, spill_stores_bytes, spill_loads_bytes, shared_mem_bytes,
threads_per_block, grid_size, latency_us, latency_p10_us, latency_p90_us, latency_ci_low_us,
latency_ci_high_us, latency_samples, baseline_name, baseline_us, baseline_ci_low_us,
baseline_ci_high_us, correct, max_rel_error, run_status, run_message, flops, bytes_moved,
device_name, compute_capability, sm_clock_mhz, triton_version, torch_version,
kernel_source_hash`` (null where unknown), plus:

- ``config`` (the config dict), ``dims`` (the shape's named sizes), ``shape_label``,
  ``kernel_module`` (file stem), ``baseline_variant`` (baseline rows: null or an SDPA backend);
- ``n_spills`` and ``spill_bytes_source``: the JIT reports one figure (the driver's local
  memory per thread / 4), so ``spill_stores_bytes``, ``spill_loads_bytes`` and
  ``stack_frame_bytes`` are all ``4 * n_spills`` and ``spill_bytes_source`` says so (ptxas -v,
  captured separately, can count more spill-store bytes);
- ``compiled_name``, ``compiled_hash``, ``launch_matches_compile`` (true when the launch reused
  the kernel whose resources were read), ``max_shared_mem_bytes`` (device opt-in limit);
- correctness: ``check_seed``, ``max_abs_error``, ``nonfinite_outputs``,
  ``elementwise_violations``, ``tolerance_rel_l2``;
- timing: ``samples_us`` (every sample, for significance tests), ``latency_mean_us``,
  ``latency_min_us``, ``latency_max_us``, ``rsd_samples``, ``rsd_median``, ``stop_reason``,
  ``ci_level``, ``sm_clock_min_mhz``, ``sm_clock_max_mhz``;
- cost: ``compile_s``, ``check_s``, ``timing_s`` (wall seconds), ``worker_attempt``;
- device: ``driver_version``, ``cuda_version``, ``sm_count``.

``run_status`` is one of :class:`RunStatus`. ``baseline_*`` on a run row come from the
baseline timed in the same worker process.

``peak`` (see ``peaks.py``): ``peak_name``, ``peak_tflops`` or ``peak_gb_per_s``, ``flops``,
``bytes_moved``, the latency statistics and ``samples_us``, device fields.

``summary`` (last line): ``sweep_wall_s`` (whole sweep), ``gpu_busy_s`` (checks + timing loops
+ peaks, the GPU-seconds the pruning saves), ``compile_s``, ``precompile_wall_s``,
``status_counts``, ``best`` (per kernel and shape: fastest correct config against its
baseline), and the options the sweep ran with.
"""

from __future__ import annotations

import argparse
import enum
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import ModuleType

from kernaudit_pipeline.bench import stats
from kernaudit_pipeline.kernel_spec import (
    KERNELS_DIR, Ptr, Shape, config_id, kernel_files, load_kernel_module, source_hash,
)

PROG = "kernaudit bench"
REPO_ROOT = Path(__file__).resolve().parents[2]
L2_FLUSH_BYTES = 256 * 1024 * 1024  # do_bench's practice: zero 256 MiB before every sample
EXIT_CUDA_FATAL = 3  # a worker exits with this when the CUDA context is no longer usable
# The driver reports one figure, local memory per thread, which Triton calls n_spills (bytes / 4).
# ptxas -v can report more spill-store bytes than that (stores to the same slot count each time).
SPILL_BYTES_SOURCE = ("4*n_spills: the driver's local-memory bytes per thread from the JIT's "
                      "compiled kernel; spill loads assumed equal to stores")

# Shape dims -> kernel_runs columns.
DIM_COLUMNS = {"M": "m", "N": "n", "K": "k", "B": "batch", "H": "num_heads",
               "KV_H": "num_kv_heads", "HKV": "num_kv_heads", "S": "seq_len",
               "D": "head_dim"}
CONFIG_COLUMNS = {"BLOCK_M": "block_m", "BLOCK_N": "block_n", "BLOCK_K": "block_k",
                  "GROUP_M": "group_m", "num_warps": "num_warps", "num_stages": "num_stages"}


class RecordType(str, enum.Enum):
    RUN = "run"
    BASELINE = "baseline"
    PEAK = "peak"
    SUMMARY = "summary"


class RunStatus(str, enum.Enum):
    OK = "OK"
    FAILED_CORRECTNESS = "FAILED_CORRECTNESS"
    OUT_OF_RESOURCES = "OUT_OF_RESOURCES"
    COMPILE_ERROR = "COMPILE_ERROR"
    PRUNED_SPILL = "PRUNED_SPILL"
    TIMEOUT = "TIMEOUT"
    CRASHED = "CRASHED"
    OOM = "OOM"
    ERROR = "ERROR"
    NOT_RUN = "NOT_RUN"


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------
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
    def spill_bytes(self) -> int | None:
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
class Timing:
    summary: stats.SampleSummary
    samples_us: list[float]
    stop_reason: str
    timing_s: float
    sm_clock_mhz: float | None = None
    sm_clock_min_mhz: float | None = None
    sm_clock_max_mhz: float | None = None


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
    latency_mean_us: float | None = None
    latency_min_us: float | None = None
    latency_max_us: float | None = None
    rsd_samples: float | None = None
    rsd_median: float | None = None
    stop_reason: str | None = None
    ci_level: float | None = None
    sm_clock_min_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    compile_s: float | None = None
    check_s: float | None = None
    timing_s: float | None = None
    worker_attempt: int | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    sm_count: int | None = None


@dataclass(frozen=True)
class KernelInfo:
    """The parts of a kernel module a record needs (so records build without a GPU)."""

    module: str
    name: str
    dtype: str
    baseline_name: str
    source_hash: str
    tolerance_rel_l2: float

    @classmethod
    def of(cls, mod: ModuleType) -> KernelInfo:
        path = Path(mod.__file__)
        return cls(module=path.stem, name=mod.NAME, dtype=mod.DTYPE,
                   baseline_name=mod.BASELINE_NAME, source_hash=source_hash(path),
                   tolerance_rel_l2=float(mod.TOLERANCE.max_rel_l2))


def _finite(value: float | None) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _grid_size(grid: Iterable[int]) -> int:
    total = 1
    for g in grid:
        total *= int(g)
    return total


def shape_columns(shape: Shape) -> dict:
    cols: dict = {"shape_name": shape.name, "phase": shape.phase, "causal": shape.causal,
                  "dims": dict(shape.dims), "shape_label": shape.label or None}
    for key, value in shape.dims.items():
        column = DIM_COLUMNS.get(key.upper())
        if column is not None:
            cols[column] = int(value)
    return cols


def config_columns(config: dict) -> dict:
    cols: dict = {"config_id": config_id(config), "config": dict(config)}
    for key, column in CONFIG_COLUMNS.items():
        if key in config:
            cols[column] = int(config[key])
    return cols


def build_record(
    record_type: RecordType,
    kernel: KernelInfo,
    shape: Shape,
    device: DeviceInfo,
    *,
    config: dict | None = None,
    status: RunStatus,
    message: str | None = None,
    static: StaticInfo | None = None,
    grid: tuple[int, ...] | None = None,
    check: CheckResult | None = None,
    timing: Timing | None = None,
    flops: float | None = None,
    bytes_moved: float | None = None,
    baseline_name: str | None = None,
    baseline_variant: str | None = None,
    launch_matches_compile: bool | None = None,
    attempt: int | None = None,
) -> RunRecord:
    """One run/baseline line from its parts; pure, so tests build real rows on a CPU."""
    cols: dict = {
        "record_type": record_type.value, "kernel_name": kernel.name,
        "kernel_module": kernel.module, "dtype": kernel.dtype,
        "kernel_source_hash": kernel.source_hash, "tolerance_rel_l2": kernel.tolerance_rel_l2,
        "baseline_name": baseline_name or kernel.baseline_name,
        "baseline_variant": baseline_variant,
        "run_status": status.value, "run_message": message,
        "flops": None if flops is None else float(flops),
        "bytes_moved": None if bytes_moved is None else float(bytes_moved),
        "worker_attempt": attempt, "launch_matches_compile": launch_matches_compile,
        **shape_columns(shape),
    }
    dev = asdict(device)
    cols.update(dev)
    if record_type is RecordType.BASELINE:
        cols["config_id"] = "baseline" if baseline_variant is None else f"baseline[{baseline_variant}]"
    if config is not None:
        cols.update(config_columns(config))
    if grid is not None:
        cols["grid_size"] = _grid_size(grid)
    if static is not None:
        spill = static.spill_bytes
        cols.update({
            "registers_per_thread": static.registers_per_thread,
            "n_spills": static.n_spills,
            "spill_stores_bytes": spill, "spill_loads_bytes": spill, "stack_frame_bytes": spill,
            "spill_bytes_source": SPILL_BYTES_SOURCE if spill is not None else None,
            "shared_mem_bytes": static.shared_mem_bytes,
            "threads_per_block": static.threads_per_block,
            "compiled_name": static.compiled_name, "compiled_hash": static.compiled_hash,
            "compile_s": _finite(static.compile_s),
        })
    if check is not None:
        cols.update({
            "correct": check.correct, "max_rel_error": _finite(check.max_rel_error),
            "max_abs_error": _finite(check.max_abs_error),
            "nonfinite_outputs": check.nonfinite_outputs,
            "elementwise_violations": check.elementwise_violations,
            "check_seed": check.check_seed, "check_s": _finite(check.check_s),
        })
    if timing is not None:
        s = timing.summary
        cols.update({
            "latency_us": s.median_us, "latency_p10_us": s.p10_us, "latency_p90_us": s.p90_us,
            "latency_ci_low_us": s.ci_low_us, "latency_ci_high_us": s.ci_high_us,
            "latency_samples": s.samples, "latency_mean_us": s.mean_us,
            "latency_min_us": s.min_us, "latency_max_us": s.max_us,
            "rsd_samples": _finite(s.rsd_samples), "rsd_median": _finite(s.rsd_median),
            "ci_level": s.ci_level, "stop_reason": timing.stop_reason,
            "samples_us": [round(x, 4) for x in timing.samples_us],
            "timing_s": _finite(timing.timing_s), "sm_clock_mhz": _finite(timing.sm_clock_mhz),
            "sm_clock_min_mhz": _finite(timing.sm_clock_min_mhz),
            "sm_clock_max_mhz": _finite(timing.sm_clock_max_mhz),
        })
        if record_type is RecordType.BASELINE:
            cols.update({"baseline_us": s.median_us, "baseline_ci_low_us": s.ci_low_us,
                         "baseline_ci_high_us": s.ci_high_us})
    known = {f for f in RunRecord.__dataclass_fields__}
    return RunRecord(**{k: v for k, v in cols.items() if k in known})


def with_baseline(record: dict, baseline: dict | None) -> dict:
    """Attach the baseline timed in the same worker to a run row."""
    if baseline is None or baseline.get("latency_us") is None:
        return record
    return {**record, "baseline_name": baseline.get("baseline_name"),
            "baseline_us": baseline.get("latency_us"),
            "baseline_ci_low_us": baseline.get("latency_ci_low_us"),
            "baseline_ci_high_us": baseline.get("latency_ci_high_us")}


def to_json_line(record: object) -> str:
    """One JSONL line; non-finite floats become null (JSON has no NaN)."""
    data = asdict(record) if hasattr(record, "__dataclass_fields__") else dict(record)
    return json.dumps(_clean(data), allow_nan=False, sort_keys=False)


def _clean(value: object) -> object:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


# --------------------------------------------------------------------------------------------
# Options
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BenchOptions:
    rsd_target: float = 0.01
    min_samples: int = 10
    max_seconds_per_config: float = 1.0
    prune: bool = True
    spill_threshold_bytes: int = 0
    timeout_s: float = 180.0
    seed: int = 20240601
    warmup_s: float = 0.02

    @property
    def rule(self) -> stats.StopRule:
        return stats.StopRule(rsd_target=self.rsd_target, min_samples=self.min_samples,
                              max_seconds=self.max_seconds_per_config)


# --------------------------------------------------------------------------------------------
# GPU side (worker processes). torch is imported here and only here.
# --------------------------------------------------------------------------------------------
_TORCH_DTYPES = {
    "bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64",
    "fp8e4nv": "float8_e4m3fn", "fp8e5": "float8_e5m2", "fp8e4b15": "float8_e4m3fn",
    "i8": "int8", "u8": "uint8", "i16": "int16", "i32": "int32", "i64": "int64", "i1": "bool",
}


def device_info(driver_version: str | None = None) -> DeviceInfo:
    import torch
    import triton

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    optin = getattr(props, "shared_memory_per_block_optin", None)
    return DeviceInfo(
        device_name=props.name, compute_capability=f"{props.major}.{props.minor}",
        sm_count=int(props.multi_processor_count),
        max_shared_mem_bytes=int(optin) if optin else None,
        driver_version=driver_version, cuda_version=torch.version.cuda,
        torch_version=torch.__version__, triton_version=triton.__version__)


def sm_clock_mhz() -> float | None:
    """The current SM clock through NVML (torch.cuda.clock_rate); never changes clocks."""
    import torch

    try:
        return float(torch.cuda.clock_rate())
    except Exception:  # no pynvml, or NVML not available: the row says null
        return None


def nvidia_smi_query(fields: str) -> list[str] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    first = out.strip().splitlines()[0] if out.strip() else ""
    return [p.strip() for p in first.split(",")] if first else None


def time_gpu(fn: Callable[[], object], flush, rule: stats.StopRule,
             warmup_s: float = 0.02) -> Timing:
    """Median-of-samples timing with an L2 flush before each sample and CUDA events around it."""
    import torch

    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    warm_calls = 0
    while warm_calls < 2 or (time.perf_counter() - t0 < warmup_s and warm_calls < 1000):
        fn()
        torch.cuda.synchronize()
        warm_calls += 1
    per_call_s = max((time.perf_counter() - t0) / warm_calls, 1e-6)
    batch = int(min(64, max(1, 0.02 // per_call_s)))
    samples: list[float] = []
    clocks: list[float] = []
    start_wall = time.perf_counter()
    while True:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(batch)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(batch)]
        for i in range(batch):
            flush.zero_()
            starts[i].record()
            fn()
            ends[i].record()
        ends[-1].synchronize()
        samples.extend(1000.0 * s.elapsed_time(e) for s, e in zip(starts, ends))
        clock = sm_clock_mhz()
        if clock is not None:
            clocks.append(clock)
        reason = stats.should_stop(samples, time.perf_counter() - start_wall, rule)
        if reason is not stats.StopReason.CONTINUE:
            break
    timing_s = time.perf_counter() - start_wall
    clock_med = float(sorted(clocks)[len(clocks) // 2]) if clocks else None
    return Timing(summary=stats.summarize(samples), samples_us=samples, stop_reason=reason.value,
                  timing_s=timing_s, sm_clock_mhz=clock_med,
                  sm_clock_min_mhz=min(clocks) if clocks else None,
                  sm_clock_max_mhz=max(clocks) if clocks else None)


def _materialize(value: object, keep: list) -> object:
    """A real (tiny) tensor for a ``Ptr``: the JIT specializes on dtype and 16-byte alignment
    only, so warming up with it compiles exactly the kernel the launch will run."""
    import torch

    if not isinstance(value, Ptr):
        return value
    dtype = getattr(torch, _TORCH_DTYPES.get(value.dtype, value.dtype))
    base = torch.empty(64, dtype=dtype, device="cuda")
    keep.append(base)
    return base if value.aligned else base[1:]


def _jit_cache_size(kernel) -> int | None:
    import torch

    try:
        return len(kernel.device_caches[torch.cuda.current_device()][0])
    except Exception:  # another triton version's layout: the row says null
        return None


def _is_out_of_resources(exc: BaseException) -> bool:
    return type(exc).__name__ == "OutOfResources"


def _first_line(exc: BaseException, limit: int = 400) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return (lines[0] if lines else type(exc).__name__)[:limit]


def compile_static(mod: ModuleType, shape: Shape, config: dict,
                   max_shared: int | None, load: bool = True) -> tuple[StaticInfo, object]:
    """Compile through ``KERNEL.warmup`` and read the resources. Raises on compile errors and
    on OutOfResources from loading; shared memory over ``max_shared`` returns before loading
    (registers and spills then stay unknown)."""
    keep: list = []
    args = {k: _materialize(v, keep) for k, v in mod.compile_args(shape, config).items()}
    options = {k: v for k, v in config.items() if k.islower()}
    t0 = time.perf_counter()
    compiled = mod.KERNEL.warmup(**args, grid=(1,), **options)
    compile_s = time.perf_counter() - t0
    meta = compiled.metadata
    num_warps = getattr(meta, "num_warps", config.get("num_warps"))
    info = StaticInfo(shared_mem_bytes=int(meta.shared), threads_per_block=int(num_warps) * 32,
                      compiled_name=getattr(compiled, "name", None),
                      compiled_hash=getattr(compiled, "hash", None), compile_s=compile_s)
    if max_shared is not None and info.shared_mem_bytes > max_shared:
        return info, compiled  # the caller records OUT_OF_RESOURCES without loading it
    if load:
        init = getattr(compiled, "_init_handles", None)
        if init is not None:
            init()
        else:  # older layout: the ``run`` property loads the binary
            _ = compiled.run
        info = replace(info, registers_per_thread=int(compiled.n_regs),
                       n_spills=int(compiled.n_spills))
    return info, compiled


def _poison(t) -> None:
    import torch

    if t.dtype.is_floating_point:
        t.fill_(float("nan"))
    else:
        t.fill_(torch.iinfo(t.dtype).max)


def check_outputs(out, ref, tol, seed: int, t0: float) -> CheckResult:
    """||out - ref|| / ||ref|| in float64, NaN/Inf count and the elementwise atol/rtol."""
    import torch

    out_f = out.float()
    ref_f = ref.float()
    nonfinite = int((~torch.isfinite(out_f)).sum().item())
    diff = out_f - ref_f
    ref_norm = float(torch.linalg.vector_norm(ref_f, dtype=torch.float64).item())
    err_norm = float(torch.linalg.vector_norm(diff, dtype=torch.float64).item())
    rel = err_norm / ref_norm if ref_norm > 0 else (0.0 if err_norm == 0 else math.inf)
    max_abs = float(diff.abs().max().item()) if diff.numel() else 0.0
    violations = None
    if tol.atol > 0 or tol.rtol > 0:
        violations = int((diff.abs() > tol.atol + tol.rtol * ref_f.abs()).sum().item())
    correct = (nonfinite == 0 and math.isfinite(rel) and rel <= tol.max_rel_l2
               and (violations is None or violations == 0))
    return CheckResult(correct=correct, max_rel_error=rel if math.isfinite(rel) else None,
                       max_abs_error=max_abs if math.isfinite(max_abs) else None,
                       nonfinite_outputs=nonfinite, elementwise_violations=violations,
                       check_seed=seed, check_s=time.perf_counter() - t0)


def check_config(mod: ModuleType, shape: Shape, config: dict, seed: int) -> CheckResult:
    import torch

    t0 = time.perf_counter()
    inputs = mod.make_inputs(shape, "cuda", seed)
    out = mod.launch(inputs, config)
    _poison(out)
    out = mod.launch(inputs, config, out=out)
    torch.cuda.synchronize()
    ref = mod.reference(inputs)
    return check_outputs(out, ref, mod.TOLERANCE, seed, t0)


def check_baseline(fn: Callable[[dict], object], mod: ModuleType, shape: Shape,
                   seed: int) -> CheckResult:
    import torch

    t0 = time.perf_counter()
    inputs = mod.make_inputs(shape, "cuda", seed)
    out = fn(inputs)
    torch.cuda.synchronize()
    ref = mod.reference(inputs)
    return check_outputs(out, ref, mod.TOLERANCE, seed, t0)


def _is_fatal_cuda(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(s in text for s in ("illegal memory access", "unspecified launch failure",
                                   "misaligned address", "illegal instruction",
                                   "cuda error", "device-side assert", "an illegal"))


class _Writer:
    """Appends one line per record and flushes, so a crash loses nothing written."""

    def __init__(self, path: Path, progress: Path | None = None):
        self.path = path
        self.progress = progress

    def write(self, record: object) -> None:
        with self.path.open("a") as fh:
            fh.write(to_json_line(record) + "\n")

    def mark(self, what: str) -> None:
        if self.progress is not None:
            self.progress.write_text(what)
        print(f"[bench] {what}", flush=True)


def _shape_by_name(mod: ModuleType, name: str) -> Shape:
    for s in mod.SHAPES:
        if s.name == name:
            return s
    raise KeyError(f"{mod.NAME}: no shape {name!r}")


def _baseline_variants(mod: ModuleType) -> list[tuple[str | None, Callable[[dict], object]]]:
    """The contract's ``baseline``, plus SDPA's FLASH backend pinned where a module offers
    ``baseline_pinned`` (the issue's attention target is against FLASH)."""
    variants: list[tuple[str | None, Callable[[dict], object]]] = [(None, mod.baseline)]
    pinned = getattr(mod, "baseline_pinned", None)
    if callable(pinned):
        variants.append(("FLASH_ATTENTION", lambda inputs: pinned(inputs, "FLASH_ATTENTION")))
    return variants


def _baseline_name(mod: ModuleType, variant: str | None) -> str:
    name = mod.BASELINE_NAME
    probe = getattr(mod, "baseline_name", None)
    if callable(probe):
        try:
            name = probe("cuda")
        except Exception:  # the probe failed: keep the declared name
            pass
    return name if variant is None else f"{name}[{variant}]"


def _mark(shape_name: str, label: str) -> str:
    """The progress marker of one step: ``<shape>|<config id or baseline label>``."""
    return f"{shape_name}|{label}"


def _bench_baselines(mod: ModuleType, kinfo: KernelInfo, shape: Shape, dev: DeviceInfo,
                     writer: _Writer, flush, opts: BenchOptions, timing_inputs: dict,
                     seed: int, common: dict) -> tuple[int, bool]:
    """Check and time the baseline(s) of one shape; returns (next seed, fatal)."""
    import torch

    for variant, fn in _baseline_variants(mod):
        label = "baseline" if variant is None else f"baseline[{variant}]"
        writer.mark(_mark(shape.name, label))
        seed += 1
        try:
            check = check_baseline(fn, mod, shape, seed)
            timing = time_gpu(lambda: fn(timing_inputs), flush, opts.rule, opts.warmup_s)
            status = RunStatus.OK if check.correct else RunStatus.FAILED_CORRECTNESS
            msg = None if check.correct else (
                f"baseline incorrect: rel err {check.max_rel_error}, "
                f"{check.nonfinite_outputs} non-finite, "
                f"{check.elementwise_violations} elementwise violations")
            writer.write(build_record(
                RecordType.BASELINE, kinfo, shape, dev, status=status, message=msg,
                check=check, timing=timing, baseline_name=_baseline_name(mod, variant),
                baseline_variant=variant, **common))
        except Exception as exc:  # recorded, then the sweep goes on
            status = RunStatus.OOM if isinstance(exc, torch.cuda.OutOfMemoryError) else RunStatus.ERROR
            writer.write(build_record(
                RecordType.BASELINE, kinfo, shape, dev, status=status,
                message=_first_line(exc), baseline_name=_baseline_name(mod, variant),
                baseline_variant=variant, **common))
            torch.cuda.empty_cache()
            if _is_fatal_cuda(exc):
                return seed, True
    return seed, False


def _bench_config(mod: ModuleType, kinfo: KernelInfo, shape: Shape, config: dict,
                  dev: DeviceInfo, writer: _Writer, flush, opts: BenchOptions,
                  timing_inputs: dict, seed: int, common: dict) -> bool:
    """Compile, prune, check and time one config at one shape; returns True when the CUDA
    context is no longer usable."""
    import torch

    grid = tuple(mod.grid(shape, config))
    rec = dict(config=config, grid=grid, **common)
    try:
        static, _compiled = compile_static(mod, shape, config, dev.max_shared_mem_bytes)
    except Exception as exc:
        status = RunStatus.OUT_OF_RESOURCES if _is_out_of_resources(exc) else RunStatus.COMPILE_ERROR
        writer.write(build_record(RecordType.RUN, kinfo, shape, dev, status=status,
                                  message=_first_line(exc), **rec))
        return _is_fatal_cuda(exc)
    if dev.max_shared_mem_bytes is not None and static.shared_mem_bytes > dev.max_shared_mem_bytes:
        writer.write(build_record(
            RecordType.RUN, kinfo, shape, dev, status=RunStatus.OUT_OF_RESOURCES, static=static,
            message=(f"shared memory {static.shared_mem_bytes} B > device opt-in limit "
                     f"{dev.max_shared_mem_bytes} B (checked before launch)"), **rec))
        return False
    spill = static.spill_bytes or 0
    if opts.prune and spill > opts.spill_threshold_bytes:
        writer.write(build_record(
            RecordType.RUN, kinfo, shape, dev, status=RunStatus.PRUNED_SPILL, static=static,
            message=f"pruned: {spill} local/spill bytes > threshold {opts.spill_threshold_bytes}",
            **rec))
        return False
    before = _jit_cache_size(mod.KERNEL)
    check = None
    try:
        check = check_config(mod, shape, config, seed)
        after = _jit_cache_size(mod.KERNEL)
        matches = None if before is None or after is None else before == after
        out = mod.launch(timing_inputs, config)
        timing = time_gpu(lambda: mod.launch(timing_inputs, config, out=out), flush,
                          opts.rule, opts.warmup_s)
        del out
        if check.correct:
            status, msg = RunStatus.OK, None
        else:  # timed for the record, never a win: comparisons see FAILED_CORRECTNESS
            status = RunStatus.FAILED_CORRECTNESS
            msg = (f"incorrect (timed, never a win): rel err {check.max_rel_error} vs "
                   f"{mod.TOLERANCE.max_rel_l2}, {check.nonfinite_outputs} non-finite, "
                   f"{check.elementwise_violations} elementwise violations "
                   f"(atol {mod.TOLERANCE.atol}, rtol {mod.TOLERANCE.rtol})")
        writer.write(build_record(
            RecordType.RUN, kinfo, shape, dev, status=status, message=msg, static=static,
            check=check, timing=timing, launch_matches_compile=matches, **rec))
    except Exception as exc:
        if _is_out_of_resources(exc):
            status = RunStatus.OUT_OF_RESOURCES
        elif isinstance(exc, torch.cuda.OutOfMemoryError):
            status = RunStatus.OOM
        elif _is_fatal_cuda(exc):
            status = RunStatus.CRASHED
        else:
            status = RunStatus.ERROR
        writer.write(build_record(RecordType.RUN, kinfo, shape, dev, status=status,
                                  message=_first_line(exc), static=static, check=check, **rec))
        if status is RunStatus.CRASHED:
            return True
        torch.cuda.empty_cache()
        try:
            torch.cuda.synchronize()
        except Exception:
            return True
    return False


def sweep_worker(spec: dict) -> int:
    """One kernel: for each shape in ``items`` order, its baseline(s) then its configs; rows
    are appended as they finish."""
    import torch

    mod = load_kernel_module(spec["kernel_path"])
    opts = BenchOptions(**spec["options"])
    kinfo = KernelInfo.of(mod)
    dev = device_info(spec.get("driver_version"))
    writer = _Writer(Path(spec["rows_path"]), Path(spec["progress_path"]))
    attempt = int(spec.get("attempt", 0))
    seed = opts.seed + 7919 * attempt
    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    skip_baseline = set(spec.get("skip_baseline_shapes", []))
    by_id = {config_id(c): c for c in mod.CONFIGS}
    by_shape: dict[str, list[str]] = {}
    for shape_name, cid in spec["items"]:
        by_shape.setdefault(shape_name, []).append(cid)
    for shape_name in spec["shapes"]:
        shape = _shape_by_name(mod, shape_name)
        writer.mark(_mark(shape_name, "inputs"))
        timing_inputs = mod.make_inputs(shape, "cuda", opts.seed)
        common = dict(flops=float(mod.flops(shape)), bytes_moved=float(mod.bytes_moved(shape)),
                      attempt=attempt)
        if shape_name not in skip_baseline:
            seed, fatal = _bench_baselines(mod, kinfo, shape, dev, writer, flush, opts,
                                           timing_inputs, seed, common)
            if fatal:
                return EXIT_CUDA_FATAL
        for cid in by_shape.get(shape_name, []):
            writer.mark(_mark(shape_name, cid))
            seed += 1
            if _bench_config(mod, kinfo, shape, by_id[cid], dev, writer, flush, opts,
                             timing_inputs, seed, common):
                return EXIT_CUDA_FATAL
        del timing_inputs
        torch.cuda.empty_cache()
    writer.mark("done")
    return 0


def precompile_worker(spec: dict) -> int:
    """Fill Triton's on-disk cache for a slice of (kernel, config) x shapes, in parallel with
    other such workers, so the timed sweep does not wait on one compile at a time."""
    import torch  # noqa: F401  (the JIT needs the CUDA driver to pick its target)

    done = 0
    for task in spec["tasks"]:
        mod = load_kernel_module(task["kernel_path"])
        config = {config_id(c): c for c in mod.CONFIGS}[task["config_id"]]
        for shape_name in task["shapes"]:
            shape = _shape_by_name(mod, shape_name)
            try:
                compile_static(mod, shape, config, None, load=False)
                done += 1
            except Exception as exc:  # the timed sweep records it properly
                print(f"[precompile] {mod.NAME} {task['config_id']} {shape_name}: "
                      f"{_first_line(exc, 160)}", flush=True)
    print(f"[precompile] {done} compiles", flush=True)
    return 0


def peaks_worker(spec: dict) -> int:
    from kernaudit_pipeline.bench import peaks

    opts = BenchOptions(**spec["options"])
    writer = _Writer(Path(spec["rows_path"]), Path(spec["progress_path"]))
    dev = device_info(spec.get("driver_version"))
    for record in peaks.measure_peaks(dev, opts.rule, writer.mark):
        writer.write(record)
    writer.mark("done")
    return 0


def worker_main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    mode = spec["mode"]
    if mode == "sweep":
        return sweep_worker(spec)
    if mode == "precompile":
        return precompile_worker(spec)
    if mode == "peaks":
        return peaks_worker(spec)
    raise ValueError(f"unknown worker mode {mode!r}")


# --------------------------------------------------------------------------------------------
# Parent side: plan, supervise workers, assemble the JSONL
# --------------------------------------------------------------------------------------------
@dataclass
class _Group:
    """One kernel to sweep in one worker process (respawned after a crash)."""

    path: Path
    mod: ModuleType
    shapes: list[Shape]
    configs: list[dict]


@dataclass
class _Sweep:
    out: Path
    options: BenchOptions
    deadline: float
    work_dir: Path
    driver_version: str | None
    device: DeviceInfo
    rows: list[dict] = field(default_factory=list)
    precompile_wall_s: float = 0.0

    def emit(self, row: dict) -> None:
        self.rows.append(row)
        with self.out.open("a") as fh:
            fh.write(to_json_line(row) + "\n")


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _spawn(spec: dict, work_dir: Path, tag: str) -> tuple[subprocess.Popen, Path]:
    spec_path = work_dir / f"{tag}.spec.json"
    spec_path.write_text(json.dumps(spec))
    log_path = work_dir / f"{tag}.log"
    log = log_path.open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernaudit_pipeline.bench.runner", "--worker", str(spec_path)],
        stdout=log, stderr=subprocess.STDOUT, env=_worker_env(), cwd=str(REPO_ROOT),
        start_new_session=True)
    log.close()
    return proc, log_path


def _kill(proc: subprocess.Popen) -> None:
    """End a worker we started, and its children, by its own process group id."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by a crash
            continue
    return rows


def _classify_exit(log_tail: str, killed_for: str | None, returncode: int | None) -> tuple[RunStatus, str]:
    if killed_for is not None:
        return RunStatus.TIMEOUT, killed_for
    lower = log_tail.lower()
    lines = [ln.strip() for ln in log_tail.splitlines()
             if ln.strip() and not ln.startswith("[bench]")]
    last = lines[-1][:400] if lines else ""
    if "out of memory" in lower:
        return RunStatus.OOM, f"worker exit {returncode}: {last}"
    return RunStatus.CRASHED, f"worker exit {returncode}: {last}"


def _supervise(spec: dict, sweep: _Sweep, tag: str, per_step_timeout_s: float,
               echo: bool = True) -> tuple[int | None, str | None, str]:
    """Run one worker to completion, killing it when the step in flight outlasts
    ``per_step_timeout_s`` or the sweep passes its deadline. Returns (returncode,
    killed_for, progress marker at exit)."""
    progress = Path(spec["progress_path"])
    progress.write_text("")
    proc, log_path = _spawn(spec, sweep.work_dir, tag)
    killed_for = None
    step, step_started = "", time.monotonic()
    printed = 0
    while True:
        rc = proc.poll()
        try:
            current = progress.read_text()
        except OSError:
            current = step
        if current != step:
            step, step_started = current, time.monotonic()
        if echo:
            printed = _echo_new(log_path, printed)
        if rc is not None:
            break
        now = time.monotonic()
        if now - step_started > per_step_timeout_s:
            killed_for = f"step {step or 'start-up'!r} ran over {per_step_timeout_s:.0f} s"
            _kill(proc)
            break
        if now > sweep.deadline:
            killed_for = f"sweep deadline reached during {step or 'start-up'!r}"
            _kill(proc)
            break
        time.sleep(0.2)
    if echo:
        _echo_new(log_path, printed)
    try:
        final = progress.read_text()
    except OSError:
        final = step
    return proc.returncode, killed_for, final


def _echo_new(log_path: Path, printed: int) -> int:
    try:
        data = log_path.read_bytes()
    except OSError:
        return printed
    if len(data) > printed:
        sys.stdout.write(data[printed:].decode(errors="replace"))
        sys.stdout.flush()
    return len(data)


def _log_tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def _failure_row(group: _Group, kinfo: KernelInfo, shape: Shape, config: dict,
                 status: RunStatus, message: str, sweep: _Sweep, attempt: int | None) -> dict:
    return asdict(build_record(
        RecordType.RUN, kinfo, shape, sweep.device, config=config, status=status,
        message=message, grid=tuple(group.mod.grid(shape, config)),
        flops=float(group.mod.flops(shape)), bytes_moved=float(group.mod.bytes_moved(shape)),
        attempt=attempt))


def run_group(group: _Group, sweep: _Sweep, max_attempts: int = 8) -> None:
    """Sweep one kernel through as many workers as crashes require: the step in flight when a
    worker dies becomes a failure row, and a new worker carries on after it."""
    kinfo = KernelInfo.of(group.mod)
    shapes = {s.name: s for s in group.shapes}
    by_id = {config_id(c): c for c in group.configs}
    todo = [(s.name, config_id(c)) for s in group.shapes for c in group.configs]
    todo_shapes = [s.name for s in group.shapes]
    skip_baseline: set[str] = set()
    attempt = 0
    last_failure = ""
    stem = group.path.stem
    while todo_shapes and attempt < max_attempts and time.monotonic() < sweep.deadline:
        tag = f"{stem}.{attempt}"
        rows_path = sweep.work_dir / f"{tag}.rows.jsonl"
        spec = {"mode": "sweep", "kernel_path": str(group.path), "shapes": todo_shapes,
                "items": todo, "skip_baseline_shapes": sorted(skip_baseline), "attempt": attempt,
                "rows_path": str(rows_path), "progress_path": str(sweep.work_dir / f"{tag}.progress"),
                "options": asdict(sweep.options), "driver_version": sweep.driver_version}
        rc, killed_for, final = _supervise(spec, sweep, tag, sweep.options.timeout_s)
        rows = _read_rows(rows_path)
        baselines = {r.get("shape_name"): r for r in rows
                     if r.get("record_type") == RecordType.BASELINE.value
                     and r.get("baseline_variant") is None}
        done: set[tuple[str, str]] = set()
        for row in rows:
            if row.get("record_type") == RecordType.RUN.value:
                row = with_baseline(row, baselines.get(row.get("shape_name")))
                done.add((row.get("shape_name"), row.get("config_id")))
            sweep.emit(row)
        finished_ok = rc == 0 and killed_for is None
        if not finished_ok:
            status, message = _classify_exit(_log_tail(sweep.work_dir / f"{tag}.log"), killed_for, rc)
            last_failure = message
            shape_name, _, label = final.partition("|")
            if shape_name in shapes and label.startswith("baseline"):
                variant = label[len("baseline["):-1] if label.startswith("baseline[") else None
                if not any(r.get("shape_name") == shape_name and r.get("config_id") == label
                           for r in rows):
                    sweep.emit(asdict(build_record(
                        RecordType.BASELINE, kinfo, shapes[shape_name], sweep.device,
                        status=status, message=message, baseline_variant=variant,
                        attempt=attempt)))
                skip_baseline.add(shape_name)  # a baseline that hangs or crashes would again
            elif shape_name in shapes and label in by_id and (shape_name, label) not in done:
                sweep.emit(with_baseline(
                    _failure_row(group, kinfo, shapes[shape_name], by_id[label], status, message,
                                 sweep, attempt), baselines.get(shape_name)))
                done.add((shape_name, label))
            elif shape_name in shapes and label == "inputs":
                # the inputs themselves cannot be made: every config of that shape fails so
                for cid in by_id:
                    if (shape_name, cid) not in done:
                        sweep.emit(_failure_row(group, kinfo, shapes[shape_name], by_id[cid],
                                                status, f"inputs: {message}", sweep, attempt))
                        done.add((shape_name, cid))
                skip_baseline.add(shape_name)
            elif not rows:
                print(f"[bench] {stem}: worker failed before its first step: {message}", flush=True)
                attempt = max_attempts  # no progress possible
        todo = [item for item in todo if item not in done]
        # Shapes whose baselines already ran in an earlier worker keep theirs only if the
        # worker finished them; a shape is dropped once it has nothing left to do.
        remaining = {s for s, _ in todo}
        todo_shapes = [s for s in todo_shapes if s in remaining]
        attempt += 1
        if finished_ok:
            break
    reason = ("sweep deadline reached" if time.monotonic() >= sweep.deadline
              else f"worker gave up: {last_failure}")
    for shape_name, cid in todo:
        sweep.emit(_failure_row(group, kinfo, shapes[shape_name], by_id[cid], RunStatus.NOT_RUN,
                                reason, sweep, None))


def run_peaks(sweep: _Sweep, timeout_s: float = 240.0) -> None:
    tag = "peaks"
    rows_path = sweep.work_dir / "peaks.rows.jsonl"
    spec = {"mode": "peaks", "rows_path": str(rows_path),
            "progress_path": str(sweep.work_dir / "peaks.progress"),
            "options": asdict(sweep.options), "driver_version": sweep.driver_version}
    rc, killed_for, final = _supervise(spec, sweep, tag, timeout_s)
    for row in _read_rows(rows_path):
        sweep.emit(row)
    if rc != 0 or killed_for is not None:
        print(f"[bench] peaks worker ended at {final!r}: rc={rc} {killed_for or ''}", flush=True)


def precompile(groups: list[_Group], sweep: _Sweep, jobs: int, budget_s: float) -> None:
    """Compile every (kernel, config, shape) in ``jobs`` parallel processes into the on-disk
    cache; stragglers are killed at ``budget_s`` (the sweep then compiles them itself)."""
    tasks: dict[tuple[str, str], list[str]] = {}
    for g in groups:
        for c in g.configs:
            tasks.setdefault((str(g.path), config_id(c)), []).extend(s.name for s in g.shapes)
    items = [{"kernel_path": k, "config_id": c, "shapes": s} for (k, c), s in tasks.items()]
    if not items or jobs <= 1:
        return
    t0 = time.monotonic()
    procs = []
    for j in range(min(jobs, len(items))):
        spec = {"mode": "precompile", "tasks": items[j::jobs]}
        procs.append(_spawn(spec, sweep.work_dir, f"precompile.{j}")[0])
    end = min(t0 + budget_s, sweep.deadline)
    while any(p.poll() is None for p in procs) and time.monotonic() < end:
        time.sleep(0.25)
    stragglers = [p for p in procs if p.poll() is None]
    for p in stragglers:
        _kill(p)
    sweep.precompile_wall_s = time.monotonic() - t0
    print(f"[bench] precompile: {len(items)} (kernel, config) tasks in {jobs} processes, "
          f"{sweep.precompile_wall_s:.1f} s, {len(stragglers)} killed at the budget", flush=True)


def _best(rows: list[dict]) -> list[dict]:
    """Fastest correct config per (kernel, shape) against the same-process baseline."""
    best: dict[tuple[str, str], dict] = {}
    for r in rows:
        if r.get("record_type") != RecordType.RUN.value or r.get("run_status") != RunStatus.OK.value:
            continue
        key = (r["kernel_name"], r["shape_name"])
        if key not in best or r["latency_us"] < best[key]["latency_us"]:
            best[key] = r
    out = []
    for (kname, sname), r in sorted(best.items()):
        base = r.get("baseline_us")
        out.append({"kernel_name": kname, "shape_name": sname, "config_id": r["config_id"],
                    "latency_us": r["latency_us"], "baseline_name": r.get("baseline_name"),
                    "baseline_us": base,
                    "speedup": (base / r["latency_us"]) if base else None})
    return out


def summary_record(sweep: _Sweep, started_wall: float, args: argparse.Namespace,
                   kernels: list[str], shapes: list[str]) -> dict:
    rows = sweep.rows
    counts: dict[str, int] = {}
    for r in rows:
        if r.get("record_type") in (RecordType.RUN.value, RecordType.BASELINE.value):
            key = f"{r['record_type']}:{r.get('run_status')}"
            counts[key] = counts.get(key, 0) + 1
    check_s = sum(r.get("check_s") or 0.0 for r in rows)
    timing_s = sum(r.get("timing_s") or 0.0 for r in rows)
    compile_s = sum(r.get("compile_s") or 0.0 for r in rows)
    dev = asdict(sweep.device)
    return {
        "record_type": RecordType.SUMMARY.value,
        "sweep_wall_s": time.time() - started_wall,
        "gpu_busy_s": check_s + timing_s,
        "check_s": check_s, "timing_s": timing_s, "compile_s": compile_s,
        "precompile_wall_s": sweep.precompile_wall_s,
        "status_counts": counts,
        "configs_timed": counts.get("run:OK", 0),
        "best": _best(rows),
        "kernels": kernels, "shapes": shapes,
        "prune": sweep.options.prune, "spill_threshold_bytes": sweep.options.spill_threshold_bytes,
        "rsd_target": sweep.options.rsd_target, "min_samples": sweep.options.min_samples,
        "max_seconds_per_config": sweep.options.max_seconds_per_config,
        "timeout_s": sweep.options.timeout_s, "deadline_s": args.deadline_s,
        "quick": bool(args.quick), "argv": list(args.argv_copy),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started_wall)),
        "python_version": platform.python_version(),
        **dev,
    }


def _peak_values(rows: list[dict]) -> dict[str, float]:
    out = {}
    for r in rows:
        if r.get("record_type") == RecordType.PEAK.value:
            value = r.get("peak_tflops") if r.get("peak_tflops") is not None else r.get("peak_gb_per_s")
            if value is not None:
                out[r["peak_name"]] = float(value)
    return out


def print_table(rows: list[dict]) -> None:
    """The short table the GPU log ends with."""
    peaks = _peak_values(rows)
    for name, value in peaks.items():
        print(f"peak {name}: {value:.1f}")
    best = _best(rows)
    header = f"{'kernel':<22} {'shape':<30} {'best config':<28} {'us':>9} {'base us':>9} {'x':>6} {'TFLOP/s':>8}"
    print(header)
    by_key = {(r["kernel_name"], r["shape_name"], r["config_id"]): r for r in rows
              if r.get("record_type") == RecordType.RUN.value}
    for b in best:
        r = by_key.get((b["kernel_name"], b["shape_name"], b["config_id"]), {})
        tflops = (r.get("flops") or 0) / (b["latency_us"] * 1e-6) / 1e12
        base = f"{b['baseline_us']:9.1f}" if b["baseline_us"] else f"{'-':>9}"
        x = f"{b['speedup']:6.2f}" if b["speedup"] else f"{'-':>6}"
        print(f"{b['kernel_name']:<22} {b['shape_name']:<30} {b['config_id']:<28} "
              f"{b['latency_us']:9.1f} {base} {x} {tflops:8.1f}")
    counts: dict[str, int] = {}
    for r in rows:
        if r.get("record_type") == RecordType.RUN.value:
            counts[r["run_status"]] = counts.get(r["run_status"], 0) + 1
    print("run statuses: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))


def _resolve_kernels(names: list[str], kernels_dir: Path) -> list[tuple[Path, ModuleType]]:
    files = kernel_files(kernels_dir)
    if not files:
        raise ValueError(f"no kernel modules in {kernels_dir}")
    loaded = []
    for path in files:
        loaded.append((path, load_kernel_module(path)))
    if not names:
        return loaded
    picked = []
    for name in names:
        match = [(p, m) for p, m in loaded if name in (p.stem, getattr(m, "NAME", None))]
        if not match:
            known = ", ".join(f"{p.stem}" for p, _ in loaded)
            raise ValueError(f"unknown kernel {name!r} (known: {known})")
        picked.extend(match)
    return picked


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Time Triton kernels against their "
                                "PyTorch baselines on this GPU and write JSONL traces.")
    p.add_argument("kernels", nargs="*", metavar="KERNEL",
                   help="kernel module stems or NAMEs (default: every module in kernels/)")
    p.add_argument("--shapes", nargs="+", metavar="NAME", help="only these shape names")
    p.add_argument("--configs", nargs="+", metavar="ID", help="only these config ids")
    p.add_argument("--max-configs", type=int, help="only the first N configs of each kernel")
    p.add_argument("--out", default="bench_runs.jsonl", help="JSONL output (appended rows)")
    p.add_argument("--no-prune", action="store_true", help="also time configs that spill")
    p.add_argument("--spill-threshold-bytes", type=int, default=0,
                   help="prune configs spilling more than this (default 0: any spill)")
    p.add_argument("--rsd-target", type=float, default=0.01,
                   help="stop sampling when the RSD reaches this fraction (default 0.01)")
    p.add_argument("--min-samples", type=int, default=10)
    p.add_argument("--max-seconds-per-config", type=float, default=1.0,
                   help="time cap for sampling one config (default 1.0)")
    p.add_argument("--timeout-s", type=float, default=180.0,
                   help="kill a worker whose current step (compile+check+timing) exceeds this")
    p.add_argument("--deadline-s", type=float, default=None,
                   help="stop the whole sweep after this many seconds (rest: NOT_RUN)")
    p.add_argument("--jobs", type=int, default=None,
                   help="parallel precompile processes (default: CPU count - 2, max 12)")
    p.add_argument("--precompile-s", type=float, default=150.0,
                   help="budget for the parallel precompile (default 150)")
    p.add_argument("--no-peaks", action="store_true", help="skip the peak ceilings")
    p.add_argument("--quick", action="store_true",
                   help="first shape of each kernel, 5 samples minimum, 0.25 s cap")
    p.add_argument("--kernels-dir", default=str(KERNELS_DIR), help=argparse.SUPPRESS)
    return p


class _ArgError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, no usage dump
        raise _ArgError(message)


def cli(argv: list[str]) -> int:
    argv = list(argv)
    if argv[:1] == ["--worker"]:
        if len(argv) != 2:
            print(f"{PROG}: --worker takes one spec path", file=sys.stderr)
            return 2
        return worker_main(argv[1])
    parser = build_parser()
    parser.__class__ = _Parser
    try:
        args = parser.parse_args(argv)
    except _ArgError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    args.argv_copy = argv
    for name in ("rsd_target", "max_seconds_per_config", "timeout_s"):
        if getattr(args, name) <= 0:
            print(f"{PROG}: --{name.replace('_', '-')} must be positive", file=sys.stderr)
            return 2
    try:
        picked = _resolve_kernels(args.kernels, Path(args.kernels_dir))
    except (ValueError, FileNotFoundError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a kernel module that fails to import
        print(f"{PROG}: cannot load kernel modules: {_first_line(exc, 200)}", file=sys.stderr)
        return 2

    groups: list[_Group] = []
    for path, mod in picked:
        shapes = list(mod.SHAPES)
        if args.shapes:
            shapes = [s for s in shapes if s.name in args.shapes]
        elif args.quick:
            shapes = shapes[:1]
        configs = list(mod.CONFIGS)
        if args.configs:
            configs = [c for c in configs if config_id(c) in args.configs]
        if args.max_configs is not None:
            configs = configs[:args.max_configs]
        if shapes:
            groups.append(_Group(path, mod, shapes, configs))
    if not groups:
        print(f"{PROG}: no (kernel, shape) pairs match the filters", file=sys.stderr)
        return 2

    import torch

    if not torch.cuda.is_available():
        print(f"{PROG}: no CUDA GPU visible (torch {torch.__version__}, "
              f"torch.cuda.is_available() is False)", file=sys.stderr)
        return 2

    started_wall = time.time()
    start = time.monotonic()
    deadline = start + (args.deadline_s if args.deadline_s else 10 * 86400)
    quick = args.quick
    options = BenchOptions(
        rsd_target=args.rsd_target,
        min_samples=5 if quick and args.min_samples == 10 else args.min_samples,
        max_seconds_per_config=(0.25 if quick and args.max_seconds_per_config == 1.0
                                else args.max_seconds_per_config),
        prune=not args.no_prune, spill_threshold_bytes=args.spill_threshold_bytes,
        timeout_s=args.timeout_s)
    smi = nvidia_smi_query("name,driver_version,compute_cap")
    import triton

    device = DeviceInfo(device_name=smi[0] if smi else None,
                        compute_capability=smi[2] if smi and len(smi) > 2 else None,
                        driver_version=smi[1] if smi and len(smi) > 1 else None,
                        cuda_version=torch.version.cuda, torch_version=torch.__version__,
                        triton_version=triton.__version__)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("")
    with tempfile.TemporaryDirectory(prefix="kernaudit-bench-") as tmp:
        sweep = _Sweep(out=out, options=options, deadline=deadline, work_dir=Path(tmp),
                       driver_version=device.driver_version, device=device)
        if not args.no_peaks:
            run_peaks(sweep)
        jobs = args.jobs if args.jobs is not None else max(1, min(12, (os.cpu_count() or 2) - 2))
        precompile(groups, sweep, jobs, args.precompile_s)
        for group in groups:
            if time.monotonic() >= deadline:
                run_group(group, sweep)  # records NOT_RUN rows only
                continue
            print(f"[bench] {group.mod.NAME}: {len(group.shapes)} shapes x "
                  f"{len(group.configs)} configs", flush=True)
            run_group(group, sweep)
        summary = summary_record(sweep, started_wall, args,
                                 sorted({g.mod.NAME for g in groups}),
                                 sorted({s.name for g in groups for s in g.shapes}))
        sweep.emit(summary)
    print_table(sweep.rows)
    print(f"[bench] wrote {len(sweep.rows)} rows to {out} "
          f"(sweep {summary['sweep_wall_s']:.1f} s, GPU busy {summary['gpu_busy_s']:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
