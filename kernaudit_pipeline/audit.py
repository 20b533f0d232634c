"""``kernaudit audit``: materialize the whole asset graph in-process.

It uses the same Definitions as the Dagster UI, a SQLite Dagster instance
under the data folder (``DAGSTER_HOME``) and the local MLflow store, and
prints where the report went.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import warnings
from pathlib import Path

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


def run_audit(settings_kwargs: dict | None = None, data_dir: str | None = None, quiet: bool = False):
    """Run ``audit_job`` in-process; returns (result, report directory)."""
    prepare_dagster_home(data_dir)
    warnings.filterwarnings("ignore", module="dagster")
    warnings.filterwarnings("ignore", module="dagster_mlflow")
    from dagster import DagsterInstance

    from kernaudit_pipeline.defs.definitions import build_definitions
    from kernaudit_pipeline.defs.resources import AuditSettings

    settings = AuditSettings(data_dir=str(data_paths(data_dir).root), **(settings_kwargs or {}))
    defs = build_definitions(settings)
    job = defs.resolve_job_def("audit_job")
    with DagsterInstance.get() as instance:
        run_config = {"loggers": {"console": {"config": {"log_level": "WARNING" if quiet else "INFO"}}}}
        result = job.execute_in_process(instance=instance, raise_on_error=False, run_config=run_config)
    report_dir = settings.paths().reports / result.run_id
    return result, report_dir


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kernaudit audit", description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", help="data folder (default $KERNAUDIT_DATA_DIR or ./data)")
    parser.add_argument("--source", action="append", default=[], help="trace file to audit (repeatable); "
                        "default: a GPU run if a GPU is present, else the committed samples")
    parser.add_argument("--no-synthetic", action="store_true", help="leave out the synthetic attention tables")
    parser.add_argument("--no-gpu", action="store_true", help="never run the GPU runner, even with a GPU present")
    parser.add_argument("--static-kernel", action="append", default=[], help="limit the static audit to a kernel module")
    parser.add_argument("--static-max-configs", type=int, default=0, help="compile only the first N configs per kernel")
    parser.add_argument("--no-static", action="store_true", help="skip the ahead-of-time compile")
    parser.add_argument("--noise-band", type=float, default=0.02)
    parser.add_argument("--quiet", action="store_true", help="only warnings from Dagster")
    args = parser.parse_args(argv)
    for src in args.source:
        if not Path(src).exists():
            print(f"kernaudit audit: {src}: no such file", file=sys.stderr)
            return 2
    settings = {
        "sources": [str(Path(s).resolve()) for s in args.source],
        "include_synthetic": not args.no_synthetic,
        "use_gpu": "never" if args.no_gpu else "auto",
        "static_kernels": args.static_kernel,
        "static_max_configs": args.static_max_configs,
        "static_enabled": not args.no_static,
        "noise_band": args.noise_band,
    }
    result, report_dir = run_audit(settings, args.data_dir, args.quiet)
    if not result.success:
        failed = [e for e in result.all_events if e.is_step_failure]
        first = failed[0].event_specific_data.error.message.strip().splitlines()[0] if failed else "unknown failure"
        print(f"kernaudit audit: run {result.run_id} failed: {first}", file=sys.stderr)
        return 1
    print(f"report: {report_dir / 'report.html'}")
    print(f"markdown: {report_dir / 'report.md'}")
    print(f"mlflow: {data_paths(args.data_dir).mlflow_tracking_uri} (mlflow ui --backend-store-uri <that>)")
    return 0
