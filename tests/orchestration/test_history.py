"""Audit history in DuckDB, the comparison with the accepted audit, and the asset check."""

import pandas as pd
import pytest
from dagster import AssetKey, DagsterInstance, asset, materialize

from kernaudit_pipeline import history
from kernaudit_pipeline.defs.audit_history import audit_history, no_new_regressions
from kernaudit_pipeline.defs.resources import AuditSettings


def row(config, latency, lo, hi, status="IMPROVED", shape="s1", device="NVIDIA H200", kernel="gemm_bf16"):
    return {"kernel_name": kernel, "config_id": config, "shape_name": shape, "device_name": device,
            "latency_us": latency, "latency_ci_low_us": lo, "latency_ci_high_us": hi, "baseline_us": 120.0,
            "speedup": None if latency is None else 120.0 / latency, "status": status}


BASE = [row("a", 100.0, 99.0, 101.0), row("b", 50.0, 49.0, 51.0), row("c", 80.0, 79.0, 81.0),
        row("d", 40.0, None, None), row("e", 30.0, 29.5, 30.5), row("f", 60.0, 59.0, 61.0)]


@pytest.fixture
def db(tmp_path):
    return tmp_path / "history.duckdb"


def test_first_audit_is_the_reference_later_ones_are_compared(db):
    first = history.record_audit(db, "run-1", pd.DataFrame(BASE), trigger="manual")
    assert first.accepted and first.rows == 6
    now = [row("a", 110.0, 109.0, 111.0),   # +10 %, CIs apart: regression
           row("b", 51.5, 50.5, 52.5),      # +3 %, CIs overlap: noise, not a regression
           row("c", 81.0, 80.5, 81.5),      # +1.25 %: inside the 2 % band
           row("d", 44.0, None, None),      # +10 %, no CIs: judged by the band alone
           row("e", None, None, None, status="FAILED"),  # newly failing
           row("f", 50.0, 49.0, 51.0)]      # faster: fine
    second = history.record_audit(db, "run-2", pd.DataFrame(now), trigger="nightly")
    assert not second.accepted
    result = history.compare(db, "run-2", noise_band=0.02)
    assert result.reference_run_id == "run-1" and result.keys_compared == 6
    found = {r.config_id: r for r in result.regressions}
    assert set(found) == {"a", "d", "e"}
    assert found["e"].kind == history.RegressionKind.NOW_FAILING
    a = found["a"]
    assert a.kind == history.RegressionKind.SLOWER and a.delta_us == 10.0 and a.delta_pct == 10.0
    assert (a.latency_ci_low_us, a.reference_ci_high_us, a.ci_separated) == (109.0, 101.0, True)
    assert found["d"].ci_separated is None


def test_accepting_moves_the_reference(db):
    history.record_audit(db, "run-1", pd.DataFrame(BASE))
    slower = [row("a", 110.0, 109.0, 111.0)]
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


def test_cli_list_accept_compare_and_errors(db, capsys):
    history.record_audit(db, "aaaa-1111", pd.DataFrame(BASE))
    history.record_audit(db, "bbbb-2222", pd.DataFrame([row("a", 110.0, 109.0, 111.0)]))
    args = ["--data-dir", str(db.parent)]
    assert history.cli([*args, "list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("* aaaa-1111") and out[1].startswith("  bbbb-2222")
    assert history.cli([*args, "compare"]) == 0
    out = capsys.readouterr().out
    assert "bbbb-2222 vs reference aaaa-1111: 1 keys compared, 1 regressions" in out
    assert "slower" in out and "100.00 -> 110.00 us (10.00 %)" in out
    assert history.cli([*args, "accept", "bbbb"]) == 0
    assert "accepted bbbb-2222" in capsys.readouterr().out
    assert history.cli([*args, "accept", "zzzz"]) == 2
    assert capsys.readouterr().err.strip() == "kernaudit history: no audit with run id 'zzzz' in the history"
    assert history.cli([*args, "frobnicate"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_cli_without_history_says_so(tmp_path, capsys):
    assert history.cli(["--data-dir", str(tmp_path), "list"]) == 2
    assert "no audit history yet" in capsys.readouterr().err


def _diag_asset(rows):
    @asset(name="spill_diagnostics")
    def spill_diagnostics() -> pd.DataFrame:
        return pd.DataFrame(rows)

    return spill_diagnostics


def test_a_regression_fails_the_asset_check_in_the_instance(tmp_path):
    settings = AuditSettings(data_dir=str(tmp_path / "data"))
    with DagsterInstance.ephemeral() as instance:
        def run(rows):
            return materialize([_diag_asset(rows), audit_history, no_new_regressions], instance=instance,
                               resources={"settings": settings})

        first = run(BASE)
        assert first.success
        [evaluation] = first.get_asset_check_evaluations()
        assert evaluation.passed
        assert "first audit" in evaluation.metadata["reference_run_id"].value  # said, not "no regression"
        second = run([row("a", 110.0, 109.0, 111.0), *BASE[1:]])
        assert second.success  # a failed check reports, it does not crash the audit
        [evaluation] = second.get_asset_check_evaluations()
        assert not evaluation.passed and evaluation.severity.value == "ERROR"
        assert evaluation.metadata["regressions"].value == 1
        assert evaluation.metadata["worst_delta_pct"].value == 10.0
        [record] = evaluation.metadata["regressions_table"].records
        assert record.data["kernel_name"] == "gemm_bf16" and record.data["latency_ci_low_us"] == 109.0
        assert record.data["reference_ci_high_us"] == 101.0
        # the check shows on the asset as Dagster records it (what the UI reads)
        latest = instance.get_latest_materialization_event(AssetKey("audit_history"))
        assert latest.asset_materialization.metadata["regressions"].value == 1
        history.accept(settings.paths().history_db, second.run_id)
        third = run([row("a", 110.0, 109.0, 111.0), *BASE[1:]])
        assert third.get_asset_check_evaluations()[0].passed
