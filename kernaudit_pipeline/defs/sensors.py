"""Re-audit a kernel when its source changes.

The cursor is the JSON of ``{module: sha256}`` from
:func:`kernaudit_pipeline.kernel_sources.hashes`. Each evaluation emits one
``RunRequest`` per module whose hash differs from the cursor (a new file
counts), with ``run_key = "<module>:<sha256>"`` (Dagster never launches the
same key twice) and the audit restricted to that kernel through
``AuditSettings.static_kernels`` (static compile and GPU runner) and the tag
``kernaudit/kernel``. An unchanged or deleted file launches nothing. The first
evaluation (no cursor) only records the hashes: the nightly schedule covers
what existed before the sensor was switched on.
"""


import json
from pathlib import Path

from dagster import (DefaultSensorStatus, JobDefinition, RunRequest, SensorDefinition, SensorEvaluationContext,
                     SensorResult, sensor)
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

from kernaudit_pipeline import kernel_sources
from kernaudit_pipeline.kernel_spec import KERNELS_DIR

KERNEL_TAG = "kernaudit/kernel"
HASH_TAG = "kernaudit/kernel_sha256"
TRIGGER_TAG = "kernaudit/trigger"


def changed_kernels(previous: dict[str, str], current: dict[str, str]) -> list[str]:
    return sorted(module for module, digest in current.items() if previous.get(module) != digest)


def run_request_for(module: str, digest: str) -> RunRequest:
    return RunRequest(
        run_key=f"{module}:{digest}",
        run_config={"resources": {"settings": {"config": {"static_kernels": [module]}}}},
        tags={KERNEL_TAG: module, HASH_TAG: digest, TRIGGER_TAG: "sensor"},
    )


def build_kernel_sensor(job: JobDefinition | UnresolvedAssetJobDefinition, kernels_dir: Path = KERNELS_DIR,
                        name: str = "kernel_sources_sensor", minimum_interval_seconds: int = 60) -> SensorDefinition:
    @sensor(name=name, job=job, minimum_interval_seconds=minimum_interval_seconds,
            default_status=DefaultSensorStatus.RUNNING,
            description="One run per kernel module whose sha256 changed in kernels/ (run_key module:sha256).")
    def kernel_sources_sensor(context: SensorEvaluationContext) -> SensorResult:
        current = kernel_sources.hashes(kernels_dir)
        cursor = json.dumps(current, sort_keys=True)
        if not context.cursor:
            return SensorResult(cursor=cursor, skip_reason=f"recorded the hashes of {len(current)} kernels")
        try:
            previous = json.loads(context.cursor)
        except json.JSONDecodeError:
            previous = {}
        if not isinstance(previous, dict):
            previous = {}
        changed = changed_kernels(previous, current)
        if not changed:
            return SensorResult(cursor=cursor, skip_reason="no kernel source changed")
        context.log.info(f"changed kernels: {', '.join(changed)}")
        return SensorResult(run_requests=[run_request_for(m, current[m]) for m in changed], cursor=cursor)

    return kernel_sources_sensor
