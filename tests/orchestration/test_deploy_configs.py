"""Every configuration docs/scaling.md documents loads and validates, without a server.

PostgreSQL (Dagster and MLflow), Celery (one queue per GPU host) and Kubernetes
(`nvidia.com/gpu` per GPU step) are checked with the installed dagster-postgres,
dagster-celery and dagster-k8s, through the same loaders those deployments use.
"""

import importlib.util
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml
from dagster import AssetKey, validate_run_config
from dagster._config import process_config
from dagster._core.instance.config import dagster_instance_config

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PG_ENV = {"KERNAUDIT_PG_HOST": "db.internal", "KERNAUDIT_PG_PORT": "5432", "KERNAUDIT_PG_USER": "kernaudit",
          "KERNAUDIT_PG_PASSWORD": "s3cret", "KERNAUDIT_PG_DAGSTER_DB": "dagster"}


@pytest.fixture
def pg_env(monkeypatch):
    for key, value in PG_ENV.items():
        monkeypatch.setenv(key, value)


def load_module(path: Path):
    spec = importlib.util.spec_from_file_location(f"deploy_{path.parent.name}_{uuid.uuid4().hex}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def instance_config(tmp_path: Path, source: Path) -> dict:
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(source, home / "dagster.yaml")
    config, custom_class = dagster_instance_config(str(home))
    assert custom_class is None
    return config


@pytest.mark.parametrize("name", ["postgres/dagster.yaml", "k8s/dagster.yaml"])
def test_instance_yaml_validates_and_points_at_postgres(name, tmp_path, pg_env):
    from dagster_postgres.utils import pg_config, pg_url_from_config

    config = instance_config(tmp_path, DEPLOY / name)
    pg = process_config(pg_config(), config["storage"]["postgres"])  # the env values resolve here
    assert pg.success, pg.errors
    assert pg_url_from_config(pg.value) == "postgresql://kernaudit:s3cret@db.internal:5432/dagster"
    assert config["concurrency"]["pools"] == {"default_limit": 1, "granularity": "op"}
    assert config["run_monitoring"]["enabled"] and config["run_coordinator"]["class"] == "QueuedRunCoordinator"


def test_instance_yaml_needs_its_credentials_from_the_environment(tmp_path, monkeypatch):
    from dagster_postgres.utils import pg_config

    for key in PG_ENV:
        monkeypatch.delenv(key, raising=False)
    config = instance_config(tmp_path, DEPLOY / "postgres/dagster.yaml")
    result = process_config(pg_config(), config["storage"]["postgres"])
    assert not result.success and "KERNAUDIT_PG_" in str(result.errors)


def test_k8s_run_launcher_config_validates(tmp_path, pg_env):
    from dagster_k8s import K8sRunLauncher

    launcher = yaml.safe_load((DEPLOY / "k8s/dagster.yaml").read_text())["run_launcher"]
    assert (launcher["module"], launcher["class"]) == ("dagster_k8s", "K8sRunLauncher")
    result = process_config(K8sRunLauncher.config_type(), launcher["config"])
    assert result.success, result.errors
    assert result.value["job_namespace"] == "kernaudit"


def test_mlflow_server_script_builds_a_postgres_backend_uri(monkeypatch):
    import sqlalchemy
    from mlflow.utils.uri import extract_db_type_from_uri

    env = {"PATH": "/usr/bin:/bin", **PG_ENV}
    out = subprocess.run(["bash", str(DEPLOY / "postgres/mlflow-server.sh"), "--dry-run"], env=env,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[:2] == ["mlflow", "server"]
    uri = out[out.index("--backend-store-uri") + 1]
    assert extract_db_type_from_uri(uri) == "postgresql"
    url = sqlalchemy.engine.make_url(uri)
    assert (url.drivername, url.host, url.port, url.database) == ("postgresql+psycopg2", "db.internal", 5432, "mlflow")
    sqlalchemy.create_engine(uri)  # the dialect and psycopg2 load; nothing connects
    missing = subprocess.run(["bash", str(DEPLOY / "postgres/mlflow-server.sh"), "--dry-run"],
                             env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert missing.returncode != 0 and "KERNAUDIT_PG_HOST" in missing.stderr


def test_celery_one_queue_per_gpu_host(monkeypatch):
    monkeypatch.setenv("KERNAUDIT_GPU_HOSTS", "hosta=0,1;hostb=0")
    monkeypatch.setenv("KERNAUDIT_CELERY_BROKER", "pyamqp://guest@broker.internal//")
    monkeypatch.setenv("KERNAUDIT_CELERY_BACKEND", "rpc://")
    module = load_module(DEPLOY / "celery/definitions.py")
    defs = module.defs
    graph = defs.resolve_assets_def("raw_traces").node_def
    ops = {n.name: n.definition for n in graph.node_dict.values() if n.name != "merge_traces"}
    assert {name: (op.tags["dagster-celery/queue"], op.pool, op.tags["kernaudit/device"]) for name, op in ops.items()} == {
        "bench_gpu_hosta_0": ("gpu-hosta", "gpu-hosta-0", "0"),
        "bench_gpu_hosta_1": ("gpu-hosta", "gpu-hosta-1", "1"),
        "bench_gpu_hostb_0": ("gpu-hostb", "gpu-hostb-0", "0"),
    }
    cpu_step = defs.resolve_assets_def("static_resources").op
    assert "dagster-celery/queue" not in cpu_step.tags  # CPU work: the default queue
    job = defs.resolve_job_def("audit_job")
    assert job.executor_def.name == "celery"
    validate_run_config(job, {})  # the executor's broker/backend resolve from the environment
    assert defs.resolve_asset_graph().get(AssetKey("raw_traces")).pools == {"gpu-hosta-0", "gpu-hosta-1", "gpu-hostb-0"}


def test_celery_worker_yaml_is_what_dagster_celery_accepts(monkeypatch, tmp_path):
    from dagster_celery.cli import get_config_dir

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    monkeypatch.setenv("KERNAUDIT_CELERY_BROKER", "pyamqp://guest@broker.internal//")
    monkeypatch.setenv("KERNAUDIT_CELERY_BACKEND", "rpc://")
    # what `dagster-celery worker start -y worker.yaml` writes for celery to import
    module = Path(get_config_dir(str(DEPLOY / "celery/worker.yaml"))) / "dagster_celery_config.py"
    settings = {}
    exec(module.read_text(), settings)  # noqa: S102 - the generated celery config module
    assert settings["broker_url"] == "pyamqp://guest@broker.internal//" and settings["result_backend"] == "rpc://"
    assert settings["worker_prefetch_multiplier"] == 1 and settings["task_acks_late"] is True
    script = DEPLOY / "celery/start-worker.sh"
    assert '-q "gpu-${host}"' in script.read_text() and "-A dagster_celery.app" in script.read_text()
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


def test_k8s_gpu_steps_request_one_gpu_each(monkeypatch):
    from dagster_k8s.job import DagsterK8sJobConfig, construct_dagster_k8s_job, get_user_defined_k8s_config

    monkeypatch.setenv("KERNAUDIT_GPU_K8S_STEPS", "2")
    module = load_module(DEPLOY / "k8s/definitions.py")
    defs = module.defs
    job = defs.resolve_job_def("audit_job")
    assert job.executor_def.name == "k8s"
    validate_run_config(job, {})
    graph = defs.resolve_assets_def("raw_traces").node_def
    gpu_ops = [n.definition for n in graph.node_dict.values() if n.name != "merge_traces"]
    assert sorted(op.pool for op in gpu_ops) == ["gpu-pod0-0", "gpu-pod1-0"]
    for op in gpu_ops:
        user_config = get_user_defined_k8s_config(op.tags)
        assert user_config.container_config["resources"]["limits"]["nvidia.com/gpu"] == "1"
        k8s_job = construct_dagster_k8s_job(
            DagsterK8sJobConfig(job_image="registry.internal/kernaudit:cuda", dagster_home="/opt/dagster/home",
                                image_pull_policy="IfNotPresent"),
            args=["dagster", "api", "execute_step"], job_name=f"kernaudit-{op.name}".replace("_", "-"),
            user_defined_k8s_config=user_config)
        pod = k8s_job.spec.template.spec
        assert pod.containers[0].resources.limits["nvidia.com/gpu"] == "1"
        assert pod.node_selector == {"nvidia.com/gpu.present": "true"}
        assert pod.tolerations[0].key == "nvidia.com/gpu"
    cpu_op = defs.resolve_assets_def("static_resources").op
    assert "dagster-k8s/config" not in cpu_op.tags


def test_workspace_files_point_at_the_variant_definitions():
    for name in ("celery", "k8s"):
        spec = yaml.safe_load((DEPLOY / name / "workspace.yaml").read_text())["load_from"][0]["python_file"]
        assert (DEPLOY / name / spec["relative_path"]).exists()
        assert (DEPLOY / name / spec["working_directory"]).resolve() == ROOT
