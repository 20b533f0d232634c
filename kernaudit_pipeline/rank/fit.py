"""Calibrate the cost model on measured sweeps and score it the way it will be used.

Measurements are the GPU runner's JSONL (``kernaudit bench``), read through the ingest parser
(``ingest.runner_jsonl``). Only the order of configs within one (kernel, shape, run) matters to
a ranking, so the fit works on log-time residuals centred per group: a run's overall clock or
power state cancels out. Configs near the measured best weigh more (they decide the pick).
The parameters also carry a weak prior toward their physical defaults (``model.Params``), so a
small calibration set cannot push them anywhere unphysical.

Scoring per group, on the configs the runner measured:

- ``top1``: measured time of the model's first pick / the measured best;
- ``top5``: best measured time among the model's first five / the measured best;
- the two simple rules the issue cites, as reference points: "largest tile, most warps" and
  "max occupancy".
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kernaudit_pipeline.core.hardware import lookup
from kernaudit_pipeline.rank.features import Features
from kernaudit_pipeline.rank.model import (
    FITTED, HEAVY_SPILL_BYTES, Calibration, Params, predict, with_values,
)

NEAR_BEST_WEIGHT = 5.0  # weight 1 / (1 + NEAR_BEST_WEIGHT * (t / t_best - 1))
PRIOR_SIGMA = 1.0       # log-space sigma of the prior on each fitted parameter


@dataclass(frozen=True)
class Measurement:
    kernel_name: str
    shape_name: str
    config_id: str
    latency_us: float
    source: str  # the file the row came from: one run, one group per shape
    speedup: float | None = None  # paired against the shape's primary reference, when measured so
    device_name: str = ""  # the GPU the runner reported; features are built for that GPU

    @property
    def group(self) -> tuple[str, str, str]:
        return (self.kernel_name, self.shape_name, self.source)

    @property
    def value(self) -> float:
        """What configs of one group are compared by (lower is better): the paired
        ``1 / speedup`` when the run paired its timings (steadier than either latency), else the
        latency. Only ratios within a group are ever used."""
        return 1.0 / self.speedup if self.speedup else self.latency_us


def load_measurements(paths: list[Path]) -> list[Measurement]:
    """Timed, correct ``run`` rows of runner JSONL files (everything else is not a timing)."""
    from kernaudit_pipeline.ingest import runner_jsonl  # noqa: PLC0415 - pandas, CPU tooling only

    out = []
    for path in paths:
        parsed = runner_jsonl.parse(Path(path), Path(path).name)
        for row in parsed.rows:
            lat = row.get("latency_us")
            if (row.get("record_type") != "run" or row.get("run_status") != "OK"
                    or not isinstance(lat, (int, float)) or not math.isfinite(lat) or lat <= 0):
                continue
            sp = row.get("speedup")
            paired = float(sp) if isinstance(sp, (int, float)) and math.isfinite(sp) and sp > 0 else None
            out.append(Measurement(str(row["kernel_name"]), str(row["shape_name"]),
                                   str(row["config_id"]), float(lat), Path(path).name, paired,
                                   str(row.get("device_name") or "")))
    return out


@dataclass
class Sample:
    features: Features
    measured_us: float  # Measurement.value: a latency, or a paired 1/speedup (ratios only)
    group: tuple[str, str, str]


def device_of(m: Measurement, default: str) -> str:
    """The spec-table name of the GPU a measurement ran on (``default`` when unknown)."""
    gpu = lookup(m.device_name) if m.device_name else None
    return gpu.name if gpu else default


def samples_for(measurements: list[Measurement],
                features: dict[str, dict[tuple[str, str, str], Features]],
                default_device: str) -> list[Sample]:
    """Measurements the model can score: those whose config the static audit kept, with the
    features of the GPU they ran on (``features`` is keyed by spec-table GPU name; a row that
    names no known GPU is taken as ``default_device``)."""
    out = []
    for m in measurements:
        key = (m.kernel_name, m.shape_name, m.config_id)
        f = features.get(device_of(m, default_device), {}).get(key)
        if f is not None:
            out.append(Sample(f, m.value, m.group))
    return out


def _groups(samples: list[Sample]) -> dict[tuple, list[Sample]]:
    by: dict[tuple, list[Sample]] = defaultdict(list)
    for s in samples:
        by[s.group].append(s)
    return {g: v for g, v in by.items() if len(v) >= 2}


def residuals(params: Params, samples: list[Sample], near_best: float = NEAR_BEST_WEIGHT) -> list[float]:
    """Weighted, group-centred log residuals (``near_best``: how much more a config near the
    measured best weighs than one far from it)."""
    out: list[float] = []
    for group in _groups(samples).values():
        best = min(s.measured_us for s in group)
        logs = [math.log(predict(s.features, params).total_s * 1e6) - math.log(s.measured_us)
                for s in group]
        weights = [1.0 / (1.0 + near_best * (s.measured_us / best - 1.0)) for s in group]
        centre = sum(w * x for w, x in zip(weights, logs)) / sum(weights)
        out += [math.sqrt(w) * (x - centre) for w, x in zip(weights, logs)]
    return out


def fit(samples: list[Sample], start: Params | None = None,
        objective: Callable[[Params, list[Sample]], list[float]] = residuals) -> Params:
    """Least squares on :func:`residuals` (or another ``objective``'s residuals, for
    experiments) plus the prior, within ``model.FITTED``'s bounds."""
    from scipy.optimize import least_squares  # noqa: PLC0415 - CPU tooling only

    start = start or Params()
    names = list(FITTED)
    prior = Params()
    x0 = [getattr(start, n) for n in names]
    scale = [max(abs(getattr(prior, n)), 1e-9) for n in names]

    def fun(xs):
        params = with_values(start, names, [x * s for x, s in zip(xs, scale)])
        res = objective(params, samples)
        # Prior: relative distance from the physical default, sigma PRIOR_SIGMA.
        res += [(x - 1.0) / PRIOR_SIGMA for x in xs]
        return res

    lo = [FITTED[n][0] / s for n, s in zip(names, scale)]
    hi = [FITTED[n][1] / s for n, s in zip(names, scale)]
    x_start = [min(max(x / s, lo_i + 1e-9), hi_i - 1e-9) for x, s, lo_i, hi_i in zip(x0, scale, lo, hi)]
    result = least_squares(fun, x_start, bounds=(lo, hi), x_scale="jac", max_nfev=400)
    return with_values(start, names, [x * s for x, s in zip(result.x, scale)])


STATED_QUANTILE = 0.9  # the stated error covers 90 % of within-shape predictions


def within_shape_error(params: Params, samples: list[Sample], quantile: float = STATED_QUANTILE) -> float:
    """The model's relative error on the order of configs within a shape: the ``quantile`` of
    |log residual - the group's median log residual|, as a fraction (0.1 = 10 %)."""
    errs = []
    for group in _groups(samples).values():
        logs = [math.log(predict(s.features, params).total_s * 1e6) - math.log(s.measured_us)
                for s in group]
        centre = statistics.median(logs)
        errs += [abs(x - centre) for x in logs]
    if not errs:
        return float("nan")
    errs.sort()
    return math.expm1(errs[min(len(errs) - 1, int(quantile * len(errs)))])


# ------------------------------------------------------------------------------------------
# Scoring
# ------------------------------------------------------------------------------------------
def _largest_tile(f: Features) -> tuple:
    tile = (f.block_m or 1) * (f.block_n or 1) * (f.block_k or 1)
    return (tile, f.num_warps, f.num_stages)


def _max_occupancy(f: Features) -> tuple:
    return (f.occupancy_pct, f.blocks_per_sm)


@dataclass(frozen=True)
class GroupScore:
    kernel_name: str
    shape_name: str
    source: str
    measured: int
    top1: float
    top5: float
    largest_tile: float
    max_occupancy: float
    best_config: str
    picked_config: str


def score(params: Params, samples: list[Sample],
          all_measured: list[Measurement] | None = None) -> list[GroupScore]:
    """Per group: the pick's measured time over the exhaustive best. The best is taken over
    every measured config of the group (``all_measured``), including any the ranking dropped,
    so a wrong drop counts against the model."""
    best_any: dict[tuple, float] = {}
    for m in all_measured or []:
        best_any[m.group] = min(best_any.get(m.group, math.inf), m.value)
    out = []
    for g, group in sorted(_groups(samples).items()):
        kept = [s for s in group if s.features.spill_bytes < HEAVY_SPILL_BYTES]
        if not kept:
            continue
        best = min(best_any.get(g, math.inf), min(s.measured_us for s in group))
        order = sorted(kept, key=lambda s: (predict(s.features, params).total_s, s.features.config_id))
        rule_tile = max(kept, key=lambda s: _largest_tile(s.features))
        rule_occ = max(kept, key=lambda s: _max_occupancy(s.features))
        true_best = min(group, key=lambda s: s.measured_us)
        out.append(GroupScore(
            kernel_name=g[0], shape_name=g[1], source=g[2], measured=len(group),
            top1=order[0].measured_us / best, top5=min(s.measured_us for s in order[:5]) / best,
            largest_tile=rule_tile.measured_us / best, max_occupancy=rule_occ.measured_us / best,
            best_config=true_best.features.config_id, picked_config=order[0].features.config_id,
        ))
    return out


@dataclass
class LokoResult:
    held_out: str
    params: Params
    scores: list[GroupScore] = field(default_factory=list)
    error: float = float("nan")


def leave_one_kernel_out(samples: list[Sample], measurements: list[Measurement],
                         kernels: list[str],
                         objective: Callable[[Params, list[Sample]], list[float]] = residuals,
                         ) -> list[LokoResult]:
    """Fit on every kernel but one, score on that one; once per kernel."""
    out = []
    for held in kernels:
        train = [s for s in samples if s.features.kernel_name != held]
        test = [s for s in samples if s.features.kernel_name == held]
        params = fit(train, objective=objective)
        out.append(LokoResult(held, params, score(params, test, measurements),
                              within_shape_error(params, test)))
    return out


def calibrate(samples: list[Sample], kernels: list[str], loko: list[LokoResult]) -> Calibration:
    """The shipped calibration: fitted on every kernel given; its stated error is the
    held-out (LOKO) within-shape error, the honest figure for a kernel the fit never saw."""
    params = fit(samples)
    errors = [r.error for r in loko if math.isfinite(r.error)]
    stated = max(errors) if errors else within_shape_error(params, samples)
    return Calibration(params, round(float(stated), 4), tuple(sorted(kernels)),
                       note=f"fitted by scripts/rank_validate.py on the committed sweeps of {len(kernels)} "
                            "kernels, each row with the features of the GPU it ran on (H200 or H100)")
