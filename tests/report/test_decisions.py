"""Decisions first, evidence inline, counts that add up: the report built from real library stages on the
committed traces, with Decision records (core.verdicts) as the recommendations stage hands them over."""

import dataclasses
import io
import json
import re

import pandas as pd
import pytest

from kernaudit_pipeline.audit_report import decisions as decision_text
from kernaudit_pipeline.audit_report import write_report
from kernaudit_pipeline.audit_report.evidence import clean_twins, spill_rows
from kernaudit_pipeline.audit_report.terminal import plain_table, print_decisions
from tests.report.inputs import constructed_decisions, library_inputs


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    base = library_inputs(tmp_path_factory.mktemp("data"))
    return dataclasses.replace(base, decisions=constructed_decisions(base.diagnostics))


@pytest.fixture(scope="module")
def report(inputs, tmp_path_factory):
    return write_report(inputs, tmp_path_factory.mktemp("report"))


def test_report_json_has_every_decision_with_its_data_kind(inputs, report):
    payload = json.loads(report.json.read_text())
    assert payload["decisions"] == [d.to_json() for d in inputs.decisions]
    assert all(d["data_kind"] in ("measured", "modelled", "predicted") for d in payload["decisions"])
    keys = {(d["kernel_name"], d["shape_name"], d["device_name"]) for d in payload["decisions"]}
    assert keys == {tuple(g) for g in payload["groups"]}  # one per (kernel, shape, device)
    assert sum(payload["decision_counts"].values()) == len(payload["decisions"])
    assert "decision_views" not in payload  # display fields stay out of the data


def test_decisions_come_before_every_chart_and_carry_ci_baseline_and_evidence(inputs, report):
    html = report.html.read_text()
    first_chart = html.index('<section class="chart"')
    assert html.index('<section id="decisions">') < first_chart
    section = html[html.index('<section id="decisions">'):html.index("</section>", html.index('<section id="decisions">'))]
    ship = next(d for d in inputs.decisions if str(d.decision) == "SHIP_CONFIG" and d.speedup_ci_low is not None)
    assert f"{ship.speedup:.3f}×" in section and f"[{ship.speedup_ci_low:.3f}, {ship.speedup_ci_high:.3f}]" in section
    assert "cuBLAS via torch.<wbr>matmul" in section  # line-break chances after dots and underscores
    assert "Inductor (Triton) via torch.compile: 0.970× [0.950, 0.990]" in section  # another reference
    assert section.count('<tr data-kernel=') == len(inputs.decisions)
    assert "modelled" in section and "measured" in section
    assert "regs/thread" in section  # the one line of evidence


def test_baseline_names_say_what_ran():
    assert decision_text.baseline_label("torch.matmul", "cuBLAS") == "cuBLAS via torch.matmul"
    assert decision_text.baseline_label("torch.nn.functional.scaled_dot_product_attention",
                                        "FlashAttention-2") == "FlashAttention-2 via SDPA"
    assert decision_text.baseline_label("torch._scaled_mm", None) == "torch._scaled_mm (backend not recorded)"
    assert decision_text.speedup_text(1.23456, 1.2, 1.3) == "1.235× [1.200, 1.300]"
    assert decision_text.speedup_text(1.1) == "1.100× (no CI)"


def test_header_counts_add_up(inputs, report):
    payload = json.loads(report.json.read_text())
    counts = payload["counts"]
    assert sum(payload["status_counts"].values()) == counts["candidates"] == len(inputs.diagnostics)
    assert counts["candidates"] + counts["baseline_rows"] + counts["profiler_rows"] == counts["runs"]
    assert counts["runs"] == len(inputs.kernel_runs)
    html = report.html.read_text()
    assert f"= {counts['candidates']} candidate runs" in html


def test_every_spilling_config_is_listed_and_paged_honestly(inputs, report):
    diag = inputs.diagnostics
    spilling = int(diag["spill_detected"].sum())
    payload = json.loads(report.json.read_text())
    assert len(payload["spills"]) == spilling == payload["counts"]["spilling"]
    html = report.html.read_text()
    table = html[html.index('id="spills-table"'):html.index("</table>", html.index('id="spills-table"'))]
    assert table.count("<tr data-kernel=") == spilling  # every row is in the page; the script pages them
    assert 'data-page-size="50"' in table
    assert len(pd.read_csv(report.csvs["spills"])) == spilling
    md = report.markdown.read_text()
    if spilling > 100:
        assert f"Showing 100 of {spilling} spilling configs" in md


def test_the_spill_chain_pairs_each_profiled_spill_with_the_same_tile_without_spills(inputs):
    rows = spill_rows(inputs.diagnostics)
    profiled = rows[rows["profiled"]]
    assert len(profiled) and profiled.index.max() < (~rows["profiled"]).idxmax()  # profiled first
    gemm = rows[rows["config_id"] == "BK64_BM128_BN256_GM8_s3_w4"]
    if len(gemm):  # the H200 capture's 128x256 tile: 4 warps spill, 8 do not
        row = gemm.iloc[0]
        assert row["twin_config_id"] == "BK64_BM128_BN256_GM8_s3_w8"
        assert row["stall_lg_throttle_pct"] > 10 > row["twin_lg_throttle_pct"]
        assert "B/thread spilled →" in row["chain"] and "local-memory traffic" in row["chain"]
        assert "same tile without spills (BK64_BM128_BN256_GM8_s3_w8" in row["chain"]
    twins = clean_twins(inputs.diagnostics)
    diag = inputs.diagnostics
    for index, twin in twins.items():
        mine = re.sub(r"_s\d+_w\d+$", "", str(diag.loc[index, "config_id"]))
        assert re.sub(r"_s\d+_w\d+$", "", twin.config_id) == mine  # the same tile, other warps/stages


def test_statuses_keep_their_real_names(report):
    payload = json.loads(report.json.read_text())
    html = report.html.read_text()
    for status in payload["status_counts"]:
        assert f'<div class="card {status}"><b>' in html
    pruned = [r for r in payload["spills"] if r.get("run_status") == "PRUNED_SPILL"]
    if pruned:
        assert "PRUNED_SPILL" in html


def test_the_terminal_names_every_decision(inputs, report):
    payload = json.loads(report.json.read_text())
    out = io.StringIO()
    assert print_decisions(payload, out, use_rich=False) == len(inputs.decisions)
    text = out.getvalue()
    lines = text.splitlines()
    assert lines[0].startswith(f"Decisions ({len(inputs.decisions)}: ")
    assert len(lines) == 3 + len(inputs.decisions)  # title, header, rule, one line per decision
    for d in inputs.decisions:
        assert any(d.kernel_name in line and str(d.shape_name) in line and str(d.decision) in line for line in lines)
    assert "cuBLAS via torch.matmul" in text
    rich_out = io.StringIO()
    print_decisions(payload, rich_out, use_rich=True)
    assert "SHIP_CONFIG" in rich_out.getvalue() and "Decisions" in rich_out.getvalue()


def test_the_stage_decisions_reach_the_report(tmp_path):
    """The recommendations stage's own Decision records, not constructed ones."""
    real = library_inputs(tmp_path / "data")
    assert real.decisions  # stage.run decides every group
    files = write_report(real, tmp_path / "report")
    payload = json.loads(files.json.read_text())
    assert payload["decisions"] == [d.to_json() for d in real.decisions]
    assert {tuple(g) for g in payload["groups"]} == {(d.kernel_name, d.shape_name, d.device_name)
                                                     for d in real.decisions}
    assert {d["data_kind"] for d in payload["decisions"]} >= {"measured", "modelled"}
    if real.heuristics:
        assert 'id="heuristics-table"' in files.html.read_text()


def test_without_decisions_the_terminal_still_names_every_group(tmp_path):
    base = dataclasses.replace(library_inputs(tmp_path / "data"), decisions=())
    files = write_report(base, tmp_path / "report")
    payload = json.loads(files.json.read_text())
    out = io.StringIO()
    assert print_decisions(payload, out, use_rich=False) == len(payload["groups"])
    assert "No decision was handed over" in out.getvalue()
    assert 'id="no-decisions"' in files.html.read_text()


def test_plain_table_pads_and_never_truncates():
    text = plain_table(("a", "bb"), [("long value", "x"), ("y", "z")])
    assert text.splitlines() == ["a           bb", "----------  --", "long value  x", "y           z"]
