"""The dashboard's plotly charts: decided speedups, candidate vs baseline, memory footprint, latency
heatmaps, roofline.

Each chart is a figure spec (``data`` + ``layout`` JSON) that the page draws with the one inlined
plotly.js. Every trace-provided string passes through :func:`esc` before it reaches a plotly text
field, and the spec's JSON is written with ``<`` as ``\\u003c``, so nothing in it can close the
script element. Traces carry ``meta`` (``{"kernel": ...}``, ``{"status": ...}``) so the page's
filters can show and hide them.
"""

from __future__ import annotations

import functools
import json

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots
from plotly.utils import PlotlyJSONEncoder

from kernaudit_pipeline.audit_report.formatting import col, esc, fmt_num, slug
from kernaudit_pipeline.audit_report.frames import footprint_frame, roofline_frame
from kernaudit_pipeline.audit_report.model import ChartSection, ReportInputs
from kernaudit_pipeline.core.hardware import sm_resources

STATUS_COLORS = {"IMPROVED": "#1a7f37", "REGRESSION": "#cf222e", "NEUTRAL": "#6e7781", "NOISY": "#9a6700",
                 "FAILED": "#8250df", "INCONCLUSIVE": "#bf8700", "PRUNED_SPILL": "#fb8f44",
                 "OUT_OF_RESOURCES": "#d1242f", "NOT_RUN": "#8c959f"}
DECISION_COLORS = {"SHIP_CONFIG": "#1a7f37", "KEEP_BASELINE": "#cf222e", "NO_DECISION": "#bf8700"}
DEFAULT_SM = sm_resources("9.0")  # the limit lines when a config names no compute capability


@functools.cache
def _page_template() -> dict:
    """The page's plotly template as JSON, built once: setting it through ``update_layout``
    re-validates the whole template for every figure, which was most of a report's chart time."""
    return pio.templates["plotly_white"].to_plotly_json()


def figure_spec(fig: go.Figure | dict, height: int = 420) -> str:
    """The figure (a plotly figure, or a ``{"data", "layout"}`` spec already in plotly.js JSON) as
    JSON for the page (``<`` escaped, so it is inert inside a script element)."""
    spec = fig if isinstance(fig, dict) else fig.to_plotly_json()
    layout = {**spec["layout"], "template": _page_template(), "margin": dict(l=70, r=30, t=60, b=70),
              "height": height}
    text = json.dumps({"data": spec["data"], "layout": layout}, cls=PlotlyJSONEncoder, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _group_label(kernel: object, shape: object) -> str:
    return f"{esc(kernel)}<br>{esc(shape)}"


# --- decisions: the decided config's speedup, and candidate vs baseline latency ----------------

def decided_speedups_figure(best: pd.DataFrame) -> go.Figure:
    """The decided (or fastest correct) config's paired speedup per kernel and shape, with its CI.

    Horizontal bars, fastest at the top, so the long (kernel, shape) labels read on one line.
    """
    fig = go.Figure()
    colour_by = "decision" if "decision" in best else "status"
    palette = DECISION_COLORS if colour_by == "decision" else STATUS_COLORS
    ordered = best.assign(_s=col(best, "speedup")).sort_values("_s", na_position="first")
    labels = [f"{esc(k)} · {esc(s)}" for k, s in zip(ordered["kernel_name"], ordered["shape_name"])]
    shown: set[str] = set()
    for (kernel, verdict), group in ordered.groupby(["kernel_name", colour_by], sort=False, dropna=False):
        sp = col(group, "speedup")
        has_ci = col(group, "speedup_ci_low").notna()
        fig.add_trace(go.Bar(
            name=esc(verdict), legendgroup=esc(verdict), showlegend=str(verdict) not in shown, orientation="h",
            y=[f"{esc(k)} · {esc(s)}" for k, s in zip(group["kernel_name"], group["shape_name"])], x=sp,
            marker_color=palette.get(str(verdict), "#57606a"), meta={"kernel": str(kernel)},
            error_x=dict(type="data", symmetric=False, array=(col(group, "speedup_ci_high") - sp).fillna(0).clip(lower=0),
                         arrayminus=(sp - col(group, "speedup_ci_low")).fillna(0).clip(lower=0)),
            text=[f"{esc(c)}<br>{'95 % CI' if ci else 'no CI recorded'}" for c, ci in zip(group["config_id"], has_ci)],
            textposition="none", hovertemplate="%{y}<br>%{text}<br>speedup %{x:.3f}×<extra>%{fullData.name}</extra>"))
        shown.add(str(verdict))
    fig.add_vline(x=1.0, line=dict(dash="dash", color="#57606a"), annotation_text="baseline = 1")
    fig.update_layout(title="Speedup of the decided config per kernel and shape (whiskers: paired 95 % CI, "
                            "where recorded)", xaxis_title="speedup (baseline µs / candidate µs)",
                      barmode="relative", yaxis=dict(type="category", categoryorder="array", categoryarray=labels,
                                                     automargin=True))
    return fig


def decided_speedups_height(best: pd.DataFrame) -> int:
    return 160 + 22 * len(best)


def candidate_vs_baseline_figure(best: pd.DataFrame) -> go.Figure:
    """Latency of the decided config and of its baseline, per kernel and shape (whiskers: latency CI)."""
    fig = go.Figure()
    for i, (kernel, group) in enumerate(best.groupby("kernel_name", sort=True)):
        labels = [_group_label(k, s) for k, s in zip(group["kernel_name"], group["shape_name"])]
        lat = col(group, "latency_us")
        base = col(group, "baseline_us")
        fig.add_trace(go.Bar(
            name="decided config (µs)", legendgroup="candidate", showlegend=i == 0, offsetgroup="candidate",
            x=labels, y=lat, marker_color="#0969da", meta={"kernel": str(kernel)},
            error_y=dict(type="data", symmetric=False, array=(col(group, "latency_ci_high_us") - lat).fillna(0).clip(lower=0),
                         arrayminus=(lat - col(group, "latency_ci_low_us")).fillna(0).clip(lower=0)),
            text=[esc(c) for c in group["config_id"]], textposition="none",
            hovertemplate="%{x}<br>%{text}<br>%{y:.2f} µs<extra></extra>"))
        fig.add_trace(go.Bar(
            name="baseline (µs)", legendgroup="baseline", showlegend=i == 0, offsetgroup="baseline",
            x=labels, y=base, marker_color="#8c959f", meta={"kernel": str(kernel)},
            error_y=dict(type="data", symmetric=False, array=(col(group, "baseline_ci_high_us") - base).fillna(0).clip(lower=0),
                         arrayminus=(base - col(group, "baseline_ci_low_us")).fillna(0).clip(lower=0)),
            text=[esc(b) for b in group.get("baseline_name", pd.Series("", index=group.index))],
            textposition="none", hovertemplate="%{x}<br>%{text}<br>%{y:.2f} µs<extra></extra>"))
    fig.update_layout(title="Latency: decided config vs baseline per kernel and shape (whiskers: 95 % CI where "
                            "recorded)", barmode="group", yaxis_title="latency (µs, log)", yaxis_type="log",
                      xaxis=dict(type="category"))
    return fig


def speedups_figure(diag: pd.DataFrame) -> go.Figure:
    """Every timed config's speedup per kernel and shape, coloured by verdict."""
    timed = diag[col(diag, "speedup").notna()]
    fig = go.Figure()
    shown: set[str] = set()
    for (status, kernel), group in timed.groupby(["status", "kernel_name"], sort=True):
        sp = col(group, "speedup")
        fig.add_trace(go.Scatter(
            name=esc(status), legendgroup=esc(status), showlegend=str(status) not in shown, mode="markers",
            marker=dict(color=STATUS_COLORS.get(str(status)), size=7, opacity=0.75),
            meta={"kernel": str(kernel), "status": str(status)},
            x=[_group_label(k, s) for k, s in zip(group["kernel_name"], group["shape_name"])], y=sp,
            error_y=dict(type="data", symmetric=False, thickness=1,
                         array=(col(group, "speedup_ci_high") - sp).fillna(0).clip(lower=0),
                         arrayminus=(sp - col(group, "speedup_ci_low")).fillna(0).clip(lower=0)),
            text=[esc(c) for c in group["config_id"]],
            hovertemplate="%{x}<br>%{text}<br>speedup %{y:.3f}<extra></extra>"))
        shown.add(str(status))
    fig.add_hline(y=1.0, line=dict(dash="dash", color="#57606a"), annotation_text="baseline")
    fig.update_layout(title="Speedup of every timed config vs its baseline (whiskers: 95 % CI where recorded)",
                      yaxis_title="speedup (log)", yaxis_type="log", xaxis=dict(type="category"))
    return fig


def status_counts_figure(diag: pd.DataFrame) -> go.Figure:
    counts = diag.groupby(["kernel_name", "status"]).size().reset_index(name="runs")
    fig = go.Figure([go.Bar(name=esc(s), x=[esc(k) for k in g["kernel_name"]], y=g["runs"], meta={"status": str(s)},
                            marker_color=STATUS_COLORS.get(str(s)))
                     for s, g in counts.groupby("status")])
    fig.update_layout(title="Verdicts per kernel (every candidate run)", barmode="stack", yaxis_title="runs")
    return fig


# --- memory footprint ------------------------------------------------------------------------

# The footprint chart: four stacked panels, written as a plotly.js spec rather than through
# ``make_subplots``: an audit of foreign traces draws one such chart per kernel (hundreds), and
# plotly's validation made each cost ~0.1 s.
_FOOTPRINT_PANELS = 4
_FOOTPRINT_GAP = 0.05


def _axis(row: int) -> str:
    """plotly.js's suffix for a panel's axes: ``x``/``y`` for the first, ``x2``/``y2``... after."""
    return "" if row == 1 else str(row)


def _footprint_axes() -> tuple[dict, list[float]]:
    """The stacked axes of ``make_subplots(rows=4, shared_xaxes=True, vertical_spacing=0.05)``:
    one x axis per panel, all matching the bottom one (which alone shows its tick labels)."""
    height = (1.0 - _FOOTPRINT_GAP * (_FOOTPRINT_PANELS - 1)) / _FOOTPRINT_PANELS
    layout: dict = {}
    tops = []
    for row in range(1, _FOOTPRINT_PANELS + 1):
        top = 1.0 - (row - 1) * (height + _FOOTPRINT_GAP)
        bottom = max(top - height, 0.0)
        tops.append(top)
        sfx = _axis(row)
        xaxis = {"anchor": f"y{sfx}", "domain": [0.0, 1.0]}
        if row < _FOOTPRINT_PANELS:
            xaxis.update(matches=f"x{_FOOTPRINT_PANELS}", showticklabels=False)
        layout[f"xaxis{sfx}"] = xaxis
        layout[f"yaxis{sfx}"] = {"anchor": f"x{sfx}", "domain": [round(bottom, 12), round(top, 12)]}
    return layout, tops


def _values(series: pd.Series) -> list:
    return [None if pd.isna(v) else float(v) for v in series]


def memory_footprint_figure(kernel: str, cfg: pd.DataFrame) -> dict:
    """Registers, spill bytes, shared memory per block (vs the opt-in limit), occupancy per config,
    as a plotly.js spec (``{"data", "layout"}``) for :func:`figure_spec`."""
    x = [esc(c) for c in cfg["config_id"]]
    limit = col(cfg, "shared_mem_limit_bytes").dropna()
    smem_limit = int(limit.iloc[0]) if len(limit) else DEFAULT_SM.smem_per_block_optin_bytes
    smem = col(cfg, "shared_mem_bytes")
    hover = "%{x}<br>%{y:,.0f}<extra>%{fullData.name}</extra>"

    def bar(name: str, y: pd.Series, color: object, row: int, template: str = hover) -> dict:
        sfx = _axis(row)
        return {"type": "bar", "name": name, "x": x, "y": _values(y), "marker": {"color": color},
                "hovertemplate": template, "xaxis": f"x{sfx}", "yaxis": f"y{sfx}"}

    def level(y: float, row: int, dash: str) -> dict:
        sfx = _axis(row)
        return {"type": "line", "xref": f"x{sfx} domain", "x0": 0, "x1": 1, "yref": f"y{sfx}", "y0": y, "y1": y,
                "line": {"dash": dash, "color": "#cf222e"}}

    layout, tops = _footprint_axes()
    layout["xaxis4"].update(tickangle=-60, tickfont={"size": 9}, type="category")
    layout["yaxis4"]["range"] = [0, 100]
    titles = ("registers / thread", "spill bytes (stores, loads)",
              f"shared memory / block (bytes; dashed: opt-in limit {smem_limit:,})", "theoretical occupancy (%)")
    layout["annotations"] = [
        {"text": t, "x": 0.5, "xanchor": "center", "xref": "paper", "y": top, "yanchor": "bottom", "yref": "paper",
         "showarrow": False, "font": {"size": 16}} for t, top in zip(titles, tops)]
    layout["shapes"] = [level(DEFAULT_SM.max_regs_per_thread, 1, "dot"), level(smem_limit, 3, "dash")]
    layout.update(title={"text": f"Memory footprint per config: {esc(kernel)}"}, barmode="group", showlegend=False)
    data = [
        bar("registers/thread", col(cfg, "registers_per_thread"), "#0969da", 1),
        bar("spill stores (B)", col(cfg, "spill_stores_bytes").fillna(0), "#cf222e", 2),
        bar("spill loads (B)", col(cfg, "spill_loads_bytes").fillna(0), "#fb8f44", 2),
        bar("shared memory/block (B)", smem,
            ["#cf222e" if v > smem_limit else "#8250df" for v in smem.fillna(0)], 3),
        bar("occupancy %", col(cfg, "occupancy_pct"), "#1a7f37", 4, "%{x}<br>%{y:.1f} %<extra></extra>"),
    ]
    return {"data": data, "layout": layout}


# --- latency heatmaps ------------------------------------------------------------------------

def heatmap_figure(kernel: str, shape: str, frame: pd.DataFrame) -> go.Figure | None:
    """Latency over BLOCK_M x BLOCK_N, one panel per (num_warps, num_stages); None if nothing to grid."""
    frame = frame.assign(block_m=col(frame, "block_m"), block_n=col(frame, "block_n"),
                         num_warps=col(frame, "num_warps").fillna(4), num_stages=col(frame, "num_stages").fillna(0),
                         latency_us=col(frame, "latency_us"))
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
    narrow = frame[["block_m", "block_n", "num_warps", "num_stages", "latency_us", "config_id"]].assign(
        status=frame["status"] if "status" in frame else "")
    cells: dict[tuple, tuple] = {}  # (w, s, bm, bn) -> (fastest timed row, or the first row)
    for key, hits in narrow.groupby(["num_warps", "num_stages", "block_m", "block_n"], sort=False):
        timed = hits[hits["latency_us"].notna()]
        cells[key] = (timed.loc[timed["latency_us"].idxmin()] if len(timed) else None, hits.iloc[0])
    for i, w in enumerate(warps, start=1):
        for j, s in enumerate(stages, start=1):
            z, text, hover = [], [], []
            for bm in bms:
                zr, tr, hr = [], [], []
                for bn in bns:
                    best, first = cells.get((w, s, bm, bn), (None, None))
                    if best is not None:
                        zr.append(float(best["latency_us"]))
                        tr.append(fmt_num(float(best["latency_us"]), 1))
                        hr.append(f"{esc(best['config_id'])}<br>{float(best['latency_us']):,.2f} µs"
                                  f"<br>{esc(best['status'])}")
                    else:
                        zr.append(None)
                        status = esc(first["status"]) if first is not None else ""
                        tr.append(status)
                        hr.append(f"{esc(first['config_id'])}<br>{status}" if first is not None else "not in the sweep")
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


def roofline_figure(points: pd.DataFrame) -> go.Figure:
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
            marker=dict(size=7, opacity=0.7), meta={"kernel": str(kernel)},
            text=[f"{esc(s)}<br>{esc(c)}" for s, c in zip(group["shape_name"], group["config_id"])],
            hovertemplate="%{text}<br>%{x:.1f} FLOP/B, %{y:.1f} TFLOP/s<extra>%{fullData.name}</extra>"))
    fig.update_layout(title="Roofline: achieved TFLOP/s vs arithmetic intensity (dashed: compute and bandwidth "
                      "ceilings)", xaxis=dict(type="log", title="arithmetic intensity (FLOP/byte)"),
                      yaxis=dict(type="log", title="achieved TFLOP/s"))
    return fig


# --- assembling ------------------------------------------------------------------------------

def heatmap_height(fig: go.Figure) -> int:
    return 190 + 230 * fig.layout.meta["grid_rows"]


def build_charts(inputs: ReportInputs, best: pd.DataFrame) -> list[ChartSection]:
    """Every chart of the dashboard, in page order; ``best`` holds the decided config of each group."""
    diag = inputs.diagnostics
    charts: list[ChartSection] = []
    if len(best) and col(best, "speedup").notna().any():
        charts.append(ChartSection("chart-decided-speedups", "Decided speedups", "compare",
                                   figure_spec(decided_speedups_figure(best), decided_speedups_height(best)),
                                   filters=("kernel",)))
    if len(best):
        charts.append(ChartSection("chart-candidate-vs-baseline", "Candidate vs baseline", "compare",
                                   figure_spec(candidate_vs_baseline_figure(best), 440), filters=("kernel",)))
    if len(diag) and col(diag, "speedup").notna().any():
        charts.append(ChartSection("chart-speedups", "Speedup of every config", "compare",
                                   figure_spec(speedups_figure(diag), 460), filters=("kernel", "status")))
    if len(diag):
        charts.append(ChartSection("chart-status", "Verdicts", "compare", figure_spec(status_counts_figure(diag), 380),
                                   filters=("status",)))
    footprint = footprint_frame(inputs.static, diag)
    for kernel, cfg in footprint.groupby("kernel_name", sort=True) if len(footprint) else []:
        sources = ", ".join(sorted(cfg["footprint_source"].unique()))
        charts.append(ChartSection(f"chart-footprint-{slug(kernel)}", f"Memory footprint: {kernel}", "memory",
                                   figure_spec(memory_footprint_figure(str(kernel), cfg), 820), kernel=str(kernel),
                                   note=f"{len(cfg)} configs, from: {sources}", filters=("kernel",)))
    if len(diag) and {"block_m", "block_n"} <= set(diag.columns):
        keyed = diag.fillna({"shape_name": ""})
        for (kernel, shape), group in keyed.groupby(["kernel_name", "shape_name"], sort=True):
            fig = heatmap_figure(str(kernel), str(shape), group)
            if fig is not None:
                charts.append(ChartSection(f"chart-heatmap-{slug(kernel, shape)}",
                                           f"Latency heatmap: {kernel} · {shape}", "heatmap",
                                           figure_spec(fig, heatmap_height(fig)), kernel=str(kernel),
                                           filters=("kernel",)))
    points = roofline_frame(diag) if len(diag) else diag
    if len(points):
        charts.append(ChartSection("chart-roofline", "Roofline", "roofline", figure_spec(roofline_figure(points), 520),
                                   filters=("kernel",)))
    return charts
