"""Everything the templates show, computed once: decisions, counts that add up, evidence, tables, charts.

``build_context`` is the single place where the report decides what it says; the HTML,
the Markdown, the JSON and the terminal summary all render this one dictionary.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pandas as pd

from kernaudit_pipeline import __version__
from kernaudit_pipeline.audit_report import decisions as decision_text
from kernaudit_pipeline.audit_report.charts import build_charts
from kernaudit_pipeline.audit_report.evidence import spill_rows
from kernaudit_pipeline.audit_report.formatting import is_blank, jsonable, records
from kernaudit_pipeline.audit_report.frames import best_per_group
from kernaudit_pipeline.audit_report.model import ReportInputs
from kernaudit_pipeline.core.verdicts import Status

CHART_GROUPS = {"compare": "candidate-vs-baseline", "memory": "memory-footprint", "heatmap": "latency-heatmap",
                "roofline": "roofline"}
GROUP_KEYS = ["kernel_name", "shape_name", "device_name"]
STATUS_ORDER = [str(s) for s in Status]


def row_counts(kernel_runs: pd.DataFrame, candidates: int, quarantined: int) -> dict[str, int]:
    """How the kernel_runs rows divide: candidates judged, baseline rows, profiler rows joined as evidence."""
    from kernaudit_pipeline.comparisons import RowRole, row_role

    roles = kernel_runs.apply(row_role, axis=1).value_counts().to_dict() if len(kernel_runs) else {}
    return {"runs": len(kernel_runs), "candidates": candidates,
            "baseline_rows": int(roles.get(RowRole.BASELINE, 0)), "profiler_rows": int(roles.get(RowRole.PROFILER, 0)),
            "quarantined": quarantined}


def groups(diag: pd.DataFrame) -> list[tuple]:
    """Every (kernel, shape, device) that has candidate rows: each needs one decision."""
    if diag.empty:
        return []
    keys = diag.reindex(columns=GROUP_KEYS)
    keys = keys.astype(object).where(keys.notna(), None)
    return sorted({tuple(r) for r in keys.itertuples(index=False, name=None)}, key=lambda k: tuple(map(str, k)))


def status_counts(diag: pd.DataFrame) -> dict[str, int]:
    """Verdict -> rows, in the vocabulary's order (unknown spellings last); they sum to the candidates."""
    if diag.empty:
        return {}
    counts = diag["status"].astype(str).value_counts().to_dict()
    order = STATUS_ORDER + sorted(set(counts) - set(STATUS_ORDER))
    return {s: int(counts[s]) for s in order if s in counts}


MATCH_KEYS = GROUP_KEYS + ["config_id"]


def _cell_key(value: object) -> str | None:
    return None if is_blank(value) else str(value)


def _first_rows(diag: pd.DataFrame, decisions: list[dict]) -> list[int | None]:
    """Where each decision's config is in ``diag``: the position of its first row with the same
    kernel, shape, device and config (a blank key matches a blank cell), or None. One index over
    the frame, not a scan per decision: foreign traces bring hundreds of decisions."""
    present = [c for c in MATCH_KEYS if c in diag]
    if not present:
        return [0 if len(diag) else None for _ in decisions]
    cells = zip(*(diag[c].astype(object).where(diag[c].notna(), None).map(_cell_key) for c in present))
    first: dict[tuple, int] = {}
    for pos, key in enumerate(cells):
        first.setdefault(key, pos)
    return [first.get(tuple(_cell_key(d.get(c)) for c in present)) for d in decisions]


def decided_rows(diag: pd.DataFrame, decisions: list[dict]) -> pd.DataFrame:
    """The run row of each decision's config (the table and the chart follow the decisions)."""
    chosen = [d for d in decisions if d.get("config_id")]
    found = [(d, pos) for d, pos in zip(chosen, _first_rows(diag, chosen)) if pos is not None]
    if not found:
        return diag.iloc[0:0]
    rows = diag.iloc[[pos for _, pos in found]].reset_index(drop=True)
    return rows.assign(decision=[str(d.get("decision")) for d, _ in found],
                       data_kind=[d.get("data_kind") for d, _ in found])


def decision_views(diag: pd.DataFrame, decisions: list[dict]) -> list[dict]:
    ordered = sorted(decisions, key=decision_text.sort_key)
    positions = [pos if d.get("config_id") else None for d, pos in zip(ordered, _first_rows(diag, ordered))]
    hits = sorted({pos for pos in positions if pos is not None})
    rows = dict(zip(hits, records(diag.iloc[hits]))) if hits else {}
    return [decision_text.view(d, rows.get(pos) if pos is not None else None) for d, pos in zip(ordered, positions)]


def advisor_view(advisor: object, fallback_note: str) -> dict:
    """What the advisor (Claude, or the rules alone) said: summary, kept and rejected suggestions, its hints.

    Reads the stage's ``AdvisorReport.to_json()``; anything without one is only its note.
    """
    empty = {"note": fallback_note, "used": "rules", "model": None, "summary": "", "accepted": [], "rejected": [],
             "heuristics": [], "rejected_heuristics": []}
    if advisor is None or not callable(getattr(advisor, "to_json", None)):
        note = advisor.note() if callable(getattr(advisor, "note", None)) else fallback_note
        return {**empty, "note": note}
    data = jsonable(advisor.to_json())
    return {**empty, **{k: data.get(k) or empty[k] for k in empty}, "used": data.get("advisor_used", "rules")}


def build_context(inputs: ReportInputs) -> dict:
    diag = inputs.diagnostics
    decisions = [jsonable(d) for d in inputs.decisions]
    decided = decided_rows(diag, decisions) if decisions and len(diag) else diag.iloc[0:0]
    best = decided if len(decided) else (best_per_group(diag) if len(diag) else diag)
    charts = build_charts(inputs, best)
    recs = [jsonable(r) for r in inputs.recommendations]
    spills = spill_rows(diag)
    kernels = sorted({str(k) for k in diag.get("kernel_name", pd.Series(dtype=str)).dropna()}
                     | {str(r.get("kernel_name")) for r in recs if r.get("kernel_name")})
    history = inputs.history
    views = decision_views(diag, decisions)
    return {
        "title": "kernaudit report",
        "version": __version__,
        "generated_utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ"),
        "run_id": inputs.run_id,
        "mode_note": inputs.mode_note,
        "advisor_note": inputs.advisor_note,
        "mlflow_run_url": inputs.mlflow_run_url,
        "files": [jsonable(f) for f in inputs.files],
        "counts": {**row_counts(inputs.kernel_runs, len(diag), len(inputs.quarantine)),
                   "spilling": len(spills), "spilling_profiled": int(spills["profiled"].sum()) if len(spills) else 0,
                   "recommendations": len(recs), "decisions": len(decisions)},
        "status_counts": status_counts(diag),
        "groups": [list(g) for g in groups(diag)],
        "decisions": decisions,
        "decision_views": views,
        "decision_counts": {k: sum(1 for d in decisions if str(d.get("decision")) == k)
                            for k in decision_text.ORDER if any(str(d.get("decision")) == k for d in decisions)},
        "best_follows_decisions": bool(len(decided)),
        "kernels": kernels,
        "review_states": sorted({str(r.get("review_state")) for r in recs}),
        "best": records(best),
        "spills": records(spills),
        "spill_chain": [r for r in records(spills) if r.get("profiled")],
        "recommendations": recs,
        "quarantine": records(inputs.quarantine),
        "rules": [jsonable(r) for r in inputs.rules],
        "regressions": records(history) if history is not None else None,
        "history_reference": inputs.history_reference,
        "advisor": advisor_view(inputs.advisor, inputs.advisor_note),
        "heuristics": [jsonable(h) for h in inputs.heuristics],
        "charts": charts,
        "chart_groups": {label: sum(c.group == group for c in charts) for group, label in CHART_GROUPS.items()
                         if any(c.group == group for c in charts)},
    }


# what report.json leaves out: the rendered charts (kept as a list of ids) and the display-only views
JSON_EXCLUDED = ("charts", "decision_views")
