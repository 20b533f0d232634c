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


@resource(config_schema=CONFIG_SCHEMA)
def kernaudit_mlflow(init_context: InitResourceContext) -> MlFlow:
    """dagster-mlflow's run-per-Dagster-run resource, with the store pinned first."""
    config = init_context.resource_config
    paths = data_paths().ensure()
    ensure_experiment(config.get("mlflow_tracking_uri") or paths.mlflow_tracking_uri,
                      paths.mlflow_artifacts.as_uri(), config["experiment_name"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BetaWarning)
        return MlFlow(init_context)


def mlflow_resource(paths: DataPaths | None = None):
    paths = paths or data_paths()
    return kernaudit_mlflow.configured({
        "experiment_name": MLFLOW_EXPERIMENT,
        "mlflow_tracking_uri": paths.mlflow_tracking_uri,
    })
