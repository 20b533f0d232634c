"""A pool of spawned worker processes, each task under its own deadline.

Why processes with deadlines: a kernel module can hang at import, in ``compile_args`` or inside
the compiler, and some spilling configs take minutes to compile. Nothing of the kernel module
runs in the parent; a worker that overruns its deadline is killed and replaced, so one
pathological task costs its deadline and the sweep goes on.

The pool is generic: a *handler* module (named by its dotted path, imported in the worker)
provides ``warm_up()`` (the one-off start-up cost, under the start-up deadline) and
``handle(task, state) -> payload`` (``state`` is a dict the worker keeps across tasks, e.g.
imported modules). Tasks are dicts with a unique ``"key"``; payloads travel back by pickle.

Standard library only.
"""

from __future__ import annotations

import enum
import importlib
import multiprocessing
import multiprocessing.connection
import os
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable


class OutcomeKind(enum.StrEnum):
    OK = "ok"
    ERROR = "error"          # the handler raised
    TIMEOUT = "timeout"      # killed at its deadline
    DIED = "died"            # the worker process ended while running it
    NOT_STARTED = "not_started"  # no worker could start


@dataclass(frozen=True)
class Outcome:
    """What came back for one task. ``deterministic`` errors recur on every retry of the same
    task (the handler says which), so a cache may keep them."""

    kind: OutcomeKind
    payload: Any = None
    message: str = ""
    seconds: float | None = None
    deterministic: bool = False


def _error_text(exc: BaseException, handler: Any, output: str) -> str:
    describe = getattr(handler, "describe_error", None)
    if describe is not None:
        return describe(exc, output)
    first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
    return f"{type(exc).__name__}: {first}"[:500] if first else type(exc).__name__


def _exit_with_parent(parent: int, period_s: float = 1.0) -> None:
    """A worker stuck in kernel code (a hanging compile_args) must not outlive a parent that
    was killed before it could kill the worker."""
    def watch() -> None:
        while True:
            time.sleep(period_s)
            if os.getppid() != parent:
                os._exit(0)
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _worker_main(conn: multiprocessing.connection.Connection, handler_path: str,
                 env: dict[str, str], parent: int | None = None) -> None:
    """Run tasks until told to stop. C-level output (MLIR diagnostics, Triton's PTX dump on a
    ptxas failure) goes to a private file so it never mixes with the parent's table or JSON."""
    if parent is not None:
        _exit_with_parent(parent)
    os.environ.update(env)
    sink = tempfile.TemporaryFile()
    os.dup2(sink.fileno(), 1)
    os.dup2(sink.fileno(), 2)
    try:
        handler = importlib.import_module(handler_path)
        warm_up = getattr(handler, "warm_up", None)
        if warm_up is not None:
            warm_up()
    except BaseException as exc:  # reported to the parent, which counts a failed start
        conn.send(("dead", f"{type(exc).__name__}: {exc}"[:500]))
        return
    conn.send(("ready", None))
    state: dict = {}
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        sys.stdout.flush()
        sys.stderr.flush()
        offset = sink.seek(0, os.SEEK_END)
        start = time.perf_counter()
        try:
            payload = handler.handle(task, state)
        except (Exception, SystemExit) as exc:  # a module's own sys.exit() is its error, not ours
            sys.stdout.flush()
            sys.stderr.flush()
            sink.seek(offset)
            output = sink.read().decode(errors="replace")
            is_det = getattr(handler, "is_deterministic", lambda e: False)
            conn.send(("error", {"message": _error_text(exc, handler, output),
                                 "seconds": time.perf_counter() - start,
                                 "deterministic": bool(is_det(exc))}))
            continue
        conn.send(("ok", payload))


class _Worker:
    def __init__(self, ctx: Any, handler: str, env: dict[str, str], start_timeout_s: float) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, handler, env, os.getpid()), daemon=True)
        self.proc.start()
        child.close()
        self.ready = False
        self.task: dict | None = None
        self.deadline = time.monotonic() + start_timeout_s
        self.started = 0.0

    def assign(self, task: dict, timeout_s: float) -> None:
        self.task = task
        self.started = time.monotonic()
        self.deadline = self.started + timeout_s
        self.conn.send(task)

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=10)
        self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.proc.join(timeout=5)
        self.kill()


@dataclass
class WorkerPool:
    """Spawned workers running ``handler``; reusable across :meth:`run` calls, closed by
    :meth:`close` (or ``with``).

    ``start_timeout_s`` bounds a worker's start-up (interpreter, imports, ``warm_up``): a worker
    not ready by then is killed and counted as a failed start. Once as many starts have failed
    as there are workers (at least 2) while none is ready, every pending task ends NOT_STARTED.
    """

    handler: str
    max_workers: int
    start_timeout_s: float
    env: dict[str, str] = field(default_factory=dict)
    _workers: list[_Worker] = field(default_factory=list, init=False)
    _ctx: Any = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        if self.start_timeout_s <= 0:
            raise ValueError("start_timeout_s must be positive")
        self._ctx = multiprocessing.get_context("spawn")

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for w in self._workers:
            w.stop()
        self._workers.clear()

    def run(self, tasks: list[dict], *, timeout_s: float,
            on_done: Callable[[dict, Outcome], None] | None = None) -> dict[str, Outcome]:
        """Each task's outcome by key; ``timeout_s`` is each task's deadline once assigned."""
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        pending = deque(tasks)
        outcomes: dict[str, Outcome] = {}
        workers = self._workers
        start_failures: list[str] = []

        def finish(task: dict, outcome: Outcome) -> None:
            outcomes[task["key"]] = outcome
            if on_done is not None:
                on_done(task, outcome)

        def spawn_needed() -> None:
            target = min(self.max_workers, len(pending) + sum(1 for w in workers if w.task is not None))
            while len(workers) < target:
                workers.append(_Worker(self._ctx, self.handler, self.env, self.start_timeout_s))

        def drop(w: _Worker) -> None:
            w.kill()
            workers.remove(w)

        while pending or any(w.task is not None for w in workers):
            if len(start_failures) >= max(2, self.max_workers) and not any(w.ready for w in workers):
                msg = f"worker failed to start: {start_failures[-1]}"
                while pending:
                    finish(pending.popleft(), Outcome(OutcomeKind.NOT_STARTED, message=msg))
                break
            spawn_needed()
            for w in list(workers):
                if w.ready and w.task is None and pending:
                    task = pending.popleft()
                    try:
                        w.assign(task, timeout_s)
                    except OSError:  # died after saying ready: retry the task elsewhere
                        pending.appendleft(task)
                        w.task = None
                        drop(w)
            now = time.monotonic()
            wait_s = max(0.0, min((w.deadline for w in workers), default=now + 1.0) - now)
            ready = multiprocessing.connection.wait([w.conn for w in workers], timeout=min(wait_s, 1.0))
            for w in [w for w in workers if w.conn in ready]:
                try:
                    kind, payload = w.conn.recv()
                except (EOFError, OSError):
                    task = w.task
                    w.proc.join(timeout=1.0)  # its own exit code, before drop() kills it
                    code = w.proc.exitcode
                    drop(w)
                    if task is not None:
                        finish(task, Outcome(OutcomeKind.DIED, message=f"worker died (exit code {code})",
                                             seconds=time.monotonic() - w.started))
                    else:
                        start_failures.append(f"exit code {code}")
                    continue
                if kind == "ready":
                    w.ready = True
                elif kind == "dead":
                    start_failures.append(payload)
                    drop(w)
                elif kind == "ok":
                    task, w.task = w.task, None
                    finish(task, Outcome(OutcomeKind.OK, payload=payload,
                                         seconds=time.monotonic() - w.started))
                else:
                    task, w.task = w.task, None
                    finish(task, Outcome(OutcomeKind.ERROR, message=payload["message"],
                                         seconds=payload["seconds"],
                                         deterministic=payload["deterministic"]))
            now = time.monotonic()
            for w in [w for w in workers if now > w.deadline]:
                task = w.task
                drop(w)
                if task is not None:
                    elapsed = now - w.started
                    finish(task, Outcome(OutcomeKind.TIMEOUT, seconds=elapsed,
                                         message=f"exceeded the {timeout_s:g} s timeout (killed after {elapsed:.2f} s)"))
                else:
                    start_failures.append(f"did not start within {self.start_timeout_s:g} s")
        return outcomes
