"""Audit history in DuckDB: the comparison with the accepted audit on paired speedup CIs, the
same-run confirmation that keeps drift from failing a night, and the asset check."""

import importlib

import duckdb
import pandas as pd
import pytest
from dagster import AssetKey, DagsterInstance, asset, materialize

from kernaudit_pipeline import history
from kernaudit_pipeline.cli import main as cli_main
from kernaudit_pipeline.defs.audit_history import audit_history, no_new_regressions
from kernaudit_pipeline.defs.resources import AuditSettings

defs_history = importlib.import_module("kernaudit_pipeline.defs.audit_history")  # the module, not the asset

C = history.Confirmation


def row(config, latency, lo, hi, status="IMPROVED", shape="s1", device="NVIDIA H200", kernel="gemm_bf16",
        speedup=None, sp_lo=None, sp_hi=None):
    return {"kernel_name": kernel, "config_id": config, "shape_name": shape, "device_name": device,
            "latency_us": latency, "latency_ci_low_us": lo, "latency_ci_high_us": hi, "baseline_us": 120.0,
            "speedup": speedup if speedup is not None or latency is None else 120.0 / latency,
            "speedup_ci_low": sp_lo, "speedup_ci_high": sp_hi, "status": status}


# paired rows (speedup CIs) and older rows (latency CIs only)
BASE = [row("a", 100.0, 99.0, 101.0, speedup=1.20, sp_lo=1.19, sp_hi=1.21),
        row("b", 50.0, 49.0, 51.0, speedup=2.40, sp_lo=2.37, sp_hi=2.43),
        row("c", 80.0, 79.0, 81.0), row("d", 40.0, None, None), row("e", 30.0, 29.5, 30.5),
        row("f", 60.0, 59.0, 61.0)]
NOW = [row("a", 110.0, 109.0, 111.0, speedup=1.09, sp_lo=1.08, sp_hi=1.10),  # paired CIs apart
       row("b", 53.0, 52.0, 54.0, speedup=2.36, sp_lo=2.33, sp_hi=2.39),     # latency drifted 6 %, paired CIs overlap
       row("c", 81.0, 80.5, 81.5),      # +1.25 %: inside the 2 % band
       row("d", 44.0, None, None),      # +10 %, no CIs at all: judged by the band alone
       row("e", None, None, None, status="FAILED"),  # newly failing
       row("f", 50.0, 49.0, 51.0)]      # faster: fine


@pytest.fixture
def db(tmp_path):
    return tmp_path / "history.duckdb"


def test_without_a_remeasure_timing_differences_are_unconfirmed(db):
    first = history.record_audit(db, "run-1", pd.DataFrame(BASE), trigger="manual")
    assert first.accepted and first.rows == 6
    assert not history.record_audit(db, "run-2", pd.DataFrame(NOW), trigger="nightly").accepted
    result = history.compare(db, "run-2", noise_band=0.02)
    assert result.reference_run_id == "run-1" and result.keys_compared == 6
    found = {r.config_id: r for r in result.regressions}
    assert set(found) == {"a", "d", "e"}  # b's latency moved but its paired speedup did not
    assert found["e"].kind == history.RegressionKind.NOW_FAILING and found["e"].confirmation == C.CONFIRMED
    a = found["a"]
    assert a.kind == history.RegressionKind.SLOWER and a.confirmation == C.UNCONFIRMED
    assert "no GPU" in a.confirmation_note and a.ci_separated is True
    assert a.delta_pct == pytest.approx((1.20 / 1.09 - 1) * 100, abs=0.01)
    assert found["d"].ci_separated is None and found["d"].confirmation == C.UNCONFIRMED
    assert [r.config_id for r in result.confirmed] == ["e"]


def test_a_remeasure_confirms_or_refutes(db):
    history.record_audit(db, "run-1", pd.DataFrame(BASE))
    history.record_audit(db, "run-2", pd.DataFrame(NOW))
    asked = []

    def still_slow(reg):
        asked.append((reg.kernel_name, reg.shape_name, reg.config_id))
        return history.Remeasured(1.10, 1.09, 1.11)

    result = history.compare(db, "run-2", remeasure=still_slow)
    a = {r.config_id: r for r in result.regressions}["a"]
    assert a.confirmation == C.CONFIRMED and a.remeasured_speedup == 1.10
    assert ("gemm_bf16", "s1", "a") in asked
    # d has no reference speedup CI (an older audit): a re-measure cannot judge it
    assert {r.config_id: r for r in result.regressions}["d"].confirmation == C.UNCONFIRMED

    drift = history.compare(db, "run-2", remeasure=lambda reg: history.Remeasured(1.19, 1.175, 1.205))
    assert {r.config_id: r for r in drift.regressions}["a"].confirmation == C.REFUTED

    def broken(reg):
        raise RuntimeError("runner exit 1")

    failed = history.compare(db, "run-2", remeasure=broken)
    a = {r.config_id: r for r in failed.regressions}["a"]
    assert a.confirmation == C.UNCONFIRMED and "runner exit 1" in a.confirmation_note


def test_accepting_moves_the_reference(db):
    history.record_audit(db, "run-1", pd.DataFrame(BASE))
    slower = [NOW[0]]
    history.record_audit(db, "run-2", pd.DataFrame(slower))
    assert len(history.compare(db, "run-2").regressions) == 1
    history.accept(db, "run-2", "reviewer")
    history.record_audit(db, "run-3", pd.DataFrame(slower))
    result = history.compare(db, "run-3")
    assert result.reference_run_id == "run-2" and result.regressions == ()
    audits = {a.run_id: a for a in history.list_audits(db)}
    assert audits["run-2"].accepted and audits["run-2"].accepted_by == "reviewer"


def test_keys_are_per_device_and_shape_and_duplicates_condense_to_the_fastest(db):
    history.record_audit(db, "run-1", pd.DataFrame([row("a", 100.0, 99.0, 101.0, device="NVIDIA H100"),
                                                     row("a", 100.0, 99.0, 101.0, shape="s2")]))
    now = pd.DataFrame([row("a", 130.0, 129.0, 131.0, device="NVIDIA H200"),   # a new key: nothing to compare
                        row("a", 100.5, 100.0, 101.0, shape="s2"),
                        row("a", 140.0, 139.0, 141.0, shape="s2")])              # duplicate: the fastest counts
    history.record_audit(db, "run-2", now)
    result = history.compare(db, "run-2")
    assert result.keys_compared == 1 and result.regressions == ()


def test_re_recording_a_run_replaces_it(db):
    history.record_audit(db, "run-1", pd.DataFrame(BASE))
    history.record_audit(db, "run-1", pd.DataFrame(BASE[:2]))
    assert [a.rows for a in history.list_audits(db)] == [2]


def test_a_database_from_before_paired_timing_gains_the_columns(db):
    con = duckdb.connect(str(db))
    con.execute("""CREATE TABLE audits (run_id VARCHAR PRIMARY KEY, recorded_utc TIMESTAMP NOT NULL,
                   trigger VARCHAR, data_mode VARCHAR, rows INTEGER NOT NULL, accepted BOOLEAN NOT NULL DEFAULT FALSE,
                   accepted_utc TIMESTAMP, accepted_by VARCHAR)""")
    con.execute("""CREATE TABLE results (run_id VARCHAR NOT NULL, kernel_name VARCHAR NOT NULL,
                   config_id VARCHAR NOT NULL, shape_name VARCHAR NOT NULL, device_name VARCHAR NOT NULL,
                   latency_us DOUBLE, latency_ci_low_us DOUBLE, latency_ci_high_us DOUBLE, baseline_us DOUBLE,
                   speedup DOUBLE, status VARCHAR, recorded_utc TIMESTAMP NOT NULL,
                   PRIMARY KEY (run_id, kernel_name, config_id, shape_name, device_name))""")
    con.execute("INSERT INTO audits VALUES ('old', now(), 'manual', NULL, 1, TRUE, now(), 'first')")
    con.execute("INSERT INTO results VALUES ('old', 'gemm_bf16', 'a', 's1', 'NVIDIA H200', 100, 99, 101, 120, 1.2, "
                "'IMPROVED', now())")
    con.close()
    history.record_audit(db, "new", pd.DataFrame([NOW[0]]))
    (reg,) = history.compare(db, "new").regressions
    assert reg.reference_speedup_ci_low is None and reg.speedup_ci_high == 1.10  # judged on latency CIs
    assert reg.ci_separated is True and reg.confirmation == C.UNCONFIRMED


def test_cli_list_accept_compare_and_errors(db, capsys):
    history.record_audit(db, "aaaa-1111", pd.DataFrame(BASE))
    history.record_audit(db, "bbbb-2222", pd.DataFrame([NOW[0]]))
    args = ["history", "--data-dir", str(db.parent)]
    assert cli_main([*args, "list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("* aaaa-1111") and out[1].startswith("  bbbb-2222")
    assert cli_main([*args, "compare"]) == 0
    out = capsys.readouterr().out
    assert "bbbb-2222 vs reference aaaa-1111: 1 keys compared, 0 confirmed regressions, 1 unconfirmed" in out
    assert "unconfirmed slower" in out and "100.00 -> 110.00 us" in out and "1.200 -> 1.090" in out
    assert cli_main([*args, "accept", "bbbb", "--reviewer", "me"]) == 0
    assert "accepted bbbb-2222" in capsys.readouterr().out
    assert cli_main([*args, "accept", "zzzz"]) == 2
    assert capsys.readouterr().err.strip() == "kernaudit history: no audit with run id 'zzzz' in the history"
    assert cli_main([*args, "frobnicate"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert cli_main([*args, "compare", "--noise-band", "2"]) == 2
    assert "--noise-band" in capsys.readouterr().err


def test_cli_without_history_says_so(tmp_path, capsys):
    assert cli_main(["history", "--data-dir", str(tmp_path), "list"]) == 2
    assert "no audit history yet" in capsys.readouterr().err


def _diag_asset(rows):
    @asset(name="spill_diagnostics")
    def spill_diagnostics() -> pd.DataFrame:
        return pd.DataFrame(rows)

    return spill_diagnostics


def test_the_asset_check_fails_only_on_confirmed_regressions(tmp_path, monkeypatch):
    settings = AuditSettings(data_dir=str(tmp_path / "data"))
    monkeypatch.setattr(defs_history, "remeasure_for", lambda s: None)  # a CPU-only audit
    with DagsterInstance.ephemeral() as instance:
        def run(rows):
            return materialize([_diag_asset(rows), audit_history, no_new_regressions], instance=instance,
                               resources={"settings": settings})

        first = run(BASE)
        assert first.success and first.get_asset_check_evaluations()[0].passed
        [evaluation] = first.get_asset_check_evaluations()
        assert "first audit" in evaluation.metadata["reference_run_id"].value  # said, not "no regression"
        drifted = run([NOW[0], *BASE[1:]])  # slower, but nothing could re-measure it
        [evaluation] = drifted.get_asset_check_evaluations()
        assert evaluation.passed and evaluation.metadata["unconfirmed"].value == 1
        latest = instance.get_latest_materialization_event(AssetKey("audit_history"))
        assert latest.asset_materialization.metadata["unconfirmed_regressions"].value == 1
        assert "no GPU" in latest.asset_materialization.metadata["remeasured_on"].value

        # the same audit on a GPU whose re-measure agrees: the check fails
        monkeypatch.setattr(defs_history, "remeasure_for",
                            lambda s: lambda reg: history.Remeasured(1.10, 1.09, 1.11))
        confirmed = run([NOW[0], *BASE[1:]])
        assert confirmed.success  # a failed check reports, it does not crash the audit
        [evaluation] = confirmed.get_asset_check_evaluations()
        assert not evaluation.passed and evaluation.severity.value == "ERROR"
        assert evaluation.metadata["regressions"].value == 1
        [record] = evaluation.metadata["regressions_table"].records
        assert record.data["kernel_name"] == "gemm_bf16" and record.data["confirmation"] == "confirmed"
        assert record.data["latency_ci_low_us"] == 109.0 and record.data["reference_ci_high_us"] == 101.0
        history.accept(settings.paths().history_db, confirmed.run_id)
        assert run([NOW[0], *BASE[1:]]).get_asset_check_evaluations()[0].passed


def test_newly_failing_fails_the_check_without_a_gpu(tmp_path, monkeypatch):
    settings = AuditSettings(data_dir=str(tmp_path / "data"))
    monkeypatch.setattr(defs_history, "remeasure_for", lambda s: None)
    with DagsterInstance.ephemeral() as instance:
        materialize([_diag_asset(BASE), audit_history, no_new_regressions], instance=instance,
                    resources={"settings": settings})
        second = materialize([_diag_asset([*BASE[:4], NOW[4], BASE[5]]), audit_history, no_new_regressions],
                             instance=instance, resources={"settings": settings})
        [evaluation] = second.get_asset_check_evaluations()
        assert not evaluation.passed and evaluation.metadata["now_failing"].value == 1
