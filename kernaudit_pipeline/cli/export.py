"""``kernaudit export``: vLLM drop-in tuned-config files from approved recommendations only."""

from __future__ import annotations

import argparse
from pathlib import Path

from kernaudit_pipeline.cli.errors import EXIT_FAILURE, UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("rec_ids", nargs="*", metavar="REC_ID",
                        help="recommendations to export (default: every approved one that can be)")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder to write into (default: the data folder's exports/)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="data folder holding recommendations.json and the trail "
                             "(default: KERNAUDIT_DATA_DIR or ./data)")
    parser.add_argument("--allow-slower", action="store_true",
                        help="also export a config that was measured slower than the baseline")
    parser.add_argument("--allow-unverified", action="store_true",
                        help="also export a config not verified to fit and to beat the baseline")
    parser.add_argument("--json", action="store_true", help="print what was written as JSON")


def run(args: argparse.Namespace) -> int:
    import json  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from kernaudit_pipeline.recommendations import export, review  # noqa: PLC0415

    if args.data_dir is not None and args.data_dir.exists() and not args.data_dir.is_dir():
        raise UserError(f"--data-dir {args.data_dir} is not a folder")
    try:
        result = export.export_approved(review.data_dir(args.data_dir), args.out, args.rec_ids or None,
                                        allow_slower=args.allow_slower, allow_unverified=args.allow_unverified)
    except review.UnknownRecommendation as exc:
        raise UserError(str(exc)) from None
    except review.ReviewError as exc:
        raise UserError(str(exc), exit_code=EXIT_FAILURE) from None
    for reason in result.skipped:
        print(f"kernaudit export: skipped: {' '.join(reason.split())}", file=sys.stderr)
    if args.json:
        print(json.dumps({"files": [str(p) for p in result.files], "rec_ids": list(result.rec_ids),
                          "manifest": str(result.manifest), "skipped": list(result.skipped)}, indent=2))
        return 0
    for path in result.files:
        print(path)
    print(f"exported {len(result.rec_ids)} approved recommendation(s); manifest {result.manifest}")
    return 0
