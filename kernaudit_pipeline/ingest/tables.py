"""Ingest straight to the output tables, batch by batch (what ``kernaudit ingest`` runs).

Each input is parsed, validated and appended to the tables one batch at a time, so a
million-line runner JSONL never sits in memory as a whole. Tables are first written as
``.*.partial`` files in the output folder and renamed into place by :meth:`TableWriter.commit`:
a run that fails half-way leaves no half-written tables behind.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from kernaudit_pipeline.ingest import (
    RULE_COLUMNS, FileSummary, SkippedFile, SourceFormat, display_path, iter_file, rows_frame, validate_frame, walk,
)
from kernaudit_pipeline.ingest.sources import IngestError, UnknownFormat
from kernaudit_pipeline.kernel_runs import _SCHEMA, COLUMNS, QUARANTINE_COLUMNS

_ARROW_TYPES = {"float64": pa.float64(), "Int64": pa.int64(), "boolean": pa.bool_(), "str": pa.string()}
ARROW_SCHEMA = pa.schema([(name, _ARROW_TYPES.get(str(col.dtype), pa.string()))
                          for name, col in _SCHEMA.columns.items()])


class TableWriter:
    """``kernel_runs.csv``, ``quarantine.csv``, ``ncu_rules.csv`` and ``peaks.csv`` in ``out``."""

    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self._runs_path = self.out / ".kernel_runs.csv.partial"
        self._quarantine_path = self.out / ".quarantine.csv.partial"
        self._runs = pacsv.CSVWriter(str(self._runs_path), ARROW_SCHEMA)
        pd.DataFrame(columns=list(QUARANTINE_COLUMNS)).to_csv(self._quarantine_path, index=False)
        self.rules: list[dict] = []
        self.peaks: list[dict] = []
        self.want_rules = False

    def write(self, runs: pd.DataFrame, quarantine: pd.DataFrame) -> None:
        if len(runs):
            self._runs.write_table(pa.Table.from_pandas(runs[list(COLUMNS)], schema=ARROW_SCHEMA,
                                                        preserve_index=False))
        if len(quarantine):
            quarantine.reindex(columns=list(QUARANTINE_COLUMNS)).to_csv(
                self._quarantine_path, mode="a", header=False, index=False)

    def commit(self) -> dict[str, Path]:
        self._runs.close()
        written = {"kernel_runs": self.out / "kernel_runs.csv", "quarantine": self.out / "quarantine.csv"}
        os.replace(self._runs_path, written["kernel_runs"])
        os.replace(self._quarantine_path, written["quarantine"])
        if self.want_rules or self.rules:
            written["ncu_rules"] = self.out / "ncu_rules.csv"
            pd.DataFrame(self.rules, columns=list(RULE_COLUMNS)).to_csv(written["ncu_rules"], index=False)
        if self.peaks:
            written["peaks"] = self.out / "peaks.csv"
            pd.DataFrame(self.peaks).drop(columns=["samples_us"], errors="ignore").to_csv(written["peaks"],
                                                                                          index=False)
        return written

    def discard(self) -> None:
        self._runs.close()
        for path in (self._runs_path, self._quarantine_path):
            path.unlink(missing_ok=True)


@dataclass
class FileReport:
    path: str
    source_format: str
    records_in: int = 0
    kept: int = 0
    quarantined: int = 0
    other_records: int = 0
    notes: list[str] = field(default_factory=list)

    def line(self) -> str:
        extra = f", {self.other_records} non-row records" if self.other_records else ""
        return (f"{self.path}: {self.source_format}: {self.kept} rows normalized, {self.quarantined} quarantined"
                f"{extra} ({self.records_in} records in)")


@dataclass
class IngestReport:
    files: list[FileReport] = field(default_factory=list)
    skipped: list[SkippedFile] = field(default_factory=list)
    rules: int = 0

    @property
    def kept(self) -> int:
        return sum(f.kept for f in self.files)

    @property
    def quarantined(self) -> int:
        return sum(f.quarantined for f in self.files)

    def lines(self) -> list[str]:
        return [f.line() for f in self.files] + [f"{s.path}: skipped ({s.reason})" for s in self.skipped]

    def to_json(self, written: dict[str, Path]) -> dict:
        return {"files": [{**f.__dict__, "notes": "; ".join(f.notes)} for f in self.files],
                "skipped": [s.__dict__ for s in self.skipped],
                "kernel_runs": self.kept, "quarantined": self.quarantined, "ncu_rules": self.rules,
                "written": {k: str(v) for k, v in written.items()}}

    def summaries(self) -> list[FileSummary]:
        return [FileSummary(f.path, f.source_format, f.kept, f.quarantined, f.other_records, f.records_in,
                            "; ".join(f.notes)) for f in self.files]


def ingest_to_tables(paths: list[Path], writer: TableWriter) -> IngestReport:
    report = IngestReport()
    for entry in walk([Path(p) for p in paths]):
        shown = display_path(entry.path)
        if entry.error is not None:
            report.skipped.append(SkippedFile(shown, entry.error))
            continue
        try:
            fmt, batches = iter_file(entry.path)
        except IngestError as exc:
            named = entry.explicit or not isinstance(exc, UnknownFormat)
            report.skipped.append(SkippedFile(shown, str(exc).removeprefix(f"{shown}: "), named=named))
            continue
        if fmt is SourceFormat.NCU_DETAILS:
            writer.want_rules = True
        current = FileReport(shown, str(fmt))
        try:
            for batch in batches:
                checked = validate_frame(rows_frame(batch))
                parse_q = pd.DataFrame(batch.quarantine, columns=list(QUARANTINE_COLUMNS))
                writer.write(checked.kernel_runs, pd.concat([parse_q, checked.quarantine], ignore_index=True)
                             if len(parse_q) else checked.quarantine)
                writer.rules += batch.rules
                writer.peaks += batch.peaks
                report.rules += len(batch.rules)
                current.records_in += batch.records_in
                current.kept += len(checked.kernel_runs)
                current.quarantined += len(batch.quarantine) + len(checked.quarantine)
                current.other_records += batch.other_records
                if batch.note and batch.note not in current.notes:
                    current.notes.append(batch.note)
        except IngestError as exc:
            report.skipped.append(SkippedFile(shown, f"read {current.records_in} records, then: "
                                                     f"{str(exc).removeprefix(f'{shown}: ')}"))
        report.files.append(current)
    return report
