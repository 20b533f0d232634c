"""kernaudit bench --search end to end on the runner's CPU test double: real supervisor and
worker processes, a kernel whose configs take time in proportion to their WORK, and rankings
that are right, wrong or broken."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
KERNELS = Path(__file__).resolve().parent / "search_kernels"
SHAPE = "n65536"


def _ranking(path: Path, order: str) -> Path:
    """A ranking of cpu_work's 24 configs: 'right' predicts time ~ WORK, 'wrong' the reverse."""
    configs = [(f"BN{64 * (1 + i % 4)}_WORK{1 + i}_s1_w4", 1 + i) for i in range(24)]
    ranked = sorted(({"config_id": cid, "predicted_us": 10.0 * (work if order == "right" else 25 - work)}
                     for cid, work in configs), key=lambda r: r["predicted_us"])
    path.write_text(json.dumps([{"kernel_name": "cpu_work", "shape_name": SHAPE, "stated_error": 0.2,
                                 "ranked": ranked}]))
    return path


def _search(tmp: Path, ranking: Path, *extra: str) -> tuple[subprocess.CompletedProcess, list[dict], list[dict]]:
    out, summary = tmp / "search.jsonl", tmp / "summary.json"
    env = dict(os.environ, PYTHONPATH=str(REPO), KERNAUDIT_BENCH_FAKE_DEVICE="cpu")
    proc = subprocess.run(
        [sys.executable, "-m", "kernaudit_pipeline.bench.runner", "cpu_work", "--kernels-dir", str(KERNELS),
         "--shapes", SHAPE, "--search", "--ranking", str(ranking), "--out", str(out),
         "--search-summary", str(summary), "--min-time-s", "0.005", "--min-blocks", "3",
         "--max-seconds-per-config", "0.1", "--timeout-s", "60", "--search-initial", "4",
         "--search-batch", "4", *extra],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    summaries = json.loads(summary.read_text()) if summary.exists() else []
    return proc, rows, summaries


def test_a_right_ranking_stops_after_the_first_batch(tmp_path):
    proc, rows, (s,) = _search(tmp_path, _ranking(tmp_path / "r.json", "right"))
    assert proc.returncode == 0, proc.stderr
    assert s["best_config_id"] == "BN64_WORK1_s1_w4" and s["stop_reason"] == "NO_PLAUSIBLE_WINNER"
    assert s["measured"] == 4 and s["candidates"] == 24
    runs = [r for r in rows if r["record_type"] == "run"]
    assert sorted(r["config_id"] for r in runs) == sorted(s["measured_config_ids"])
    assert all(r["speedup"] > 0 and r["speedup_ci_low"] <= r["speedup"] <= r["speedup_ci_high"] for r in runs)
    # the GPU-seconds are the rows' own checks and timing loops, the reference's included
    assert s["gpu_seconds"] == pytest.approx(sum((r.get("check_s") or 0) + (r.get("timing_s") or 0)
                                                 for r in rows if r["record_type"] in ("run", "baseline")))
    assert rows[-1]["record_type"] == "summary"


def test_a_wrong_ranking_measures_batch_after_batch_within_its_budget(tmp_path):
    proc, rows, (s,) = _search(tmp_path, _ranking(tmp_path / "w.json", "wrong"), "--search-max-fraction", "0.5")
    assert proc.returncode == 0, proc.stderr
    assert s["stop_reason"] == "BUDGET" and s["measured"] == 12
    # three worker runs, one reference row each, no row written twice
    assert sum(r["record_type"] == "baseline" for r in rows) == 3
    ids = [r["config_id"] for r in rows if r["record_type"] == "run"]
    assert len(ids) == len(set(ids)) == 12
    # the pick is the fastest of the half it was allowed (the reversed ranking's WORK 24..13)
    assert {int(i.split("WORK")[1].split("_")[0]) for i in ids} == set(range(13, 25))
    fastest = max((r for r in rows if r["record_type"] == "run"), key=lambda r: r["speedup"])
    assert s["best_config_id"] == fastest["config_id"]


@pytest.mark.parametrize("content, needle", [
    ("{not json", "not a readable ranking"),
    ("[]", "ranks nothing for cpu_work"),
    ('[{"kernel_name": "cpu_work", "shape_name": "n65536", "ranked": [{"config_id": "x"}]}]',
     "lacks config_id or predicted_us"),
])
def test_a_broken_ranking_is_one_line_exit_2(tmp_path, content, needle):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    proc, rows, summaries = _search(tmp_path, bad)
    assert proc.returncode == 2 and not summaries
    assert len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr


@pytest.mark.parametrize("extra, needle", [
    (["--search-initial", "0"], "--search-initial and --search-batch must be at least 1"),
    (["--search-max-fraction", "1.5"], "--search-max-fraction must be in (0, 1]"),
])
def test_bad_search_options_are_one_line_exit_2(tmp_path, extra, needle):
    proc, _, _ = _search(tmp_path, _ranking(tmp_path / "r.json", "right"), *extra)
    assert proc.returncode == 2 and needle in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_the_deadline_ends_the_search_with_what_it_has(tmp_path):
    """24 configs, each timed to the 40-block cap, and a worker start-up per batch of 4 do not
    fit in 12 s (the workers are told to wrap up 6 s before it); a stated error of 500 % keeps
    the stop rule from ending the search first. Configs the deadline kept from running are not
    counted as measured, so the search ends as DEADLINE, never as EXHAUSTED."""
    proc, rows, summaries = _search(tmp_path, _ranking(tmp_path / "w.json", "wrong"), "--deadline-s", "12",
                                    "--min-time-s", "1.0", "--max-seconds-per-config", "2.0",
                                    "--search-stated-error", "5")
    assert proc.returncode == 0, proc.stderr
    (s,) = summaries
    assert s["stop_reason"] == "DEADLINE" and s["measured"] < 24
    ran = {r["config_id"] for r in rows if r["record_type"] == "run" and r["run_status"] != "NOT_RUN"}
    assert set(s["measured_config_ids"]) <= ran
    ids = [r["config_id"] for r in rows if r["record_type"] == "run" and r["run_status"] == "OK"]
    assert s["best_config_id"] in ids or (not ids and s["best_config_id"] is None)
