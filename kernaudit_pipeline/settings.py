"""Where kernaudit keeps its state: one data folder, nothing outside it.

``KERNAUDIT_DATA_DIR`` (default ``./data``) holds the Dagster home, the
MLflow SQLite store and artifacts, reports, the audit history, the static
compile cache and the review trail. Committed inputs live in ``samples/``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SAMPLES_DIR = PROJECT_ROOT / "samples"
SYNTHETIC_DIR = SAMPLES_DIR / "synthetic"
H200_SAMPLES_DIR = SAMPLES_DIR / "h200"
MLFLOW_EXPERIMENT = "kernaudit"


@dataclass(frozen=True)
class DataPaths:
    root: Path

    @property
    def dagster_home(self) -> Path:
        return self.root / "dagster_home"

    @property
    def mlflow_db(self) -> Path:
        return self.root / "mlflow.db"

    @property
    def mlflow_tracking_uri(self) -> str:
        return f"sqlite:///{self.mlflow_db}"

    @property
    def mlflow_artifacts(self) -> Path:
        return self.root / "mlartifacts"

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    @property
    def traces(self) -> Path:
        return self.root / "traces"

    @property
    def history_db(self) -> Path:
        return self.root / "history.duckdb"

    @property
    def static_cache(self) -> Path:
        return self.root / "static_cache"

    def ensure(self) -> "DataPaths":
        for path in (self.root, self.dagster_home, self.mlflow_artifacts, self.reports, self.traces):
            path.mkdir(parents=True, exist_ok=True)
        return self


def data_paths(root: str | Path | None = None) -> DataPaths:
    chosen = root or os.environ.get("KERNAUDIT_DATA_DIR") or (PROJECT_ROOT / "data")
    return DataPaths(Path(chosen).resolve())
