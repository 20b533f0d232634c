"""The spill → stall chain, shown per spilling config against the same tile without spills.

For every candidate row with spill evidence (``spill_detected``), the chain reads:

    spill bytes per thread (ptxas) → local-memory traffic (ncu: bytes, spilling requests)
    → lg_throttle and long_scoreboard stall shares → does the spill cause the stalls?

and sets beside it the *clean twin*: the same tile (kernel, shape, device and every
meta-parameter of the config id but ``num_warps``/``num_stages``: BLOCK_M/N/K, GROUP_M,
PARTITION_SIZE ...) with other warps or stages that does not spill, preferring one that was profiled
too, then the same stages, then the nearest warp count. The verdict itself
(``spill_causes_stalls``) is the spill_diagnostics stage's; this module only lines the
numbers up so a reader sees the cause and the control side by side.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from kernaudit_pipeline.audit_report.formatting import col, fmt_num, is_blank
from kernaudit_pipeline.core.configs import parse_config_id

GROUP_KEYS = ("kernel_name", "shape_name", "device_name")
LAUNCH_KEYS = ("num_warps", "num_stages")
CHAIN_COLUMNS = ("kernel_name", "shape_name", "device_name", "config_id", "num_warps", "num_stages",
                 "registers_per_thread", "spill_stores_bytes", "spill_loads_bytes", "stack_frame_bytes",
                 "local_memory_bytes", "local_spill_requests", "stall_lg_throttle_pct", "stall_long_scoreboard_pct",
                 "spill_causes_stalls", "status", "run_status", "speedup", "latency_us")


@dataclass(frozen=True)
class Twin:
    config_id: str
    num_warps: float | None
    num_stages: float | None
    profiled: bool
    local_memory_bytes: float | None
    stall_lg_throttle_pct: float | None
    stall_long_scoreboard_pct: float | None
    speedup: float | None
    status: str | None


def _key(row: pd.Series) -> tuple | None:
    """(kernel, shape, device, the tile's meta-parameters); None when the config id does not parse."""
    params = parse_config_id(row.get("config_id"))
    if not params:
        return None
    tile = tuple(sorted((k, v) for k, v in params.items() if k not in LAUNCH_KEYS))
    return (*("" if is_blank(row.get(k)) else str(row.get(k)) for k in GROUP_KEYS), tile)


def _num(value: object) -> float | None:
    return None if is_blank(value) else float(value)


def clean_twins(diag: pd.DataFrame) -> dict[int, Twin]:
    """For each spilling row (by index), its best non-spilling same-tile config, when one exists."""
    if diag.empty or "spill_detected" not in diag or "config_id" not in diag:
        return {}
    spills = diag["spill_detected"].fillna(False).astype(bool)
    clean = diag[~spills & diag["config_id"].notna()]
    by_tile: dict[tuple, list[pd.Series]] = {}
    for _, row in clean.iterrows():
        by_tile.setdefault(_key(row), []).append(row)
    out: dict[int, Twin] = {}
    for index, row in diag[spills].iterrows():
        key = _key(row)
        options = by_tile.get(key) if key is not None else None
        if not options:
            continue

        def rank(other: pd.Series) -> tuple:
            profiled = not is_blank(other.get("stall_lg_throttle_pct"))
            same_stages = other.get("num_stages") == row.get("num_stages")
            warps = abs((_num(other.get("num_warps")) or 0) - (_num(row.get("num_warps")) or 0))
            return (not profiled, not same_stages, warps, str(other.get("config_id")))

        best = min(options, key=rank)
        out[index] = Twin(
            config_id=str(best.get("config_id")), num_warps=_num(best.get("num_warps")),
            num_stages=_num(best.get("num_stages")), profiled=not is_blank(best.get("stall_lg_throttle_pct")),
            local_memory_bytes=_num(best.get("local_memory_bytes")),
            stall_lg_throttle_pct=_num(best.get("stall_lg_throttle_pct")),
            stall_long_scoreboard_pct=_num(best.get("stall_long_scoreboard_pct")),
            speedup=_num(best.get("speedup")), status=None if is_blank(best.get("status")) else str(best.get("status")))
    return out


def fmt_bytes(value: object) -> str:
    """Bytes with a decimal unit: 9.95 GB, 784 B."""
    if is_blank(value):
        return "–"
    value = float(value)
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value:,.0f} B"


def chain_sentence(row: pd.Series, twin: Twin | None) -> str:
    """One line: spill bytes → local traffic → stall shares, then the clean twin's numbers."""
    spill = _num(row.get("spill_stores_bytes")) or _num(row.get("stack_frame_bytes")) or 0
    parts = [f"{fmt_num(spill, 0)} B/thread spilled"]
    if not is_blank(row.get("local_memory_bytes")):
        parts.append(f"{fmt_bytes(row.get('local_memory_bytes'))} local-memory traffic "
                     f"({fmt_num(_num(row.get('local_spill_requests')) or 0, 0)} spilling requests)")
    else:
        parts.append("local-memory traffic not profiled")
    if not is_blank(row.get("stall_lg_throttle_pct")):
        parts.append(f"lg_throttle {float(row['stall_lg_throttle_pct']):.1f} %, long_scoreboard "
                     f"{float(row.get('stall_long_scoreboard_pct') or 0):.1f} % of stalls")
    text = " → ".join(parts)
    if twin is not None:
        warps = "?" if twin.num_warps is None else f"{twin.num_warps:.0f}"
        stages = "?" if twin.num_stages is None else f"{twin.num_stages:.0f}"
        text += f"; same tile without spills ({twin.config_id}, {warps} warps, {stages} stages)"
        if twin.profiled:
            text += (f": {fmt_bytes(twin.local_memory_bytes)} local, lg_throttle {twin.stall_lg_throttle_pct:.1f} %, "
                     f"long_scoreboard {twin.stall_long_scoreboard_pct or 0:.1f} %")
        elif twin.speedup is not None:
            text += f": not profiled, speedup {twin.speedup:.3f}×"
        else:
            text += ": not profiled"
    else:
        text += "; no same-tile config without spills in this audit"
    return text


def spill_rows(diag: pd.DataFrame) -> pd.DataFrame:
    """Every spilling candidate row, worst spill first, with its clean twin and its chain sentence."""
    if diag.empty or "spill_detected" not in diag:
        return pd.DataFrame(columns=[*CHAIN_COLUMNS, "twin_config_id", "twin_lg_throttle_pct", "chain"])
    spills = diag[diag["spill_detected"].fillna(False).astype(bool)]
    twins = clean_twins(diag)
    out = spills.reindex(columns=list(CHAIN_COLUMNS)).copy()
    out["profiled"] = col(spills, "stall_lg_throttle_pct").notna()
    out["twin_config_id"] = [twins[i].config_id if i in twins else None for i in spills.index]
    out["twin_lg_throttle_pct"] = [twins[i].stall_lg_throttle_pct if i in twins else None for i in spills.index]
    out["twin_long_scoreboard_pct"] = [twins[i].stall_long_scoreboard_pct if i in twins else None
                                       for i in spills.index]
    out["twin_speedup"] = [twins[i].speedup if i in twins else None for i in spills.index]
    out["chain"] = [chain_sentence(row, twins.get(i)) for i, row in spills.iterrows()]
    spill_bytes = col(out, "spill_stores_bytes").fillna(col(out, "stack_frame_bytes")).fillna(0)
    return out.assign(_order=spill_bytes).sort_values(["profiled", "_order"], ascending=[False, False]).drop(
        columns="_order").reset_index(drop=True)
