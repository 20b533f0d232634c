"""Opening what the user named, safely: regular files only, gzip transparently, bounded JSON.

Every failure here is an :class:`IngestError` with one line that says what is wrong, so the
caller can list the file as skipped and go on with the others:

- a FIFO, socket or device is refused from its ``stat`` before it is opened (opening a FIFO
  with no writer blocks forever);
- a symlink loop, a missing file, a permission error become reasons, not tracebacks;
- ``.gz`` is recognised by its magic bytes (HTA's and kineto's sample traces are
  ``.json.gz``), decompressed as a stream, and bounded so that a small bomb cannot fill memory;
- text must be UTF-8 (a byte-order mark is dropped); binary files are named as such;
- JSON is parsed by ``pydantic_core.from_json`` (the Rust parser pydantic uses), which bounds
  nesting (a 3,000-deep document is an error, not a ``RecursionError``) and reads integers of
  any size exactly; the models that validate it decide what a too-large number means.
"""

from __future__ import annotations

import gzip
import io
import os
import stat
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

import pydantic_core

SNIFF_BYTES = 1 << 16
GZIP_MAGIC = b"\x1f\x8b"
# Whole-file formats (a torch trace, a Proton tree, seed JSON, ncu CSV) are read into memory.
MAX_WHOLE_FILE_BYTES = 4 << 30
CHUNK = 1 << 20


class IngestError(ValueError):
    """A file that cannot be read as any known format: one line, listed as skipped."""


class UnknownFormat(IngestError):
    """No known format at all (a log, a README, a binary): skipped quietly when met while
    walking a directory, reported when named on the command line. A garbled file of a known
    format is an :class:`IngestError`, and reported either way."""


_KIND = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
         (stat.S_ISBLK, "a block device"))


def _os_reason(exc: OSError) -> str:
    if exc.errno == 40 or "Symlink loop" in str(exc) or "Too many levels of symbolic links" in str(exc):
        return "a symlink loop"
    return (exc.strerror or type(exc).__name__).lower()


def check_path(path: Path) -> str:
    """``"file"`` or ``"dir"``; raises :class:`IngestError` for anything else, without opening it."""
    try:
        st = os.stat(path)  # follows symlinks; a loop raises ELOOP
    except FileNotFoundError:
        if os.path.lexists(path):
            raise IngestError("a dangling symlink") from None
        raise IngestError("no such file or directory") from None
    except (OSError, RuntimeError) as exc:
        raise IngestError(_os_reason(exc) if isinstance(exc, OSError) else "a symlink loop") from None
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    if stat.S_ISREG(st.st_mode):
        return "file"
    kind = next((name for test, name in _KIND if test(st.st_mode)), "not a regular file")
    raise IngestError(f"{kind}, not a regular file: refused")


@contextmanager
def open_stream(path: Path) -> Iterator[BinaryIO]:
    """The file's bytes, gunzipped when it is gzip (by content, not by name)."""
    check_path(path)
    try:
        raw = open(path, "rb")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise IngestError(f"cannot read ({_os_reason(exc)})") from None
    try:
        magic = raw.read(2)
        raw.seek(0)
        if magic == GZIP_MAGIC:
            with gzip.GzipFile(fileobj=raw, mode="rb") as gz:
                yield gz  # type: ignore[misc]
        else:
            yield raw
    finally:
        raw.close()


def iter_chunks(path: Path) -> Iterator[bytes]:
    """The (decompressed) content, :data:`CHUNK` bytes at a time; read errors propagate, for
    the caller to word with what it knows (a line number, a size)."""
    with open_stream(path) as fh:
        while chunk := fh.read(CHUNK):
            yield chunk


def read_bytes(path: Path, limit: int | None = None) -> bytes:
    """The whole (decompressed) content, at most ``limit`` bytes (default
    :data:`MAX_WHOLE_FILE_BYTES`)."""
    limit = MAX_WHOLE_FILE_BYTES if limit is None else limit
    buf = io.BytesIO()
    try:
        for chunk in iter_chunks(path):
            buf.write(chunk)
            if buf.tell() > limit:
                raise IngestError(f"larger than {limit >> 20} MiB once decompressed: refused")
    except (OSError, EOFError, zlib.error) as exc:  # a truncated or corrupt .gz
        if isinstance(exc, IngestError):
            raise
        raise IngestError(f"unreadable gzip stream ({str(exc).splitlines()[0][:80]})") from None
    return buf.getvalue()


def head_bytes(path: Path, size: int = SNIFF_BYTES) -> bytes:
    try:
        with open_stream(path) as fh:
            return fh.read(size)
    except (OSError, EOFError, zlib.error) as exc:
        if isinstance(exc, IngestError):
            raise
        raise IngestError(f"unreadable gzip stream ({str(exc).splitlines()[0][:80]})") from None


def is_gzip(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(2) == GZIP_MAGIC
    except OSError:
        return False


def decode_text(data: bytes, *, partial: bool = False) -> str:
    """UTF-8 text (BOM dropped). ``partial``: a multi-byte character cut at the end is fine."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if partial and exc.start >= len(data) - 4:
            return data[:exc.start].decode("utf-8")
        raise IngestError(f"not UTF-8 text (byte {exc.start})") from None


def read_text(path: Path) -> str:
    data = read_bytes(path)
    if b"\x00" in data[:SNIFF_BYTES]:
        raise IngestError("binary file, not a known text format")
    return decode_text(data)


def load_json(data: bytes | str) -> object:
    """Parsed JSON with nesting bounded (pydantic-core's limit, 200 levels)."""
    try:
        return pydantic_core.from_json(data, allow_inf_nan=True)
    except ValueError as exc:
        message = str(exc).splitlines()[0]
        if "recursion limit" in message:
            raise IngestError(f"JSON nested too deeply ({message})") from None
        raise IngestError(f"malformed or truncated JSON ({message})") from None


def read_json(path: Path) -> object:
    data = read_bytes(path)
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    return load_json(data)
