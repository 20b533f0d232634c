"""Asset checks: the normalized table honours its schema and loses no row."""


import pandas as pd
import pandera.pandas as pa
from dagster import AssetCheckExecutionContext, AssetIn, AssetCheckResult, AssetCheckSeverity, AssetKey, asset_check

from kernaudit_pipeline.kernel_runs import KernelRuns
from kernaudit_pipeline.raw_traces import RawTraces


@asset_check(asset=AssetKey("kernel_runs"), description="kernel_runs validates against the pandera KernelRuns model.")
def kernel_runs_schema(context: AssetCheckExecutionContext, kernel_runs: pd.DataFrame) -> AssetCheckResult:
    try:
        KernelRuns.validate(kernel_runs, lazy=True)
    except pa.errors.SchemaErrors as exc:
        return AssetCheckResult(passed=False, severity=AssetCheckSeverity.ERROR,
                                metadata={"failures": len(exc.failure_cases)})
    return AssetCheckResult(passed=True, metadata={"rows": len(kernel_runs)})


@asset_check(asset=AssetKey("kernel_runs"), additional_ins={"raw_traces": AssetIn("raw_traces"),
                                                            "quarantine": AssetIn("quarantine")},
             description="Every input row is in kernel_runs or in quarantine, exactly once.")
def rows_accounted_for(context: AssetCheckExecutionContext, kernel_runs: pd.DataFrame,
                       raw_traces: RawTraces, quarantine: pd.DataFrame) -> AssetCheckResult:
    rows_in = len(raw_traces.rows) + len(raw_traces.quarantine)
    rows_out = len(kernel_runs) + len(quarantine)
    return AssetCheckResult(passed=rows_in == rows_out,
                            metadata={"rows_in": rows_in, "kernel_runs": len(kernel_runs),
                                      "quarantine": len(quarantine)})
