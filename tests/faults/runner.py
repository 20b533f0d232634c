"""Running the malformed-input campaign (``tests/faults/campaign.py``'s cases).

The cases run in worker processes, in-process through ``kernaudit_pipeline.cli.main`` (fast:
the imports are paid once per worker), two lanes side by side. The parent watches each
worker's progress and kills it when one case stops answering, which is recorded as a hang and
the worker restarted for the rest of its lane.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

from tests.faults.campaign import REPO, Case, Outcome, cases


def _count_rows(out_dir: Path) -> tuple[int, int] | None:
    try:
        import pandas as pd

        runs = pd.read_csv(out_dir / "kernel_runs.csv")
        # a torch.profiler row stands for its launches (latency_samples kernel events)
        grouped = runs["source_format"].astype(str).eq("torch_trace") & runs["latency_samples"].notna()
        kept = int((~grouped).sum() + runs.loc[grouped, "latency_samples"].sum())
        quarantined = len(pd.read_csv(out_dir / "quarantine.csv"))
        return kept, quarantined
    except Exception:  # noqa: BLE001 - a missing or empty table reads as "not accounted"
        return None


def _skipped_lines(stdout: str) -> int:
    return sum(1 for line in stdout.splitlines() if ": skipped (" in line)


def _snapshot(root: Path) -> set[str]:
    return {str(p) for p in root.rglob("*")} if root.exists() else set()


def run_case(case: Case, scratch: Path) -> Outcome:
    """Run one case in this process (the worker calls this)."""
    from kernaudit_pipeline import cli

    d = scratch
    d.mkdir(parents=True, exist_ok=True)
    os.environ["KERNAUDIT_DATA_DIR"] = str(d / "data")
    os.environ.pop("DAGSTER_HOME", None)
    before_repo = _snapshot(REPO / "data")
    t0 = time.monotonic()
    argv = case.build(d)
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            rc = cli.main(argv)
        except SystemExit as exc:  # pragma: no cover - main never raises it
            rc = exc.code if isinstance(exc.code, int) else 1
    seconds = time.monotonic() - t0
    stderr, stdout = err.getvalue(), out.getvalue()
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    accounted = None
    if case.command == "ingest" and rc == 0 and case.records_in is not None:
        counts = _count_rows(d / "out")
        accounted = counts is not None and sum(counts) + _skipped_lines(stdout) >= case.records_in
    wrote_outside = _snapshot(REPO / "data") != before_repo
    return Outcome(case.name, case.command, rc, len(lines), "Traceback" in stderr + stdout,
                   "internal error" in stderr, False, accounted, wrote_outside, round(seconds, 2),
                   detail=(lines[-1] if lines else "")[:300])


def worker_main(names: list[str], scratch: str) -> None:
    """Worker loop: one JSON line per finished case on stdout's file descriptor 3-free channel."""
    by_name = {c.name: c for c in cases()}
    # The protocol gets its own copy of stdout; anything else written to file descriptor 1
    # (a child process, a C library) goes to /dev/null instead of into the protocol.
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    for i, name in enumerate(names):
        channel.write(json.dumps({"start": name}) + "\n")
        outcome = run_case(by_name[name], Path(scratch) / f"c{i:03d}")
        channel.write(json.dumps({"done": asdict(outcome)}) + "\n")
    channel.close()


def run_campaign(selected: list[Case] | None = None, per_case_timeout_s: float = 240.0,
                 scratch: Path | None = None, lanes: int = 2) -> Iterator[Outcome]:
    """Run the cases in ``lanes`` worker processes side by side (dealt round-robin), yielding
    each outcome as it ends; a case that stops answering is a hang.

    Two lanes by default: four cases wait out a 20 s timeout on purpose (a module that hangs),
    and one worker would sit idle through them."""
    chosen = list(selected if selected is not None else cases())
    scratch = Path(scratch or tempfile.mkdtemp(prefix="kernaudit-campaign-"))
    lanes = max(1, min(lanes, len(chosen)))
    if lanes == 1:
        yield from _run_lane(chosen, per_case_timeout_s, scratch)
        return
    done: queue.Queue = queue.Queue()

    def lane(part: list[Case], where: Path) -> None:
        try:
            for outcome in _run_lane(part, per_case_timeout_s, where):
                done.put(outcome)
        finally:
            done.put(None)

    threads = [threading.Thread(target=lane, args=(chosen[i::lanes], scratch / f"lane{i}"), daemon=True)
               for i in range(lanes)]
    for t in threads:
        t.start()
    finished = 0
    while finished < lanes:
        item = done.get()
        if item is None:
            finished += 1
        else:
            yield item
    for t in threads:
        t.join()


def _run_lane(pending: list[Case], per_case_timeout_s: float, scratch: Path) -> Iterator[Outcome]:
    """One worker process at a time, through ``pending`` in order (a new worker after a hang)."""
    pending = list(pending)
    scratch.mkdir(parents=True, exist_ok=True)
    by_name = {c.name: c for c in pending}
    attempt = 0
    while pending:
        attempt += 1
        names = [c.name for c in pending]
        spec = scratch / f"names{attempt}.json"
        spec.write_text(json.dumps(names))
        code = ("import json, sys; sys.path.insert(0, %r); from tests.faults.runner import worker_main; "
                "worker_main(json.load(open(%r)), %r)") % (str(REPO), str(spec), str(scratch / f"w{attempt}"))
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True, cwd=str(REPO))
        current: str | None = None
        started = time.monotonic()
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        buf = ""
        while True:
            limit = per_case_timeout_s - (time.monotonic() - started)
            events = sel.select(timeout=max(0.1, limit))
            if not events and time.monotonic() - started >= per_case_timeout_s:
                proc.kill()
                proc.wait()
                if current is not None:
                    case = by_name[current]
                    yield Outcome(case.name, case.command, None, 0, False, False, True, None, False,
                                  per_case_timeout_s, "no answer").judge(case)
                    pending = [c for c in pending if c.name != current]
                break
            chunk = proc.stdout.readline()
            if not chunk:
                proc.wait()
                if current is not None:  # the worker died inside a case
                    case = by_name[current]
                    yield Outcome(case.name, case.command, proc.returncode, 0, True, False, False, None, False,
                                  0.0, "worker process died").judge(case)
                    pending = [c for c in pending if c.name != current]
                else:
                    pending = []
                break
            buf = chunk
            try:
                msg = json.loads(buf)
            except json.JSONDecodeError:
                continue
            if "start" in msg:
                current, started = msg["start"], time.monotonic()
            elif "done" in msg:
                o = Outcome(**{k: v for k, v in msg["done"].items() if k != "problems"})
                case = by_name[o.name]
                pending = [c for c in pending if c.name != o.name]
                current = None
                yield o.judge(case)
        sel.close()
