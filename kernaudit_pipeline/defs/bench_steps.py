"""The GPU steps behind the ``raw_traces`` asset: runner ops and the merge that reads them back.

Two shapes, chosen by what the environment declares when the code location loads
(:func:`kernaudit_pipeline.gpu_devices.declared_devices`, environment variables only;
nothing runs a subprocess at load):

- devices declared (``KERNAUDIT_GPU_DEVICES``, ``KERNAUDIT_GPU_HOSTS`` or
  ``CUDA_VISIBLE_DEVICES``): one ``bench_gpu_<id>`` op per device, each in that device's
  pool (limit 1 from ``dagster.yaml``: one step per GPU at a time, across runs too) and
  pinned to it with ``CUDA_VISIBLE_DEVICES``;
- nothing declared: one ``bench_gpu`` op in pool ``gpu`` that lists the host's GPUs with
  nvidia-smi when the run starts and runs one pinned runner per GPU it finds, side by side.

Either way ``merge_traces`` reads what they wrote, or the committed samples when no runner
ran, and every step says why it did or did not start.
"""


from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd
from dagster import In, MetadataValue, OpDefinition, OpExecutionContext, Out, op

from kernaudit_pipeline import gpu_devices
from kernaudit_pipeline import raw_traces as raw_traces_lib
from kernaudit_pipeline.defs.metadata import table
from kernaudit_pipeline.defs.resources import AuditSettings
from kernaudit_pipeline.defs.run_tags import selected_modules
from kernaudit_pipeline.kernel_spec import kernel_files
from kernaudit_pipeline.settings import PROJECT_ROOT, SYNTHETIC_DIR

GPU_TAG = "kernaudit/gpu"
DEVICE_TAG = "kernaudit/device"
HOST_TAG = "kernaudit/gpu_host"

StepTags = Callable[[gpu_devices.GpuDevice | None], Mapping[str, Any]]
DeviceRuns = list[gpu_devices.DeviceRun]


def _skip_reason(settings: AuditSettings) -> str | None:
    """Why no runner starts in this run at all, whatever the devices."""
    if settings.sources:
        return "traces were given explicitly"
    if settings.use_gpu == "never":
        return "use_gpu='never'"
    return None


def _run_devices(context: OpExecutionContext, settings: AuditSettings, devices: list[gpu_devices.GpuDevice],
                 mine: list[gpu_devices.GpuDevice]) -> DeviceRuns:
    """Run the runner on each device of ``mine`` (``devices``: the whole listing, for the kernel split)."""
    all_kernels = [p.stem for p in kernel_files()]
    share = gpu_devices.assign_kernels(all_kernels, devices, selected_modules(context.run.tags))
    skipped = _skip_reason(settings)
    cuda = skipped is None and gpu_devices.torch_sees_cuda()
    runs: list[gpu_devices.DeviceRun] = []
    work: list[tuple[gpu_devices.GpuDevice, list[str]]] = []
    for device in mine:
        kernels = share.get(device.slug, [])
        reason = skipped or (None if kernels else "no kernel assigned to this device in this run") or (
            None if cuda else f"device {device.visible_id} is listed but torch sees no CUDA device")
        if reason is not None:
            context.log.info(f"runner not started on device {device.visible_id}: {reason}")
            runs.append(gpu_devices.DeviceRun(visible_id=device.visible_id, kernels=tuple(kernels),
                                              trace_file=None, note=reason))
        else:
            context.log.info(f"runner on CUDA_VISIBLE_DEVICES={device.visible_id}: {', '.join(kernels)}")
            work.append((device, kernels))
    runs += gpu_devices.run_on_devices(work, settings.paths().traces, cwd=PROJECT_ROOT)
    return runs


def device_op(device: gpu_devices.GpuDevice, devices: list[gpu_devices.GpuDevice],
              step_tags: StepTags | None = None) -> OpDefinition:
    """The runner step of one declared device of ``devices``.

    ``step_tags`` adds deployment tags to it (a Celery queue per GPU host, a
    Kubernetes ``nvidia.com/gpu`` limit: ``deploy/``).
    """
    single = len(devices) <= 1 and device.host is None
    name = "bench_gpu" if single else f"bench_gpu_{device.slug}"
    tags = {GPU_TAG: "true", DEVICE_TAG: device.visible_id, **({HOST_TAG: device.host} if device.host else {}),
            **(step_tags(device) if step_tags else {})}

    @op(name=name, pool=gpu_devices.pool_for(device, len(devices)), tags=tags, out=Out(DeviceRuns),
        description=f"Run the GPU runner on device {device.visible_id} "
                    f"(CUDA_VISIBLE_DEVICES={device.visible_id}).")
    def bench(context: OpExecutionContext, settings: AuditSettings) -> DeviceRuns:
        return _run_devices(context, settings, devices, [device])

    return bench


def detecting_op(step_tags: StepTags | None = None) -> OpDefinition:
    """The one runner step of a host whose devices were not declared: it lists them when it starts."""
    tags = {GPU_TAG: "true", DEVICE_TAG: "detected at run start", **(step_tags(None) if step_tags else {})}

    @op(name="bench_gpu", pool=gpu_devices.GPU_POOL, tags=tags, out=Out(DeviceRuns),
        description="List this host's GPUs (nvidia-smi) and run one pinned GPU runner per device.")
    def bench(context: OpExecutionContext, settings: AuditSettings) -> DeviceRuns:
        skipped = _skip_reason(settings)
        if skipped is not None:
            context.log.info(f"runner not started: {skipped}")
            return [gpu_devices.DeviceRun(visible_id="none", kernels=(), trace_file=None, note=skipped)]
        devices = gpu_devices.list_devices()
        if not devices:
            note = "no GPU on this host (nvidia-smi lists none, or is absent)"
            context.log.info(f"runner not started: {note}")
            return [gpu_devices.DeviceRun(visible_id="none", kernels=(), trace_file=None, note=note)]
        context.log.info(f"devices found at run start: {', '.join(d.visible_id for d in devices)}")
        return _run_devices(context, settings, devices, devices)

    return bench


@op(ins={"runs": In(list[DeviceRuns])}, out=Out(raw_traces_lib.RawTraces),
    description="Read back every device's traces (or the committed samples) into one RawTraces.")
def merge_traces(context: OpExecutionContext, settings: AuditSettings, runs: list[DeviceRuns]) -> raw_traces_lib.RawTraces:
    flat = [run for step in runs for run in step]
    files = [run.trace_file for run in flat if run.trace_file]
    if files:
        paths = [Path(f) for f in files]
        if settings.include_synthetic:
            paths += sorted(SYNTHETIC_DIR.glob("*.csv"))
        devices = ", ".join(run.visible_id for run in flat if run.trace_file)
        traces = raw_traces_lib.read_files(paths, raw_traces_lib.TraceMode.GPU_RUN,
                                           f"GPU run: the runner timed the kernels in this audit on device(s) {devices}")
    else:
        traces = raw_traces_lib.collect(settings.paths(), sources=list(settings.sources) or None,
                                        include_synthetic=settings.include_synthetic)
    files_frame = pd.DataFrame([asdict(f) for f in traces.files])
    context.add_output_metadata({
        "mode": traces.mode.value, "note": traces.mode_note, "rows": len(traces.rows),
        "parse_quarantined": len(traces.quarantine),
        "devices": MetadataValue.json([asdict(run) for run in flat]),
        "files": table(files_frame, limit=100),
    })
    return traces


def runner_steps(devices: list[gpu_devices.GpuDevice] | None, step_tags: StepTags | None = None) -> list[OpDefinition]:
    """One op per declared device; one detecting op when none is declared (``None`` or ``[]``)."""
    if devices:
        return [device_op(d, devices, step_tags) for d in devices]
    return [detecting_op(step_tags)]
