"""``kernaudit ingest PATH... --out DIR``: profiler and benchmark files into ``kernel_runs``.

Formats, detected from content (not from the file name):

- Nsight Compute ``--csv --page raw`` (``ncu_raw``) and ``--page details`` (``ncu_details``)
- torch.profiler chrome traces (``torch_trace``), Proton hatchet JSON (``proton``)
- ptxas ``-v`` logs (``ptxas_log``), Triton cache directories (``triton_cache``)
- the GPU runner's JSONL (``runner_jsonl``) and seed-format JSON (``seed_json``)

A Triton cache directory is read as a whole; any other directory is walked
(hidden files, READMEs and Markdown skipped, and files of no known format,
such as logs or manifests, skipped and listed). Every row carries its
provenance (format, file as given or relative to the working directory, and
0-based record index). A record that cannot become a row goes to quarantine
with the reason; a file that is no known format, or is garbled as a whole,
stops the run with one line naming it. ``ingest_paths`` is the library entry
the ``raw_traces`` asset calls; validation is the separate ``normalize`` step.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import pandas as pd

from kernaudit_pipeline.ingest import (
    ncu_details, ncu_raw, proton, ptxas_log, runner_jsonl, seed_json, torch_trace, triton_cache,
)
from kernaudit_pipeline.ingest._common import IngestError, Parsed, UnknownFormat
from kernaudit_pipeline.kernel_runs import QUARANTINE_COLUMNS, Normalized, normalize

SNIFF_BYTES = 1 << 16
RULE_COLUMNS = ("kernel_name", "profiler_kernel_name", "launch_id", "section", "rule_name", "rule_type",
                "description", "estimated_speedup_type", "estimated_speedup_pct",
                "source_format", "source_file", "source_row")


class SourceFormat(StrEnum):
    NCU_RAW = "ncu_raw"
    NCU_DETAILS = "ncu_details"
    TORCH_TRACE = "torch_trace"
    PROTON = "proton"
    PTXAS_LOG = "ptxas_log"
    TRITON_CACHE = "triton_cache"
    RUNNER_JSONL = "runner_jsonl"
    SEED_JSON = "seed_json"


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


@dataclass(frozen=True)
class IngestResult:
    rows: tuple[dict, ...]
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
        except ValueError:
            continue
    return path.name


def _sniff(path: Path) -> tuple[SourceFormat, object | None]:
    """The format, and the parsed JSON when sniffing had to parse it anyway."""
    if path.is_dir():
        if triton_cache.is_cache_dir(path):
            return SourceFormat.TRITON_CACHE, None
        raise UnknownFormat("a directory that is not a Triton cache")
    try:
        with path.open("rb") as fh:
            head = fh.read(SNIFF_BYTES)
    except OSError as exc:
        raise IngestError(f"cannot read ({exc.strerror})") from None
    if not head.strip():
        raise UnknownFormat("empty file")
    if b"\x00" in head:
        raise UnknownFormat("binary file, not a known text format")
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 4:  # a multi-byte character cut by the sniff window is fine
            raise UnknownFormat("not UTF-8 text") from None
        text = head[:exc.start].decode("utf-8")
    stripped = text.lstrip()
    if stripped[:1] in ("[", "{"):
        first_line = stripped.splitlines()[0] if stripped else ""
        if stripped[:1] == "{" and runner_jsonl.looks_like(first_line):
            return SourceFormat.RUNNER_JSONL, None
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise IngestError(f"malformed or truncated JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
        except UnicodeDecodeError:
            raise IngestError("not UTF-8 text") from None
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
    raise UnknownFormat("unrecognized format (expected Nsight Compute CSV, torch.profiler trace, Proton hatchet, "
                        "ptxas -v log, Triton cache directory, runner JSONL or seed JSON)")


def detect_format(path: Path) -> SourceFormat:
    """The format of a file or directory; raises IngestError (one line) when unknown."""
    return _sniff(Path(path))[0]


def parse_path(path: Path) -> tuple[SourceFormat, Parsed]:
    path = Path(path)
    shown = display_path(path)
    try:
        fmt, data = _sniff(path)
        if fmt is SourceFormat.NCU_RAW:
            parsed = ncu_raw.parse(path, shown)
        elif fmt is SourceFormat.NCU_DETAILS:
            parsed = ncu_details.parse(path, shown)
        elif fmt is SourceFormat.TORCH_TRACE:
            parsed = torch_trace.parse(path, shown, data)
        elif fmt is SourceFormat.PROTON:
            parsed = proton.parse(path, shown, data)
        elif fmt is SourceFormat.PTXAS_LOG:
            parsed = ptxas_log.parse(path, shown)
        elif fmt is SourceFormat.TRITON_CACHE:
            parsed = triton_cache.parse(path, shown)
        elif fmt is SourceFormat.RUNNER_JSONL:
            parsed = runner_jsonl.parse(path, shown)
        else:
            parsed = seed_json.parse(path, shown, data)
    except IngestError as exc:
        raise type(exc)(f"{shown}: {exc}") from None
    return fmt, parsed


def _skip(path: Path) -> bool:
    name = path.name
    return name.startswith(".") or name.upper().startswith("README") or path.suffix.lower() == ".md"


def expand(paths: list[Path]) -> list[Path]:
    """Files and Triton cache directories, in a stable order; other directories are walked."""
    return [path for path, _ in _expand(paths, explicit=True)]


def _expand(paths: list[Path], explicit: bool) -> list[tuple[Path, bool]]:
    out: list[tuple[Path, bool]] = []
    for path in paths:
        path = Path(path)
        if not path.exists():
            raise IngestError(f"{display_path(path)}: no such file or directory")
        if path.is_dir() and not triton_cache.is_cache_dir(path):
            children = sorted(p for p in path.iterdir() if not _skip(p))
            out.extend(_expand(children, explicit=False))
        else:
            out.append((path, explicit))
    return out


def ingest_paths(paths: list[Path], *, skip_unknown: bool = False) -> IngestResult:
    """Parse every file; raises IngestError (one line) naming the first unknown or garbled file.

    Files met while walking a directory that are no known format at all (logs, manifests,
    READMEs) are skipped and listed; so are named files when ``skip_unknown``. A garbled
    file of a known format always raises.
    """
    rows: list[dict] = []
    quarantine: list[dict] = []
    rules: list[dict] = []
    peaks: list[dict] = []
    summaries: list[FileSummary] = []
    skipped: list[SkippedFile] = []
    for path, explicit in _expand([Path(p) for p in paths], explicit=True):
        try:
            fmt, parsed = parse_path(path)
        except UnknownFormat as exc:
            if explicit and not skip_unknown:
                raise
            skipped.append(SkippedFile(display_path(path), str(exc).split(": ", 1)[-1]))
            continue
        rows += parsed.rows
        quarantine += parsed.quarantine
        rules += parsed.rules
        peaks += parsed.peaks
        summaries.append(FileSummary(display_path(path), str(fmt), len(parsed.rows), len(parsed.quarantine),
                                     parsed.other_records, parsed.records_in, parsed.note))
    return IngestResult(tuple(rows), tuple(quarantine), tuple(rules), tuple(peaks), tuple(summaries),
                        tuple(skipped))


def validate(result: IngestResult) -> Normalized:
    """Schema validation (pandera) of the parsed rows, parse-time quarantine prepended."""
    checked = normalize(list(result.rows))
    parse_q = pd.DataFrame(list(result.quarantine), columns=list(QUARANTINE_COLUMNS))
    frames = [f for f in (parse_q, checked.quarantine) if not f.empty]
    quarantine = pd.concat(frames, ignore_index=True) if frames else checked.quarantine
    return Normalized(kernel_runs=checked.kernel_runs, quarantine=quarantine)


def _counts_by_file(frame: pd.DataFrame) -> dict[str, int]:
    if frame.empty:
        return {}
    return frame["source_file"].astype(str).value_counts().to_dict()


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kernaudit ingest", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path, help="files or directories to ingest")
    parser.add_argument("--out", type=Path, required=True, help="output directory for the CSV tables")
    args = parser.parse_args(argv)
    try:
        result = ingest_paths(args.paths)
    except IngestError as exc:
        print(f"kernaudit ingest: {exc}", file=sys.stderr)
        return 2
    normalized = validate(result)
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        normalized.kernel_runs.to_csv(args.out / "kernel_runs.csv", index=False)
        normalized.quarantine.to_csv(args.out / "quarantine.csv", index=False)
        if any(s.source_format == SourceFormat.NCU_DETAILS for s in result.summaries) or result.rules:
            pd.DataFrame(list(result.rules), columns=list(RULE_COLUMNS)).to_csv(args.out / "ncu_rules.csv", index=False)
        if result.peaks:
            pd.DataFrame(list(result.peaks)).drop(columns=["samples_us"], errors="ignore").to_csv(
                args.out / "peaks.csv", index=False)
    except OSError as exc:
        print(f"kernaudit ingest: cannot write to {args.out}: {exc.strerror}", file=sys.stderr)
        return 2
    good = _counts_by_file(normalized.kernel_runs)
    bad_rows = _counts_by_file(normalized.quarantine)
    for s in result.summaries:
        # Rows of a Triton cache carry the metadata file under the cache dir as their source_file.
        n_good = sum(v for k, v in good.items() if k == s.path or k.startswith(s.path.rstrip("/") + "/"))
        n_bad = sum(v for k, v in bad_rows.items() if k == s.path or k.startswith(s.path.rstrip("/") + "/"))
        extra = f", {s.other_records} non-row records" if s.other_records else ""
        print(f"{s.path}: {s.source_format}: {n_good} rows normalized, {n_bad} quarantined{extra}")
    for skip in result.skipped:
        print(f"{skip.path}: skipped ({skip.reason})")
    print(f"wrote {args.out / 'kernel_runs.csv'} ({len(normalized.kernel_runs)} rows) and "
          f"{args.out / 'quarantine.csv'} ({len(normalized.quarantine)} rows)"
          + (f"; {len(result.rules)} ncu rule messages" if result.rules else ""))
    return 0


__all__ = ["SourceFormat", "FileSummary", "SkippedFile", "IngestResult", "IngestError", "UnknownFormat",
           "detect_format", "expand", "ingest_paths", "parse_path", "validate", "cli"]
