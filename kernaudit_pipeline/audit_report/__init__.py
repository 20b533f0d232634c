"""The ``audit_report`` stage: the comparator dashboard and its exports.

One folder per audit holding ``report.html`` (self-contained: plotly.js is
inlined once, so it works offline), ``report.md``, ``report.json`` and CSV
tables. The modules, in dependency order:

- :mod:`.formatting`: escaping and number formatting (no plotly; other stages use
  :func:`md_escape`);
- :mod:`.model`: the inputs and outputs (``ReportInputs``, ``ReportFiles``);
- :mod:`.frames`: best config per group, memory footprint, roofline points;
- :mod:`.evidence`: the spill → stall chain against the same tile without spills;
- :mod:`.decisions`: how a decision reads (baseline by what ran, speedup with CI, evidence);
- :mod:`.charts`: the plotly figures;
- :mod:`.context`: everything the templates show, computed once;
- :mod:`.render`: the report folder (templates in ``kernaudit_pipeline/templates/report.*``);
- :mod:`.terminal`: the decisions as ``kernaudit audit`` prints them.

Names are re-exported lazily, so ``from kernaudit_pipeline.audit_report import md_escape``
does not import plotly.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "md_escape": "formatting", "esc": "formatting", "fmt_num": "formatting",
    "ReportInputs": "model", "ReportFiles": "model", "ChartSection": "model",
    "best_per_group": "frames", "footprint_frame": "frames", "roofline_frame": "frames",
    "decided_speedups_figure": "charts", "candidate_vs_baseline_figure": "charts", "speedups_figure": "charts",
    "status_counts_figure": "charts", "memory_footprint_figure": "charts", "heatmap_figure": "charts",
    "roofline_figure": "charts", "figure_spec": "charts", "build_charts": "charts",
    "spill_rows": "evidence", "clean_twins": "evidence",
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
