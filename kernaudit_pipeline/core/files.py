"""Reading a file the user named, bounded: a regular file under a size limit, or a one-line reason.

Why one home: ``kernaudit assess`` and the review trail both read a file that someone else may
have replaced by a FIFO, a device or something huge; the checks and their wording are the same,
and each caller turns :class:`FileRefused` into its own error type. (Ingest opens files through
``ingest/sources.py``, which makes the same checks while it streams and decompresses.)
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class FileRefused(Exception):
    """Why a file was not read, in one line that starts with its path."""


def read_bounded(path: Path, limit: int, what: str = "file", *, missing_ok: bool = False) -> bytes | None:
    """The bytes of ``path`` if it is a regular file of at most ``limit`` bytes; None when it does
    not exist and ``missing_ok``; :class:`FileRefused` otherwise."""
    try:
        info = os.stat(path)
    except OSError as exc:
        if missing_ok and isinstance(exc, FileNotFoundError):
            return None
        raise FileRefused(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None
    if not stat.S_ISREG(info.st_mode):
        raise FileRefused(f"{path}: the {what} is not a regular file")
    if info.st_size > limit:
        raise FileRefused(f"{path}: the {what} is {info.st_size:,} bytes, over the {limit:,}-byte limit")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise FileRefused(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None
