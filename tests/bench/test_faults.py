"""Workers that hang, segfault, raise, return wrong results or hit a fatal CUDA error: every
one becomes a row with the right status, the supervisor carries on, and no kernel module is
ever imported by the parent. Runs the real supervisor and worker processes on the CPU test
double (``KERNAUDIT_BENCH_FAKE_DEVICE=cpu``)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from kernaudit_pipeline.bench.correctness import check_outputs, is_fatal_cuda
from kernaudit_pipeline.bench.options import BenchOptions
from kernaudit_pipeline.bench.records import DeviceInfo, read_jsonl
from kernaudit_pipeline.bench.supervisor import Group, Sweep, plan_kernels, run_group, supervise
from kernaudit_pipeline.kernel_spec import Tolerance

REPO = Path(__file__).resolve().parents[2]
FAULTS = Path(__file__).resolve().parent / "fault_kernels"
TIMEOUT_S = 20.0


@pytest.fixture(scope="module")
def campaign(tmp_path_factory) -> tuple[subprocess.CompletedProcess, list[dict], float]:
    """One ``kernaudit bench`` over the fault modules, as a user would run it."""
    out = tmp_path_factory.mktemp("faults") / "faults.jsonl"
    env = dict(os.environ, PYTHONPATH=str(REPO), KERNAUDIT_BENCH_FAKE_DEVICE="cpu")
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "kernaudit_pipeline.bench.runner", "--kernels-dir", str(FAULTS),
         "--out", str(out), "--quick", "--timeout-s", str(TIMEOUT_S), "--min-time-s", "0.01"],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    return proc, read_jsonl(out.read_text()), time.monotonic() - t0


def _runs(rows, kernel):
    return {r["config_id"]: r for r in rows if r["record_type"] == "run" and r["kernel_name"] == kernel}


def test_every_fault_is_a_row_with_its_status(campaign):
    proc, rows, _ = campaign
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    runs = _runs(rows, "fault_double")
    status = {cid: r["run_status"] for cid, r in runs.items()}
    assert status == {
        "BN64_FAULT0_s1_w4": "OK", "BN256_FAULT0_s1_w4": "OK",
        "BN128_FAULT0_s1_w4": "PRUNED_SPILL",          # declared stack frame: never launched
        "BN64_FAULT1_s1_w4": "FAILED_CORRECTNESS",    # wrong results: timed, never a win
        "BN64_FAULT2_s1_w4": "ERROR",                 # raises
        "BN64_FAULT3_s1_w4": "CRASHED",               # segfault kills the worker
        "BN64_FAULT5_s1_w4": "CRASHED",               # fatal CUDA error: the worker exits
        "BN64_FAULT4_s1_w4": "TIMEOUT",               # hangs: killed at --timeout-s
    }
    assert "SIGSEGV" in runs["BN64_FAULT3_s1_w4"]["run_message"]
    assert "illegal memory access" in runs["BN64_FAULT5_s1_w4"]["run_message"]
    assert f"ran over {TIMEOUT_S:g} s" in runs["BN64_FAULT4_s1_w4"]["run_message"]
    assert runs["BN64_FAULT1_s1_w4"]["correct"] is False
    # a new worker carried on after each death; the configs after them were timed, paired
    ok = runs["BN256_FAULT0_s1_w4"]
    assert ok["worker_attempt"] >= 1 and ok["timing_pairs"] > 0 and ok["speedup"] > 0
    assert ok["speedup_ci_low"] <= ok["speedup"] <= ok["speedup_ci_high"]


def test_references_rows_and_results(campaign):
    _, rows, _ = campaign
    refs = {r["config_id"]: r for r in rows if r["record_type"] == "baseline" and r["kernel_name"] == "fault_double"}
    assert set(refs) == {"baseline", "baseline[slow]", "baseline[absent]"}  # once each, despite 4 workers
    assert refs["baseline"]["run_status"] == "OK" and refs["baseline"]["correct"] is True
    assert refs["baseline[absent]"]["run_status"] == "NOT_RUN"
    assert "not installed" in refs["baseline[absent]"]["run_message"]
    import json
    ok = _runs(rows, "fault_double")["BN64_FAULT0_s1_w4"]
    others = {r["name"]: r for r in json.loads(ok["reference_speedups"])}
    assert others["torch add chain"]["run_status"] == "OK" and others["torch add chain"]["speedup"] > 0
    assert others["a library this host lacks"]["speedup"] is None
    assert others["a library this host lacks"]["run_status"].startswith("NOT_RUN")


def test_hangs_at_import_and_in_compile_args_time_out_in_workers(campaign):
    proc, rows, wall = campaign
    (import_row,) = [r for r in rows if r.get("kernel_module") == "hang_import"]
    assert import_row["run_status"] == "TIMEOUT" and "hang_import.py" in import_row["run_message"]
    (compile_row,) = _runs(rows, "hang_in_compile_args").values()
    assert compile_row["run_status"] == "TIMEOUT" and "ran over" in compile_row["run_message"]
    assert rows[-1]["record_type"] == "summary"
    # the limits followed --timeout-s: nothing waited anywhere near the old fixed 300 s
    assert wall < 300


def test_supervise_kills_a_worker_hanging_at_start_up(tmp_path):
    """The start-up limit is the step limit: a spec the worker chokes on before its first
    progress mark is killed at the timeout we pass, not at a fixed one."""
    plan_path = tmp_path / "p.json"
    spec = {"mode": "plan", "kernel_path": str(FAULTS / "hang_import.py"), "plan_path": str(plan_path),
            "rows_path": str(tmp_path / "rows.jsonl"), "progress_path": str(tmp_path / "progress")}
    t0 = time.monotonic()
    rc, killed_for, final = supervise(spec, tmp_path, "hang", step_timeout_s=8.0,
                                      deadline=time.monotonic() + 600, echo=False)
    assert killed_for is not None and not killed_for.at_deadline
    assert "ran over 8 s" in killed_for.message and final == "import"
    assert time.monotonic() - t0 < 60 and not plan_path.exists()


def test_run_group_gives_up_at_the_deadline_with_not_run_rows(tmp_path):
    plans, failures = plan_kernels([FAULTS / "fault_kernel.py"], tmp_path, 120.0, time.monotonic() + 600)
    assert not failures
    out = tmp_path / "out.jsonl"
    sweep = Sweep(out=out, options=BenchOptions(device="cpu", timeout_s=60.0), deadline=time.monotonic() - 1,
                  work_dir=tmp_path, driver_version=None, device=DeviceInfo(device_name="fake"))
    group = Group(plans[0], ["n65536"], ["BN64_FAULT0_s1_w4", "BN64_FAULT4_s1_w4"])
    run_group(group, sweep)
    rows = read_jsonl(out.read_text())
    assert [r["run_status"] for r in rows] == ["NOT_RUN", "NOT_RUN"]
    assert all(r["run_message"] == "sweep deadline reached" for r in rows)


# --------------------------------------------------------------------------------------------
# check_outputs: the correctness verdict itself
# --------------------------------------------------------------------------------------------
TOL = Tolerance(max_rel_l2=1e-2, atol=1e-3, rtol=1e-2)


def test_check_outputs_accepts_rounding_and_refuses_wrong_results():
    ref = torch.randn(4096, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    good = check_outputs(ref.to(torch.bfloat16), ref, TOL, seed=1, t0=time.perf_counter())
    assert good.correct and 1e-4 < good.max_rel_error < 1e-2
    wrong = check_outputs(ref * 1.1, ref, TOL, seed=2, t0=time.perf_counter())
    assert not wrong.correct and wrong.max_rel_error == pytest.approx(0.1)
    assert wrong.elementwise_violations > 0


def test_check_outputs_catches_unwritten_and_misshapen_outputs():
    ref = torch.ones(128, dtype=torch.float64)
    out = ref.clone()
    out[7] = math.nan  # the poison a kernel never overwrote
    res = check_outputs(out, ref, TOL, seed=3, t0=time.perf_counter())
    assert not res.correct and res.nonfinite_outputs == 1 and res.max_rel_error is None
    res = check_outputs(torch.ones(64), ref, TOL, seed=4, t0=time.perf_counter())
    assert not res.correct and res.max_rel_error is None
    zero = check_outputs(torch.zeros(8), torch.zeros(8, dtype=torch.float64), TOL, 5, time.perf_counter())
    assert zero.correct and zero.max_rel_error == 0.0


@pytest.mark.parametrize("text,fatal", [
    ("CUDA error: an illegal memory access was encountered", True),
    ("CUDA error: unspecified launch failure", True),
    ("device-side assert triggered", True),
    ("ValueError: shapes do not match", False),
    ("triton.runtime.errors.OutOfResources: out of resource: shared memory", False),
])
def test_fatal_cuda_classification(text, fatal):
    assert is_fatal_cuda(RuntimeError(text)) is fatal
