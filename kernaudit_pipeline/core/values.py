"""Reading cells that mix None, NaN, pandas NA and numpy scalars, and cleaning JSON.

One place for it, because ``bool(pd.NA)`` raises and ``float("nan")`` is truthy: each stage
used to carry its own copy of these. Standard library only (pandas' NA is recognised by its
type name), so the GPU runner, which has no pandas, uses the same readers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping


def is_missing(value: object) -> bool:
    """None, NaN, pandas NA/NaT: a cell with nothing in it."""
    if value is None:
        return True
    if isinstance(value, float):
        return math.isnan(value)
    name = type(value).__name__
    if name in ("NAType", "NaTType"):
        return True
    if name.startswith("float") and hasattr(value, "item"):  # numpy floating scalars
        return math.isnan(float(value))
    return False


def finite_float(value: object) -> float | None:
    """A finite float, or None for anything missing, non-numeric, boolean or not finite."""
    if value is None or isinstance(value, bool) or type(value).__name__ == "bool_":
        return None
    try:
        f = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return f if math.isfinite(f) else None


def as_int(value: object) -> int | None:
    f = finite_float(value)
    return None if f is None else int(round(f))


def plain(value: object) -> object:
    """None for missing values, Python scalars for numpy ones."""
    if is_missing(value):
        return None
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            return value.item()
        except (ValueError, TypeError):
            return value
    return value


def json_safe(value: object) -> object:
    """A value ``json.dumps`` writes as strict JSON: NaN/inf/NA become None, numpy scalars
    Python ones, tuples and sets lists, mapping keys strings."""
    value = plain(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return [json_safe(v) for v in items]
    if hasattr(value, "tolist"):  # numpy arrays
        return json_safe(value.tolist())
    return value
