"""``audit_history``: append each audit to DuckDB and compare it with the reference.

The asset check ``no_new_regressions`` fails (severity ERROR, visible on the asset in the UI)
only on *confirmed* regressions: a (kernel, config, shape, device) whose paired speedup CI lies
below the last accepted audit's beyond the noise band *and* whose re-measure in this audit (on
its GPU) says the same, or that newly FAILED its correctness check. Without a GPU nothing can
be re-measured: differences are reported as unconfirmed and the check passes, saying so.
Accept an audit as the new reference with ``kernaudit history accept``.
"""


import pandas as pd
from dagster import (AssetCheckExecutionContext, AssetCheckResult, AssetCheckSeverity, AssetExecutionContext,
                     MetadataValue, asset, asset_check)

from kernaudit_pipeline import history as history_lib
from kernaudit_pipeline.defs.metadata import table
from kernaudit_pipeline.defs.resources import AuditSettings
from kernaudit_pipeline.defs.run_tags import TRIGGER_TAG

FIRST_AUDIT = "none: this is the first audit in this data folder, accepted as the reference"
REGRESSION_TABLE_COLUMNS = ["confirmation", "kind", "kernel_name", "shape_name", "config_id", "device_name",
                            "reference_latency_us", "latency_us", "delta_pct", "latency_ci_low_us",
                            "latency_ci_high_us", "reference_ci_low_us", "reference_ci_high_us",
                            "reference_speedup", "speedup", "remeasured_speedup"]


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


def remeasure_for(settings: AuditSettings):
    """Re-measure on the first visible GPU of this audit; None on a CPU-only audit."""
    from kernaudit_pipeline.gpu_devices import DeviceListingError, list_devices, pinned_env

    try:
        devices = list_devices()
    except DeviceListingError:
        return None
    if not devices:
        return None
    return history_lib.runner_remeasure(settings.paths().root / "remeasure", env=pinned_env(devices[0]))


@asset(group_name="history",
       description="Every audit appended to data/history.duckdb (latency, CI, paired speedup and its CI, status per "
       "kernel, config, shape and device) and compared with the last accepted audit: the regressions found, each "
       "confirmed by a re-measure on this audit's GPU, or unconfirmed.")
def audit_history(context: AssetExecutionContext, settings: AuditSettings,
                  spill_diagnostics: pd.DataFrame) -> pd.DataFrame:
    db = settings.paths().history_db
    run_id = context.run.run_id
    modes = spill_diagnostics["source_format"].value_counts().to_dict() if "source_format" in spill_diagnostics else {}
    record = history_lib.record_audit(db, run_id, spill_diagnostics, trigger=trigger_of(context.run.tags),
                                      data_mode=", ".join(f"{k}:{v}" for k, v in sorted(modes.items())) or None)
    remeasure = remeasure_for(settings)
    result = history_lib.compare(db, run_id, settings.noise_band, remeasure=remeasure)
    frame = result.frame()
    context.add_output_metadata({
        "keys_recorded": record.rows,
        "accepted": record.accepted,
        "reference_run_id": result.reference_run_id or FIRST_AUDIT,
        "keys_compared": result.keys_compared,
        "regressions": len(frame),
        "confirmed_regressions": len(result.confirmed),
        "unconfirmed_regressions": len(result.unconfirmed),
        "remeasured_on": "GPU" if remeasure is not None else "nothing (no GPU: differences stay unconfirmed)",
        "regressions_table": regression_table(frame),
        "history_db": MetadataValue.path(str(db)),
    })
    return frame


@asset_check(asset=audit_history, description="No (kernel, config, shape, device) regressed against the last "
             "accepted audit: a paired speedup CI below the reference's beyond the noise band, confirmed by a "
             "re-measure in the same audit, or a newly FAILED correctness check. Unconfirmed differences pass.")
def no_new_regressions(context: AssetCheckExecutionContext, settings: AuditSettings,
                       audit_history: pd.DataFrame) -> AssetCheckResult:
    if audit_history.empty:
        reference = history_lib.compare(settings.paths().history_db, context.run.run_id,
                                        settings.noise_band).reference_run_id
        if reference is None:
            return AssetCheckResult(passed=True, metadata={"regressions": 0, "reference_run_id": FIRST_AUDIT},
                                    description="first audit: nothing to compare with, it is the reference now")
        return AssetCheckResult(passed=True, metadata={"regressions": 0, "reference_run_id": reference})
    confirmed = audit_history[audit_history["confirmation"] == str(history_lib.Confirmation.CONFIRMED)]
    unconfirmed = int((audit_history["confirmation"] == str(history_lib.Confirmation.UNCONFIRMED)).sum())
    metadata = {
        "regressions": len(confirmed),
        "unconfirmed": unconfirmed,
        "refuted": int((audit_history["confirmation"] == str(history_lib.Confirmation.REFUTED)).sum()),
        "now_failing": int((confirmed["kind"] == str(history_lib.RegressionKind.NOW_FAILING)).sum()),
        "reference_run_id": str(audit_history["reference_run_id"].iloc[0]),
        "regressions_table": regression_table(audit_history),
    }
    deltas = pd.to_numeric(confirmed["delta_pct"], errors="coerce").dropna()
    if len(deltas):
        metadata["worst_delta_pct"] = float(deltas.max())
    if confirmed.empty:
        return AssetCheckResult(passed=True, metadata=metadata,
                                description=f"no confirmed regressions ({unconfirmed} unconfirmed differences)")
    return AssetCheckResult(passed=False, severity=AssetCheckSeverity.ERROR, metadata=metadata,
                            description=f"{len(confirmed)} confirmed regressions against the accepted reference")
