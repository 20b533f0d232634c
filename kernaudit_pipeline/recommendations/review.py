"""Human sign-off: ``kernaudit review`` and its append-only, hash-chained audit trail.

Every recommendation starts PENDING_REVIEW. A reviewer approves or rejects it
by id, with a name and a comment; each decision is one JSON line appended to
``<data>/review_trail.jsonl``. A recommendation's review state is the last
decision about it in the trail, so the trail, not the recommendations file,
is the record of who signed off what.

Each line carries ``prev_sha256`` (the SHA-256 of the previous line's bytes,
64 zeros for the first) and ``entry_sha256`` (the SHA-256 of its own fields).
Editing, deleting or reordering a line breaks the chain at that line, and the
trail is refused until it is restored. A rewrite of the last line that also
recomputes its hash cannot be detected from the file alone: ``review verify``
prints the head hash so it can be recorded elsewhere.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import sys
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Iterator

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kernaudit_pipeline.recommendations.model import (
    Recommendation, ReviewState, VerificationState, recommendation_from_json, recommendation_to_json,
)
from kernaudit_pipeline.settings import data_paths

RECOMMENDATIONS_FILE = "recommendations.json"
TRAIL_FILE = "review_trail.jsonl"
GENESIS_SHA256 = "0" * 64
STORE_SCHEMA_VERSION = 1
DECISIONS = (ReviewState.APPROVED, ReviewState.REJECTED)


class ReviewError(Exception):
    """A one-line, user-facing failure."""


class UnknownRecommendation(ReviewError):
    pass


class TrailTampered(ReviewError):
    pass


# ---------------------------------------------------------------------------------------------
# The recommendations store
# ---------------------------------------------------------------------------------------------
class _Store(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_version: int
    recommendations: list[dict]


def data_dir(root: str | Path | None = None) -> Path:
    """``KERNAUDIT_DATA_DIR`` (default ``./data``), as the rest of kernaudit resolves it."""
    return data_paths(root).root


def save_recommendations(recs: list[Recommendation], data_dir: str | Path) -> Path:
    """Write the store atomically (the previous file stays whole if this fails)."""
    root = Path(data_dir)
    root.mkdir(parents=True, exist_ok=True)
    path = root / RECOMMENDATIONS_FILE
    body = {"schema_version": STORE_SCHEMA_VERSION,
            "recommendations": [recommendation_to_json(r) for r in recs]}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def load_recommendations(data_dir: str | Path, *, apply_trail: bool = True) -> list[Recommendation]:
    """The stored recommendations, each with its review state from the trail."""
    path = Path(data_dir) / RECOMMENDATIONS_FILE
    if not path.exists():
        raise ReviewError(f"no recommendations at {path}; run the audit first (kernaudit audit)")
    try:
        store = _Store.model_validate_json(path.read_text())
        recs = [recommendation_from_json(item) for item in store.recommendations]
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"]))
        raise ReviewError(f"{path}: invalid recommendations store at {where}: {first['msg']}") from None
    except OSError as exc:
        raise ReviewError(f"{path}: cannot read ({exc.strerror})") from None
    if apply_trail:
        recs = apply_review(recs, read_trail(data_dir))
    return recs


# ---------------------------------------------------------------------------------------------
# The trail
# ---------------------------------------------------------------------------------------------
class TrailEntryModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rec_id: str = Field(pattern=r"^rec-[0-9a-f]{12}$")
    decision: ReviewState
    reviewer: str = Field(min_length=1)
    comment: str
    timestamp_utc: str
    prev_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    entry_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class TrailEntry:
    rec_id: str
    decision: ReviewState
    reviewer: str
    comment: str
    timestamp_utc: str
    prev_sha256: str
    entry_sha256: str


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _entry_hash(fields: dict) -> str:
    body = {k: v for k, v in fields.items() if k != "entry_sha256"}
    return _sha256(json.dumps(body, sort_keys=True, separators=(",", ":")))


def trail_path(data_dir: str | Path) -> Path:
    return Path(data_dir) / TRAIL_FILE


def read_trail(data_dir: str | Path) -> list[TrailEntry]:
    """Every entry, after checking each line's own hash and its link to the previous line."""
    path = trail_path(data_dir)
    if not path.exists():
        return []
    entries: list[TrailEntry] = []
    prev = GENESIS_SHA256
    for lineno, raw in enumerate(path.read_text().splitlines(), start=1):
        try:
            model = TrailEntryModel.model_validate_json(raw)
        except ValidationError:
            raise TrailTampered(f"{path}: line {lineno} is not a valid trail entry; the trail was edited") from None
        fields = model.model_dump(mode="json")
        if model.entry_sha256 != _entry_hash(fields):
            raise TrailTampered(f"{path}: line {lineno} does not match its own hash; the trail was edited")
        if model.prev_sha256 != prev:
            raise TrailTampered(f"{path}: line {lineno} does not follow line {lineno - 1} "
                                "(hash chain broken); a line was edited, removed or reordered")
        entries.append(TrailEntry(**{k: fields[k] for k in TrailEntryModel.model_fields}
                                  | {"decision": model.decision}))
        prev = _sha256(raw)
    return entries


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def append_decision(data_dir: str | Path, rec_id: str, decision: ReviewState, reviewer: str, comment: str,
                    *, now: datetime | None = None) -> TrailEntry:
    """Append one decision; refuses to extend a trail whose chain is broken."""
    if decision not in DECISIONS:
        raise ReviewError(f"decision must be one of {', '.join(DECISIONS)}")
    if not reviewer.strip():
        raise ReviewError("--reviewer must name who decides")
    path = trail_path(data_dir)
    with _locked(path):
        read_trail(data_dir)  # raises on a broken chain
        lines = path.read_text().splitlines() if path.exists() else []
        prev = _sha256(lines[-1]) if lines else GENESIS_SHA256
        fields = {
            "rec_id": rec_id, "decision": str(decision), "reviewer": reviewer.strip(), "comment": comment,
            "timestamp_utc": (now or datetime.now(UTC)).astimezone(UTC).isoformat(timespec="seconds"),
            "prev_sha256": prev,
        }
        fields["entry_sha256"] = _entry_hash(fields)
        line = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        with open(path, "a") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())
    return TrailEntry(**(fields | {"decision": ReviewState(decision)}))


def review_states(entries: list[TrailEntry]) -> dict[str, TrailEntry]:
    """The last decision per recommendation."""
    last: dict[str, TrailEntry] = {}
    for e in entries:
        last[e.rec_id] = e
    return last


def apply_review(recs: list[Recommendation], entries: list[TrailEntry]) -> list[Recommendation]:
    last = review_states(entries)
    return [replace(r, review_state=last[r.rec_id].decision if r.rec_id in last else ReviewState.PENDING_REVIEW)
            for r in recs]


def decide(data_dir: str | Path, rec_id: str, decision: ReviewState, reviewer: str, comment: str) -> TrailEntry:
    recs = {r.rec_id: r for r in load_recommendations(data_dir)}
    if rec_id not in recs:
        raise UnknownRecommendation(f"unknown recommendation id {rec_id!r} ({len(recs)} stored; "
                                    "see kernaudit review list)")
    rec = recs[rec_id]
    if decision == ReviewState.APPROVED and rec.verification.state == VerificationState.REFUTED:
        raise ReviewError(f"{rec_id} cannot be approved: its verification is REFUTED "
                          f"({rec.verification.note})")
    return append_decision(data_dir, rec_id, decision, reviewer, comment)


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, never the usage block
        print(f"kernaudit review: {message}", file=sys.stderr)
        raise SystemExit(2)


def _format(recs: list[Recommendation]) -> str:
    header = ("rec_id", "review", "verification", "fits", "vs_baseline", "source", "kernel", "shape", "code")
    rows = [header] + [(r.rec_id, str(r.review_state), str(r.verification.state),
                        str(r.verification.fits), str(r.verification.faster_than_baseline), str(r.source),
                        r.kernel_name, r.shape_name or "-", r.code) for r in recs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row[:-1], widths)) + "  " + row[-1] for row in rows)


def cli(argv: list[str]) -> int:
    parser = _Parser(prog="kernaudit review", description="Approve or reject recommendations "
                     "(append-only, hash-chained audit trail in the data folder).")
    parser.add_argument("--data-dir", default=None, help="data folder (default: $KERNAUDIT_DATA_DIR or ./data)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    lst = sub.add_parser("list", help="list recommendations and their review state")
    lst.add_argument("--state", choices=[str(s) for s in ReviewState], default=None)
    lst.add_argument("--json", action="store_true")
    for name in ("approve", "reject"):
        p = sub.add_parser(name, help=f"{name} one recommendation")
        p.add_argument("rec_id")
        p.add_argument("--reviewer", required=True)
        p.add_argument("--comment", required=True)
    sub.add_parser("verify", help="check the trail's hash chain and print its head hash")
    args = parser.parse_args(argv)
    root = data_dir(args.data_dir)
    try:
        if args.command == "list":
            recs = load_recommendations(root)
            if args.state:
                recs = [r for r in recs if r.review_state == args.state]
            if args.json:
                print(json.dumps([recommendation_to_json(r) for r in recs], indent=2))
            else:
                print(_format(recs))
            return 0
        if args.command == "verify":
            entries = read_trail(root)
            head = _sha256(trail_path(root).read_text().splitlines()[-1]) if entries else GENESIS_SHA256
            print(f"trail ok: {len(entries)} decision(s); head sha256 {head}")
            return 0
        decision = ReviewState.APPROVED if args.command == "approve" else ReviewState.REJECTED
        entry = decide(root, args.rec_id, decision, args.reviewer, args.comment)
        print(f"{entry.rec_id} {entry.decision} by {entry.reviewer} at {entry.timestamp_utc}")
        return 0
    except UnknownRecommendation as exc:
        print(f"kernaudit review: {exc}", file=sys.stderr)
        return 2
    except ReviewError as exc:
        print(f"kernaudit review: {exc}", file=sys.stderr)
        return 1
