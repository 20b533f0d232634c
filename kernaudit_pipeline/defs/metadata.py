"""Tables as Dagster metadata (``MetadataValue.table``): typed columns the UI can sort."""

from __future__ import annotations

import math
from enum import Enum

import pandas as pd
from dagster import MetadataValue, TableColumn, TableRecord, TableSchema

_TYPES = {"i": "int", "u": "int", "f": "float", "b": "bool"}


def _cell(value: object) -> str | int | float | bool | None:
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, Enum):  # Dagster serializes only plain values
        value = value.value
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (bool, int, float)):
        return value
    return str(value)


def table(frame: pd.DataFrame, columns: list[str] | None = None, *, limit: int = 25) -> MetadataValue:
    """The first ``limit`` rows of ``frame`` (only ``columns`` that it has) as a table value."""
    columns = [c for c in (columns or list(frame.columns)) if c in frame.columns]
    shown = frame[columns].head(limit)
    schema = TableSchema(columns=[TableColumn(name=c, type=_TYPES.get(shown[c].dtype.kind, "string"))
                                  for c in columns])
    rows = [TableRecord({c: _cell(v) for c, v in zip(columns, row)})
            for row in shown.itertuples(index=False, name=None)]
    return MetadataValue.table(records=rows, schema=schema)
