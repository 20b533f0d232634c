"""The report's inputs and outputs, as frozen records."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd


@dataclass(frozen=True)
class ReportInputs:
    run_id: str
    mode_note: str
    files: list
    kernel_runs: pd.DataFrame
    quarantine: pd.DataFrame
    diagnostics: pd.DataFrame
    static: pd.DataFrame
    recommendations: list
    rules: list = field(default_factory=list)
    advisor_note: str = "rules only (the Claude advisor was not run)"
    history: pd.DataFrame | None = None  # regressions against the accepted audit (history.Comparison.frame())
    history_reference: str | None = None  # the accepted audit compared with; None: this is the first audit
    mlflow_run_url: str | None = None
    decisions: tuple = ()  # core.verdicts.Decision, one per (kernel, shape, device), from the recommendations stage
    advisor: object | None = None  # recommendations.stage.AdvisorReport: Claude's summary, kept/rejected advice
    heuristics: tuple = ()  # recommendations.model.Heuristic, learned per kernel from the sweep


@dataclass(frozen=True)
class ReportFiles:
    directory: Path
    html: Path
    markdown: Path
    json: Path
    csvs: dict[str, Path]


@dataclass(frozen=True)
class ChartSection:
    """One chart of the dashboard: its plotly spec (JSON text, inert in a script element).

    ``kernel`` lets the kernel filter hide the whole chart; ``filters`` names the page
    filters that act on it (on its traces' ``meta``, or on the whole chart).
    """

    chart_id: str
    title: str
    group: str
    spec: str
    kernel: str | None = None
    note: str = ""
    filters: tuple[str, ...] = ()

