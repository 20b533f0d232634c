"""The whole audit on other people's profiler files (tests/fixtures/public), end to end.

Real Dagster (SQLite instance in a temporary DAGSTER_HOME), real MLflow store, no static
compile, no synthetic rows, no GPU: exactly ``kernaudit audit --source ... --no-static
--no-synthetic --no-gpu``. Kernels of someone else's become candidates of their own and
reach a verdict; an unreadable file among the sources is listed, not fatal.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from kernaudit_pipeline.audit import run_audit

pytestmark = pytest.mark.slow

PUBLIC = Path(__file__).resolve().parent.parent / "fixtures" / "public"
FILES = sorted(p for p in PUBLIC.iterdir() if p.name != "SOURCES.md")


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("public_audit")
    root = tmp / "data"
    broken = tmp / "broken.json.gz"
    broken.write_bytes(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03not gzip at all")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KERNAUDIT_DATA_DIR", str(root))
        mp.setenv("DAGSTER_HOME", str(root / "dagster_home"))
        mp.delenv("ANTHROPIC_API_KEY", raising=False)
        settings = {"sources": [str(p) for p in [*FILES, broken]], "include_synthetic": False,
                    "use_gpu": "never", "static_enabled": False}
        result, report_dir = run_audit(settings, quiet=True)
        yield result, report_dir


def test_the_audit_succeeds_on_foreign_files(audited):
    result, report_dir = audited
    assert result.success
    assert (report_dir / "report.html").is_file() and (report_dir / "report.json").is_file()


def test_every_public_file_is_read_and_the_broken_one_listed(audited):
    _, report_dir = audited
    files = {Path(f["path"]).name: f for f in json.loads((report_dir / "report.json").read_text())["files"]}
    for path in FILES:
        assert files[path.name]["rows"] > 0, path.name
    assert files["broken.json.gz"]["source_format"] == "skipped"
    assert "gzip" in files["broken.json.gz"]["note"]


def test_foreign_kernels_reach_verdicts(audited):
    _, report_dir = audited
    diag = pd.read_csv(report_dir / "diagnostics.csv", low_memory=False)
    assert len(diag) > 300
    # tritonbench's softmax: one candidate per input shape, paired with naive_softmax's kernels
    softmax = diag[diag["kernel_name"] == "softmax_kernel"]
    assert len(softmax) == 3 and set(softmax["status"]) == {"IMPROVED"}
    assert (softmax["speedup"] - softmax["baseline_us"] / softmax["latency_us"]).abs().max() < 1e-9
    # a kernel whose file holds no baseline is a candidate without one, and says why
    alone = diag[diag["kernel_name"] == "triton_poi_fused_add_cos_sin_0"]
    assert len(alone) == 1 and alone["status_reason"].iloc[0] == "no baseline: the source timed none for this kernel"
    # diagnostics ran on whatever fields exist: occupancy for the known NVIDIA devices ...
    v100 = diag[diag["device_name"].astype(str).str.startswith("Tesla V100")]
    assert v100["occupancy_pct"].notna().any()
    # ... and none for AMD rows, which say so
    amd = diag[diag["vendor"] == "amd"]
    assert len(amd) > 0 and amd["occupancy_pct"].isna().all()
    assert amd["diag_notes"].str.contains("NVIDIA devices only").all()


def test_every_foreign_group_ends_in_one_decision(audited):
    _, report_dir = audited
    report = json.loads((report_dir / "report.json").read_text())
    decisions = report["decisions"]
    keys = [(d["kernel_name"], d["shape_name"], d["device_name"]) for d in decisions]
    assert len(keys) == len(set(keys)) > 100  # one decision per (kernel, shape, device)
    softmax = [d for d in decisions if d["kernel_name"] == "softmax_kernel"]
    assert len(softmax) == 3 and {d["baseline_name"] for d in softmax} == {"naive_softmax"}
    assert all(d["decision"] != "NO_DECISION" and d["speedup"] > 1 for d in softmax)
    alone = next(d for d in decisions if d["kernel_name"] == "triton_poi_fused_add_cos_sin_0")
    assert alone["decision"] == "NO_DECISION" and "no baseline" in alone["reason"]
