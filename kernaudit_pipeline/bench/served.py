"""One worker kept up for a search's batches (``kernaudit bench --search``).

A search measures a few configs at a time and asks its stop rule between batches. With a new
``sweep`` worker per batch, every batch paid the worker's start-up: Python, torch and triton
imports, the kernel module, the CUDA context. On the H100 host that is about 6 s a batch; the
fused MoE search of 2026-12-07 spent 315 s of wall time on 24 GPU-s of measuring, and its next
bucket was cut by the deadline. A ``serve`` worker (``bench/worker.py``) is set up once and
sweeps each batch it is handed, with the same spec, seeds and rows as a fresh worker's first
attempt.

Failure handling stays where it is: when the serving worker dies, runs a step past
``--timeout-s`` or is still busy at the deadline, it is killed, the rows it wrote for the batch
are kept, and the caller sweeps what is left of the batch with :func:`run_group`, whose fresh
workers attribute the failing step and carry on. The config that brought the serving worker
down therefore runs once more there (one more timeout, for a config that hangs). The next
batch starts a new serving worker. Standard library only.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from kernaudit_pipeline.bench.plan import KernelPlan
from kernaudit_pipeline.bench.records import read_jsonl
from kernaudit_pipeline.bench.supervisor import (
    POLL_S, StepWatch, Sweep, absorb_rows, kill, log_tail, spawn, sweep_spec,
)


class ServedWorker:
    """A ``serve`` worker of one kernel, started on the first batch and after a failure."""

    def __init__(self, plan: KernelPlan, sweep: Sweep, root: Path, echo: bool = True):
        self.plan, self.sweep, self.root, self.echo = plan, sweep, root, echo
        self.root.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen | None = None
        self.log_path: Path | None = None
        self.inbox: Path | None = None
        self.plan_path: Path | None = None
        self.starts = 0  # serving workers started (one unless a batch failed)
        self.batch = 0  # batches handed to the current worker
        self.batches = 0  # batches handed to any serving worker
        self._printed = 0

    def _echo(self) -> None:
        if not self.echo or self.log_path is None:
            return
        try:
            with self.log_path.open("rb") as fh:  # only what is new: the log grows batch by batch
                fh.seek(self._printed)
                data = fh.read()
        except OSError:
            return
        if data:
            print(data.decode(errors="replace"), end="", flush=True)
            self._printed += len(data)

    def _watch(self, progress: Path, until) -> str | None:
        """Poll the worker until ``until(step)`` holds for its progress mark ``step`` (returns
        None) or it fails (returns why). A step (start-up included) may last ``--timeout-s``; nothing may outlast the deadline."""
        assert self.proc is not None
        watch = StepWatch(progress)
        while True:
            self._echo()
            watch.update()
            if until(watch.step):
                return None
            rc = self.proc.poll()
            if rc is not None:
                return f"serving worker exited with {rc}: {log_tail(self.log_path, 400).strip()[-300:]}"
            overrun = watch.overrun(self.sweep.options.timeout_s, self.sweep.deadline)
            if overrun is not None:
                return overrun.message
            time.sleep(POLL_S / 10)

    def _start(self) -> str | None:
        self.starts += 1
        root = self.root / f"worker{self.starts}"
        root.mkdir()
        self.inbox = root / "inbox"
        self.inbox.mkdir()
        self.plan_path = root / f"{self.plan.stem}.plan.json"
        self.plan_path.write_text(self.plan.to_json())
        progress = root / "serve.progress"
        spec = {**sweep_spec(self.plan_path, [], [], {}, {}, 0, root / "serve.rows.jsonl", progress, self.sweep),
                "mode": "serve", "inbox": str(self.inbox)}
        self.proc, self.log_path = spawn(spec, root, "serve")
        self._printed, self.batch = 0, 0
        failed = self._watch(progress, lambda step: step == "ready")
        if failed:
            self.close(at_once=True)
        return failed

    def run(self, shapes: list[str], items: list[tuple[str, str]],
            refs_done: dict[str, dict[str, dict]]) -> tuple[set[tuple[str, str]], str | None]:
        """Sweep ``items`` in the serving worker; their rows go to the sweep as
        :func:`run_group`'s do. Returns the (shape, config) pairs that got a run row, and why
        the worker failed (None when the batch went through): the caller then sweeps the rest
        of the batch with :func:`run_group`."""
        if self.proc is None or self.proc.poll() is not None:
            failed = self._start()
            if failed:
                return set(), failed
        assert self.inbox is not None and self.plan_path is not None
        n = self.batch
        tag = f"batch{self.batches}"
        rows_path, progress = self.root / f"{tag}.rows.jsonl", self.root / f"{tag}.progress"
        progress.write_text("")
        spec = sweep_spec(self.plan_path, shapes, items, refs_done, {}, 0, rows_path, progress, self.sweep)
        pending = self.inbox / f"{n}.json.tmp"
        pending.write_text(json.dumps(spec))
        pending.rename(self.inbox / f"{n}.json")  # the worker never reads half a spec
        self.batch += 1
        self.batches += 1
        done_marker = self.inbox / f"{n}.done"
        failed = self._watch(progress, lambda step: done_marker.exists())
        rows = read_jsonl(rows_path.read_text()) if rows_path.exists() else []
        done = absorb_rows(rows, self.sweep, refs_done)
        if failed:
            self.close(at_once=True)
        return done, failed

    def close(self, at_once: bool = False) -> None:
        """Tell the worker to exit, and kill it when it has not within 10 s; ``at_once``: kill
        it now (it failed, and may be stuck in a step)."""
        if self.proc is None:
            return
        if not at_once and self.proc.poll() is None and self.inbox is not None:
            (self.inbox / f"{self.batch}.stop").write_text("")
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if self.proc.poll() is None:
            kill(self.proc)
        self._echo()
        self.proc = None

