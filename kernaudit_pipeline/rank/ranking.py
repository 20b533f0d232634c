"""Rank a config space without a GPU: compile it ahead of time, drop what cannot win, order the
rest by predicted time.

What is dropped, and why:

- what cannot launch: shared memory over the block limit, too many threads, a compile error or
  timeout (the static audit's verdict), or no resident block by the occupancy arithmetic;
- heavy spills, >= 512 B per thread: on the H200 such configs were always far from the best
  (ANCHORS). Smaller spills stay in the ranking with the model's spill factor: in an exhaustive
  attention sweep the fastest config spilled 72 B per thread.

Every number here is a prediction (``data_kind = predicted``). Configs whose predicted time is
within the model's stated error of the best are marked ``within_error_of_best``: the ranking
cannot tell them apart, and on the H200 the top configs are often within 2 % of each other.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType

from kernaudit_pipeline.core.hardware import GPUSpec, lookup, sm_resources
from kernaudit_pipeline.core.verdicts import DataKind
from kernaudit_pipeline.rank.features import Features, build
from kernaudit_pipeline.rank.model import HEAVY_SPILL_BYTES, Calibration, load_calibration, predict
from kernaudit_pipeline.static_resources import (
    ARCHS, DEFAULT_TIMEOUT_S, KernelDescription, KernelFailure, PlanItem, StaticResult,
    describe_kernels, sweep_report,
)
from kernaudit_pipeline.static_resources.results import CompileStatus

DEFAULT_DEVICE = "NVIDIA H200"


@dataclass(frozen=True)
class RankedConfig:
    config_id: str
    config: dict
    predicted_us: float
    predicted_rank: int
    relative_to_best: float
    within_error_of_best: bool
    bound: str  # which term dominates: compute, l2 or dram
    registers_per_thread: int
    spill_stores_bytes: int
    shared_mem_bytes: int
    blocks_per_sm: int
    occupancy_pct: float
    occupancy_limiter: str
    programs: int
    waves: float
    data_kind: str = DataKind.PREDICTED.value


@dataclass(frozen=True)
class Dropped:
    config_id: str
    reason: str


@dataclass(frozen=True)
class ShapeRanking:
    kernel_name: str
    shape_name: str
    device_name: str
    arch: str
    stated_error: float
    memory_bound: bool
    ranked: list[RankedConfig] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)
    data_kind: str = DataKind.PREDICTED.value

    def to_dict(self) -> dict:
        return asdict(self)


def _drop_reason(result: StaticResult) -> str | None:
    if result.status is not CompileStatus.OK:
        return f"{result.status.value}: {result.message}"
    spill = result.spill_stores_bytes or 0
    if spill >= HEAVY_SPILL_BYTES:
        return (f"spills {spill} B/thread (>= {HEAVY_SPILL_BYTES}): heavy spills were always far "
                "from the best on the H200")
    return None


def rank_results(desc: KernelDescription, results: list[StaticResult], *,
                 calibration: Calibration | None = None, device_name: str = DEFAULT_DEVICE,
                 shapes: list[str] | None = None) -> list[ShapeRanking]:
    """One ranking per shape from the static audit's rows of one kernel."""
    calibration = calibration or load_calibration()
    gpu = _gpu(device_name)
    sm = gpu.sm
    out = []
    names = shapes or [s.name for s in desc.shapes]
    for shape_name in names:
        rows = [r for r in results if r.shape_name == shape_name and r.kernel_name == desc.name]
        scored: list[tuple[float, Features, object, StaticResult]] = []
        dropped: list[Dropped] = []
        for r in rows:
            reason = _drop_reason(r)
            feats = None if reason else build(desc, r, gpu, sm)
            if reason is None and feats is None:
                reason = "cannot launch: no resident block by the occupancy arithmetic"
            if reason:
                dropped.append(Dropped(r.config_id, reason))
                continue
            b = predict(feats, calibration.params)
            scored.append((b.total_s * 1e6, feats, b, r))
        scored.sort(key=lambda t: (t[0], t[1].config_id))
        best = scored[0][0] if scored else 0.0
        ranked = [RankedConfig(
            config_id=f.config_id, config=f.config, predicted_us=round(us, 3), predicted_rank=i + 1,
            relative_to_best=round(us / best, 4) if best else 1.0,
            within_error_of_best=us <= best * (1.0 + calibration.stated_error),
            bound=b.bound, registers_per_thread=f.registers_per_thread,
            spill_stores_bytes=f.spill_bytes, shared_mem_bytes=f.shared_mem_bytes,
            blocks_per_sm=f.blocks_per_sm, occupancy_pct=round(f.occupancy_pct, 2),
            occupancy_limiter=f.limiter, programs=f.programs, waves=round(f.waves, 3),
        ) for i, (us, f, b, _r) in enumerate(scored)]
        memory_bound = scored[0][1].memory_bound if scored else False
        arch = rows[0].arch if rows else ""
        out.append(ShapeRanking(desc.name, shape_name, gpu.name, arch, calibration.stated_error,
                                memory_bound, ranked, dropped))
    return out


def _gpu(device_name: str) -> GPUSpec:
    gpu = lookup(device_name)
    if gpu is None:
        raise ValueError(f"unknown GPU {device_name!r}: the cost model needs its SM count, peak "
                         "rates and L2 size (core.hardware)")
    if sm_resources(gpu.compute_capability) is None:
        raise ValueError(f"no SM resources for compute capability {gpu.compute_capability}")
    return gpu


def arch_for(device_name: str) -> str:
    cc = _gpu(device_name).compute_capability
    arch = f"sm_{cc.replace('.', '')}"
    return arch if arch in ARCHS else "sm_90"


@dataclass(frozen=True)
class RankReport:
    rankings: list[ShapeRanking]
    failures: list[KernelFailure]
    descriptions: list[KernelDescription]


def rank_kernels(refs: list[ModuleType | str | Path], *, shapes: list[str] | None = None,
                 device_name: str = DEFAULT_DEVICE, timeout_s: float = DEFAULT_TIMEOUT_S,
                 max_workers: int | None = None, calibration: Calibration | None = None,
                 progress: bool = False, configs: dict[str, list[str]] | None = None,
                 cache_dir: Path | None = None, module_timeout_s: float | None = None) -> RankReport:
    """Describe, compile (cached) and rank each kernel's whole space at the given shapes (all
    of each kernel's shapes by default); ``configs`` limits a kernel (keyed by its NAME, file
    stem or path) to those config ids. Unknown shape names raise KeyError."""
    arch = arch_for(device_name)
    described = describe_kernels(refs, timeout_s=timeout_s, max_workers=max_workers,
                                 module_timeout_s=module_timeout_s)
    failures = [d for d in described if isinstance(d, KernelFailure)]
    descs = [d for d in described if isinstance(d, KernelDescription)]
    for d in descs:
        for s in shapes or []:
            if s not in d.module_shape_names:
                raise KeyError(f"unknown shape {s!r} for {d.name} (known: {', '.join(d.module_shape_names)})")
    def wanted(d: KernelDescription) -> list[str]:
        chosen = next((configs[k] for k in (d.name, d.stem, d.path) if configs and k in configs),
                      d.module_config_ids)
        return [c for c in chosen if c in d.module_config_ids]

    plan = [PlanItem(d, configs=wanted(d),
                     shapes=list(shapes) if shapes else None, all_shapes=True) for d in descs]
    report = sweep_report(plan, arch=arch, timeout_s=timeout_s, max_workers=max_workers,
                          progress=progress, cache_dir=cache_dir) if plan else None
    rankings: list[ShapeRanking] = []
    for d in descs:
        rows = [r for r in (report.results if report else []) if r.kernel_name == d.name]
        rankings += rank_results(d, rows, calibration=calibration, device_name=device_name,
                                 shapes=shapes)
    return RankReport(rankings, failures + (report.failures if report else []), descs)


def space_features(refs: list[ModuleType | str | Path], *, device_name: str = DEFAULT_DEVICE,
                   timeout_s: float = DEFAULT_TIMEOUT_S, max_workers: int | None = None,
                   ) -> tuple[dict[tuple[str, str, str], Features], RankReport]:
    """Features of every rankable (kernel, shape, config) of the given kernels, keyed by
    ``(kernel_name, shape_name, config_id)``: what calibration and validation score."""
    report = rank_kernels(refs, device_name=device_name, timeout_s=timeout_s, max_workers=max_workers)
    gpu = _gpu(device_name)
    arch = arch_for(device_name)
    plan = [PlanItem(d, all_shapes=True) for d in report.descriptions]
    results = sweep_report(plan, arch=arch, timeout_s=timeout_s, max_workers=max_workers,
                           progress=False).results if plan else []
    by_name = {d.name: d for d in report.descriptions}
    out: dict[tuple[str, str, str], Features] = {}
    for r in results:
        if _drop_reason(r) is not None:
            continue
        f = build(by_name[r.kernel_name], r, gpu, gpu.sm)
        if f is not None:
            out[(r.kernel_name, r.shape_name, r.config_id)] = f
    return out, report
