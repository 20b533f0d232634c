"""The kernel-source sensor against a real Dagster instance and a temporary kernels/ folder."""

import json
import shutil

import pytest
from dagster import DagsterInstance, build_sensor_context

from kernaudit_pipeline import kernel_sources
from kernaudit_pipeline.defs.definitions import build_definitions
from kernaudit_pipeline.defs.run_tags import selected_modules, selection_tags
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
    sensor = build_kernel_sensor("audit_job", kernels_dir=kernels)
    result = tick(sensor, instance, None)
    assert result.run_requests == []
    assert json.loads(result.cursor) == kernel_sources.hashes(kernels)
    assert "recorded the hashes of 3 kernels" in result.skip_message


def test_one_run_per_changed_kernel_none_for_unchanged(kernels, instance):
    sensor = build_kernel_sensor("audit_job", kernels_dir=kernels)
    cursor = tick(sensor, instance, None).cursor

    unchanged = tick(sensor, instance, cursor)
    assert unchanged.run_requests == [] and unchanged.cursor == cursor

    (kernels / "gemm.py").write_text((kernels / "gemm.py").read_text() + "\n# retuned\n")
    changed = tick(sensor, instance, cursor)
    digest = kernel_sources.hashes(kernels)["gemm"]
    assert [r.run_key for r in changed.run_requests] == [f"gemm_bf16:{digest}"]
    request = changed.run_requests[0]
    # the kernel's name for people, its module for the steps; the run config is left alone
    assert request.tags["kernaudit/kernel"] == "gemm_bf16" and request.tags["kernaudit/kernel_module"] == "gemm"
    assert request.tags["kernaudit/kernel_sha256"] == digest and request.tags["kernaudit/trigger"] == "sensor"
    assert request.run_config == {}
    assert selected_modules(request.tags) == ["gemm"]
    assert json.loads(changed.cursor)["gemm"] == digest

    # the next tick, with the advanced cursor, sees nothing new
    again = tick(sensor, instance, changed.cursor)
    assert again.run_requests == []


def test_two_changed_and_one_new_kernel_give_three_runs_deleted_gives_none(kernels, instance):
    sensor = build_kernel_sensor("audit_job", kernels_dir=kernels)
    cursor = tick(sensor, instance, None).cursor
    for name in ("gemm.py", "flash_attention.py"):
        (kernels / name).write_text((kernels / name).read_text() + "\n# edited\n")
    shutil.copy(KERNELS_DIR / "fp8_gemm.py", kernels / "fp8_gemm.py")
    (kernels / "paged_decode_attention.py").unlink()
    result = tick(sensor, instance, cursor)
    hashes = kernel_sources.hashes(kernels)
    assert sorted(r.run_key for r in result.run_requests) == sorted(
        f"{name}:{hashes[m]}" for m, name in (("gemm", "gemm_bf16"), ("flash_attention", "flash_attention_fwd"),
                                               ("fp8_gemm", "fused_fp8_gemm")))
    assert "paged_decode_attention" not in json.loads(result.cursor)


def test_the_first_tick_names_the_kernels_and_a_name_without_a_literal_falls_back_to_the_module(kernels, instance):
    (kernels / "odd.py").write_text("NAME = 'odd' + '_kernel'\n")
    result = tick(build_kernel_sensor("audit_job", kernels_dir=kernels), instance, None)
    assert "flash_attention_fwd, gemm_bf16, odd, paged_decode_attention" in result.skip_message
    assert kernel_sources.declared_name(kernels / "gemm.py") == "gemm_bf16"


def test_a_sensor_run_compiles_only_its_kernel(kernels, instance, tmp_path):
    """The tag restricts the static compile (and the runner) of the run it labels."""
    from dagster import materialize

    from kernaudit_pipeline.defs.assets import kernel_sources as sources_asset
    from kernaudit_pipeline.defs.assets import static_resources
    from kernaudit_pipeline.defs.resources import AuditSettings

    settings = AuditSettings(data_dir=str(tmp_path / "data"), static_max_configs=1)
    result = materialize([sources_asset, static_resources], instance=instance, resources={"settings": settings},
                         tags=selection_tags(["paged_decode_attention"], ["paged_decode_attention"]))
    assert result.success
    frame = result.output_for_node("static_resources")
    assert set(frame["kernel_name"]) == {"paged_decode_attention"} and len(frame) == 1


def test_corrupt_cursor_reaudits_everything(kernels, instance):
    sensor = build_kernel_sensor("audit_job", kernels_dir=kernels)
    result = tick(sensor, instance, "not json")
    assert len(result.run_requests) == 3


def test_the_code_location_carries_the_sensor_and_schedule():
    defs = build_definitions()
    sensor = defs.resolve_sensor_def("kernel_sources_sensor")
    schedule = defs.resolve_schedule_def("nightly_audit")
    assert sensor.job_name == "audit_job" and schedule.job_name == "audit_job"
    assert str(sensor.default_status.value) == "RUNNING" and sensor.minimum_interval_seconds == 60
