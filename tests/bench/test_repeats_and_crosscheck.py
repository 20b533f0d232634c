"""The repeat analysis (spread, coverage, calibration) on runner rows built with the real record
builders, and the do_bench cross-check's logic on the CPU test double."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kernaudit_pipeline.bench import paired, repeats
from kernaudit_pipeline.bench.crosscheck import compare, dobench_paired, pick_targets
from kernaudit_pipeline.bench.timing import FakeCpuBackend
from kernaudit_pipeline.kernel_spec import load_kernel_module

REPO = Path(__file__).resolve().parents[2]
FAULTS = Path(__file__).resolve().parent / "fault_kernels"


def _run_rows(run_offset: float, seed: int, configs=("c1", "c2", "c3", "c4")) -> list[dict]:
    """Rows of one repeat: each config's pairs carry this run's offset (the between-run part)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i, cid in enumerate(configs):
        true = 0.9 + 0.05 * i
        cand = 500.0 * (1 + 0.02 * rng.standard_normal(60))
        ref = cand * true * run_offset * (1 + 0.003 * rng.standard_normal(60))
        s = paired.summarize_pairs(cand, ref, [k // 10 for k in range(60)], between_run_rsd=0.006, resamples=300)
        rows.append({"record_type": "run", "run_status": "OK", "kernel_name": "gemm_bf16", "shape_name": "qkv",
                     "config_id": cid, "speedup": s.speedup, "speedup_ci_low": s.ci_low,
                     "speedup_ci_high": s.ci_high, "speedup_boot_ci_low": s.boot_ci_low,
                     "speedup_boot_ci_high": s.boot_ci_high})
    rows.append({"record_type": "run", "run_status": "FAILED_CORRECTNESS", "kernel_name": "gemm_bf16",
                 "shape_name": "qkv", "config_id": "wrong", "speedup": 3.0, "speedup_ci_low": 2.9,
                 "speedup_ci_high": 3.1})
    return rows


def test_spread_coverage_and_calibration():
    runs = {"run1": _run_rows(1.000, 1), "run2": _run_rows(1.008, 2), "run3": _run_rows(0.995, 3)}
    rows = repeats.collect(runs)
    assert [r.config_id for r in rows] == ["c1", "c2", "c3", "c4"]  # the incorrect row is not counted
    spreads = [r.spread for r in rows]
    assert all(0.008 < s < 0.02 for s in spreads)  # the offsets span 1.3 %
    fig = repeats.summary(rows)
    assert fig["rows"] == 4 and fig["median_spread_pct"] == pytest.approx(np.median(spreads) * 100)
    # the offsets' SD is about 0.65 %: the calibration finds the between-run part
    assert 0.003 < fig["calibrated_between_run_rsd"] < 0.012
    assert fig["coverage_without_between_run"] < fig["coverage_at_calibrated"]
    table = repeats.markdown(rows, list(runs))
    assert table.count("\n") == 5 and "| gemm_bf16 | qkv | c1 |" in table


def test_analyze_repeats_script(tmp_path):
    for name, (off, seed) in {"repeat_1": (1.0, 1), "repeat_2": (1.004, 2), "repeat_3": (0.998, 3)}.items():
        (tmp_path / f"{name}.jsonl").write_text("\n".join(json.dumps(r) for r in _run_rows(off, seed)) + "\n")
    files = sorted(str(p) for p in tmp_path.glob("*.jsonl"))
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "analyze_repeats.py"), *files, "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    fig = json.loads(proc.stdout)
    assert fig["rows"] == 4 and math.isfinite(fig["median_spread_pct"]) and 0 <= fig["coverage"] <= 1
    out = tmp_path / "table.md"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "analyze_repeats.py"), *files, "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "median run-to-run spread" in out.read_text()
    bad = subprocess.run([sys.executable, str(REPO / "scripts" / "analyze_repeats.py"), files[0]],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "at least two" in bad.stderr


def test_pick_targets_takes_the_best_correct_paired_config():
    rows = [{"record_type": "run", "run_status": "OK", "kernel_name": "gemm_bf16", "shape_name": "llama3_8b_qkv_prefill",
             "config_id": "a", "speedup": 0.95},
            {"record_type": "run", "run_status": "OK", "kernel_name": "gemm_bf16", "shape_name": "llama3_8b_qkv_prefill",
             "config_id": "b", "speedup": 0.97},
            {"record_type": "run", "run_status": "FAILED_CORRECTNESS", "kernel_name": "gemm_bf16",
             "shape_name": "llama3_8b_qkv_prefill", "config_id": "c", "speedup": 1.5}]
    assert pick_targets(rows) == [("gemm_bf16", "llama3_8b_qkv_prefill", "b")]


def test_dobench_pairs_alternate_and_take_the_median_ratio():
    calls = []

    def bench(fn):
        calls.append(fn.__name__)
        return 2.0 if fn.__name__ == "ref" else 1.0

    def cand():
        pass

    def ref():
        pass

    speedup, ratios = dobench_paired(cand, ref, bench, rounds=6, rng=np.random.default_rng(3))
    assert speedup == 2.0 and ratios == [2.0] * 6
    firsts = calls[::2]
    assert "cand" in firsts and "ref" in firsts  # the order is randomized per round


def test_compare_runs_both_methods_on_the_test_double():
    mod = load_kernel_module(FAULTS / "fault_kernel.py")
    config = mod.CONFIGS[0]
    import time as _time

    def wall(fn):
        t0 = _time.perf_counter()
        fn()
        return (_time.perf_counter() - t0) * 1e3

    row = compare(mod, mod.SHAPES[0], config, FakeCpuBackend(), wall, rounds=3)
    assert row["kernel_name"] == "fault_double" and row["runner_pairs"] > 0 and len(row["dobench_ratios"]) == 3
    assert row["runner_ci_low"] <= row["runner_speedup"] <= row["runner_ci_high"]
    assert row["difference"] == pytest.approx(row["dobench_speedup"] / row["runner_speedup"] - 1)
