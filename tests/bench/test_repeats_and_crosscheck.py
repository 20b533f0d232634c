"""The repeat analysis (spread, coverage, calibration) on runner rows built with the real record
builders, and the do_bench cross-check's logic on the CPU test double."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from kernaudit_pipeline.bench import paired, repeats
from kernaudit_pipeline.bench.crosscheck import LONG, SHORT, compare, dobench_paired, pick_targets
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


def test_leave_one_run_out_and_holdout_judge_runs_the_calibration_never_saw():
    # two runs of one call agree closely; a third (another device call) sits 1 % away
    runs = {"run1": _run_rows(1.000, 1), "run2": _run_rows(1.0005, 2), "run3": _run_rows(1.010, 3)}
    rows = repeats.collect(runs)
    folds = {f.held_out: f for f in repeats.leave_one_run_out(rows)}
    assert set(folds) == {"run1", "run2", "run3"} and folds["run3"].calibrated_on == ("run1", "run2")
    assert all(f.comparisons == 4 * 2 * 2 for f in folds.values())  # 4 rows x 2 other runs x both ways
    # calibrated on the two close runs only, the value is small and misses the far run
    assert folds["run3"].between_run_rsd < folds["run1"].between_run_rsd
    assert folds["run3"].coverage < folds["run1"].coverage
    # a hold-out capture at the far run's offset: covered only with a wide enough component
    far = _run_rows(1.010, 4)
    assert repeats.holdout(rows, "main", far, 0.0).coverage < repeats.holdout(rows, "main", far, 0.02).coverage == 1.0
    assert repeats.holdout(rows, "main", [], 0.01).comparisons == 0
    assert 0 <= repeats.coverage_of_median_at(rows) <= 1


def test_analyze_repeats_script(tmp_path):
    for name, (off, seed) in {"repeat_1": (1.0, 1), "repeat_2": (1.004, 2), "repeat_3": (0.998, 3)}.items():
        (tmp_path / f"{name}.jsonl").write_text("\n".join(json.dumps(r) for r in _run_rows(off, seed)) + "\n")
    files = sorted(str(p) for p in tmp_path.glob("*.jsonl"))
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "analyze_repeats.py"), *files, "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    fig = json.loads(proc.stdout)
    assert fig["rows"] == 4 and math.isfinite(fig["median_spread_pct"]) and 0 <= fig["coverage"] <= 1
    assert len(fig["leave_one_run_out"]) == 3 and 0 <= fig["leave_one_run_out_coverage"] <= 1
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "analyze_repeats.py"), *files[:2],
                           "--holdout", files[2], "--at", "0.004", "--json"], capture_output=True, text=True, timeout=120)
    fig = json.loads(proc.stdout)
    assert fig["holdout"]["comparisons"] == 16 and fig["at"]["between_run_rsd"] == 0.004
    assert "holdout_coverage" in fig["at"] and fig["leave_one_run_out"] == []  # two runs: no fold
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

    def bench(fn, warmup, rep):
        calls.append((fn.__name__, warmup, rep))
        return 2.0 if fn.__name__ == "ref" else 1.0

    def cand():
        pass

    def ref():
        pass

    got = dobench_paired(cand, ref, bench, rounds=6, rng=np.random.default_rng(3))
    assert got["speedup"] == 2.0 and got["ratios"] == [2.0] * 6 and got["rounds"] == 6
    assert got["candidate_median_us"] == 1000.0 and got["reference_median_us"] == 2000.0
    firsts = [name for name, _, _ in calls[::2]]
    assert "cand" in firsts and "ref" in firsts  # the order is randomized per round
    assert {(w, r) for _, w, r in calls} == {(SHORT["warmup"], SHORT["rep"])}


def _fault_row(rounds=3, long_rounds=2):
    mod = load_kernel_module(FAULTS / "fault_kernel.py")
    seen = []

    def wall(fn, warmup, rep):
        seen.append((warmup, rep))
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    backend = FakeCpuBackend()
    return compare(mod, mod.SHAPES[0], mod.CONFIGS[0], backend, wall, rounds=rounds, long_rounds=long_rounds), seen, backend


def test_compare_times_every_variant_on_the_test_double():
    row, seen, backend = _fault_row()
    assert row["kernel_name"] == "fault_double" and row["runner_pairs"] > 0 and len(row["dobench_ratios"]) == 3
    assert row["runner_ci_low"] <= row["runner_speedup"] <= row["runner_ci_high"]
    assert row["difference"] == pytest.approx(row["dobench_speedup"] / row["runner_speedup"] - 1)
    # the judged figure is the graph-replayed short-window one; the other two are kept beside it
    assert set(row["dobench"]) == {"graph_short", "eager_short", "eager_long"}
    assert row["dobench_speedup"] == row["dobench"]["graph_short"]["speedup"]
    assert row["dobench"]["graph_short"]["calls"].startswith("CUDA graph replay")
    assert len(row["dobench"]["eager_long"]["ratios"]) == 2
    assert seen.count((LONG["warmup"], LONG["rep"])) == 4 and seen.count((SHORT["warmup"], SHORT["rep"])) == 12
    for name, v in row["dobench"].items():  # both latencies of every round are there
        assert len(v["candidate_ms"]) == len(v["reference_ms"]) == v["rounds"]
        assert row["differences"][name] == pytest.approx(v["speedup"] / row["runner_speedup"] - 1)
    # the runner side asked for a queue lead before every block and recorded the host launch time
    assert sum(lead > 0 for lead in backend.leads_us) == row["runner_blocks"]
    assert row["runner_host_launch_us"] > 0 and row["runner_queue_lead_us"] > 0
    json.dumps(row)  # the document is plain JSON


def test_compare_runs_eagerly_and_says_so_when_a_graph_cannot_be_captured():
    mod = load_kernel_module(FAULTS / "fault_kernel.py")

    class NoGraphs(FakeCpuBackend):
        def graph(self, fn, calls=1):
            raise RuntimeError("operation not permitted when stream is capturing")

    row = compare(mod, mod.SHAPES[0], mod.CONFIGS[0], NoGraphs(), lambda fn, w, r: (fn(), 1.0)[1],
                  rounds=2, long_rounds=0)
    assert "eager: CUDA graph capture failed (RuntimeError" in row["dobench"]["graph_short"]["calls"]
    assert set(row["dobench"]) == {"graph_short", "eager_short"}


def test_crosscheck_cli_refuses_bad_input(tmp_path):
    bad = tmp_path / "empty.jsonl"
    bad.write_text("")
    for args, needle in (([str(bad)], "no target"), ([str(tmp_path / "missing.jsonl")], "cannot read")):
        proc = subprocess.run([sys.executable, "-m", "kernaudit_pipeline.bench.crosscheck", "--jsonl", *args,
                               "--out", str(tmp_path / "x.json")], capture_output=True, text=True, timeout=120,
                              cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "x.json").exists()


def test_crosscheck_command_end_to_end_on_the_test_double(tmp_path):
    """The whole command on the CPU double: best config picked from a capture, every variant
    timed, one JSON document written (which ingest skips as no trace format)."""
    import shutil

    from kernaudit_pipeline.ingest import UnknownFormat, parse_path

    kdir = tmp_path / "kernels"
    kdir.mkdir()
    shutil.copy(FAULTS / "fault_kernel.py", kdir / "fault_kernel.py")
    capture = tmp_path / "capture.jsonl"
    capture.write_text("".join(json.dumps({"record_type": "run", "run_status": "OK", "kernel_name": "fault_double",
                                           "shape_name": "n65536", "config_id": cid, "speedup": sp}) + "\n"
                               for cid, sp in (("BN64_FAULT0_s1_w4", 1.0), ("BN256_FAULT0_s1_w4", 1.1))))
    out = tmp_path / "crosscheck.json"
    proc = subprocess.run([sys.executable, "-m", "kernaudit_pipeline.bench.crosscheck", "--jsonl", str(capture),
                           "--out", str(out), "--targets", "fault_double:n65536", "--kernels-dir", str(kdir),
                           "--rounds", "3", "--long-rounds", "1"], capture_output=True, text=True, timeout=300,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "KERNAUDIT_BENCH_FAKE_DEVICE": "cpu"})
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    (row,) = doc["targets"]
    assert row["config_id"] == "BN256_FAULT0_s1_w4" and "error" not in row
    assert set(row["dobench"]) == {"graph_short", "eager_short", "eager_long"}
    assert doc["method"]["judged"].startswith("dobench.graph_short") and doc["device_name"].startswith("fake-cpu")
    assert "fault_double" in proc.stdout
    with pytest.raises(UnknownFormat):
        parse_path(out)
    bad = subprocess.run([sys.executable, "-m", "kernaudit_pipeline.bench.crosscheck", "--jsonl", str(capture),
                          "--out", str(out), "--targets", "nope"], capture_output=True, text=True, timeout=120,
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert bad.returncode == 2 and "KERNEL_NAME:SHAPE_NAME" in bad.stderr
