"""The ``audit_report`` stage: the comparator dashboard and its exports.

One folder per audit holding ``report.html`` (self-contained: plotly.js is
inlined once, so it works offline), ``report.md``, ``report.json`` and CSV
tables. The modules, in dependency order:

- :mod:`.formatting`: escaping and number formatting (no plotly; other stages use
  :func:`md_escape`);
- :mod:`.model`: the inputs and outputs (``ReportInputs``, ``ReportFiles``);
- :mod:`.frames`: best config per group, memory footprint, roofline points;
- :mod:`.charts`: the plotly figures;
- :mod:`.context`: everything the templates show, computed once;
- :mod:`.render`: the report folder (templates in ``kernaudit_pipeline/templates/report.*``).

Names are re-exported lazily, so ``from kernaudit_pipeline.audit_report import md_escape``
does not import plotly.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "md_escape": "formatting", "esc": "formatting", "fmt_num": "formatting",
    "ReportInputs": "model", "ReportFiles": "model", "ChartSection": "model",
    "best_per_group": "frames", "footprint_frame": "frames", "roofline_frame": "frames",
    "chart_candidate_vs_baseline": "charts", "chart_speedups": "charts", "chart_status_counts": "charts",
    "chart_memory_footprint": "charts", "chart_latency_heatmaps": "charts", "heatmap_figure": "charts",
    "chart_roofline": "charts", "build_charts": "charts",
    "build_context": "context",
    "write_report": "render",
}


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted(_EXPORTS)


__all__ = sorted(_EXPORTS)
