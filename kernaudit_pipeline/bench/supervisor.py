"""The parent side of the runner: start workers, watch their progress, turn deaths into rows.

A worker writes the step it is on (``<shape>|<config id or reference label>``) to a progress
file before starting it. The supervisor kills a worker whose current step, start-up included,
has run longer than ``--timeout-s``, or that is still running at the sweep's deadline. When a
worker dies (killed, segfault, illegal address, OOM, an exception) the step in flight becomes
a TIMEOUT / CRASHED / OOM row (NOT_RUN when it was the deadline that stopped it) and a new
worker carries on with what is left, up to
``max_attempts`` workers per kernel. The parent never imports a kernel module: it works from
the plan a ``plan`` worker wrote. Standard library only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kernaudit_pipeline.bench.options import BenchOptions
from kernaudit_pipeline.bench.plan import KernelPlan
from kernaudit_pipeline.bench.records import (
    REF_TIMING_MARK, DeviceInfo, RecordParts, RecordType, build_record, read_jsonl, reference_config_id,
    to_json_line,
)
from kernaudit_pipeline.core.verdicts import RunStatus

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKER_MODULE = "kernaudit_pipeline.bench.worker"
POLL_S = 0.1
# A sweep worker is told to end its shapes this long before the sweep's deadline (its open
# sessions write their rows, flagged), and is killed only at the deadline itself.
WRAP_UP_S = 6.0


@dataclass
class Sweep:
    """The state of one ``kernaudit bench`` run in the parent."""

    out: Path
    options: BenchOptions
    deadline: float
    work_dir: Path
    driver_version: str | None
    device: DeviceInfo
    rows: list[dict] = field(default_factory=list)
    precompile_wall_s: float = 0.0

    def emit(self, row: dict) -> None:
        self.rows.append(row)
        with self.out.open("a") as fh:
            fh.write(to_json_line(row) + "\n")


@dataclass
class Group:
    """One kernel to sweep (several workers when crashes require)."""

    plan: KernelPlan
    shapes: list[str]
    configs: list[str]


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def spawn(spec: dict, work_dir: Path, tag: str) -> tuple[subprocess.Popen, Path]:
    spec_path = work_dir / f"{tag}.spec.json"
    spec_path.write_text(json.dumps(spec))
    log_path = work_dir / f"{tag}.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", WORKER_MODULE, str(spec_path)],
                                stdout=log, stderr=subprocess.STDOUT, env=worker_env(),
                                cwd=str(REPO_ROOT), start_new_session=True)
    return proc, log_path


def kill(proc: subprocess.Popen) -> None:
    """End a worker we started, and its children, by its own process group id."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


@dataclass(frozen=True)
class Kill:
    """Why the supervisor killed a worker. A step that outran ``--timeout-s`` is the step's
    fault (TIMEOUT); one still running when the sweep's time ran out is not: a busy host or a
    slow wrap-up must not brand the config in flight as hanging, so that is NOT_RUN."""

    message: str
    at_deadline: bool = False


def classify_exit(log_tail: str, killed: Kill | None, returncode: int | None) -> tuple[RunStatus, str]:
    if killed is not None:
        return (RunStatus.NOT_RUN if killed.at_deadline else RunStatus.TIMEOUT), killed.message
    lines = [ln.strip() for ln in log_tail.splitlines() if ln.strip() and not ln.startswith("[bench]")]
    last = lines[-1][:400] if lines else ""
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        last = f"killed by {name}" + (f"; {last}" if last else "")
    if "out of memory" in log_tail.lower():
        return RunStatus.OOM, f"worker exit {returncode}: {last}"
    return RunStatus.CRASHED, f"worker exit {returncode}: {last}"


def _echo_new(log_path: Path, printed: int) -> int:
    try:
        data = log_path.read_bytes()
    except OSError:
        return printed
    if len(data) > printed:
        sys.stdout.write(data[printed:].decode(errors="replace"))
        sys.stdout.flush()
    return len(data)


def log_tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


class StepWatch:
    """The step a worker is on (its progress file) and since when: what the step limit and the
    deadline are checked against, for a worker per run and for the search's kept-up one."""

    def __init__(self, progress: Path):
        self.progress = progress
        self.step, self.started = "", time.monotonic()

    def update(self) -> None:
        try:
            current = self.progress.read_text()
        except OSError:
            current = self.step
        if current != self.step:
            self.step, self.started = current, time.monotonic()

    def overrun(self, step_timeout_s: float, deadline: float) -> Kill | None:
        """Why the worker must be stopped now, if it must: its step ran over the limit (start-up
        included), or the sweep's deadline passed."""
        now = time.monotonic()
        if now - self.started > step_timeout_s:
            return Kill(f"step {self.step or 'start-up'!r} ran over {step_timeout_s:g} s")
        if now > deadline:
            return Kill(f"sweep deadline reached during {self.step or 'start-up'!r}; its worker was stopped",
                        at_deadline=True)
        return None


def supervise(spec: dict, work_dir: Path, tag: str, step_timeout_s: float, deadline: float,
              echo: bool = True) -> tuple[int | None, Kill | None, str]:
    """Run one worker to its end, killing it when the step in flight (start-up included)
    outlasts ``step_timeout_s`` or the deadline passes. Returns (returncode, the kill if there
    was one, progress marker at exit)."""
    progress = Path(spec["progress_path"])
    progress.write_text("")
    proc, log_path = spawn(spec, work_dir, tag)
    killed_for = None
    watch = StepWatch(progress)
    printed = 0
    while True:
        rc = proc.poll()
        watch.update()
        if echo:
            printed = _echo_new(log_path, printed)
        if rc is not None:
            break
        killed_for = watch.overrun(step_timeout_s, deadline)
        if killed_for is not None:
            kill(proc)
            break
        time.sleep(POLL_S)
    if echo:
        _echo_new(log_path, printed)
    try:
        final = progress.read_text()
    except OSError:
        final = watch.step
    return proc.returncode, killed_for, final


# --------------------------------------------------------------------------------------------
# planning: the kernel modules are imported in workers, with the same timeout
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlanFailure:
    path: Path
    status: RunStatus
    message: str


def plan_kernels(paths: list[Path], work_dir: Path, timeout_s: float,
                 deadline: float) -> tuple[list[KernelPlan], list[PlanFailure]]:
    """A plan per kernel module, each from its own worker, all at once; a module that hangs
    at import (or in its config/shape code) is killed at ``timeout_s``."""
    running = []
    for i, path in enumerate(paths):
        tag = f"plan.{i}.{path.stem}"
        spec = {"mode": "plan", "kernel_path": str(path), "plan_path": str(work_dir / f"{tag}.json"),
                "rows_path": str(work_dir / f"{tag}.rows.jsonl"),
                "progress_path": str(work_dir / f"{tag}.progress")}
        Path(spec["progress_path"]).write_text("")
        proc, log = spawn(spec, work_dir, tag)
        running.append((path, spec, proc, log, time.monotonic()))
    plans, failures = [], []
    for path, spec, proc, log, started in running:
        killed_for = None
        while proc.poll() is None:
            now = time.monotonic()
            if now - started > timeout_s:
                step = Path(spec["progress_path"]).read_text() or "start-up"
                killed_for = Kill(f"kernel module {step!r} ran over {timeout_s:g} s")
                kill(proc)
                break
            if now > deadline:
                step = Path(spec["progress_path"]).read_text() or "start-up"
                killed_for = Kill(f"sweep deadline reached while planning ({step!r})", at_deadline=True)
                kill(proc)
                break
            time.sleep(POLL_S)
        plan_path = Path(spec["plan_path"])
        if killed_for is None and proc.returncode == 0 and plan_path.exists():
            plans.append(KernelPlan.from_json(plan_path.read_text()))
            continue
        status, message = classify_exit(log_tail(log), killed_for, proc.returncode)
        failures.append(PlanFailure(path, status, f"cannot plan {path.name}: {message}"))
    return plans, failures


def plan_failure_row(failure: PlanFailure, device: DeviceInfo) -> dict:
    """A kernel that could not even be planned still leaves a row saying why."""
    return {"record_type": RecordType.RUN.value, "kernel_name": failure.path.stem,
            "kernel_module": failure.path.stem, "config_id": None, "shape_name": None,
            "run_status": str(failure.status), "run_message": failure.message, **asdict(device)}


# --------------------------------------------------------------------------------------------
# one kernel's sweep through as many workers as it takes
# --------------------------------------------------------------------------------------------
def failure_row(plan: KernelPlan, shape_name: str, cid: str, status: RunStatus, message: str,
                device: DeviceInfo, attempt: int | None) -> dict:
    sp = plan.shape(shape_name)
    return asdict(build_record(RecordType.RUN, plan.info, sp.shape, device, status, RecordParts(
        config=plan.config(cid), grid=sp.grids.get(cid), message=message, flops=sp.flops,
        bytes_moved=sp.bytes_moved, attempt=attempt)))


def _reference_row(plan: KernelPlan, shape_name: str, label: str, status: RunStatus, message: str,
                   device: DeviceInfo, attempt: int) -> dict:
    refs = {reference_config_id(r.key): r for r in plan.references}
    ref = refs.get(label)
    sp = plan.shape(shape_name)
    return asdict(build_record(RecordType.BASELINE, plan.info, sp.shape, device, status, RecordParts(
        message=message, baseline_name=ref.name if ref else None,
        baseline_variant=ref.key if ref else None, baseline_backend=ref.backend if ref else None,
        flops=sp.flops, bytes_moved=sp.bytes_moved, attempt=attempt)))


def absorb_rows(rows: list[dict], sweep: Sweep, refs_done: dict[str, dict[str, dict]]) -> set[tuple[str, str]]:
    """Emit a worker's rows; note each reference it checked (so a later worker of the same
    shapes need not check it again). Returns the (shape, config) pairs that got a run row."""
    done: set[tuple[str, str]] = set()
    for row in rows:
        if row.get("record_type") == RecordType.RUN.value:
            done.add((row.get("shape_name"), row.get("config_id")))
        elif row.get("record_type") == RecordType.BASELINE.value:
            refs_done.setdefault(row.get("shape_name"), {})[row.get("config_id")] = {
                "status": row.get("run_status"), "backend": row.get("baseline_backend"),
                "message": row.get("run_message")}
        sweep.emit(row)
    return done


def sweep_spec(plan_path: Path, shapes: list[str], items: list[tuple[str, str]], refs_done: dict,
               failed_refs: dict, attempt: int, rows_path: Path, progress_path: Path, sweep: Sweep) -> dict:
    """What a sweep worker (or one batch of a serving worker) is told to do."""
    return {"mode": "sweep", "plan_path": str(plan_path), "shapes": shapes, "items": items,
            "references_done": refs_done, "failed_references": failed_refs, "attempt": attempt,
            "rows_path": str(rows_path), "progress_path": str(progress_path),
            "options": asdict(sweep.options), "driver_version": sweep.driver_version,
            "deadline_epoch": time.time() + (sweep.deadline - time.monotonic()) - WRAP_UP_S}


def run_group(group: Group, sweep: Sweep, max_attempts: int = 8,
              references_done: dict[str, dict[str, dict]] | None = None) -> None:
    """Sweep one kernel: the step in flight when a worker dies becomes a failure row, and a
    new worker carries on after it. ``references_done`` (shape -> reference label -> its row's
    status, backend and message), updated in place, lets a later call on the same shapes (a
    search's next batch) prepare the references without checking and timing them again."""
    plan = group.plan
    todo = [(s, c) for s in group.shapes for c in group.configs]
    todo_shapes = list(group.shapes)
    refs_done: dict[str, dict[str, dict]] = references_done if references_done is not None else {}
    failed_refs: dict[str, dict[str, str]] = {}
    attempt = 0
    last_failure = ""
    while todo_shapes and attempt < max_attempts and time.monotonic() < sweep.deadline:
        tag = f"{plan.stem}.{attempt}"
        rows_path = sweep.work_dir / f"{tag}.rows.jsonl"
        plan_path = sweep.work_dir / f"{plan.stem}.plan.json"
        plan_path.write_text(plan.to_json())
        spec = sweep_spec(plan_path, todo_shapes, todo, refs_done, failed_refs, attempt, rows_path,
                          sweep.work_dir / f"{tag}.progress", sweep)
        rc, killed_for, final = supervise(spec, sweep.work_dir, tag, sweep.options.timeout_s, sweep.deadline)
        rows = read_jsonl(rows_path.read_text()) if rows_path.exists() else []
        done = absorb_rows(rows, sweep, refs_done)
        if rc == 0 and killed_for is None:
            todo = [item for item in todo if item not in done]
            break
        status, message = classify_exit(log_tail(sweep.work_dir / f"{tag}.log"), killed_for, rc)
        last_failure = message
        shape_name, _, label = final.partition("|")
        known_shape = shape_name in group.shapes
        if known_shape and label.startswith("baseline"):
            if label not in refs_done.get(shape_name, {}):
                sweep.emit(_reference_row(plan, shape_name, label, status, message, sweep.device, attempt))
                refs_done.setdefault(shape_name, {})[label] = {"status": str(status), "message": message}
        elif known_shape and label.startswith(REF_TIMING_MARK):
            failed_refs.setdefault(shape_name, {})[label[len(REF_TIMING_MARK):]] = f"{status}: {message}"
        elif known_shape and label in group.configs and (shape_name, label) not in done:
            sweep.emit(failure_row(plan, shape_name, label, status, message, sweep.device, attempt))
            done.add((shape_name, label))
        elif known_shape and label == "inputs":  # the inputs cannot be made: every config fails
            for s, cid in todo:
                if s == shape_name and (s, cid) not in done:
                    sweep.emit(failure_row(plan, s, cid, status, f"inputs: {message}", sweep.device, attempt))
                    done.add((s, cid))
            todo_shapes = [s for s in todo_shapes if s != shape_name]
        elif not rows:
            print(f"[bench] {plan.stem}: worker failed before its first step: {message}", flush=True)
            attempt = max_attempts  # no progress is possible
        todo = [item for item in todo if item not in done]
        remaining = {s for s, _ in todo}
        todo_shapes = [s for s in todo_shapes if s in remaining]
        attempt += 1
    reason = ("sweep deadline reached" if time.monotonic() >= sweep.deadline
              else f"worker gave up: {last_failure}")
    for shape_name, cid in todo:
        sweep.emit(failure_row(plan, shape_name, cid, RunStatus.NOT_RUN, reason, sweep.device, None))


def run_peaks(sweep: Sweep) -> None:
    tag = "peaks"
    rows_path = sweep.work_dir / "peaks.rows.jsonl"
    spec = {"mode": "peaks", "rows_path": str(rows_path),
            "progress_path": str(sweep.work_dir / "peaks.progress"),
            "options": asdict(sweep.options), "driver_version": sweep.driver_version}
    rc, killed_for, final = supervise(spec, sweep.work_dir, tag, sweep.options.timeout_s, sweep.deadline)
    for row in (read_jsonl(rows_path.read_text()) if rows_path.exists() else []):
        sweep.emit(row)
    if rc != 0 or killed_for is not None:
        print(f"[bench] peaks worker ended at {final!r}: rc={rc} {killed_for.message if killed_for else ''}",
              flush=True)


def precompile(groups: list[Group], sweep: Sweep, jobs: int, budget_s: float) -> None:
    """Compile every (kernel, config, shape) in ``jobs`` parallel processes into the on-disk
    cache; stragglers are killed at ``budget_s`` (the sweep then compiles them itself)."""
    items = []
    for g in groups:
        plan_path = sweep.work_dir / f"{g.plan.stem}.plan.json"
        plan_path.write_text(g.plan.to_json())
        items += [{"plan_path": str(plan_path), "config_id": c, "shapes": list(g.shapes)} for c in g.configs]
    if not items or jobs <= 1 or sweep.options.device != "cuda":
        return
    t0 = time.monotonic()
    procs = [spawn({"mode": "precompile", "tasks": items[j::jobs]}, sweep.work_dir, f"precompile.{j}")[0]
             for j in range(min(jobs, len(items)))]
    end = min(t0 + budget_s, sweep.deadline)
    while any(p.poll() is None for p in procs) and time.monotonic() < end:
        time.sleep(0.25)
    stragglers = [p for p in procs if p.poll() is None]
    for p in stragglers:
        kill(p)
    sweep.precompile_wall_s = time.monotonic() - t0
    print(f"[bench] precompile: {len(items)} (kernel, config) tasks in {jobs} processes, "
          f"{sweep.precompile_wall_s:.1f} s, {len(stragglers)} killed at the budget", flush=True)


__all__ = ["Group", "Kill", "PlanFailure", "Sweep", "classify_exit", "failure_row", "kill",
           "plan_kernels", "precompile", "run_group", "run_peaks", "spawn", "supervise"]
