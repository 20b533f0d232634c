"""Frames the charts and tables are drawn from: best config per group, memory footprint, roofline."""

from __future__ import annotations

import pandas as pd

from kernaudit_pipeline.audit_report.formatting import col


def best_per_group(diag: pd.DataFrame) -> pd.DataFrame:
    """The fastest correct, timed config per (kernel, shape, device)."""
    timed = diag[(diag["latency_us"].notna()) & (diag["status"] != "FAILED")]
    if timed.empty:
        return timed
    keys = ["kernel_name", "shape_name", "device_name"]
    idx = timed.fillna({"shape_name": "", "device_name": ""}).groupby(keys)["latency_us"].idxmin()
    return timed.loc[idx.values].sort_values(keys)



def _occupancy_for(row: pd.Series) -> float | None:
    """Theoretical occupancy of a static row (diagnostics carry it for measured rows)."""
    from kernaudit_pipeline.core.hardware import sm_resources
    from kernaudit_pipeline.spill_diagnostics.occupancy import theoretical_occupancy

    sm = sm_resources(row.get("compute_capability") or "9.0")
    regs, smem = row.get("registers_per_thread"), row.get("shared_mem_bytes")
    threads = row.get("threads_per_block")
    if (threads is None or pd.isna(threads)) and pd.notna(row.get("num_warps")):
        threads = int(row["num_warps"]) * 32
    if sm is None or any(v is None or pd.isna(v) for v in (regs, threads)):
        return None
    try:
        return theoretical_occupancy(sm, registers_per_thread=int(regs), threads_per_block=int(threads),
                                     shared_mem_bytes=int(0 if smem is None or pd.isna(smem) else smem)).occupancy_pct
    except ValueError:
        return None


def footprint_frame(static: pd.DataFrame | None, diag: pd.DataFrame) -> pd.DataFrame:
    """One row per (kernel, config): the static compile first, else the runs."""
    parts = []
    if static is not None and len(static) and "registers_per_thread" in static:
        ok = static[static["status"].astype(str) == "OK"] if "status" in static else static
        parts.append(ok.assign(footprint_source="static compile"))
    if len(diag):
        parts.append(diag.assign(footprint_source="runs"))
    parts = [p.dropna(axis=1, how="all") for p in parts]
    if not parts:
        return pd.DataFrame()
    frame = pd.concat(parts, ignore_index=True, sort=False)
    frame = frame[frame["config_id"].notna() & col(frame, "registers_per_thread").notna()].copy()
    # The same config can carry differently spelled ids (static compile vs a trace): key on its parameters.
    params = [c for c in ("block_m", "block_n", "block_k", "group_m", "num_warps", "num_stages") if c in frame]
    by_params = pd.concat([col(frame, c) for c in params], axis=1).astype(str).agg("|".join, axis=1) if params else None
    has_params = col(frame, "block_m").notna() if "block_m" in frame else pd.Series(False, index=frame.index)
    frame["_config_key"] = frame["config_id"].astype(str)
    if by_params is not None:
        frame.loc[has_params, "_config_key"] = by_params[has_params]
    frame = frame.drop_duplicates(["kernel_name", "_config_key"]).drop(columns="_config_key")
    occ = pd.to_numeric(col(frame, "occupancy_pct"), errors="coerce").astype(float)
    missing = occ.isna()
    if missing.any():  # None where the spec table does not know the device: NaN in a float column
        occ.loc[missing] = pd.to_numeric(pd.Series([_occupancy_for(r) for _, r in frame[missing].iterrows()],
                                                   index=occ.index[missing], dtype=object), errors="coerce")
    frame["occupancy_pct"] = pd.to_numeric(occ, errors="coerce").astype(float)
    order = [c for c in ("kernel_name", "block_m", "block_n", "block_k", "num_warps", "num_stages", "config_id")
             if c in frame]
    return frame.sort_values(order, na_position="last").reset_index(drop=True)



def roofline_frame(diag: pd.DataFrame) -> pd.DataFrame:
    """Timed rows with arithmetic intensity (FLOP/byte) and achieved TFLOP/s.

    Taken from the diagnostics when they carry them, else computed from
    flops, bytes_moved and latency_us.
    """
    out = diag.copy()
    ai, tf = col(out, "arithmetic_intensity"), col(out, "achieved_tflops")
    flops, moved, lat = col(out, "flops"), col(out, "bytes_moved"), col(out, "latency_us")
    out["arithmetic_intensity"] = ai.fillna(flops / moved.where(moved > 0))
    out["achieved_tflops"] = tf.fillna(flops / (lat.where(lat > 0) * 1e-6) / 1e12)
    out = out[(out["arithmetic_intensity"] > 0) & (out["achieved_tflops"] > 0)]
    if "compute_ceiling_tflops" not in out or "bandwidth_ceiling_gb_per_s" not in out:
        from kernaudit_pipeline.core.hardware import lookup

        def _ceil(row: pd.Series) -> tuple[float | None, float | None]:
            spec = lookup(row.get("device_name"))
            if spec is None:
                return None, None
            return spec.peak_tflops_for(row.get("dtype")), spec.mem_bandwidth_gb_per_s

        pairs = [_ceil(r) for _, r in out.iterrows()]
        out["compute_ceiling_tflops"] = [p[0] for p in pairs]
        out["bandwidth_ceiling_gb_per_s"] = [p[1] for p in pairs]
    return out

