"""Measure only what can still win: a search over a predicted ranking (``kernaudit bench --search``).

The cost model orders the space; measuring everything is what the search avoids. It measures
the model's first candidates, then keeps going down the predicted order and stops as soon as
no unmeasured config can plausibly beat the best measured one:

- each measurement is paired (candidate and baseline timed interleaved), so configs measured
  minutes apart compare through their ratios to the baseline: the value compared is
  ``1 / speedup`` (kernel time over baseline time) with its confidence interval, or the
  latency when no pairing is available;
- predictions are put on the measurement's scale through the best measured config: a
  candidate predicted 10 % slower than it is expected 10 % slower than its measured value,
  as far as this shape's measurements bear out predicted differences (a slope of
  log(measured) on log(predicted), shrunk toward 1, within [0, 1]);
- an unmeasured config's most optimistic plausible value is its scaled prediction shrunk by
  ``z`` times the model's error: its stated error (which 90 % of predictions stay inside on
  kernels it was not fitted on), pulled toward the spread of the ratios this shape has shown
  so far as measurements accumulate, and never below that spread (a first batch that
  contradicts the ranking is not outweighed by the ranking's own claim). Candidates come in
  predicted order, so once the next one
  cannot beat the upper end of the best measured CI by more than a tie margin (1 %), none of
  the rest can either, and the search stops;
- a budget (a share of the space, a count, GPU-seconds) caps the search whatever happens.

The order adapts (``SearchSettings.adapt``, on by default): a model fitted on other kernels is
often wrong along one config key for this one (on the fused MoE sweep every BLOCK_K = 32
config measured 1.2-1.6x slower than predicted relative to the rest). After each batch, the
predictions are corrected by an additive model of log(measured / predicted) over the config's
values, fitted on this shape's measurements and shrunk toward no correction, and the walk goes
on in the corrected order. The error the stop rule allows is read from each measured config's
correction with that config left out, so a value seen once cannot explain its own error away.
Replayed on the recorded sweeps of the held-out kernels, the picks were unchanged and the GPU
time fell from 29 % to 22 % of the exhaustive sweeps' (docs/benchmarks.md).

Two rungs (successive halving with one cut): the walk down the predicted order can be measured
with short, cheap screening timings, and then only the configs that could still be the best
(their screening CIs reach the best's, capped at ``confirm_max``) are measured again at full
precision; the pick is the best of those. Screening is where most of the walk's configs are
measured, so it is where the GPU time goes; the confirmation keeps the pick as precise as an
exhaustive sweep's.

At the end, configs whose CIs overlap the best's are reported as tied: on the H200 the top
configs are often within 2 % of each other, and calling a winner among them would be noise.

Standard library only: this runs on the GPU host next to the runner.
"""

from __future__ import annotations

import enum
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class Candidate:
    """A config to measure and the model's prediction for it. ``config`` (its key/value pairs)
    lets an adaptive search learn, from this shape's measurements, which values of a key the
    model gets wrong (``SearchSettings.adapt``)."""

    config_id: str
    predicted_us: float
    config: tuple[tuple[str, object], ...] = ()

    @classmethod
    def of(cls, config_id: str, predicted_us: float, config: dict | None = None) -> Candidate:
        items = tuple(sorted((str(k), v) for k, v in (config or {}).items()
                             if isinstance(v, (int, float, str, bool))))
        return cls(config_id, predicted_us, items)


@dataclass(frozen=True)
class Observation:
    """One measurement of one config. ``value`` is what is compared (lower is better):
    ``1 / speedup`` for a paired measurement, else the latency in µs; ``ci_low``/``ci_high``
    bound it. ``ok`` is False for a config that failed (incorrect, crashed, cannot launch):
    it cost GPU time but is not a candidate."""

    config_id: str
    value: float
    ci_low: float
    ci_high: float
    gpu_seconds: float
    ok: bool = True
    latency_us: float | None = None
    speedup: float | None = None
    note: str = ""

    @classmethod
    def paired(cls, config_id: str, speedup: float, ci_low: float, ci_high: float,
               gpu_seconds: float, latency_us: float | None = None) -> Observation:
        """From a paired speedup and its CI (speedup = baseline time / kernel time)."""
        return cls(config_id, 1.0 / speedup, 1.0 / ci_high, 1.0 / ci_low, gpu_seconds,
                   latency_us=latency_us, speedup=speedup)

    @classmethod
    def failed(cls, config_id: str, gpu_seconds: float, note: str) -> Observation:
        return cls(config_id, math.inf, math.inf, math.inf, gpu_seconds, ok=False, note=note)


class StopReason(enum.StrEnum):
    NO_PLAUSIBLE_WINNER = "no unmeasured config can plausibly beat the best measured one"
    EXHAUSTED = "every candidate was measured"
    BUDGET = "the measuring budget ran out"
    NOTHING_WORKS = "no candidate measured correctly"


@dataclass(frozen=True)
class SearchSettings:
    """``initial``: candidates measured before the stop rule is first asked; ``z``: how many
    stated errors an unmeasured config may beat its prediction by (the stated error already
    covers 90 % of predictions, so z = 1 leaves about a 5 % chance per config to beat its
    optimistic bound); budgets cap the search."""

    stated_error: float
    initial: int = 5
    z: float = 1.0
    batch: int = 1  # configs measured per call of measure (one worker run on the GPU host)
    # Weight of the stated error against what this shape's measurements show, in measurements:
    # after prior_weight measurements the two count alike.
    prior_weight: float = 10.0
    # A config that could beat the best by less than this is a tie, not a reason to go on.
    tie_margin: float = 0.01
    max_fraction: float = 1.0
    max_measurements: int | None = None
    max_gpu_seconds: float | None = None
    # Second rung: how many screened configs may be re-measured at full precision (those whose
    # CIs reach the best's, best first), and how many at least (the screened best and the next
    # ones, whatever their CIs say: a short screening window can misorder close configs).
    confirm_max: int = 6
    confirm_min: int = 2
    # Adaptive order: after each measurement, correct every prediction by what this shape's
    # measurements say about each config value (BLOCK_K = 32 measuring 1.4x slower than
    # predicted, say), shrunk toward no correction by ``adapt_shrink`` measurements, and walk
    # the unmeasured configs in the corrected order.
    adapt: bool = True
    adapt_shrink: float = 2.0
    # Prior sd of the slope of log(measured) on log(predicted) (1 = the model's differences
    # hold): how readily this shape's measurements may say that predicted differences are
    # smaller than claimed. inf: never (the rule before 2026-12-07).
    slope_prior_sd: float = 0.25

    def __post_init__(self) -> None:
        if not (self.stated_error >= 0 and math.isfinite(self.stated_error)):
            raise ValueError("stated_error must be a finite non-negative fraction")
        if self.initial < 1 or self.batch < 1 or self.z < 0 or not 0 < self.max_fraction <= 1:
            raise ValueError("initial >= 1, batch >= 1, z >= 0 and 0 < max_fraction <= 1 are required")
        if self.prior_weight < 0 or not 0 <= self.tie_margin < 0.5:
            raise ValueError("prior_weight >= 0 and 0 <= tie_margin < 0.5 are required")
        if not 0 <= self.confirm_min <= self.confirm_max:
            raise ValueError("0 <= confirm_min <= confirm_max is required")
        if not self.adapt_shrink > 0:
            raise ValueError("adapt_shrink must be positive")
        if not self.slope_prior_sd > 0:
            raise ValueError("slope_prior_sd must be positive")


@dataclass
class SearchResult:
    """``measured``: the walk down the predicted order (screening precision when there are two
    rungs); ``confirmed``: the second rung's full-precision measurements, from which the best
    and its ties are then named."""

    candidates: int
    measured: list[Observation] = field(default_factory=list)
    confirmed: list[Observation] = field(default_factory=list)
    stop_reason: StopReason = StopReason.EXHAUSTED
    best: Observation | None = None
    tied: list[str] = field(default_factory=list)
    # the bound the stop rule last compared: the next candidate's optimistic value and the
    # best measured CI's upper end
    next_optimistic: float | None = None
    best_ci_high: float | None = None
    # and what that bound was made of: how far predicted differences counted
    # (:func:`prediction_slope`) and the error allowed (:func:`model_error`, log units)
    slope: float | None = None
    error_allowed: float | None = None

    @property
    def gpu_seconds(self) -> float:
        return sum(o.gpu_seconds for o in self.measured) + sum(o.gpu_seconds for o in self.confirmed)

    @property
    def fraction_measured(self) -> float:
        return len(self.measured) / self.candidates if self.candidates else 0.0


Corrections = dict[tuple[str, object], float]


def value_corrections(done: list[tuple[Candidate, Observation]], shrink: float,
                      rounds: int = 8) -> tuple[Corrections, dict[str, float]]:
    """Log-time corrections per (config key, value), from this shape's measurements: an
    additive model of log(measured / predicted), fitted by backfitting (each key's effects are
    the shrunk mean of what the other keys leave unexplained), with each effect pulled toward 0
    as if ``shrink`` more measurements had shown none. Keys whose measured configs all share
    one value teach nothing and get no effect (the shared offset is the scale, not a
    correction).

    Also returns, per measured config, its correction with that config left out (each of its
    values' effects refitted without it, one step): what the search's error estimate must use,
    since a value seen once would otherwise explain its own config's error away and the walk
    would stop on an error it never measured."""
    pts = [(c.config_id, dict(c.config), math.log(o.value / c.predicted_us)) for c, o in done
           if o.ok and o.value > 0 and c.predicted_us > 0 and c.config]
    if len(pts) < 3:
        return {}, {}
    keys = sorted({k for _, cfg, _ in pts for k in cfg if len({repr(p.get(k)) for _, p, _ in pts}) > 1})
    if not keys:
        return {}, {}
    mean = statistics.fmean(y for _, _, y in pts)
    effects: Corrections = {}
    partial: dict[tuple[str, str], float] = {}  # (config id, key): what that key's effect fitted
    for _ in range(rounds):
        for key in keys:
            sums: dict[object, list[float]] = {}
            for cid, cfg, y in pts:
                rest = sum(effects.get((k, cfg.get(k)), 0.0) for k in keys if k != key)
                partial[(cid, key)] = y - mean - rest
                sums.setdefault(cfg.get(key), []).append(partial[(cid, key)])
            for value, res in sums.items():
                effects[(key, value)] = sum(res) / (len(res) + shrink)
    counts: dict[tuple[str, object], int] = {}
    for _, cfg, _ in pts:
        for key in keys:
            counts[(key, cfg.get(key))] = counts.get((key, cfg.get(key)), 0) + 1
    loo = {}
    for cid, cfg, _ in pts:
        total = 0.0
        for key in keys:
            kv = (key, cfg.get(key))
            n = counts[kv]
            total += (effects[kv] * (n + shrink) - partial[(cid, key)]) / (n - 1 + shrink)
        loo[cid] = total
    return effects, loo


def corrected(c: Candidate, corrections: Corrections) -> float:
    """The prediction times what this shape's measurements say about its config's values."""
    if not corrections:
        return c.predicted_us
    return c.predicted_us * math.exp(sum(corrections.get(kv, 0.0) for kv in c.config))


def _scale_and_spread(done: list[tuple[Candidate, Observation]]) -> tuple[float, float, int]:
    """Median log ratio measured/predicted, the spread (sample sd) of the log ratios, and how
    many there are."""
    logs = [math.log(o.value / c.predicted_us) for c, o in done if o.ok and o.value > 0 and c.predicted_us > 0]
    if not logs:
        return 0.0, 0.0, 0
    spread = statistics.stdev(logs) if len(logs) >= 2 else 0.0
    return statistics.median(logs), spread, len(logs)


def model_error(done: list[tuple[Candidate, Observation]], settings: SearchSettings) -> float:
    """The error (90 % bound, log units) to allow an unmeasured config: the stated error,
    pulled toward what this shape's measurements show as they accumulate (``prior_weight``
    measurements weigh as much as the stated error), and never less than what they show.
    The prior may widen the error of a shape whose first configs happened to agree with the
    model, but not narrow the error of one whose configs already show the model wrong: a
    ranking that its first batch contradicts (a reversed one, say) would otherwise be trusted
    at its stated error for ``prior_weight`` measurements and could stop the walk there."""
    _, spread, k = _scale_and_spread(done)
    prior = math.log1p(settings.stated_error)
    seen = 1.645 * spread
    w = settings.prior_weight
    if k < 3 or w + k == 0:
        return prior
    return max(seen, math.sqrt((w * prior ** 2 + k * seen ** 2) / (w + k)))


def prediction_slope(done: list[tuple[Candidate, Observation]], settings: SearchSettings) -> float:
    """How much of the predicted difference between two configs this shape's measurements
    bear out: the slope of log(measured) on log(predicted), shrunk toward 1 (the model taken at
    its word) with a prior of sd ``slope_prior_sd``, within [0, 1]. A first batch whose
    predictions span 4x but whose latencies agree within 15 % reads near 0: the walk may not
    then stop on the model's claim that the next config is 1.5x slower. Configs the model ranks
    alike (the usual first batch) carry almost no information on the slope, so the prior
    holds there and the rule is the one the slope leaves alone."""
    pts = [(math.log(c.predicted_us), math.log(o.value)) for c, o in done
           if o.ok and o.value > 0 and c.predicted_us > 0]
    if len(pts) < 3 or settings.slope_prior_sd == math.inf:
        return 1.0
    mx = statistics.fmean(x for x, _ in pts)
    my = statistics.fmean(y for _, y in pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    sxy = sum((x - mx) * (y - my) for x, y in pts)
    # the prior in the units of sxx: the per-config residual the stated error allows (its 90 %
    # bound over 1.645), over the prior sd of the slope, squared
    s0 = (math.log1p(settings.stated_error) / 1.645 / settings.slope_prior_sd) ** 2
    if s0 + sxx == 0:
        return 1.0
    # never above 1 (the rule may not trust the model more than its word) nor below 0 (a slope
    # read as negative says the model tells nothing here, not that its order runs backwards)
    return min(1.0, max(0.0, (s0 + sxy) / (s0 + sxx)))


def _optimistic(c: Candidate, done: list[tuple[Candidate, Observation]], slope: float, error: float,
                z: float) -> float:
    """The candidate's most optimistic plausible value: its prediction relative to the best
    measured config's prediction, applied to that config's measured value, less ``z`` times
    the error. The relative prediction counts only as far as this shape's measurements bear
    out predicted differences (``slope``, from :func:`prediction_slope`)."""
    anchor_c, anchor_o = min(((cc, o) for cc, o in done if o.ok), key=lambda t: t[1].value)
    return anchor_o.value * (c.predicted_us / anchor_c.predicted_us) ** slope * math.exp(-z * error)


def search_batched(candidates: Sequence[Candidate],
                   measure: Callable[[list[str]], list[Observation]],
                   settings: SearchSettings) -> SearchResult:
    """Measure down the predicted order (``candidates`` best first), ``settings.batch`` configs
    per call of ``measure`` (the first call takes ``initial`` of them), until the stop rule
    holds or a budget runs out. ``measure`` returns one observation per config id, in order:
    it runs them on the GPU (or replays a sweep)."""
    order = list(candidates)
    result = SearchResult(candidates=len(order))
    cap = min(len(order), max(1, math.floor(settings.max_fraction * len(order) + 1e-9)))
    if settings.max_measurements is not None:
        cap = min(cap, settings.max_measurements)
    done: list[tuple[Candidate, Observation]] = []
    pending = order  # unmeasured, in predicted order
    while pending:
        # With ``adapt``, every prediction is corrected by what this shape has measured so far
        # and the walk goes on in the corrected order (a stable sort: ties keep the model's).
        # The error the stop rule allows is read from each measured config's prediction
        # corrected *without* that config (``loo``), so corrections cannot hide it.
        corrections, loo = value_corrections(done, settings.adapt_shrink) if settings.adapt else ({}, {})
        if corrections:
            pending = sorted(pending, key=lambda c: corrected(c, corrections))
        view = [(replace(c, predicted_us=c.predicted_us * math.exp(loo.get(c.config_id, 0.0))), o)
                for c, o in done]
        ok = [o for _, o in done if o.ok]
        if len(done) >= settings.initial and ok:
            best = min(ok, key=lambda o: o.value)
            nxt = replace(pending[0], predicted_us=corrected(pending[0], corrections))
            result.slope, result.error_allowed = prediction_slope(view, settings), model_error(view, settings)
            optimistic = _optimistic(nxt, view, result.slope, result.error_allowed, settings.z)
            result.next_optimistic, result.best_ci_high = optimistic, best.ci_high
            if optimistic * (1.0 + settings.tie_margin) >= best.ci_high:
                result.stop_reason = StopReason.NO_PLAUSIBLE_WINNER
                break
        if len(done) >= cap or (settings.max_gpu_seconds is not None
                                and result.gpu_seconds >= settings.max_gpu_seconds):
            result.stop_reason = StopReason.BUDGET
            break
        size = settings.initial - len(done) if len(done) < settings.initial else settings.batch
        take = max(1, min(size, cap - len(done)))
        chunk, pending = pending[:take], pending[take:]
        observations = measure([c.config_id for c in chunk])
        if len(observations) != len(chunk):
            raise ValueError(f"measure returned {len(observations)} observations for {len(chunk)} configs")
        for c, o in zip(chunk, observations):
            done.append((c, o))
            result.measured.append(o)
    else:
        result.stop_reason = StopReason.EXHAUSTED
    if not any(o.ok for _, o in done):
        result.stop_reason = StopReason.NOTHING_WORKS
    return conclude(result)


def to_confirm(result: SearchResult, settings: SearchSettings) -> list[str]:
    """The walk's configs worth a full-precision measurement, best first: every one whose CI
    reaches the best's upper end (plus the tie margin), at least ``confirm_min`` and at most
    ``confirm_max`` of them."""
    ok = sorted((o for o in result.measured if o.ok), key=lambda o: o.value)
    if not ok or settings.confirm_max == 0:
        return []
    reach = ok[0].ci_high * (1.0 + settings.tie_margin)
    contenders = [o for o in ok if o.ci_low <= reach]
    keep = max(len(contenders), settings.confirm_min)
    return [o.config_id for o in ok[:min(keep, settings.confirm_max)]]


def search_two_rungs(candidates: Sequence[Candidate],
                     screen: Callable[[list[str]], list[Observation]],
                     confirm: Callable[[list[str]], list[Observation]],
                     settings: SearchSettings) -> SearchResult:
    """The walk of :func:`search_batched` with ``screen`` (short timings), then the configs
    :func:`to_confirm` names measured again with ``confirm`` (full precision), in one call."""
    result = search_batched(candidates, screen, settings)
    ids = to_confirm(result, settings)
    if ids:
        observations = confirm(ids)
        if len(observations) != len(ids):
            raise ValueError(f"confirm returned {len(observations)} observations for {len(ids)} configs")
        result.confirmed = list(observations)
    return conclude(result)


def conclude(result: SearchResult) -> SearchResult:
    """Name the best of what was measured (of the confirmed configs when there are any that
    measured correctly), and the configs whose CIs overlap its own (ties)."""
    ok = [o for o in result.confirmed if o.ok] or [o for o in result.measured if o.ok]
    if not ok:
        return result
    result.best = min(ok, key=lambda o: o.value)
    result.tied = [o.config_id for o in sorted(ok, key=lambda o: o.value)
                   if o.config_id != result.best.config_id and o.ci_low <= result.best.ci_high]
    return result


def search(candidates: Sequence[Candidate], measure: Callable[[str], Observation],
           settings: SearchSettings) -> SearchResult:
    """:func:`search_batched` with a ``measure`` of one config at a time."""
    return search_batched(candidates, lambda ids: [measure(i) for i in ids], settings)


# ------------------------------------------------------------------------------------------
# Replaying a recorded sweep (CPU tests, and the GPU-seconds comparison on an exhaustive sweep)
# ------------------------------------------------------------------------------------------
def row_gpu_seconds(row: dict) -> float:
    """GPU-busy seconds a runner row accounts for: its correctness check and timing loops.
    The one measure of GPU time a search and the exhaustive sweep it saves are compared by."""
    return sum(float(row.get(k) or 0.0) for k in ("check_s", "timing_s"))


def observation_from_row(row: dict) -> Observation:
    """A runner ``run`` row (JSONL record) as an Observation: paired when the row carries a
    speedup CI, else its latency CI; a row that was not timed OK is a failure."""
    cid = str(row.get("config_id"))
    seconds = row_gpu_seconds(row)
    if row.get("run_status") != "OK":
        return Observation.failed(cid, seconds, str(row.get("run_status")))
    s, lo, hi = row.get("speedup"), row.get("speedup_ci_low"), row.get("speedup_ci_high")
    if all(isinstance(x, (int, float)) and x > 0 for x in (s, lo, hi)):
        return Observation.paired(cid, float(s), float(lo), float(hi), seconds,
                                  latency_us=row.get("latency_us"))
    lat = row.get("latency_us")
    if not isinstance(lat, (int, float)) or not lat > 0:
        return Observation.failed(cid, seconds, "no latency")
    low = row.get("latency_ci_low_us") or lat
    high = row.get("latency_ci_high_us") or lat
    return Observation(cid, float(lat), float(low), float(high), seconds, latency_us=float(lat))


def replay(rows: Sequence[dict]) -> Callable[[str], Observation]:
    """``measure`` over a recorded sweep of one (kernel, shape): each config's recorded row;
    a config the sweep never ran is a failure costing nothing."""
    by_id = {str(r.get("config_id")): r for r in rows}

    def measure(config_id: str) -> Observation:
        row = by_id.get(config_id)
        if row is None:
            return Observation.failed(config_id, 0.0, "not in the recorded sweep")
        return observation_from_row(row)
    return measure
