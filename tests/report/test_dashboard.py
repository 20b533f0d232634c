"""The comparator dashboard, built from the real library stages on the committed traces."""

import json
import re

import pandas as pd
import pytest

from kernaudit_pipeline import audit_report
from kernaudit_pipeline.audit_report import (build_context, figure_spec, footprint_frame, heatmap_figure,
                                             roofline_frame, write_report)
from tests.report.inputs import library_inputs

HOSTILE = "<script>alert(1)</script>"
HOSTILE_SHAPE = '"><img src=x onerror=alert(2)>'


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return library_inputs(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def report(inputs, tmp_path_factory):
    return write_report(inputs, tmp_path_factory.mktemp("report"))


def test_every_chart_family_is_there(inputs, report):
    payload = json.loads(report.json.read_text())
    groups = {c["group"] for c in payload["charts"]}
    assert groups == {"compare", "memory", "heatmap", "roofline"}
    diag = inputs.diagnostics
    configured = set(diag.loc[diag["config_id"].notna() & diag["registers_per_thread"].notna(), "kernel_name"])
    assert {c["kernel"] for c in payload["charts"] if c["group"] == "memory"} == configured
    assert {"flash_attention_fwd", "paged_decode_attention"} <= configured
    html = report.html.read_text()
    for chart in payload["charts"]:
        assert f'id="{chart["chart_id"]}"' in html and f'id="spec-{chart["chart_id"]}"' in html
    # each chart's spec is JSON the page draws; plotly.js is packed once (gzip + base64), fetched from nowhere
    specs = re.findall(r'<script type="application/json" id="spec-[^"]+">(.*?)</script>', html, re.S)
    assert len(specs) == len(payload["charts"]) and all(json.loads(s)["data"] for s in specs)
    packed = re.search(r'<script type="application/octet-stream" id="plotly-gz">(.*?)</script>', html, re.S).group(1)
    import base64
    import gzip
    plotly_js = gzip.decompress(base64.b64decode(packed)).decode()
    assert plotly_js.startswith("/**") and "plotly.js v" in plotly_js[:300]
    assert "cdn.plot.ly" not in html and "<script src" not in html
    assert len(html.encode()) < 4_500_000  # the inlined plotly.js alone was 4.8 MB


def test_exports_are_linked_and_exist(report):
    html = report.html.read_text()
    for name in ["report.md", "report.json", *[p.name for p in report.csvs.values()]]:
        assert f'href="{name}"' in html
        assert (report.directory / name).exists()


def test_heatmap_has_one_panel_per_warps_and_stages(inputs):
    diag = inputs.diagnostics
    kernel, shape = "flash_attention_fwd", diag.loc[diag["kernel_name"] == "flash_attention_fwd", "shape_name"].iloc[0]
    group = diag[(diag["kernel_name"] == kernel) & (diag["shape_name"] == shape)]
    fig = heatmap_figure(kernel, shape, group)
    timed = group.dropna(subset=["latency_us"])
    warps, stages = sorted(timed["num_warps"].unique()), sorted(timed["num_stages"].unique())
    assert len(fig.data) == len(warps) * len(stages) and all(t.type == "heatmap" for t in fig.data)
    assert [a.text for a in fig.layout.annotations] == [f"warps={w}, stages={s}" for w in warps for s in stages]
    best = group.dropna(subset=["latency_us"]).nsmallest(1, "latency_us").iloc[0]
    panel = fig.data[warps.index(best["num_warps"]) * len(stages) + stages.index(best["num_stages"])]
    row, col = list(panel.y).index(str(best["block_m"])), list(panel.x).index(str(best["block_n"]))
    assert panel.z[row][col] == best["latency_us"]  # the best config sits in its cell
    assert figure_spec(fig).count("BLOCK_M=%{y}") == len(fig.data)


def test_heatmap_is_skipped_without_tiles(inputs):
    diag = inputs.diagnostics.head(5).assign(block_m=pd.NA)
    assert heatmap_figure("k", "s", diag) is None


def test_roofline_falls_back_to_flops_bytes_and_latency(inputs):
    diag = inputs.diagnostics
    from_diag = roofline_frame(diag)
    stripped = diag.drop(columns=["arithmetic_intensity", "achieved_tflops", "compute_ceiling_tflops",
                                  "bandwidth_ceiling_gb_per_s"])
    computed = roofline_frame(stripped)
    assert len(computed) == len(from_diag) > 0
    pd.testing.assert_series_equal(computed["arithmetic_intensity"], from_diag["arithmetic_intensity"], rtol=1e-9)
    pd.testing.assert_series_equal(computed["achieved_tflops"], from_diag["achieved_tflops"], rtol=1e-9)
    # from the GPU spec table; modelled rows name no real card, so they get no ceiling
    real = computed["data_kind"] != "modelled"
    assert real.any() and computed.loc[real, "compute_ceiling_tflops"].notna().all()


def test_footprint_computes_occupancy_when_diagnostics_lack_it(inputs):
    diag = inputs.diagnostics
    with_occ = footprint_frame(None, diag)
    without = footprint_frame(None, diag.drop(columns=["occupancy_pct"]))
    merged = with_occ.merge(without, on=["kernel_name", "config_id"], suffixes=("", "_computed"))
    assert len(merged) == len(with_occ) > 0
    same = (merged["occupancy_pct"] - merged["occupancy_pct_computed"]).abs() < 1e-6
    assert same.mean() > 0.9  # the same occupancy model, from registers, threads and shared memory


def test_footprint_prefers_the_static_compile_and_keeps_the_smem_limit(inputs):
    static = pd.DataFrame([{"kernel_name": "gemm_bf16", "config_id": "BK64_BM128_BN256_GM8_s3_w4", "status": "OK",
                            "registers_per_thread": 255, "spill_stores_bytes": 808, "spill_loads_bytes": 808,
                            "shared_mem_bytes": 147456, "shared_mem_limit_bytes": 232448, "threads_per_block": 128,
                            "block_m": 128, "block_n": 256, "block_k": 64, "group_m": 8, "num_warps": 4,
                            "num_stages": 3, "compute_capability": "9.0"}])
    frame = footprint_frame(static, inputs.diagnostics)
    mine = frame[(frame["kernel_name"] == "gemm_bf16") & (frame["block_m"] == 128) & (frame["block_n"] == 256)
                 & (frame["block_k"] == 64) & (frame["num_warps"] == 4) & (frame["num_stages"] == 3)]
    assert len(mine) == 1  # one row per config, whichever way its id is spelled
    gemm = mine.iloc[0]
    assert gemm["footprint_source"] == "static compile" and gemm["spill_stores_bytes"] == 808
    assert gemm["occupancy_pct"] > 0
    fig = audit_report.memory_footprint_figure("gemm_bf16", frame[frame["kernel_name"] == "gemm_bf16"])
    assert "opt-in limit 232,448" in figure_spec(fig)


def test_footprint_spec_is_valid_plotly_on_make_subplots_axes():
    """The footprint chart is written as a plotly.js spec (one per kernel; plotly's own objects
    cost ~0.1 s each). plotly itself must accept every property, and its panels must sit where
    ``make_subplots`` would put them, the over-limit bar red and the limit line on panel 3."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    cfg = pd.DataFrame({"config_id": ["a", HOSTILE, "c"], "registers_per_thread": [64, 128, None],
                        "spill_stores_bytes": [0, None, 8], "spill_loads_bytes": [0, 0, 8],
                        "shared_mem_bytes": [1000, 240_000, None], "occupancy_pct": [50.0, None, 25.0],
                        "shared_mem_limit_bytes": 232448})
    spec = audit_report.memory_footprint_figure("k", cfg)
    go.Figure(spec)  # raises on any property plotly.js does not know or a value of the wrong type
    ref = make_subplots(rows=4, cols=1, shared_xaxes=True, vertical_spacing=0.05).to_plotly_json()["layout"]
    for axis in ("xaxis", "yaxis", "xaxis2", "yaxis2", "xaxis3", "yaxis3", "xaxis4", "yaxis4"):
        for key, value in ref[axis].items():
            expected = pytest.approx(value) if key == "domain" else value
            assert spec["layout"][axis][key] == expected, (axis, key)
    smem = spec["data"][3]
    assert smem["yaxis"] == "y3" and smem["marker"]["color"] == ["#8250df", "#cf222e", "#8250df"]
    assert [s["y0"] for s in spec["layout"]["shapes"] if s["yref"] == "y3"] == [232448]
    assert spec["data"][0]["y"] == [64.0, 128.0, None] and HOSTILE not in figure_spec(spec)


def test_trace_names_are_escaped_everywhere(tmp_path):
    inputs = library_inputs(tmp_path / "data", rename={"flash_attention_fwd": HOSTILE})
    diag = inputs.diagnostics.copy()
    diag.loc[diag.index[:3], "shape_name"] = HOSTILE_SHAPE
    inputs = audit_report.ReportInputs(**{**inputs.__dict__, "diagnostics": diag})
    files = write_report(inputs, tmp_path / "report")
    html = files.html.read_text()
    assert HOSTILE not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # shown as text, in tables and in plotly labels
    scripts = re.findall(r"<script[^>]*>", html)
    assert all(s == "<script>" or s.startswith(('<script type="application/json" id="spec-',
                                                 '<script type="application/octet-stream"')) for s in scripts)
    specs = re.findall(r'<script type="application/json"[^>]*>(.*?)</script>', html, re.S)
    assert specs and all("<" not in s and ">" not in s for s in specs)  # nothing can close the element
    labels = [json.loads(s) for s in specs if "alert(1)" in s]
    assert labels and all("&lt;script&gt;alert(1)" in json.dumps(spec) for spec in labels)  # plotly shows it as text
    markdown = files.markdown.read_text()
    assert HOSTILE not in markdown and "\\<script\\>alert(1)\\</script\\>" in markdown
    assert json.loads(files.json.read_text())["kernels"][0] == HOSTILE  # JSON keeps the data as data


def test_regressions_section_when_history_is_given(inputs, tmp_path):
    from dataclasses import asdict

    from kernaudit_pipeline.history import Confirmation, Regression, RegressionKind

    found = Regression(kernel_name="gemm_bf16", config_id="c", shape_name="s", device_name="NVIDIA H200",
                       kind=RegressionKind.SLOWER, reference_run_id="r0", latency_us=110.0,
                       reference_latency_us=100.0, delta_us=10.0, delta_pct=10.0, latency_ci_low_us=109.0,
                       latency_ci_high_us=111.0, reference_ci_low_us=99.0, reference_ci_high_us=101.0,
                       ci_separated=True, status="IMPROVED", reference_status="IMPROVED", speedup=0.91,
                       speedup_ci_low=0.9, speedup_ci_high=0.92, reference_speedup=1.0, reference_speedup_ci_low=0.99,
                       reference_speedup_ci_high=1.01, confirmation=Confirmation.CONFIRMED, remeasured_speedup=0.905,
                       remeasured_ci_low=0.9, remeasured_ci_high=0.91, confirmation_note="re-timed: still slower")
    regressions = pd.DataFrame([asdict(found)])  # what history.Comparison.frame() hands over
    files = write_report(audit_report.ReportInputs(**{**inputs.__dict__, "history": regressions}), tmp_path)
    html = files.html.read_text()
    assert "1 regressions against the accepted audit <code>r0</code>" in html and "1 confirmed by a re-measure" in html
    assert "0.905<span class=\"ci\">[0.900, 0.910]</span>" in html
    assert "| confirmed | slower | gemm\\_bf16 |" in files.markdown.read_text()
    assert (tmp_path / "regressions.csv").exists()


def test_context_lists_kernels_and_review_states_for_the_filters(inputs):
    ctx = build_context(inputs)
    assert ctx["kernels"] == sorted(set(inputs.diagnostics["kernel_name"]))
    assert ctx["review_states"] == ["PENDING_REVIEW"]
