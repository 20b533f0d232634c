"""Reading cells of frames that mix None, NaN, pandas NA and numpy scalars.

One place for it, because ``bool(pd.NA)`` raises and ``float("nan")`` is
truthy: each stage used to carry its own copy of these.
"""

from __future__ import annotations

import math

import pandas as pd


def finite_float(value: object) -> float | None:
    """A finite float, or None for anything missing, non-numeric or NaN."""
    if value is None or isinstance(value, bool):
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def as_int(value: object) -> int | None:
    f = finite_float(value)
    return None if f is None else int(round(f))


def plain(value: object) -> object:
    """None for missing values, Python scalars for numpy ones."""
    if value is None or value is pd.NA:
        return None
    if isinstance(value, float) and math.isnan(value):
        return None
    if hasattr(value, "item"):
        return value.item()
    return value
