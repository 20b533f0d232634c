"""MLflow logging for one audit: a parent run, one nested run per (kernel, shape, device) decision.

The parent run is the one dagster-mlflow opened for the Dagster run (tagged
with ``dagster_run_id``); it holds the audit's counts and the whole report. Each
child run is one decision: its verdict and data kind as tags, the chosen config
as params, the paired speedup with its CI, latency, registers, spills, shared
memory, occupancy and stall shares as metrics, and the kernel's own artifacts
(the decision record, its rows, the kernel module's source). Nothing here ever
logs an API key: params are built from an allow-list of columns, never from
the environment.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import mlflow
import pandas as pd

from kernaudit_pipeline.audit_report import ReportFiles, ReportInputs, best_per_group
from kernaudit_pipeline.audit_report.formatting import jsonable
from kernaudit_pipeline.core.values import finite_float

PARAM_COLUMNS = ("config_id", "block_m", "block_n", "block_k", "group_m", "num_warps", "num_stages",
                 "device_name", "compute_capability", "triton_version", "torch_version", "dtype", "baseline_name")
METRIC_COLUMNS = ("latency_us", "latency_ci_low_us", "latency_ci_high_us", "baseline_us", "speedup",
                  "speedup_ci_low", "speedup_ci_high", "registers_per_thread", "spill_stores_bytes",
                  "spill_loads_bytes", "stack_frame_bytes", "shared_mem_bytes", "occupancy_pct", "achieved_tflops",
                  "local_memory_bytes", "stall_lg_throttle_pct", "stall_long_scoreboard_pct")
DECISION_METRICS = ("speedup", "speedup_ci_low", "speedup_ci_high")
UI_URL_ENV = "KERNAUDIT_MLFLOW_UI_URL"
DEFAULT_UI_URL = "http://127.0.0.1:5000"
GROUP = ["kernel_name", "shape_name", "device_name"]


def run_url(run_id: str, experiment_id: str | None = None, base_url: str | None = None) -> str:
    """The run's page in ``mlflow ui`` (``KERNAUDIT_MLFLOW_UI_URL``, default the local UI)."""
    base = (base_url or os.environ.get(UI_URL_ENV) or DEFAULT_UI_URL).rstrip("/")
    if experiment_id is None:
        experiment_id = mlflow.get_run(run_id).info.experiment_id
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}"


def _key(text: str) -> str:
    """A valid MLflow param or metric key."""
    return re.sub(r"[^A-Za-z0-9_\-./ ]", "_", text)[:250]


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


@dataclass(frozen=True)
class ChildRun:
    """What one (kernel, shape, device) child run logs."""

    name: str
    tags: dict[str, str]
    params: dict[str, str]
    metrics: dict[str, float]
    decision: dict | None
    rows: pd.DataFrame


def _same(frame: pd.DataFrame, column: str, value: object) -> pd.Series:
    if column not in frame:
        return pd.Series(value is None, index=frame.index)
    if value is None:
        return frame[column].isna()
    return frame[column].astype(str) == str(value)


def child_runs(inputs: ReportInputs) -> list[ChildRun]:
    """One child per decision; without decisions, one per fastest correct config of a group."""
    diag = inputs.diagnostics
    decisions = [jsonable(d) for d in inputs.decisions]
    if not decisions and len(diag):
        best = best_per_group(diag)
        decisions = [None] * len(best)
        keyed = list(best.iterrows())
    else:
        keyed = [(None, None)] * len(decisions)
    several_devices = len({d.get("device_name") for d in decisions if d}) > 1 or (
        "device_name" in diag and diag["device_name"].nunique() > 1)
    out = []
    for decision, (_, best_row) in zip(decisions, keyed):
        key = {k: (decision or {}).get(k) if decision else best_row.get(k) for k in GROUP}
        for k, v in key.items():
            if v is not None and not isinstance(v, str) and pd.isna(v):
                key[k] = None
        rows = diag
        for k in GROUP:
            rows = rows[_same(rows, k, key[k])]
        config_id = decision.get("config_id") if decision else best_row.get("config_id")
        chosen = rows[_same(rows, "config_id", config_id)] if config_id else rows.iloc[0:0]
        row = chosen.iloc[0] if len(chosen) else (best_row if best_row is not None else None)
        metrics = {}
        if row is not None:
            metrics = {c: finite_float(row.get(c)) for c in METRIC_COLUMNS if c in row}
        if decision:
            metrics.update({c: finite_float(decision.get(c)) for c in DECISION_METRICS})
            for ref in decision.get("baselines") or []:
                value = finite_float(ref.get("speedup"))
                if value is not None and ref.get("name"):
                    metrics[_key(f"speedup_vs.{ref['name']}")] = value
        metrics["configs_judged"] = float(len(rows))
        params = {}
        if row is not None:
            params = {c: str(row.get(c)) for c in PARAM_COLUMNS if c in row and pd.notna(row.get(c))}
        if decision:
            params.update({k: str(v) for k, v in (decision.get("config") or {}).items()})
            for k in ("config_id", "baseline_name", "baseline_backend"):
                if decision.get(k):
                    params[k] = str(decision[k])
        tags = {k: str(v) for k, v in key.items() if v is not None}
        if decision:
            tags.update({"decision": str(decision.get("decision")), "data_kind": str(decision.get("data_kind"))})
        elif row is not None:
            tags["status"] = str(row.get("status"))
        name = " · ".join(str(v) for v in (key["kernel_name"], key["shape_name"],
                                           key["device_name"] if several_devices else None) if v)
        out.append(ChildRun(name=name or "unnamed", tags=tags,
                            params={_key(k): v[:500] for k, v in params.items()},
                            metrics={_key(k): v for k, v in metrics.items() if v is not None},
                            decision=decision, rows=rows))
    return out


def kernel_source_files() -> dict[str, Path]:
    """kernel name -> its module in kernels/ (for the child runs' artifacts)."""
    from kernaudit_pipeline import kernel_sources
    from kernaudit_pipeline.kernel_spec import KERNELS_DIR

    return {s.kernel_name: KERNELS_DIR.parent / s.path for s in kernel_sources.observe()}


def log_audit(tracker, inputs: ReportInputs, files: ReportFiles) -> str:
    """Log params, metrics, nested per-decision runs and the report; returns the parent run id."""
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
               "recommendations": len(inputs.recommendations), "decisions": len(inputs.decisions)}
    metrics.update({f"status_{k.lower()}": v for k, v in status_counts.items()})
    decided = pd.Series([str(jsonable(d).get("decision")) for d in inputs.decisions], dtype=object)
    metrics.update({f"decision_{k.lower()}": v for k, v in decided.value_counts().items()})
    mlflow.log_metrics({k: float(v) for k, v in metrics.items()})
    sources = kernel_source_files()
    with tempfile.TemporaryDirectory(prefix="kernaudit-mlflow-") as scratch:
        for i, child in enumerate(child_runs(inputs)):
            with mlflow.start_run(run_name=child.name, nested=True):
                mlflow.set_tags(child.tags)
                if child.params:
                    mlflow.log_params(child.params)
                if child.metrics:
                    mlflow.log_metrics(child.metrics)
                folder = Path(scratch) / str(i)
                folder.mkdir()
                if child.decision is not None:
                    (folder / "decision.json").write_text(json.dumps(child.decision, indent=2))
                child.rows.to_csv(folder / "runs.csv", index=False)
                source = sources.get(child.tags.get("kernel_name", ""))
                if source is not None and source.is_file():
                    (folder / source.name).write_bytes(source.read_bytes())
                mlflow.log_artifacts(str(folder), artifact_path="kernel")
    mlflow.log_artifacts(str(files.directory), artifact_path="report")
    return parent.info.run_id
