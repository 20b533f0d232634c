"""The code location: ``dagster dev -w workspace.yaml`` loads ``defs`` from here.

Loading runs no subprocess: the GPU listing read here is the environment's
(``gpu_devices.declared_devices``); without one, the runner step lists the host's
GPUs when a run starts.
"""

from __future__ import annotations

import warnings

from dagster import AssetSelection, BetaWarning, Definitions, ExecutorDefinition, define_asset_job

with warnings.catch_warnings():
    warnings.simplefilter("ignore", BetaWarning)
    from dagster_mlflow import end_mlflow_on_run_finished

from kernaudit_pipeline import gpu_devices
from kernaudit_pipeline.defs import assets, audit_history, bench_steps, checks, ranking, schedules, sensors
from kernaudit_pipeline.defs.resources import AuditSettings, kernaudit_mlflow, mlflow_resource
from kernaudit_pipeline.settings import MLFLOW_EXPERIMENT

AUDIT_JOB = "audit_job"
ALL_CHECKS = [checks.kernel_runs_schema, checks.rows_accounted_for, *checks.REPORT_CHECKS,
              audit_history.no_new_regressions]

audit_job = define_asset_job(AUDIT_JOB, selection=AssetSelection.all(), hooks={end_mlflow_on_run_finished},
                             description="The full audit: every asset, every check. Launch it from "
                                         "Jobs → audit_job so the run (and its MLflow run) carry this name.")


def build_assets(devices: list[gpu_devices.GpuDevice] | None = None,
                 step_tags: bench_steps.StepTags | None = None) -> list:
    """The asset chain; ``raw_traces`` has one runner step per listed device.

    ``devices=None`` reads the environment's declaration (no subprocess); when that
    declares nothing, the single runner step finds the GPUs when the run starts.
    """
    raw_traces = assets.build_raw_traces(gpu_devices.declared_devices() if devices is None else devices, step_tags)
    return [assets.kernel_sources, assets.static_resources, raw_traces, assets.kernel_runs,
            assets.comparisons, assets.spill_diagnostics, assets.recommendations, assets.audit_report,
            audit_history.audit_history, ranking.predicted_ranking, ranking.predicted_vs_measured]


def build_definitions(settings: AuditSettings | None = None,
                      devices: list[gpu_devices.GpuDevice] | None = None,
                      executor: ExecutorDefinition | None = None,
                      step_tags: bench_steps.StepTags | None = None,
                      mlflow_tracking_uri: str | None = None) -> Definitions:
    """``executor``, ``step_tags``, ``mlflow_tracking_uri``: the multi-host variants in ``deploy/``
    (Celery, Kubernetes, an MLflow server); the defaults are the embedded single machine."""
    mlflow = mlflow_resource() if not mlflow_tracking_uri else kernaudit_mlflow.configured(
        {"experiment_name": MLFLOW_EXPERIMENT, "mlflow_tracking_uri": mlflow_tracking_uri})
    return Definitions(
        assets=build_assets(devices, step_tags),
        executor=executor,
        asset_checks=ALL_CHECKS,
        jobs=[audit_job],
        schedules=[schedules.build_nightly_schedule(AUDIT_JOB)],
        sensors=[sensors.build_kernel_sensor(AUDIT_JOB)],
        resources={"settings": settings or AuditSettings(), "mlflow": mlflow},
    )


defs = build_definitions()
