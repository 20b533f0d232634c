"""kernaudit assess: the seed's starter examples exactly, and the rules beyond them."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kernaudit_pipeline import cli
from kernaudit_pipeline.assess import assess

ROOT = Path(__file__).resolve().parents[2]
SEED_DIR = ROOT.parent / "shared" / "seeds"


def _seed_examples() -> list[dict]:
    """The starter examples straight from the seed file when it is beside the
    checkout (as in CI), else the committed copy of the same JSON."""
    seeds = sorted(SEED_DIR.glob("000_*.txt"))
    if seeds:
        text = seeds[0].read_text()
        block = text.split("```json", 1)[1].split("```", 1)[0]
        return json.loads(block)
    return json.loads((ROOT / "examples" / "seed_starter.json").read_text())


def test_seed_examples_exactly():
    examples = _seed_examples()
    assert len(examples) == 2
    results = assess([e["input"] for e in examples], "seed")
    for example, result in zip(examples, results):
        for key, expected in example["expected_output"].items():
            assert result[key] == expected, (key, result)


def test_committed_copy_matches_seed():
    committed = json.loads((ROOT / "examples" / "seed_starter.json").read_text())
    assert committed == _seed_examples()


def test_console_script_prints_seed_values(tmp_path):
    examples = _seed_examples()
    path = tmp_path / "seed.json"
    path.write_text(json.dumps(examples))
    proc = subprocess.run([sys.executable, "-m", "kernaudit_pipeline.cli", "assess", str(path)],
                          capture_output=True, text=True, check=True)
    out = json.loads(proc.stdout)
    assert [{k: o[k] for k in e["expected_output"]} for o, e in zip(out, examples)] == \
        [e["expected_output"] for e in examples]


def base(**kw):
    item = {"kernel_name": "k", "block_m": 64, "block_n": 128, "registers_per_thread": 128,
            "spill_stores_bytes": 0, "latency_us": 10.0, "baseline_us": 10.0}
    item.update(kw)
    return item


def one(**kw) -> dict:
    return assess([base(**kw)], "t")[0]


def test_spill_and_slower_shrinks_larger_dim():
    r = one(spill_stores_bytes=512, latency_us=20.0)
    assert (r["status"], r["spill_detected"], r["speedup_ratio"]) == ("REGRESSION", True, 0.5)
    assert r["recommendation"] == "reduce_tile_size_to_64x64_to_relieve_register_pressure"
    assert r["new_config"]["block_n"] == 64


def test_spill_and_faster_is_improved_but_still_fixes_spill():
    r = one(spill_stores_bytes=256, latency_us=5.0)
    assert r["status"] == "IMPROVED" and r["spill_detected"] is True
    assert r["recommendation"] != "adopt_configuration_for_production_profile"
    assert r["recommendation"].endswith("_to_relieve_register_pressure")


def test_big_accumulator_prefers_more_warps():
    # ANCHORS: 128x256 spills at 4 warps (256 acc regs/thread) and not at 8.
    r = one(block_m=128, block_n=256, num_warps=4, spill_stores_bytes=808, latency_us=30.0)
    assert r["recommendation"] == "increase_num_warps_to_8_to_relieve_register_pressure"
    assert r["new_config"]["num_warps"] == 8


def test_clean_and_slower_keeps_baseline():
    r = one(latency_us=12.0)
    assert r["status"] == "REGRESSION" and r["spill_detected"] is False
    assert r["recommendation"] == "keep_baseline_and_retune_tile_configuration"


def test_equal_latency_is_neutral():
    r = one(latency_us=10.0, baseline_us=10.0)
    assert r["status"] == "NEUTRAL" and r["speedup_ratio"] == 1.0
    assert r["recommendation"] == "keep_baseline_gain_within_noise_band"


def test_inside_noise_band_is_neutral_outside_is_not():
    assert one(latency_us=9.9)["status"] == "NEUTRAL"  # 1.0101x
    assert one(latency_us=9.5)["status"] == "IMPROVED"  # 1.0526x


@pytest.mark.parametrize("fields", [
    {"baseline_us": None}, {"latency_us": -3.0}, {"latency_us": float("nan")},
    {"latency_us": 0}, {"baseline_us": "fast"},
])
def test_invalid_inputs_are_never_improved_or_regression(fields):
    item = base(**fields)
    if fields.get("baseline_us", 1) is None:
        del item["baseline_us"]
    r = assess([item], "t")[0]
    assert r["status"] not in ("IMPROVED", "REGRESSION", "NEUTRAL")
    assert r["speedup_ratio"] is None or fields.get("latency_us") != -3.0
    assert r["recommendation"] != "adopt_configuration_for_production_profile"


def test_schema_violation_is_reported_not_hidden():
    r = one(registers_per_thread=300, latency_us=5.0)
    assert r["validation_errors"] and "registers_per_thread" in r["validation_errors"][0]
    assert r["status"] == "INCONCLUSIVE"


def test_failed_correctness_is_failed_even_when_fast():
    r = one(latency_us=1.0, correct=False)
    assert r["status"] == "FAILED" and r["recommendation"] == "fix_correctness_before_tuning"


def test_bare_objects_and_wrapped_items_both_accepted(tmp_path, capsys):
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps([base(), {"input": base(latency_us=5.0)}]))
    assert cli.main(["assess", str(path), "--brief"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [o["status"] for o in out] == ["NEUTRAL", "IMPROVED"]


@pytest.mark.parametrize("content,needle", [
    ("[{\"input\": ", "malformed JSON"),
    ("{\"kernel_name\": \"k\"}", "expected a JSON array"),
    ("[1, 2]", "item 0 is int"),
    ("", "empty file"),
    ("[" * 3000 + "]" * 3000, "nested deeper"),
    ("[" * 100_000, "nested deeper"),
    ("[{\"a\": " * 3000 + "1" + "}" * 3000 + "]", "nested deeper"),
    (b"\x1f\x8b\x08\x00garbage", "gzip-compressed"),
    (bytes(range(256)) * 4, "not UTF-8"),
    ("[{\"kernel_name\": \"caf\xe9\"}]".encode("latin-1"), "not UTF-8"),
])
def test_bad_files_exit_nonzero_with_one_line(tmp_path, content, needle):
    path = tmp_path / "bad.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    proc = subprocess.run([sys.executable, "-m", "kernaudit_pipeline.cli", "assess", str(path)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in proc.stderr


def test_missing_file_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "kernaudit_pipeline.cli", "assess", str(tmp_path / "nope.json")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and re.search(r"cannot read", proc.stderr) and "Traceback" not in proc.stderr


def test_diagnostics_appear_where_the_item_has_the_fields():
    rich = one(kernel_name="gemm_bf16", block_m=128, block_n=256, num_warps=4, registers_per_thread=255,
               spill_stores_bytes=808, threads_per_block=128, shared_mem_bytes=147456, device_name="NVIDIA H200",
               local_spill_requests=39_542_784, stall_lg_throttle_pct=41.0, latency_us=2000.0, baseline_us=300.0)
    d = rich["diagnostics"]
    assert d["occupancy_limiter"] and d["blocks_per_sm"] == 1
    assert d["spill_causes_stalls"] is True
    assert {e["metric"] for e in d["spill_evidence"]} >= {"spill_stores_bytes", "stall_lg_throttle_pct"}
    bare = one()
    assert bare["diagnostics"].get("spill_causes_stalls") is False
    assert "occupancy_pct" not in bare["diagnostics"]  # no warps/threads/device: nothing invented


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/null", "."])
def test_non_regular_files_are_refused_at_once(path):
    proc = subprocess.run([sys.executable, "-m", "kernaudit_pipeline.cli", "assess", path],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "not a regular file" in proc.stderr and "Traceback" not in proc.stderr


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    import os

    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    proc = subprocess.run([sys.executable, "-m", "kernaudit_pipeline.cli", "assess", str(fifo)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "not a regular file" in proc.stderr


BIG = "9" * 400


@pytest.mark.parametrize(("raw", "reason"), [
    ('{"kernel_name": "k", "latency_us": %s, "baseline_us": 2}' % BIG, "too large"),
    ('{"kernel_name": "k", "block_m": %s, "latency_us": 1, "baseline_us": 2}' % BIG, "too large"),
    ('{"kernel_name": "k", "block_m": 7, "block_n": 3, "latency_us": 1, "baseline_us": 2}', "block_m=7"),
    ('{"kernel_name": "k", "block_m": -128, "latency_us": 1, "baseline_us": 2}', "block_m=-128"),
    ('{"kernel_name": "k", "block_n": 0, "latency_us": 1, "baseline_us": 2}', "block_n=0"),
    ('{"kernel_name": "k", "block_m": 64.5, "latency_us": 1, "baseline_us": 2}', "block_m=64.5"),
    ('{"kernel_name": "k", "num_warps": 3, "latency_us": 1, "baseline_us": 2}', "num_warps=3"),
    ('{"kernel_name": ["a"], "latency_us": 1, "baseline_us": 2}', "kernel_name"),
    ('{"kernel_name": null, "latency_us": 1, "baseline_us": 2}', "kernel_name"),
    ('{"kernel_name": "a\\nb", "latency_us": 1, "baseline_us": 2}', "single-line"),
    ('{"kernel_name": "%s", "latency_us": 1, "baseline_us": 2}' % ("k" * 100_000), "single-line"),
    ('{"kernel_name": "k", "latency_us": {"a": [1]}, "baseline_us": 2}', "nested"),
    ('{"kernel_name": "k", "latency_us": true, "baseline_us": 2}', "boolean"),
    ('7', "item is int"),
])
def test_one_bad_item_is_rejected_on_its_own_and_the_batch_goes_on(tmp_path, raw, reason):
    """Issue 13: one mistyped item must not crash the batch, and nothing is recommended from it."""
    path = tmp_path / "items.json"
    path.write_text("[" + raw + ", " + json.dumps(base(latency_us=5.0)) + "]")
    proc = subprocess.run([sys.executable, "-m", "kernaudit_pipeline.cli", "assess", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    bad, good = json.loads(proc.stdout)
    assert bad["status"] == "INCONCLUSIVE" and bad["recommendation"] == "reject_invalid_input"
    assert bad["new_config"] is None and reason in " ".join(bad["validation_errors"])
    assert good["status"] == "IMPROVED"


@pytest.mark.parametrize("latency", [1e-300, 1e-4, 4e9, 1e308])
def test_latency_outside_physical_bounds_is_never_a_verdict(latency):
    r = one(latency_us=latency)
    assert r["status"] == "INCONCLUSIVE"
    assert "physical bounds" in r["status_reason"] or "too large" in r["status_reason"]
    assert r["recommendation"] != "adopt_configuration_for_production_profile"


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "1e400"])
def test_non_finite_literals_are_invalid_measurements(tmp_path, literal):
    path = tmp_path / "x.json"
    path.write_text('[{"kernel_name": "k", "latency_us": %s, "baseline_us": 2}]' % literal)
    proc = subprocess.run([sys.executable, "-m", "kernaudit_pipeline.cli", "assess", str(path), "--brief"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and json.loads(proc.stdout)[0]["status"] == "INCONCLUSIVE"


def test_byte_order_marks_are_read(tmp_path):
    items = json.dumps([base(latency_us=5.0)])
    for i, raw in enumerate((b"\xef\xbb\xbf" + items.encode(), items.encode("utf-16"))):
        path = tmp_path / f"bom{i}.json"
        path.write_bytes(raw)
        assert [r["status"] for r in assess(__import__("kernaudit_pipeline.assess").assess.read_file(path), "t")] \
            == ["IMPROVED"]
