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
    """Open the page and wait until plotly.js is unpacked and every chart drawn."""
    log = PageLog().attach(page)
    page.goto(path.as_uri())
    page.wait_for_function("document.body.dataset.charts === 'drawn'", timeout=180_000)
    page.wait_for_function(f"{RENDERED} >= {charts}", timeout=60_000)
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
        scripts = page.evaluate("Array.from(document.scripts).filter(s => s.textContent.includes('alert(1)'))"
                                ".map(s => s.type)")
        assert set(scripts) <= {"application/json"}  # only chart data (inert JSON) carries the name
        assert page.locator("#best td", has_text=HOSTILE).count() > 0  # displayed as text
        assert page.locator(f"#f-kernel option[value='{HOSTILE}']").count() == 1
        labels = page.locator("#chart-status .xtick text").all_text_contents()
        assert HOSTILE in labels  # plotly shows it literally
    assert log.dialogs == [] and log.page_errors == [] and log.console_errors == []


# --- the reader's questions at 1,440 px: decisions first, no sideways scroll, sorting, paging, filters ---------

@pytest.fixture(scope="module")
def decided(tmp_path_factory):
    """The report of the committed traces with Decision records as the recommendations stage hands them over."""
    import dataclasses

    from tests.report.inputs import constructed_decisions

    base = library_inputs(tmp_path_factory.mktemp("data"))
    inputs = dataclasses.replace(base, decisions=constructed_decisions(base.diagnostics))
    files = write_report(inputs, tmp_path_factory.mktemp("report"))
    return inputs, files, json.loads(files.json.read_text())


def test_decisions_come_first_and_nothing_is_wider_than_the_window(decided):
    inputs, files, payload = decided
    with chromium({"width": 1440, "height": 900}) as page:
        log = open_report(page, files.html, len(payload["charts"]))
        width = page.evaluate("window.innerWidth")
        assert page.evaluate("document.documentElement.scrollWidth") <= width  # no sideways page scroll
        too_wide = page.evaluate("""(w) => Array.from(document.querySelectorAll('main > *, table, section.chart'))
            .filter(e => e.getBoundingClientRect().right > w + 0.5).map(e => e.id || e.tagName)""", width)
        assert too_wide == []
        decisions_top = page.locator("#decisions").bounding_box()["y"]
        first_chart_top = page.locator("section.chart").first.bounding_box()["y"]
        assert decisions_top < first_chart_top
        rows = page.locator("#decisions-table tbody tr")
        assert rows.count() == len(payload["decisions"])
        ship = next(d for d in payload["decisions"] if d["decision"] == "SHIP_CONFIG" and d["speedup_ci_low"])
        row = page.locator("#decisions-table tbody tr", has_text=ship["shape_name"]).filter(has_text="SHIP_CONFIG").first
        assert f"[{ship['speedup_ci_low']:.3f}, {ship['speedup_ci_high']:.3f}]" in row.inner_text()
        assert "cuBLAS via torch.matmul" in page.locator("#decisions-table").inner_text() or \
            "via" in page.locator("#decisions-table").inner_text()
        # the spill -> stall evidence is on the page, not only in diagnostics.csv
        assert page.locator("#spill-chain .chain").count() == payload["counts"]["spilling_profiled"] > 0
        assert "lg_throttle" in page.locator("#spill-chain").inner_text()
    assert log.console_errors == [] and log.page_errors == [] and log.external_requests == []


def test_jump_links_land_below_the_sticky_bar(decided):
    _, files, payload = decided
    with chromium() as page:
        open_report(page, files.html, len(payload["charts"]))
        bar = page.locator("#bar").bounding_box()
        for anchor in ("spills", "recs", "decisions", "sec-roofline"):
            page.locator(f"#bar a[href='#{anchor}']").click()
            page.wait_for_timeout(300)
            top = page.evaluate(f"document.getElementById('{anchor}').getBoundingClientRect().top")
            assert top >= bar["height"] - 1, anchor


def _column(page, table: str, index: int) -> list[str]:
    return page.locator(f"#{table} tbody tr:visible").evaluate_all(
        f"rows => rows.map(r => r.cells[{index}].dataset.v ?? r.cells[{index}].textContent.trim())")


def test_tables_sort_by_any_column(decided):
    _, files, payload = decided
    with chromium() as page:
        open_report(page, files.html, len(payload["charts"]))
        header = page.locator("#decisions-table thead th", has_text="speedup")
        header.click()
        values = [float(v) for v in _column(page, "decisions-table", 5) if v != ""]
        assert values == sorted(values) and header.get_attribute("aria-sort") == "ascending"
        header.click()
        values = [float(v) for v in _column(page, "decisions-table", 5) if v != ""]
        assert values == sorted(values, reverse=True) and header.get_attribute("aria-sort") == "descending"
        page.locator("#spills-table thead th", has_text="lg_throttle").first.click()
        page.locator("#spills-table thead th", has_text="lg_throttle").first.click()  # descending: worst first
        stalls = _column(page, "spills-table", 7)
        numbers = [float(v) for v in stalls if v != ""]
        assert numbers and numbers == sorted(numbers, reverse=True)
        assert all(v != "" for v in stalls[:len(numbers)])  # unprofiled (blank) rows last, whichever way
        page.locator("#best thead th", has_text="kernel").first.click()
        kernels = [v.lower() for v in _column(page, "best", 0)]
        assert kernels == sorted(kernels)


def test_the_spills_table_pages_and_says_n_of_m(decided):
    _, files, payload = decided
    total = len(payload["spills"])
    assert total > 50  # the committed traces spill in more configs than one page holds
    with chromium() as page:
        open_report(page, files.html, len(payload["charts"]))
        foot = page.locator("#spills-table-foot .count")
        assert foot.inner_text() == f"showing 1–50 of {total} spilling configs"
        assert page.locator("#spills-table tbody tr:visible").count() == 50
        page.locator("#spills-table-foot [data-act=next]").click()
        assert foot.inner_text() == f"showing 51–{min(100, total)} of {total} spilling configs"
        page.locator("#spills-table-foot [data-act=all]").click()
        assert foot.inner_text() == f"all {total} spilling configs"
        assert page.locator("#spills-table tbody tr:visible").count() == total
        page.locator("#spills-table-foot [data-act=all]").click()  # back to pages
        kernel = "gemm_bf16"
        page.select_option("#f-kernel", kernel)
        mine = sum(1 for r in payload["spills"] if r["kernel_name"] == kernel)
        shown = min(50, mine)
        assert foot.inner_text() == f"showing 1–{shown} of {mine} spilling configs (filtered from {total})"
        recs = page.locator("#recs-table-foot .count").inner_text()
        assert recs.startswith("showing 1–") and f"(filtered from {len(payload['recommendations'])})" in recs


def test_filters_act_on_every_table_and_chart_they_name(decided):
    _, files, payload = decided
    kernel = "paged_decode_attention"
    with chromium() as page:
        log = open_report(page, files.html, len(payload["charts"]))
        page.select_option("#f-kernel", kernel)
        for table in ("decisions-table", "best", "spills-table", "recs-table"):
            kernels = page.locator(f"#{table} tbody tr:visible").evaluate_all("rs => rs.map(r => r.dataset.kernel)")
            assert kernels and set(kernels) == {kernel}, table
        for chart in payload["charts"]:
            section = page.locator(f"#sec-{chart['chart_id']}")
            if chart["kernel"] is not None:  # per-kernel charts hide
                assert section.is_visible() == (chart["kernel"] == kernel), chart["chart_id"]
        # shared charts hide the other kernels' traces
        visible = page.evaluate("""() => document.getElementById('chart-roofline').data
            .filter(t => t.meta && t.meta.kernel).map(t => [t.meta.kernel, t.visible !== false])""")
        assert visible and all(shown == (k == kernel) for k, shown in visible)
        page.select_option("#f-kernel", "")
        page.select_option("#f-status", "IMPROVED")
        statuses = page.locator("#best tbody tr:visible").evaluate_all("rs => rs.map(r => r.dataset.status)")
        assert set(statuses) <= {"IMPROVED"}
        traces = page.evaluate("""() => document.getElementById('chart-speedups').data
            .map(t => [t.meta.status, t.visible !== false])""")
        assert all(shown == (s == "IMPROVED") for s, shown in traces)
        page.select_option("#f-status", "")
        page.select_option("#f-decision", "SHIP_CONFIG")
        decisions = page.locator("#decisions-table tbody tr:visible").evaluate_all("rs => rs.map(r => r.dataset.decision)")
        assert decisions and set(decisions) == {"SHIP_CONFIG"}
        page.click("#f-reset")
        assert page.locator("#decisions-table tbody tr:visible").count() == len(payload["decisions"])
        page.fill("#f-text", "BK64_BM128_BN256_GM8_s3_w4")
        assert page.locator("#spills-table tbody tr:visible").count() >= 1
        assert "filtered from" in page.locator("#spills-table-foot .count").inner_text()
    assert log.console_errors == [] and log.page_errors == []
