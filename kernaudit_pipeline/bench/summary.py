"""The sweep's closing ``summary`` line and the short table the GPU log ends with.

Standard library only.
"""

from __future__ import annotations

import platform
import time
from dataclasses import asdict

from kernaudit_pipeline.bench.records import RecordType
from kernaudit_pipeline.core.verdicts import RunStatus


def best(rows: list[dict]) -> list[dict]:
    """Per (kernel, shape): the correct config with the highest paired speedup (the fastest
    one where no row is paired)."""
    chosen: dict[tuple[str, str], dict] = {}

    def key(r: dict) -> tuple:
        sp = r.get("speedup")
        return (sp is not None, sp if sp is not None else -r["latency_us"])

    for r in rows:
        if (r.get("record_type") != RecordType.RUN.value or r.get("run_status") != RunStatus.OK.value
                or r.get("latency_us") is None):
            continue
        k = (r["kernel_name"], r["shape_name"])
        if k not in chosen or key(r) > key(chosen[k]):
            chosen[k] = r
    out = []
    for (kname, sname), r in sorted(chosen.items()):
        base = r.get("baseline_us")
        out.append({"kernel_name": kname, "shape_name": sname, "config_id": r["config_id"],
                    "latency_us": r["latency_us"], "baseline_name": r.get("baseline_name"),
                    "baseline_backend": r.get("baseline_backend"), "baseline_us": base,
                    "speedup": r.get("speedup") if r.get("speedup") is not None
                    else ((base / r["latency_us"]) if base else None),
                    "speedup_ci_low": r.get("speedup_ci_low"), "speedup_ci_high": r.get("speedup_ci_high"),
                    "timing_mode": r.get("timing_mode")})
    return out


def status_counts(rows: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in rows:
        if r.get("record_type") in (RecordType.RUN.value, RecordType.BASELINE.value):
            k = f"{r['record_type']}:{r.get('run_status')}"
            counts[k] = counts.get(k, 0) + 1
    return counts


def summary_record(sweep, started_wall: float, argv: list[str], deadline_s: float | None,
                   kernels: list[str], shapes: list[str]) -> dict:
    rows = sweep.rows
    check_s = sum(r.get("check_s") or 0.0 for r in rows)
    timing_s = sum(r.get("timing_s") or 0.0 for r in rows)
    compile_s = sum(r.get("compile_s") or 0.0 for r in rows)
    counts = status_counts(rows)
    return {
        "record_type": RecordType.SUMMARY.value,
        "sweep_wall_s": time.time() - started_wall, "gpu_busy_s": check_s + timing_s,
        "check_s": check_s, "timing_s": timing_s, "compile_s": compile_s,
        "precompile_wall_s": sweep.precompile_wall_s, "status_counts": counts,
        "configs_timed": counts.get("run:OK", 0), "best": best(rows),
        "kernels": kernels, "shapes": shapes, "deadline_s": deadline_s, "argv": list(argv),
        "options": asdict(sweep.options),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started_wall)),
        "python_version": platform.python_version(), **asdict(sweep.device),
    }


def _peaks(rows: list[dict]) -> dict[str, float]:
    out = {}
    for r in rows:
        if r.get("record_type") == RecordType.PEAK.value:
            value = r.get("peak_tflops") if r.get("peak_tflops") is not None else r.get("peak_gb_per_s")
            if value is not None:
                out[r["peak_name"]] = float(value)
    return out


def _fmt(value: float | None, spec: str, width: int) -> str:
    return f"{value:{width}{spec}}" if value is not None else f"{'-':>{width}}"


def print_table(rows: list[dict]) -> None:
    for name, value in _peaks(rows).items():
        print(f"peak {name}: {value:.1f}")
    print(f"{'kernel':<22} {'shape':<30} {'best config':<30} {'us':>9} {'base us':>9} "
          f"{'speedup [95% CI]':>24}  baseline ran")
    for b in best(rows):
        ci = ""
        if b.get("speedup_ci_low") is not None:
            ci = f" [{b['speedup_ci_low']:.3f}, {b['speedup_ci_high']:.3f}]"
        sp = (f"{b['speedup']:.3f}" if b["speedup"] is not None else "-") + ci
        print(f"{b['kernel_name']:<22} {b['shape_name']:<30} {b['config_id']:<30} "
              f"{_fmt(b['latency_us'], '.1f', 9)} {_fmt(b['baseline_us'], '.1f', 9)} {sp:>24}  "
              f"{b.get('baseline_backend') or b.get('baseline_name') or '-'}")
    counts: dict[str, int] = {}
    for r in rows:
        if r.get("record_type") == RecordType.RUN.value:
            counts[str(r.get("run_status"))] = counts.get(str(r.get("run_status")), 0) + 1
    print("run statuses: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
