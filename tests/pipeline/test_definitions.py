"""The code location loads the way `dagster dev -w workspace.yaml` loads it."""

import subprocess
import sys
from pathlib import Path

import yaml

from kernaudit_pipeline.defs.definitions import defs

ROOT = Path(__file__).resolve().parents[2]
CHAIN = ["kernel_sources", "static_resources", "raw_traces", "kernel_runs", "quarantine", "comparisons",
         "spill_diagnostics", "recommendations", "audit_report"]


def test_definitions_load_with_the_whole_chain():
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert set(CHAIN) <= keys
    job = defs.resolve_job_def("audit_job")
    assert job is not None
    checks = {k.name for k in graph.asset_check_keys}
    assert {"kernel_runs_schema", "rows_accounted_for"} <= checks


def test_lineage_matches_design():
    graph = defs.resolve_asset_graph()
    from dagster import AssetKey

    def parents(name):
        return {k.to_user_string() for k in graph.get(AssetKey(name)).parent_keys}

    assert parents("static_resources") == {"kernel_sources"}
    assert parents("kernel_runs") == {"raw_traces"}
    assert "kernel_runs" in parents("comparisons") and "static_resources" in parents("comparisons")
    assert parents("spill_diagnostics") == {"comparisons", "raw_traces"}  # raw_traces: measured peaks
    assert parents("recommendations") >= {"spill_diagnostics"}
    assert "recommendations" in parents("audit_report")


def test_raw_traces_is_gpu_pooled():
    from dagster import AssetKey

    node = defs.resolve_asset_graph().get(AssetKey("raw_traces"))
    assert node.pools == {"gpu"}


def test_workspace_yaml_points_at_these_definitions():
    spec = yaml.safe_load((ROOT / "workspace.yaml").read_text())
    module = spec["load_from"][0]["python_module"]
    assert module["module_name"] == "kernaudit_pipeline.defs.definitions" and module["attribute"] == "defs"
    # the same load the UI does, in a fresh interpreter
    proc = subprocess.run([sys.executable, "-c", f"import {module['module_name']} as m; print(type(m.defs).__name__)"],
                          capture_output=True, text=True, cwd=ROOT, check=True)
    assert proc.stdout.strip() == "Definitions"
