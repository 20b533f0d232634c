"""Nsight Compute reports (``.ncu-rep``), through Nsight Compute's own ``ncu_report`` module.

The report format is NVIDIA's binary; the only reader is the ``ncu_report`` Python module
that ships with Nsight Compute (``<install>/extras/python``). Where it can be imported (on
``sys.path``, under ``$NCU_REPORT_PATH``, or beside the ``ncu`` on ``PATH``), each profiled
launch ("action") becomes one row, read exactly as the raw CSV page is
(:func:`kernaudit_pipeline.ingest.ncu_raw.launch_row`: same metric names, same units).
Elsewhere the file is skipped with a one-line reason that says how to export the CSV.
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType

from kernaudit_pipeline.ingest._common import IngestError, Parsed, bad
from kernaudit_pipeline.ingest.ncu_raw import launch_row
from kernaudit_pipeline.ingest.units import BadValue

FORMAT = "ncu_rep"
EXPORT_HINT = ("export it with `ncu --import REPORT.ncu-rep --csv --page raw > REPORT.csv` "
               "and ingest the CSV")


def _candidates() -> list[Path]:
    out = []
    if os.environ.get("NCU_REPORT_PATH"):
        out.append(Path(os.environ["NCU_REPORT_PATH"]))
    ncu = shutil.which("ncu")
    if ncu:
        out.append(Path(ncu).resolve().parent / "extras" / "python")
    return out


def load_module() -> ModuleType | None:
    """``ncu_report``, or None where Nsight Compute's Python module is not installed."""
    try:
        return importlib.import_module("ncu_report")
    except ImportError:
        pass
    for folder in _candidates():
        if (folder / "ncu_report.py").is_file():
            sys.path.insert(0, str(folder))
            try:
                return importlib.import_module("ncu_report")
            except ImportError:
                continue
            finally:
                sys.path.remove(str(folder))
    return None


def _metric(action, name: str) -> tuple[str | None, str]:
    metric = action.metric_by_name(name)
    if metric is None:
        return None, ""
    unit = metric.unit() if hasattr(metric, "unit") else ""
    try:
        value = metric.as_string() if "display_name" in name else metric.as_double()
    except Exception:  # noqa: BLE001 - a metric ncu_report cannot convert is left out
        return None, unit
    return str(value), unit


def parse(path: Path, source_file: str) -> Parsed:
    module = load_module()
    if module is None:
        raise IngestError("an Nsight Compute report: reading it needs Nsight Compute's ncu_report Python module, "
                          f"not installed here; {EXPORT_HINT}")
    try:
        context = module.load_report(str(path))
    except Exception as exc:  # noqa: BLE001 - the vendor reader's errors, as one line
        raise IngestError(f"ncu_report could not load it ({type(exc).__name__}: {str(exc)[:100]})") from None
    rows: list[dict] = []
    quarantine: list[dict] = []
    index = 0
    for r in range(context.num_ranges()):
        rng = context.range_by_idx(r)
        for a in range(rng.num_actions()):
            action = rng.action_by_idx(a)
            prov = {"source_format": FORMAT, "source_file": source_file, "source_row": index}
            name = action.name()
            metrics: dict[str, str | None] = {}
            units: dict[str, str] = {}
            for metric_name in action.metric_names():
                metrics[metric_name], units[metric_name] = _metric(action, metric_name)
            fixed = {"ID": str(index), "Kernel Name": name}
            try:
                row = launch_row(metrics, units, fixed)
            except BadValue as exc:
                quarantine.append(bad({**prov, "kernel_name": name}, f"launch {index}: {exc}"))
            else:
                rows.append({**row, **prov})
            index += 1
    return Parsed(rows=rows, quarantine=quarantine, records_in=index, note=f"{index} launches via ncu_report")
