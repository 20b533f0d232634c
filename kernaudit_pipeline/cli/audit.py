"""``kernaudit audit``: run the whole audit in-process, show each stage, end with the decisions.

While it works it prints each stage with its elapsed time, and progress bars for long loops,
on stderr. At the end, on stdout: the decisions table (every decision), the checks, the next
step and where the report went. ``--quiet`` prints only the table and the paths.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from kernaudit_pipeline.cli.errors import EXIT_FAILURE, UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", help="data folder for the report, history, Dagster and MLflow state "
                        "(default: $KERNAUDIT_DATA_DIR, else ./data)")
    parser.add_argument("--source", action="append", default=[], metavar="FILE",
                        help="a trace file to audit instead of running the GPU runner or reading the committed "
                             "samples (repeatable)")
    parser.add_argument("--kernel", action="append", default=[], metavar="MODULE",
                        help="audit only this kernel module of kernels/, e.g. gemm (repeatable); the static "
                             "compile and the GPU runner both follow it, as in a sensor-triggered run")
    parser.add_argument("--no-synthetic", action="store_true",
                        help="leave out the synthetic (modelled) attention tables")
    parser.add_argument("--no-gpu", action="store_true", help="never run the GPU runner, even with a GPU present")
    parser.add_argument("--static-kernel", action="append", default=[], metavar="MODULE",
                        help="compile only this kernel module ahead of time (repeatable); the runs still cover "
                             "every kernel")
    parser.add_argument("--static-max-configs", type=int, default=0, metavar="N",
                        help="compile only the first N configs of each kernel (default 0: all)")
    parser.add_argument("--no-static", action="store_true",
                        help="skip the ahead-of-time compile (and so the recompiles that verify recommendations)")
    parser.add_argument("--noise-band", type=float, default=0.02, metavar="FRACTION",
                        help="speedups within 1 ± this fraction are NEUTRAL (default 0.02, i.e. ±2 %%)")
    parser.add_argument("--quiet", action="store_true", help="print only the decisions table and the paths")
    parser.add_argument("--verbose", action="store_true", help="also print Dagster's own log lines")


def _settings(args: argparse.Namespace) -> dict:
    for src in args.source:
        path = Path(src)
        if not path.exists():
            raise UserError(f"{src}: no such file")
        if not (path.is_file() or path.is_dir()):
            raise UserError(f"{src}: not a regular file or folder")
    if args.static_max_configs < 0:
        raise UserError("--static-max-configs must be 0 (all) or more")
    if not 0 <= args.noise_band < 1:
        raise UserError("--noise-band must be a fraction in [0, 1), e.g. 0.02")
    return {
        "sources": [str(Path(s).resolve()) for s in args.source],
        "include_synthetic": not args.no_synthetic,
        "use_gpu": "never" if args.no_gpu else "auto",
        "static_kernels": args.static_kernel,
        "static_max_configs": args.static_max_configs,
        "static_enabled": not args.no_static,
        "noise_band": args.noise_band,
    }


def _kernel_tags(modules: list[str]) -> dict[str, str]:
    if not modules:
        return {}
    from kernaudit_pipeline import kernel_sources
    from kernaudit_pipeline.defs.run_tags import selection_tags

    known = {s.module: s.kernel_name for s in kernel_sources.observe()}
    unknown = [m for m in modules if m not in known]
    if unknown:
        raise UserError(f"--kernel {unknown[0]}: not a module in kernels/ (known: {', '.join(sorted(known))})")
    return selection_tags(modules, [known[m] for m in modules])


def _quiet_logging() -> None:
    """MLflow's and alembic's INFO lines (store creation, migrations) are not the audit's output."""
    import logging

    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # read when mlflow configures its loggers
    for name in ("alembic", "alembic.runtime.migration", "urllib3"):
        logging.getLogger(name).setLevel(logging.WARNING)


def run(args: argparse.Namespace) -> int:
    settings = _settings(args)
    tags = _kernel_tags(args.kernel)
    if args.quiet:
        os.environ["KERNAUDIT_PROGRESS"] = "off"
    _quiet_logging()
    from kernaudit_pipeline.audit import audit, checks_line, elapsed_text
    from kernaudit_pipeline.audit_report.terminal import print_decisions
    from kernaudit_pipeline.defs.schedules import ScheduleConfigError
    from kernaudit_pipeline.gpu_devices import DeviceListingError
    from kernaudit_pipeline.settings import data_paths

    paths = data_paths(args.data_dir)
    if not args.quiet:
        print(f"kernaudit audit: data folder {paths.root}", file=sys.stderr, flush=True)
    try:
        outcome = audit(settings, args.data_dir, quiet=args.quiet, verbose=args.verbose, tags=tags)
    except (ScheduleConfigError, DeviceListingError) as exc:
        raise UserError(str(exc)) from None
    if not outcome.success:
        where = f" (details: {outcome.log_path})" if outcome.log_path else ""
        print(f"kernaudit audit: run {outcome.run_id} failed: {outcome.failure}{where}", file=sys.stderr)
        return EXIT_FAILURE
    report = outcome.report_dir
    payload = json.loads((report / "report.json").read_text())
    out = sys.stdout
    print_decisions(payload, out)
    if not args.quiet:
        print(checks_line(outcome.checks), file=out)
        pending = sum(1 for r in payload.get("recommendations") or [] if r.get("review_state") == "PENDING_REVIEW")
        data_flag = f" --data-dir {shlex.quote(args.data_dir)}" if args.data_dir else ""
        print(f"next: kernaudit review list{data_flag}   ({pending} recommendations wait for review; "
              f"approve one with kernaudit review approve REC_ID --reviewer NAME)", file=out)
        print(f"audit {outcome.run_id} took {elapsed_text(outcome.elapsed_s)}", file=out)
    print(f"report: {report / 'report.html'}", file=out)
    print(f"markdown: {report / 'report.md'}", file=out)
    print(f"json: {report / 'report.json'}", file=out)
    print(f"mlflow: mlflow ui --backend-store-uri {shlex.quote(paths.mlflow_tracking_uri)}", file=out)
    return 0
