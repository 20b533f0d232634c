"""kernaudit: a local auditor of Triton kernel latency and memory.

This package must stay importable on a GPU host that has only torch, triton,
numpy and the standard library, so nothing heavy is imported here.

The one thing done at import: MLflow (imported later by the tracking code) starts a usage
telemetry client when it is itself imported, which writes an installation id under
``~/.config/mlflow`` and sends events off the machine. A local auditor writes nothing outside
its data folder and sends nothing anywhere, so telemetry is off unless the user sets
``MLFLOW_DISABLE_TELEMETRY=false`` themselves. (Dagster's is off in ``dagster.yaml``.)
"""

import os

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

__version__ = "0.1.0"
