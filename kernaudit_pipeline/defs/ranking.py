"""``predicted_ranking``: the static cost model's order of each kernel's configs at every shape.

It needs no GPU: it reads the configs ``static_resources`` compiled (from the same compile
cache) and ranks them (``kernaudit_pipeline.rank.predict_frame``). Every row is
``data_kind = predicted``; the decisions fall back on it when no measurement exists, and the
report shows it next to measured rows.
"""


import pandas as pd
from dagster import AssetExecutionContext, MetadataValue, asset

from kernaudit_pipeline.defs.metadata import table
from kernaudit_pipeline.defs.resources import AuditSettings


@asset(group_name="static", description="Configs ranked by the static cost model at every shape, with no "
       "GPU: predicted_us, predicted_rank, the model's stated error; data_kind = predicted.")
def predicted_ranking(context: AssetExecutionContext, settings: AuditSettings,
                      static_resources: pd.DataFrame) -> pd.DataFrame:
    from kernaudit_pipeline.rank.frame import PREDICTION_COLUMNS, predict_frame

    if not settings.static_enabled or static_resources.empty:
        context.log.info("no static audit, so no predicted ranking")
        return pd.DataFrame(columns=PREDICTION_COLUMNS)
    frame = predict_frame(static_resources, timeout_s=settings.static_timeout_s,
                          cache_dir=settings.paths().static_cache)
    picks = frame[frame["predicted_rank"] == 1]
    context.add_output_metadata({
        "rows": len(frame),
        "ranked": int(frame["predicted_us"].notna().sum()),
        "dropped": int(frame["dropped_reason"].notna().sum()),
        "data_kind": "predicted",
        "stated_error": MetadataValue.float(float(frame["stated_error"].max()) if len(frame) else 0.0),
        "predicted_picks": table(picks, ["kernel_name", "shape_name", "config_id", "predicted_us", "bound",
                                         "occupancy_limiter"]),
    })
    return frame


@asset(group_name="analysis", description="The predicted ranking next to the measured rows of the same configs: "
       "measured rank, the prediction on the measurement's scale, and a flag where the two disagree by more "
       "than the model's stated error.")
def predicted_vs_measured(context: AssetExecutionContext, predicted_ranking: pd.DataFrame,
                          kernel_runs: pd.DataFrame) -> pd.DataFrame:
    from kernaudit_pipeline.rank.frame import compare_with_measured

    frame = compare_with_measured(predicted_ranking, kernel_runs)
    flagged = frame[frame["disagrees"].astype(bool)] if len(frame) else frame
    context.add_output_metadata({
        "compared": len(frame),
        "disagreements": len(flagged),
        "flagged": table(flagged.sort_values("disagreement", key=abs, ascending=False) if len(flagged) else flagged,
                         ["kernel_name", "shape_name", "config_id", "predicted_rank", "measured_rank",
                          "disagreement", "stated_error"]),
    })
    return frame
