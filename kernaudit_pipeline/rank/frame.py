"""The pipeline's view of the ranking: frames the audit, the decisions and the report read.

- :func:`predict_frame` ranks the configs the static audit compiled (``static_resources``'s
  frame), every shape of each kernel, with no GPU: one row per (kernel, shape, config) with
  ``predicted_us``, ``predicted_rank`` and ``data_kind = predicted``. Dropped configs keep a row
  with their reason and no prediction.
- :func:`compare_with_measured` puts the prediction next to measured rows and flags where the
  two disagree by more than the model's stated error, after putting the prediction on the
  measurement's scale (the median measured/predicted ratio of the group: a ranking predicts
  order, not the GPU's clock of the day).
"""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from kernaudit_pipeline.core.verdicts import DataKind
from kernaudit_pipeline.rank.model import Calibration, load_calibration
from kernaudit_pipeline.rank.ranking import DEFAULT_DEVICE, ShapeRanking, rank_kernels

PREDICTION_COLUMNS = [
    "kernel_name", "shape_name", "config_id", "device_name", "predicted_us", "predicted_rank",
    "relative_to_best", "within_error_of_best", "bound", "registers_per_thread",
    "spill_stores_bytes", "shared_mem_bytes", "blocks_per_sm", "occupancy_pct",
    "occupancy_limiter", "programs", "waves", "stated_error", "memory_bound", "dropped_reason",
    "data_kind",
]


def rankings_frame(rankings: list[ShapeRanking]) -> pd.DataFrame:
    rows = []
    for sr in rankings:
        common = {"kernel_name": sr.kernel_name, "shape_name": sr.shape_name,
                  "device_name": sr.device_name, "stated_error": sr.stated_error,
                  "memory_bound": sr.memory_bound, "data_kind": DataKind.PREDICTED.value}
        for r in sr.ranked:
            rec = asdict(r)
            rec.pop("config")
            rows.append({**common, **rec, "dropped_reason": None})
        for d in sr.dropped:
            rows.append({**common, "config_id": d.config_id, "dropped_reason": d.reason})
    return pd.DataFrame(rows, columns=PREDICTION_COLUMNS)


def predict_frame(static_frame: pd.DataFrame, *, device_name: str = DEFAULT_DEVICE,
                  timeout_s: float = 300.0, max_workers: int | None = None,
                  calibration: Calibration | None = None, cache_dir: Path | None = None) -> pd.DataFrame:
    """Rank, at every shape, the configs ``static_frame`` holds for each of its kernels.

    The kernel modules are described in workers (never imported here); the compiles come from
    the static audit's cache (shapes that specialize alike share one), so this adds little to
    an audit that already ran the static stage."""
    if static_frame is None or static_frame.empty or "kernel_name" not in static_frame:
        return pd.DataFrame(columns=PREDICTION_COLUMNS)
    configs = {k: sorted(set(g["config_id"])) for k, g in static_frame.groupby("kernel_name")}
    report = rank_kernels(list(configs), device_name=device_name, timeout_s=timeout_s,
                          max_workers=max_workers, calibration=calibration or load_calibration(),
                          configs=configs, cache_dir=cache_dir)
    return rankings_frame(report.rankings)


def compare_with_measured(predicted: pd.DataFrame, runs: pd.DataFrame,
                          stated_error: float | None = None) -> pd.DataFrame:
    """One row per predicted config that was also measured (``run_status`` OK, a latency, not
    modelled):
    ``measured_us``, ``measured_rank``, ``predicted_on_measured_scale_us``, the relative
    ``disagreement`` and ``disagrees`` (beyond the stated error). Grouped by kernel, shape and,
    when the runs carry it, device."""
    columns = ["kernel_name", "shape_name", "config_id", "predicted_us", "predicted_rank",
               "measured_us", "measured_rank", "predicted_on_measured_scale_us", "disagreement",
               "disagrees", "stated_error", "data_kind"]
    if predicted.empty or runs.empty or "latency_us" not in runs or "config_id" not in runs:
        return pd.DataFrame(columns=columns)
    keep = runs["latency_us"].notna()
    if "run_status" in runs:
        keep &= runs["run_status"] == "OK"
    if "data_kind" in runs:  # modelled (synthetic) rows are no measurement
        keep &= runs["data_kind"].fillna(DataKind.MEASURED.value) == DataKind.MEASURED.value
    measured = runs[keep]
    keys = ["kernel_name", "shape_name", "config_id"]
    measured = measured.groupby(keys, as_index=False)["latency_us"].median()
    pred = predicted[predicted["predicted_us"].notna()]
    both = pred.merge(measured, on=keys).rename(columns={"latency_us": "measured_us"})
    out = []
    for _, g in both.groupby(["kernel_name", "shape_name"]):
        g = g.copy()
        err = stated_error if stated_error is not None else float(g["stated_error"].iloc[0])
        scale = math.exp(float((g["measured_us"].map(math.log) - g["predicted_us"].map(math.log)).median()))
        g["predicted_on_measured_scale_us"] = g["predicted_us"] * scale
        g["disagreement"] = g["measured_us"] / g["predicted_on_measured_scale_us"] - 1.0
        g["disagrees"] = g["disagreement"].abs() > err
        g["measured_rank"] = g["measured_us"].rank(method="min").astype(int)
        g["stated_error"] = err
        out.append(g)
    frame = pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=columns)
    frame["data_kind"] = DataKind.PREDICTED.value
    return frame[columns]
