"""The kernel-source sensor against a real Dagster instance and a temporary kernels/ folder."""

import json
import shutil

import pytest
from dagster import DagsterInstance, build_sensor_context, validate_run_config

from kernaudit_pipeline import kernel_sources
from kernaudit_pipeline.defs.definitions import audit_job, build_definitions
from kernaudit_pipeline.defs.sensors import build_kernel_sensor
from kernaudit_pipeline.kernel_spec import KERNELS_DIR


@pytest.fixture
def kernels(tmp_path):
    folder = tmp_path / "kernels"
    folder.mkdir()
    for name in ("gemm.py", "flash_attention.py", "paged_decode_attention.py"):
        shutil.copy(KERNELS_DIR / name, folder / name)
    return folder


@pytest.fixture
def instance():
    with DagsterInstance.ephemeral() as inst:
        yield inst


def tick(sensor, instance, cursor):
    with build_sensor_context(instance=instance, cursor=cursor) as context:
        result = sensor.evaluate_tick(context)
    return result


def test_first_tick_records_hashes_and_launches_nothing(kernels, instance):
    sensor = build_kernel_sensor(audit_job, kernels_dir=kernels)
    result = tick(sensor, instance, None)
    assert result.run_requests == []
    assert json.loads(result.cursor) == kernel_sources.hashes(kernels)
    assert "recorded the hashes of 3 kernels" in result.skip_message


def test_one_run_per_changed_kernel_none_for_unchanged(kernels, instance):
    sensor = build_kernel_sensor(audit_job, kernels_dir=kernels)
    cursor = tick(sensor, instance, None).cursor

    unchanged = tick(sensor, instance, cursor)
    assert unchanged.run_requests == [] and unchanged.cursor == cursor

    (kernels / "gemm.py").write_text((kernels / "gemm.py").read_text() + "\n# retuned\n")
    changed = tick(sensor, instance, cursor)
    digest = kernel_sources.hashes(kernels)["gemm"]
    assert [r.run_key for r in changed.run_requests] == [f"gemm:{digest}"]
    request = changed.run_requests[0]
    assert request.tags["kernaudit/kernel"] == "gemm" and request.tags["kernaudit/kernel_sha256"] == digest
    assert request.run_config == {"resources": {"settings": {"config": {"static_kernels": ["gemm"]}}}}
    assert json.loads(changed.cursor)["gemm"] == digest

    # the next tick, with the advanced cursor, sees nothing new
    again = tick(sensor, instance, changed.cursor)
    assert again.run_requests == []


def test_two_changed_and_one_new_kernel_give_three_runs_deleted_gives_none(kernels, instance):
    sensor = build_kernel_sensor(audit_job, kernels_dir=kernels)
    cursor = tick(sensor, instance, None).cursor
    for name in ("gemm.py", "flash_attention.py"):
        (kernels / name).write_text((kernels / name).read_text() + "\n# edited\n")
    shutil.copy(KERNELS_DIR / "fp8_gemm.py", kernels / "fp8_gemm.py")
    (kernels / "paged_decode_attention.py").unlink()
    result = tick(sensor, instance, cursor)
    hashes = kernel_sources.hashes(kernels)
    assert sorted(r.run_key for r in result.run_requests) == sorted(
        f"{m}:{hashes[m]}" for m in ("gemm", "flash_attention", "fp8_gemm"))
    assert "paged_decode_attention" not in json.loads(result.cursor)


def test_run_requests_are_valid_run_config_for_the_audit_job(kernels, instance):
    defs = build_definitions()
    job = defs.resolve_job_def("audit_job")
    sensor = build_kernel_sensor(audit_job, kernels_dir=kernels)
    cursor = tick(sensor, instance, None).cursor
    (kernels / "gemm.py").write_text((kernels / "gemm.py").read_text() + "\n")
    request = tick(sensor, instance, cursor).run_requests[0]
    validated = validate_run_config(job, request.run_config)
    assert validated["resources"]["settings"]["config"]["static_kernels"] == ["gemm"]


def test_corrupt_cursor_reaudits_everything(kernels, instance):
    sensor = build_kernel_sensor(audit_job, kernels_dir=kernels)
    result = tick(sensor, instance, "not json")
    assert len(result.run_requests) == 3


def test_the_code_location_carries_the_sensor_and_schedule():
    defs = build_definitions()
    sensor = defs.resolve_sensor_def("kernel_sources_sensor")
    schedule = defs.resolve_schedule_def("nightly_audit")
    assert sensor.job_name == "audit_job" and schedule.job_name == "audit_job"
    assert str(sensor.default_status.value) == "RUNNING" and sensor.minimum_interval_seconds == 60
