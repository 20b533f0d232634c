"""The committed H200 captures (samples/h200): every record accounted for, base units,
occupancy limiters equal to ncu's on every launch, and spills diagnosed only where they run.

Counts are taken independently of the parsers (csv/json over the files) and cross-checked
between formats: the same Triton config must show the same registers and shared-memory bytes
in ncu (``Kbyte/block``), the torch trace (bytes) and the runner (bytes), and comparable
durations in microseconds in ncu, torch.profiler and Proton.
``KERNAUDIT_H200_SAMPLES`` points the tests at another capture directory.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections import defaultdict
from pathlib import Path

import pandas as pd
import pytest

from kernaudit_pipeline.core.hardware import resources_for
from kernaudit_pipeline.ingest import SourceFormat, UnknownFormat, expand, ingest_paths, parse_path, validate
from kernaudit_pipeline.ingest._common import identify
from kernaudit_pipeline.spill_diagnostics.occupancy import LIMITER_ORDER, limiters_from_ncu, theoretical_occupancy
from kernaudit_pipeline.settings import H200_SAMPLES_DIR
from kernaudit_pipeline.spill_diagnostics import diagnose

SAMPLES = Path(os.environ.get("KERNAUDIT_H200_SAMPLES", H200_SAMPLES_DIR))
REFERENCES_TRACE = "references_trace"  # gpu_collect.sh's profile of the references
NEEDED = (SourceFormat.NCU_RAW, SourceFormat.NCU_DETAILS, SourceFormat.TORCH_TRACE, SourceFormat.PROTON,
          SourceFormat.RUNNER_JSONL, SourceFormat.PTXAS_LOG, SourceFormat.TRITON_CACHE)


@pytest.fixture(scope="module")
def parsed() -> dict[Path, tuple[SourceFormat, object]]:
    assert SAMPLES.is_dir(), f"no committed H200 samples at {SAMPLES}"
    out = {}
    for path in expand([SAMPLES]):
        if path.name.startswith(REFERENCES_TRACE):
            continue  # another capture (what each reference ran), not the capture_targets.json one
        try:
            out[path] = parse_path(path)
        except UnknownFormat:
            continue  # logs and manifests beside the traces
    missing = [f for f in NEEDED if not any(fmt is f for fmt, _ in out.values())]
    assert not missing, f"samples lack {missing}"
    return out


def _records(p) -> list[dict]:
    """A parse's rows as dicts, whether parsed one by one or in bulk (a runner JSONL)."""
    bulk = [] if p.frame is None else [{k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()}
                                       for r in p.frame.to_dict("records")]
    return p.rows + bulk


def _of(parsed, fmt):
    return [(p, r) for p, (f, r) in parsed.items() if f is fmt]


# --------------------------------------------------------------------------------------------
# every record accounted for
# --------------------------------------------------------------------------------------------
def _csv_table(path: Path) -> tuple[list[str], list[list[str]]]:
    rows = list(csv.reader(io.StringIO(path.read_text())))
    h = next(i for i, r in enumerate(rows) if r and r[0] == "ID" and "Kernel Name" in r)
    return rows[h], [r for r in rows[h + 1:] if any(c.strip() for c in r)]


def test_ncu_raw_every_launch_is_a_row(parsed):
    for path, p in _of(parsed, SourceFormat.NCU_RAW):
        header, body = _csv_table(path)
        launches = [r for r in body if r[0].strip()]  # the units row has an empty ID
        assert len(launches) == p.records_in == len(p.rows) + len(p.quarantine)
        assert not p.quarantine, p.quarantine[:1]
        assert sorted(r["ncu_launch_id"] for r in _records(p)) == sorted(int(r[0]) for r in launches)


def test_ncu_details_every_launch_is_a_row_and_rules_are_kept(parsed):
    for path, p in _of(parsed, SourceFormat.NCU_DETAILS):
        header, body = _csv_table(path)
        ids = {int(r[0]) for r in body}
        assert len(ids) == p.records_in == len(p.rows) + len(p.quarantine) and not p.quarantine
        rule_lines = [r for r in body if len(r) > header.index("Rule Name") and r[header.index("Rule Name")]]
        assert len(p.rules) == len(rule_lines) > 0
        assert all(r["description"] and r["source_file"] for r in p.rules)


def test_torch_trace_every_kernel_event_is_counted(parsed):
    for path, p in _of(parsed, SourceFormat.TORCH_TRACE):
        events = json.loads(path.read_text())["traceEvents"]
        kernels = [e for e in events if str(e.get("cat", "")).lower() == "kernel"]
        assert sum(r["latency_samples"] for r in _records(p)) + len(p.quarantine) == len(kernels) > 0
        assert p.other_records == len(events) - len(kernels)
        assert not p.quarantine


def test_proton_every_leaf_is_a_row(parsed):
    def leaves(node):
        kids = node.get("children") or []
        return [node] if not kids else [leaf for k in kids for leaf in leaves(k)]

    for path, p in _of(parsed, SourceFormat.PROTON):
        data = json.loads(path.read_text())
        root = data[0] if isinstance(data, list) else data
        assert len(leaves(root)) == len(p.rows) + len(p.quarantine) > 0
        for row in p.rows:
            assert row["latency_us"] == pytest.approx(row["proton_total_time_ns"] / row["latency_samples"] / 1e3)


def test_runner_jsonl_every_line_is_accounted_for(parsed):
    for path, p in _of(parsed, SourceFormat.RUNNER_JSONL):
        kinds = [json.loads(line)["record_type"] for line in path.read_text().splitlines() if line.strip()]
        assert p.records_in == len(kinds) and not p.quarantine
        assert p.row_count == sum(k in ("run", "baseline") for k in kinds)
        assert p.other_records == sum(k in ("peak", "summary") for k in kinds)
        assert len(p.peaks) == kinds.count("peak")


def test_all_files_validate_into_kernel_runs():
    result = ingest_paths([SAMPLES])
    for s in result.summaries:
        assert s.quarantined == 0 and s.rows > 0, s
    assert {s.source_format for s in result.summaries} == {f.value for f in NEEDED}
    checked = validate(result)
    assert len(checked.kernel_runs) + len(checked.quarantine) == len(result.rows) + len(result.quarantine)
    assert checked.quarantine.empty, checked.quarantine["reason"].tolist()[:3]
    assert not checked.kernel_runs["source_file"].astype(str).str.startswith("/").any()


# --------------------------------------------------------------------------------------------
# base units, cross-checked between formats
# --------------------------------------------------------------------------------------------
def _is_triton(row: dict) -> bool:
    """A launch of a kernels/ module's own Triton kernel (not a baseline or helper kernel in its capture)."""
    return identify(str(row.get("profiler_kernel_name") or row["kernel_name"])) is not None


def _triton_rows(parsed, fmt) -> list[dict]:
    return [r for _, p in _of(parsed, fmt) for r in _records(p) if _is_triton(r)]


def _key(r: dict) -> tuple:
    return (r["kernel_name"], r.get("registers_per_thread"), r.get("threads_per_block"), r.get("grid_size"))


def test_ncu_shared_memory_in_bytes_matches_the_torch_trace(parsed):
    ncu = _triton_rows(parsed, SourceFormat.NCU_RAW)
    trace = {_key(r): r for r in _triton_rows(parsed, SourceFormat.TORCH_TRACE)}
    matched = [(r, trace[_key(r)]) for r in ncu if _key(r) in trace]
    assert matched, "no Triton launch appears in both ncu and the torch trace"
    for n, t in matched:
        # ncu printed Kbyte/block (SI); the trace prints bytes: equal only if Kbyte = 1,000 B
        assert n["shared_mem_bytes"] == t["shared_mem_bytes"]
        assert n["shared_mem_bytes"] % 128 == 0 or n["shared_mem_bytes"] == 0


def _by_config(parsed, fmt) -> dict[tuple, dict]:
    return {(r["kernel_name"], r.get("shape_name"), r["config_id"]): r for _, p in _of(parsed, fmt) for r in _records(p)
            if r.get("config_id") and not str(r["config_id"]).startswith("baseline")}


def test_ncu_launches_are_named_by_the_capture_ranges(parsed):
    targets = json.loads((SAMPLES / "capture_targets.json").read_text())
    wanted = {(t["kernel_name"], t["shape_name"], t["config_id"]) for t in targets if t["config_id"] != "baseline"}
    for fmt in (SourceFormat.NCU_RAW, SourceFormat.NCU_DETAILS, SourceFormat.TORCH_TRACE, SourceFormat.PROTON):
        named = _by_config(parsed, fmt)
        assert set(named) == wanted, fmt
        for row in named.values():
            if row.get("threads_per_block"):
                assert row["threads_per_block"] == 32 * row["num_warps"]


def test_ncu_agrees_with_the_runner_and_ptxas_in_base_units(parsed):
    ncu = _by_config(parsed, SourceFormat.NCU_RAW)
    runner = _by_config(parsed, SourceFormat.RUNNER_JSONL)
    ptxas = _by_config(parsed, SourceFormat.PTXAS_LOG)
    for key, n in ncu.items():
        r = runner[key]  # the runner read n_regs and metadata.shared from the same compile
        assert (n["registers_per_thread"], n["shared_mem_bytes"]) == (r["registers_per_thread"], r["shared_mem_bytes"])
        assert n["registers_per_thread"] == ptxas[key]["registers_per_thread"]
        spills = ptxas[key]["spill_stores_bytes"] > 0
        assert spills == (n["local_spill_requests"] > 0), key  # static and dynamic spill evidence agree
    cache = [r for _, p in _of(parsed, SourceFormat.TRITON_CACHE) for r in _records(p)]
    for row in cache:  # the cubins in the cache are the GEMM's ANCHORS pair
        twin = ptxas[("gemm_bf16", "llama3_8b_qkv_prefill", f"BK64_BM128_BN256_GM8_s3_w{row['num_warps']}")]
        for column in ("registers_per_thread", "spill_stores_bytes", "spill_loads_bytes", "stack_frame_bytes"):
            assert row[column] == twin[column], column


def test_latencies_are_microseconds_in_every_format(parsed):
    ncu = defaultdict(list)
    for r in _triton_rows(parsed, SourceFormat.NCU_RAW):
        ncu[_key(r)].append(r["latency_us"])
    compared = 0
    for t in _triton_rows(parsed, SourceFormat.TORCH_TRACE):
        if _key(t) in ncu:
            ratio = t["latency_us"] / (sum(ncu[_key(t)]) / len(ncu[_key(t)]))
            assert 0.5 < ratio < 2.0, (t["kernel_name"], ratio)  # a unit slip would be 1000x
            compared += 1
    assert compared
    trace = _by_config(parsed, SourceFormat.TORCH_TRACE)
    proton = _by_config(parsed, SourceFormat.PROTON)
    ncu_named = _by_config(parsed, SourceFormat.NCU_RAW)
    assert set(proton) == set(trace) == set(ncu_named)
    for key, p in proton.items():
        assert 0.5 < p["latency_us"] / trace[key]["latency_us"] < 2.0, key
        assert 0.5 < p["latency_us"] / ncu_named[key]["latency_us"] < 2.0, key


# --------------------------------------------------------------------------------------------
# occupancy: our limits against ncu's on every launch
# --------------------------------------------------------------------------------------------
def _ncu_launch_rows(parsed) -> list[dict]:
    return [r for fmt in (SourceFormat.NCU_RAW, SourceFormat.NCU_DETAILS) for _, p in _of(parsed, fmt)
            for r in _records(p)]


def test_occupancy_limits_equal_ncu_on_every_launch(parsed):
    checked = 0
    for r in _ncu_launch_rows(parsed):
        ncu = {lim: r.get(f"ncu_occupancy_limit_{lim.value}") for lim in LIMITER_ORDER}
        if any(v is None for v in ncu.values()):
            continue
        sm = resources_for(r.get("device_name"), r.get("compute_capability"))
        assert sm is not None, r.get("compute_capability")
        occ = theoretical_occupancy(sm, registers_per_thread=r["registers_per_thread"],
                                    threads_per_block=r["threads_per_block"],
                                    shared_mem_bytes=r["shared_mem_bytes"],
                                    smem_config_bytes=r.get("ncu_shared_mem_config_bytes"))
        ours = (occ.limit_registers, occ.limit_shared_mem, occ.limit_warps, occ.limit_blocks)
        assert ours[0] == ncu[LIMITER_ORDER[0]] and ours[2:] == (ncu[LIMITER_ORDER[2]], ncu[LIMITER_ORDER[3]]), r
        if r.get("ncu_shared_mem_config_bytes") is not None:
            assert ours[1] == ncu[LIMITER_ORDER[1]], r
        assert occ.limiters == limiters_from_ncu({f"ncu_occupancy_limit_{k.value}": v for k, v in ncu.items()}), r
        if r.get("ncu_rule_occupancy_limiters"):
            assert ",".join(map(str, occ.limiters)) == r["ncu_rule_occupancy_limiters"]
        checked += 1
    assert checked > 0


# --------------------------------------------------------------------------------------------
# the spill chain: the spilling kernels, and only those
# --------------------------------------------------------------------------------------------
def test_spilling_kernels_and_only_those_are_diagnosed(parsed):
    for fmt in (SourceFormat.NCU_RAW, SourceFormat.NCU_DETAILS):
        rows = [r for _, p in _of(parsed, fmt) for r in _records(p)]
        out = diagnose(pd.DataFrame(rows))
        runs_spills = out["local_spill_requests"].fillna(0) > 0
        assert (out["spill_detected"] == runs_spills).all()
        flagged = out["spill_causes_stalls"]
        assert not (flagged & ~runs_spills).any(), "a kernel without spill evidence was flagged"
        triton = pd.Series([_is_triton(r) for r in rows], index=out.index)
        # every audited Triton config that spills at run time is diagnosed, with cited evidence
        assert (triton & runs_spills).sum() >= 4 and flagged[triton & runs_spills].all(), \
            out.loc[triton & runs_spills, ["kernel_name", "config_id", "diag_notes"]].to_dict("records")
        for ev in out.loc[flagged, "spill_evidence"]:
            cited = {e["metric"] for e in json.loads(ev) if e["met"]}
            assert "local_spill_requests" in cited and cited & {"stall_lg_throttle_pct", "stall_long_scoreboard_pct"}
        # a library kernel with a little local traffic and no stall to show for it is reported
        # as spilling but not as stalled by it
        for _, row in out[runs_spills & ~triton].iterrows():
            assert not row["spill_causes_stalls"]
            assert row["stall_lg_throttle_pct"] < 10 and row["stall_long_scoreboard_pct"] < 50
