"""The ``spill_diagnostics`` stage: does a kernel spill, and does it hurt?

Static evidence is ptxas' spill store/load bytes (or a stack frame, which a
Triton kernel only has when it spills). Dynamic evidence is Nsight Compute's
local-memory spilling requests and the lg_throttle / long_scoreboard stall
shares. A row with no spill evidence is never flagged.
"""

from __future__ import annotations

import math

import pandas as pd


def _pos(value: object) -> bool:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return False
    return math.isfinite(f) and f > 0


def spill_detected(row: dict | pd.Series) -> bool:
    """Spills are detected from spill bytes (static) or local spill requests (ncu)."""
    get = row.get
    return any(_pos(get(col)) for col in ("spill_stores_bytes", "spill_loads_bytes", "local_spill_requests"))


def diagnose(comparisons: pd.DataFrame) -> pd.DataFrame:
    out = comparisons.copy()
    out["spill_detected"] = [spill_detected(row) for _, row in out.iterrows()]
    return out
