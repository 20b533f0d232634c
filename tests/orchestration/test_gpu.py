"""GPU-tagged execution: per-device pools, CUDA_VISIBLE_DEVICES pinning, the device listing.

The listings are faked through KERNAUDIT_GPU_DEVICES (this machine has no GPU);
the pools and slot limits are Dagster's own, read from the project's dagster.yaml.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance, materialize

from kernaudit_pipeline import gpu_devices
from kernaudit_pipeline.defs.definitions import build_assets, build_definitions
from kernaudit_pipeline.defs.resources import AuditSettings
from kernaudit_pipeline.gpu_devices import DeviceListingError, GpuDevice
from kernaudit_pipeline.kernel_spec import kernel_files

ROOT = Path(__file__).resolve().parents[2]
THREE = [GpuDevice("0"), GpuDevice("1"), GpuDevice("2")]


def test_listing_from_the_override_and_from_cuda_visible_devices():
    assert gpu_devices.list_devices({"KERNAUDIT_GPU_DEVICES": "0,1,2"}) == THREE
    assert gpu_devices.list_devices({"KERNAUDIT_GPU_DEVICES": "none", "CUDA_VISIBLE_DEVICES": "0"}) == []
    assert gpu_devices.list_devices({"CUDA_VISIBLE_DEVICES": "2,3"}) == [GpuDevice("2"), GpuDevice("3")]
    assert gpu_devices.list_devices({"CUDA_VISIBLE_DEVICES": ""}) == []
    uuid = "GPU-5d3c2f1e-8a7b-4c6d-9e0f-1a2b3c4d5e6f"
    assert gpu_devices.list_devices({"KERNAUDIT_GPU_DEVICES": uuid})[0].slug == uuid.replace("-", "_")


@pytest.mark.parametrize("text, message", [("0,,1", "empty device id"), ("0,0", "listed twice"),
                                           ("0;rm -rf", "not a device id")])
def test_bad_listings_are_refused(text, message):
    with pytest.raises(DeviceListingError, match=message):
        gpu_devices.list_devices({"KERNAUDIT_GPU_DEVICES": text})


def test_nvidia_smi_csv_is_parsed():
    text = ("0, NVIDIA H200, GPU-11111111-2222-3333-4444-555555555555\n"
            "1, NVIDIA H200, GPU-66666666-7777-8888-9999-000000000000\n")
    devices = gpu_devices.parse_nvidia_smi_csv(text)
    assert [(d.visible_id, d.name) for d in devices] == [("0", "NVIDIA H200"), ("1", "NVIDIA H200")]
    assert devices[1].uuid.startswith("GPU-6666")


def test_without_nvidia_smi_there_is_no_gpu(monkeypatch):
    monkeypatch.delenv("KERNAUDIT_GPU_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has nvidia-smi")
    assert gpu_devices.list_devices() == []


def test_pools_one_gpu_pool_or_one_per_device():
    assert gpu_devices.pool_for(None, 0) == "gpu"
    assert gpu_devices.pool_for(GpuDevice("0"), 1) == "gpu"
    assert [gpu_devices.pool_for(d, 3) for d in THREE] == ["gpu-0", "gpu-1", "gpu-2"]


def test_kernel_assignment_is_static_balanced_and_restrictable():
    kernels = [p.stem for p in kernel_files()]
    share = gpu_devices.assign_kernels(kernels, THREE)
    assigned = [k for ks in share.values() for k in ks]
    assert sorted(assigned) == sorted(kernels)  # every kernel exactly once
    assert max(map(len, share.values())) - min(map(len, share.values())) <= 1
    one = sorted(kernels)[1]
    restricted = gpu_devices.assign_kernels(kernels, THREE, [one])
    # a sensor run for one kernel lands on the device that kernel always gets
    assert {d: ks for d, ks in restricted.items() if ks} == {d: [one] for d, ks in share.items() if one in ks}


def test_a_pinned_process_sees_exactly_its_device():
    env = gpu_devices.pinned_env(GpuDevice("2"), {"PATH": "/usr/bin:/bin", "KERNAUDIT_GPU_DEVICES": "0,1,2"})
    out = subprocess.run([sys.executable, "-c", "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], "
                          "os.environ.get('KERNAUDIT_GPU_DEVICES'))"], env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == ["2", "None"]
    cmd = gpu_devices.runner_command(Path("t.jsonl"), ["gemm"], ["--quick"])
    assert cmd[1:] == ["-m", "kernaudit_pipeline.bench.runner", "--out", "t.jsonl", "--quick", "gemm"]


def test_three_devices_give_three_pinned_steps_in_three_pools():
    defs = build_definitions(devices=THREE)
    node = defs.resolve_asset_graph().get(AssetKey("raw_traces"))
    assert node.pools == {"gpu-0", "gpu-1", "gpu-2"}
    graph = defs.resolve_assets_def("raw_traces").node_def
    ops = {n.name: n.definition for n in graph.node_dict.values()}
    assert set(ops) == {"bench_gpu_0", "bench_gpu_1", "bench_gpu_2", "merge_traces"}
    for i in range(3):
        op = ops[f"bench_gpu_{i}"]
        assert op.pool == f"gpu-{i}" and op.tags["kernaudit/device"] == str(i) and op.tags["kernaudit/gpu"] == "true"


def test_no_gpu_gives_one_step_in_pool_gpu():
    defs = build_definitions(devices=[])
    assert defs.resolve_asset_graph().get(AssetKey("raw_traces")).pools == {"gpu"}


FAKE_SMI = """#!/bin/sh
echo called >> "{marker}"
echo "0, NVIDIA H200, GPU-11111111-2222-3333-4444-555555555555"
echo "1, NVIDIA H200, GPU-66666666-7777-8888-9999-000000000000"
"""


def test_devices_are_listed_when_the_run_starts_never_when_the_definitions_load(tmp_path, monkeypatch):
    """A fake nvidia-smi on PATH: loading the code location must not call it; the runner step must."""
    marker = tmp_path / "smi-calls"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").write_text(FAKE_SMI.format(marker=marker))
    (bindir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    for name in ("KERNAUDIT_GPU_DEVICES", "KERNAUDIT_GPU_HOSTS", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KERNAUDIT_DATA_DIR", str(tmp_path / "data"))

    defs = build_definitions()
    assert not marker.exists()  # nothing ran at load
    node = defs.resolve_asset_graph().get(AssetKey("raw_traces"))
    assert node.pools == {"gpu"}  # one host-level step, in the one-GPU pool

    raw_traces = next(a for a in build_assets() if AssetKey("raw_traces") in a.keys)
    assert not marker.exists()
    with DagsterInstance.ephemeral() as instance:
        result = materialize([raw_traces], instance=instance,
                             resources={"settings": AuditSettings(data_dir=str(tmp_path / "data"))})
    assert result.success
    assert marker.read_text().count("called") == 1  # asked once, when the step ran
    devices = result.asset_materializations_for_node("raw_traces")[0].metadata["devices"].value
    assert [d["visible_id"] for d in devices] == ["0", "1"]  # found at run start, kernels split over both
    assert all("torch sees no CUDA device" in d["note"] for d in devices)
    assert sum(len(d["kernels"]) for d in devices) == len(kernel_files())


def test_faked_devices_materialize_and_say_why_the_runner_did_not_start(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNAUDIT_DATA_DIR", str(tmp_path / "data"))
    raw_traces = next(a for a in build_assets(THREE) if AssetKey("raw_traces") in a.keys)
    with DagsterInstance.ephemeral() as instance:
        result = materialize([raw_traces], instance=instance,
                             resources={"settings": AuditSettings(data_dir=str(tmp_path / "data"))})
        assert result.success
        traces = result.output_for_node("raw_traces", "result")
        assert traces.mode.value == "committed_samples" and len(traces.rows) > 0
        devices = result.asset_materializations_for_node("raw_traces")[0].metadata["devices"].value
    assert [d["visible_id"] for d in devices] == ["0", "1", "2"]
    assert all(d["trace_file"] is None and "torch sees no CUDA device" in d["note"] for d in devices)
    assert sum(len(d["kernels"]) for d in devices) == len(kernel_files())


def test_project_dagster_yaml_limits_each_device_pool_to_one_step(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(ROOT / "dagster.yaml", home / "dagster.yaml")
    with DagsterInstance.from_config(str(home)) as instance:
        config = instance.get_concurrency_config()
        assert config.pool_config.default_pool_limit == 1
        assert str(config.pool_config.pool_granularity.value) == "op"
        assert instance.run_monitoring_enabled
        assert instance.run_monitoring_settings["free_slots_after_run_end_seconds"] > 0
        storage = instance.event_log_storage
        for pool in ("gpu", "gpu-0", "gpu-1"):
            storage.initialize_concurrency_limit_to_default(pool)
            assert storage.get_concurrency_info(pool).slot_count == 1
        first = storage.claim_concurrency_slot("gpu-0", "run-a", "raw_traces.bench_gpu_0")
        second = storage.claim_concurrency_slot("gpu-0", "run-b", "raw_traces.bench_gpu_0")
        other_device = storage.claim_concurrency_slot("gpu-1", "run-b", "raw_traces.bench_gpu_1")
        assert [c.slot_status.value for c in (first, second, other_device)] == ["CLAIMED", "BLOCKED", "CLAIMED"]
        storage.free_concurrency_slots_for_run("run-a")  # what run monitoring does for a dead run
        assert storage.claim_concurrency_slot("gpu-0", "run-b", "raw_traces.bench_gpu_0").slot_status.value == "CLAIMED"


def test_several_hosts_get_host_qualified_pools():
    devices = gpu_devices.list_devices({"KERNAUDIT_GPU_HOSTS": "hosta=0,1; hostb=0", "KERNAUDIT_GPU_DEVICES": "0"})
    assert [(d.host, d.visible_id) for d in devices] == [("hosta", "0"), ("hosta", "1"), ("hostb", "0")]
    assert [gpu_devices.pool_for(d, len(devices)) for d in devices] == ["gpu-hosta-0", "gpu-hosta-1", "gpu-hostb-0"]
    # one host with one GPU still gets its own host pool, not the local "gpu"
    [solo] = gpu_devices.parse_hosts("hostc=0")
    assert gpu_devices.pool_for(solo, 1) == "gpu-hostc-0"
    for bad in ("hosta", "hosta=0;hosta=1", "ho st=0"):
        with pytest.raises(DeviceListingError):
            gpu_devices.parse_hosts(bad)
