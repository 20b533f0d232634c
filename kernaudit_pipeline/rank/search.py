"""Measure only what can still win: a search over a predicted ranking (``kernaudit bench --search``).

The cost model orders the space; measuring everything is what the search avoids. It measures
the model's first candidates, then keeps going down the predicted order and stops as soon as
no unmeasured config can plausibly beat the best measured one:

- each measurement is paired (candidate and baseline timed interleaved), so configs measured
  minutes apart compare through their ratios to the baseline: the value compared is
  ``1 / speedup`` (kernel time over baseline time) with its confidence interval, or the
  latency when no pairing is available;
- predictions are put on the measurement's scale through the best measured config: a
  candidate predicted 10 % slower than it is expected 10 % slower than its measured value;
- an unmeasured config's most optimistic plausible value is its scaled prediction shrunk by
  ``z`` times the model's error: its stated error (which 90 % of predictions stay inside on
  kernels it was not fitted on), pulled toward the spread of the ratios this shape has shown
  so far as measurements accumulate. Candidates come in predicted order, so once the next one
  cannot beat the upper end of the best measured CI by more than a tie margin (1 %), none of
  the rest can either, and the search stops;
- a budget (a share of the space, a count, GPU-seconds) caps the search whatever happens.

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
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Candidate:
    config_id: str
    predicted_us: float


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

    def __post_init__(self) -> None:
        if not (self.stated_error >= 0 and math.isfinite(self.stated_error)):
            raise ValueError("stated_error must be a finite non-negative fraction")
        if self.initial < 1 or self.batch < 1 or self.z < 0 or not 0 < self.max_fraction <= 1:
            raise ValueError("initial >= 1, batch >= 1, z >= 0 and 0 < max_fraction <= 1 are required")
        if self.prior_weight < 0 or not 0 <= self.tie_margin < 0.5:
            raise ValueError("prior_weight >= 0 and 0 <= tie_margin < 0.5 are required")
        if not 0 <= self.confirm_min <= self.confirm_max:
            raise ValueError("0 <= confirm_min <= confirm_max is required")


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

    @property
    def gpu_seconds(self) -> float:
        return sum(o.gpu_seconds for o in self.measured) + sum(o.gpu_seconds for o in self.confirmed)

    @property
    def fraction_measured(self) -> float:
        return len(self.measured) / self.candidates if self.candidates else 0.0


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
    measurements weigh as much as the stated error)."""
    _, spread, k = _scale_and_spread(done)
    prior = math.log1p(settings.stated_error)
    seen = 1.645 * spread
    w = settings.prior_weight
    if k < 3 or w + k == 0:
        return prior
    return math.sqrt((w * prior ** 2 + k * seen ** 2) / (w + k))


def _optimistic(c: Candidate, done: list[tuple[Candidate, Observation]], settings: SearchSettings) -> float:
    """The candidate's most optimistic plausible value: its prediction relative to the best
    measured config's prediction, applied to that config's measured value, less the error."""
    anchor_c, anchor_o = min(((cc, o) for cc, o in done if o.ok), key=lambda t: t[1].value)
    return (anchor_o.value * c.predicted_us / anchor_c.predicted_us
            * math.exp(-settings.z * model_error(done, settings)))


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
    index = 0
    while index < len(order):
        ok = [o for _, o in done if o.ok]
        if len(done) >= settings.initial and ok:
            best = min(ok, key=lambda o: o.value)
            optimistic = _optimistic(order[index], done, settings)
            result.next_optimistic, result.best_ci_high = optimistic, best.ci_high
            if optimistic * (1.0 + settings.tie_margin) >= best.ci_high:
                result.stop_reason = StopReason.NO_PLAUSIBLE_WINNER
                break
        if len(done) >= cap or (settings.max_gpu_seconds is not None
                                and result.gpu_seconds >= settings.max_gpu_seconds):
            result.stop_reason = StopReason.BUDGET
            break
        size = settings.initial - len(done) if len(done) < settings.initial else settings.batch
        chunk = order[index: index + max(1, min(size, cap - len(done)))]
        observations = measure([c.config_id for c in chunk])
        if len(observations) != len(chunk):
            raise ValueError(f"measure returned {len(observations)} observations for {len(chunk)} configs")
        for c, o in zip(chunk, observations):
            done.append((c, o))
            result.measured.append(o)
        index += len(chunk)
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
