"""``raw_traces``: the GPU-tagged asset, one runner step per device.

``raw_traces`` is a graph-backed asset: one ``bench_gpu*`` op per listed
device, each in that device's Dagster pool (limit 1 from ``dagster.yaml``, so
one step per GPU at a time, across runs too) and pinned to it with
``CUDA_VISIBLE_DEVICES``, then ``merge_traces`` reads what they wrote. With no
GPU (or ``use_gpu="never"``, or traces given explicitly) the single op in pool
``gpu`` records why it did not run and ``merge_traces`` reads the committed
samples. The device listing is read when the definitions load
(:func:`kernaudit_pipeline.gpu_devices.list_devices`).
"""


from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Mapping

import pandas as pd
from dagster import AssetsDefinition, In, MetadataValue, OpExecutionContext, Out, graph_asset, op

from kernaudit_pipeline import gpu_devices
from kernaudit_pipeline import raw_traces as raw_traces_lib
from kernaudit_pipeline.defs.resources import AuditSettings
from kernaudit_pipeline.kernel_spec import kernel_files
from kernaudit_pipeline.settings import PROJECT_ROOT, SYNTHETIC_DIR

GPU_TAG = "kernaudit/gpu"
DEVICE_TAG = "kernaudit/device"
HOST_TAG = "kernaudit/gpu_host"
DESCRIPTION = ("GPU benchmark runs (the runner, one step per GPU, each pinned with CUDA_VISIBLE_DEVICES) or, "
               "without a GPU, the committed H200 sample traces plus the synthetic tables. GPU-tagged: each "
               "device has its own pool ('gpu' on a one-GPU host, 'gpu-<id>' on several), limited to one step.")


def _skip_reason(settings: AuditSettings, device: gpu_devices.GpuDevice | None, kernels: list[str]) -> str | None:
    if settings.sources:
        return "traces were given explicitly"
    if settings.use_gpu == "never":
        return "use_gpu='never'"
    if device is None:
        return "no GPU listed on this host"
    if not kernels:
        return "no kernel assigned to this device in this run"
    if not raw_traces_lib.gpu_available():
        return f"device {device.visible_id} is listed but torch sees no CUDA device"
    return None


StepTags = Callable[[gpu_devices.GpuDevice | None], Mapping[str, Any]]


def device_op(device: gpu_devices.GpuDevice | None, devices: list[gpu_devices.GpuDevice],
              step_tags: StepTags | None = None):
    """The runner step of one device of ``devices`` (or the single no-GPU step).

    ``step_tags`` adds deployment tags to it (a Celery queue per GPU host, a
    Kubernetes ``nvidia.com/gpu`` limit: ``deploy/``).
    """
    device_count = len(devices)
    single = device is None or (device_count <= 1 and device.host is None)
    name = "bench_gpu" if single else f"bench_gpu_{device.slug}"
    visible = device.visible_id if device else "none"
    tags = {GPU_TAG: "true", DEVICE_TAG: visible, **({HOST_TAG: device.host} if device and device.host else {}),
            **(step_tags(device) if step_tags else {})}

    @op(name=name, pool=gpu_devices.pool_for(device, device_count), tags=tags, out=Out(gpu_devices.DeviceRun),
        description=f"Run the GPU runner on device {visible} (CUDA_VISIBLE_DEVICES={visible}).")
    def bench(context: OpExecutionContext, settings: AuditSettings) -> gpu_devices.DeviceRun:
        all_kernels = [p.stem for p in kernel_files()]
        share = gpu_devices.assign_kernels(all_kernels, devices, list(settings.static_kernels) or None)
        kernels = share.get(device.slug, []) if device else []
        reason = _skip_reason(settings, device, kernels)
        if reason is not None:
            context.log.info(f"runner not started on device {visible}: {reason}")
            return gpu_devices.DeviceRun(visible_id=visible, kernels=tuple(kernels), trace_file=None, note=reason)
        context.log.info(f"runner on CUDA_VISIBLE_DEVICES={visible}: {', '.join(kernels)}")
        out = gpu_devices.run_on_device(device, settings.paths().traces, kernels, cwd=PROJECT_ROOT)
        return gpu_devices.DeviceRun(visible_id=visible, kernels=tuple(kernels), trace_file=str(out),
                                     note=f"timed on CUDA_VISIBLE_DEVICES={visible}")

    return bench


@op(ins={"runs": In(list[gpu_devices.DeviceRun])}, out=Out(raw_traces_lib.RawTraces),
    description="Read back every device's traces (or the committed samples) into one RawTraces.")
def merge_traces(context: OpExecutionContext, settings: AuditSettings,
                 runs: list[gpu_devices.DeviceRun]) -> raw_traces_lib.RawTraces:
    files = [run.trace_file for run in runs if run.trace_file]
    if files:
        paths = [Path(f) for f in files]
        if settings.include_synthetic:
            paths += sorted(SYNTHETIC_DIR.glob("*.csv"))
        devices = ", ".join(run.visible_id for run in runs if run.trace_file)
        traces = raw_traces_lib.read_files(paths, raw_traces_lib.TraceMode.GPU_RUN,
                                           f"GPU run: the runner timed the kernels in this audit on device(s) {devices}")
    else:
        traces = raw_traces_lib.collect(settings.paths(), sources=list(settings.sources) or None,
                                        include_synthetic=settings.include_synthetic, use_gpu="never")
    files_frame = pd.DataFrame([asdict(f) for f in traces.files])
    context.add_output_metadata({
        "mode": traces.mode.value, "note": traces.mode_note, "rows": len(traces.rows),
        "parse_quarantined": len(traces.quarantine),
        "devices": MetadataValue.json([asdict(run) for run in runs]),
        "files": MetadataValue.md(files_frame.to_markdown(index=False) if len(files_frame) else "_none_"),
    })
    return traces


def build_raw_traces(devices: list[gpu_devices.GpuDevice], step_tags: StepTags | None = None) -> AssetsDefinition:
    """The ``raw_traces`` asset for this device listing (empty: no GPU)."""
    steps = [device_op(d, devices, step_tags) for d in devices] or [device_op(None, [], step_tags)]

    @graph_asset(name="raw_traces", group_name="traces", description=DESCRIPTION)
    def raw_traces():
        return merge_traces([step() for step in steps])

    return raw_traces
