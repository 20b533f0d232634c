"""Writing one audit's report folder: HTML dashboard, Markdown, JSON and CSV tables.

``report.html`` stays one self-contained file that works offline, but it no longer
carries plotly.js as 4.8 MB of text: the library is stored gzip-compressed and base64-encoded
(about 2 MB) and unpacked in the browser with the standard ``DecompressionStream``
(Chromium 80+, Firefox 113+, Safari 16.4+), then the charts are drawn from their specs.
The tables and the decisions need no script at all to be read.
"""

from __future__ import annotations

import base64
import gzip
import json
from functools import lru_cache
from pathlib import Path

import pandas as pd
from jinja2 import Environment, PackageLoader
from markupsafe import Markup, escape
from plotly.offline import get_plotlyjs

from kernaudit_pipeline.audit_report.context import JSON_EXCLUDED, build_context
from kernaudit_pipeline.audit_report.formatting import fmt_ci, fmt_num, is_blank, md_escape
from kernaudit_pipeline.audit_report.model import ReportFiles, ReportInputs


def _env() -> Environment:
    env = Environment(loader=PackageLoader("kernaudit_pipeline", "templates"),
                      autoescape=lambda name: bool(name) and name.endswith(".html.j2"), trim_blocks=True,
                      lstrip_blocks=True)
    env.filters["md"] = md_escape
    env.filters["num"] = fmt_num
    env.filters["ci"] = lambda row, low, high, digits=3: fmt_ci(row.get(low), row.get(high), digits)
    env.filters["bytes"] = _bytes
    env.filters["v"] = lambda value: "" if is_blank(value) else value  # a sort key: blank when missing
    env.filters["ident"] = ident
    return env


def ident(value: object) -> Markup:
    """An identifier (kernel, shape, config id) escaped, with line-break chances after ``_ . / ,``."""
    if is_blank(value):
        return Markup("–")
    text = str(escape(str(value)))
    for ch in "_./,":
        text = text.replace(ch, ch + "<wbr>")
    return Markup(text)


def _bytes(value: object) -> str:
    from kernaudit_pipeline.audit_report.evidence import fmt_bytes

    return fmt_bytes(value)


@lru_cache(maxsize=1)
def packed_plotlyjs() -> str:
    """plotly.js, gzip-compressed and base64-encoded (deterministic: no timestamp in the header)."""
    return base64.b64encode(gzip.compress(get_plotlyjs().encode(), compresslevel=9, mtime=0)).decode("ascii")


def _recommendations_csv(recs: list[dict], path: Path) -> None:
    pd.DataFrame([{**{k: v for k, v in r.items() if k not in ("evidence", "verification")},
                   "evidence": json.dumps(r.get("evidence")), "verification": json.dumps(r.get("verification"))}
                  for r in recs]).to_csv(path, index=False)


def write_report(inputs: ReportInputs, out_dir: Path) -> ReportFiles:
    out_dir.mkdir(parents=True, exist_ok=True)
    env = _env()
    ctx = build_context(inputs)
    csvs = {
        "kernel_runs": out_dir / "kernel_runs.csv",
        "diagnostics": out_dir / "diagnostics.csv",
        "quarantine": out_dir / "quarantine.csv",
        "recommendations": out_dir / "recommendations.csv",
        "spills": out_dir / "spills.csv",
    }
    inputs.kernel_runs.to_csv(csvs["kernel_runs"], index=False)
    inputs.diagnostics.to_csv(csvs["diagnostics"], index=False)
    inputs.quarantine.to_csv(csvs["quarantine"], index=False)
    _recommendations_csv(ctx["recommendations"], csvs["recommendations"])
    pd.DataFrame(ctx["spills"]).to_csv(csvs["spills"], index=False)
    if ctx["decisions"]:
        csvs["decisions"] = out_dir / "decisions.csv"
        pd.DataFrame([{**{k: v for k, v in d.items() if k not in ("config", "evidence", "baselines")},
                       "config": json.dumps(d.get("config")), "evidence": json.dumps(d.get("evidence")),
                       "baselines": json.dumps(d.get("baselines"))} for d in ctx["decisions"]]).to_csv(
            csvs["decisions"], index=False)
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
    json_ctx = {k: v for k, v in ctx.items() if k not in JSON_EXCLUDED}
    json_ctx["charts"] = [{"chart_id": c.chart_id, "title": c.title, "group": c.group, "kernel": c.kernel,
                           "filters": list(c.filters)} for c in ctx["charts"]]
    json_path.write_text(json.dumps(json_ctx, indent=2, default=str))
    html_path = out_dir / "report.html"
    html_path.write_text(env.get_template("report.html.j2").render(plotly_gz=packed_plotlyjs(), **ctx))
    return ReportFiles(directory=out_dir, html=html_path, markdown=markdown, json=json_path, csvs=csvs)
