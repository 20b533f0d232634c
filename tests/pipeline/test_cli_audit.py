"""`kernaudit audit` as a person runs it: stages while it works, the decisions and the next step at the end,
`--quiet` with only the table and the paths, and a failure in one line that names its log file."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.report.inputs import sample_files

ROOT = Path(__file__).resolve().parents[2]


def kernaudit(*args: str, data_dir: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "KERNAUDIT_DATA_DIR": str(data_dir),
               "DAGSTER_HOME": str(data_dir / "dagster_home"), **(env or {})}
    environ.pop("ANTHROPIC_API_KEY", None)
    return subprocess.run([sys.executable, "-m", "kernaudit_pipeline.cli", *args], capture_output=True, text=True,
                          env=environ, cwd=ROOT, timeout=900)


@pytest.mark.slow
def test_stages_while_it_works_then_every_decision_the_checks_and_the_next_step(tmp_path):
    data = tmp_path / "data"
    sources = [a for f in sample_files() for a in ("--source", str(f))]
    done = kernaudit("audit", "--no-static", *sources, data_dir=data)
    assert done.returncode == 0, done.stderr[-3000:]
    # while it works: each stage with its elapsed time, on stderr
    for stage in ("kernel_sources", "raw_traces.merge_traces", "recommendations", "audit_report"):
        assert re.search(rf"^\[\d+:\d\d\] {re.escape(stage)} done in \d+\.\d s$", done.stderr, re.M), stage
    assert "Traceback" not in done.stderr and "INFO" not in done.stderr
    out = done.stdout
    report = Path(re.search(r"^report: (.+report\.html)$", out, re.M).group(1))
    payload = json.loads(report.with_name("report.json").read_text())
    names = payload["decisions"] or payload["best"]
    for row in names:  # the terminal names every decision (or, before decisions exist, every group)
        assert re.search(rf"^\S*\s*{re.escape(row['kernel_name'])}\s+{re.escape(str(row['shape_name']))}\s", out, re.M)
    assert re.search(r"^checks: \d+ of \d+ passed", out, re.M)
    assert "next: kernaudit review list" in out
    assert f"mlflow: mlflow ui --backend-store-uri sqlite:///{data.resolve()}/mlflow.db" in out
    assert "<that>" not in out
    assert payload["history_reference"] is None  # the first audit says so
    assert 'id="first-audit"' in report.read_text()

    quiet = kernaudit("audit", "--quiet", "--no-static", *sources, data_dir=data)
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert quiet.stderr.strip() == ""  # no stages, no progress, no library chatter
    lines = quiet.stdout.splitlines()
    assert not any(line.startswith(("checks:", "next:", "audit ")) for line in lines)
    assert [line.split(":")[0] for line in lines[-4:]] == ["report", "markdown", "json", "mlflow"]
    assert len(lines) == 3 + len(names) + 4  # title, header, rule, one row per decision, four paths
    second = json.loads(Path(lines[-2].split(": ", 1)[1]).read_text())
    assert second["history_reference"] == payload["run_id"]  # compared with the first, not with itself


@pytest.mark.slow
def test_a_failed_audit_is_one_line_naming_its_log(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a trace"')
    done = kernaudit("audit", "--no-static", "--source", str(bad), data_dir=tmp_path / "data")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    match = re.fullmatch(r"kernaudit audit: run \S+ failed: step (\S+) failed: (\w+): (.+) \(details: (\S+)\)", last)
    assert match, last
    assert match.group(1) == "raw_traces.merge_traces" and "bad.json" in match.group(3)
    log = Path(match.group(4))
    dump = log.read_text()  # Dagster's full error, stack frames included
    assert log.parent == (tmp_path / "data" / "logs").resolve() and "bad.json" in dump and 'File "' in dump


def test_bad_options_fail_before_anything_runs(tmp_path):
    missing = kernaudit("audit", "--source", str(tmp_path / "nope.jsonl"), data_dir=tmp_path / "data")
    assert missing.returncode == 2 and missing.stderr.strip() == f"kernaudit audit: {tmp_path / 'nope.jsonl'}: no such file"
    unknown = kernaudit("audit", "--kernel", "not_a_kernel", data_dir=tmp_path / "data")
    assert unknown.returncode == 2 and "--kernel not_a_kernel: not a module in kernels/" in unknown.stderr
    band = kernaudit("audit", "--noise-band", "2", data_dir=tmp_path / "data")
    assert band.returncode == 2 and "--noise-band" in band.stderr
    assert not (tmp_path / "data" / "dagster_home").exists()  # nothing started
