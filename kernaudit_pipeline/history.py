"""Audit history: every audit appended to an embedded DuckDB database.

``data/history.duckdb`` holds one row per (audit, kernel, config, shape,
device): latency with its 95 % CI, baseline, speedup, status. An audit is
compared with the last *accepted* audit, the reference. A key regressed when

- it got slower beyond the noise band (``delta_pct > noise_band * 100``) and
  the two latency CIs do not overlap (this audit's CI low is above the
  reference's CI high); a pair without CIs is judged by the noise band alone
  and says so (``ci_separated`` is null); or
- it was not FAILED in the reference and is FAILED now.

The first audit recorded becomes the reference by itself (there is nothing to
compare it with); later ones only when a person runs
``kernaudit history accept RUN_ID``.
"""

from __future__ import annotations

import argparse
import math
import sys
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from enum import StrEnum
from pathlib import Path
from typing import Iterator

import duckdb
import pandas as pd

KEY = ("kernel_name", "config_id", "shape_name", "device_name")
VALUE_COLUMNS = ("latency_us", "latency_ci_low_us", "latency_ci_high_us", "baseline_us", "speedup", "status")
SCHEMA = (
    """CREATE TABLE IF NOT EXISTS audits (
        run_id VARCHAR PRIMARY KEY,
        recorded_utc TIMESTAMP NOT NULL,
        trigger VARCHAR,
        data_mode VARCHAR,
        rows INTEGER NOT NULL,
        accepted BOOLEAN NOT NULL DEFAULT FALSE,
        accepted_utc TIMESTAMP,
        accepted_by VARCHAR)""",
    """CREATE TABLE IF NOT EXISTS results (
        run_id VARCHAR NOT NULL,
        kernel_name VARCHAR NOT NULL,
        config_id VARCHAR NOT NULL,
        shape_name VARCHAR NOT NULL,
        device_name VARCHAR NOT NULL,
        latency_us DOUBLE,
        latency_ci_low_us DOUBLE,
        latency_ci_high_us DOUBLE,
        baseline_us DOUBLE,
        speedup DOUBLE,
        status VARCHAR,
        recorded_utc TIMESTAMP NOT NULL,
        PRIMARY KEY (run_id, kernel_name, config_id, shape_name, device_name))""",
    """CREATE OR REPLACE VIEW history AS
        SELECT r.*, a.accepted, a.trigger FROM results r JOIN audits a USING (run_id)""",
)


class HistoryError(RuntimeError):
    """A one-line, user-facing history problem (unknown run, database in use)."""


class RegressionKind(StrEnum):
    SLOWER = "slower"
    NOW_FAILING = "now_failing"


@dataclass(frozen=True)
class AuditRecord:
    run_id: str
    recorded_utc: str
    trigger: str | None
    data_mode: str | None
    rows: int
    accepted: bool
    accepted_utc: str | None
    accepted_by: str | None


@dataclass(frozen=True)
class Regression:
    kernel_name: str
    config_id: str
    shape_name: str
    device_name: str
    kind: RegressionKind
    reference_run_id: str
    latency_us: float | None
    reference_latency_us: float | None
    delta_us: float | None
    delta_pct: float | None
    latency_ci_low_us: float | None
    latency_ci_high_us: float | None
    reference_ci_low_us: float | None
    reference_ci_high_us: float | None
    ci_separated: bool | None
    status: str | None
    reference_status: str | None


@dataclass(frozen=True)
class Comparison:
    run_id: str
    reference_run_id: str | None
    keys_compared: int
    regressions: tuple[Regression, ...]

    def frame(self) -> pd.DataFrame:
        columns = [f for f in Regression.__dataclass_fields__]
        return pd.DataFrame([asdict(r) for r in self.regressions], columns=columns)


@contextmanager
def connect(db_path: Path, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
    """A short-lived connection: DuckDB lets one process write at a time."""
    if read_only and not db_path.exists():
        raise HistoryError(f"no audit history yet ({db_path.name} does not exist): run `kernaudit audit` first")
    db_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        con = duckdb.connect(str(db_path), read_only=read_only)
    except duckdb.IOException as exc:
        raise HistoryError(f"cannot open {db_path.name}: {str(exc).splitlines()[0]}") from None
    try:
        if not read_only:
            for statement in SCHEMA:
                con.execute(statement)
        yield con
    finally:
        con.close()


def _float(value: object) -> float | None:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def condense(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per key: the fastest timed row, else the first (e.g. a FAILED run)."""
    out = frame.reindex(columns=[*KEY, *VALUE_COLUMNS]).copy()
    for column in KEY:
        out[column] = out[column].astype(object).where(out[column].notna(), "").astype(str)
    for column in VALUE_COLUMNS[:-1]:
        out[column] = pd.to_numeric(out[column], errors="coerce").astype(float)
    out["status"] = out["status"].astype(object).where(out["status"].notna(), None)
    out = out[out["kernel_name"] != ""]
    out["_timed"] = out["latency_us"].notna()
    out = out.sort_values(["_timed", "latency_us"], ascending=[False, True], na_position="last")
    return out.drop_duplicates(list(KEY)).drop(columns="_timed").sort_values(list(KEY)).reset_index(drop=True)


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def record_audit(db_path: Path, run_id: str, runs: pd.DataFrame, *, trigger: str | None = None,
                 data_mode: str | None = None, accept_if_first: bool = True) -> AuditRecord:
    """Append one audit (idempotent per run id: a re-record replaces its rows)."""
    rows = condense(runs)
    now = _now()
    rows["run_id"] = run_id
    rows["recorded_utc"] = now
    with connect(db_path) as con:
        con.execute("BEGIN TRANSACTION")
        con.execute("DELETE FROM results WHERE run_id = ?", [run_id])
        con.execute("DELETE FROM audits WHERE run_id = ?", [run_id])
        first = con.execute("SELECT count(*) FROM audits WHERE accepted").fetchone()[0] == 0
        accepted = bool(accept_if_first and first)
        con.execute("INSERT INTO audits VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [run_id, now, trigger, data_mode, len(rows), accepted, now if accepted else None,
                     "first audit (automatic)" if accepted else None])
        con.register("incoming", rows[["run_id", *KEY, *VALUE_COLUMNS, "recorded_utc"]])
        con.execute(f"INSERT INTO results SELECT run_id, {', '.join(KEY)}, {', '.join(VALUE_COLUMNS)}, recorded_utc "
                    "FROM incoming")
        con.unregister("incoming")
        con.execute("COMMIT")
    return get_audit(db_path, run_id)


def _audit(row: tuple) -> AuditRecord:
    run_id, recorded, trigger, mode, rows, accepted, accepted_utc, by = row
    return AuditRecord(run_id=run_id, recorded_utc=f"{recorded:%Y-%m-%d %H:%M:%S}", trigger=trigger, data_mode=mode,
                       rows=int(rows), accepted=bool(accepted),
                       accepted_utc=f"{accepted_utc:%Y-%m-%d %H:%M:%S}" if accepted_utc else None, accepted_by=by)


def list_audits(db_path: Path) -> list[AuditRecord]:
    with connect(db_path, read_only=True) as con:
        return [_audit(r) for r in con.execute("SELECT * FROM audits ORDER BY recorded_utc, run_id").fetchall()]


def resolve_run_id(db_path: Path, prefix: str) -> str:
    """A full run id from a unique prefix (as Dagster's UI shows the first 8 characters)."""
    with connect(db_path, read_only=True) as con:
        found = [r[0] for r in con.execute("SELECT run_id FROM audits WHERE starts_with(run_id, ?)", [prefix]).fetchall()]
    if not found:
        raise HistoryError(f"no audit with run id {prefix!r} in the history")
    if len(found) > 1:
        raise HistoryError(f"run id {prefix!r} is ambiguous ({len(found)} audits)")
    return found[0]


def get_audit(db_path: Path, run_id: str) -> AuditRecord:
    with connect(db_path, read_only=True) as con:
        row = con.execute("SELECT * FROM audits WHERE run_id = ?", [run_id]).fetchone()
    if row is None:
        raise HistoryError(f"no audit with run id {run_id!r} in the history")
    return _audit(row)


def accept(db_path: Path, run_id: str, accepted_by: str = "cli") -> AuditRecord:
    """Make an audit a reference; the latest accepted one is what later audits compare with."""
    full = resolve_run_id(db_path, run_id)
    with connect(db_path) as con:
        con.execute("UPDATE audits SET accepted = TRUE, accepted_utc = ?, accepted_by = ? WHERE run_id = ?",
                    [_now(), accepted_by, full])
    return get_audit(db_path, full)


def reference_for(con: duckdb.DuckDBPyConnection, run_id: str) -> str | None:
    """The last accepted audit recorded before ``run_id`` (or any, when run_id is unknown)."""
    row = con.execute(
        """SELECT run_id FROM audits WHERE accepted AND run_id <> ?
           AND recorded_utc <= coalesce((SELECT recorded_utc FROM audits WHERE run_id = ?), ?)
           ORDER BY recorded_utc DESC, run_id DESC LIMIT 1""", [run_id, run_id, _now()]).fetchone()
    return row[0] if row else None


def _regression(cur: pd.Series, ref: pd.Series, reference_run_id: str, noise_band: float) -> Regression | None:
    lat, ref_lat = _float(cur["latency_us"]), _float(ref["latency_us"])
    lo, hi = _float(cur["latency_ci_low_us"]), _float(cur["latency_ci_high_us"])
    ref_lo, ref_hi = _float(ref["latency_ci_low_us"]), _float(ref["latency_ci_high_us"])
    status, ref_status = cur["status"], ref["status"]
    kind: RegressionKind | None = None
    delta_us = delta_pct = None
    separated: bool | None = None
    if status == "FAILED" and ref_status != "FAILED":
        kind = RegressionKind.NOW_FAILING
    elif lat is not None and ref_lat is not None and ref_lat > 0:
        delta_us = lat - ref_lat
        delta_pct = delta_us / ref_lat * 100.0
        if lo is not None and ref_hi is not None:
            separated = lo > ref_hi
        if delta_pct > noise_band * 100.0 and separated is not False:
            kind = RegressionKind.SLOWER
    if kind is None:
        return None
    return Regression(
        kernel_name=cur["kernel_name"], config_id=cur["config_id"], shape_name=cur["shape_name"],
        device_name=cur["device_name"], kind=kind, reference_run_id=reference_run_id,
        latency_us=lat, reference_latency_us=ref_lat,
        delta_us=None if delta_us is None else round(delta_us, 3),
        delta_pct=None if delta_pct is None else round(delta_pct, 2),
        latency_ci_low_us=lo, latency_ci_high_us=hi, reference_ci_low_us=ref_lo, reference_ci_high_us=ref_hi,
        ci_separated=separated, status=status, reference_status=ref_status)


def compare(db_path: Path, run_id: str, noise_band: float = 0.02) -> Comparison:
    """This audit against the last accepted one; every key present in both is judged."""
    with connect(db_path, read_only=True) as con:
        reference = reference_for(con, run_id)
        if reference is None:
            return Comparison(run_id=run_id, reference_run_id=None, keys_compared=0, regressions=())
        pairs = con.execute(
            f"""SELECT {', '.join(f'c.{k}' for k in KEY)},
                       {', '.join(f'c.{v} AS cur_{v}' for v in VALUE_COLUMNS)},
                       {', '.join(f'r.{v} AS ref_{v}' for v in VALUE_COLUMNS)}
                FROM results c JOIN results r USING ({', '.join(KEY)})
                WHERE c.run_id = ? AND r.run_id = ? ORDER BY {', '.join(f'c.{k}' for k in KEY)}""",
            [run_id, reference]).df()
    found = []
    for _, row in pairs.iterrows():
        cur = pd.Series({**{k: row[k] for k in KEY}, **{v: row[f"cur_{v}"] for v in VALUE_COLUMNS}})
        ref = pd.Series({v: row[f"ref_{v}"] for v in VALUE_COLUMNS})
        regression = _regression(cur, ref, reference, noise_band)
        if regression is not None:
            found.append(regression)
    found.sort(key=lambda r: (r.kind != RegressionKind.NOW_FAILING, -(r.delta_pct or 0.0)))
    return Comparison(run_id=run_id, reference_run_id=reference, keys_compared=len(pairs), regressions=tuple(found))


def latest_run_id(db_path: Path) -> str:
    audits = list_audits(db_path)
    if not audits:
        raise HistoryError("the history holds no audit yet")
    return audits[-1].run_id


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, never the usage block
        raise HistoryError(message)


def _fmt(value: object, digits: int = 2) -> str:
    f = _float(value)
    return "–" if f is None else f"{f:,.{digits}f}"


def cli(argv: list[str]) -> int:
    """``kernaudit history list | accept RUN_ID | compare [RUN_ID]``."""
    from kernaudit_pipeline.settings import data_paths

    parser = _Parser(prog="kernaudit history", description="audit history (DuckDB in the data folder)")
    parser.add_argument("--data-dir", default=None, help="data folder (default: $KERNAUDIT_DATA_DIR or ./data)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="every recorded audit, oldest first; * marks accepted references")
    acc = sub.add_parser("accept", help="make an audit the reference later audits compare with")
    acc.add_argument("run_id", help="Dagster run id (a unique prefix is enough)")
    acc.add_argument("--by", default="cli", help="who accepts it (recorded)")
    cmp_ = sub.add_parser("compare", help="regressions of an audit against the last accepted one")
    cmp_.add_argument("run_id", nargs="?", help="default: the latest audit")
    cmp_.add_argument("--noise-band", type=float, default=0.02)
    try:
        args = parser.parse_args(argv)
        db = data_paths(args.data_dir).history_db
        if args.command == "list":
            for audit in list_audits(db):
                mark = "*" if audit.accepted else " "
                print(f"{mark} {audit.run_id}  {audit.recorded_utc}  {audit.trigger or '-':<8} keys={audit.rows}"
                      + (f"  accepted {audit.accepted_utc} by {audit.accepted_by}" if audit.accepted else ""))
        elif args.command == "accept":
            audit = accept(db, args.run_id, args.by)
            print(f"accepted {audit.run_id} as the reference ({audit.rows} keys)")
        else:
            run_id = resolve_run_id(db, args.run_id) if args.run_id else latest_run_id(db)
            result = compare(db, run_id, args.noise_band)
            if result.reference_run_id is None:
                print(f"{run_id}: no earlier accepted audit to compare with")
                return 0
            print(f"{run_id} vs reference {result.reference_run_id}: {result.keys_compared} keys compared, "
                  f"{len(result.regressions)} regressions")
            for r in result.regressions:
                print(f"  {r.kind:<11} {r.kernel_name} {r.shape_name} {r.config_id} {r.device_name}: "
                      f"{_fmt(r.reference_latency_us)} -> {_fmt(r.latency_us)} us ({_fmt(r.delta_pct)} %), "
                      f"CI [{_fmt(r.latency_ci_low_us)}, {_fmt(r.latency_ci_high_us)}] vs "
                      f"[{_fmt(r.reference_ci_low_us)}, {_fmt(r.reference_ci_high_us)}]")
    except HistoryError as exc:
        print(f"kernaudit history: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
