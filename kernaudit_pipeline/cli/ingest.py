"""``kernaudit ingest PATH... --out DIR``: profiler and benchmark files into normalized tables.

Writes ``kernel_runs.csv`` (rows that passed the schema), ``quarantine.csv`` (every record
that did not, with its reason), ``ncu_rules.csv`` (Nsight Compute's rule messages, when any)
and ``peaks.csv`` (the runner's measured ceilings, when any) into ``--out``, and prints one
line per input. An input that cannot be read is listed as skipped with its reason and the
others are still ingested; the tables are written whenever at least one input was read, and
the exit status is 2 when any named input was skipped. Large runner JSONL files are read and
validated in batches, so memory stays bounded by the batch, not the file.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", type=Path, metavar="PATH",
                        help="files or directories to ingest (Nsight Compute CSV or .ncu-rep, torch.profiler trace, "
                             "Proton hatchet, ptxas -v log, Triton cache directory, runner JSONL, seed JSON; "
                             "plain or .gz)")
    parser.add_argument("--out", type=Path, required=True,
                        help="folder to write kernel_runs.csv, quarantine.csv (and ncu_rules.csv, peaks.csv) into")
    parser.add_argument("--json", action="store_true",
                        help="print the per-file summary as JSON instead of lines")


def run(args: argparse.Namespace) -> int:
    from kernaudit_pipeline.cli.errors import UserError
    from kernaudit_pipeline.ingest.tables import TableWriter, ingest_to_tables

    try:
        writer = TableWriter(args.out)
    except OSError as exc:
        raise UserError(f"cannot write to {args.out}: {(exc.strerror or type(exc).__name__).lower()}") from None
    report = ingest_to_tables(args.paths, writer)
    if not report.files:
        writer.discard()
        first = report.skipped[0].reason if report.skipped else "no input"
        raise UserError(f"no input could be read ({report.skipped[0].path if report.skipped else ''}: {first})")
    try:
        written = writer.commit()
    except OSError as exc:
        raise UserError(f"cannot write to {args.out}: {(exc.strerror or type(exc).__name__).lower()}") from None
    if args.json:
        print(json.dumps(report.to_json(written), indent=2))
    else:
        for line in report.lines():
            print(line)
        print(f"wrote {written['kernel_runs']} ({report.kept} rows) and {written['quarantine']} "
              f"({report.quarantined} rows)" + (f"; {report.rules} ncu rule messages" if report.rules else ""))
    named = [s for s in report.skipped if s.named]
    if named:
        raise UserError(f"{len(named)} of {len(named) + len(report.files)} inputs skipped "
                        f"(first: {named[0].path}: {named[0].reason}); the tables hold the others")
    return 0
