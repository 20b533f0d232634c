"""``kernaudit rank``: order a kernel's config space by predicted time, with no GPU."""

from __future__ import annotations

import argparse
from pathlib import Path

from kernaudit_pipeline.cli.errors import UserError
from kernaudit_pipeline.cli.static import add_common, check_common, report_problems

TEXT_TOP = 10


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kernel", metavar="KERNEL",
                        help="kernels/ file stem, kernel NAME, or path to a module following the kernel contract")
    parser.add_argument("--shapes", nargs="+", metavar="NAME", default=None,
                        help="rank at these shapes only (default: every shape of the kernel)")
    parser.add_argument("--top", type=int, default=None, metavar="K",
                        help=f"list the K best configs per shape (default: {TEXT_TOP} in the table, all in --json)")
    parser.add_argument("--json", action="store_true",
                        help="print [{kernel_name, shape_name, ranked: [{config_id, predicted_us, ...}]}], best first")
    parser.add_argument("--device", default="NVIDIA H200",
                        help="GPU to predict for, by name (default: NVIDIA H200); sets the compile target")
    parser.add_argument("--calibration", type=Path, default=None,
                        help="cost-model calibration JSON (default: the one shipped with kernaudit)")
    add_common(parser, arch=False)


def _table(ranking, top: int) -> str:
    head = (f"{ranking.kernel_name} @ {ranking.shape_name} "
            f"({'memory' if ranking.memory_bound else 'compute'}-bound) on {ranking.device_name}: "
            f"{len(ranking.ranked)} ranked, {len(ranking.dropped)} dropped; PREDICTED, model error "
            f"about ±{100 * ranking.stated_error:.0f} % (≈ marks configs within it of the best)")
    rows = [["#", "config_id", "pred_us", "x_best", "", "regs", "spill_B", "smem_B", "occ%",
             "limiter", "waves", "bound"]]
    for r in ranking.ranked[:top]:
        rows.append([str(r.predicted_rank), r.config_id, f"{r.predicted_us:.1f}", f"{r.relative_to_best:.3f}",
                     "≈" if r.within_error_of_best else "", str(r.registers_per_thread),
                     str(r.spill_stores_bytes), str(r.shared_mem_bytes), f"{r.occupancy_pct:.0f}",
                     r.occupancy_limiter, f"{r.waves:.2f}", r.bound])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [head] + ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    if ranking.dropped:
        kinds: dict[str, int] = {}
        for d in ranking.dropped:
            key = d.reason.split(":")[0] if d.reason[:1].isupper() else "heavy spill (>= 512 B/thread)"
            kinds[key] = kinds.get(key, 0) + 1
        lines.append("dropped: " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    import json  # noqa: PLC0415

    check_common(args)
    if args.top is not None and args.top < 1:
        raise UserError("--top must be at least 1")
    from kernaudit_pipeline.rank.model import CalibrationError, load_calibration  # noqa: PLC0415
    from kernaudit_pipeline.rank.ranking import rank_kernels  # noqa: PLC0415
    from kernaudit_pipeline.static_resources import UnknownKernel  # noqa: PLC0415

    calibration = None
    if args.calibration is not None:
        if not args.calibration.is_file():
            what = "not a regular file" if args.calibration.exists() else "no such file"
            raise UserError(f"--calibration {args.calibration}: {what}")
        try:
            calibration = load_calibration(args.calibration)
        except CalibrationError as exc:
            raise UserError(f"--calibration {exc}") from None
    try:
        report = rank_kernels([args.kernel], shapes=args.shapes, device_name=args.device,
                              timeout_s=args.timeout_s, max_workers=args.jobs,
                              calibration=calibration, progress=not args.json,
                              module_timeout_s=args.module_timeout_s)
    except UnknownKernel as exc:
        raise UserError(str(exc.args[0])) from None
    except (KeyError, ValueError) as exc:
        raise UserError(str(exc.args[0] if exc.args else exc)) from None
    report_problems([f"{f.module}: {f.reason}" for f in report.failures], "rank", bool(report.rankings))
    if args.json:
        payload = []
        for r in report.rankings:
            d = r.to_dict()
            if args.top is not None:
                d["ranked"] = d["ranked"][: args.top]
            payload.append(d)
        print(json.dumps(payload, indent=2))
    else:
        print("\n\n".join(_table(r, args.top or TEXT_TOP) for r in report.rankings))
    return 1 if report.failures else 0
