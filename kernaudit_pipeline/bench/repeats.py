"""Do the speedup CIs hold from one run to the next? Computed from independent repeat captures.

Input: several runner JSONL files of the same subset (``samples/h200/repeats/*.jsonl``), each
from its own process. For every (kernel, shape, config) timed OK in at least two of them:

- the run-to-run *spread* of its paired speedup: (max - min) / median across the runs;
- each run's CI half-width, relative to its speedup;
- *coverage*: over every ordered pair of runs (i, j), whether run i's CI holds run j's speedup.

It also *calibrates* the between-run component that widens each CI (``--between-run-rsd``):
the total variance of log speedup across runs, minus the part the within-run (block bootstrap)
CIs already explain, pooled over rows. ``coverage_at`` recomputes the CIs with another value,
from each row's bootstrap-only CI, to show what a calibration would give.

A value calibrated on the same runs it is then judged on flatters itself, so two out-of-sample
figures go beside it: :func:`leave_one_run_out` calibrates on all runs but one and judges only
the comparisons that involve the run left out; :func:`holdout` calibrates on the repeats and
judges another capture (the main sweep, a separate process) against them. numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

Z95 = NormalDist().inv_cdf(0.975)


@dataclass(frozen=True)
class Observation:
    run: str
    speedup: float
    ci_low: float
    ci_high: float
    boot_ci_low: float | None
    boot_ci_high: float | None
    recorded_rsd: float | None = None


@dataclass(frozen=True)
class RowStats:
    kernel_name: str
    shape_name: str
    config_id: str
    runs: tuple[Observation, ...]

    @property
    def speedups(self) -> list[float]:
        return [o.speedup for o in self.runs]

    @property
    def spread(self) -> float:
        s = self.speedups
        return (max(s) - min(s)) / float(np.median(s))

    @property
    def ci_halfwidth(self) -> float:
        """Median over runs of the CI's half-width relative to its speedup."""
        return float(np.median([(o.ci_high - o.ci_low) / 2.0 / o.speedup for o in self.runs]))

    def covered(self, cis: Sequence[tuple[float, float]] | None = None) -> tuple[int, int]:
        """(hits, pairs): run i's CI (or ``cis[i]``) holding run j's speedup, i != j."""
        cis = cis or [(o.ci_low, o.ci_high) for o in self.runs]
        hits = total = 0
        for i, (lo, hi) in enumerate(cis):
            for j, other in enumerate(self.runs):
                if i != j:
                    total += 1
                    hits += lo <= other.speedup <= hi
        return hits, total

    def covers_median_of_others(self, cis: Sequence[tuple[float, float]] | None = None) -> tuple[int, int]:
        """(hits, runs): run i's CI holding the median speedup of the other runs."""
        cis = cis or [(o.ci_low, o.ci_high) for o in self.runs]
        hits = 0
        for i, (lo, hi) in enumerate(cis):
            others = float(np.median([o.speedup for j, o in enumerate(self.runs) if j != i]))
            hits += lo <= others <= hi
        return hits, len(cis)


def _observations(run: str, records: list[dict]) -> dict[tuple[str, str, str], Observation]:
    out = {}
    for r in records:
        if (r.get("record_type") != "run" or r.get("run_status") != "OK" or r.get("speedup") is None
                or r.get("speedup_ci_low") is None or r.get("speedup_ci_high") is None):
            continue
        out[(r["kernel_name"], r["shape_name"], r["config_id"])] = Observation(
            run, float(r["speedup"]), float(r["speedup_ci_low"]), float(r["speedup_ci_high"]),
            r.get("speedup_boot_ci_low"), r.get("speedup_boot_ci_high"), r.get("between_run_rsd"))
    return out


def collect(files: dict[str, list[dict]]) -> list[RowStats]:
    """Rows timed OK with a paired speedup in at least two of the runs (name -> records)."""
    by_key: dict[tuple[str, str, str], list[Observation]] = {}
    for run, records in sorted(files.items()):
        for key, obs in _observations(run, records).items():
            by_key.setdefault(key, []).append(obs)
    return [RowStats(*key, tuple(obs)) for key, obs in sorted(by_key.items()) if len(obs) >= 2]


def coverage(rows: Sequence[RowStats]) -> float:
    hits = total = 0
    for row in rows:
        h, t = row.covered()
        hits += h
        total += t
    return hits / total if total else math.nan


def _widened(o: Observation, rsd: float) -> tuple[float, float]:
    if o.boot_ci_low is None or o.boot_ci_high is None:
        return o.ci_low, o.ci_high
    point = math.log(o.speedup)
    extra = Z95 * rsd
    below = math.hypot(point - math.log(o.boot_ci_low), extra)
    above = math.hypot(math.log(o.boot_ci_high) - point, extra)
    return math.exp(point - below), math.exp(point + above)


def coverage_at(rows: Sequence[RowStats], between_run_rsd: float) -> float:
    """Coverage if every CI had been widened by ``between_run_rsd`` instead."""
    hits = total = 0
    for row in rows:
        h, t = row.covered([_widened(o, between_run_rsd) for o in row.runs])
        hits += h
        total += t
    return hits / total if total else math.nan


def coverage_of_median_at(rows: Sequence[RowStats], between_run_rsd: float | None = None) -> float:
    """Share of (row, run) whose CI holds the median of the other runs' speedups (the CIs as
    recorded, or widened by ``between_run_rsd``)."""
    hits = total = 0
    for row in rows:
        cis = None if between_run_rsd is None else [_widened(o, between_run_rsd) for o in row.runs]
        h, t = row.covers_median_of_others(cis)
        hits += h
        total += t
    return hits / total if total else math.nan


def calibrate(rows: Sequence[RowStats]) -> float:
    """The between-run relative SD: pooled variance of log speedup across runs minus the
    within-run variance the bootstrap CIs imply (never negative)."""
    total, within = [], []
    for row in rows:
        logs = np.log(row.speedups)
        total.append(float(np.var(logs, ddof=1)))
        for o in row.runs:
            if o.boot_ci_low and o.boot_ci_high:
                within.append(((math.log(o.boot_ci_high) - math.log(o.boot_ci_low)) / (2 * Z95)) ** 2)
    if not total:
        return math.nan
    return math.sqrt(max(0.0, float(np.mean(total)) - (float(np.mean(within)) if within else 0.0)))


def _subset(rows: Sequence[RowStats], runs: set[str]) -> list[RowStats]:
    out = []
    for row in rows:
        kept = tuple(o for o in row.runs if o.run in runs)
        if len(kept) >= 2:
            out.append(RowStats(row.kernel_name, row.shape_name, row.config_id, kept))
    return out


def cross_coverage(rows: Sequence[RowStats], held: str, rsd: float) -> tuple[int, int]:
    """Comparisons that involve run ``held``: its CI against each other run's speedup and each
    other run's CI against its speedup, every CI widened by ``rsd``."""
    hits = total = 0
    for row in rows:
        by_run = {o.run: o for o in row.runs}
        if held not in by_run:
            continue
        h = by_run[held]
        for run, o in by_run.items():
            if run == held:
                continue
            for ci_of, value in ((h, o.speedup), (o, h.speedup)):
                lo, hi = _widened(ci_of, rsd)
                hits += lo <= value <= hi
                total += 1
    return hits, total


@dataclass(frozen=True)
class Fold:
    held_out: str
    calibrated_on: tuple[str, ...]
    between_run_rsd: float
    hits: int
    comparisons: int

    @property
    def coverage(self) -> float:
        return self.hits / self.comparisons if self.comparisons else math.nan


def leave_one_run_out(rows: Sequence[RowStats]) -> list[Fold]:
    """One fold per run: calibrate on the others (at least two), judge the comparisons with the
    run left out. Needs three runs or more."""
    runs = sorted({o.run for row in rows for o in row.runs})
    folds = []
    for held in runs:
        rest = tuple(r for r in runs if r != held)
        train = _subset(rows, set(rest))
        if len(rest) < 2 or not train:
            continue
        rsd = calibrate(train)
        h, t = cross_coverage(rows, held, rsd)
        folds.append(Fold(held, rest, rsd, h, t))
    return folds


def holdout(rows: Sequence[RowStats], name: str, records: list[dict], rsd: float) -> Fold:
    """Another capture (``records``, e.g. the main sweep) judged against the repeats, every CI
    widened by ``rsd`` (calibrated without that capture)."""
    extra = _observations(name, records)
    joined = [RowStats(row.kernel_name, row.shape_name, row.config_id,
                       row.runs + ((extra[key],) if (key := (row.kernel_name, row.shape_name, row.config_id)) in extra else ()))
              for row in rows]
    h, t = cross_coverage(joined, name, rsd)
    return Fold(name, tuple(sorted({o.run for row in rows for o in row.runs})), rsd, h, t)


def markdown(rows: Sequence[RowStats], runs: Sequence[str]) -> str:
    """The per-row table for docs/benchmarks.md, then the summary figures."""
    head = ("| kernel | shape | config | " + " | ".join(f"speedup ({r})" for r in runs)
            + " | spread | CI ± (median) | CI holds others |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for row in rows:
        by_run = {o.run: o for o in row.runs}
        cells = [f"{by_run[r].speedup:.3f} [{by_run[r].ci_low:.3f}, {by_run[r].ci_high:.3f}]"
                 if r in by_run else "–" for r in runs]
        h, t = row.covered()
        lines.append(f"| {row.kernel_name} | {row.shape_name} | {row.config_id} | " + " | ".join(cells)
                     + f" | {row.spread * 100:.2f} % | {row.ci_halfwidth * 100:.2f} % | {h}/{t} |")
    return "\n".join(lines)


def summary(rows: Sequence[RowStats]) -> dict:
    spreads = [r.spread for r in rows]
    cal = calibrate(rows)
    return {
        "rows": len(rows),
        "median_spread_pct": float(np.median(spreads)) * 100 if spreads else math.nan,
        "p90_spread_pct": float(np.percentile(spreads, 90)) * 100 if spreads else math.nan,
        "median_ci_halfwidth_pct": float(np.median([r.ci_halfwidth for r in rows])) * 100 if rows else math.nan,
        "coverage": coverage(rows),
        "calibrated_between_run_rsd": cal,
        "coverage_at_calibrated": coverage_at(rows, cal) if math.isfinite(cal) else math.nan,
        "coverage_without_between_run": coverage_at(rows, 0.0),
        "coverage_of_median_of_others": coverage_of_median_at(rows),
        "recorded_between_run_rsd": _recorded_rsd(rows),
    }


def _recorded_rsd(rows: Sequence[RowStats]) -> float | None:
    """The between-run component the runs' CIs were widened by, when every run says the same."""
    seen = {o.recorded_rsd for row in rows for o in row.runs}
    return seen.pop() if len(seen) == 1 else None
