"""Text and number helpers of the report: escaping, formatting, JSON-safe records.

Every string that comes from a trace is escaped before it is shown: by Jinja's
autoescape in the HTML, by :func:`md_escape` in Markdown, and by :func:`esc`
before it reaches a plotly text field (plotly renders a subset of HTML in
labels and hover text). Standard library plus pandas only, so that other stages
can use :func:`md_escape` without importing plotly.
"""

from __future__ import annotations

import html
import math
from dataclasses import asdict, is_dataclass
from enum import Enum
from types import MappingProxyType

import pandas as pd

from kernaudit_pipeline.core.values import is_missing


def md_escape(value: object) -> str:
    """Neutralize Markdown/HTML metacharacters in trace-provided strings."""
    text = "" if value is None else str(value)
    for ch in "\\`*_{}[]<>|#":
        text = text.replace(ch, "\\" + ch)
    return text.replace("\n", " ")


def is_blank(value: object) -> bool:
    """None, NaN, NA: nothing to show (core.values.is_missing)."""
    return is_missing(value)


def esc(value: object) -> str:
    """A trace-provided string made inert for plotly's pseudo-HTML text fields."""
    if is_blank(value):
        return ""
    return html.escape(str(value), quote=True)


def fmt_num(value: object, digits: int = 2) -> str:
    """Thousands separators for large integers, ``digits`` decimals otherwise, "–" for missing."""
    if is_blank(value):
        return "–"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) >= 1000):
        return f"{int(value):,}"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def fmt_ci(low: object, high: object, digits: int = 3) -> str:
    """``[low, high]``, or "" when either end is missing."""
    if is_blank(low) or is_blank(high):
        return ""
    return f"[{fmt_num(float(low), digits)}, {fmt_num(float(high), digits)}]"


def jsonable(value: object) -> object:
    """Dataclasses, enums, mappings, numpy scalars and NaN made JSON-ready."""
    if hasattr(value, "to_json") and callable(value.to_json) and is_dataclass(value):
        return jsonable(value.to_json())
    if is_dataclass(value) and not isinstance(value, type):
        return jsonable(asdict(value))
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (dict, MappingProxyType)):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return None
    if value is pd.NA:
        return None
    if hasattr(value, "item"):
        return jsonable(value.item())
    return value


def records(frame: pd.DataFrame) -> list[dict]:
    """A frame as a list of JSON-ready dicts (NaN, NA and NaT as None).

    Cell by cell from ``to_dict``: converting a wide frame with ``astype(object)`` first cost
    about 60 ms even for one row, and the report asks for one row per decision (hundreds on
    foreign traces)."""
    return [{str(k): None if is_missing(v) else jsonable(v) for k, v in row.items()}
            for row in frame.to_dict("records")]


def col(frame: pd.DataFrame, name: str) -> pd.Series:
    """A numeric column, all-NaN when the frame lacks it (diagnostics vary by source)."""
    if name in frame:
        return pd.to_numeric(frame[name], errors="coerce").astype(float)
    return pd.Series(float("nan"), index=frame.index)


def slug(*parts: object) -> str:
    """An HTML id fragment: letters and digits, the rest as dashes."""
    text = "-".join(str(p) for p in parts)
    return "".join(ch if ch.isalnum() else "-" for ch in text).strip("-").lower()[:80] or "x"
