"""Malformed input: bad records go to quarantine with a reason; unknown files stop with one line.

Each fixture under tests/fixtures is hand-made to hold specific defects; the counts below are
what those defects must produce, and every record is accounted for.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernaudit_pipeline.ingest import IngestError, SourceFormat, detect_format, ingest_paths, parse_path, validate

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _reasons(parsed) -> list[str]:
    return [q["reason"] for q in parsed.quarantine]


def test_ncu_raw_garbled_rows_are_quarantined_with_reasons():
    fmt, parsed = parse_path(FIXTURES / "ncu_raw_garbled.csv")
    assert fmt is SourceFormat.NCU_RAW
    assert parsed.records_in == 4 and len(parsed.rows) == 1 and len(parsed.quarantine) == 3
    reasons = _reasons(parsed)
    assert any("garbled row: 8 fields, header has 18" in r for r in reasons)
    assert any("missing Kernel Name" in r for r in reasons)
    assert any("launch__registers_per_thread" in r and "lots" in r for r in reasons)
    row = parsed.rows[0]
    assert row["latency_us"] == pytest.approx(25.89)
    assert row["shared_mem_dynamic_bytes"] == 147_456  # "147.456000" Kbyte/block
    assert row["kernel_name"] == "gemm_bf16" and row["profiler_kernel_name"] == "gemm_kernel"
    assert [q["source_row"] for q in parsed.quarantine] == [1, 2, 3]


def test_ncu_details_truncated_line_and_unknown_unit():
    fmt, parsed = parse_path(FIXTURES / "ncu_details_garbled.csv")
    assert fmt is SourceFormat.NCU_DETAILS
    # launches 0 and 1, plus one line that names no launch's metric
    assert parsed.records_in == 3 and len(parsed.rows) == 1 and len(parsed.quarantine) == 2
    assert any("garbled line" in r for r in _reasons(parsed))
    assert any("Duration" in r and "furlong" in r for r in _reasons(parsed))
    row = parsed.rows[0]
    assert row["registers_per_thread"] == 255 and row["latency_us"] == pytest.approx(162.08)
    assert row["stall_lg_throttle_pct"] == pytest.approx(40.5)  # from the CPIStall rule
    assert "stall_long_scoreboard_pct" not in row  # not flagged by ncu: unknown, never 0
    assert len(parsed.rules) == 1 and parsed.rules[0]["estimated_speedup_pct"] == pytest.approx(33.02)


def test_torch_trace_bad_kernel_events():
    fmt, parsed = parse_path(FIXTURES / "trace_bad_events.json")
    assert fmt is SourceFormat.TORCH_TRACE
    kernel_events_in_rows = sum(r["latency_samples"] for r in parsed.rows)
    assert kernel_events_in_rows == 1 and len(parsed.quarantine) == 3 and parsed.other_records == 1
    assert parsed.records_in == kernel_events_in_rows + len(parsed.quarantine) + parsed.other_records
    reasons = " | ".join(_reasons(parsed))
    assert "dur" in reasons and "grid" in reasons


def test_proton_leaf_without_calls():
    fmt, parsed = parse_path(FIXTURES / "proton_bad_leaf.hatchet")
    assert fmt is SourceFormat.PROTON
    assert len(parsed.rows) == 1 and len(parsed.quarantine) == 1 and parsed.other_records == 1
    assert parsed.rows[0]["latency_us"] == pytest.approx(25.0)  # 100,000 ns over 4 calls
    assert parsed.rows[0]["compute_capability"] == "9.0"
    assert "empty_kernel" in parsed.quarantine[0]["reason"]


def test_ptxas_truncated_entry():
    fmt, parsed = parse_path(FIXTURES / "ptxas_truncated.log")
    assert fmt is SourceFormat.PTXAS_LOG
    assert len(parsed.rows) == 1 and len(parsed.quarantine) == 1
    row = parsed.rows[0]
    assert (row["registers_per_thread"], row["spill_stores_bytes"], row["spill_loads_bytes"],
            row["stack_frame_bytes"]) == (255, 1972, 1460, 784)
    assert "other_kernel" in parsed.quarantine[0]["reason"]


def test_runner_jsonl_bad_lines_and_non_row_records():
    fmt, parsed = parse_path(FIXTURES / "runner_bad.jsonl")
    assert fmt is SourceFormat.RUNNER_JSONL
    assert parsed.records_in == 6
    assert len(parsed.rows) == 1 and len(parsed.quarantine) == 3 and parsed.other_records == 2
    assert len(parsed.peaks) == 1 and parsed.peaks[0]["peak_tflops"] == 701.0
    reasons = " | ".join(_reasons(parsed))
    assert "line 2: not JSON" in reasons and "record_type" in reasons and "not a JSON object" in reasons


def test_seed_items_bad_item_and_schema_quarantine():
    result = ingest_paths([FIXTURES / "seed_bad.json"])
    assert len(result.rows) == 2 and len(result.quarantine) == 1
    checked = validate(result)
    # the item with latency_us = -1 fails the kernel_runs schema: quarantined, not dropped
    assert len(checked.kernel_runs) == 1 and len(checked.quarantine) == 2
    assert checked.quarantine["reason"].str.contains("latency_us").any()


@pytest.mark.parametrize("name, fragment", [
    ("trace_truncated.json", "malformed or truncated JSON (EOF while parsing"),
    ("unknown_format.txt", "unrecognized format"),
])
def test_unknown_or_truncated_files_raise_one_line(name, fragment):
    with pytest.raises(IngestError) as info:
        parse_path(FIXTURES / name)
    message = str(info.value)
    assert "\n" not in message and fragment in message and name in message
    # ... and in a run of several files, the file is listed as skipped: the others are read
    result = ingest_paths([FIXTURES / name, FIXTURES / "ptxas_truncated.log"])
    assert [(s.path.rsplit("/", 1)[-1], fragment in s.reason) for s in result.skipped] == [(name, True)]
    assert len(result.rows) == 1 and len(result.summaries) == 1


def test_binary_and_empty_files(tmp_path):
    (tmp_path / "x.bin").write_bytes(b"\x7fELF\x00\x01\x02")
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(IngestError, match="binary"):
        detect_format(tmp_path / "x.bin")
    with pytest.raises(IngestError, match="empty"):
        detect_format(tmp_path / "empty.csv")


def test_json_that_is_no_known_trace(tmp_path):
    (tmp_path / "cfg.json").write_text(json.dumps({"BLOCK_M": 128}))
    with pytest.raises(IngestError, match="no known trace"):
        detect_format(tmp_path / "cfg.json")


def test_missing_path_is_skipped_with_its_reason():
    result = ingest_paths([Path("does/not/exist.csv"), FIXTURES / "ptxas_truncated.log"])
    assert [(s.path, s.reason) for s in result.skipped] == [("does/not/exist.csv", "no such file or directory")]
    assert len(result.rows) == 1
