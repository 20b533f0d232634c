"""JSON Lines at scale: DuckDB reads clean lines in bulk, anything doubtful line by line.

Why DuckDB: on this project's 2-core machine, 100,000 runner lines (647 MB) parse in 0.55 s
through DuckDB's ``read_json`` with the columns named, 5.1 s through pyarrow's JSON reader,
2.9 s through ``pydantic_core.from_json`` and 10.2 s through ``json.loads``, a line at a time
(docs/benchmarks.md, "Ingest at scale", with the whole ingest's figures).

DuckDB is lenient where kernaudit must not be: it reads ``true`` as 1.0 in a DOUBLE column,
``1e400`` as ``inf`` and rounds 12.7 into a BIGINT. So every number is read as text and cast
with ``TRY_CAST``; a cell that is present but does not cast to a finite number (a boolean,
an object, ``1e400``, ``"abc"``) marks its row. The bulk stream stops at the first batch with
such a row, or at anything DuckDB refuses (a malformed line, a line that is no object, a
duplicate key), and :func:`stream` goes on from that batch's first record line by line:
every line is then parsed on its own (``pydantic_core.from_json``: nesting bounded, integers
of any size exact) and a bad line becomes a quarantined record with its line number. Rows
already given in bulk were clean, so nothing is read twice into the output.

This module knows nothing of the runner's schema: the caller names the columns and their
kinds, and decides what a record means.
"""

from __future__ import annotations

import queue
import threading
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import pandas as pd

from kernaudit_pipeline.ingest.sources import IngestError, is_gzip, iter_chunks

BATCH_ROWS = 100_000
MAX_LINE_BYTES = 64 << 20  # a longer "line" is no record (and is not held whole in memory)
BAD_COLUMN = "_bad_columns"


class Kind(StrEnum):
    NUMBER = "number"  # finite float (integers too: their integrality is the schema's to check)
    TEXT = "text"
    BOOL = "bool"


@dataclass(frozen=True)
class Line:
    """One non-blank line read on its own: the object, or why it is none."""

    record: int  # 0-based among non-blank lines
    line: int  # 1-based line of the file
    obj: dict | None
    error: str | None = None
    raw: str = ""


@dataclass(frozen=True)
class Batch:
    """Either bulk rows (``frame``, one row per record, ``_record`` = record index) or lines."""

    frame: pd.DataFrame | None = None
    lines: tuple[Line, ...] = ()


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _sql(path: Path, columns: Mapping[str, Kind]) -> str:
    spec = "{" + ", ".join(f"'{name}': 'VARCHAR'" for name in columns) + "}"
    select, bad = [], []
    for name, kind in columns.items():
        q = _quote(name)
        if kind is Kind.NUMBER:
            select.append(f"TRY_CAST({q} AS DOUBLE) AS {q}")
            bad.append(f"CASE WHEN {q} IS NOT NULL AND (TRY_CAST({q} AS DOUBLE) IS NULL "
                       f"OR NOT isfinite(TRY_CAST({q} AS DOUBLE))) THEN '{name}' END")
        elif kind is Kind.BOOL:
            select.append(f"TRY_CAST({q} AS BOOLEAN) AS {q}")
            bad.append(f"CASE WHEN {q} IS NOT NULL AND lower({q}) NOT IN ('true', 'false') THEN '{name}' END")
        else:
            select.append(q)
    compression = "gzip" if is_gzip(path) else "none"
    literal = str(path).replace("'", "''")
    return (f"SELECT {', '.join(select)}, concat_ws(',', {', '.join(bad) or 'NULL'}) AS {BAD_COLUMN} "
            f"FROM read_json('{literal}', format='newline_delimited', columns={spec}, "
            f"compression='{compression}', maximum_object_size={MAX_LINE_BYTES})")


def _bulk(path: Path, columns: Mapping[str, Kind], batch_rows: int) -> Iterator[pd.DataFrame]:
    """Record batches from DuckDB; raises whatever DuckDB raises, at any point.

    The next batch is read in a helper thread while the caller works on the current one
    (DuckDB and Arrow release the GIL while they parse and convert), so reading and
    validating overlap on two cores. At most one batch waits ahead.
    """
    import duckdb  # noqa: PLC0415 - heavy, and only needed here

    con = duckdb.connect()
    done = object()
    ahead: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()

    def produce() -> None:
        try:
            con.execute("SET preserve_insertion_order = true")
            reader = con.sql(_sql(path, columns)).to_arrow_reader(batch_rows)
            while not stop.is_set():
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    break
                ahead.put(batch.to_pandas())
            ahead.put(done)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            ahead.put(exc)

    worker = threading.Thread(target=produce, name="kernaudit-jsonl-bulk", daemon=True)
    worker.start()
    try:
        while True:
            item = ahead.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while worker.is_alive():  # unblock a producer waiting to put, then let it finish
            try:
                ahead.get(timeout=0.1)
            except queue.Empty:
                pass
        con.close()


def _raw_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, bytes without the newline) for every line, streamed."""
    line_no = 0
    pending = b""
    try:
        for chunk in iter_chunks(path):
            parts = (pending + chunk).split(b"\n")
            pending = parts.pop()
            if len(pending) > MAX_LINE_BYTES:
                raise IngestError(f"a line longer than {MAX_LINE_BYTES >> 20} MiB at line {line_no + 1}")
            for raw in parts:
                line_no += 1
                yield line_no, raw
    except (OSError, EOFError, zlib.error) as exc:
        raise IngestError(f"unreadable stream after line {line_no} ({str(exc).splitlines()[0][:80]})") from None
    if pending:
        yield line_no + 1, pending


def iter_lines(path: Path, start_record: int = 0) -> Iterator[Line]:
    """Every non-blank line from record ``start_record`` on, parsed on its own."""
    import pydantic_core  # noqa: PLC0415

    record = 0
    for line_no, raw in _raw_lines(path):
        if not raw.strip():
            continue
        if record >= start_record:
            yield _parse_line(record, line_no, raw, pydantic_core)
        record += 1


def _parse_line(record: int, line_no: int, raw: bytes, pydantic_core) -> Line:
    text = raw.rstrip(b"\r")
    shown = text[:500].decode("utf-8", errors="replace")
    try:
        obj = pydantic_core.from_json(text, allow_inf_nan=False)
    except ValueError as exc:
        message = str(exc).splitlines()[0]
        why = "nested too deeply" if "recursion limit" in message else f"not JSON ({message})"
        return Line(record, line_no, None, f"line {line_no}: {why}", shown)
    if not isinstance(obj, dict):
        return Line(record, line_no, None, f"line {line_no}: not a JSON object", shown)
    return Line(record, line_no, obj, None, shown)


def stream(path: Path, columns: Mapping[str, Kind], *, batch_rows: int | None = None,
           bulk: bool = True) -> Iterator[Batch]:
    """The file's records: bulk batches while every cell reads exactly, then line by line.

    A bulk batch's ``frame`` holds the named columns (numbers as float, missing as NaN/None)
    and ``_record``, the record index (line numbers: :func:`line_numbers`).
    """
    batch_rows = batch_rows or BATCH_ROWS
    done = 0
    if bulk:
        try:
            for frame in _bulk(path, columns, batch_rows):
                if (frame[BAD_COLUMN] != "").any():
                    break  # redo this batch, and the rest, line by line
                frame = frame.drop(columns=[BAD_COLUMN])
                frame.insert(0, "_record", range(done, done + len(frame)))
                done += len(frame)
                yield Batch(frame=frame)
            else:
                return
        except Exception:  # noqa: BLE001 - any refusal by DuckDB means: read the rest exactly
            pass
    lines: list[Line] = []
    for line in iter_lines(path, start_record=done):
        lines.append(line)
        if len(lines) >= batch_rows:
            yield Batch(lines=tuple(lines))
            lines = []
    if lines:
        yield Batch(lines=tuple(lines))


def line_numbers(path: Path, records: set[int]) -> dict[int, int]:
    """1-based file line of each 0-based record index asked for (blank lines are no records)."""
    out: dict[int, int] = {}
    if not records:
        return out
    last = max(records)
    record = 0
    for line_no, raw in _raw_lines(path):
        if not raw.strip():
            continue
        if record in records:
            out[record] = line_no
        record += 1
        if record > last:
            break
    return out
