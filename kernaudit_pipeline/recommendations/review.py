"""Human sign-off: ``kernaudit review``, an append-only, hash-chained trail bound to content.

Every recommendation starts PENDING_REVIEW. A reviewer approves or rejects it by id, with a name
and a comment; each decision is one JSON line appended to ``<data>/review_trail.jsonl``. A
recommendation's review state is the last decision about it in the trail, so the trail, not the
recommendations file, is the record of who signed off what.

What makes a sign-off hold:

- **Bound to content.** An entry records ``content_sha256``, the sha256 of the recommendation's
  canonical content (``model.canonical_content``: every field but the review state). If the
  stored recommendation changes afterwards (an edited ``recommendations.json``, or a new audit
  with a different config or verification), its state is STALE, not APPROVED, and the export
  refuses it.
- **A chain.** Each line carries ``prev_sha256`` (the sha256 of the previous line's bytes, 64
  zeros for the first) and ``entry_sha256`` (of its own fields): an edited, removed or reordered
  line breaks the chain at that line.
- **A head kept elsewhere.** The number of entries and the last line's hash are also written to
  the history DB (``history.duckdb``, table ``review_chain_head``). Deleting the last lines of
  the trail (say, a rejection) leaves a valid chain but not the recorded head, so it is refused.
- **Rejections reach the files.** The export records which vLLM file entries each approval
  produced (table ``review_exports``); rejecting a recommendation removes its entries from those
  files (and the files left empty).

Every read of the store or the trail refuses non-regular files, files over the size limit and
bytes that are not UTF-8, with a one-line reason.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Iterator

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kernaudit_pipeline.core.files import FileRefused, read_bounded
from kernaudit_pipeline.recommendations.model import (
    Recommendation, ReviewState, content_sha256, recommendation_from_json, recommendation_to_json, refuted_fit,
)
from kernaudit_pipeline.settings import data_paths

RECOMMENDATIONS_FILE = "recommendations.json"
TRAIL_FILE = "review_trail.jsonl"
GENESIS_SHA256 = "0" * 64
STORE_SCHEMA_VERSION = 2
DECISIONS = (ReviewState.APPROVED, ReviewState.REJECTED)
MAX_STORE_BYTES = 256 * 1024 * 1024
MAX_TRAIL_BYTES = 64 * 1024 * 1024
MAX_EXPORT_FILE_BYTES = 16 * 1024 * 1024
SCHEMA = (
    """CREATE TABLE IF NOT EXISTS review_chain_head (
        trail VARCHAR PRIMARY KEY, entries BIGINT NOT NULL, head_sha256 VARCHAR NOT NULL,
        updated_utc VARCHAR NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS review_exports (
        rec_id VARCHAR NOT NULL, export_root VARCHAR NOT NULL, file VARCHAR NOT NULL, m VARCHAR NOT NULL,
        content_sha256 VARCHAR NOT NULL, exported_utc VARCHAR NOT NULL)""",
)


class ReviewError(Exception):
    """A one-line, user-facing failure."""


class UnknownRecommendation(ReviewError):
    pass


class TrailTampered(ReviewError):
    pass


def data_dir(root: str | Path | None = None) -> Path:
    """``KERNAUDIT_DATA_DIR`` (default ``./data``), as the rest of kernaudit resolves it."""
    return data_paths(root).root


def _sha256(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def read_text(path: Path, what: str, limit: int) -> str | None:
    """A regular UTF-8 file's text; None when it does not exist; ReviewError (one line) otherwise."""
    try:
        raw = read_bounded(path, limit, what, missing_ok=True)
    except FileRefused as exc:
        raise ReviewError(str(exc)) from None
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReviewError(f"{path}: the {what} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset "
                          f"{exc.start})") from None


def write_atomic(path: Path, text: str) -> None:
    """Write beside, then rename: the previous file stays whole if this fails."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------
# The recommendations store
# ---------------------------------------------------------------------------------------------
class _Store(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_version: int
    recommendations: list[dict]


def save_recommendations(recs: list[Recommendation], data_dir: str | Path) -> Path:
    """Write the store atomically."""
    root = Path(data_dir)
    root.mkdir(parents=True, exist_ok=True)
    path = root / RECOMMENDATIONS_FILE
    body = {"schema_version": STORE_SCHEMA_VERSION, "recommendations": [recommendation_to_json(r) for r in recs]}
    write_atomic(path, json.dumps(body, indent=2, sort_keys=True, allow_nan=False) + "\n")
    return path


def load_recommendations(data_dir: str | Path, *, apply_trail: bool = True) -> list[Recommendation]:
    """The stored recommendations, each with its review state from the trail."""
    path = Path(data_dir) / RECOMMENDATIONS_FILE
    text = read_text(path, "recommendations store", MAX_STORE_BYTES)
    if text is None:
        raise ReviewError(f"no recommendations at {path}; run the audit first (kernaudit audit)")
    try:
        store = _Store.model_validate_json(text)
        if store.schema_version != STORE_SCHEMA_VERSION:
            raise ReviewError(f"{path}: store schema version {store.schema_version}, this kernaudit reads "
                              f"{STORE_SCHEMA_VERSION}; run the audit again")
        recs = [recommendation_from_json(item) for item in store.recommendations]
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"])) or "top level"
        raise ReviewError(f"{path}: invalid recommendations store at {where}: {first['msg']}") from None
    if apply_trail:
        recs = apply_review(recs, read_trail(data_dir))
    return recs


# ---------------------------------------------------------------------------------------------
# The chain head and the export ledger, in the history DB
# ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def signoff_db(data_dir: str | Path, *, create: bool = True) -> Iterator[object | None]:
    """A short-lived DuckDB connection to ``<data>/history.duckdb`` (None when it does not exist
    and ``create`` is off)."""
    import duckdb  # noqa: PLC0415

    path = data_paths(data_dir).history_db
    if not create and not path.exists():
        yield None
        return
    if path.exists() and not path.is_file():
        raise ReviewError(f"{path}: the history DB is not a regular file")
    try:
        con = duckdb.connect(str(path))
        for statement in SCHEMA:
            con.execute(statement)
    except duckdb.Error as exc:
        raise ReviewError(f"{path}: cannot open the history DB ({str(exc).splitlines()[0][:200]})") from None
    try:
        yield con
    except duckdb.Error as exc:
        raise ReviewError(f"{path}: history DB error ({str(exc).splitlines()[0][:200]})") from None
    finally:
        con.close()


def recorded_head(data_dir: str | Path) -> tuple[int, str] | None:
    with signoff_db(data_dir, create=False) as con:
        if con is None:
            return None
        row = con.execute("SELECT entries, head_sha256 FROM review_chain_head WHERE trail = ?",
                          [TRAIL_FILE]).fetchone()
    return None if row is None else (int(row[0]), str(row[1]))


def record_head(data_dir: str | Path, entries: int, head: str) -> None:
    with signoff_db(data_dir) as con:
        con.execute("DELETE FROM review_chain_head WHERE trail = ?", [TRAIL_FILE])
        con.execute("INSERT INTO review_chain_head VALUES (?, ?, ?, ?)",
                    [TRAIL_FILE, entries, head, datetime.now(UTC).isoformat(timespec="seconds")])


# ---------------------------------------------------------------------------------------------
# The trail
# ---------------------------------------------------------------------------------------------
class TrailEntryModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rec_id: str = Field(pattern=r"^rec-[0-9a-f]{12}$")
    decision: ReviewState
    reviewer: str = Field(min_length=1, max_length=200)
    comment: str = Field(max_length=4000)
    timestamp_utc: str = Field(max_length=40)
    content_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    prev_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    entry_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class TrailEntry:
    rec_id: str
    decision: ReviewState
    reviewer: str
    comment: str
    timestamp_utc: str
    content_sha256: str
    prev_sha256: str
    entry_sha256: str


def _entry_hash(fields: dict) -> str:
    body = {k: v for k, v in fields.items() if k != "entry_sha256"}
    return _sha256(json.dumps(body, sort_keys=True, separators=(",", ":")))


def trail_path(data_dir: str | Path) -> Path:
    return Path(data_dir) / TRAIL_FILE


def _parse_trail(data_dir: str | Path) -> tuple[list[TrailEntry], str]:
    """(entries, head sha256) after checking each line's own hash and its link to the previous one."""
    path = trail_path(data_dir)
    text = read_text(path, "review trail", MAX_TRAIL_BYTES)
    entries: list[TrailEntry] = []
    prev = GENESIS_SHA256
    for lineno, raw in enumerate((text or "").splitlines(), start=1):
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
        entries.append(TrailEntry(**{k: fields[k] for k in TrailEntryModel.model_fields} | {"decision": model.decision}))
        prev = _sha256(raw)
    return entries, prev


def read_trail(data_dir: str | Path) -> list[TrailEntry]:
    """Every entry, after checking the chain and comparing its head with the one in the history DB."""
    entries, head = _parse_trail(data_dir)
    recorded = recorded_head(data_dir)
    path = trail_path(data_dir)
    if recorded is None and entries:
        raise TrailTampered(f"{path}: {len(entries)} decision(s) but no chain head in history.duckdb; the trail "
                            "was copied in or the history DB replaced")
    if recorded is not None and recorded != (len(entries), head):
        raise TrailTampered(f"{path}: {len(entries)} decision(s) ending in {head[:12]}, but history.duckdb "
                            f"recorded {recorded[0]} ending in {recorded[1][:12]}; the trail was truncated, "
                            "extended or replaced")
    return entries


def trail_head(data_dir: str | Path) -> tuple[int, str]:
    entries = read_trail(data_dir)
    return len(entries), _parse_trail(data_dir)[1]


@contextlib.contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / ".review.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _check_text(value: str, what: str, limit: int) -> str:
    value = value.strip()
    if not value and what == "--reviewer":
        raise ReviewError("--reviewer must name who decides")
    if len(value) > limit:
        raise ReviewError(f"{what} is {len(value)} characters, over the {limit} allowed")
    if any(ord(ch) < 32 and ch not in "\t" for ch in value):
        raise ReviewError(f"{what} contains control characters")
    return value


def append_decision(data_dir: str | Path, rec_id: str, decision: ReviewState, reviewer: str, comment: str,
                    content: str, *, now: datetime | None = None) -> TrailEntry:
    """Append one decision and record the new head; refuses to extend a broken or truncated trail."""
    if decision not in DECISIONS:
        raise ReviewError(f"decision must be one of {', '.join(DECISIONS)}")
    reviewer = _check_text(reviewer, "--reviewer", 200)
    comment = _check_text(comment, "--comment", 4000)
    root = Path(data_dir)
    path = trail_path(root)
    with _locked(root):
        entries = read_trail(root)
        prev = _parse_trail(root)[1]
        fields = {
            "rec_id": rec_id, "decision": str(decision), "reviewer": reviewer, "comment": comment,
            "timestamp_utc": (now or datetime.now(UTC)).astimezone(UTC).isoformat(timespec="seconds"),
            "content_sha256": content, "prev_sha256": prev,
        }
        fields["entry_sha256"] = _entry_hash(fields)
        line = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        record_head(root, len(entries) + 1, _sha256(line))
    return TrailEntry(**(fields | {"decision": ReviewState(decision)}))


def review_states(entries: list[TrailEntry]) -> dict[str, TrailEntry]:
    """The last decision per recommendation."""
    last: dict[str, TrailEntry] = {}
    for e in entries:
        last[e.rec_id] = e
    return last


def state_of(rec: Recommendation, entry: TrailEntry | None) -> ReviewState:
    if entry is None:
        return ReviewState.PENDING_REVIEW
    if entry.decision == ReviewState.APPROVED and entry.content_sha256 != content_sha256(rec):
        return ReviewState.STALE
    return entry.decision


def apply_review(recs: list[Recommendation], entries: list[TrailEntry]) -> list[Recommendation]:
    last = review_states(entries)
    return [replace(r, review_state=state_of(r, last.get(r.rec_id))) for r in recs]


# ---------------------------------------------------------------------------------------------
# Exports: what each approval wrote, and taking it back on rejection
# ---------------------------------------------------------------------------------------------
def record_exports(data_dir: str | Path, root: Path, files: dict[str, list[tuple[str, str, str]]]) -> None:
    """``files``: relative file -> [(rec_id, M, content sha256)] as written now (replaces earlier rows)."""
    stamp = datetime.now(UTC).isoformat(timespec="seconds")
    with signoff_db(data_dir) as con:
        for rel, rows in files.items():
            con.execute("DELETE FROM review_exports WHERE export_root = ? AND file = ?", [str(root), rel])
            for rec_id, m, content in rows:
                con.execute("INSERT INTO review_exports VALUES (?, ?, ?, ?, ?, ?)",
                            [rec_id, str(root), rel, m, content, stamp])


def invalidate_exports(data_dir: str | Path, rec_id: str) -> list[Path]:
    """Remove ``rec_id``'s entries from every file an export wrote for it; files left empty are
    deleted. Returns the files changed."""
    with signoff_db(data_dir, create=False) as con:
        if con is None:
            return []
        rows = con.execute("SELECT export_root, file, m FROM review_exports WHERE rec_id = ?", [rec_id]).fetchall()
    by_file: dict[tuple[str, str], set[str]] = {}
    for root, rel, m in rows:
        by_file.setdefault((root, rel), set()).add(m)
    changed: list[Path] = []
    for (root, rel), ms in sorted(by_file.items()):
        base = Path(root).resolve()
        path = (base / rel).resolve()
        if not path.is_relative_to(base):
            continue  # a ledger row pointing outside its root is ignored, never followed
        try:
            text = read_text(path, "exported config", MAX_EXPORT_FILE_BYTES)
        except ReviewError:
            continue
        if text is None:
            continue
        try:
            table = json.loads(text)
        except ValueError:
            continue
        if not isinstance(table, dict):
            continue
        kept = {k: v for k, v in table.items() if k not in ms}
        if kept == table:
            continue
        if kept:
            write_atomic(path, json.dumps(kept, indent=4) + "\n")
        else:
            path.unlink()
        changed.append(path)
        _drop_from_manifest(base, rel, rec_id)
    with signoff_db(data_dir) as con:
        con.execute("DELETE FROM review_exports WHERE rec_id = ?", [rec_id])
    return changed


MANIFEST = "manifest.json"


def _drop_from_manifest(root: Path, rel: str, rec_id: str) -> None:
    path = root / MANIFEST
    try:
        text = read_text(path, "export manifest", MAX_EXPORT_FILE_BYTES)
        manifest = json.loads(text) if text else None
    except (ReviewError, ValueError):
        return
    if not isinstance(manifest, dict):
        return
    files = manifest.get("files") if isinstance(manifest.get("files"), dict) else {}
    if isinstance(files.get(rel), list):
        files[rel] = [r for r in files[rel] if r != rec_id]
        if not files[rel]:
            files.pop(rel)
    if isinstance(manifest.get("approvals"), list):
        manifest["approvals"] = [a for a in manifest["approvals"] if not (isinstance(a, dict)
                                                                          and a.get("rec_id") == rec_id)]
    manifest.setdefault("revoked", []).append({"rec_id": rec_id, "file": rel,
                                               "revoked_utc": datetime.now(UTC).isoformat(timespec="seconds")})
    write_atomic(path, json.dumps(manifest, indent=2) + "\n")


# ---------------------------------------------------------------------------------------------
# Decisions
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Decided:
    entry: TrailEntry
    invalidated: tuple[Path, ...] = ()


def decide(data_dir: str | Path, rec_id: str, decision: ReviewState, reviewer: str, comment: str) -> Decided:
    recs = {r.rec_id: r for r in load_recommendations(data_dir)}
    if rec_id not in recs:
        raise UnknownRecommendation(f"unknown recommendation id {rec_id!r} ({len(recs)} stored; "
                                    "see kernaudit review list)")
    rec = recs[rec_id]
    if decision == ReviewState.APPROVED and refuted_fit(rec.verification):
        raise ReviewError(f"{rec_id} cannot be approved: its verification is REFUTED "
                          f"({rec.verification.note})")
    entry = append_decision(data_dir, rec_id, decision, reviewer, comment, content_sha256(rec))
    invalidated = tuple(invalidate_exports(data_dir, rec_id)) if decision == ReviewState.REJECTED else ()
    return Decided(entry, invalidated)


def format_table(recs: list[Recommendation]) -> str:
    header = ("rec_id", "review", "verification", "fits", "vs_baseline", "decision", "source", "kernel", "shape",
              "code")
    rows = [header] + [(r.rec_id, str(r.review_state), str(r.verification.state), str(r.verification.fits),
                        str(r.verification.faster_than_baseline), str(r.decision or "-"), str(r.source),
                        r.kernel_name, r.shape_name or "-", r.code) for r in recs]
    rows = [tuple(" ".join(str(c).split()) for c in row) for row in rows]  # one line per row, whatever the data
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row[:-1], widths)) + "  " + row[-1] for row in rows)
