"""``kernaudit assess FILE.json``: seed-format items in, one verdict and recommendation per item out."""

from __future__ import annotations

import argparse
from pathlib import Path

from kernaudit_pipeline.cli.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, metavar="FILE",
                        help='JSON array of seed-format items: {"input": {...}} or bare input objects')
    parser.add_argument("--noise-band", type=float, default=0.02,
                        help="relative speedup band treated as NEUTRAL (default 0.02)")
    parser.add_argument("--brief", action="store_true",
                        help="print only the seed's four fields: status, spill_detected, speedup_ratio, "
                             "recommendation")


def run(args: argparse.Namespace) -> int:
    import json  # noqa: PLC0415
    import math  # noqa: PLC0415

    from kernaudit_pipeline.assess import InputError, assess_file  # noqa: PLC0415
    from kernaudit_pipeline.core.values import json_safe  # noqa: PLC0415

    if not math.isfinite(args.noise_band) or not 0 <= args.noise_band < 1:
        raise UserError("--noise-band must be a fraction between 0 and 1")
    try:
        results = assess_file(args.file, args.noise_band, brief=args.brief)
    except InputError as exc:
        raise UserError(str(exc)) from None
    print(json.dumps(json_safe(results), indent=2, allow_nan=False, default=str))
    return 0
