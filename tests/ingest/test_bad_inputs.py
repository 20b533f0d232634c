"""Hostile and broken inputs, made here: no traceback, no hang, no row lost without a reason.

Every case either quarantines the bad record (with a reason that names it) while the rest
of the file is kept, or lists the file as skipped (with a one-line reason) while the other
files are ingested; records in = kept + quarantined + non-row, and a skipped file is listed.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from kernaudit_pipeline.ingest import ingest_paths, parse_path, validate
from kernaudit_pipeline.ingest import runner_jsonl
from kernaudit_pipeline.kernel_runs import MAX_LATENCY_US, normalize

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
GOOD = FIXTURES / "ptxas_truncated.log"  # one row, one quarantined entry


def _run(**fields) -> dict:
    return {"record_type": "run", "kernel_name": "gemm_bf16", "kernel_module": "gemm", "config_id": "BM64_w4",
            "shape_name": "s", "latency_us": 10.0, "baseline_us": 12.0, **fields}


def _jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def _accounted(parsed) -> bool:
    return parsed.accounted


def _reasons(result) -> str:
    checked = validate(result)
    return " | ".join(checked.quarantine["reason"].astype(str))


# ---------------------------------------------------------------------------------------------
# numbers: too large, not finite, booleans, outside physical bounds
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("raw, fragment", [
    ("1" + "0" * 400, "integer with 401 digits is out of range"),  # 10^400
    ("1e400", "is not a finite number"),
    ("true", "boolean True is not a number"),
    ('{"a": 1}', "a dict is not a number"),
    ("1e-7", "latency_us: failed greater_than_or_equal_to"),  # 0.1 ps: below 1 ns
    (str(MAX_LATENCY_US * 10), "latency_us: failed less_than_or_equal_to"),  # ten hours
])
def test_runner_jsonl_bad_numbers_are_quarantined_and_the_rest_kept(tmp_path, raw, fragment):
    good = json.dumps(_run())
    path = _jsonl(tmp_path / "runs.jsonl", [good, good.replace('"latency_us": 10.0', f'"latency_us": {raw}'), good])
    result = ingest_paths([path])
    checked = validate(result)
    assert len(checked.kernel_runs) == 2 and len(checked.quarantine) == 1
    assert fragment in checked.quarantine["reason"].iloc[0]
    assert checked.quarantine["source_row"].iloc[0] == 1


@pytest.mark.parametrize("value, fragment", [
    (True, "boolean True is not a number"), (float("inf"), "not a finite number"), (10**400, "out of range"),
])
def test_schema_refuses_what_coercion_would_accept(value, fragment):
    rows = [{"kernel_name": "k", "latency_us": value, "source_format": "seed_json", "source_file": "f",
             "source_row": 0}, {"kernel_name": "k", "latency_us": 5.0, "source_format": "seed_json",
                                "source_file": "f", "source_row": 1}]
    out = normalize(rows)
    assert len(out.kernel_runs) == 1 and fragment in out.quarantine["reason"].iloc[0]
    assert out.quarantine["raw_json"].str.len().iloc[0] <= 4100  # bounded, even for 10^400


def test_seed_json_with_a_400_digit_integer(tmp_path):
    path = tmp_path / "seed.json"
    path.write_text('[{"input": {"kernel_name": "k", "latency_us": 1' + "0" * 400 + ', "baseline_us": 3}},'
                    ' {"input": {"kernel_name": "k", "latency_us": 2, "baseline_us": 3}}]')
    result = ingest_paths([path])
    checked = validate(result)
    assert len(checked.kernel_runs) == 1 and "out of range" in checked.quarantine["reason"].iloc[0]


def test_ncu_duration_that_overflows_its_unit_is_quarantined(tmp_path):
    header = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
              '"Grid Size","Device","CC","gpu__time_duration.sum"\n"","","","","","","","","","","","msecond"\n')
    rows = ['"0","1","p","h","k","1","7","(128, 1, 1)","(1, 1, 1)","0","9.0","1e308"',
            '"1","1","p","h","k","1","7","(128, 1, 1)","(1, 1, 1)","0","9.0","0.004"']
    path = tmp_path / "ncu.csv"
    path.write_text(header + "\n".join(rows) + "\n")
    _, parsed = parse_path(path)
    assert len(parsed.rows) == 1 and parsed.rows[0]["latency_us"] == pytest.approx(4.0)
    (q,) = parsed.quarantine
    assert "not a finite number" in q["reason"] and q["reason"].startswith("line 3:")  # header + units + 1


def test_duplicated_ncu_column_is_never_silently_preferred(tmp_path):
    header = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
              '"Grid Size","Device","CC","gpu__time_duration.sum","gpu__time_duration.sum"\n'
              '"","","","","","","","","","","","usecond","usecond"\n')
    rows = ['"0","1","p","h","k","1","7","(128, 1, 1)","(1, 1, 1)","0","9.0","5.0","5.0"',
            '"1","1","p","h","k","1","7","(128, 1, 1)","(1, 1, 1)","0","9.0","5.0","900.0"']
    path = tmp_path / "dup.csv"
    path.write_text(header + "\n".join(rows) + "\n")
    _, parsed = parse_path(path)
    assert [r["ncu_launch_id"] for r in parsed.rows] == [0]  # equal copies: fine
    (q,) = parsed.quarantine
    assert "appears 2 times with different values" in q["reason"] and "line 4" in q["reason"]


def test_quarantine_line_numbers_are_the_files_lines(tmp_path):
    text = (FIXTURES / "ncu_details_garbled.csv").read_text()
    path = tmp_path / "d.csv"
    path.write_text("==PROF== Connected to process 1\nprogram output\n" + text)  # two lines before the header
    _, parsed = parse_path(path)
    lines = path.read_text().splitlines()
    for q in parsed.quarantine:
        if q["reason"].startswith("line "):
            n = int(q["reason"].split()[1].rstrip(":"))
            assert lines[n - 1].startswith('"')  # the quoted CSV line named, not one off by the header


# ---------------------------------------------------------------------------------------------
# nesting, encodings, compression
# ---------------------------------------------------------------------------------------------
def test_deeply_nested_json_files_are_skipped_with_a_reason(tmp_path):
    deep = "[" * 3000 + "]" * 3000
    (tmp_path / "trace.json").write_text('{"traceEvents": ' + deep + "}")
    (tmp_path / "proton.hatchet").write_text('[{"frame": {"name": "ROOT"}, "metrics": {}, "children": ' + deep + "}]")
    (tmp_path / "seed.json").write_text('[{"input": ' + deep + "}]")
    result = ingest_paths([tmp_path / "trace.json", tmp_path / "proton.hatchet", tmp_path / "seed.json", GOOD])
    assert len(result.skipped) == 3 and all("nested too deeply" in s.reason for s in result.skipped)
    assert len(result.rows) == 1


def test_a_deep_line_in_runner_jsonl_is_one_quarantined_record(tmp_path):
    deep = '{"record_type": "run", "x": ' + "[" * 3000 + "]" * 3000 + "}"
    path = _jsonl(tmp_path / "r.jsonl", [json.dumps(_run()), deep, json.dumps(_run()), "not json"])
    result = ingest_paths([path])
    checked = validate(result)
    (summary,) = result.summaries
    assert summary.records_in == 4 and len(checked.kernel_runs) == 2 and len(checked.quarantine) == 2
    exact = list(runner_jsonl.parse_chunks(path, "r.jsonl", bulk=False))  # read line by line
    assert "line 2: nested too deeply" in exact[0].quarantine[0]["reason"]


@pytest.mark.parametrize("content, fragment", [
    (b"\x7fELF\x02\x01\x01\x00\x00\x00", "binary file"),
    ('"ID","Kernel Name"\n"0","caf\xe9"\n'.encode("latin-1"), "not UTF-8 text"),
    (b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03garbage", "unreadable gzip stream"),
])
def test_binary_non_utf8_and_broken_gzip_files_are_skipped(tmp_path, content, fragment):
    bad = tmp_path / "bad.dat"
    bad.write_bytes(content)
    result = ingest_paths([bad, GOOD])
    assert [fragment in s.reason for s in result.skipped] == [True] and len(result.rows) == 1


def test_gzipped_runner_jsonl_and_seed_json(tmp_path):
    with gzip.open(tmp_path / "r.jsonl.gz", "wt") as fh:
        fh.write(json.dumps(_run()) + "\n")
    with gzip.open(tmp_path / "s.json.gz", "wt") as fh:
        json.dump([{"input": {"kernel_name": "k", "latency_us": 2, "baseline_us": 3}}], fh)
    result = ingest_paths([tmp_path / "r.jsonl.gz", tmp_path / "s.json.gz"])
    assert not result.skipped and len(result.rows) == 2


def test_a_gzip_bomb_is_refused(tmp_path, monkeypatch):
    from kernaudit_pipeline.ingest import sources
    monkeypatch.setattr(sources, "MAX_WHOLE_FILE_BYTES", 1 << 20)
    with gzip.open(tmp_path / "bomb.json.gz", "wb") as fh:
        fh.write(b"[" + b" " * (4 << 20) + b"]")
    result = ingest_paths([tmp_path / "bomb.json.gz"])
    assert "once decompressed: refused" in result.skipped[0].reason


# ---------------------------------------------------------------------------------------------
# what is not a regular file
# ---------------------------------------------------------------------------------------------
def test_a_fifo_is_refused_at_once(tmp_path):
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)
    # in a child process, so that a regression (a blocking open) cannot hang the test run
    code = ("import sys; from pathlib import Path; from kernaudit_pipeline.ingest import ingest_paths; "
            f"r = ingest_paths([Path({str(fifo)!r}), Path({str(GOOD)!r})]); "
            "print(r.skipped[0].reason); print(len(r.rows))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2], env={**os.environ, "PYTHONPATH": "."})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["a FIFO, not a regular file: refused", "1"]


def test_symlink_loops_and_dangling_links(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    (tmp_path / "gone").symlink_to(tmp_path / "missing")
    result = ingest_paths([tmp_path / "a", tmp_path / "gone", GOOD])
    assert [s.reason for s in result.skipped] == ["a symlink loop", "a dangling symlink"]
    assert len(result.rows) == 1


def test_a_directory_that_links_back_to_itself_is_walked_once(tmp_path):
    d = tmp_path / "traces"
    d.mkdir()
    shutil.copy(GOOD, d / "a.log")
    (d / "again").symlink_to(d)
    result = ingest_paths([d])
    assert len(result.rows) == 1 and "already walked" in result.skipped[0].reason


# ---------------------------------------------------------------------------------------------
# records that used to vanish
# ---------------------------------------------------------------------------------------------
def test_a_ptxas_entry_with_an_empty_name_is_quarantined(tmp_path):
    log = tmp_path / "p.log"
    log.write_text("ptxas info    : Compiling entry function '' for 'sm_90a'\n"
                   "ptxas info    : Function properties for \n"
                   "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
                   "ptxas info    : Used 40 registers\n"
                   "ptxas info    : Compiling entry function 'k' for 'sm_90a'\n"
                   "ptxas info    : Used 32 registers\n")
    _, parsed = parse_path(log)
    assert [r["kernel_name"] for r in parsed.rows] == ["k"] and parsed.rows[0]["registers_per_thread"] == 32
    assert "empty name (log line 1)" in parsed.quarantine[0]["reason"] and parsed.accounted


def _cache(root: Path, name: str, meta: dict | None, meta_is_dir: bool = False) -> None:
    d = root / name
    d.mkdir(parents=True)
    (d / "k.cubin").write_bytes(b"\x7fELF")
    if meta_is_dir:
        (d / "k.json").mkdir()
    elif meta is not None:
        (d / "k.json").write_text(json.dumps(meta))


def test_triton_cache_entries_without_usable_metadata_are_quarantined(tmp_path):
    root = tmp_path / "cache"
    meta = {"name": "k", "num_warps": 4, "num_stages": 3, "shared": 0, "target": {"backend": "cuda", "arch": 90}}
    _cache(root, "aaa", meta)
    _cache(root, "bbb", None)  # the .json is missing
    _cache(root, "ccc", None, meta_is_dir=True)  # the .json is a directory
    _, parsed = parse_path(root)
    assert parsed.row_count == 1 and len(parsed.quarantine) == 2 and parsed.accounted
    reasons = sorted(q["reason"] for q in parsed.quarantine)
    assert reasons == ["k.cubin: its metadata k.json is missing", "k.cubin: its metadata k.json is not a regular file"]


def test_runner_jsonl_bulk_and_exact_reads_agree(tmp_path):
    lines = [json.dumps(_run(latency_us=10.0 + i)) for i in range(7)]
    lines.insert(5, json.dumps(_run(latency_us=True)))  # a boolean: DuckDB would read 1.0
    lines.insert(7, "")  # a blank line: not a record, but it moves the line numbers
    path = _jsonl(tmp_path / "r.jsonl", lines)
    bulk = list(runner_jsonl.parse_chunks(path, "r.jsonl", batch_rows=2))
    exact = list(runner_jsonl.parse_chunks(path, "r.jsonl", bulk=False))
    assert any(p.frame is not None for p in bulk)  # the clean start was read in bulk ...
    assert any(p.rows for p in bulk)  # ... the rest exactly, from the doubtful batch on
    for parts in (bulk, exact):
        frames = [runner_jsonl.Parsed(rows=p.rows, quarantine=[], records_in=0, frame=p.frame) for p in parts]
        rows = [r for p in frames for r in (p.rows + ([] if p.frame is None else p.frame.to_dict("records")))]
        checked = normalize(rows)
        assert sorted(checked.kernel_runs["latency_us"]) == [10.0 + i for i in range(7)]
        assert "boolean True" in checked.quarantine["reason"].iloc[0]
        assert checked.quarantine["source_row"].iloc[0] == 5
        assert sum(p.records_in for p in parts) == 8


def test_runner_jsonl_malformed_line_numbers_count_blank_lines(tmp_path):
    path = _jsonl(tmp_path / "r.jsonl", [json.dumps(_run()), "", "{oops", json.dumps(_run())])
    _, parsed = parse_path(path)
    assert parsed.row_count == 2 and parsed.quarantine[0]["reason"].startswith("line 3: not JSON")
    assert parsed.quarantine[0]["source_row"] == 1  # the second record


def test_record_accounting_over_a_mixed_run(tmp_path):
    path = _jsonl(tmp_path / "r.jsonl", [json.dumps(_run()), "[1, 2]", json.dumps({"record_type": "summary"})])
    result = ingest_paths([path, FIXTURES / "seed_bad.json", tmp_path / "missing.csv", GOOD])
    checked = validate(result)
    records_in = sum(s.records_in for s in result.summaries)
    non_row = sum(s.other_records for s in result.summaries)
    assert records_in == len(checked.kernel_runs) + len(checked.quarantine) + non_row
    assert [s.path.rsplit("/", 1)[-1] for s in result.skipped] == ["missing.csv"]


def test_empty_inputs_are_a_normal_case():
    out = normalize(pd.DataFrame())
    assert out.kernel_runs.empty and out.quarantine.empty
    result = ingest_paths([])
    assert result.rows.empty and not result.summaries
