"""Writing one audit's report folder: HTML dashboard, Markdown, JSON and CSV tables."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from jinja2 import Environment, PackageLoader
from plotly.offline import get_plotlyjs

from kernaudit_pipeline.audit_report.context import build_context
from kernaudit_pipeline.audit_report.formatting import fmt_num, md_escape
from kernaudit_pipeline.audit_report.model import ReportFiles, ReportInputs


def _env() -> Environment:
    env = Environment(loader=PackageLoader("kernaudit_pipeline", "templates"),
                      autoescape=lambda name: bool(name) and name.endswith(".html.j2"), trim_blocks=True, lstrip_blocks=True)
    env.filters["md"] = md_escape
    env.filters["num"] = fmt_num
    return env



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
    if inputs.history is not None:
        csvs["regressions"] = out_dir / "regressions.csv"
        inputs.history.to_csv(csvs["regressions"], index=False)
    ctx["exports"] = {name: path.name for name, path in csvs.items()}
    markdown = out_dir / "report.md"
    markdown.write_text(env.get_template("report.md.j2").render(**ctx))
    json_path = out_dir / "report.json"
    json_ctx = {k: v for k, v in ctx.items() if k != "charts"}
    json_ctx["charts"] = [{"chart_id": c.chart_id, "title": c.title, "group": c.group, "kernel": c.kernel}
                          for c in ctx["charts"]]
    json_path.write_text(json.dumps(json_ctx, indent=2, default=str))
    html_path = out_dir / "report.html"
    html_path.write_text(env.get_template("report.html.j2").render(plotlyjs=get_plotlyjs(), **ctx))
    return ReportFiles(directory=out_dir, html=html_path, markdown=markdown, json=json_path, csvs=csvs)

