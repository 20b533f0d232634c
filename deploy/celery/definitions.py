"""The kernaudit code location for several GPU hosts behind one Dagster, on Celery.

Every GPU host gets its own Celery queue ``gpu-<host>``; its runner steps (one
per device, each pinned with CUDA_VISIBLE_DEVICES and in its own one-slot
pool ``gpu-<host>-<device>``) carry the tag ``dagster-celery/queue`` for that
queue, so only that host's worker takes them. Every other step goes to the
default queue ``dagster`` (any CPU worker). The hosts and their devices come
from ``KERNAUDIT_GPU_HOSTS`` (``hosta=0,1,2,3;hostb=0,1``), which must be the
same wherever this file is loaded (webserver, daemon, run workers, Celery
workers). Broker and result backend come from the environment.
"""

import os

from dagster_celery import celery_executor

from kernaudit_pipeline.defs.definitions import build_definitions
from kernaudit_pipeline.gpu_devices import GpuDevice, declared_devices

QUEUE_TAG = "dagster-celery/queue"


def queue_for(device: GpuDevice | None) -> str | None:
    return f"gpu-{device.host}" if device is not None and device.host else None


def step_tags(device: GpuDevice | None) -> dict[str, str]:
    queue = queue_for(device)
    return {QUEUE_TAG: queue} if queue else {}


executor = celery_executor.configured({
    "broker": {"env": "KERNAUDIT_CELERY_BROKER"},
    "backend": {"env": "KERNAUDIT_CELERY_BACKEND"},
})

# MLflow on its server (deploy/postgres/mlflow-server.sh); create the experiment there once with
# `mlflow experiments create -n kernaudit` so its artifacts go where the server keeps them.
defs = build_definitions(devices=declared_devices(), executor=executor, step_tags=step_tags,
                         mlflow_tracking_uri=os.environ.get("MLFLOW_TRACKING_URI"))
