"""The ``raw_traces`` stage: gather every trace the audit will read.

With a GPU present (and allowed), the Dagster layer's runner steps time the
kernels now (``defs/bench_steps.py``) and their JSONL is read back with
:func:`read_files`. Without one, :func:`collect` reads the traces given, or the
committed sample traces: real H200 runs under ``samples/h200`` and the
synthetic attention tables under ``samples/synthetic``, and says so in the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import pandas as pd

from kernaudit_pipeline.ingest import FileSummary, display_path, ingest_paths
from kernaudit_pipeline.kernel_runs import COLUMNS, quarantine_row
from kernaudit_pipeline.settings import H200_SAMPLES_DIR, SYNTHETIC_DIR, DataPaths


class TraceMode(StrEnum):
    GPU_RUN = "gpu_run"
    COMMITTED_SAMPLES = "committed_samples"


@dataclass(frozen=True)
class RawTraces:
    """Rows not yet validated, plus everything else the traces carried."""

    mode: TraceMode
    mode_note: str
    rows: list[dict]
    quarantine: list[dict]
    files: list[FileSummary]
    rules: list[dict] = field(default_factory=list)
    peaks: list[dict] = field(default_factory=list)


def read_kernel_runs_csv(path: Path, source_format: str = "synthetic") -> list[dict]:
    """A CSV already in ``kernel_runs`` columns (the synthetic tables, or a
    previous ``kernaudit ingest`` output). Provenance is kept when present."""
    try:
        frame = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise ValueError(f"{display_path(path)}: not a readable CSV ({exc})") from None
    missing = {"kernel_name"} - set(frame.columns)
    if missing:
        raise ValueError(f"{display_path(path)}: not a kernel_runs table (missing {sorted(missing)})")
    rows = []
    unknown = sorted(set(frame.columns) - set(COLUMNS))
    for i, record in enumerate(frame.to_dict("records")):
        record = {k: (None if not isinstance(v, str) and pd.isna(v) else v) for k, v in record.items()}
        record.setdefault("source_format", source_format)
        record["source_format"] = record.get("source_format") or source_format
        record["source_file"] = record.get("source_file") or display_path(path)
        record["source_row"] = i if record.get("source_row") is None else record["source_row"]
        if unknown:
            record = {k: v for k, v in record.items() if k not in unknown}
        rows.append(record)
    return rows


def _blank(value: object) -> bool:
    return isinstance(value, float) and value != value


# The committed H200 capture the embedded default audits. Left out on purpose:
# ncu_raw_nvtx_named.csv (the same launches as ncu_raw.csv, named by NVTX range),
# bench_h200_gemm_noprune.jsonl (the pruning comparison of docs/benchmarks.md,
# which repeats gemm rows) and the capture's logs and manifests.
H200_DEFAULT_INPUTS = ("bench_h200.jsonl", "ncu_raw.csv", "ncu_details.csv", "torch_trace.json",
                       "proton.hatchet", "ptxas", "triton_cache")


def default_sample_files(include_synthetic: bool = True) -> list[Path]:
    files = [H200_SAMPLES_DIR / name for name in H200_DEFAULT_INPUTS if (H200_SAMPLES_DIR / name).exists()]
    if include_synthetic:
        files += sorted(SYNTHETIC_DIR.glob("*.csv"))
    return files


def collect(paths: DataPaths, *, sources: list[str] | None = None, include_synthetic: bool = True) -> RawTraces:
    """The traces given, else the committed samples (no runner here: see the module docstring)."""
    files: list[Path]
    if sources:
        files = [Path(s) for s in sources]
        mode, note = TraceMode.COMMITTED_SAMPLES, "traces given explicitly: " + ", ".join(map(display_path, files))
    else:
        files = default_sample_files(include_synthetic)
        mode = TraceMode.COMMITTED_SAMPLES
        note = ("no GPU here: this audit uses the real static compile plus the committed sample traces "
                "(real H200 runs in samples/h200) and the synthetic attention tables (samples/synthetic, "
                "modelled, not measured)")
    traces = read_files(files, mode, note)
    if sources and traces.files and all(f.source_format == "skipped" for f in traces.files):
        first = traces.files[0]
        raise NoReadableSource(f"no trace given could be read ({first.path}: {first.note})")
    return traces


class NoReadableSource(ValueError):
    """Every trace named for the audit was unreadable: there is nothing to audit."""


def read_files(files: list[Path], mode: TraceMode, note: str) -> RawTraces:
    rows: list[dict] = []
    quarantine: list[dict] = []
    summaries: list[FileSummary] = []
    rules: list[dict] = []
    peaks: list[dict] = []
    other: list[Path] = []
    for path in files:
        if path.suffix == ".csv" and path.parent.resolve() == SYNTHETIC_DIR.resolve():
            got = read_kernel_runs_csv(path)
            rows += got
            summaries.append(FileSummary(display_path(path), "synthetic", len(got), 0, 0, len(got)))
        else:
            other.append(path)
    if other:
        result = ingest_paths(other)
        rows += [{k: (None if _blank(v) else v) for k, v in r.items()} for r in result.rows.to_dict("records")]
        quarantine += list(result.quarantine)
        rules += list(result.rules)
        peaks += list(result.peaks)
        summaries += list(result.summaries)
        # an input that could not be read is listed beside the others, with its reason
        summaries += [FileSummary(s.path, "skipped", 0, 0, 0, 0, note=s.reason) for s in result.skipped]
    return RawTraces(mode=mode, mode_note=note, rows=rows, quarantine=quarantine, files=summaries,
                     rules=rules, peaks=peaks)


__all__ = ["RawTraces", "TraceMode", "FileSummary", "collect", "read_files", "quarantine_row"]
