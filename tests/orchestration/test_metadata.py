"""Dagster metadata as typed tables, and MLflow run names that never read __ASSET_JOB."""

import math

import pandas as pd
from dagster import TableMetadataValue

from kernaudit_pipeline.core.verdicts import Status
from kernaudit_pipeline.defs.metadata import table
from kernaudit_pipeline.defs.resources import run_name


def test_a_frame_becomes_a_typed_table_with_plain_values():
    frame = pd.DataFrame({"kernel_name": ["gemm_bf16", "fa"], "registers_per_thread": [255, 128],
                          "speedup": [1.25, math.nan], "status": [Status.IMPROVED, Status.PRUNED_SPILL],
                          "spill_detected": [True, False]})
    value = table(frame, ["kernel_name", "speedup", "status", "spill_detected", "not_a_column"], limit=1)
    assert isinstance(value, TableMetadataValue)
    assert [c.name for c in value.schema.columns] == ["kernel_name", "speedup", "status", "spill_detected"]
    assert [c.type for c in value.schema.columns] == ["string", "float", "string", "bool"]
    [record] = value.records
    assert record.data == {"kernel_name": "gemm_bf16", "speedup": 1.25, "status": "IMPROVED", "spill_detected": True}
    assert type(record.data["status"]) is str  # the enum's value: Dagster serializes plain values only
    assert table(frame.iloc[0:0]).records == []


def test_mlflow_run_names_say_what_ran():
    assert run_name("audit_job", None) == "audit_job"
    assert run_name("__ASSET_JOB", ["audit_report", "recommendations"]) == \
        "materialized: audit_report, recommendations"
    many = run_name("__ASSET_JOB", [f"a{i}" for i in range(7)])
    assert many.startswith("materialized: a0, a1, a2, a3") and many.endswith("and 3 more")
    assert "__ASSET_JOB" not in run_name("__ASSET_JOB", [])
