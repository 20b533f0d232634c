"""Other people's profiler output (tests/fixtures/public, see SOURCES.md) through ingest.

Expected values are read from the files independently of the parsers (``csv`` and ``json``
over the raw text), so a parser that slips a unit or drops a launch fails here.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
from collections import defaultdict
from pathlib import Path

import pandas as pd
import pytest

from kernaudit_pipeline.ingest import SourceFormat, ingest_paths, parse_path, validate
from kernaudit_pipeline.spill_diagnostics import diagnose

PUBLIC = Path(__file__).resolve().parent.parent / "fixtures" / "public"
FILES = sorted(p for p in PUBLIC.iterdir() if p.name != "SOURCES.md")


def _records(parsed) -> list[dict]:
    bulk = [] if parsed.frame is None else parsed.frame.to_dict("records")
    return parsed.rows + bulk


def _ncu_table(path: Path) -> tuple[list[str], list[list[str]]]:
    rows = list(csv.reader(io.StringIO(path.read_text())))
    h = next(i for i, r in enumerate(rows) if r and r[0] == "ID" and "Kernel Name" in r)
    return rows[h], [r for r in rows[h + 1:] if r and any(c.strip() for c in r)]


def _trace(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        return json.load(fh)


def test_the_collection_is_broad():
    assert len(FILES) >= 15
    formats = defaultdict(set)
    for path in FILES:
        fmt, _ = parse_path(path)
        formats[fmt].add(path.name)
    assert {SourceFormat.NCU_DETAILS, SourceFormat.TORCH_TRACE, SourceFormat.PROTON,
            SourceFormat.PTXAS_LOG} <= set(formats)
    assert sources_listed() == {p.name for p in FILES}


def sources_listed() -> set[str]:
    text = (PUBLIC / "SOURCES.md").read_text()
    return {line.split("`")[1] for line in text.splitlines() if line.startswith("| `")}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_public_file_ingests_and_every_record_is_accounted_for(path):
    fmt, parsed = parse_path(path)
    assert parsed.row_count > 0 and not parsed.quarantine, [q["reason"] for q in parsed.quarantine][:3]
    assert parsed.accounted, (parsed.records_in, parsed.row_count, parsed.other_records)
    result = ingest_paths([path])
    checked = validate(result)
    assert checked.quarantine.empty, checked.quarantine["reason"].tolist()[:3]
    assert len(checked.kernel_runs) == parsed.row_count


# ---------------------------------------------------------------------------------------------
# Nsight Compute, 2020 to 2025
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["ncu_v100_bfs_2020.csv", "ncu_v100_lassen_bfs_2020.csv", "ncu_v100_cfd_2020.csv"])
def test_old_ncu_launches_are_kept_with_their_units(name):
    header, body = _ncu_table(PUBLIC / name)
    col = {c: header.index(c) for c in ("ID", "Metric Name", "Metric Unit", "Metric Value")}
    per_launch: dict[int, dict[str, tuple[str, str]]] = defaultdict(dict)
    for r in body:
        per_launch[int(r[col["ID"]])][r[col["Metric Name"]]] = (r[col["Metric Unit"]], r[col["Metric Value"]])
    _, parsed = parse_path(PUBLIC / name)
    rows = {r["ncu_launch_id"]: r for r in parsed.rows}
    assert set(rows) == set(per_launch)  # every launch kept, none quarantined
    for launch, metrics in per_launch.items():
        unit, value = metrics["Duration"]
        assert unit == "nsecond"
        assert rows[launch]["latency_us"] == pytest.approx(float(value.replace(",", "")) / 1000)
        unit, value = metrics["SM Frequency"]
        assert unit == "cycle/second"  # the spelling that quarantined every launch before
        assert rows[launch]["sm_clock_mhz"] == pytest.approx(float(value.replace(",", "")) / 1e6)
        # "SM [%]" and "Memory [%]" are the old names of the SOL figures
        assert rows[launch]["sm_throughput_pct"] == pytest.approx(float(metrics["SM [%]"][1]))
        assert rows[launch]["memory_throughput_pct"] == pytest.approx(float(metrics["Memory [%]"][1]))
        assert rows[launch]["registers_per_thread"] == int(metrics["Registers Per Thread"][1])
        assert rows[launch]["vendor"] == "nvidia"


def test_ncu_2025_base_units_and_a_compute_capability_10_device():
    _, parsed = parse_path(PUBLIC / "ncu_cc100_cublaslt_2025.csv")
    (row,) = parsed.rows
    assert row["compute_capability"] == "10.0"
    assert row["latency_us"] == pytest.approx(406.240)  # "Duration","ns","406240"
    assert row["sm_clock_mhz"] == pytest.approx(1239.49604913)  # "SM Frequency","hz","1239496049.13"
    assert (row["shared_mem_dynamic_bytes"], row["registers_per_thread"]) == (205_696, 168)
    assert row["threads_per_block"] == 384 and row["grid_size"] == 288


def test_ncu_2022_raw_metric_pages_without_launch_columns():
    header, body = _ncu_table(PUBLIC / "ncu_dropout_2022.csv")
    durations = {int(r[0]): float(r[header.index("Metric Value")].replace(",", "")) for r in body
                 if r[header.index("Metric Name")] == "gpu__time_duration.sum"}
    _, parsed = parse_path(PUBLIC / "ncu_dropout_2022.csv")
    got = {r["ncu_launch_id"]: r["latency_us"] for r in parsed.rows}
    assert got == pytest.approx({k: v / 1000 for k, v in durations.items()})  # nsecond
    assert all(r["config_id"] == "as_profiled" for r in parsed.rows)  # no launch facts in the file


# ---------------------------------------------------------------------------------------------
# torch.profiler traces: gzip, vendors, whole-microsecond timers, input shapes
# ---------------------------------------------------------------------------------------------
def test_gzipped_traces_ingest():
    gz = [p for p in FILES if p.suffix == ".gz"]
    assert len(gz) >= 5
    for path in gz:
        fmt, parsed = parse_path(path)
        assert fmt is SourceFormat.TORCH_TRACE and parsed.row_count > 0


def test_amd_rows_are_labelled_amd_and_get_no_nvidia_resources():
    _, parsed = parse_path(PUBLIC / "torch_mi250_rocm62.json.gz")
    assert {r["vendor"] for r in parsed.rows} == {"amd"}
    assert all(r.get("compute_capability") is None for r in parsed.rows)  # not the trace's "9.0"
    out = diagnose(pd.DataFrame(parsed.rows))
    assert out["occupancy_pct"].isna().all()
    assert out["diag_notes"].str.contains("NVIDIA devices only").any()
    _, hip = parse_path(PUBLIC / "proton_triton_hip.json")
    assert {(r["vendor"], r.get("compute_capability")) for r in hip.rows} == {("amd", None)}


def test_whole_microsecond_traces_keep_their_zero_launches():
    path = PUBLIC / "torch_v100_resnet50_int_us.json.gz"
    kernels = [e for e in _trace(path)["traceEvents"] if str(e.get("cat", "")).lower() == "kernel"]
    zeros = [e for e in kernels if e["dur"] == 0]
    assert zeros and all(float(e["dur"]).is_integer() for e in kernels)
    _, parsed = parse_path(path)
    assert sum(r["latency_samples"] for r in parsed.rows) == len(kernels)  # none dropped
    assert {r["timer_resolution_us"] for r in parsed.rows} == {1.0}
    # the unbiased mean: total time over every launch, 0 us ones included
    by_name: dict[str, list[float]] = defaultdict(list)
    for e in kernels:
        by_name[e["name"]].append(float(e["dur"]))
    for name, durs in by_name.items():
        rows = [r for r in parsed.rows if r["profiler_kernel_name"] == name]
        total = sum((r["latency_us"] or 0.0) * r["latency_samples"] for r in rows)
        assert total == pytest.approx(sum(durs)), name
    below = [r for r in parsed.rows if r["latency_us"] is None]
    assert all(r["latency_p90_us"] == 0 for r in below)  # every launch read 0: no latency, row kept
    fractional = [r for r in parse_path(PUBLIC / "torch_v100_ddp_ns.json.gz")[1].rows]
    assert {r["timer_resolution_us"] for r in fractional} == {None}


def test_input_shapes_and_scopes_are_kept():
    _, parsed = parse_path(PUBLIC / "torch_a100_triton_example.json.gz")
    (row,) = parsed.rows
    assert row["kernel_name"] == "triton_poi_fused_add_cos_sin_0"
    assert json.loads(row["input_shapes"]) == [[10, 10], [10, 10], [10, 10], []]
    assert row["shape_name"] == row["input_shapes"] and row["config_id"] == "grid1x1x1_block128x1x1_regs16_smem0"
    _, ddp = parse_path(PUBLIC / "torch_v100_ddp_ns.json.gz")
    assert any(r.get("scope") for r in ddp.rows)


def test_old_kineto_compute_properties_give_the_device():
    _, parsed = parse_path(PUBLIC / "torch_kineto_computeproperties.json")
    assert parsed.row_count > 0 and {r["vendor"] for r in parsed.rows} <= {"nvidia", None}


# ---------------------------------------------------------------------------------------------
# Proton: scopes, FLOPs and bytes, a baseline from the same file
# ---------------------------------------------------------------------------------------------
def _leaves(node, path=()):
    if not node.get("children"):
        yield path, node
        return
    here = path if node["frame"]["name"] == "ROOT" and not path else (*path, node["frame"]["name"])
    for child in node["children"]:
        yield from _leaves(child, here)


def test_tritonbench_rows_are_one_per_input_shape_and_paired_with_the_naive_baseline():
    path = PUBLIC / "tritonbench_proton.hatchet"
    tree = json.loads(path.read_text())[0]
    expected: dict[str, dict] = {}
    for scope, leaf in _leaves(tree):
        shape, op = "/".join(scope[:-1]), scope[-1]
        per_call_us = leaf["metrics"]["time (ns)"] / leaf["metrics"]["count"] / 1000
        entry = expected.setdefault(shape, {"triton": None, "naive": 0.0})
        if op == "triton_softmax":
            entry["triton"] = per_call_us
        else:
            entry["naive"] += per_call_us
    _, parsed = parse_path(path)
    softmax = {r["shape_name"]: r for r in parsed.rows if r["kernel_name"] == "softmax_kernel"}
    assert len(softmax) == 3 and set(softmax) == set(expected)
    for shape, row in softmax.items():
        assert row["scope"] == f"{shape}/triton_softmax"
        assert row["latency_us"] == pytest.approx(expected[shape]["triton"])
        assert row["baseline_us"] == pytest.approx(expected[shape]["naive"])
        assert row["baseline_name"] == "naive_softmax"
    baselines = [r for r in parsed.rows if r["kernel_name"] != "softmax_kernel"]
    assert len(baselines) == 15 and {r["config_id"] for r in baselines} == {"baseline"}


def test_proton_flops_and_bytes_are_per_call():
    _, parsed = parse_path(PUBLIC / "proton_triton_cuda.json")
    rows = {r["kernel_name"]: r for r in parsed.rows}
    # foo0: 10 launches, flops8 1e11 and bytes 1e8 in total
    assert rows["foo0"]["flops"] == pytest.approx(1e10) and rows["foo0"]["bytes_moved"] == pytest.approx(1e7)
    assert rows["foo0"]["latency_us"] == pytest.approx(204_800 / 10 / 1000)
    assert (rows["foo0"]["compute_capability"], rows["foo1"]["compute_capability"]) == ("9.0", "8.9")
    _, nested = parse_path(PUBLIC / "proton_triton_leaf_nodes.json")
    rows = {r["kernel_name"]: r for r in nested.rows}
    # flops/bytes set on the scope above exactly one timed kernel belong to that kernel
    assert rows["kernel_1_3_1"]["flops"] == pytest.approx(1534939103232 / 502)
    assert rows["kernel_1_3_1"]["scope"] == "kernel_1_1_1/kernel_1_2_1"
    assert rows["kernel_1_2_2"].get("flops") is None


# ---------------------------------------------------------------------------------------------
# ptxas: spills read from the column that means spills
# ---------------------------------------------------------------------------------------------
def test_a_stack_frame_without_spill_stores_is_no_spill():
    _, parsed = parse_path(PUBLIC / "ptxas_flash_attention_sm89.log")
    assert len(parsed.rows) == 5
    assert all(r["stack_frame_bytes"] >= 800 and r["spill_stores_bytes"] == 0 for r in parsed.rows)
    out = diagnose(pd.DataFrame(parsed.rows))
    assert not out["spill_detected"].any()


def test_ptxas_entries_only_non_entry_spills_are_not_rows():
    text = (PUBLIC / "ptxas_openmp_sm89.log").read_text()
    entries = text.count("Compiling entry function")
    _, parsed = parse_path(PUBLIC / "ptxas_openmp_sm89.log")
    assert len(parsed.rows) == entries
    assert all(r["spill_stores_bytes"] == 0 for r in parsed.rows)  # the spilling helpers are no entries
    assert {r["compute_capability"] for r in parsed.rows} == {"8.9"}


def test_all_public_latencies_are_finite_microseconds():
    result = ingest_paths(FILES)
    assert not result.skipped
    lat = pd.to_numeric(result.rows["latency_us"], errors="coerce").dropna()
    assert len(lat) > 300 and lat.map(math.isfinite).all() and (lat > 0).all() and (lat < 1e6).all()
