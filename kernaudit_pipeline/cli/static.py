"""``kernaudit static``: the compile-time resource table of kernels' config spaces, no GPU."""

from __future__ import annotations

import argparse
from pathlib import Path

from kernaudit_pipeline.cli.errors import UserError


def add_common(parser: argparse.ArgumentParser, *, arch: bool = True) -> None:
    """Options ``kernaudit static`` and ``kernaudit rank`` share (rank takes its compile target
    from the GPU it predicts for, so it has no --arch)."""
    from kernaudit_pipeline.static_resources.results import ARCHS  # noqa: PLC0415 - stdlib only

    if arch:
        parser.add_argument("--arch", default="sm_90", choices=list(ARCHS),
                            help="compile target (default sm_90, the H100/H200)")
    parser.add_argument("--timeout-s", type=float, default=300.0,
                        help="seconds allowed for each compile and for a compile worker to start (default 300)")
    parser.add_argument("--module-timeout-s", type=float, default=None,
                        help="seconds allowed for importing a kernel module and running its compile_args "
                             "(default: 60, or --timeout-s if smaller)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="parallel compile workers (default: the CPU count)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="data folder holding the compile cache (default: KERNAUDIT_DATA_DIR or ./data)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kernels", nargs="*", metavar="KERNEL",
                        help="kernel NAME, kernels/ file stem or path to a kernel module "
                             "(default: every module in kernels/)")
    parser.add_argument("--all-shapes", action="store_true",
                        help="compile every shape, not only each kernel's first")
    parser.add_argument("--configs", default=None, metavar="ID[,ID...]",
                        help="only these config ids (e.g. BK64_BM128_BN256_GM8_s3_w8)")
    add_common(parser)
    parser.add_argument("--json", action="store_true", help="print the rows as a JSON array")
    parser.add_argument("--no-cache", action="store_true",
                        help="recompile everything, bypassing the audit cache and Triton's own "
                             "(the results still refresh the audit cache)")


def check_common(args: argparse.Namespace) -> None:
    """Validate the shared options and point the data folder where asked."""
    import math  # noqa: PLC0415
    import os  # noqa: PLC0415

    if not math.isfinite(args.timeout_s) or args.timeout_s <= 0:
        raise UserError("--timeout-s must be positive")
    if args.module_timeout_s is not None and not (math.isfinite(args.module_timeout_s) and args.module_timeout_s > 0):
        raise UserError("--module-timeout-s must be positive")
    if args.jobs is not None and args.jobs < 1:
        raise UserError("--jobs must be at least 1")
    if args.data_dir is not None:
        if args.data_dir.exists() and not args.data_dir.is_dir():
            raise UserError(f"--data-dir {args.data_dir} is not a folder")
        os.environ["KERNAUDIT_DATA_DIR"] = str(args.data_dir.resolve())


def describe_or_fail(refs: list, args: argparse.Namespace) -> tuple[list, list[str]]:
    """Descriptions of the asked-for kernels (all of kernels/ when none), and one line per
    module that could not be described (imported, or its compile_args run, in a worker)."""
    from kernaudit_pipeline.kernel_spec import kernel_files  # noqa: PLC0415
    from kernaudit_pipeline.static_resources import (  # noqa: PLC0415
        KernelFailure, UnknownKernel, describe_kernels,
    )

    try:
        got = describe_kernels(refs or kernel_files(), timeout_s=args.timeout_s, max_workers=args.jobs,
                               module_timeout_s=args.module_timeout_s)
    except UnknownKernel as exc:
        raise UserError(str(exc.args[0])) from None
    problems = [f"{d.module}: {d.reason}" for d in got if isinstance(d, KernelFailure)]
    return [d for d in got if not isinstance(d, KernelFailure)], problems


def report_problems(problems: list[str], command: str, anything_left: bool) -> None:
    """Nothing left to do: the reasons as the one error line. Otherwise one line per module
    that failed, on stderr, and the command goes on with the rest (exit 1 at the end)."""
    import sys  # noqa: PLC0415

    if not anything_left:
        raise UserError("; ".join(problems) if problems else "no kernel modules to audit")
    for line in problems:
        print(f"kernaudit {command}: {line}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    import dataclasses  # noqa: PLC0415
    import json  # noqa: PLC0415

    from kernaudit_pipeline.static_resources import (  # noqa: PLC0415
        PlanItem, format_table, summary, sweep_report,
    )

    check_common(args)
    described, problems = describe_or_fail(list(args.kernels), args)
    wanted = [c for c in args.configs.split(",") if c] if args.configs else None
    plan = []
    for desc in described:
        cfgs = None
        if wanted is not None:
            cfgs = [c for c in wanted if c in desc.module_config_ids]
            if not cfgs:
                continue
        plan.append(PlanItem(desc, configs=cfgs, all_shapes=args.all_shapes))
    if wanted is not None:
        known = {c for d in described for c in d.module_config_ids}
        missing = [c for c in wanted if c not in known]
        if missing:
            raise UserError(f"unknown config id(s): {', '.join(missing)}")
    report_problems(problems, "static", bool(plan))
    report = sweep_report(plan, arch=args.arch, timeout_s=args.timeout_s, max_workers=args.jobs,
                          use_cache=not args.no_cache, module_timeout_s=args.module_timeout_s)
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in report.results], indent=2))
    else:
        print(format_table(report.results))
        print(summary(report.results))
    return 1 if problems or report.failures else 0
