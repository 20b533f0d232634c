"""Everything the templates show, computed once: counts, best configs, spills, recommendations, charts."""

from __future__ import annotations

from datetime import datetime, timezone

import pandas as pd

from kernaudit_pipeline import __version__
from kernaudit_pipeline.audit_report.charts import build_charts
from kernaudit_pipeline.audit_report.formatting import jsonable, records
from kernaudit_pipeline.audit_report.frames import best_per_group
from kernaudit_pipeline.audit_report.model import ReportInputs

MAX_TABLE_ROWS = 1000
CHART_GROUPS = {"compare": "candidate-vs-baseline", "memory": "memory-footprint", "heatmap": "latency-heatmap",
                "roofline": "roofline"}


GROUP_KEYS = ["kernel_name", "shape_name", "device_name"]


def row_counts(kernel_runs: pd.DataFrame, candidates: int, quarantined: int) -> dict[str, int]:
    """How the kernel_runs rows divide: candidates judged, baseline rows, profiler rows joined as evidence."""
    from kernaudit_pipeline.comparisons import RowRole, row_role

    roles = kernel_runs.apply(row_role, axis=1).value_counts().to_dict() if len(kernel_runs) else {}
    return {"runs": len(kernel_runs), "candidates": candidates,
            "baseline_rows": int(roles.get(RowRole.BASELINE, 0)), "profiler_rows": int(roles.get(RowRole.PROFILER, 0)),
            "quarantined": quarantined}


def groups(diag: pd.DataFrame) -> list[list[str | None]]:
    """Every (kernel, shape, device) that has candidate rows: each needs one decision."""
    if diag.empty:
        return []
    keys = diag.reindex(columns=GROUP_KEYS).astype(object).where(diag.reindex(columns=GROUP_KEYS).notna(), None)
    return sorted({tuple(r) for r in keys.itertuples(index=False, name=None)}, key=lambda k: tuple(map(str, k)))


def build_context(inputs: ReportInputs) -> dict:
    diag = inputs.diagnostics
    best = best_per_group(diag) if len(diag) else diag
    charts = build_charts(inputs, best)
    recs = [jsonable(r) for r in inputs.recommendations]
    status_counts = diag["status"].value_counts().to_dict() if len(diag) else {}
    spills = diag[diag["spill_detected"].astype(bool)] if len(diag) and "spill_detected" in diag else diag.iloc[0:0]
    kernels = sorted({str(k) for k in diag.get("kernel_name", pd.Series(dtype=str)).dropna()}
                     | {str(r.get("kernel_name")) for r in recs if r.get("kernel_name")})
    history = inputs.history if inputs.history is not None else None
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
                   "spilling": len(spills), "recommendations": len(recs)},
        "groups": [list(g) for g in groups(diag)],
        "decisions": [jsonable(d) for d in inputs.decisions],
        "status_counts": status_counts,
        "kernels": kernels,
        "review_states": sorted({str(r.get("review_state")) for r in recs}),
        "best": records(best),
        "spills": records(spills.sort_values("spill_stores_bytes", ascending=False).head(50)) if len(spills) else [],
        "recommendations": recs,
        "max_table_rows": MAX_TABLE_ROWS,
        "quarantine": records(inputs.quarantine),
        "rules": [jsonable(r) for r in inputs.rules],
        "regressions": records(history) if history is not None else None,
        "history_reference": inputs.history_reference,
        "charts": charts,
        "chart_groups": {label: sum(c.group == group for c in charts) for group, label in CHART_GROUPS.items()
                         if any(c.group == group for c in charts)},
    }

