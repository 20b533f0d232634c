"""The ``audit_report`` stage: the comparator dashboard and its exports.

One folder per audit holding ``report.html`` (self-contained: plotly.js is
inlined once, so it works offline), ``report.md``, ``report.json`` and CSV
tables. Every string that comes from a trace is escaped by Jinja's
autoescape in the HTML and by ``md_escape`` in Markdown.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, is_dataclass
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
from jinja2 import Environment, PackageLoader
from plotly.offline import get_plotlyjs

from kernaudit_pipeline import __version__

SMEM_LIMIT_SM90_BYTES = 232_448
STATUS_COLORS = {"IMPROVED": "#1a7f37", "REGRESSION": "#cf222e", "NEUTRAL": "#6e7781",
                 "FAILED": "#8250df", "INCONCLUSIVE": "#bf8700"}


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


@dataclass(frozen=True)
class ReportFiles:
    directory: Path
    html: Path
    markdown: Path
    json: Path
    csvs: dict[str, Path]


def _env() -> Environment:
    env = Environment(loader=PackageLoader("kernaudit_pipeline", "templates"),
                      autoescape=lambda name: bool(name) and name.endswith(".html.j2"), trim_blocks=True, lstrip_blocks=True)
    env.filters["md"] = md_escape
    env.filters["num"] = fmt_num
    return env


def md_escape(value: object) -> str:
    """Neutralize Markdown/HTML metacharacters in trace-provided strings."""
    text = "" if value is None else str(value)
    for ch in "\\`*_{}[]<>|#":
        text = text.replace(ch, "\\" + ch)
    return text.replace("\n", " ")


def fmt_num(value: object, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return "–"
    if isinstance(value, (int,)) or (isinstance(value, float) and value.is_integer() and abs(value) >= 1000):
        return f"{int(value):,}"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def _jsonable(value: object) -> object:
    if is_dataclass(value):
        return _jsonable(asdict(value))
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return None
    if value is pd.NA:
        return None
    if hasattr(value, "item"):
        return _jsonable(value.item())
    return value


def _records(frame: pd.DataFrame) -> list[dict]:
    return [_jsonable(r) for r in frame.astype(object).where(frame.notna(), None).to_dict("records")]


def best_per_group(diag: pd.DataFrame) -> pd.DataFrame:
    """The fastest correct, timed config per (kernel, shape, device)."""
    timed = diag[(diag["latency_us"].notna()) & (diag["status"] != "FAILED")]
    if timed.empty:
        return timed
    keys = ["kernel_name", "shape_name", "device_name"]
    idx = timed.fillna({"shape_name": "", "device_name": ""}).groupby(keys)["latency_us"].idxmin()
    return timed.loc[idx.values].sort_values(keys)


def _figure_html(fig: go.Figure, div_id: str) -> str:
    fig.update_layout(template="plotly_white", margin=dict(l=60, r=20, t=50, b=60), height=420)
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id)


def chart_candidate_vs_baseline(best: pd.DataFrame) -> str:
    labels = [f"{k}<br>{s}" for k, s in zip(best["kernel_name"], best["shape_name"].fillna(""))]
    fig = go.Figure([
        go.Bar(name="best candidate (µs)", x=labels, y=best["latency_us"],
               error_y=dict(type="data", symmetric=False,
                            array=(best["latency_ci_high_us"] - best["latency_us"]).fillna(0),
                            arrayminus=(best["latency_us"] - best["latency_ci_low_us"]).fillna(0)),
               text=best["config_id"], hovertemplate="%{x}<br>%{text}<br>%{y:.2f} µs<extra></extra>"),
        go.Bar(name="baseline (µs)", x=labels, y=best["baseline_us"], text=best["baseline_name"],
               hovertemplate="%{x}<br>%{text}<br>%{y:.2f} µs<extra></extra>"),
    ])
    fig.update_layout(title="Best candidate vs baseline per kernel and shape", barmode="group",
                      yaxis_title="latency (µs, log)", yaxis_type="log")
    return _figure_html(fig, "chart-candidate-vs-baseline")


def chart_memory_footprint(frame: pd.DataFrame) -> str:
    """Registers, spill bytes and shared memory per config (static audit, or the runs)."""
    cfg = frame.drop_duplicates(["kernel_name", "config_id"]).sort_values(["kernel_name", "config_id"])
    x = [f"{k}:{c}" for k, c in zip(cfg["kernel_name"], cfg["config_id"])]
    fig = go.Figure([
        go.Bar(name="registers/thread", x=x, y=cfg["registers_per_thread"], yaxis="y"),
        go.Bar(name="spill stores (bytes)", x=x, y=cfg["spill_stores_bytes"], yaxis="y2"),
        go.Scatter(name="shared memory/block (bytes)", x=x, y=cfg["shared_mem_bytes"], yaxis="y3",
                   mode="markers", marker=dict(symbol="diamond", size=8)),
    ])
    fig.add_shape(type="line", xref="paper", x0=0, x1=1, yref="y3", y0=SMEM_LIMIT_SM90_BYTES,
                  y1=SMEM_LIMIT_SM90_BYTES, line=dict(dash="dash", color="#cf222e"))
    fig.update_layout(title="Memory footprint per config (dashed: sm_90 shared-memory limit per block)",
                      barmode="group", xaxis=dict(tickangle=-60, tickfont=dict(size=8)),
                      yaxis=dict(title="registers/thread", range=[0, 260]),
                      yaxis2=dict(title="spill bytes", overlaying="y", side="right"),
                      yaxis3=dict(overlaying="y", side="right", showticklabels=False, anchor="free",
                                  position=1.0, range=[0, 300_000]), height=480)
    return _figure_html(fig, "chart-memory-footprint")


def chart_status_counts(diag: pd.DataFrame) -> str:
    counts = diag.groupby(["kernel_name", "status"]).size().reset_index(name="runs")
    fig = go.Figure([go.Bar(name=s, x=g["kernel_name"], y=g["runs"], marker_color=STATUS_COLORS.get(s))
                     for s, g in counts.groupby("status")])
    fig.update_layout(title="Verdicts per kernel", barmode="stack", yaxis_title="runs")
    return _figure_html(fig, "chart-status")


def build_context(inputs: ReportInputs) -> dict:
    diag = inputs.diagnostics
    best = best_per_group(diag) if len(diag) else diag
    footprint_src = inputs.static if inputs.static is not None and len(inputs.static) else diag
    charts = {}
    if len(best):
        charts["Candidate vs baseline"] = chart_candidate_vs_baseline(best)
    if len(diag):
        charts["Verdicts"] = chart_status_counts(diag)
    if len(footprint_src) and "registers_per_thread" in footprint_src:
        charts["Memory footprint"] = chart_memory_footprint(footprint_src)
    recs = [_jsonable(r) for r in inputs.recommendations]
    status_counts = diag["status"].value_counts().to_dict() if len(diag) else {}
    spills = diag[diag["spill_detected"]] if len(diag) else diag
    return {
        "title": "kernaudit report",
        "version": __version__,
        "generated_utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ"),
        "run_id": inputs.run_id,
        "mode_note": inputs.mode_note,
        "advisor_note": inputs.advisor_note,
        "files": [_jsonable(f) for f in inputs.files],
        "counts": {"runs": len(inputs.kernel_runs), "quarantined": len(inputs.quarantine),
                   "spilling": len(spills), "recommendations": len(recs)},
        "status_counts": status_counts,
        "best": _records(best),
        "spills": _records(spills.sort_values("spill_stores_bytes", ascending=False).head(50)) if len(spills) else [],
        "recommendations": recs,
        "quarantine": _records(inputs.quarantine),
        "rules": [_jsonable(r) for r in inputs.rules],
        "charts": charts,
    }


def write_report(inputs: ReportInputs, out_dir: Path) -> ReportFiles:
    out_dir.mkdir(parents=True, exist_ok=True)
    env = _env()
    ctx = build_context(inputs)
    csvs = {
        "kernel_runs": out_dir / "kernel_runs.csv",
        "diagnostics": out_dir / "diagnostics.csv",
        "quarantine": out_dir / "quarantine.csv",
        "recommendations": out_dir / "recommendations.csv",
    }
    inputs.kernel_runs.to_csv(csvs["kernel_runs"], index=False)
    inputs.diagnostics.to_csv(csvs["diagnostics"], index=False)
    inputs.quarantine.to_csv(csvs["quarantine"], index=False)
    pd.DataFrame([{**{k: v for k, v in r.items() if k not in ("evidence", "verification")},
                   "evidence": json.dumps(r.get("evidence")), "verification": json.dumps(r.get("verification"))}
                  for r in ctx["recommendations"]]).to_csv(csvs["recommendations"], index=False)
    if inputs.static is not None and len(inputs.static):
        csvs["static_resources"] = out_dir / "static_resources.csv"
        inputs.static.to_csv(csvs["static_resources"], index=False)
    ctx["exports"] = {name: path.name for name, path in csvs.items()}
    markdown = out_dir / "report.md"
    markdown.write_text(env.get_template("report.md.j2").render(**ctx))
    json_path = out_dir / "report.json"
    json_ctx = {k: v for k, v in ctx.items() if k != "charts"}
    json_path.write_text(json.dumps(json_ctx, indent=2, default=str))
    html = out_dir / "report.html"
    html.write_text(env.get_template("report.html.j2").render(plotlyjs=get_plotlyjs(), **ctx))
    return ReportFiles(directory=out_dir, html=html, markdown=markdown, json=json_path, csvs=csvs)
