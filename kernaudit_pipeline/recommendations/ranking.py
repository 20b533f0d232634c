"""One rule picks the best config of every (kernel, shape, device), and decides.

Everything downstream follows this module: the report's best-config table, the ``decisions`` of
``report.json``, the review queue and the vLLM export.

Candidates. Only correct, completed rows with a latency inside physical bounds compete. Rows of
the same config (repeats, reruns) are pooled: the point estimate is their median speedup and the
interval spans every row's interval, so a CI must hold across independent reruns. When a group
has measured rows, modelled (synthetic) and predicted (cost-model) rows of it do not compete.

Ranking. Configs are ranked by speedup over the baseline, paired when the runner timed them
interleaved, else derived from the two medians; without a baseline, by latency.

Ties. A config whose speedup is within the noise band of the fastest (default 2 %, the spread
of paired ratios between reruns) is statistically indistinguishable from it. Among the fastest
and its ties, and only among those that would reach the same decision, the stated tie-break
criterion picks, in this order: no register spills; fewer registers per thread; less shared
memory per block; then the higher speedup; then the config id. Equal speed with more headroom
is the config that survives the next compiler version and the next shape.

Decision (``core.verdicts.DecisionKind``), on the chosen config's interval [lo, hi] (the point
estimate when there is no interval) and band b:

- SHIP_CONFIG when lo > 1 + b: a Triton config beats the baseline;
- KEEP_BASELINE when hi < 1 - b: the best correct config is clearly slower;
- NO_DECISION otherwise (inside the noise), or when nothing is correct, nothing was timed, or
  there is no baseline to compare with; the reason says which.

b is the noise band for paired speedups. Unpaired ratios move 5-10 % between runs on the same
card (ANCHORS, "Run-to-run truth"), so a decision on them uses ``UNPAIRED_NOISE_BAND`` (10 %)
when that is wider, and says so.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import pandas as pd

from kernaudit_pipeline.comparisons import (
    DEFAULT_NOISE_BAND, FAILED_RUN_STATUSES, MAX_LATENCY_US, MIN_LATENCY_US, SKIPPED_RUN_STATUSES, SpeedupSource,
    data_kind_of,
)
from kernaudit_pipeline.core.configs import columns_to_kernel_config, config_id, config_label, group_key, row_config
from kernaudit_pipeline.core.configs import row_shape_dims
from kernaudit_pipeline.core.values import finite_float, is_missing, json_safe, plain
from kernaudit_pipeline.core.verdicts import BaselineResult, DataKind, Decision, DecisionKind, Status

UNPAIRED_NOISE_BAND = 0.10
# Strongest evidence first: a group decides on the best kind of data it has.
KIND_ORDER = (DataKind.MEASURED, DataKind.MODELLED, DataKind.PREDICTED)
TIE_BREAK = ("no register spills, then fewer registers per thread, then less shared memory per block, "
             "then the higher speedup")
# Columns copied into a decision's evidence when the chosen config's rows have them.
EVIDENCE_COLUMNS = (
    "registers_per_thread", "spill_stores_bytes", "spill_loads_bytes", "stack_frame_bytes", "shared_mem_bytes",
    "occupancy_limiter", "blocks_per_sm", "occupancy_pct", "efficiency_pct", "headroom_pct", "bottleneck",
    "at_roofline", "compute_sol_pct", "memory_sol_pct", "latency_us", "baseline_us",
)

GroupKey = tuple[str, str | None, str | None]


def _text(value: object) -> str | None:
    return None if is_missing(value) else str(value)


def is_timed_ok(row: Mapping) -> bool:
    """A correct, completed row with a latency inside physical bounds (what may be ranked)."""
    status = _text(row.get("run_status"))
    if status in FAILED_RUN_STATUSES or status in SKIPPED_RUN_STATUSES:
        return False
    correct = plain(row.get("correct"))
    if correct is not None and not bool(correct):
        return False
    if str(row.get("status")) in (Status.FAILED, Status.PRUNED_SPILL, Status.OUT_OF_RESOURCES, Status.NOT_RUN):
        return False
    lat = finite_float(row.get("latency_us"))
    return lat is not None and MIN_LATENCY_US <= lat <= MAX_LATENCY_US


def config_key(row: Mapping) -> str:
    """The kernel's own config id when the row has one, else one built from the config columns."""
    cid = _text(row.get("config_id"))
    if cid:
        return cid
    return config_id(columns_to_kernel_config(row_config(row))) or "unknown"


def spills(row: Mapping) -> bool:
    return any((finite_float(row.get(c)) or 0.0) > 0 for c in ("spill_stores_bytes", "stack_frame_bytes"))


@dataclass(frozen=True)
class Candidate:
    """One config of one group, pooled over its timed rows."""

    config_id: str
    config: Mapping[str, int]
    speedup: float | None
    ci_low: float | None
    ci_high: float | None
    paired: bool
    latency_us: float
    rows: int
    data_kind: DataKind
    registers_per_thread: int | None = None
    shared_mem_bytes: int | None = None
    spills: bool = False
    evidence: Mapping[str, object] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return config_label(self.config)

    def interval(self) -> tuple[float, float] | None:
        if self.speedup is None:
            return None
        lo = self.speedup if self.ci_low is None else self.ci_low
        hi = self.speedup if self.ci_high is None else self.ci_high
        return lo, hi


@dataclass(frozen=True)
class GroupRanking:
    """A group's candidates, best first, and the config the rule chose."""

    key: GroupKey
    candidates: tuple[Candidate, ...]  # eligible, fastest first
    chosen: Candidate | None
    tied: tuple[Candidate, ...]  # the others statistically tied with the fastest
    tie_reason: str
    not_ranked: Mapping[str, int]  # status -> rows that could not compete
    rows: int
    data_kind: DataKind
    shape_dims: Mapping[str, int]
    dtype: str | None
    baseline_name: str | None
    baseline_backend: str | None
    baselines: tuple[BaselineResult, ...] = ()
    ignored_kinds: tuple[str, ...] = ()  # weaker data kinds present but not ranked

    @property
    def fastest(self) -> Candidate | None:
        return self.candidates[0] if self.candidates else None

    def candidate(self, cid: str) -> Candidate | None:
        return next((c for c in self.candidates if c.config_id == cid), None)


def group_rows(frame: pd.DataFrame) -> Iterator[tuple[GroupKey, pd.DataFrame]]:
    """((kernel, shape, device), rows) in first-seen order."""
    if frame.empty:
        return
    keys = [group_key(r) for _, r in frame.iterrows()]
    frame = frame.assign(_gkey=keys)
    for key, rows in frame.groupby("_gkey", sort=False):
        yield key, rows.drop(columns="_gkey")


def _median(values: list[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def _first_int(rows: list[Mapping], col: str) -> int | None:
    for r in rows:
        v = finite_float(r.get(col))
        if v is not None:
            return int(round(v))
    return None


def pool(rows: list[Mapping], kind: DataKind) -> Candidate:
    """One candidate from the rows of one config: median speedup, interval over every row's."""
    speedups = [s for s in (finite_float(r.get("speedup")) for r in rows) if s is not None]
    lows = [finite_float(r.get("speedup_ci_low")) for r in rows]
    highs = [finite_float(r.get("speedup_ci_high")) for r in rows]
    lo = min(lows) if speedups and all(v is not None for v in lows) else None
    hi = max(highs) if speedups and all(v is not None for v in highs) else None
    latency = _median([float(finite_float(r.get("latency_us"))) for r in rows])
    evidence: dict[str, object] = {}
    for col in EVIDENCE_COLUMNS:
        for r in rows:
            v = plain(r.get(col))
            if v is not None:
                evidence[col] = v
                break
    evidence["latency_us"] = latency
    return Candidate(
        config_id=config_key(rows[0]), config=row_config(rows[0]),
        speedup=_median(speedups) if speedups else None, ci_low=lo, ci_high=hi,
        paired=bool(speedups) and all(str(r.get("speedup_source")) == SpeedupSource.PAIRED for r in rows),
        latency_us=latency, rows=len(rows), data_kind=kind,
        registers_per_thread=_first_int(rows, "registers_per_thread"),
        shared_mem_bytes=_first_int(rows, "shared_mem_bytes"),
        spills=any(spills(r) for r in rows), evidence=json_safe(evidence),
    )


def _order(cands: list[Candidate]) -> list[Candidate]:
    """Highest speedup first; configs without a speedup (no baseline) after them, by latency."""
    return sorted(cands, key=lambda c: (c.speedup is None, -(c.speedup or 0.0), c.latency_us, c.config_id))


def tied_with(fastest: Candidate, other: Candidate, noise_band: float) -> bool:
    """Within the noise band of the fastest: by speedup when both have one, else by latency."""
    if fastest.speedup is not None and other.speedup is not None and other.speedup > 0:
        return fastest.speedup / other.speedup <= 1.0 + noise_band + 1e-12
    return other.latency_us <= fastest.latency_us * (1.0 + noise_band) + 1e-12


def _tie_key(c: Candidate) -> tuple:
    return (c.spills, math.inf if c.registers_per_thread is None else c.registers_per_thread,
            math.inf if c.shared_mem_bytes is None else c.shared_mem_bytes,
            -(c.speedup or 0.0), c.latency_us, c.config_id)


def decision_band(candidate: Candidate, noise_band: float) -> float:
    return noise_band if candidate.paired else max(noise_band, UNPAIRED_NOISE_BAND)


def decision_kind(candidate: Candidate | None, noise_band: float) -> DecisionKind:
    if candidate is None or candidate.interval() is None:
        return DecisionKind.NO_DECISION
    lo, hi = candidate.interval()
    band = decision_band(candidate, noise_band)
    if lo > 1.0 + band:
        return DecisionKind.SHIP_CONFIG
    if hi < 1.0 - band:
        return DecisionKind.KEEP_BASELINE
    return DecisionKind.NO_DECISION


def choose(ranked: list[Candidate], noise_band: float) -> tuple[Candidate | None, tuple[Candidate, ...], str]:
    """(chosen, the others tied with the fastest, why)."""
    if not ranked:
        return None, (), "nothing to rank"
    fastest = ranked[0]
    tied = [c for c in ranked[1:] if tied_with(fastest, c, noise_band)]
    if not tied:
        return fastest, (), "the fastest; no other config within the noise band"
    kind = decision_kind(fastest, noise_band)
    pool_ = [fastest, *(c for c in tied if decision_kind(c, noise_band) == kind)]
    chosen = min(pool_, key=_tie_key)
    others = tuple(c for c in (fastest, *tied) if c is not chosen)
    if chosen is fastest:
        why = (f"the fastest; {len(tied)} other config(s) within the ±{noise_band:.0%} noise band, and it also "
               f"wins the tie-break ({TIE_BREAK})")
    else:
        why = (f"statistically tied with the fastest ({fastest.label}) within the ±{noise_band:.0%} noise band; "
               f"chosen by the tie-break: {TIE_BREAK}")
    return chosen, others, why


def _baselines(rows: pd.DataFrame) -> tuple[BaselineResult, ...]:
    """The other references the runner timed paired against the chosen config (JSON text)."""
    import json  # noqa: PLC0415

    if "reference_speedups" not in rows:
        return ()
    out: list[BaselineResult] = []
    for text in rows["reference_speedups"].dropna().unique():
        try:
            items = json.loads(str(text))
        except ValueError:
            continue
        for item in items if isinstance(items, list) else []:
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                out.append(BaselineResult(
                    name=item["name"], backend=_text(item.get("backend")), speedup=finite_float(item.get("speedup")),
                    speedup_ci_low=finite_float(item.get("speedup_ci_low")),
                    speedup_ci_high=finite_float(item.get("speedup_ci_high")), primary=bool(item.get("primary")),
                    run_status=_text(item.get("run_status"))))
    return tuple(dict.fromkeys(out))


def _mode(rows: pd.DataFrame, col: str) -> str | None:
    if col not in rows:
        return None
    values = [str(v) for v in rows[col] if not is_missing(v)]
    return Counter(values).most_common(1)[0][0] if values else None


def rank_group(key: GroupKey, rows: pd.DataFrame, noise_band: float = DEFAULT_NOISE_BAND) -> GroupRanking:
    records = [r for _, r in rows.iterrows()]
    kinds = [data_kind_of(r) for r in records]
    timed = [(r, k) for r, k in zip(records, kinds) if is_timed_ok(r)]
    present = [k for k in KIND_ORDER if any(kk == k for _, kk in timed)] or [
        k for k in KIND_ORDER if k in kinds] or [DataKind.MEASURED]
    kind = present[0]
    by_config: dict[str, list[Mapping]] = {}
    for r, k in timed:
        if k == kind:
            by_config.setdefault(config_key(r), []).append(r)
    ranked = _order([pool(rs, kind) for rs in by_config.values()])
    chosen, tied, why = choose(ranked, noise_band)
    not_ranked = Counter(str(r.get("status")) if not is_missing(r.get("status")) else "UNKNOWN"
                         for r in records if not is_timed_ok(r))
    dims: dict[str, int] = {}
    for r in records:
        dims = row_shape_dims(r)
        if dims:
            break
    return GroupRanking(
        key=key, candidates=tuple(ranked), chosen=chosen, tied=tied, tie_reason=why,
        not_ranked=dict(not_ranked), rows=len(records), data_kind=kind,
        shape_dims=dims, dtype=_mode(rows, "dtype"), baseline_name=_mode(rows, "baseline_name"),
        baseline_backend=_mode(rows, "baseline_backend"), baselines=_baselines(rows),
        ignored_kinds=tuple(str(k) for k in present[1:]),
    )


def rank_groups(frame: pd.DataFrame, noise_band: float = DEFAULT_NOISE_BAND) -> dict[GroupKey, GroupRanking]:
    """Every group's ranking, in first-seen order."""
    return {key: rank_group(key, rows, noise_band) for key, rows in group_rows(frame)}


# ---------------------------------------------------------------------------------------------
# Decisions
# ---------------------------------------------------------------------------------------------
def _fmt(c: Candidate) -> str:
    lo, hi = c.interval() or (None, None)
    ci = "" if c.ci_low is None or c.ci_high is None else f" [{lo:.3f}, {hi:.3f}]"
    return f"{c.label} ({c.config_id}) at {c.speedup:.3f}x{ci}"


def _kind_note(g: GroupRanking) -> str:
    if g.data_kind == DataKind.MODELLED:
        return "; modelled by the synthetic generator; no GPU timed it"
    if g.data_kind == DataKind.PREDICTED:
        return "; predicted by the static cost model; no GPU timed it"
    return ""


def _not_ranked_text(g: GroupRanking) -> str:
    return ", ".join(f"{n} {s}" for s, n in sorted(g.not_ranked.items(), key=lambda kv: (-kv[1], kv[0])))


def decide(g: GroupRanking, noise_band: float = DEFAULT_NOISE_BAND) -> Decision:
    """The group's one decision, with the reason and the chosen config's evidence."""
    c = g.chosen
    kind = DecisionKind.NO_DECISION
    if c is None:
        if not g.rows:
            reason = "no candidate rows"
        elif g.not_ranked.get(str(Status.FAILED)) and not any(
                s in g.not_ranked for s in (Status.PRUNED_SPILL, Status.OUT_OF_RESOURCES, Status.NOT_RUN)):
            reason = f"nothing correct: {_not_ranked_text(g)}"
        else:
            reason = f"nothing timed correctly: {_not_ranked_text(g)}"
    elif c.speedup is None:
        reason = (f"no baseline to compare with: {c.label} is the fastest of {len(g.candidates)} config(s) "
                  f"at {c.latency_us:.3f} us, but no baseline latency was measured")
    else:
        kind = decision_kind(c, noise_band)
        band = decision_band(c, noise_band)
        paired = "paired" if c.paired else "unpaired (candidate and baseline timed at different moments)"
        if kind == DecisionKind.SHIP_CONFIG:
            reason = f"{_fmt(c)} beats {g.baseline_name or 'the baseline'}: the {paired} interval is above 1 + {band:.0%}"
        elif kind == DecisionKind.KEEP_BASELINE:
            reason = (f"the best correct config, {_fmt(c)}, is clearly slower than {g.baseline_name or 'the baseline'} "
                      f"({paired} interval below 1 - {band:.0%})")
        else:
            reason = (f"within noise: the best config, {_fmt(c)}, is within ±{band:.0%} of "
                      f"{g.baseline_name or 'the baseline'} ({paired})")
        if len(g.candidates) > 1:
            reason += f"; best of {len(g.candidates)} timed config(s)"
            if g.tied:
                reason += f", tied with {len(g.tied)} (tie-break: {TIE_BREAK})"
    reason += _kind_note(g)
    evidence: dict[str, object] = {} if c is None else dict(c.evidence)
    if c is not None:
        evidence.update(rows=c.rows, speedup_source="paired" if c.paired else "unpaired",
                        noise_band=decision_band(c, noise_band), tie_reason=g.tie_reason,
                        spills=c.spills)
    if g.not_ranked:
        evidence["not_ranked"] = dict(g.not_ranked)
    if g.ignored_kinds:
        evidence["ignored_data_kinds"] = list(g.ignored_kinds)
    return Decision(
        kernel_name=g.key[0], shape_name=g.key[1], device_name=g.key[2], decision=kind,
        config_id=None if c is None else c.config_id, speedup=None if c is None else c.speedup,
        speedup_ci_low=None if c is None else c.ci_low, speedup_ci_high=None if c is None else c.ci_high,
        baseline_name=g.baseline_name, data_kind=g.data_kind, reason=reason,
        config={} if c is None else dict(c.config), baseline_backend=g.baseline_backend,
        evidence=json_safe(evidence), baselines=g.baselines,
        tied_with=tuple(t.config_id for t in g.tied), candidates=len(g.candidates),
    )


def decide_all(rankings: Mapping[GroupKey, GroupRanking], noise_band: float = DEFAULT_NOISE_BAND
               ) -> dict[GroupKey, Decision]:
    return {key: decide(g, noise_band) for key, g in rankings.items()}
