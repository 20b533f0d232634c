"""MLflow logging for one audit: a parent run, one nested run per kernel.

The parent run is the one dagster-mlflow opened for the Dagster run (tagged
with ``dagster_run_id``). Nothing here ever logs an API key: params are built
from an allow-list of columns, never from the environment.
"""

from __future__ import annotations

import importlib.metadata
import math
import os
import re

import mlflow
import pandas as pd

from kernaudit_pipeline.audit_report import ReportFiles, ReportInputs, best_per_group

PARAM_COLUMNS = ("config_id", "block_m", "block_n", "block_k", "num_warps", "num_stages", "shape_name",
                 "device_name", "compute_capability", "triton_version", "torch_version", "dtype")
METRIC_COLUMNS = {
    "latency_us": "latency_us", "baseline_us": "baseline_us", "speedup": "speedup",
    "registers_per_thread": "registers_per_thread", "spill_stores_bytes": "spill_stores_bytes",
    "shared_mem_bytes": "shared_mem_bytes", "occupancy_pct": "occupancy_pct",
    "spill_loads_bytes": "spill_loads_bytes", "latency_ci_low_us": "latency_ci_low_us",
    "latency_ci_high_us": "latency_ci_high_us", "achieved_tflops": "achieved_tflops",
}
UI_URL_ENV = "KERNAUDIT_MLFLOW_UI_URL"
DEFAULT_UI_URL = "http://127.0.0.1:5000"


def run_url(run_id: str, experiment_id: str | None = None, base_url: str | None = None) -> str:
    """The run's page in ``mlflow ui`` (``KERNAUDIT_MLFLOW_UI_URL``, default the local UI)."""
    base = (base_url or os.environ.get(UI_URL_ENV) or DEFAULT_UI_URL).rstrip("/")
    if experiment_id is None:
        experiment_id = mlflow.get_run(run_id).info.experiment_id
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}"


def _metric_key(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_\-./ ]", "_", text)[:250]


def _finite(value: object) -> float | None:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def log_audit(tracker, inputs: ReportInputs, files: ReportFiles) -> str:
    """Log params, metrics, nested per-kernel runs and the report; returns the parent run id."""
    diag = inputs.diagnostics
    parent = mlflow.active_run()
    if parent is None:  # dagster-mlflow opens it; outside Dagster we open our own
        parent = mlflow.start_run(run_name="kernaudit-audit")
    status_counts = diag["status"].value_counts().to_dict() if len(diag) else {}
    tracker.log_params({
        "data_mode": inputs.mode_note[:480],
        "kernaudit_version": _version("kernaudit"),
        "triton_version_local": _version("triton"),
        "torch_version_local": _version("torch"),
        "devices": ",".join(sorted(diag["device_name"].dropna().astype(str).unique()))[:480] if len(diag) else "",
        "advisor": inputs.advisor_note[:480],
    })
    metrics = {"runs": len(inputs.kernel_runs), "quarantined": len(inputs.quarantine),
               "spilling_runs": int(diag["spill_detected"].sum()) if len(diag) else 0,
               "recommendations": len(inputs.recommendations)}
    metrics.update({f"status_{k.lower()}": v for k, v in status_counts.items()})
    mlflow.log_metrics({k: float(v) for k, v in metrics.items()})
    best = best_per_group(diag) if len(diag) else diag
    for kernel, group in best.groupby("kernel_name"):
        with mlflow.start_run(run_name=str(kernel), nested=True):
            mlflow.set_tag("kernel_name", str(kernel))
            for _, row in group.iterrows():
                shape = _metric_key(str(row.get("shape_name") or "shape"))
                params = {f"{shape}.{c}": str(row.get(c)) for c in PARAM_COLUMNS
                          if c in row and pd.notna(row.get(c))}
                mlflow.log_params({_metric_key(k): v[:500] for k, v in params.items()})
                for col, name in METRIC_COLUMNS.items():
                    value = _finite(row.get(col)) if col in row else None
                    if value is not None:
                        mlflow.log_metric(_metric_key(f"{shape}.{name}"), value)
    mlflow.log_artifacts(str(files.directory), artifact_path="report")
    return parent.info.run_id
