"""Regenerate the screenshots in docs/demo/: the comparator dashboard, the Dagster UI, the MLflow UI.

    .venv/bin/python scripts/screenshots.py [--data-dir DIR] [--out docs/demo]

With ``--data-dir`` it photographs an audit already in that data folder (its
``reports/latest``, its DAGSTER_HOME and MLflow store), as ``scripts/demo.sh``
leaves it; without, it first runs an audit into a temporary folder. It uses
Debian's chromium through Playwright (``scripts/browser_deps.sh``), starts
``dagster dev`` and ``mlflow server`` on free loopback ports, and stops them.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.browser.harness import CHROMIUM, PageLog, chromium, dagster_dev, mlflow_ui  # noqa: E402

VIEWPORT = {"width": 1440, "height": 900}
# the densest sweep of the samples (the synthetic flash-attention table), else the first heatmap
HEATMAP = ("section[id$=prefill-b4-h32-kv8-s4096-d128]", "section[id^=sec-chart-heatmap]")


def report_shots(report: Path, out: Path) -> list[Path]:
    shots = []
    with chromium(VIEWPORT) as page:
        log = PageLog().attach(page)
        page.goto(report.as_uri())
        page.wait_for_function("document.body.dataset.charts === 'drawn'", timeout=180_000)
        page.wait_for_timeout(1500)
        shots.append(out / "report-overview.png")  # the decisions, above every chart
        page.screenshot(path=shots[-1])
        # no sticky bar or table header over the element shots
        page.add_style_tag(content="#bar, th { position: static !important; }")
        for name, selector in (("report-decisions.png", "#decisions"),
                               ("report-spill-chain.png", "#spill-chain"),
                               ("report-candidate-vs-baseline.png", "#sec-chart-decided-speedups"),
                               ("report-memory-footprint.png", "section[id^=sec-chart-footprint]"),
                               ("report-latency-heatmap.png", HEATMAP),
                               ("report-roofline.png", "#sec-chart-roofline")):
            choices = selector if isinstance(selector, tuple) else (selector,)
            target = next((page.locator(c).first for c in choices if page.locator(c).count()), None)
            if target is not None:
                target.scroll_into_view_if_needed()
                shots.append(out / name)
                target.screenshot(path=shots[-1])
        for name, anchor in (("report-spills.png", "spills"), ("report-recommendations.png", "recs")):
            page.locator(f"#{anchor}").scroll_into_view_if_needed()
            page.evaluate(f"document.getElementById('{anchor}').scrollIntoView()")
            shots.append(out / name)
            page.screenshot(path=shots[-1])
    if log.console_errors or log.page_errors or log.external_requests:
        raise SystemExit(f"report page problems: {log}")
    return shots


def dagster_shots(data_dir: Path, out: Path, logs: Path) -> list[Path]:
    shots = []
    with dagster_dev(data_dir, data_dir / "dagster_home", logs) as server, chromium(VIEWPORT) as page:
        page.goto(server.url + "/asset-groups")
        page.locator("[class*=collapsedGroupNodeContainer]").first.wait_for(timeout=120_000)
        page.keyboard.press("Alt+e")  # expand all groups
        page.locator("[class*=collapsedGroupNodeContainer]").first.wait_for(state="detached", timeout=30_000)
        page.get_by_text("audit_report", exact=True).first.wait_for()
        page.wait_for_timeout(2500)
        shots.append(out / "dagster-asset-graph.png")
        page.screenshot(path=shots[-1])
        page.goto(server.url + "/assets/audit_report")
        page.get_by_text("Latest materialization").first.wait_for(timeout=60_000)
        page.get_by_text("mlflow_run", exact=True).first.wait_for(timeout=30_000)
        page.wait_for_timeout(1500)
        shots.append(out / "dagster-audit-report-materialization.png")
        page.screenshot(path=shots[-1])
        page.goto(server.url + "/assets/audit_report?view=checks")
        page.get_by_text("counts_add_up").first.wait_for(timeout=60_000)
        page.wait_for_timeout(1500)
        shots.append(out / "dagster-report-checks.png")
        page.screenshot(path=shots[-1])
        page.goto(server.url + "/assets/audit_history?view=checks")
        page.get_by_text("no_new_regressions").first.wait_for(timeout=60_000)
        page.wait_for_timeout(1500)
        shots.append(out / "dagster-history-check.png")
        page.screenshot(path=shots[-1])
        page.goto(server.url + "/runs")
        page.get_by_text("Success", exact=True).first.wait_for(timeout=60_000)
        page.get_by_text("audit_job", exact=True).first.wait_for(timeout=30_000)
        page.wait_for_timeout(1000)
        shots.append(out / "dagster-runs.png")
        page.screenshot(path=shots[-1])
    return shots


def mlflow_shots(data_dir: Path, out: Path, logs: Path) -> list[Path]:
    from mlflow.tracking import MlflowClient

    from kernaudit_pipeline.settings import MLFLOW_EXPERIMENT, data_paths

    paths = data_paths(data_dir)
    client = MlflowClient(tracking_uri=paths.mlflow_tracking_uri)
    experiment = client.get_experiment_by_name(MLFLOW_EXPERIMENT)
    parents = [r for r in client.search_runs([experiment.experiment_id], order_by=["attributes.start_time DESC"])
               if "mlflow.parentRunId" not in r.data.tags]
    parent = parents[0]
    shots = []
    with mlflow_ui(paths.mlflow_tracking_uri, paths.mlflow_artifacts, logs) as server, chromium(VIEWPORT) as page:
        page.goto(f"{server.url}/#/experiments/{experiment.experiment_id}/runs?workflowType=machine_learning")
        page.get_by_text(parent.info.run_name, exact=True).first.wait_for(timeout=90_000)
        close = page.get_by_label("Close")  # the assistant side panel, when shown
        if close.count():
            close.first.click()
        expand = page.locator("[data-testid=experiment-view-runs-table-row] button, .ag-row button").first
        if expand.count():
            expand.click()
        page.wait_for_timeout(2000)
        shots.append(out / "mlflow-runs.png")
        page.screenshot(path=shots[-1])
        page.goto(f"{server.url}/#/experiments/{experiment.experiment_id}/runs/{parent.info.run_id}")
        page.get_by_text(parent.info.run_id).first.wait_for(timeout=60_000)
        page.wait_for_timeout(2000)
        shots.append(out / "mlflow-audit-run.png")
        page.screenshot(path=shots[-1])
    return shots


def audit_into(data_dir: Path) -> None:
    import os

    os.environ["KERNAUDIT_DATA_DIR"] = str(data_dir)
    os.environ["DAGSTER_HOME"] = str(data_dir / "dagster_home")
    from kernaudit_pipeline.audit import run_audit

    result, _ = run_audit({"static_enabled": False}, quiet=True)
    if not result.success:
        raise SystemExit("the audit failed; see the Dagster logs")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, help="an audited data folder (default: audit into a temporary one)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "demo")
    args = parser.parse_args(argv)
    if not CHROMIUM.exists():
        print(f"screenshots: {CHROMIUM} is missing (bash scripts/browser_deps.sh)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kernaudit-shots-") as tmp:
        data_dir = args.data_dir.resolve() if args.data_dir else Path(tmp) / "data"
        if args.data_dir is None:
            audit_into(data_dir)
        report = data_dir / "reports" / "latest" / "report.html"
        if not report.exists():
            print(f"screenshots: no report at {report}", file=sys.stderr)
            return 2
        started = time.monotonic()
        shots = report_shots(report, args.out)
        shots += dagster_shots(data_dir, args.out, Path(tmp) / "logs")
        shots += mlflow_shots(data_dir, args.out, Path(tmp) / "logs")
    for shot in shots:
        print(f"wrote {shot.relative_to(ROOT) if shot.is_relative_to(ROOT) else shot}")
    print(f"{len(shots)} screenshots in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
