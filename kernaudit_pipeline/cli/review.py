"""``kernaudit review``: list, approve, reject and verify recommendations (human sign-off).

The trail is append-only and hash-chained; its head is also kept in the history DB, and every
approval records the sha256 of the recommendation's content (see recommendations/review.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kernaudit_pipeline.cli.errors import EXIT_FAILURE, UserError

STATES = ("PENDING_REVIEW", "APPROVED", "REJECTED", "STALE")


def _data_dir_option(parser: argparse.ArgumentParser, default: object) -> None:
    parser.add_argument("--data-dir", type=Path, default=default,
                        help="data folder holding recommendations.json and the trail "
                             "(default: KERNAUDIT_DATA_DIR or ./data)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _data_dir_option(parser, None)
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True, parser_class=type(parser),
                                help="what to do: list, approve, reject or verify")
    lst = sub.add_parser("list", help="list recommendations with their verification and review state",
                         description="List recommendations with their verification and review state.")
    lst.add_argument("--state", choices=STATES, default=None, help="only recommendations in this review state")
    lst.add_argument("--json", action="store_true", help="print the records as a JSON array")
    _data_dir_option(lst, argparse.SUPPRESS)
    for name, verb in (("approve", "approve"), ("reject", "reject")):
        p = sub.add_parser(name, help=f"{verb} one recommendation (appends to the trail)",
                           description=f"{verb.capitalize()} one recommendation; the decision is appended "
                                       "to the trail with the sha256 of what was reviewed.")
        p.add_argument("rec_id", metavar="REC_ID", help="the recommendation's id (rec-...), from kernaudit review list")
        p.add_argument("--reviewer", required=True, help="who decides (a name, recorded in the trail)")
        p.add_argument("--comment", required=True, help="why (recorded in the trail)")
        _data_dir_option(p, argparse.SUPPRESS)
    ver = sub.add_parser("verify", help="check the trail's hash chain against the head kept in the history DB",
                         description="Check the trail's hash chain and its head against the history DB.")
    _data_dir_option(ver, argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    import json  # noqa: PLC0415

    from kernaudit_pipeline.recommendations import review  # noqa: PLC0415
    from kernaudit_pipeline.recommendations.model import ReviewState, recommendation_to_json  # noqa: PLC0415

    if args.data_dir is not None and args.data_dir.exists() and not args.data_dir.is_dir():
        raise UserError(f"--data-dir {args.data_dir} is not a folder")
    root = review.data_dir(args.data_dir)
    try:
        if args.action == "list":
            recs = review.load_recommendations(root)
            if args.state:
                recs = [r for r in recs if r.review_state == args.state]
            if args.json:
                print(json.dumps([recommendation_to_json(r) for r in recs], indent=2))
            else:
                print(review.format_table(recs))
            return 0
        if args.action == "verify":
            entries, head = review.trail_head(root)
            print(f"trail ok: {entries} decision(s); head sha256 {head} (matches history.duckdb)")
            return 0
        decision = ReviewState.APPROVED if args.action == "approve" else ReviewState.REJECTED
        done = review.decide(root, args.rec_id, decision, args.reviewer, args.comment)
    except review.UnknownRecommendation as exc:
        raise UserError(str(exc)) from None
    except review.ReviewError as exc:
        raise UserError(str(exc), exit_code=EXIT_FAILURE) from None
    e = done.entry
    print(f"{e.rec_id} {e.decision} by {e.reviewer} at {e.timestamp_utc} (content sha256 {e.content_sha256[:12]})")
    for path in done.invalidated:
        print(f"revoked its entries in {path}")
    return 0
