"""The kernaudit code location on Kubernetes: every step in its own pod.

``k8s_job_executor`` launches one pod per step. A runner step carries the tag
``dagster-k8s/config`` with a container limit of ``nvidia.com/gpu: 1`` (and a
toleration and node selector for the GPU nodes), so the scheduler puts it on a
GPU node and the NVIDIA device plugin gives the pod exactly one GPU; inside
the pod that GPU is device 0, hence ``CUDA_VISIBLE_DEVICES=0`` for every step.
``KERNAUDIT_GPU_K8S_STEPS`` (default 4) says how many GPU steps run side by
side; each is its own one-slot pool ``gpu-podN-0``, and Kubernetes queues the
pods when fewer GPUs are free. CPU steps (the static compile, the analysis)
get the CPU limits of ``step_k8s_config``.
"""

import os

from dagster_k8s import k8s_job_executor

from kernaudit_pipeline.defs.definitions import build_definitions
from kernaudit_pipeline.gpu_devices import GpuDevice

K8S_CONFIG_TAG = "dagster-k8s/config"
GPU_NODE_SELECTOR = {"nvidia.com/gpu.present": "true"}


def gpu_steps(environ: dict[str, str] | None = None) -> list[GpuDevice]:
    env = os.environ if environ is None else environ
    count = int(env.get("KERNAUDIT_GPU_K8S_STEPS", "4"))
    if count < 1:
        raise ValueError(f"KERNAUDIT_GPU_K8S_STEPS={count}: at least one GPU step")
    return [GpuDevice(visible_id="0", host=f"pod{i}") for i in range(count)]


def step_tags(device: GpuDevice | None) -> dict:
    if device is None:
        return {}
    return {K8S_CONFIG_TAG: {
        "container_config": {"resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "8", "memory": "32Gi"},
                                           "requests": {"nvidia.com/gpu": "1", "cpu": "4", "memory": "16Gi"}}},
        "pod_spec_config": {"node_selector": GPU_NODE_SELECTOR,
                            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
    }}


executor = k8s_job_executor.configured({
    "job_namespace": "kernaudit",
    "max_concurrent": 16,
    "step_k8s_config": {"container_config": {"resources": {"requests": {"cpu": "2", "memory": "8Gi"},
                                                           "limits": {"cpu": "4", "memory": "16Gi"}}}},
})

# MLflow on its server (deploy/postgres/mlflow-server.sh); create the experiment there once with
# `mlflow experiments create -n kernaudit` so its artifacts go where the server keeps them.
defs = build_definitions(devices=gpu_steps(), executor=executor, step_tags=step_tags,
                         mlflow_tracking_uri=os.environ.get("MLFLOW_TRACKING_URI"))
