"""``kernaudit audit``: materialize the whole asset graph in-process, show it working, end with the decisions.

It uses the same Definitions as the Dagster UI, a SQLite Dagster instance under the data
folder (``DAGSTER_HOME``) and the local MLflow store. While it runs, each stage's start and
end is printed with its elapsed time (:class:`StageLog`, fed by the instance's event
listener); long loops inside a stage draw their own progress bar
(:mod:`kernaudit_pipeline.core.progress`). A failed run ends in one line naming the failed
step, the root cause and the log file that holds Dagster's full error dump.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import uuid
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TextIO

from kernaudit_pipeline.core.progress import fmt_duration
from kernaudit_pipeline.settings import PROJECT_ROOT, data_paths


def prepare_dagster_home(data_dir: str | None = None) -> Path:
    """Point DAGSTER_HOME into the data folder and give it the project's dagster.yaml."""
    paths = data_paths(data_dir).ensure()
    os.environ["KERNAUDIT_DATA_DIR"] = str(paths.root)
    home = Path(os.environ.setdefault("DAGSTER_HOME", str(paths.dagster_home)))
    home.mkdir(parents=True, exist_ok=True)
    project_yaml = PROJECT_ROOT / "dagster.yaml"
    if project_yaml.exists() and not (home / "dagster.yaml").exists():
        shutil.copy(project_yaml, home / "dagster.yaml")
    return home


class StageLog:
    """Prints ``[0:12] static_resources … done in 8.1 s`` lines from the run's step events."""

    def __init__(self, stream: TextIO | None = None, clock=time.monotonic, hidden: frozenset[str] = frozenset()) -> None:
        self.stream = stream or sys.stderr
        self.hidden = set(hidden)  # steps not worth a line (the asset checks: summed up at the end)
        self._clock = clock
        self._start = clock()
        self._step_start: dict[str, float] = {}
        self.finished: list[tuple[str, float, bool]] = []

    def _stamp(self) -> str:
        seconds = int(self._clock() - self._start)
        return f"[{seconds // 60}:{seconds % 60:02d}]"

    def step_started(self, step: str) -> None:
        self._step_start[step] = self._clock()
        print(f"{self._stamp()} {step} …", file=self.stream, flush=True)

    def step_ended(self, step: str, ok: bool) -> None:
        took = self._clock() - self._step_start.pop(step, self._clock())
        self.finished.append((step, took, ok))
        word = "done" if ok else "FAILED"
        print(f"{self._stamp()} {step} {word} in {took:.1f} s", file=self.stream, flush=True)

    def __call__(self, entry) -> None:
        """An instance event listener: reacts to step start, success and failure."""
        event = getattr(entry, "dagster_event", None)
        if event is None or not entry.step_key or entry.step_key in self.hidden:
            return
        kind = event.event_type_value
        if kind == "STEP_START":
            self.step_started(entry.step_key)
        elif kind in ("STEP_SUCCESS", "STEP_FAILURE"):
            self.step_ended(entry.step_key, kind == "STEP_SUCCESS")


@dataclass(frozen=True)
class CheckOutcome:
    name: str
    asset: str
    passed: bool
    severity: str


@dataclass(frozen=True)
class AuditOutcome:
    run_id: str
    success: bool
    report_dir: Path
    elapsed_s: float
    failure: str | None = None  # one line: the failed step and the root cause
    log_path: Path | None = None  # Dagster's full error dump, when it failed
    checks: tuple[CheckOutcome, ...] = field(default_factory=tuple)
    result: object = None  # the ExecuteInProcessResult


def _root_cause(error) -> str:
    """The innermost cause of a Dagster error, as ``Type: first line``."""
    while getattr(error, "cause", None) is not None:
        error = error.cause
    message = (error.message or "").strip()
    first = message.splitlines()[0] if message else ""
    name = error.cls_name or "Error"
    head, sep, rest = first.partition(": ")
    if sep and head.split(".")[-1] == name:  # "package.module.IngestError: text" -> "IngestError: text"
        first = rest
    return f"{name}: {first}"


def failure_summary(result, logs_dir: Path) -> tuple[str, Path | None]:
    """(one line, the log file with every failure's full text) for a failed run."""
    failures = [e for e in result.all_events if e.event_type_value in ("STEP_FAILURE", "RUN_FAILURE")]
    steps = [e for e in failures if e.event_type_value == "STEP_FAILURE"]
    first = steps[0] if steps else (failures[0] if failures else None)
    if first is None:
        return "the run failed without a failure event", None
    data = first.event_specific_data
    error = getattr(data, "error", None)
    cause = _root_cause(error) if error is not None else (first.message or "unknown failure")
    where = f"step {first.step_key} failed" if first.step_key else "the run failed"
    logs_dir.mkdir(parents=True, exist_ok=True)
    path = logs_dir / f"audit-{result.run_id}.log"
    lines = [f"kernaudit audit: run {result.run_id} failed at {datetime.now(timezone.utc):%Y-%m-%d %H:%M:%SZ}", ""]
    for event in failures:
        err = getattr(event.event_specific_data, "error", None)
        lines += [f"== {event.event_type_value} {event.step_key or ''}".rstrip(), event.message or "",
                  err.to_string() if err is not None else "", ""]
    path.write_text("\n".join(lines))
    return f"{where}: {cause}", path


def check_outcomes(result) -> tuple[CheckOutcome, ...]:
    out = []
    for event in result.all_events:
        if event.event_type_value != "ASSET_CHECK_EVALUATION":
            continue
        data = event.asset_check_evaluation_data
        out.append(CheckOutcome(name=data.check_name, asset=data.asset_key.to_user_string(), passed=data.passed,
                                severity=str(getattr(data.severity, "value", data.severity))))
    return tuple(out)


def check_steps(defs) -> set[str]:
    """The step keys of the standalone asset checks (Dagster names them ``<asset>_<check>``)."""
    keys = defs.resolve_asset_graph().asset_check_keys
    return {f"{key.asset_key.to_python_identifier()}_{key.name}" for key in keys}


def run_audit(settings_kwargs: dict | None = None, data_dir: str | None = None, quiet: bool = False, *,
              tags: dict[str, str] | None = None, stage_log: StageLog | None = None,
              log_level: str | None = None):
    """Run ``audit_job`` in-process; returns (result, report directory).

    ``stage_log`` receives the run's step events as they happen; ``log_level`` is Dagster's
    console level (default WARNING, CRITICAL when ``quiet``).
    """
    prepare_dagster_home(data_dir)
    warnings.filterwarnings("ignore", module="dagster")
    warnings.filterwarnings("ignore", module="dagster_mlflow")
    from dagster import DagsterInstance

    from kernaudit_pipeline.defs.definitions import AUDIT_JOB, build_definitions
    from kernaudit_pipeline.defs.resources import AuditSettings

    settings = AuditSettings(data_dir=str(data_paths(data_dir).root), **(settings_kwargs or {}))
    defs = build_definitions(settings)
    job = defs.resolve_job_def(AUDIT_JOB)
    run_id = str(uuid.uuid4())
    level = log_level or ("CRITICAL" if quiet else "WARNING")
    with DagsterInstance.get() as instance:
        if stage_log is not None:
            stage_log.hidden.update(check_steps(defs))
            instance.add_event_listener(run_id, stage_log)
        run_config = {"loggers": {"console": {"config": {"log_level": level}}}}
        result = job.execute_in_process(instance=instance, raise_on_error=False, run_config=run_config,
                                        run_id=run_id, tags={"kernaudit/trigger": "cli", **(tags or {})})
    report_dir = settings.paths().reports / result.run_id
    return result, report_dir


def audit(settings_kwargs: dict | None = None, data_dir: str | None = None, *, quiet: bool = False,
          verbose: bool = False, tags: dict[str, str] | None = None, stream: TextIO | None = None) -> AuditOutcome:
    """The CLI's audit: stage lines on ``stream`` (stderr) unless quiet, a one-line failure with a log file."""
    start = time.monotonic()
    stage_log = None if quiet else StageLog(stream)
    # Dagster's own console lines only with --verbose: a failure is summed up in one line and its
    # full dump goes to a log file (failure_summary)
    result, report_dir = run_audit(settings_kwargs, data_dir, quiet, tags=tags, stage_log=stage_log,
                                   log_level="INFO" if verbose else "CRITICAL")
    elapsed = time.monotonic() - start
    checks = check_outcomes(result)
    if result.success:
        return AuditOutcome(result.run_id, True, report_dir, elapsed, checks=checks, result=result)
    line, log_path = failure_summary(result, data_paths(data_dir).root / "logs")
    return AuditOutcome(result.run_id, False, report_dir, elapsed, failure=line, log_path=log_path, checks=checks,
                        result=result)


def checks_line(checks: tuple[CheckOutcome, ...]) -> str:
    """``checks: 7 of 8 passed; failed: decision_per_group (WARN)``."""
    failed = [c for c in checks if not c.passed]
    text = f"checks: {len(checks) - len(failed)} of {len(checks)} passed"
    if failed:
        text += "; failed: " + ", ".join(f"{c.name} on {c.asset} ({c.severity})" for c in failed)
    return text


def elapsed_text(seconds: float) -> str:
    return fmt_duration(seconds)
