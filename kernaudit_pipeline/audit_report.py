"""The ``audit_report`` stage: the comparator dashboard and its exports.

One folder per audit holding ``report.html`` (self-contained: plotly.js is
inlined once, so it works offline), ``report.md``, ``report.json`` and CSV
tables. The dashboard shows:

- candidate versus baseline per kernel and shape (best config, and every
  config's speedup with its CI);
- the memory footprint of every config, per kernel: registers/thread, spill
  bytes, shared memory per block against the SM's opt-in limit, occupancy;
- latency heatmaps over BLOCK_M x BLOCK_N, one panel per (num_warps,
  num_stages), per kernel and shape;
- a roofline (arithmetic intensity vs achieved TFLOP/s under the compute and
  bandwidth ceilings);
- the recommendations with their verification and review state;
- filters (kernel, verdict, review state, free text) and links to the exports.

Every string that comes from a trace is escaped: by Jinja's autoescape in the
HTML, by ``md_escape`` in Markdown, and by :func:`esc` before it reaches a
plotly text field (plotly renders a subset of HTML in labels and hover text;
its JSON is emitted with ``<`` as ``\\u003c``, so nothing closes the script).
"""

from __future__ import annotations

import html
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
from plotly.subplots import make_subplots

from kernaudit_pipeline import __version__

SMEM_LIMIT_SM90_BYTES = 232_448
MAX_REGISTERS_PER_THREAD = 255
MAX_TABLE_ROWS = 1000
STATUS_COLORS = {"IMPROVED": "#1a7f37", "REGRESSION": "#cf222e", "NEUTRAL": "#6e7781",
                 "FAILED": "#8250df", "INCONCLUSIVE": "#bf8700"}
PLOTLY_CONFIG = {"displaylogo": False, "responsive": True}
CHART_GROUPS = {"compare": "candidate-vs-baseline", "memory": "memory-footprint", "heatmap": "latency-heatmap",
                "roofline": "roofline"}


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
    mlflow_run_url: str | None = None


@dataclass(frozen=True)
class ReportFiles:
    directory: Path
    html: Path
    markdown: Path
    json: Path
    csvs: dict[str, Path]


@dataclass(frozen=True)
class ChartSection:
    """One chart of the dashboard; ``kernel`` lets the kernel filter hide it."""

    chart_id: str
    title: str
    group: str
    html: str
    kernel: str | None = None
    note: str = ""


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


def esc(value: object) -> str:
    """A trace-provided string made inert for plotly's pseudo-HTML text fields."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return ""
    return html.escape(str(value), quote=True)


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


def _col(frame: pd.DataFrame, name: str) -> pd.Series:
    """A numeric column, all-NaN when the frame lacks it (diagnostics vary by source)."""
    if name in frame:
        return pd.to_numeric(frame[name], errors="coerce").astype(float)
    return pd.Series(float("nan"), index=frame.index)


def best_per_group(diag: pd.DataFrame) -> pd.DataFrame:
    """The fastest correct, timed config per (kernel, shape, device)."""
    timed = diag[(diag["latency_us"].notna()) & (diag["status"] != "FAILED")]
    if timed.empty:
        return timed
    keys = ["kernel_name", "shape_name", "device_name"]
    idx = timed.fillna({"shape_name": "", "device_name": ""}).groupby(keys)["latency_us"].idxmin()
    return timed.loc[idx.values].sort_values(keys)


def _figure_html(fig: go.Figure, div_id: str, height: int = 420) -> str:
    fig.update_layout(template="plotly_white", margin=dict(l=70, r=30, t=60, b=70), height=height)
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=PLOTLY_CONFIG)


def _slug(*parts: object) -> str:
    text = "-".join(str(p) for p in parts)
    return "".join(ch if ch.isalnum() else "-" for ch in text).strip("-").lower()[:80] or "x"


# --- candidate vs baseline -------------------------------------------------------------------

def chart_candidate_vs_baseline(best: pd.DataFrame) -> str:
    labels = [f"{esc(k)}<br>{esc(s)}" for k, s in zip(best["kernel_name"], best["shape_name"])]
    lat = _col(best, "latency_us")
    fig = go.Figure([
        go.Bar(name="best candidate (µs)", x=labels, y=lat,
               error_y=dict(type="data", symmetric=False,
                            array=(_col(best, "latency_ci_high_us") - lat).fillna(0).clip(lower=0),
                            arrayminus=(lat - _col(best, "latency_ci_low_us")).fillna(0).clip(lower=0)),
               text=[esc(c) for c in best["config_id"]], textposition="none",
               hovertemplate="%{x}<br>%{text}<br>%{y:.2f} µs<extra></extra>"),
        go.Bar(name="baseline (µs)", x=labels, y=_col(best, "baseline_us"),
               text=[esc(b) for b in best.get("baseline_name", pd.Series("", index=best.index))],
               textposition="none", hovertemplate="%{x}<br>%{text}<br>%{y:.2f} µs<extra></extra>"),
    ])
    fig.update_layout(title="Best candidate vs baseline per kernel and shape (95 % CI)", barmode="group",
                      yaxis_title="latency (µs, log)", yaxis_type="log")
    return _figure_html(fig, "chart-candidate-vs-baseline", 460)


def chart_speedups(diag: pd.DataFrame) -> str:
    """Every timed config's speedup per kernel and shape, coloured by verdict."""
    timed = diag[_col(diag, "speedup").notna()]
    fig = go.Figure()
    for status, group in timed.groupby("status"):
        sp = _col(group, "speedup")
        fig.add_trace(go.Scatter(
            name=esc(status), mode="markers", marker=dict(color=STATUS_COLORS.get(str(status)), size=7, opacity=0.75),
            x=[f"{esc(k)}<br>{esc(s)}" for k, s in zip(group["kernel_name"], group["shape_name"])], y=sp,
            error_y=dict(type="data", symmetric=False, thickness=1,
                         array=(_col(group, "speedup_ci_high") - sp).fillna(0).clip(lower=0),
                         arrayminus=(sp - _col(group, "speedup_ci_low")).fillna(0).clip(lower=0)),
            text=[esc(c) for c in group["config_id"]],
            hovertemplate="%{x}<br>%{text}<br>speedup %{y:.3f}<extra></extra>"))
    fig.add_hline(y=1.0, line=dict(dash="dash", color="#57606a"), annotation_text="baseline")
    fig.update_layout(title="Speedup of every config vs its baseline (baseline_us / latency_us, 95 % CI)",
                      yaxis_title="speedup (log)", yaxis_type="log")
    return _figure_html(fig, "chart-speedups", 460)


def chart_status_counts(diag: pd.DataFrame) -> str:
    counts = diag.groupby(["kernel_name", "status"]).size().reset_index(name="runs")
    fig = go.Figure([go.Bar(name=esc(s), x=[esc(k) for k in g["kernel_name"]], y=g["runs"],
                            marker_color=STATUS_COLORS.get(str(s)))
                     for s, g in counts.groupby("status")])
    fig.update_layout(title="Verdicts per kernel", barmode="stack", yaxis_title="runs")
    return _figure_html(fig, "chart-status", 380)


# --- memory footprint ------------------------------------------------------------------------

def _occupancy_for(row: pd.Series) -> float | None:
    """Theoretical occupancy of a static row (diagnostics carry it for measured rows)."""
    from kernaudit_pipeline.core.hardware import sm_resources
    from kernaudit_pipeline.occupancy import theoretical_occupancy

    sm = sm_resources(row.get("compute_capability") or "9.0")
    regs, smem = row.get("registers_per_thread"), row.get("shared_mem_bytes")
    threads = row.get("threads_per_block")
    if (threads is None or pd.isna(threads)) and pd.notna(row.get("num_warps")):
        threads = int(row["num_warps"]) * 32
    if sm is None or any(v is None or pd.isna(v) for v in (regs, threads)):
        return None
    try:
        return theoretical_occupancy(sm, registers_per_thread=int(regs), threads_per_block=int(threads),
                                     shared_mem_bytes=int(0 if smem is None or pd.isna(smem) else smem)).occupancy_pct
    except ValueError:
        return None


def footprint_frame(static: pd.DataFrame | None, diag: pd.DataFrame) -> pd.DataFrame:
    """One row per (kernel, config): the static compile first, else the runs."""
    parts = []
    if static is not None and len(static) and "registers_per_thread" in static:
        ok = static[static["status"].astype(str) == "OK"] if "status" in static else static
        parts.append(ok.assign(footprint_source="static compile"))
    if len(diag):
        parts.append(diag.assign(footprint_source="runs"))
    parts = [p.dropna(axis=1, how="all") for p in parts]
    if not parts:
        return pd.DataFrame()
    frame = pd.concat(parts, ignore_index=True, sort=False)
    frame = frame[frame["config_id"].notna() & _col(frame, "registers_per_thread").notna()].copy()
    # The same config can carry differently spelled ids (static compile vs a trace): key on its parameters.
    params = [c for c in ("block_m", "block_n", "block_k", "group_m", "num_warps", "num_stages") if c in frame]
    by_params = pd.concat([_col(frame, c) for c in params], axis=1).astype(str).agg("|".join, axis=1) if params else None
    has_params = _col(frame, "block_m").notna() if "block_m" in frame else pd.Series(False, index=frame.index)
    frame["_config_key"] = frame["config_id"].astype(str)
    if by_params is not None:
        frame.loc[has_params, "_config_key"] = by_params[has_params]
    frame = frame.drop_duplicates(["kernel_name", "_config_key"]).drop(columns="_config_key")
    occ = _col(frame, "occupancy_pct")
    missing = occ.isna()
    if missing.any():
        occ.loc[missing] = [_occupancy_for(r) for _, r in frame[missing].iterrows()]
    frame["occupancy_pct"] = pd.to_numeric(occ, errors="coerce").astype(float)
    order = [c for c in ("kernel_name", "block_m", "block_n", "block_k", "num_warps", "num_stages", "config_id")
             if c in frame]
    return frame.sort_values(order, na_position="last").reset_index(drop=True)


def chart_memory_footprint(kernel: str, cfg: pd.DataFrame) -> str:
    """Registers, spill bytes, shared memory per block (vs the opt-in limit), occupancy per config."""
    x = [esc(c) for c in cfg["config_id"]]
    limit = _col(cfg, "shared_mem_limit_bytes").dropna()
    smem_limit = int(limit.iloc[0]) if len(limit) else SMEM_LIMIT_SM90_BYTES
    smem = _col(cfg, "shared_mem_bytes")
    fig = make_subplots(rows=4, cols=1, shared_xaxes=True, vertical_spacing=0.05,
                        subplot_titles=("registers / thread", "spill bytes (stores, loads)",
                                        f"shared memory / block (bytes; dashed: opt-in limit {smem_limit:,})",
                                        "theoretical occupancy (%)"))
    hover = "%{x}<br>%{y:,.0f}<extra>%{fullData.name}</extra>"
    fig.add_trace(go.Bar(name="registers/thread", x=x, y=_col(cfg, "registers_per_thread"), marker_color="#0969da",
                         hovertemplate=hover), row=1, col=1)
    fig.add_hline(y=MAX_REGISTERS_PER_THREAD, line=dict(dash="dot", color="#cf222e"), row=1, col=1)
    fig.add_trace(go.Bar(name="spill stores (B)", x=x, y=_col(cfg, "spill_stores_bytes").fillna(0),
                         marker_color="#cf222e", hovertemplate=hover), row=2, col=1)
    fig.add_trace(go.Bar(name="spill loads (B)", x=x, y=_col(cfg, "spill_loads_bytes").fillna(0),
                         marker_color="#fb8f44", hovertemplate=hover), row=2, col=1)
    fig.add_trace(go.Bar(name="shared memory/block (B)", x=x, y=smem,
                         marker_color=["#cf222e" if v > smem_limit else "#8250df" for v in smem.fillna(0)],
                         hovertemplate=hover), row=3, col=1)
    fig.add_hline(y=smem_limit, line=dict(dash="dash", color="#cf222e"), row=3, col=1)
    fig.add_trace(go.Bar(name="occupancy %", x=x, y=_col(cfg, "occupancy_pct"), marker_color="#1a7f37",
                         hovertemplate="%{x}<br>%{y:.1f} %<extra></extra>"), row=4, col=1)
    fig.update_yaxes(range=[0, 100], row=4, col=1)
    fig.update_xaxes(tickangle=-60, tickfont=dict(size=9), type="category", row=4, col=1)
    fig.update_layout(title=f"Memory footprint per config: {esc(kernel)}", barmode="group", showlegend=False)
    return _figure_html(fig, f"chart-footprint-{_slug(kernel)}", 820)


# --- latency heatmaps ------------------------------------------------------------------------

def chart_latency_heatmaps(kernel: str, shape: str, frame: pd.DataFrame) -> str | None:
    fig = heatmap_figure(kernel, shape, frame)
    if fig is None:
        return None
    return _figure_html(fig, f"chart-heatmap-{_slug(kernel, shape)}", 190 + 230 * fig.layout.meta["grid_rows"])


def heatmap_figure(kernel: str, shape: str, frame: pd.DataFrame) -> go.Figure | None:
    """Latency over BLOCK_M x BLOCK_N, one panel per (num_warps, num_stages); None if nothing to grid."""
    frame = frame.assign(block_m=_col(frame, "block_m"), block_n=_col(frame, "block_n"),
                         num_warps=_col(frame, "num_warps").fillna(4), num_stages=_col(frame, "num_stages").fillna(0),
                         latency_us=_col(frame, "latency_us"))
    frame = frame[frame["block_m"].notna() & frame["block_n"].notna()]
    timed_rows = frame[frame["latency_us"].notna()]
    if timed_rows.empty:
        return None
    # a panel row or column with no timed config at all would only be an empty frame
    warps = sorted(timed_rows["num_warps"].unique())
    stages = sorted(timed_rows["num_stages"].unique())
    frame = frame[frame["num_warps"].isin(warps) & frame["num_stages"].isin(stages)]
    bms = sorted(frame["block_m"].unique())
    bns = sorted(frame["block_n"].unique())
    titles = [f"warps={int(w)}, stages={int(s) if s else '?'}" for w in warps for s in stages]
    fig = make_subplots(rows=len(warps), cols=len(stages), subplot_titles=titles, shared_xaxes=True,
                        shared_yaxes=True, horizontal_spacing=0.04, vertical_spacing=0.12 / max(len(warps), 1))
    lat = frame["latency_us"].dropna()
    for i, w in enumerate(warps, start=1):
        for j, s in enumerate(stages, start=1):
            cell = frame[(frame["num_warps"] == w) & (frame["num_stages"] == s)]
            z, text, hover = [], [], []
            for bm in bms:
                zr, tr, hr = [], [], []
                for bn in bns:
                    hits = cell[(cell["block_m"] == bm) & (cell["block_n"] == bn)]
                    timed = hits.dropna(subset=["latency_us"])
                    if len(timed):
                        best = timed.loc[timed["latency_us"].idxmin()]
                        zr.append(float(best["latency_us"]))
                        tr.append(fmt_num(float(best["latency_us"]), 1))
                        hr.append(f"{esc(best['config_id'])}<br>{float(best['latency_us']):,.2f} µs"
                                  f"<br>{esc(best.get('status'))}")
                    else:
                        zr.append(None)
                        status = esc(hits["status"].iloc[0]) if len(hits) and "status" in hits else ""
                        tr.append(status)
                        hr.append(f"{esc(hits['config_id'].iloc[0])}<br>{status}" if len(hits) else "not in the sweep")
                z.append(zr)
                text.append(tr)
                hover.append(hr)
            fig.add_trace(go.Heatmap(z=z, x=[str(int(v)) for v in bns], y=[str(int(v)) for v in bms], text=text,
                                     customdata=hover, texttemplate="%{text}", textfont=dict(size=10),
                                     coloraxis="coloraxis", hoverongaps=False,
                                     hovertemplate="BLOCK_M=%{y} BLOCK_N=%{x}<br>%{customdata}<extra></extra>"),
                          row=i, col=j)
    fig.update_xaxes(type="category", title_text="BLOCK_N", row=len(warps))
    fig.update_yaxes(type="category", title_text="BLOCK_M", col=1)
    fig.update_layout(title=f"Latency (µs) over BLOCK_M × BLOCK_N: {esc(kernel)} · {esc(shape)}",
                      coloraxis=dict(colorscale="Viridis", cmin=float(lat.min()), cmax=float(lat.max()),
                                     colorbar=dict(title="µs")),
                      meta={"grid_rows": len(warps), "grid_cols": len(stages)})
    return fig


# --- roofline --------------------------------------------------------------------------------

def roofline_frame(diag: pd.DataFrame) -> pd.DataFrame:
    """Timed rows with arithmetic intensity (FLOP/byte) and achieved TFLOP/s.

    Taken from the diagnostics when they carry them, else computed from
    flops, bytes_moved and latency_us.
    """
    out = diag.copy()
    ai, tf = _col(out, "arithmetic_intensity"), _col(out, "achieved_tflops")
    flops, moved, lat = _col(out, "flops"), _col(out, "bytes_moved"), _col(out, "latency_us")
    out["arithmetic_intensity"] = ai.fillna(flops / moved.where(moved > 0))
    out["achieved_tflops"] = tf.fillna(flops / (lat.where(lat > 0) * 1e-6) / 1e12)
    out = out[(out["arithmetic_intensity"] > 0) & (out["achieved_tflops"] > 0)]
    if "compute_ceiling_tflops" not in out or "bandwidth_ceiling_gb_per_s" not in out:
        from kernaudit_pipeline.core.hardware import lookup

        def _ceil(row: pd.Series) -> tuple[float | None, float | None]:
            spec = lookup(row.get("device_name"))
            if spec is None:
                return None, None
            return spec.peak_tflops_for(row.get("dtype")), spec.mem_bandwidth_gb_per_s

        pairs = [_ceil(r) for _, r in out.iterrows()]
        out["compute_ceiling_tflops"] = [p[0] for p in pairs]
        out["bandwidth_ceiling_gb_per_s"] = [p[1] for p in pairs]
    return out


def chart_roofline(points: pd.DataFrame) -> str:
    fig = go.Figure()
    ai = points["arithmetic_intensity"]
    x_lo, x_hi = float(ai.min()) / 4, float(ai.max()) * 4
    ceilings = points[["device_name", "dtype", "compute_ceiling_tflops", "bandwidth_ceiling_gb_per_s"]].copy()
    ceilings = ceilings.dropna(subset=["compute_ceiling_tflops", "bandwidth_ceiling_gb_per_s"]).drop_duplicates(
        ["compute_ceiling_tflops", "bandwidth_ceiling_gb_per_s"])
    for _, c in ceilings.iterrows():
        peak, bw = float(c["compute_ceiling_tflops"]), float(c["bandwidth_ceiling_gb_per_s"])
        ridge = peak * 1e3 / bw  # FLOP/byte where the two ceilings meet
        xs = [min(x_lo, ridge / 4), ridge, max(x_hi, ridge * 4)]
        ys = [min(peak, x * bw / 1e3) for x in xs]
        fig.add_trace(go.Scatter(
            name=f"ceiling {esc(c['device_name'])} {esc(c['dtype'])}: {peak:,.0f} TFLOP/s, {bw:,.0f} GB/s",
            x=xs, y=ys, mode="lines", line=dict(color="#57606a", dash="dash"),
            hovertemplate="%{x:.1f} FLOP/B → %{y:.1f} TFLOP/s<extra>ceiling</extra>"))
    for kernel, group in points.groupby("kernel_name"):
        fig.add_trace(go.Scatter(
            name=esc(kernel), mode="markers", x=group["arithmetic_intensity"], y=group["achieved_tflops"],
            marker=dict(size=7, opacity=0.7),
            text=[f"{esc(s)}<br>{esc(c)}" for s, c in zip(group["shape_name"], group["config_id"])],
            hovertemplate="%{text}<br>%{x:.1f} FLOP/B, %{y:.1f} TFLOP/s<extra>%{fullData.name}</extra>"))
    fig.update_layout(title="Roofline: achieved TFLOP/s vs arithmetic intensity (dashed: compute and bandwidth "
                      "ceilings)", xaxis=dict(type="log", title="arithmetic intensity (FLOP/byte)"),
                      yaxis=dict(type="log", title="achieved TFLOP/s"))
    return _figure_html(fig, "chart-roofline", 520)


# --- assembling ------------------------------------------------------------------------------

def build_charts(inputs: ReportInputs, best: pd.DataFrame) -> list[ChartSection]:
    diag = inputs.diagnostics
    charts: list[ChartSection] = []
    if len(best):
        charts.append(ChartSection("chart-candidate-vs-baseline", "Candidate vs baseline", "compare",
                                   chart_candidate_vs_baseline(best)))
    if len(diag) and _col(diag, "speedup").notna().any():
        charts.append(ChartSection("chart-speedups", "Speedup of every config", "compare", chart_speedups(diag)))
    if len(diag):
        charts.append(ChartSection("chart-status", "Verdicts", "compare", chart_status_counts(diag)))
    footprint = footprint_frame(inputs.static, diag)
    for kernel, cfg in footprint.groupby("kernel_name", sort=True) if len(footprint) else []:
        sources = ", ".join(sorted(cfg["footprint_source"].unique()))
        charts.append(ChartSection(f"chart-footprint-{_slug(kernel)}", f"Memory footprint: {kernel}", "memory",
                                   chart_memory_footprint(str(kernel), cfg), kernel=str(kernel),
                                   note=f"{len(cfg)} configs, from: {sources}"))
    if len(diag) and {"block_m", "block_n"} <= set(diag.columns):
        keyed = diag.fillna({"shape_name": ""})
        for (kernel, shape), group in keyed.groupby(["kernel_name", "shape_name"], sort=True):
            chart = chart_latency_heatmaps(str(kernel), str(shape), group)
            if chart is not None:
                charts.append(ChartSection(f"chart-heatmap-{_slug(kernel, shape)}", f"Latency heatmap: {kernel} · {shape}",
                                           "heatmap", chart, kernel=str(kernel)))
    points = roofline_frame(diag) if len(diag) else diag
    if len(points):
        charts.append(ChartSection("chart-roofline", "Roofline", "roofline", chart_roofline(points)))
    return charts


def build_context(inputs: ReportInputs) -> dict:
    diag = inputs.diagnostics
    best = best_per_group(diag) if len(diag) else diag
    charts = build_charts(inputs, best)
    recs = [_jsonable(r) for r in inputs.recommendations]
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
        "files": [_jsonable(f) for f in inputs.files],
        "counts": {"runs": len(inputs.kernel_runs), "quarantined": len(inputs.quarantine),
                   "spilling": len(spills), "recommendations": len(recs)},
        "status_counts": status_counts,
        "kernels": kernels,
        "review_states": sorted({str(r.get("review_state")) for r in recs}),
        "best": _records(best),
        "spills": _records(spills.sort_values("spill_stores_bytes", ascending=False).head(50)) if len(spills) else [],
        "recommendations": recs,
        "max_table_rows": MAX_TABLE_ROWS,
        "quarantine": _records(inputs.quarantine),
        "rules": [_jsonable(r) for r in inputs.rules],
        "regressions": _records(history) if history is not None else None,
        "charts": charts,
        "chart_groups": {label: sum(c.group == group for c in charts) for group, label in CHART_GROUPS.items()
                         if any(c.group == group for c in charts)},
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
