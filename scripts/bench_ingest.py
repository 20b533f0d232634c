#!/usr/bin/env python3
"""Time ``kernaudit ingest`` on a generated runner JSONL: wall time and peak memory.

    .venv/bin/python scripts/bench_ingest.py --rows 200000 [--rows 1000000] [--repeats 3] [--out DIR]

The input is made from the committed H200 sweep (samples/h200/bench_h200.jsonl): its run and
baseline lines are repeated, each copy with its own config id, shape and latencies, so every
line is a real runner record of realistic size (about 2.9 kB; 1,000,000 lines are 2.9 GB).
Each repeat runs ``python -m kernaudit_pipeline.cli ingest FILE --out DIR`` in a fresh process
and reads the child's wall time and peak resident memory (``wait4``'s ``ru_maxrss``). The
rows written are checked against the rows generated, so a fast run that loses rows fails.

Everything is written under ``--out`` (default ``data/bench_ingest``): the generated input
(``--keep-input`` keeps it for the next run), the tables, and ``results.json``.
Measure on a quiet machine: other processes on the cores move the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "samples" / "h200" / "bench_h200.jsonl"


def generate(path: Path, rows: int, seed: int = 0) -> int:
    """``rows`` run/baseline lines in ``path``; returns the bytes written."""
    templates = [json.loads(line) for line in SAMPLE.read_text().splitlines()
                 if '"record_type": "run"' in line or '"record_type": "baseline"' in line]
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with path.open("w") as fh:
        for i in range(rows):
            record = dict(templates[i % len(templates)])
            scale = rng.uniform(0.8, 1.25)
            for key in ("latency_us", "latency_p10_us", "latency_p90_us", "latency_ci_low_us",
                        "latency_ci_high_us"):
                if isinstance(record.get(key), (int, float)):
                    record[key] = record[key] * scale
            record["shape_name"] = f"{record.get('shape_name')}_{i // len(templates)}"
            line = json.dumps(record) + "\n"
            fh.write(line)
            written += len(line)
    return written


def run_once(input_path: Path, out: Path) -> dict:
    cmd = [sys.executable, "-m", "kernaudit_pipeline.cli", "ingest", str(input_path), "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    stdout, stderr = proc.stdout.read().decode(), proc.stderr.read().decode()
    proc.stdout.close()
    proc.stderr.close()
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"ingest failed (exit {code}): {stderr.strip()[-300:]}")
    kept = sum(1 for _ in (out / "kernel_runs.csv").open()) - 1
    return {"wall_s": round(wall, 3), "max_rss_mb": round(usage.ru_maxrss / 1024, 1),
            "user_s": round(usage.ru_utime, 2), "sys_s": round(usage.ru_stime, 2), "kept": kept,
            "summary": stdout.strip().splitlines()[-1] if stdout.strip() else ""}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, action="append", help="rows to generate (repeatable; default 200000)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per size (default 3)")
    parser.add_argument("--out", type=Path, default=REPO / "data" / "bench_ingest", help="work folder")
    parser.add_argument("--keep-input", action="store_true", help="keep the generated JSONL for the next run")
    args = parser.parse_args()
    results = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                           "load_avg_at_start": os.getloadavg()}, "sizes": []}
    for rows in args.rows or [200_000]:
        input_path = args.out / f"runner_{rows}.jsonl"
        if not input_path.exists():
            t0 = time.perf_counter()
            size = generate(input_path, rows)
            print(f"generated {rows:,} rows ({size / 1e9:.2f} GB) in {time.perf_counter() - t0:.0f} s", flush=True)
        size = input_path.stat().st_size
        runs = []
        for r in range(args.repeats):
            got = run_once(input_path, args.out / f"tables_{rows}")
            if got["kept"] != rows:
                raise SystemExit(f"{rows:,} rows in, {got['kept']:,} kept: rows lost")
            got["load_avg"] = os.getloadavg()[0]
            runs.append(got)
            print(f"{rows:>9,} rows  run {r + 1}: {got['wall_s']:7.2f} s wall  {got['max_rss_mb']:7.0f} MB peak  "
                  f"(user {got['user_s']} s, sys {got['sys_s']} s, load {got['load_avg']:.2f})", flush=True)
        walls = [g["wall_s"] for g in runs]
        entry = {"rows": rows, "bytes": size, "runs": runs, "median_wall_s": statistics.median(walls),
                 "min_wall_s": min(walls), "max_rss_mb": max(g["max_rss_mb"] for g in runs),
                 "rows_per_s": round(rows / statistics.median(walls))}
        results["sizes"].append(entry)
        print(f"{rows:>9,} rows: median {entry['median_wall_s']:.2f} s, best {entry['min_wall_s']:.2f} s, "
              f"peak {entry['max_rss_mb']:.0f} MB, {entry['rows_per_s']:,} rows/s", flush=True)
        if not args.keep_input:
            input_path.unlink()
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
