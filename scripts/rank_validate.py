#!/usr/bin/env python3
"""Calibrate the static cost model on measured sweeps and report leave-one-kernel-out accuracy
(issue 15): for each kernel, fit on the others, rank its space with no timings, and compare the
pick with the exhaustive best of each measured shape.

    PYTHONPATH=. .venv/bin/python scripts/rank_validate.py                      # committed sweeps
    PYTHONPATH=. .venv/bin/python scripts/rank_validate.py --sweeps a.jsonl b.jsonl \\
        --kernels gemm fp8_gemm ... --held-out NEW_KERNEL --write-calibration

The committed sweeps are the four kernels/ modules on the H200 and the exhaustive sweeps in
samples/rank (swiglu_gemm, rmsnorm_gemm, w8a16_gemm, fused_moe_gemm, bias_gelu_gemm and
w8a8_int8_gemm on an H100, w4a16_gemm and fp8_block_gemm on the H200); each row is scored with
the features of the GPU it ran on. Held-out kernels (``--held-out``; by default w8a8_int8_gemm,
whose M=128 bucket is not yet swept whole) are never fitted on, even when ``--kernels`` names
them too: when a sweep of one exists, it is scored with the calibration fitted on the others.
``--write-calibration`` rewrites ``kernaudit_pipeline/rank/calibration.json`` (fitted on every
non-held-out kernel, stated error = the worst LOKO within-shape error). Prints a Markdown
report (``--out`` to also write it to a file). Needs the CPU static audit (cached under the data
folder).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SWEEPS = [ROOT / "samples" / "h200" / "bench_h200.jsonl",
                  *sorted((ROOT / "samples" / "rank").glob("*_exhaustive_*.jsonl.gz"))]
# The four kernels/ modules (H200 sweeps); since 2026-12-06 the two held-out kernels of
# 12-04..05, since 2026-12-07 the four of 12-06..07, and since the afternoon of 12-07 the
# seventh (bias_gelu_gemm): each joined only after its held-out result had been reported
# (docs/benchmarks.md). The eighth, w8a8_int8_gemm (2026-12-07 evening), stays held out: its
# M=128 bucket has not been swept whole, so its committed ranking is still a test to score.
CALIBRATION_KERNELS = ["gemm", "fp8_gemm", "flash_attention", "paged_decode_attention",
                       "swiglu_gemm", "rmsnorm_gemm", "w8a16_gemm", "w4a16_gemm", "fp8_block_gemm",
                       "fused_moe_gemm", "bias_gelu_gemm"]
HELD_OUT_KERNELS: list[str] = ["w8a8_int8_gemm"]


def fitted_kernels(kernels: list[str], held_out: list[str]) -> list[str]:
    """The kernels the calibration is fitted on: a kernel named in both lists is held out, never
    fitted on, whatever ``--kernels`` says (its held-out score would otherwise be read off a fit
    that saw it)."""
    return [k for k in kernels if k not in set(held_out)]


def _plain(path: Path, scratch: Path) -> Path:
    """A .gz file (gpu_rank.sh compresses large sweeps) unpacked into ``scratch``, under its
    name without .gz (the name identifies the run); anything else as it is."""
    import gzip
    import shutil

    if path.suffix != ".gz":
        return path
    out = scratch / path.with_suffix("").name
    with gzip.open(path, "rb") as src, out.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    return out


def _fmt(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{x:.3f}"


def _table(scores, title: str) -> list[str]:
    lines = [f"| {title} | shape | configs measured | top-1 | best of top-5 | largest tile, most warps | max occupancy | exhaustive best | model's pick |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s in scores:
        lines.append(f"| {s.kernel_name} | {s.shape_name} | {s.measured} | {_fmt(s.top1)}× | {_fmt(s.top5)}× | "
                     f"{_fmt(s.largest_tile)}× | {_fmt(s.max_occupancy)}× | `{s.best_config}` | `{s.picked_config}` |")
    return lines


def _rows_by_group(paths: list[Path]) -> dict[tuple[str, str, str], list[dict]]:
    """The runner's ``run`` records (JSON lines) per (kernel, shape, file)."""
    import json

    groups: dict[tuple[str, str, str], list[dict]] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and row.get("record_type") == "run":
                groups.setdefault((str(row.get("kernel_name")), str(row.get("shape_name")), path.name), []).append(row)
    return groups


def _search_replay(params, stated_error: float, samples, rows_by_group, title: str,
                   adapt: bool = True) -> list[str]:
    """Replay ``kernaudit bench --search`` on each recorded sweep: the model's order over the
    configs it keeps (corrected as the walk goes unless ``adapt`` is off), measured from the
    recorded rows; GPU-seconds are the rows' own check + timing seconds against the whole
    sweep's."""
    from kernaudit_pipeline.rank.model import predict
    from kernaudit_pipeline.rank.search import Candidate, SearchSettings, replay, search

    lines = [f"| {title} | shape | configs ranked | measured | found / exhaustive best | GPU-s search / exhaustive | stop |",
             "|---|---|---|---|---|---|---|"]
    spent = total = 0.0
    by_group: dict = {}
    for s in samples:
        by_group.setdefault(s.group, []).append(s)
    for group, members in sorted(by_group.items()):
        rows = rows_by_group.get(group, [])
        timed = [r for r in rows if r.get("run_status") == "OK" and r.get("latency_us")]
        if not timed:
            continue
        exhaustive_s = sum(float(r.get("check_s") or 0) + float(r.get("timing_s") or 0) for r in rows)
        ranking = sorted((Candidate.of(m.features.config_id, predict(m.features, params).total_s * 1e6,
                                       m.features.config)
                          for m in members if m.features.spill_bytes < 512), key=lambda c: c.predicted_us)
        res = search(ranking, replay(rows), SearchSettings(stated_error=stated_error, adapt=adapt))
        best = min(float(r["latency_us"]) for r in timed)
        found = (res.best.latency_us or math.inf) / best if res.best else math.inf
        spent += res.gpu_seconds
        total += exhaustive_s
        lines.append(f"| {group[0]} | {group[1]} | {len(ranking)} | {len(res.measured)} | {_fmt(found)}× | "
                     f"{res.gpu_seconds:.2f} / {exhaustive_s:.2f} ({100 * res.gpu_seconds / max(exhaustive_s, 1e-9):.0f} %) | "
                     f"{res.stop_reason.name.lower()} |")
    lines += ["", f"All shapes: {spent:.2f} of {total:.2f} GPU-s ({100 * spent / max(total, 1e-9):.0f} %)."]
    return lines


def _value(row: dict) -> float:
    """Lower is better: the paired 1/speedup when the row has one, else the latency."""
    sp = row.get("speedup")
    return 1.0 / sp if isinstance(sp, (int, float)) and sp > 0 else float(row.get("latency_us") or math.inf)


def _live_search(summary_paths: list[Path], search_jsonls: list[Path], exhaustive: list[Path]) -> list[str]:
    """``kernaudit bench --search`` on the GPU against the exhaustive sweep of the same space:
    the pick's value in the exhaustive sweep over that sweep's best (one run, so one clock),
    and the GPU-seconds (checks + timing loops of every row, references included) of each.
    Several searches (one device call each, say) are read together: rows are matched to a
    summary by kernel and shape."""
    import json

    from kernaudit_pipeline.rank.search import row_gpu_seconds

    summaries = [s for p in summary_paths for s in json.loads(p.read_text())]
    search_rows = [json.loads(line) for p in search_jsonls for line in p.read_text().splitlines() if line.strip()]
    full = [json.loads(line) for p in exhaustive for line in p.read_text().splitlines() if line.strip()]
    lines = ["| kernel | shape | measured / candidates | pick | pick in the exhaustive sweep / its best | "
             "pick's own paired speedup | GPU-s search / exhaustive | stop |", "|---|---|---|---|---|---|---|---|"]
    spent = total = 0.0
    for s in summaries:
        k, shape = s["kernel_name"], s["shape_name"]
        ex = [r for r in full if r.get("kernel_name") == k and r.get("shape_name") == shape
              and r.get("record_type") in ("run", "baseline")]
        timed = {r["config_id"]: r for r in ex if r.get("record_type") == "run" and r.get("run_status") == "OK"}
        mine = [r for r in search_rows if r.get("kernel_name") == k and r.get("shape_name") == shape
                and r.get("record_type") in ("run", "baseline")]
        ex_s = sum(row_gpu_seconds(r) for r in ex)
        # a two-rung search's --out keeps one row per config; its summary counts every row
        # either rung wrote (the screening rows of the confirmed configs too)
        se_s = float(s["gpu_seconds"]) if isinstance(s.get("gpu_seconds"), (int, float)) \
            else sum(row_gpu_seconds(r) for r in mine)
        if s.get("measured"):  # a bucket the search never reached adds nothing to either total
            spent, total = spent + se_s, total + ex_s
        best = min((_value(r) for r in timed.values()), default=math.inf)
        pick = s.get("best_config_id")
        ratio = _value(timed[pick]) / best if pick in timed else math.nan
        confirmed = len(s.get("confirmed_config_ids") or [])
        lines.append(f"| {k} | {shape} | {s['measured']} / {s['candidates']}"
                     + (f" ({confirmed} confirmed)" if confirmed else "") + f" | `{pick}` | {_fmt(ratio)}× | "
                     f"{_fmt(s.get('best_speedup') or math.nan)}× | {se_s:.1f} / {ex_s:.1f} "
                     f"({100 * se_s / max(ex_s, 1e-9):.0f} %) | {s['stop_reason'].lower()} |")
    lines += ["", f"All shapes searched: {spent:.1f} of {total:.1f} GPU-s ({100 * spent / max(total, 1e-9):.0f} %)."]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweeps", nargs="+", type=Path, default=DEFAULT_SWEEPS,
                        help="runner JSONL files to calibrate and score on")
    parser.add_argument("--kernels", nargs="+", default=CALIBRATION_KERNELS,
                        help="kernels/ stems to calibrate on (leave-one-kernel-out over these)")
    parser.add_argument("--held-out", nargs="*", default=HELD_OUT_KERNELS,
                        help="kernels never fitted on; scored when a sweep of them is given")
    parser.add_argument("--write-calibration", action="store_true",
                        help="rewrite kernaudit_pipeline/rank/calibration.json")
    parser.add_argument("--out", type=Path, default=None, help="also write the report here")
    parser.add_argument("--jobs", type=int, default=None, help="parallel compile workers")
    parser.add_argument("--search-summary", nargs="+", type=Path, default=[],
                        help="the --search-summary JSON of kernaudit bench --search runs, to compare "
                             "with the exhaustive sweep(s) of the held-out kernels in --sweeps")
    parser.add_argument("--search-run", nargs="+", type=Path, default=[],
                        help="the JSONL files those kernaudit bench --search runs wrote (with --search-summary)")
    parser.add_argument("--search-fixed-order", action="store_true",
                        help="replay the search in the model's order as ranked (no corrections)")
    args = parser.parse_args(argv)
    import tempfile
    scratch = tempfile.TemporaryDirectory(prefix="rank-validate-")
    args.sweeps = [_plain(p, Path(scratch.name)) for p in args.sweeps]
    args.search_run = [_plain(p, Path(scratch.name)) for p in args.search_run]

    from kernaudit_pipeline.core.hardware import lookup
    from kernaudit_pipeline.rank import fit
    from kernaudit_pipeline.rank.model import CALIBRATION_FILE
    from kernaudit_pipeline.rank.ranking import DEFAULT_DEVICE, space_features

    measurements = fit.load_measurements(args.sweeps)
    stems = list(dict.fromkeys([*args.kernels, *args.held_out]))
    default = lookup(DEFAULT_DEVICE).name
    features = {}  # per GPU the sweeps ran on: SM count, bandwidth and peaks differ
    for device in sorted({fit.device_of(m, default) for m in measurements} | {default}):
        features[device], report = space_features(stems, device_name=device, max_workers=args.jobs)
    for failure in report.failures:
        print(f"rank_validate: {failure.module}: {failure.reason}", file=sys.stderr)
    names = {d.stem: d.name for d in report.descriptions}
    calib_names = [names[k] for k in fitted_kernels(args.kernels, args.held_out) if k in names]
    held_names = [names[k] for k in args.held_out if k in names]
    samples = fit.samples_for(measurements, features, default)
    train = [s for s in samples if s.features.kernel_name in calib_names]
    held = [s for s in samples if s.features.kernel_name in held_names]
    print(f"{len(measurements)} timed rows; {len(train)} scored on {len(calib_names)} calibration kernels, "
          f"{len(held)} on held-out kernels", file=sys.stderr)

    loko = fit.leave_one_kernel_out(train, measurements, calib_names)
    calibration = fit.calibrate(train, calib_names, loko)
    lines = ["### Leave-one-kernel-out (each kernel scored with a model fitted on the others)", ""]
    all_scores = [s for r in loko for s in r.scores]
    lines += _table(all_scores, "held-out kernel")
    lines += ["", "| held-out kernel | within-shape error (90 % of configs) | worst top-1 | worst best-of-top-5 |",
              "|---|---|---|---|"]
    for r in loko:
        lines.append(f"| {r.held_out} | ±{100 * r.error:.1f} % | {_fmt(max((s.top1 for s in r.scores), default=math.nan))}× | "
                     f"{_fmt(max((s.top5 for s in r.scores), default=math.nan))}× |")
    if all_scores:
        lines += ["", f"Over all {len(all_scores)} held-out shapes: median top-1 {_fmt(statistics.median(s.top1 for s in all_scores))}×, "
                      f"median best-of-top-5 {_fmt(statistics.median(s.top5 for s in all_scores))}×, "
                      f"shapes meeting top-1 ≤ 1.10×: {sum(s.top1 <= 1.10 for s in all_scores)}/{len(all_scores)}, "
                      f"best-of-top-5 ≤ 1.02×: {sum(s.top5 <= 1.02 for s in all_scores)}/{len(all_scores)}; "
                      f"'largest tile, most warps' median {_fmt(statistics.median(s.largest_tile for s in all_scores))}×, "
                      f"'max occupancy' median {_fmt(statistics.median(s.max_occupancy for s in all_scores))}×."]
    rows_by_group = _rows_by_group(args.sweeps)
    lines += ["", "### Search replayed on the recorded sweeps (each kernel ranked by its LOKO model)", ""]
    for r in loko:
        kernel_samples = [s for s in train if s.features.kernel_name == r.held_out]
        lines += _search_replay(r.params, calibration.stated_error, kernel_samples, rows_by_group,
                                r.held_out, not args.search_fixed_order) + [""]
    if held:
        scores = fit.score(calibration.params, held, measurements)
        lines += ["", f"### Held-out kernel(s) never fitted on: {', '.join(held_names)}", ""]
        lines += _table(scores, "kernel")
        lines += ["", f"Within-shape error on the held-out kernel(s): ±{100 * fit.within_shape_error(calibration.params, held):.1f} %.",
                  "", "Search replayed on the held-out sweep:", ""]
        lines += _search_replay(calibration.params, calibration.stated_error, held, rows_by_group, "kernel",
                                not args.search_fixed_order)
    if args.search_summary and args.search_run:
        held_files = [p for p in args.sweeps if any(g[2] == p.name and g[0] in held_names for g in rows_by_group)]
        lines += ["", "### kernaudit bench --search on the GPU against the exhaustive sweep", ""]
        lines += _live_search(args.search_summary, args.search_run, held_files or args.sweeps)
    lines += ["", f"Shipped calibration: fitted on {', '.join(calib_names)}; stated error ±{100 * calibration.stated_error:.1f} % "
                  "(the worst LOKO within-shape error).", "",
              "Parameters: " + ", ".join(f"{k}={v:.4g}" for k, v in calibration.params.to_dict().items())]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    if args.write_calibration:
        CALIBRATION_FILE.write_text(calibration.to_json())
        print(f"wrote {CALIBRATION_FILE.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
