"""`dagster dev` and `mlflow server` on loopback, looked at by headless Chromium.

Each server gets a free port on 127.0.0.1, the audit's temporary DAGSTER_HOME or
MLflow store, a bounded start-up wait, and is killed (its whole process group)
at the end, pass or fail.
"""

import pytest
from dagster import AssetKey, DagsterInstance
from mlflow.tracking import MlflowClient

from kernaudit_pipeline.settings import MLFLOW_EXPERIMENT, data_paths
from tests.browser.harness import PageLog, chromium, dagster_dev, mlflow_ui

pytestmark = pytest.mark.browser
ASSETS = ["kernel_sources", "static_resources", "raw_traces", "kernel_runs", "quarantine", "comparisons",
          "spill_diagnostics", "recommendations", "audit_report", "audit_history"]


def dismiss_onboarding(page) -> None:
    """Dagster shows a one-off 'Join the community' dialog on a fresh instance."""
    skip = page.get_by_role("button", name="Skip")
    try:
        skip.wait_for(timeout=5_000)
    except Exception:  # noqa: BLE001 - not shown: nothing to dismiss
        return
    skip.click()


def expand_asset_graph(page) -> None:
    page.locator("[class*=collapsedGroupNodeContainer]").first.wait_for(timeout=120_000)
    dismiss_onboarding(page)
    page.keyboard.press("Alt+e")  # "Expand all groups" in the graph's settings menu
    page.locator("[class*=collapsedGroupNodeContainer]").first.wait_for(state="detached", timeout=30_000)


def test_dagster_dev_shows_the_asset_graph_and_the_completed_materialization(audited, tmp_path):
    with DagsterInstance.from_config(str(audited.dagster_home)) as instance:
        event = instance.get_latest_materialization_event(AssetKey("audit_report"))
    metadata = event.asset_materialization.metadata
    assert metadata["mlflow_run"].value.endswith(f"/runs/{metadata['mlflow_run_id'].value}")

    with dagster_dev(audited.data_dir, audited.dagster_home, tmp_path / "logs") as server:
        with chromium() as page:
            log = PageLog().attach(page, allowed_prefixes=(server.url, "data:", "blob:", "about:"))
            page.goto(server.url + "/asset-groups")
            expand_asset_graph(page)
            for name in ASSETS:
                page.get_by_text(name, exact=True).first.wait_for(timeout=30_000)

            page.goto(server.url + "/assets/audit_report")
            dismiss_onboarding(page)
            page.get_by_text("Latest materialization").first.wait_for(timeout=60_000)
            for key in ("mlflow_run", "quarantined", "top_regressions", "preview"):
                page.get_by_text(key, exact=True).first.wait_for(timeout=30_000)

            page.goto(server.url + "/runs")
            page.get_by_text(audited.run_id[:8]).first.wait_for(timeout=60_000)
            page.get_by_text("Success", exact=True).first.wait_for(timeout=30_000)  # the only run here
            page.get_by_text("audit_job", exact=True).first.wait_for(timeout=30_000)  # a named job, not __ASSET_JOB
            assert page.get_by_text("__ASSET_JOB").count() == 0

            page.goto(server.url + "/assets/audit_history?view=checks")
            page.get_by_text("no_new_regressions").first.wait_for(timeout=60_000)

            page.goto(server.url + "/assets/audit_report?view=checks")  # the report's own checks
            for check in ("decision_per_group", "counts_add_up", "self_contained"):
                page.get_by_text(check, exact=True).first.wait_for(state="attached", timeout=60_000)
    assert log.page_errors == [] and log.external_requests == []


def test_mlflow_ui_lists_the_audit_run_and_its_kernels(audited, tmp_path):
    paths = data_paths(audited.data_dir)
    client = MlflowClient(tracking_uri=paths.mlflow_tracking_uri)
    experiment = client.get_experiment_by_name(MLFLOW_EXPERIMENT)
    [parent] = client.search_runs([experiment.experiment_id],
                                  filter_string=f"tags.dagster_run_id = '{audited.run_id}'")
    nested = client.search_runs([experiment.experiment_id],
                                filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    children = sorted(r.info.run_name for r in nested)  # one per (kernel, shape): "gemm_bf16 · <shape>"
    assert children and any("occupancy_pct" in r.data.metrics for r in nested)
    assert parent.info.run_name == "audit_job"
    assert all(r.data.tags.get("decision") and r.data.tags.get("data_kind") for r in nested)

    with mlflow_ui(paths.mlflow_tracking_uri, paths.mlflow_artifacts, tmp_path / "logs") as server:
        with chromium() as page:
            log = PageLog().attach(page, allowed_prefixes=(server.url, "data:", "blob:", "about:"))
            page.goto(f"{server.url}/#/experiments/{experiment.experiment_id}/runs?workflowType=machine_learning")
            page.get_by_text(parent.info.run_name, exact=True).first.wait_for(timeout=90_000)
            page.get_by_text(f"{1 + len(nested)} matching runs").first.wait_for(timeout=30_000)

            page.goto(f"{server.url}/#/experiments/{experiment.experiment_id}/runs/{parent.info.run_id}")
            page.get_by_text(parent.info.run_id).first.wait_for(timeout=60_000)
            # the run page lists its child runs (the first ten, then "Load more"), by (kernel, shape) name
            page.get_by_role("link", name=" · ").first.wait_for(timeout=30_000)
            shown = [name for name in page.get_by_role("link").all_inner_texts() if " · " in name]
            assert len(shown) >= min(10, len(children)) and set(shown) <= set(children)
            page.get_by_text("quarantined", exact=True).first.wait_for(timeout=30_000)  # a metric
    assert log.page_errors == [] and log.external_requests == []
