"""Run-to-run spread of the paired speedups against their reported CIs, from repeat captures.

    python scripts/analyze_repeats.py [samples/h200/repeats/*.jsonl] [--holdout FILE] [--json] [--out FILE.md]

Prints (or writes) the per-row table for docs/benchmarks.md and the figures issue 9's "Done
when" asks for: the median run-to-run spread of each config's paired speedup (target <= 1.5 %),
the share of rows whose CI holds the other runs' speedups (target >= 80 %), and the between-run
component calibrated from these repeats (the runner's --between-run-rsd).

A value calibrated on the repeats and judged on the same repeats flatters itself, so two
out-of-sample figures follow it: leave one repeat out (calibrate on the others, judge only the
comparisons with the one left out), and with ``--holdout`` another capture of the same configs
(for example the main sweep, its own process) judged against the repeats at the calibrated value.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernaudit_pipeline.bench import repeats  # noqa: E402
from kernaudit_pipeline.bench.records import read_jsonl  # noqa: E402


def _read(path: Path) -> list[dict]:
    try:
        return read_jsonl(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise SystemExit(f"analyze_repeats: cannot read {path}: {str(exc).splitlines()[0] if str(exc) else exc}")


def _figures(rows, holdout_name: str | None, holdout_rows: list[dict] | None, at: float | None = None) -> dict:
    figures = repeats.summary(rows)
    folds = repeats.leave_one_run_out(rows)
    figures["leave_one_run_out"] = [
        {"held_out": f.held_out, "calibrated_on": list(f.calibrated_on), "between_run_rsd": f.between_run_rsd,
         "coverage": f.coverage, "comparisons": f.comparisons} for f in folds]
    hits = sum(f.hits for f in folds)
    total = sum(f.comparisons for f in folds)
    figures["leave_one_run_out_coverage"] = hits / total if total else None
    if holdout_rows is not None:
        cal = figures["calibrated_between_run_rsd"]
        fold = repeats.holdout(rows, holdout_name, holdout_rows, cal)
        figures["holdout"] = {"name": holdout_name, "between_run_rsd": cal, "coverage": fold.coverage,
                              "comparisons": fold.comparisons}
    if at is not None:
        figures["at"] = {"between_run_rsd": at, "coverage": repeats.coverage_at(rows, at),
                         "coverage_of_median_of_others": repeats.coverage_of_median_at(rows, at)}
        if holdout_rows is not None:
            figures["at"]["holdout_coverage"] = repeats.holdout(rows, holdout_name, holdout_rows, at).coverage
    return figures


def _text(rows, runs: list[str], fig: dict) -> str:
    lines = [repeats.markdown(rows, runs), "",
             f"- rows: {fig['rows']} (timed OK in at least two of {len(runs)} runs)",
             f"- median run-to-run spread of the paired speedup: {fig['median_spread_pct']:.2f} % "
             f"(p90 {fig['p90_spread_pct']:.2f} %; target <= 1.5 %)",
             f"- median CI half-width: {fig['median_ci_halfwidth_pct']:.2f} %"
             + (f" (CIs as recorded, widened by {fig['recorded_between_run_rsd'] * 100:.2f} %)"
                if fig.get("recorded_between_run_rsd") is not None else ""),
             f"- CI holds another run's speedup: {fig['coverage'] * 100:.1f} % of (row, run pair)s "
             f"(target >= 80 %); without the between-run component: "
             f"{fig['coverage_without_between_run'] * 100:.1f} %",
             f"- CI holds the median of the other runs: {fig['coverage_of_median_of_others'] * 100:.1f} % of (row, run)s",
             f"- between-run component calibrated on these repeats: "
             f"{fig['calibrated_between_run_rsd'] * 100:.2f} % (in-sample coverage with it: "
             f"{fig['coverage_at_calibrated'] * 100:.1f} %)"]
    for f in fig["leave_one_run_out"]:
        lines.append(f"- leave {f['held_out']} out: calibrated on {', '.join(f['calibrated_on'])} "
                     f"{f['between_run_rsd'] * 100:.2f} %, coverage of the comparisons with {f['held_out']} "
                     f"{f['coverage'] * 100:.1f} % ({f['comparisons']})")
    if fig.get("leave_one_run_out_coverage") is not None:
        lines.append(f"- leave-one-repeat-out coverage, pooled: {fig['leave_one_run_out_coverage'] * 100:.1f} %")
    if "holdout" in fig:
        h = fig["holdout"]
        lines.append(f"- hold-out capture {h['name']} against the repeats at {h['between_run_rsd'] * 100:.2f} %: "
                     f"coverage {h['coverage'] * 100:.1f} % ({h['comparisons']} comparisons)")
    if "at" in fig:
        a = fig["at"]
        lines.append(f"- every CI widened by {a['between_run_rsd'] * 100:.2f} % instead: holds another run's speedup "
                     f"{a['coverage'] * 100:.1f} %, the median of the others {a['coverage_of_median_of_others'] * 100:.1f} %"
                     + (f", hold-out {a['holdout_coverage'] * 100:.1f} %" if a.get("holdout_coverage") is not None else ""))
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="analyze_repeats", description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", type=Path, help="repeat JSONL files (default: samples/h200/repeats/*.jsonl)")
    p.add_argument("--holdout", type=Path,
                   help="another capture of the same configs to judge at the calibrated value (e.g. the main sweep)")
    p.add_argument("--at", type=float, metavar="RSD",
                   help="also judge every CI widened by this between-run value (e.g. the runner's default)")
    p.add_argument("--json", action="store_true", help="print the summary figures as JSON only")
    p.add_argument("--out", type=Path, help="write the Markdown table and figures to this file")
    args = p.parse_args(argv)
    files = args.files or sorted((ROOT / "samples" / "h200" / "repeats").glob("*.jsonl"))
    if len(files) < 2:
        print("analyze_repeats: need at least two repeat files", file=sys.stderr)
        return 2
    try:
        runs = {f.stem: _read(f) for f in files}
        held = _read(args.holdout) if args.holdout else None
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    rows = repeats.collect(runs)
    if not rows:
        print("analyze_repeats: no config was timed OK, paired, in two or more of the files", file=sys.stderr)
        return 2
    if args.at is not None and not 0 <= args.at < 1:
        print("analyze_repeats: --at must be a fraction in [0, 1)", file=sys.stderr)
        return 2
    figures = _figures(rows, args.holdout.stem if args.holdout else None, held, args.at)
    if args.json:
        print(json.dumps(figures, indent=1))
        return 0
    text = _text(rows, list(runs), figures)
    if args.out:
        args.out.write_text(text)
        print(f"wrote {args.out}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
