"""Profiler and benchmark files into ``kernel_runs`` rows (the library behind ``kernaudit ingest``).

Formats, detected from content (not from the file name), plain or gzipped:

- Nsight Compute ``--csv --page raw`` (``ncu_raw``) and ``--page details`` (``ncu_details``),
  ncu 2019 to 2025; ``.ncu-rep`` reports where Nsight Compute's ``ncu_report`` module is
  installed (``ncu_rep``)
- torch.profiler chrome traces (``torch_trace``), Proton hatchet JSON (``proton``)
- ptxas ``-v`` logs (``ptxas_log``), Triton cache directories (``triton_cache``)
- the GPU runner's JSONL (``runner_jsonl``) and seed-format JSON (``seed_json``)

One bad input never hides the rest: a file that cannot be read (missing, a FIFO or device,
a symlink loop, binary, not UTF-8, garbled, of no known format) is listed as skipped with its
reason and the others are ingested. A Triton cache directory is read as a whole; any other
directory is walked (hidden files, READMEs and Markdown left out; symlinked directories are
followed once). Every row carries its provenance (format, file as given or relative to the
working directory, 0-based record index); a record that cannot become a row goes to
quarantine with the reason, so records in = kept + quarantined + non-row, per file.

Rows of a kernel that matches no module in ``kernels/`` are keyed and paired as foreign
candidates (:mod:`.foreign`). :func:`ingest_paths` is the library entry the ``raw_traces``
asset calls; validation is the separate :func:`validate` step; :func:`iter_file` streams one
file in batches for the command (``kernaudit_pipeline.cli.ingest``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path

import pandas as pd

from kernaudit_pipeline.ingest import (
    foreign, ncu_details, ncu_raw, ncu_rep, proton, ptxas_log, runner_jsonl, seed_json, torch_trace,
    triton_cache,
)
from kernaudit_pipeline.ingest._common import Parsed
from kernaudit_pipeline.ingest.sources import (
    IngestError, UnknownFormat, check_path, decode_text, head_bytes, read_json,
)
from kernaudit_pipeline.kernel_runs import (
    COLUMNS, QUARANTINE_COLUMNS, Normalized, empty_quarantine, normalize, records_frame,
)

RULE_COLUMNS = ("kernel_name", "profiler_kernel_name", "launch_id", "section", "rule_name", "rule_type",
                "description", "estimated_speedup_type", "estimated_speedup_pct",
                "source_format", "source_file", "source_row")
VALIDATE_CHUNK_ROWS = 100_000


class SourceFormat(StrEnum):
    NCU_RAW = "ncu_raw"
    NCU_DETAILS = "ncu_details"
    NCU_REP = "ncu_rep"
    TORCH_TRACE = "torch_trace"
    PROTON = "proton"
    PTXAS_LOG = "ptxas_log"
    TRITON_CACHE = "triton_cache"
    RUNNER_JSONL = "runner_jsonl"
    SEED_JSON = "seed_json"


# Formats whose rows may be kernels of someone else's (keyed and paired by .foreign).
PROFILER_FORMATS = frozenset({SourceFormat.NCU_RAW, SourceFormat.NCU_DETAILS, SourceFormat.NCU_REP,
                              SourceFormat.TORCH_TRACE, SourceFormat.PROTON, SourceFormat.PTXAS_LOG,
                              SourceFormat.TRITON_CACHE})


@dataclass(frozen=True)
class FileSummary:
    path: str
    source_format: str
    rows: int  # rows parsed (before schema validation)
    quarantined: int  # records the parser could not turn into rows
    other_records: int  # non-row records, accounted for (peaks, summaries, non-kernel events ...)
    records_in: int  # the file's records in its own unit
    note: str = ""


@dataclass(frozen=True)
class SkippedFile:
    path: str
    reason: str
    named: bool = True  # named by the user (or garbled), not a stray file met in a directory


@dataclass(frozen=True)
class IngestResult:
    rows: pd.DataFrame  # kernel_runs columns (plus provenance), not yet validated
    quarantine: tuple[dict, ...]
    rules: tuple[dict, ...]
    peaks: tuple[dict, ...]
    summaries: tuple[FileSummary, ...]
    skipped: tuple[SkippedFile, ...] = ()


def display_path(path: Path) -> str:
    """The path as given when relative, else relative to the working directory; never absolute."""
    if not path.is_absolute():
        return path.as_posix()
    for base in (Path.cwd(), Path(__file__).resolve().parents[2]):
        try:
            return path.resolve().relative_to(base.resolve()).as_posix()
        except (ValueError, OSError, RuntimeError):
            continue
    return path.name


def _sniff(path: Path) -> tuple[SourceFormat, object | None]:
    """The format, and the parsed JSON when sniffing had to parse it anyway."""
    if check_path(path) == "dir":
        if triton_cache.is_cache_dir(path):
            return SourceFormat.TRITON_CACHE, None
        raise UnknownFormat("a directory that is not a Triton cache")
    if path.name.endswith(".ncu-rep"):
        return SourceFormat.NCU_REP, None
    head = head_bytes(path)
    if not head.strip():
        raise UnknownFormat("empty file")
    if b"\x00" in head:
        raise UnknownFormat("binary file, not a known text format")
    text = decode_text(head, partial=True)
    stripped = text.lstrip()
    if stripped[:1] in ("[", "{"):
        first_line = stripped.splitlines()[0] if stripped else ""
        if stripped[:1] == "{" and runner_jsonl.looks_like(first_line):
            return SourceFormat.RUNNER_JSONL, None
        data = read_json(path)
        if torch_trace.is_torch_trace(data):
            return SourceFormat.TORCH_TRACE, data
        if proton.is_proton(data):
            return SourceFormat.PROTON, data
        if seed_json.is_seed(data):
            return SourceFormat.SEED_JSON, data
        raise UnknownFormat("JSON that is no known trace (not a torch.profiler trace, a Proton tree or seed items)")
    if ptxas_log.looks_like(text):
        return SourceFormat.PTXAS_LOG, None
    for line in text.splitlines()[:200]:
        cells = line.strip()
        if cells.startswith('"ID"') and '"Kernel Name"' in cells:
            return (SourceFormat.NCU_DETAILS if '"Metric Name"' in cells and '"Metric Value"' in cells
                    else SourceFormat.NCU_RAW), None
    raise UnknownFormat("unrecognized format (expected Nsight Compute CSV or .ncu-rep, torch.profiler trace, "
                        "Proton hatchet, ptxas -v log, Triton cache directory, runner JSONL or seed JSON)")


def detect_format(path: Path) -> SourceFormat:
    """The format of a file or directory; raises IngestError (one line) when unknown."""
    return _sniff(Path(path))[0]


# One reader per format; the JSON formats get the document detection already parsed.
_READERS: dict[SourceFormat, Callable[[Path, str, object | None], Parsed]] = {
    SourceFormat.NCU_RAW: lambda path, shown, data: ncu_raw.parse(path, shown),
    SourceFormat.NCU_DETAILS: lambda path, shown, data: ncu_details.parse(path, shown),
    SourceFormat.NCU_REP: lambda path, shown, data: ncu_rep.parse(path, shown),
    SourceFormat.TORCH_TRACE: torch_trace.parse,
    SourceFormat.PROTON: proton.parse,
    SourceFormat.PTXAS_LOG: lambda path, shown, data: ptxas_log.parse(path, shown),
    SourceFormat.TRITON_CACHE: lambda path, shown, data: triton_cache.parse(path, shown),
    SourceFormat.RUNNER_JSONL: lambda path, shown, data: runner_jsonl.parse(path, shown),
    SourceFormat.SEED_JSON: seed_json.parse,
}


def _parse_one(fmt: SourceFormat, path: Path, shown: str, data: object | None) -> Parsed:
    return _READERS[fmt](path, shown, data)


def _finish(fmt: SourceFormat, parsed: Parsed) -> Parsed:
    """Foreign rows keyed and paired (per file: a baseline is only taken from the same file)."""
    if fmt in PROFILER_FORMATS and parsed.rows:
        paired = foreign.prepare(parsed.rows)
        if paired:
            return replace(parsed, note="; ".join(x for x in (parsed.note, f"{paired} foreign kernels paired "
                                                              "with a baseline from the same file") if x))
    return parsed


def _guarded(shown: str, work):
    """``work()``, its failures as one-line IngestErrors naming the file."""
    try:
        return work()
    except IngestError as exc:
        raise type(exc)(f"{shown}: {exc}") from None
    except (RecursionError, MemoryError, OverflowError) as exc:
        raise IngestError(f"{shown}: cannot be read ({type(exc).__name__})") from None


def parse_path(path: Path) -> tuple[SourceFormat, Parsed]:
    """One file or Triton cache; raises IngestError with the path and one line of reason."""
    path = Path(path)
    shown = display_path(path)

    def work() -> tuple[SourceFormat, Parsed]:
        fmt, data = _sniff(path)
        return fmt, _finish(fmt, _parse_one(fmt, path, shown, data))
    return _guarded(shown, work)


def iter_file(path: Path) -> tuple[SourceFormat, Iterator[Parsed]]:
    """One file as a stream of batches (a large runner JSONL), or as one batch. The stream
    raises IngestError (naming the file) if the file turns unreadable half-way."""
    path = Path(path)
    shown = display_path(path)
    fmt, data = _guarded(shown, lambda: _sniff(path))
    if fmt is not SourceFormat.RUNNER_JSONL:
        parsed = _guarded(shown, lambda: _finish(fmt, _parse_one(fmt, path, shown, data)))
        return fmt, iter([parsed])

    def chunks() -> Iterator[Parsed]:
        stream = runner_jsonl.parse_chunks(path, shown)
        while True:
            batch = _guarded(shown, lambda: next(stream, None))
            if batch is None:
                return
            yield batch
    return fmt, chunks()


def _skip(path: Path) -> bool:
    name = path.name
    return name.startswith(".") or name.upper().startswith("README") or path.suffix.lower() == ".md"


@dataclass(frozen=True)
class Entry:
    path: Path
    explicit: bool
    error: str | None = None


def expand(paths: list[Path]) -> list[Path]:
    """Files and Triton cache directories, in a stable order; other directories are walked."""
    return [e.path for e in walk(paths) if e.error is None]


def walk(paths: list[Path]) -> list[Entry]:
    """Every input with, for unusable ones, the reason; directories walked without cycles."""
    out: list[Entry] = []
    seen: set[tuple[int, int]] = set()

    def visit(path: Path, explicit: bool) -> None:
        try:
            kind = check_path(path)
        except IngestError as exc:
            out.append(Entry(path, explicit, str(exc)))
            return
        if kind == "dir" and not triton_cache.is_cache_dir(path):
            try:
                st = os.stat(path)
                key = (st.st_dev, st.st_ino)
                if key in seen:
                    out.append(Entry(path, explicit, "a directory already walked (symlink cycle)"))
                    return
                seen.add(key)
                children = sorted(p for p in path.iterdir() if not _skip(p))
            except OSError as exc:
                out.append(Entry(path, explicit, f"cannot list ({(exc.strerror or type(exc).__name__).lower()})"))
                return
            for child in children:
                visit(child, False)
            return
        out.append(Entry(path, explicit))

    for p in paths:
        visit(Path(p), True)
    return out


def rows_frame(parsed: Parsed) -> pd.DataFrame:
    """The batch's rows as one frame of kernel_runs columns."""
    frames = []
    if parsed.rows:
        frames.append(records_frame(parsed.rows))
    if parsed.frame is not None and len(parsed.frame):
        frames.append(parsed.frame.reindex(columns=list(COLUMNS)))
    return _concat(frames)


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Row frames of one or more files as one (cells as given where the frames' types differ)."""
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in COLUMNS})
    if len(frames) == 1:
        return frames[0]
    return pd.concat([f.astype(object) for f in frames], ignore_index=True)


def summarize(path: str, fmt: SourceFormat, parts: list[Parsed]) -> FileSummary:
    notes = [p.note for p in parts if p.note]
    return FileSummary(path, str(fmt), sum(p.row_count for p in parts), sum(len(p.quarantine) for p in parts),
                       sum(p.other_records for p in parts), sum(p.records_in for p in parts),
                       notes[0] if len(set(notes)) == 1 else "; ".join(dict.fromkeys(notes)))


def ingest_paths(paths: list[Path], *, skip_unknown: bool = True) -> IngestResult:
    """Parse every file. A file that cannot be read is listed in ``skipped`` with its reason
    and the others are still read; nothing here raises for one bad input.

    ``skip_unknown`` is kept for callers of the previous signature; every unreadable input
    is skipped now, whether named or met while walking a directory.
    """
    frames: list[pd.DataFrame] = []
    quarantine: list[dict] = []
    rules: list[dict] = []
    peaks: list[dict] = []
    summaries: list[FileSummary] = []
    skipped: list[SkippedFile] = []
    for entry in walk([Path(p) for p in paths]):
        shown = display_path(entry.path)
        if entry.error is not None:
            skipped.append(SkippedFile(shown, entry.error, named=True))
            continue
        try:
            fmt, parsed = parse_path(entry.path)
        except IngestError as exc:
            reason = str(exc).removeprefix(f"{shown}: ")
            named = entry.explicit or not isinstance(exc, UnknownFormat)
            skipped.append(SkippedFile(shown, reason, named=named))
            continue
        frames.append(rows_frame(parsed))
        quarantine += parsed.quarantine
        rules += parsed.rules
        peaks += parsed.peaks
        summaries.append(summarize(shown, fmt, [parsed]))
    rows = _concat(frames)
    return IngestResult(rows, tuple(quarantine), tuple(rules), tuple(peaks), tuple(summaries), tuple(skipped))


def validate_frame(rows: pd.DataFrame, chunk_rows: int = VALIDATE_CHUNK_ROWS) -> Normalized:
    """Schema validation (pandera) in chunks of ``chunk_rows`` rows."""
    if len(rows) <= chunk_rows:
        return normalize(rows)
    parts = [normalize(rows.iloc[i:i + chunk_rows]) for i in range(0, len(rows), chunk_rows)]
    return Normalized(kernel_runs=pd.concat([p.kernel_runs for p in parts], ignore_index=True),
                      quarantine=pd.concat([p.quarantine for p in parts], ignore_index=True))


def validate(result: IngestResult) -> Normalized:
    """Schema validation of the parsed rows, parse-time quarantine prepended."""
    checked = validate_frame(result.rows)
    parse_q = pd.DataFrame(list(result.quarantine), columns=list(QUARANTINE_COLUMNS))
    frames = [f for f in (parse_q, checked.quarantine) if not f.empty]
    quarantine = pd.concat(frames, ignore_index=True) if frames else empty_quarantine()
    return Normalized(kernel_runs=checked.kernel_runs, quarantine=quarantine)


__all__ = ["SourceFormat", "FileSummary", "SkippedFile", "IngestResult", "IngestError", "UnknownFormat",
           "detect_format", "display_path", "expand", "ingest_paths", "iter_file", "parse_path", "summarize",
           "rows_frame", "validate", "validate_frame", "walk"]
