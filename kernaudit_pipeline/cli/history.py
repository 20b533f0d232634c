"""``kernaudit history``: list recorded audits, accept a reference, compare an audit with it.

A comparison lists each regression with its confirmation: confirmed (re-measured in that audit
and still below the reference), unconfirmed (nothing could be re-measured) or refuted.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kernaudit_pipeline.cli import Parser

    parser.add_argument("--data-dir", default=None,
                        help="data folder holding history.duckdb (default: $KERNAUDIT_DATA_DIR or ./data)")
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=Parser,
                                help="list, accept or compare")
    sub.add_parser("list", help="every recorded audit, oldest first; * marks accepted references")
    acc = sub.add_parser("accept", help="make an audit the reference later audits compare with")
    acc.add_argument("run_id", help="Dagster run id (a unique prefix is enough)")
    acc.add_argument("--reviewer", default="cli", help="who accepts it (recorded)")
    cmp_ = sub.add_parser("compare", help="regressions of an audit against the last accepted one")
    cmp_.add_argument("run_id", nargs="?", help="the audit to compare (default: the latest)")
    cmp_.add_argument("--noise-band", type=float, default=0.02,
                      help="relative band inside which a difference is noise (default 0.02)")


def run(args: argparse.Namespace) -> int:
    from kernaudit_pipeline import history
    from kernaudit_pipeline.cli.errors import UserError
    from kernaudit_pipeline.settings import data_paths

    db = data_paths(args.data_dir).history_db
    try:
        if args.action == "list":
            for audit in history.list_audits(db):
                mark = "*" if audit.accepted else " "
                print(f"{mark} {audit.run_id}  {audit.recorded_utc}  {audit.trigger or '-':<8} keys={audit.rows}"
                      + (f"  accepted {audit.accepted_utc} by {audit.accepted_by}" if audit.accepted else ""))
            return 0
        if args.action == "accept":
            audit = history.accept(db, args.run_id, args.reviewer)
            print(f"accepted {audit.run_id} as the reference ({audit.rows} keys)")
            return 0
        if not 0 <= args.noise_band < 1:
            raise UserError("--noise-band must be in [0, 1)")
        run_id = history.resolve_run_id(db, args.run_id) if args.run_id else history.latest_run_id(db)
        result = history.compare(db, run_id, args.noise_band)
    except history.HistoryError as exc:
        raise UserError(str(exc)) from None
    if result.reference_run_id is None:
        print(f"{run_id}: no earlier accepted audit to compare with")
        return 0
    fmt = history.fmt
    print(f"{run_id} vs reference {result.reference_run_id}: {result.keys_compared} keys compared, "
          f"{len(result.confirmed)} confirmed regressions, {len(result.unconfirmed)} unconfirmed")
    for r in result.regressions:
        paired = ""
        if r.speedup is not None and r.reference_speedup is not None:
            paired = (f", speedup {fmt(r.reference_speedup, 3)} -> {fmt(r.speedup, 3)} "
                      f"[{fmt(r.speedup_ci_low, 3)}, {fmt(r.speedup_ci_high, 3)}] vs "
                      f"[{fmt(r.reference_speedup_ci_low, 3)}, {fmt(r.reference_speedup_ci_high, 3)}]")
        print(f"  {r.confirmation:<11} {r.kind:<11} {r.kernel_name} {r.shape_name} {r.config_id} {r.device_name}: "
              f"{fmt(r.reference_latency_us)} -> {fmt(r.latency_us)} us ({fmt(r.delta_pct)} %), "
              f"CI [{fmt(r.latency_ci_low_us)}, {fmt(r.latency_ci_high_us)}] vs "
              f"[{fmt(r.reference_ci_low_us)}, {fmt(r.reference_ci_high_us)}]{paired}")
    return 0
