"""The code location: ``dagster dev -w workspace.yaml`` loads ``defs`` from here."""

from __future__ import annotations

import warnings

from dagster import AssetSelection, BetaWarning, Definitions, define_asset_job

with warnings.catch_warnings():
    warnings.simplefilter("ignore", BetaWarning)
    from dagster_mlflow import end_mlflow_on_run_finished

from kernaudit_pipeline.defs import assets, checks
from kernaudit_pipeline.defs.resources import AuditSettings, mlflow_resource

ALL_ASSETS = [assets.kernel_sources, assets.static_resources, assets.raw_traces, assets.kernel_runs,
              assets.comparisons, assets.spill_diagnostics, assets.recommendations, assets.audit_report]
ALL_CHECKS = [checks.kernel_runs_schema, checks.rows_accounted_for]

audit_job = define_asset_job("audit_job", selection=AssetSelection.all(), hooks={end_mlflow_on_run_finished},
                             description="The full audit: every asset, every check.")


def build_definitions(settings: AuditSettings | None = None) -> Definitions:
    return Definitions(
        assets=ALL_ASSETS,
        asset_checks=ALL_CHECKS,
        jobs=[audit_job],
        resources={"settings": settings or AuditSettings(), "mlflow": mlflow_resource()},
    )


defs = build_definitions()
