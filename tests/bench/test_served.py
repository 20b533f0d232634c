"""``kernaudit bench --search`` with its kept-up worker (``bench/served.py``) on the runner's
CPU test double, over the fault kernel: every way a config can take its worker down, met in the
middle of a batch. The batch's rows so far are kept, the rest goes to fresh workers (which name
the failing config as a full sweep does), and the next batch gets a new serving worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FAULTS = Path(__file__).resolve().parent / "fault_kernels"
# long enough for a worker to start (python, torch) on a loaded 2-core host, as the suite runs
# in worker processes; the hanging config costs this much
TIMEOUT_S = 15.0
# the walk, two configs a batch: each fault after a config that is fine
ORDER = ["BN64_FAULT0_s1_w4", "BN64_FAULT3_s1_w4",   # a segfault
         "BN256_FAULT0_s1_w4", "BN64_FAULT1_s1_w4",  # wrong results: a row, not a death
         "BN64_FAULT2_s1_w4", "BN64_FAULT5_s1_w4",   # raises (a row), then a fatal CUDA error
         "BN64_FAULT4_s1_w4"]                        # hangs past --timeout-s
STATUS = {"BN64_FAULT0_s1_w4": "OK", "BN64_FAULT3_s1_w4": "CRASHED", "BN256_FAULT0_s1_w4": "OK",
          "BN64_FAULT1_s1_w4": "FAILED_CORRECTNESS", "BN64_FAULT2_s1_w4": "ERROR",
          "BN64_FAULT5_s1_w4": "CRASHED", "BN64_FAULT4_s1_w4": "TIMEOUT"}


def _search(tmp: Path, *extra: str, order: list[str] = ORDER) -> tuple[subprocess.CompletedProcess, list[dict], dict]:
    ranking = tmp / "ranking.json"
    ranking.write_text(json.dumps([{"kernel_name": "fault_double", "shape_name": "n65536", "stated_error": 5,
                                    # predicted alike, so the stop rule can rule none out: the
                                    # walk reaches every fault, whichever fine config is faster
                                    "ranked": [{"config_id": c, "predicted_us": 1.0} for c in order]}]))
    out, summary = tmp / "out.jsonl", tmp / "summary.json"
    env = dict(os.environ, PYTHONPATH=str(REPO), KERNAUDIT_BENCH_FAKE_DEVICE="cpu")
    proc = subprocess.run(
        [sys.executable, "-m", "kernaudit_pipeline.bench.runner", "fault_kernel", "--kernels-dir", str(FAULTS),
         "--search", "--ranking", str(ranking), "--out", str(out), "--search-summary", str(summary),
         "--timeout-s", str(TIMEOUT_S), "--min-time-s", "0.005", "--min-blocks", "3",
         "--max-seconds-per-config", "0.1", "--search-initial", "2", "--search-batch", "2",
         "--search-fixed-order", *extra],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return proc, rows, (json.loads(summary.read_text())[0] if summary.exists() else {})


def test_a_batch_the_serving_worker_fails_goes_to_fresh_workers(tmp_path):
    proc, rows, s = _search(tmp_path, "--search-screen-time-s", "0")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    runs = {r["config_id"]: r for r in rows if r["record_type"] == "run"}
    assert {cid: r["run_status"] for cid, r in runs.items()} == STATUS
    assert "SIGSEGV" in runs["BN64_FAULT3_s1_w4"]["run_message"]
    assert "illegal memory access" in runs["BN64_FAULT5_s1_w4"]["run_message"]
    assert f"ran over {TIMEOUT_S:g} s" in runs["BN64_FAULT4_s1_w4"]["run_message"]
    # a batch's configs are checked before any is timed, so a death in the check leaves its
    # batch-mates to the fresh workers, which time them (paired) once the faulty one is named
    for cid in ("BN64_FAULT0_s1_w4", "BN256_FAULT0_s1_w4"):
        assert runs[cid]["timing_pairs"] > 0 and runs[cid]["speedup"] > 0
    assert len([r for r in rows if r["record_type"] == "run"]) == len(STATUS)  # none written twice
    assert s["measured"] == 7 and s["stop_reason"] == "EXHAUSTED" and s["best_config_id"] in (
        "BN64_FAULT0_s1_w4", "BN256_FAULT0_s1_w4")
    summary = rows[-1]
    # four batches; the first, third and fourth bring their worker down: three serving workers
    # (the second batch's wrong results are a row, and its worker served the third)
    assert summary["search_served_batches"] == 4 and summary["search_serving_workers_started"] == 3
    assert proc.stdout.count("[search] serving worker failed") == 3
    # the reference was checked once for the shape, however many workers there were
    assert sum(r["record_type"] == "baseline" and r["config_id"] == "baseline" for r in rows) == 1


def test_fresh_workers_give_the_same_rows(tmp_path):
    """--search-fresh-workers: a new worker for every batch, as before; the same statuses."""
    proc, rows, s = _search(tmp_path, "--search-screen-time-s", "0", "--search-fresh-workers")
    assert proc.returncode == 0, proc.stderr
    runs = {r["config_id"]: r["run_status"] for r in rows if r["record_type"] == "run"}
    assert runs == STATUS and s["measured"] == 7
    assert rows[-1]["search_served_batches"] is None and "serving worker" not in proc.stdout


@pytest.mark.parametrize("screen", ["0", "0.01"])
def test_the_deadline_stops_a_serving_worker_stuck_in_a_config(tmp_path, screen):
    """The second batch hangs in its check past the sweep's deadline (the step limit is longer):
    the serving worker is killed at the deadline, what it left is NOT_RUN, nothing of the batch
    counts as measured, and the search ends as DEADLINE with the first batch's pick."""
    order = ["BN64_FAULT0_s1_w4", "BN256_FAULT0_s1_w4", "BN64_FAULT4_s1_w4", "BN64_FAULT1_s1_w4"]
    proc, rows, s = _search(tmp_path, "--search-screen-time-s", screen, "--deadline-s", "20",
                            "--timeout-s", "120", order=order)
    assert proc.returncode == 0, proc.stderr
    runs = {r["config_id"]: r for r in rows if r["record_type"] == "run"}
    assert runs["BN64_FAULT4_s1_w4"]["run_status"] == "NOT_RUN"
    assert runs["BN64_FAULT1_s1_w4"]["run_status"] == "NOT_RUN"
    assert s["stop_reason"] == "DEADLINE" and sorted(s["measured_config_ids"]) == sorted(order[:2])
    assert s["best_config_id"] in order[:2]
    assert "serving worker failed (sweep deadline reached" in proc.stdout


ORPHAN = """
import os, sys, time
from pathlib import Path
from kernaudit_pipeline.bench.options import BenchOptions
from kernaudit_pipeline.bench.records import DeviceInfo
from kernaudit_pipeline.bench.served import ServedWorker
from kernaudit_pipeline.bench.supervisor import Sweep, plan_kernels
tmp = Path(sys.argv[1])
plans, _ = plan_kernels([Path(sys.argv[2])], tmp, 120.0, time.monotonic() + 600)
sweep = Sweep(out=tmp / "out.jsonl", options=BenchOptions(device="cpu", timeout_s=60.0),
              deadline=time.monotonic() + 600, work_dir=tmp, driver_version=None,
              device=DeviceInfo(device_name="fake"))
served = ServedWorker(plans[0], sweep, tmp / "served", echo=False)
done, failed = served.run(["n65536"], [("n65536", "BN64_FAULT0_s1_w4")], {})
print(served.proc.pid, sorted(done), failed, flush=True)
os._exit(0)  # gone without closing it, as when the command running the search is killed
"""


def test_a_serving_worker_outlives_no_supervisor(tmp_path):
    """It runs in a session of its own, so nothing kills it with its parent's process group;
    left waiting for a batch by a supervisor that died, it ends by itself."""
    env = dict(os.environ, PYTHONPATH=str(REPO), KERNAUDIT_BENCH_FAKE_DEVICE="cpu")
    proc = subprocess.run([sys.executable, "-c", ORPHAN, str(tmp_path), str(FAULTS / "fault_kernel.py")],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    pid, rest = proc.stdout.split(maxsplit=1)
    assert "BN64_FAULT0_s1_w4" in rest and rest.rstrip().endswith("None")  # the batch went through
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _alive(int(pid)):
        time.sleep(0.1)
    assert not _alive(int(pid))
    assert "the supervisor is gone" in (tmp_path / "served" / "worker1" / "serve.log").read_text()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by init in this container) counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
