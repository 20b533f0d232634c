"""Progress for long loops (verification recompiles, the GPU runner's configs): a bar with an ETA.

Standard library only, so the GPU runner can use it on a host without rich:

    from kernaudit_pipeline.core.progress import progress

    with progress("verify: recompiles", total=len(todo)) as bar:
        for item in todo:
            ...
            bar.advance(note=item.config_id)

On a terminal, with rich importable, it draws rich's live bar (done/total, elapsed, ETA).
Otherwise (a pipe, a log file, CI, a bare GPU host) it prints plain lines, at most one every
``PLAIN_EVERY_S`` seconds plus the last, so a log stays readable (a task done within
``PLAIN_EVERY_S`` prints only its last line):
``verify: recompiles 12/40 (30 %) 1m05s elapsed, ETA 2m31s [gemm_bf16 BM128...]``.
``KERNAUDIT_PROGRESS=off`` (what ``kernaudit audit --quiet`` sets) silences it, also in child
processes; ``KERNAUDIT_PROGRESS=plain`` forces the plain lines.
"""

from __future__ import annotations

import os
import sys
import time
from types import TracebackType
from typing import TextIO

ENV = "KERNAUDIT_PROGRESS"
PLAIN_EVERY_S = 10.0


def fmt_duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def mode(stream: TextIO | None = None) -> str:
    """"off", "rich" or "plain" for ``stream`` (default stderr), from ``KERNAUDIT_PROGRESS`` and the terminal."""
    wanted = os.environ.get(ENV, "").strip().lower()
    if wanted in ("off", "0", "no", "false"):
        return "off"
    stream = stream or sys.stderr
    if wanted != "plain" and getattr(stream, "isatty", lambda: False)():
        try:
            import rich.progress  # noqa: F401
        except ImportError:
            return "plain"
        return "rich"
    return "plain"


class Progress:
    """One counted task. Use as a context manager; call :meth:`advance` once per item done."""

    def __init__(self, label: str, total: int | None, *, stream: TextIO | None = None,
                 clock=time.monotonic) -> None:
        self.label = label
        self.total = total if total and total > 0 else None
        self.done = 0
        self.stream = stream or sys.stderr
        self._clock = clock
        self._start = clock()
        self._last_line = float("-inf")
        self._mode = mode(self.stream)
        self._rich = None
        self._task = None

    # --- numbers -----------------------------------------------------------------------------
    @property
    def elapsed_s(self) -> float:
        return self._clock() - self._start

    def eta_s(self) -> float | None:
        """Seconds left at the pace so far; None before the first item or without a total."""
        if not self.total or self.done <= 0:
            return None
        return self.elapsed_s / self.done * max(self.total - self.done, 0)

    def line(self, note: str = "") -> str:
        """The plain line for the current state."""
        if self.total:
            text = f"{self.label} {self.done}/{self.total} ({self.done / self.total:.0%}) " \
                   f"{fmt_duration(self.elapsed_s)} elapsed"
            eta = self.eta_s()
            if eta is not None and self.done < self.total:
                text += f", ETA {fmt_duration(eta)}"
        else:
            text = f"{self.label} {self.done} done, {fmt_duration(self.elapsed_s)} elapsed"
        return text + (f" [{note}]" if note else "")

    # --- output ------------------------------------------------------------------------------
    def __enter__(self) -> "Progress":
        if self._mode == "rich":
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)

            self._rich = RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                      TextColumn("{task.fields[note]}"), console=Console(file=self.stream),
                                      transient=False)
            self._rich.__enter__()
            self._task = self._rich.add_task(self.label, total=self.total, note="")
        elif self._mode == "plain":
            self._last_line = self._clock()  # the first line comes after PLAIN_EVERY_S, or at the end
        return self

    def advance(self, n: int = 1, note: str = "") -> None:
        self.done += n
        if self._rich is not None:
            self._rich.update(self._task, advance=n, note=note[:60])
        elif self._mode == "plain":
            self._emit(note, force=self.total is not None and self.done >= self.total)

    def _emit(self, note: str = "", force: bool = False) -> None:
        now = self._clock()
        if not force and now - self._last_line < PLAIN_EVERY_S:
            return
        self._last_line = now
        print(self.line(note), file=self.stream, flush=True)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._rich is not None:
            self._rich.__exit__(exc_type, exc, tb)
        elif self._mode == "plain" and (self.total is None or self.done < self.total):
            self._emit("stopped" if exc_type else "", force=True)


def progress(label: str, total: int | None, *, stream: TextIO | None = None) -> Progress:
    """A :class:`Progress` for ``total`` items (None when the count is unknown)."""
    return Progress(label, total, stream=stream)
