"""The normalized table: schema, quarantine, and that no row is ever lost."""

import math

import pandas as pd

from kernaudit_pipeline.kernel_runs import COLUMNS, SEED_FIELDS, KernelRuns, attach_static_resources, normalize
from kernaudit_pipeline.synthetic import generate


def row(i, **kw):
    r = {"kernel_name": "k", "config_id": f"c{i}", "latency_us": 10.0 + i, "baseline_us": 12.0,
         "source_format": "test", "source_file": "t.jsonl", "source_row": i}
    r.update(kw)
    return r


def test_seed_fields_are_columns_and_units_are_named():
    assert set(SEED_FIELDS) <= set(COLUMNS)
    for col in COLUMNS:
        if "latency" in col or col.startswith("baseline_") and col not in ("baseline_name", "baseline_backend"):
            assert col.endswith("_us") or col == "latency_samples"
        if ("spill" in col and "requests" not in col or "shared_mem" in col) and "occupancy_limit" not in col:
            assert col.endswith("_bytes"), col


def test_every_row_lands_in_exactly_one_table():
    rows = [row(0), row(1, latency_us=-1.0), row(2, registers_per_thread=400), row(3, num_warps=6),
            row(4, latency_us="abc"), row(5, kernel_name=""), row(6),
            row(7, spill_stores_bytes=0, spill_loads_bytes=64),
            row(8, latency_us=10.0, latency_ci_low_us=11.0, latency_ci_high_us=12.0)]
    result = normalize(rows)
    assert len(result.kernel_runs) + len(result.quarantine) == len(rows)
    assert sorted(result.kernel_runs["source_row"].tolist()) == [0, 6]
    assert sorted(result.quarantine["source_row"].tolist()) == [1, 2, 3, 4, 5, 7, 8]
    reasons = dict(zip(result.quarantine["source_row"], result.quarantine["reason"]))
    assert "latency_us" in reasons[1] and "registers_per_thread" in reasons[2]
    assert "num_warps" in reasons[3] and "latency_us" in reasons[4]
    assert "spill_loads_need_stores" in reasons[7] and "ci_brackets_median" in reasons[8]
    assert all(isinstance(r, str) and "\n" not in r for r in reasons.values())
    # raw values are kept for the person who reads the quarantine
    assert '"registers_per_thread": 400' in result.quarantine.set_index("source_row").loc[2, "raw_json"]


def test_valid_frame_round_trips_schema():
    result = normalize([row(i) for i in range(5)])
    assert result.quarantine.empty
    KernelRuns.validate(result.kernel_runs)
    assert list(result.kernel_runs.columns) == list(COLUMNS)


def test_synthetic_quarantine_accounting():
    frame = generate(seed=0, faults=3)
    result = normalize(frame.to_dict("records"))
    assert len(result.kernel_runs) + len(result.quarantine) == len(frame)
    assert len(result.quarantine) == 3
    assert set(result.quarantine["raw_json"].str.contains("fault injection")) == {True}


def test_static_resources_fill_only_missing_values():
    runs = normalize([row(0, config_id="a"), row(1, config_id="b", registers_per_thread=100)]).kernel_runs
    static = pd.DataFrame([
        {"kernel_name": "k", "config_id": "a", "status": "OK", "registers_per_thread": 200, "spill_stores_bytes": 0},
        {"kernel_name": "k", "config_id": "b", "status": "OK", "registers_per_thread": 150, "spill_stores_bytes": 8},
    ])
    out = attach_static_resources(runs, static).set_index("config_id")
    assert out.loc["a", "registers_per_thread"] == 200
    assert out.loc["b", "registers_per_thread"] == 100  # measured value wins
    assert out.loc["b", "spill_stores_bytes"] == 8
    assert not math.isnan(float(out.loc["a", "latency_us"]))
