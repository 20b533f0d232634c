"""Run-to-run spread of the paired speedups against their reported CIs, from repeat captures.

    python scripts/analyze_repeats.py [samples/h200/repeats/*.jsonl] [--json] [--out FILE.md]

Prints (or writes) the per-row table for docs/benchmarks.md and the figures issue 9's "Done
when" asks for: the median run-to-run spread of each config's paired speedup (target <= 1.5 %),
the share of rows whose CI holds the other runs' speedups (target >= 80 %), and the between-run
component calibrated from these repeats (the runner's --between-run-rsd).
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


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="analyze_repeats", description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", type=Path, help="repeat JSONL files (default: samples/h200/repeats/*.jsonl)")
    p.add_argument("--json", action="store_true", help="print the summary figures as JSON only")
    p.add_argument("--out", type=Path, help="write the Markdown table and figures to this file")
    args = p.parse_args(argv)
    files = args.files or sorted((ROOT / "samples" / "h200" / "repeats").glob("*.jsonl"))
    if len(files) < 2:
        print("analyze_repeats: need at least two repeat files", file=sys.stderr)
        return 2
    runs = {}
    for f in files:
        try:
            runs[f.stem] = read_jsonl(f.read_text())
        except (OSError, UnicodeDecodeError) as exc:
            print(f"analyze_repeats: cannot read {f}: {exc}", file=sys.stderr)
            return 2
    rows = repeats.collect(runs)
    if not rows:
        print("analyze_repeats: no config was timed OK, paired, in two or more of the files", file=sys.stderr)
        return 2
    figures = repeats.summary(rows)
    if args.json:
        print(json.dumps(figures, indent=1))
        return 0
    text = (repeats.markdown(rows, list(runs)) + "\n\n"
            + f"- rows: {figures['rows']} (timed OK in at least two of {len(runs)} runs)\n"
            + f"- median run-to-run spread of the paired speedup: {figures['median_spread_pct']:.2f} % "
              f"(p90 {figures['p90_spread_pct']:.2f} %; target <= 1.5 %)\n"
            + f"- median CI half-width: {figures['median_ci_halfwidth_pct']:.2f} %\n"
            + f"- CI holds another run's speedup: {figures['coverage'] * 100:.1f} % of (row, run pair)s "
              f"(target >= 80 %); without the between-run component: "
              f"{figures['coverage_without_between_run'] * 100:.1f} %\n"
            + f"- between-run component calibrated from these repeats: "
              f"{figures['calibrated_between_run_rsd'] * 100:.2f} % (coverage with it: "
              f"{figures['coverage_at_calibrated'] * 100:.1f} %)\n")
    if args.out:
        args.out.write_text(text)
        print(f"wrote {args.out}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
