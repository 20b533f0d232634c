"""Between the audit and the Claude client: the evidence it is shown, and its answer checked.

The advisor module only talks to the API. This module decides what Claude sees (the most telling
rows, the decisions, the review queue and the learned heuristics; kernel source only on request)
and what becomes of its answer. A suggestion is kept only when:

- its kernel, shape and device are in the evidence, its configs are inside physical bounds
  (tile dims positive powers of two, num_warps in {1, 2, 4, 8, 16, 32}) and it names a config
  when its action needs one;
- it does not give a group a second config change: a group whose queue already changes the
  config (a SHIP_CONFIG, or the rules' untested fix) keeps that one, and a different target is
  rejected with the reason;
- the Verifier does not refute it (the same checks as the rules' proposals).

A block-size hint ("for M up to m_max use this config") is checked against the measured groups
of its kernel in its M bucket: VERIFIED when the config is the chosen one or within the noise
band of it in every measured group of the bucket, REFUTED when it was measured slower than that
anywhere or does not fit, UNVERIFIED otherwise. Nothing Claude writes is deployed without a
person's approval.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from kernaudit_pipeline.core.configs import config_label, group_key, row_shape_dims
from kernaudit_pipeline.core.values import finite_float
from kernaudit_pipeline.core.verdicts import Decision
from kernaudit_pipeline.recommendations.advisor import PromptEvidence
from kernaudit_pipeline.recommendations.limits import device_limits
from kernaudit_pipeline.recommendations.model import (
    NO_CONFIG_ACTIONS, AdvisorOutput, AdvisorSuggestion, BlockSizeHint, Evidence, Heuristic, HeuristicKind,
    Recommendation, RejectedSuggestion, Rule, Source, VerificationState, rec_id_for,
)
from kernaudit_pipeline.recommendations.ranking import GroupKey, GroupRanking, config_key, tied_with
from kernaudit_pipeline.recommendations.rules import config_problem
from kernaudit_pipeline.recommendations.verify import Verifier, configs_match, find_candidate

V = VerificationState
EVIDENCE_COLUMNS = (
    "kernel_name", "shape_name", "device_name", "data_kind", "m", "n", "k", "batch", "seq_len", "head_dim",
    "block_m", "block_n", "block_k", "group_m", "num_warps", "num_stages",
    "registers_per_thread", "spill_stores_bytes", "spill_loads_bytes", "stack_frame_bytes", "shared_mem_bytes",
    "grid_size", "latency_us", "latency_ci_low_us", "latency_ci_high_us", "baseline_us", "speedup",
    "speedup_ci_low", "speedup_ci_high", "speedup_source", "status", "correct", "run_status",
    "local_spill_requests", "stall_lg_throttle_pct", "stall_long_scoreboard_pct", "achieved_occupancy_pct",
    "occupancy_pct", "occupancy_limiter", "blocks_per_sm", "smem_limited", "spill_causes_stalls",
    "sm_throughput_pct", "memory_throughput_pct", "compute_sol_pct", "memory_sol_pct", "efficiency_pct",
    "headroom_pct", "at_roofline", "bottleneck", "source_format",
)


# ---------------------------------------------------------------------------------------------
# What Claude is shown
# ---------------------------------------------------------------------------------------------
def evidence_csv(frame: pd.DataFrame, max_rows: int, chosen: set[tuple]) -> tuple[str, int]:
    """The most telling rows (each group's chosen config, spilling, failed, then fastest) as CSV."""
    if frame.empty:
        return "(no rows)", 0
    cols = [c for c in EVIDENCE_COLUMNS if c in frame.columns and frame[c].notna().any()]

    def priority(row: pd.Series) -> tuple:
        spill = any((finite_float(row.get(c)) or 0.0) > 0 for c in ("spill_stores_bytes", "stack_frame_bytes"))
        lat = finite_float(row.get("latency_us"))
        return ((group_key(row), config_key(row)) not in chosen, not spill, str(row.get("status")) != "FAILED",
                float("inf") if lat is None else lat)

    ranked = sorted(range(len(frame)), key=lambda pos: priority(frame.iloc[pos]))
    keep = sorted(ranked[:max_rows])
    shown = frame.iloc[keep][cols].sort_values([c for c in ("kernel_name", "shape_name", "latency_us") if c in cols],
                                              na_position="last", kind="stable")
    for c in shown.columns:
        values = pd.to_numeric(shown[c], errors="coerce") if shown[c].dtype == object else shown[c]
        if not pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values):
            continue
        present = values.dropna()
        if len(present) and len(present) == shown[c].notna().sum():
            whole = bool(((present % 1) == 0).all())
            shown[c] = values.astype("Int64") if whole else values.astype(float).round(4)
    return shown.to_csv(index=False).strip(), len(shown)


def kernel_sources(frame: pd.DataFrame, verifier: Verifier) -> list[dict]:
    """Source text of the kernel modules behind the frame's kernels (opt-in only)."""
    out = []
    for name in sorted({str(k) for k in frame.get("kernel_name", pd.Series(dtype=object)).dropna()}):
        kernel = verifier.kernel(name)
        if kernel is not None:
            path = Path(kernel.path)
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            out.append({"kernel_name": name, "path": f"kernels/{path.name}", "text": text})
    return out


def prompt_evidence(frame: pd.DataFrame, rankings: Mapping[GroupKey, GroupRanking], decisions: list[Decision],
                    queue: list[Recommendation], heuristics: list[Heuristic], *, max_rows: int, max_queue: int,
                    sources: list[dict] | None = None) -> PromptEvidence:
    chosen = {(key, g.chosen.config_id) for key, g in rankings.items() if g.chosen is not None}
    runs_csv, shown = evidence_csv(frame, max_rows, chosen)
    devices = sorted({str(d) for d in frame.get("device_name", pd.Series(dtype=object)).dropna()}) or ["unknown"]

    def num(v: float | None, digits: int = 3) -> object:
        return "-" if v is None else round(v, digits)

    rows = [{"kernel_name": d.kernel_name, "shape_name": d.shape_name or "-", "device_name": d.device_name or "-",
             "decision": str(d.decision), "config": config_label(dict(d.config)) if d.config else "-",
             "speedup": num(d.speedup), "ci": "-" if d.speedup_ci_low is None else
             f"[{d.speedup_ci_low:.3f}, {d.speedup_ci_high:.3f}]", "data_kind": str(d.data_kind),
             "tied": len(d.tied_with)} for d in decisions]
    items = [{"rec_id": r.rec_id, "kernel_name": r.kernel_name, "shape_name": r.shape_name or "-",
              "current": config_label(r.current_config) if r.current_config else "-", "code": r.code,
              "new": config_label(r.new_config) if r.new_config else "-",
              "verification": (f"{r.verification.state} (fits {r.verification.fits}, vs baseline "
                               f"{r.verification.faster_than_baseline})")} for r in queue]
    return PromptEvidence(
        devices=[{"name": d, **asdict(device_limits(d))} for d in devices], runs_csv=runs_csv, rows_shown=shown,
        rows_total=len(frame), decisions=rows, queue=items[:max_queue], queue_total=len(items),
        heuristics=[f"{h.kernel_name}: {h.text} ({h.verification})" for h in heuristics], sources=sources or [])


# ---------------------------------------------------------------------------------------------
# What becomes of Claude's answer
# ---------------------------------------------------------------------------------------------
def _rows_for(frame: pd.DataFrame, kernel: str, shape: str | None, device: str | None) -> pd.DataFrame:
    if frame.empty:
        return frame
    mask = [group_key(r)[0] == kernel and (shape is None or group_key(r)[1] == shape)
            and (device is None or group_key(r)[2] == device) for _, r in frame.iterrows()]
    return frame[mask]


def to_recommendation(s: AdvisorSuggestion, frame: pd.DataFrame,
                      rankings: Mapping[GroupKey, GroupRanking]) -> tuple[Recommendation, str | None]:
    """The suggestion as a CLAUDE recommendation, and why it must be rejected (or None)."""
    current = s.current_config.model_dump(exclude_none=True)
    new = s.new_config.model_dump(exclude_none=True) if s.new_config else None
    rows = _rows_for(frame, s.kernel_name, s.shape_name, s.device_name)
    first = rows.iloc[0] if len(rows) else None
    shape = s.shape_name if s.shape_name is not None else (None if first is None else group_key(first)[1])
    device = s.device_name if s.device_name is not None else (None if first is None else group_key(first)[2])
    g = rankings.get((s.kernel_name, shape, device))
    rec = Recommendation(
        rec_id=rec_id_for(s.kernel_name, shape, device, current, s.code, new, Source.CLAUDE),
        kernel_name=s.kernel_name, shape_name=shape, device_name=device, current_config=current,
        action=s.action, new_config=new, code=s.code, rationale=s.rationale,
        evidence=tuple(Evidence(**e.model_dump()) for e in s.evidence), expected_effect=s.expected_effect,
        confidence=s.confidence, source=Source.CLAUDE, rule=Rule.CLAUDE,
        shape_dims={} if first is None else row_shape_dims(first),
        data_kind=g.data_kind if g is not None else Recommendation.__dataclass_fields__["data_kind"].default,
        dtype=None if g is None else g.dtype,
    )
    if first is None:
        return rec, (f"{s.kernel_name} / {s.shape_name or '-'} / {s.device_name or '-'} is not in the audit's "
                     "evidence")
    if s.action not in NO_CONFIG_ACTIONS and not new:
        return rec, f"action {s.action} needs a new config and none was given"
    for cfg in (new or {}, current):
        if problem := config_problem(cfg):
            return rec, problem
    return rec, None


def screen(output: AdvisorOutput, frame: pd.DataFrame, rankings: Mapping[GroupKey, GroupRanking],
           queue: list[Recommendation], verifier: Verifier) -> tuple[list[Recommendation], list[RejectedSuggestion]]:
    """(kept suggestions, rejected ones with the reason)."""
    changes = {(r.kernel_name, r.shape_name, r.device_name): r for r in queue if r.new_config}
    candidates: list[Recommendation] = []
    rejected: list[RejectedSuggestion] = []
    for s in output.recommendations:
        rec, problem = to_recommendation(s, frame, rankings)
        key = (rec.kernel_name, rec.shape_name, rec.device_name)
        if problem is None and rec.new_config:
            other = changes.get(key)
            if other is not None and configs_match(other.new_config, rec.new_config):
                problem = f"the same config as {other.rec_id} ({other.code}), already in the queue"
            elif other is not None:
                problem = (f"this group already has a config change in the queue ({other.rec_id}: "
                           f"{config_label(other.new_config)}, {other.decision or 'untested fix'}); "
                           "one target per group")
        if problem is None and rec.new_config is None:
            problem = "proposes no config; the group's decision item already states what to do"
        if problem:
            rejected.append(RejectedSuggestion(rec, problem, summary=s.code))
        else:
            candidates.append(rec)
            changes[key] = rec
    kept: list[Recommendation] = []
    for rec in verifier.verify(candidates):
        if rec.verification.state == V.REFUTED:
            rejected.append(RejectedSuggestion(rec, f"verification refuted it: {rec.verification.note}",
                                               summary=rec.code))
        else:
            kept.append(rec)
    return kept, rejected


def _bucket_groups(h: BlockSizeHint, hints: list[BlockSizeHint],
                   rankings: Mapping[GroupKey, GroupRanking]) -> list[GroupRanking]:
    """The kernel's groups whose M falls in this hint's bucket (above the next smaller hint)."""
    lower = max((o.m_max for o in hints if o.kernel_name == h.kernel_name and o.m_max < h.m_max), default=0)
    return [g for key, g in rankings.items() if key[0] == h.kernel_name
            and (h.device_name is None or key[2] == h.device_name)
            and g.shape_dims.get("M") is not None and lower < g.shape_dims["M"] <= h.m_max]


def check_hints(hints: list[BlockSizeHint], rankings: Mapping[GroupKey, GroupRanking],
                noise_band: float) -> tuple[list[Heuristic], list[Heuristic]]:
    """(kept hints, refuted hints), each as a CLAUDE_HINT heuristic with its verification."""
    kept: list[Heuristic] = []
    refuted: list[Heuristic] = []
    for h in hints:
        cfg = {k: v for k, v in h.model_dump().items()
               if k in ("block_m", "block_n", "block_k", "group_m", "num_warps", "num_stages") and v is not None}
        groups = _bucket_groups(h, hints, rankings)
        problem = config_problem(cfg)
        slower, within, unmeasured = [], [], []
        for g in groups:
            c = find_candidate(g, cfg)
            if c is None or g.fastest is None:
                unmeasured.append(g)
            elif c is g.chosen or tied_with(g.fastest, c, noise_band):
                within.append(g)
            else:
                slower.append(g)
        if problem:
            state, note = V.REFUTED, problem
        elif not groups:
            state, note = V.UNVERIFIED, f"{h.kernel_name} has no measured shape with M in this bucket"
        elif slower:
            state = V.REFUTED
            note = (f"measured slower than the chosen config by more than the noise band in "
                    f"{len(slower)} of {len(groups)} shape(s): {', '.join(str(g.key[1]) for g in slower)}")
        elif within and not unmeasured:
            state, note = V.VERIFIED, f"the chosen config or within the noise band in all {len(within)} shape(s)"
        else:
            state, note = V.UNVERIFIED, (f"within the noise band in {len(within)} shape(s); not measured in "
                                         f"{len(unmeasured)}")
        heuristic = Heuristic(
            h.kernel_name, h.device_name, HeuristicKind.CLAUDE_HINT,
            f"for M <= {h.m_max}, use {config_label(cfg)}: {h.rationale}", when={"m_max": h.m_max}, avoid={},
            use=cfg, support=len(within), counterexamples=len(slower), verification=state, note=note,
            source=Source.CLAUDE, data_kind=groups[0].data_kind if groups else
            Heuristic.__dataclass_fields__["data_kind"].default)
        (refuted if state == V.REFUTED else kept).append(heuristic)
    return kept, refuted
