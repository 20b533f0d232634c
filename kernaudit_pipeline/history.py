"""Audit history: every audit appended to an embedded DuckDB database, compared with the last
accepted one without crying wolf.

``data/history.duckdb`` holds one row per (audit, kernel, config, shape, device): latency with
its 95 % CI, baseline, the paired speedup with its 95 % CI, status. An audit is compared with
the last *accepted* audit, the reference. A key *looks* regressed when

- both audits have paired speedup CIs and this audit's CI, raised by the noise band, still lies
  wholly below the reference's (``speedup_ci_high * (1 + band) < reference speedup_ci_low``);
  a pair without speedup CIs (older audits) falls back to the latency CIs and the band; or
- it was not FAILED in the reference and is FAILED now.

A timing difference is only *confirmed* when the same audit re-measures that config against
its baseline (paired, on this run's GPU) and the re-measured CI, too, lies below the
reference's beyond the band; a re-measure that overlaps *refutes* it; without a GPU nothing can
be re-measured and the difference stays *unconfirmed*. ``no_new_regressions`` fails only on
confirmed regressions; a newly FAILED correctness check is its own confirmation (it ran on
fresh inputs in this audit).

The first audit recorded becomes the reference by itself (there is nothing to
compare it with); later ones only when a person runs
``kernaudit history accept RUN_ID``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from enum import StrEnum
from pathlib import Path
from typing import Iterator

import duckdb
import pandas as pd

KEY = ("kernel_name", "config_id", "shape_name", "device_name")
VALUE_COLUMNS = ("latency_us", "latency_ci_low_us", "latency_ci_high_us", "baseline_us", "speedup",
                 "speedup_ci_low", "speedup_ci_high", "status")
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
        speedup_ci_low DOUBLE,
        speedup_ci_high DOUBLE,
        PRIMARY KEY (run_id, kernel_name, config_id, shape_name, device_name))""",
    # databases written before paired timing: add its columns in place
    "ALTER TABLE results ADD COLUMN IF NOT EXISTS speedup_ci_low DOUBLE",
    "ALTER TABLE results ADD COLUMN IF NOT EXISTS speedup_ci_high DOUBLE",
    """CREATE OR REPLACE VIEW history AS
        SELECT r.*, a.accepted, a.trigger FROM results r JOIN audits a USING (run_id)""",
)


class HistoryError(RuntimeError):
    """A one-line, user-facing history problem (unknown run, database in use)."""


class RegressionKind(StrEnum):
    SLOWER = "slower"
    NOW_FAILING = "now_failing"


class Confirmation(StrEnum):
    CONFIRMED = "confirmed"      # re-measured in this audit: still below the reference
    UNCONFIRMED = "unconfirmed"  # could not be re-measured (no GPU, or the re-measure failed)
    REFUTED = "refuted"          # the re-measure overlaps the reference: drift, not a regression


@dataclass(frozen=True)
class Remeasured:
    """A config re-timed in this audit, paired against its baseline."""

    speedup: float
    speedup_ci_low: float
    speedup_ci_high: float
    note: str | None = None


# (kernel, config, shape, device) -> the re-measure, or None when it cannot be done
Remeasure = Callable[["Regression"], "Remeasured | None"]


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
    speedup: float | None = None
    speedup_ci_low: float | None = None
    speedup_ci_high: float | None = None
    reference_speedup: float | None = None
    reference_speedup_ci_low: float | None = None
    reference_speedup_ci_high: float | None = None
    confirmation: Confirmation = Confirmation.UNCONFIRMED
    remeasured_speedup: float | None = None
    remeasured_ci_low: float | None = None
    remeasured_ci_high: float | None = None
    confirmation_note: str | None = None


@dataclass(frozen=True)
class Comparison:
    run_id: str
    reference_run_id: str | None
    keys_compared: int
    regressions: tuple[Regression, ...]

    @property
    def confirmed(self) -> tuple[Regression, ...]:
        return tuple(r for r in self.regressions if r.confirmation == Confirmation.CONFIRMED)

    @property
    def unconfirmed(self) -> tuple[Regression, ...]:
        return tuple(r for r in self.regressions if r.confirmation == Confirmation.UNCONFIRMED)

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
        columns = ", ".join(("run_id", *KEY, *VALUE_COLUMNS, "recorded_utc"))
        con.execute(f"INSERT INTO results ({columns}) SELECT {columns} FROM incoming")
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


def below(ci_high: float | None, reference_ci_low: float | None, noise_band: float) -> bool | None:
    """A speedup CI wholly below the reference's, even raised by the noise band; None when a
    bound is missing."""
    if ci_high is None or reference_ci_low is None:
        return None
    return ci_high * (1.0 + noise_band) < reference_ci_low


def _regression(cur: pd.Series, ref: pd.Series, reference_run_id: str, noise_band: float) -> Regression | None:
    lat, ref_lat = _float(cur["latency_us"]), _float(ref["latency_us"])
    lo, hi = _float(cur["latency_ci_low_us"]), _float(cur["latency_ci_high_us"])
    ref_lo, ref_hi = _float(ref["latency_ci_low_us"]), _float(ref["latency_ci_high_us"])
    sp, sp_lo, sp_hi = (_float(cur[c]) for c in ("speedup", "speedup_ci_low", "speedup_ci_high"))
    rsp, rsp_lo, rsp_hi = (_float(ref[c]) for c in ("speedup", "speedup_ci_low", "speedup_ci_high"))
    status, ref_status = cur["status"], ref["status"]
    kind: RegressionKind | None = None
    delta_us = delta_pct = None
    separated: bool | None = None
    confirmation = Confirmation.UNCONFIRMED
    if lat is not None and ref_lat is not None and ref_lat > 0:
        delta_us = lat - ref_lat
        delta_pct = delta_us / ref_lat * 100.0
    if status == "FAILED" and ref_status != "FAILED":
        kind = RegressionKind.NOW_FAILING
        confirmation = Confirmation.CONFIRMED  # a correctness check on fresh inputs in this audit
    elif below(sp_hi, rsp_lo, noise_band) is not None and sp is not None and rsp:
        separated = below(sp_hi, rsp_lo, noise_band)
        delta_pct = (rsp / sp - 1.0) * 100.0  # how much slower relative to the baseline
        if separated:
            kind = RegressionKind.SLOWER
    elif delta_pct is not None:
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
        ci_separated=separated, status=status, reference_status=ref_status, speedup=sp,
        speedup_ci_low=sp_lo, speedup_ci_high=sp_hi, reference_speedup=rsp, reference_speedup_ci_low=rsp_lo,
        reference_speedup_ci_high=rsp_hi, confirmation=confirmation)


def confirm(regression: Regression, remeasure: Remeasure | None, noise_band: float) -> Regression:
    """Re-measure a timing regression in this audit: confirmed only if the re-measured CI also
    lies below the reference's beyond the band."""
    if regression.kind != RegressionKind.SLOWER:
        return regression
    if remeasure is None:
        return replace(regression, confirmation=Confirmation.UNCONFIRMED,
                       confirmation_note="no GPU in this audit: nothing could be re-measured")
    try:
        again = remeasure(regression)
    except Exception as exc:  # noqa: BLE001 - a failed re-measure leaves the difference unconfirmed
        again = None
        note = f"re-measure failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    else:
        note = None if again is not None else "the re-measure produced no paired speedup"
    if again is None:
        return replace(regression, confirmation=Confirmation.UNCONFIRMED, confirmation_note=note)
    ref_low = regression.reference_speedup_ci_low  # None for audits from before paired timing
    verdict = below(again.speedup_ci_high, ref_low, noise_band)
    confirmation = (Confirmation.CONFIRMED if verdict else
                    Confirmation.REFUTED if verdict is False else Confirmation.UNCONFIRMED)
    return replace(regression, confirmation=confirmation, remeasured_speedup=again.speedup,
                   remeasured_ci_low=again.speedup_ci_low, remeasured_ci_high=again.speedup_ci_high,
                   confirmation_note=again.note or (None if verdict is not None else
                                                    "the reference audit has no paired speedup CI"))


def compare(db_path: Path, run_id: str, noise_band: float = 0.02,
            remeasure: Remeasure | None = None) -> Comparison:
    """This audit against the last accepted one; every key present in both is judged, and each
    timing regression is re-measured through ``remeasure`` (None: no GPU, all unconfirmed)."""
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
            found.append(confirm(regression, remeasure, noise_band))
    found.sort(key=lambda r: (r.confirmation != Confirmation.CONFIRMED, r.kind != RegressionKind.NOW_FAILING,
                              -(r.delta_pct or 0.0)))
    return Comparison(run_id=run_id, reference_run_id=reference, keys_compared=len(pairs), regressions=tuple(found))


def latest_run_id(db_path: Path) -> str:
    audits = list_audits(db_path)
    if not audits:
        raise HistoryError("the history holds no audit yet")
    return audits[-1].run_id


def fmt(value: object, digits: int = 2) -> str:
    f = _float(value)
    return "–" if f is None else f"{f:,.{digits}f}"


def runner_remeasure(out_dir: Path, env: dict[str, str] | None = None, timeout_s: float = 900.0) -> Remeasure:
    """A :data:`Remeasure` that runs the GPU runner on one (kernel, shape, config), paired against
    its primary reference, and reads the paired speedup from its JSONL (under ``out_dir``)."""
    import hashlib
    import subprocess
    import sys

    from kernaudit_pipeline.bench.records import read_jsonl
    from kernaudit_pipeline.settings import PROJECT_ROOT

    def run(reg: Regression) -> Remeasured | None:
        key = "|".join((reg.kernel_name, reg.shape_name, reg.config_id))
        out = out_dir / f"remeasure-{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsonl"
        out_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "kernaudit_pipeline.bench.runner", reg.kernel_name, "--shapes",
               reg.shape_name, "--configs", reg.config_id, "--no-peaks", "--references-top-k", "0",
               "--out", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=PROJECT_ROOT)
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError((proc.stderr.strip().splitlines() or [f"runner exit {proc.returncode}"])[-1])
        for row in read_jsonl(out.read_text()):
            if (row.get("record_type") == "run" and row.get("config_id") == reg.config_id
                    and row.get("speedup") is not None and row.get("speedup_ci_high") is not None):
                return Remeasured(float(row["speedup"]), float(row["speedup_ci_low"]),
                                  float(row["speedup_ci_high"]), note=f"re-measured in {out.name}")
        return None

    return run
