"""Resources: audit settings and MLflow tracking through dagster-mlflow."""

from __future__ import annotations

import warnings

import mlflow
from dagster import BetaWarning, ConfigurableResource, InitResourceContext, resource
from dagster_mlflow.resources import CONFIG_SCHEMA, MlFlow

from kernaudit_pipeline.settings import MLFLOW_EXPERIMENT, DataPaths, data_paths


class AuditSettings(ConfigurableResource):
    """Knobs of one audit. Empty strings and lists mean "the default"."""

    data_dir: str = ""
    sources: list[str] = []
    include_synthetic: bool = True
    use_gpu: str = "auto"  # "auto" | "never"
    static_kernels: list[str] = []  # empty: every module in kernels/
    static_arch: str = "sm_90"
    static_max_configs: int = 0  # 0: the whole config space
    static_timeout_s: int = 300
    static_enabled: bool = True
    verify_max_compiles: int = -1  # recompiles allowed to verify recommendations; -1: all
    noise_band: float = 0.02
    advisor: str = "auto"  # "auto" (Claude when ANTHROPIC_API_KEY is set) | "off"

    def paths(self) -> DataPaths:
        return data_paths(self.data_dir or None).ensure()


def ensure_experiment(tracking_uri: str, artifact_root: str, name: str = MLFLOW_EXPERIMENT) -> str:
    """Create the experiment with its artifacts inside the data folder.

    dagster-mlflow calls ``mlflow.set_experiment``, which would put artifacts
    under the current directory; creating the experiment first pins them.
    """
    mlflow.set_tracking_uri(tracking_uri)
    existing = mlflow.get_experiment_by_name(name)
    if existing is not None:
        return existing.experiment_id
    return mlflow.create_experiment(name, artifact_location=artifact_root)


IMPLICIT_ASSET_JOB = "__ASSET_JOB"  # what Dagster names a run launched from the asset graph


def run_name(job_name: str, asset_keys: list[str] | None) -> str:
    """The MLflow run's name: the job's, or what a UI materialization selected (never ``__ASSET_JOB``)."""
    if not job_name.startswith(IMPLICIT_ASSET_JOB):
        return job_name
    keys = sorted(asset_keys or [])
    if not keys:
        return "materialized from the asset graph"
    shown = ", ".join(keys[:4]) + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")
    return f"materialized: {shown}"


@resource(config_schema=CONFIG_SCHEMA)
def kernaudit_mlflow(init_context: InitResourceContext) -> MlFlow:
    """dagster-mlflow's run-per-Dagster-run resource, with the store pinned first and a readable run name."""
    config = init_context.resource_config
    paths = data_paths().ensure()
    ensure_experiment(config.get("mlflow_tracking_uri") or paths.mlflow_tracking_uri,
                      paths.mlflow_artifacts.as_uri(), config["experiment_name"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BetaWarning)
        tracker = MlFlow(init_context)
    run = init_context.run
    if run is not None and mlflow.active_run() is not None:
        keys = [k.to_user_string() for k in (run.asset_selection or [])]
        mlflow.set_tags({"mlflow.runName": run_name(run.job_name, keys), "dagster_job": run.job_name})
    return tracker


def mlflow_resource(paths: DataPaths | None = None):
    paths = paths or data_paths()
    return kernaudit_mlflow.configured({
        "experiment_name": MLFLOW_EXPERIMENT,
        "mlflow_tracking_uri": paths.mlflow_tracking_uri,
    })
