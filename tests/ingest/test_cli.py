"""``kernaudit ingest`` as a command: output tables, summary lines, one-line errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest

from kernaudit_pipeline.cli import main
from kernaudit_pipeline.kernel_runs import COLUMNS, QUARANTINE_COLUMNS


def cli(argv: list[str]) -> int:
    return main(["ingest", *argv])

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def test_cli_writes_tables_and_summarises(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(FIXTURES.parent.parent)  # relative paths as a user types them
    rel = [str((FIXTURES / n).relative_to(Path.cwd())) for n in
           ("ncu_raw_garbled.csv", "ncu_details_garbled.csv", "runner_bad.jsonl", "seed_bad.json")]
    rc = cli([*rel, "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert rc == 0
    runs = pd.read_csv(tmp_path / "out" / "kernel_runs.csv")
    quarantine = pd.read_csv(tmp_path / "out" / "quarantine.csv")
    rules = pd.read_csv(tmp_path / "out" / "ncu_rules.csv")
    assert list(runs.columns) == list(COLUMNS) and list(quarantine.columns) == list(QUARANTINE_COLUMNS)
    # raw 1+3, details 1+2, runner 1+3 (+2 non-row), seed 1+2 (one fails the schema)
    assert len(runs) == 4 and len(quarantine) == 10
    assert len(rules) == 1 and rules.loc[0, "rule_name"] == "CPIStall"
    assert (tmp_path / "out" / "peaks.csv").exists()
    assert f"{rel[0]}: ncu_raw: 1 rows normalized, 3 quarantined (4 records in)" in out
    assert f"{rel[2]}: runner_jsonl: 1 rows normalized, 3 quarantined, 2 non-row records (6 records in)" in out
    assert f"{rel[3]}: seed_json: 1 rows normalized, 2 quarantined (3 records in)" in out
    for frame in (runs, quarantine):
        assert not frame["source_file"].astype(str).str.startswith("/").any()
    assert set(runs["source_format"]) == {"ncu_raw", "ncu_details", "runner_jsonl", "seed_json"}


def test_cli_absolute_paths_become_relative(tmp_path, monkeypatch):
    monkeypatch.chdir(FIXTURES)
    assert cli([str(FIXTURES / "ptxas_truncated.log"), "--out", str(tmp_path)]) == 0
    q = pd.read_csv(tmp_path / "quarantine.csv")
    runs = pd.read_csv(tmp_path / "kernel_runs.csv")
    assert runs.loc[0, "source_file"] == "ptxas_truncated.log" == q.loc[0, "source_file"]


@pytest.mark.parametrize("name", ["trace_truncated.json", "unknown_format.txt"])
def test_one_unreadable_file_is_listed_and_the_others_still_written(tmp_path, capsys, name):
    rc = cli([str(FIXTURES / "ptxas_truncated.log"), str(FIXTURES / name), "--out", str(tmp_path / "o")])
    captured = capsys.readouterr()
    assert rc == 2  # a named input was skipped: say so in the exit status ...
    assert captured.err.count("\n") == 1 and name in captured.err and "Traceback" not in captured.err
    assert f"{name}: skipped (" in captured.out
    runs = pd.read_csv(tmp_path / "o" / "kernel_runs.csv")  # ... but the tables hold the other file
    assert len(runs) == 1 and runs.loc[0, "source_format"] == "ptxas_log"
    assert not list((tmp_path / "o").glob(".*partial"))


def test_nothing_readable_writes_nothing(tmp_path, capsys):
    rc = cli([str(FIXTURES / "unknown_format.txt"), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "no input could be read" in err
    assert not (tmp_path / "o" / "kernel_runs.csv").exists()


def test_cli_walks_directories_and_skips_readmes(tmp_path, capsys):
    d = tmp_path / "traces"
    (d / "nested").mkdir(parents=True)
    (d / "README.md").write_text("# notes\n")
    (d / "collect.log").write_text("== host\nNVIDIA H200, 580.159.04\n")  # a log beside the traces
    (d / "nested" / "a.log").write_text((FIXTURES / "ptxas_truncated.log").read_text())
    (d / "b.hatchet").write_text((FIXTURES / "proton_bad_leaf.hatchet").read_text())
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        assert cli(["traces", "--out", "out"]) == 0
    finally:
        os.chdir(cwd)
    out = capsys.readouterr().out
    assert "traces/b.hatchet: proton" in out and "traces/nested/a.log: ptxas_log" in out
    assert "traces/collect.log: skipped (unrecognized format" in out
    assert "README" not in out


def test_a_garbled_file_inside_a_directory_is_reported(tmp_path, capsys):
    d = tmp_path / "traces"
    d.mkdir()
    (d / "broken.json").write_text((FIXTURES / "trace_truncated.json").read_text())
    (d / "ok.log").write_text((FIXTURES / "ptxas_truncated.log").read_text())
    assert cli([str(d), "--out", str(tmp_path / "o")]) == 2  # garbled, not a stray log: it counts
    captured = capsys.readouterr()
    assert "broken.json: skipped (malformed or truncated JSON" in captured.out
    assert len(pd.read_csv(tmp_path / "o" / "kernel_runs.csv")) == 1


def test_json_summary(tmp_path, capsys):
    assert cli([str(FIXTURES / "ptxas_truncated.log"), "--out", str(tmp_path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    (entry,) = summary["files"]
    assert entry["source_format"] == "ptxas_log" and entry["kept"] == 1 and entry["quarantined"] == 1
    assert entry["records_in"] == entry["kept"] + entry["quarantined"] + entry["other_records"]


def test_a_runner_jsonl_is_written_batch_by_batch(tmp_path, capsys, monkeypatch):
    from kernaudit_pipeline.ingest import jsonl

    monkeypatch.setattr(jsonl, "BATCH_ROWS", 3)
    rows = [{"record_type": "run", "kernel_name": "k", "config_id": f"c{i}", "latency_us": 1.0 + i,
             "baseline_us": 2.0} for i in range(10)]
    lines = [json.dumps(r) for r in rows]
    lines.insert(7, json.dumps({**rows[0], "latency_us": True}))  # turns the rest to exact reading
    lines.insert(2, json.dumps({"record_type": "peak", "peak_name": "dram", "peak_gb_per_s": 4000.0}))
    (tmp_path / "r.jsonl").write_text("\n".join(lines) + "\n")
    assert cli([str(tmp_path / "r.jsonl"), "--out", str(tmp_path / "o")]) == 0
    runs = pd.read_csv(tmp_path / "o" / "kernel_runs.csv")
    quarantine = pd.read_csv(tmp_path / "o" / "quarantine.csv")
    assert sorted(runs["latency_us"]) == [1.0 + i for i in range(10)]
    assert len(quarantine) == 1 and "boolean" in quarantine.loc[0, "reason"]
    assert len(pd.read_csv(tmp_path / "o" / "peaks.csv")) == 1
    assert "10 rows normalized, 1 quarantined, 1 non-row records (12 records in)" in capsys.readouterr().out
