"""Re-audit a kernel when its source changes.

The cursor is the JSON of ``{module: sha256}`` from
:func:`kernaudit_pipeline.kernel_sources.hashes`. Each evaluation emits one
``RunRequest`` per kernel whose file hash differs from the cursor (a new file
counts), with ``run_key = "<kernel name>:<sha256>"`` (Dagster never launches the
same key twice). The run is restricted to that kernel by its tags
(:mod:`kernaudit_pipeline.defs.run_tags`): ``kernaudit/kernel`` names it as people
know it (``gemm_bf16``), ``kernaudit/kernel_module`` is the module the steps read
(``gemm``). The run config is left alone. An unchanged or deleted file launches
nothing. The first evaluation (no cursor) only records the hashes: the nightly
schedule covers what existed before the sensor was switched on.
"""


import json
from pathlib import Path

from dagster import DefaultSensorStatus, RunRequest, SensorDefinition, SensorEvaluationContext, SensorResult, sensor

from kernaudit_pipeline import kernel_sources
from kernaudit_pipeline.defs.run_tags import HASH_TAG, TRIGGER_TAG, selection_tags
from kernaudit_pipeline.kernel_spec import KERNELS_DIR


def changed_kernels(previous: dict[str, str], current: dict[str, str]) -> list[str]:
    return sorted(module for module, digest in current.items() if previous.get(module) != digest)


def run_request_for(source: kernel_sources.KernelSource) -> RunRequest:
    return RunRequest(
        run_key=f"{source.kernel_name}:{source.sha256}",
        tags={**selection_tags([source.module], [source.kernel_name]), HASH_TAG: source.sha256,
              TRIGGER_TAG: "sensor"},
    )


def build_kernel_sensor(job_name: str = "audit_job", kernels_dir: Path = KERNELS_DIR,
                        name: str = "kernel_sources_sensor", minimum_interval_seconds: int = 60) -> SensorDefinition:
    @sensor(name=name, job_name=job_name, minimum_interval_seconds=minimum_interval_seconds,
            default_status=DefaultSensorStatus.RUNNING,
            description="One run per kernel whose source sha256 changed in kernels/ (run_key kernel:sha256), "
                        "tagged with the kernel's name.")
    def kernel_sources_sensor(context: SensorEvaluationContext) -> SensorResult:
        sources = {s.module: s for s in kernel_sources.observe(kernels_dir)}
        current = {m: s.sha256 for m, s in sources.items()}
        cursor = json.dumps(current, sort_keys=True)
        names = ", ".join(sorted(s.kernel_name for s in sources.values()))
        if not context.cursor:
            return SensorResult(cursor=cursor, skip_reason=f"recorded the hashes of {len(current)} kernels: {names}")
        try:
            previous = json.loads(context.cursor)
        except json.JSONDecodeError:
            previous = {}
        if not isinstance(previous, dict):
            previous = {}
        changed = [sources[m] for m in changed_kernels(previous, current)]
        if not changed:
            return SensorResult(cursor=cursor, skip_reason=f"no kernel source changed ({names})")
        context.log.info(f"changed kernels: {', '.join(s.kernel_name for s in changed)}")
        return SensorResult(run_requests=[run_request_for(s) for s in changed], cursor=cursor)

    return kernel_sources_sensor
