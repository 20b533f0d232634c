"""The whole asset graph, materialized in-process on the embedded default.

Real Dagster instance (SQLite under a temporary DAGSTER_HOME), real MLflow
(SQLite store in the temporary data folder), real static compiles (two
configs of one kernel, to keep CI short), real committed traces.
"""

import json

import mlflow
import pytest
from dagster import AssetKey, DagsterInstance
from mlflow.tracking import MlflowClient

from kernaudit_pipeline.audit import run_audit
from kernaudit_pipeline.settings import MLFLOW_EXPERIMENT, data_paths

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    """One audit for the whole module: it is the slow part."""
    root = tmp_path_factory.mktemp("audit") / "data"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KERNAUDIT_DATA_DIR", str(root))
        mp.setenv("DAGSTER_HOME", str(root / "dagster_home"))
        mp.delenv("ANTHROPIC_API_KEY", raising=False)
        result, report_dir = run_audit({"static_kernels": ["gemm"], "static_max_configs": 2,
                                        "verify_max_compiles": 4}, quiet=True)
        yield result, report_dir, root


def test_graph_materializes_and_report_says_what_it_used(audited):
    result, report_dir, data_dir = audited
    assert result.success
    md = (report_dir / "report.md").read_text()
    assert "no GPU here" in md and "synthetic" in md
    assert md.index("## Decisions") < md.index("## Spills → stalls") < md.index("## Recommendations")
    assert "config per kernel and shape" in md
    assert "flash_attention_fwd".replace("_", "\\_") in md
    payload = json.loads((report_dir / "report.json").read_text())
    counts = payload["counts"]
    assert counts["runs"] > 0 and counts["quarantined"] >= 3  # the injected synthetic faults
    assert counts["spilling"] > 0
    # the statuses in the JSON match the per-row CSV
    import pandas as pd

    diag = pd.read_csv(report_dir / "diagnostics.csv")
    assert diag["status"].value_counts().to_dict() == payload["status_counts"]
    html = (report_dir / "report.html").read_text()
    assert "<script>" in html and "Plotly" in html and "cdn." not in html.split("</script>", 1)[1]


def result_dir(result, data_dir):
    return data_paths(data_dir).reports / result.run_id


def test_every_asset_and_check_recorded_in_the_instance(audited):
    result, _, data_dir = audited
    with DagsterInstance.from_config(str(data_dir / "dagster_home")) as instance:
        for name in ("kernel_sources", "static_resources", "raw_traces", "kernel_runs", "quarantine",
                     "comparisons", "spill_diagnostics", "recommendations", "audit_report"):
            assert instance.get_latest_materialization_event(AssetKey(name)) is not None, name
    checks = {e.asset_check_evaluation_data.check_name: e.asset_check_evaluation_data.passed
              for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"}
    payload = json.loads((result_dir(result, data_dir) / "report.json").read_text())
    assert checks == {"kernel_runs_schema": True, "rows_accounted_for": True, "no_new_regressions": True,
                      "counts_add_up": True, "self_contained": True,
                      "decision_per_group": True}
    assert payload["decisions"] and all(d["data_kind"] for d in payload["decisions"])


def test_mlflow_run_holds_metrics_and_the_report(audited):
    result, _, data_dir = audited
    paths = data_paths(data_dir)
    client = MlflowClient(tracking_uri=paths.mlflow_tracking_uri)
    experiment = client.get_experiment_by_name(MLFLOW_EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.dagster_run_id = '{result.run_id}'")
    assert len(runs) == 1
    parent = runs[0]
    assert parent.data.metrics["runs"] > 0 and "quarantined" in parent.data.metrics
    assert parent.info.status == "FINISHED"
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/report.html", "report/report.md", "report/report.json"} <= artifacts
    assert str(paths.mlflow_artifacts) in parent.info.artifact_uri  # artifacts stay in the data folder
    nested = client.search_runs([experiment.experiment_id],
                                filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert {r.data.tags["kernel_name"] for r in nested} >= {"flash_attention_fwd", "paged_decode_attention"}
    # one child per (kernel, shape): named so, with the paired speedup and its CI, and the kernel's files
    assert all(r.info.run_name.startswith(r.data.tags["kernel_name"] + " · ") for r in nested)
    assert len({(r.data.tags["kernel_name"], r.data.tags.get("shape_name")) for r in nested}) == len(nested)
    measured = [r for r in nested if "speedup_ci_low" in r.data.metrics]
    assert measured and all(r.data.metrics["speedup_ci_low"] <= r.data.metrics["speedup"]
                            <= r.data.metrics["speedup_ci_high"] for r in measured)
    gemm = next(r for r in nested if r.data.tags["kernel_name"] == "gemm_bf16")
    files = {a.path for a in client.list_artifacts(gemm.info.run_id, "kernel")}
    assert {"kernel/runs.csv", "kernel/gemm.py"} <= files
    mlflow.set_tracking_uri(None)
