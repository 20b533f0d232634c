"""The comparator dashboard in headless Chromium: every chart renders, offline, without errors."""

import json

import pytest

from kernaudit_pipeline.audit_report import write_report
from tests.browser.harness import PageLog, chromium
from tests.report.inputs import library_inputs

pytestmark = pytest.mark.browser
HOSTILE = "<script>alert(1)</script>"
RENDERED = "document.querySelectorAll('.js-plotly-plot .main-svg').length"


def open_report(page, path, charts: int) -> PageLog:
    log = PageLog().attach(page)
    page.goto(path.as_uri())
    page.wait_for_function(f"{RENDERED} >= {charts}", timeout=120_000)
    return log


def test_every_chart_renders_without_console_errors(audited):
    payload = json.loads((audited.report_dir / "report.json").read_text())
    charts = payload["charts"]
    assert {c["group"] for c in charts} == {"compare", "memory", "heatmap", "roofline"}
    with chromium() as page:
        log = open_report(page, audited.report_dir / "report.html", len(charts))
        for chart in charts:
            plot = page.locator(f"#{chart['chart_id']}")
            assert plot.locator(".main-svg").count() >= 1, chart["chart_id"]
            box = plot.bounding_box()
            assert box["width"] > 300 and box["height"] > 200, chart["chart_id"]
        # the heatmaps drew their cells and the roofline its points
        assert page.locator("#chart-roofline .scatterlayer .point").count() > 10
        assert page.locator("[id^=chart-heatmap] .hm").count() >= 1
        assert page.locator("#exports a").count() >= 6
    assert log.console_errors == [] and log.page_errors == []
    assert log.external_requests == []  # offline: plotly.js is inlined


def test_kernel_filter_hides_other_kernels_tables_and_charts(audited):
    payload = json.loads((audited.report_dir / "report.json").read_text())
    memory = [c for c in payload["charts"] if c["group"] == "memory"]
    kernel = "paged_decode_attention"
    with chromium() as page:
        log = open_report(page, audited.report_dir / "report.html", len(payload["charts"]))
        page.select_option("#f-kernel", kernel)
        visible_rows = page.locator("#best tr[data-kernel]:visible")
        assert visible_rows.count() > 0
        assert set(visible_rows.evaluate_all("rows => rows.map(r => r.dataset.kernel)")) == {kernel}
        for chart in memory:
            shown = page.locator(f"#sec-{chart['chart_id']}").is_visible()
            assert shown == (chart["kernel"] == kernel), chart["chart_id"]
        page.select_option("#f-status", "IMPROVED")
        statuses = page.locator("#best tr[data-kernel]:visible").evaluate_all("r => r.map(x => x.dataset.status)")
        assert set(statuses) <= {"IMPROVED"}
        page.select_option("#f-kernel", "")
        page.select_option("#f-status", "")
        assert page.locator("#best tr[data-kernel]:visible").count() == len(payload["best"])
    assert log.console_errors == [] and log.page_errors == []


def test_a_hostile_kernel_name_is_shown_never_run(tmp_path):
    inputs = library_inputs(tmp_path / "data", rename={"paged_decode_attention": HOSTILE})
    files = write_report(inputs, tmp_path / "report")
    charts = len(json.loads(files.json.read_text())["charts"])
    with chromium() as page:
        log = open_report(page, files.html, charts)
        page.locator("#chart-candidate-vs-baseline").hover()
        scripts = page.evaluate("Array.from(document.scripts).map(s => s.textContent.includes('alert(1)') "
                                "&& !s.textContent.includes('Plotly.newPlot'))")
        assert not any(scripts)  # no script element carries the name except as chart data
        assert page.locator("#best td", has_text=HOSTILE).count() > 0  # displayed as text
        assert page.locator(f"#f-kernel option[value='{HOSTILE}']").count() == 1
        labels = page.locator("#chart-status .xtick text").all_text_contents()
        assert HOSTILE in labels  # plotly shows it literally
    assert log.dialogs == [] and log.page_errors == [] and log.console_errors == []
