"""``kernaudit synth``: regenerate the committed synthetic attention tables (modelled data)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kernaudit_pipeline.settings import SYNTHETIC_DIR

    parser.add_argument("--out", type=Path, default=SYNTHETIC_DIR,
                        help="folder to write attention_runs.csv into (default: samples/synthetic)")
    parser.add_argument("--seed", type=int, default=0,
                        help="random seed of the generator; the committed table uses 0")
    parser.add_argument("--faults", type=int, default=3,
                        help="rows deliberately corrupted to exercise the quarantine (default 3)")


def run(args: argparse.Namespace) -> int:
    import pandas as pd

    from kernaudit_pipeline.settings import PROJECT_ROOT
    from kernaudit_pipeline.synthetic import write_tables

    path = write_tables(args.out, args.seed, args.faults)
    frame = pd.read_csv(path)
    try:
        shown = path.relative_to(PROJECT_ROOT)
    except ValueError:
        shown = path
    print(f"wrote {len(frame)} modelled rows ({(frame['run_status'] == 'OUT_OF_RESOURCES').sum()} over shared "
          f"memory, {(frame['spill_stores_bytes'] > 0).sum()} spilling) to {shown}")
    return 0
