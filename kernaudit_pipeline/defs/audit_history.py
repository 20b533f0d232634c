"""``audit_history``: append each audit to DuckDB and compare it with the reference.

The asset check ``no_new_regressions`` fails (severity ERROR, visible on the
asset in the UI) when a (kernel, config, shape, device) got slower than in the
last accepted audit beyond the noise band with non-overlapping CIs, or newly
FAILED. Accept an audit as the new reference with ``kernaudit history accept``.
"""


import pandas as pd
from dagster import (AssetCheckExecutionContext, AssetCheckResult, AssetCheckSeverity, AssetExecutionContext,
                     MetadataValue, asset, asset_check)

from kernaudit_pipeline import history as history_lib
from kernaudit_pipeline.defs.metadata import table
from kernaudit_pipeline.defs.resources import AuditSettings
from kernaudit_pipeline.defs.run_tags import TRIGGER_TAG

FIRST_AUDIT = "none: this is the first audit in this data folder, accepted as the reference"
REGRESSION_TABLE_COLUMNS = ["kind", "kernel_name", "shape_name", "config_id", "device_name", "reference_latency_us",
                            "latency_us", "delta_pct", "latency_ci_low_us", "latency_ci_high_us",
                            "reference_ci_low_us", "reference_ci_high_us"]


def trigger_of(tags: dict[str, str]) -> str:
    if TRIGGER_TAG in tags:
        return tags[TRIGGER_TAG]
    if "dagster/schedule_name" in tags:
        return "schedule"
    if "dagster/sensor_name" in tags:
        return "sensor"
    return "manual"


def regression_table(frame: pd.DataFrame, limit: int = 25) -> MetadataValue:
    return table(frame, REGRESSION_TABLE_COLUMNS, limit=limit)


@asset(group_name="history",
       description="Every audit appended to data/history.duckdb (latency, CI, speedup, status per kernel, config, "
       "shape and device) and compared with the last accepted audit: the regressions found, with delta and CI.")
def audit_history(context: AssetExecutionContext, settings: AuditSettings,
                  spill_diagnostics: pd.DataFrame) -> pd.DataFrame:
    db = settings.paths().history_db
    run_id = context.run.run_id
    modes = spill_diagnostics["source_format"].value_counts().to_dict() if "source_format" in spill_diagnostics else {}
    record = history_lib.record_audit(db, run_id, spill_diagnostics, trigger=trigger_of(context.run.tags),
                                      data_mode=", ".join(f"{k}:{v}" for k, v in sorted(modes.items())) or None)
    result = history_lib.compare(db, run_id, settings.noise_band)
    frame = result.frame()
    context.add_output_metadata({
        "keys_recorded": record.rows,
        "accepted": record.accepted,
        "reference_run_id": result.reference_run_id or FIRST_AUDIT,
        "keys_compared": result.keys_compared,
        "regressions": len(frame),
        "regressions_table": regression_table(frame),
        "history_db": MetadataValue.path(str(db)),
    })
    return frame


@asset_check(asset=audit_history, description="No (kernel, config, shape, device) regressed against the last "
             "accepted audit: slower beyond the noise band with non-overlapping 95 % CIs, or newly FAILED.")
def no_new_regressions(context: AssetCheckExecutionContext, settings: AuditSettings,
                       audit_history: pd.DataFrame) -> AssetCheckResult:
    if audit_history.empty:
        reference = history_lib.compare(settings.paths().history_db, context.run.run_id,
                                        settings.noise_band).reference_run_id
        if reference is None:
            return AssetCheckResult(passed=True, metadata={"regressions": 0, "reference_run_id": FIRST_AUDIT},
                                    description="first audit: nothing to compare with, it is the reference now")
        return AssetCheckResult(passed=True, metadata={"regressions": 0, "reference_run_id": reference})
    worst = audit_history.dropna(subset=["delta_pct"]).nlargest(1, "delta_pct")
    metadata = {
        "regressions": len(audit_history),
        "now_failing": int((audit_history["kind"] == str(history_lib.RegressionKind.NOW_FAILING)).sum()),
        "reference_run_id": str(audit_history["reference_run_id"].iloc[0]),
        "regressions_table": regression_table(audit_history),
    }
    if len(worst):
        metadata["worst_delta_pct"] = float(worst["delta_pct"].iloc[0])
    return AssetCheckResult(passed=False, severity=AssetCheckSeverity.ERROR, metadata=metadata,
                            description=f"{len(audit_history)} new regressions against the accepted reference")
