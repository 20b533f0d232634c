"""Check the decision engine on a sweep it was not tuned on (issue 10, "Done when").

    PYTHONPATH=. python scripts/check_decisions.py SWEEP.jsonl [MORE ...] [--json] [--noise-band 0.02]

Reads any files ``kernaudit ingest`` reads (a runner JSONL sweep, typically), runs them through
normalize -> comparisons -> diagnostics -> the recommendations stage (no compiles, no Claude), and
checks per (kernel, shape, device) group, against figures recomputed here from the rows rather
than taken from the ranking module:

- the group has exactly one decision;
- its config is within 1.02x of the fastest measured correct config (by median speedup when
  every timed row has one, paired when the runner timed it so, else by median latency; the
  latency ratio to the lowest latency is printed beside it);
- it is KEEP_BASELINE wherever the best correct Triton config is clearly slower than the
  baseline (its interval entirely below 1 - the decision band);
- the review queue holds at most two items for it, and at most one config change.

Prints one line per group and a summary; ``--json`` prints the same as JSON. Exit 0 when every
check holds, 1 when one fails, 2 on bad input. Writes nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from statistics import median

WITHIN = 1.02


def _rows(paths: list[Path]):
    from kernaudit_pipeline import kernel_runs
    from kernaudit_pipeline.ingest import ingest_paths

    result = ingest_paths(paths)
    checked = kernel_runs.normalize(result.rows)  # a frame of kernel_runs columns
    return checked.kernel_runs, len(result.quarantine) + len(checked.quarantine), list(result.peaks)


def _finite(v) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def check(paths: list[Path], noise_band: float) -> dict:
    from kernaudit_pipeline import spill_diagnostics
    from kernaudit_pipeline.comparisons import TIMED_STATUSES, build_comparisons
    from kernaudit_pipeline.core.configs import group_key
    from kernaudit_pipeline.recommendations import stage
    from kernaudit_pipeline.recommendations.advisor import AdvisorSettings
    from kernaudit_pipeline.recommendations.ranking import UNPAIRED_NOISE_BAND
    from kernaudit_pipeline.recommendations.verify import VerifySettings

    runs, quarantined, peaks = _rows(paths)
    frame = spill_diagnostics.diagnose(build_comparisons(runs, noise_band), peaks=peaks)
    result = stage.run(frame, verify_settings=VerifySettings(max_compiles=0, noise_band=noise_band),
                       advisor_settings=AdvisorSettings(enabled=False), noise_band=noise_band)

    # recomputed from the rows: per group, per config, the median speedup / latency of correct timed rows
    configs: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for _, row in frame.iterrows():
        if str(row.get("status")) not in TIMED_STATUSES:
            continue
        cid = str(row.get("config_id"))
        entry = configs[group_key(row)].setdefault(cid, {"speedup": [], "lo": [], "hi": [], "lat": [], "paired": True})
        entry["lat"].append(float(row["latency_us"]))
        for key, col in (("speedup", "speedup"), ("lo", "speedup_ci_low"), ("hi", "speedup_ci_high")):
            v = _finite(row.get(col))
            if v is not None:
                entry[key].append(v)
        entry["paired"] &= str(row.get("speedup_source")) == "paired"

    decisions = defaultdict(list)
    for d in result.decisions:
        decisions[(d.kernel_name, d.shape_name, d.device_name)].append(d)
    queue = defaultdict(list)
    for r in result.recommendations:
        queue[(r.kernel_name, r.shape_name, r.device_name)].append(r)

    groups = []
    for key in sorted(set(decisions) | set(configs), key=lambda k: tuple(map(str, k))):
        ds, items, cfgs = decisions.get(key, []), queue.get(key, []), configs.get(key, {})
        problems = []
        if len(ds) != 1:
            problems.append(f"{len(ds)} decisions")
        d = ds[0] if ds else None
        by_speedup = bool(cfgs) and all(c["speedup"] for c in cfgs.values())
        ratio = lat_ratio = None
        clearly_slower = False
        if cfgs and d is not None and d.config_id is not None:
            lat = {cid: median(c["lat"]) for cid, c in cfgs.items()}
            lat_ratio = lat[d.config_id] / min(lat.values()) if d.config_id in lat else None
            if by_speedup:
                best = {cid: median(c["speedup"]) for cid, c in cfgs.items()}
                fastest = max(best.values())
                ratio = fastest / best[d.config_id] if d.config_id in best else None
                top = max(cfgs.values(), key=lambda c: median(c["speedup"]))
                band = noise_band if top["paired"] else max(noise_band, UNPAIRED_NOISE_BAND)
                hi = max(top["hi"]) if len(top["hi"]) == len(top["speedup"]) else median(top["speedup"])
                clearly_slower = hi < 1.0 - band
            else:
                ratio = lat_ratio
            if ratio is None:
                problems.append(f"decided config {d.config_id} is not a correct timed config")
            elif ratio > WITHIN + 1e-9:
                problems.append(f"decided config is {ratio:.3f}x off the fastest")
        elif cfgs:
            problems.append("timed correct configs exist but no config was decided")
        if clearly_slower and (d is None or str(d.decision) != "KEEP_BASELINE"):
            problems.append("the best config is clearly slower but the decision is not KEEP_BASELINE")
        changes = sum(1 for r in items if r.new_config)
        if len(items) > 2 or changes > 1:
            problems.append(f"queue holds {len(items)} item(s), {changes} config change(s)")
        groups.append({
            "kernel_name": key[0], "shape_name": key[1], "device_name": key[2],
            "decision": None if d is None else str(d.decision), "config_id": None if d is None else d.config_id,
            "speedup": None if d is None else d.speedup, "data_kind": None if d is None else str(d.data_kind),
            "off_fastest": ratio, "latency_vs_fastest": lat_ratio, "clearly_slower": clearly_slower, "queue": len(items), "config_changes": changes,
            "ok": not problems, "problems": problems,
        })
    return {"files": [str(p) for p in paths], "rows": len(frame), "quarantined": quarantined,
            "groups": groups, "failed": sum(not g["ok"] for g in groups), "queue": len(result.recommendations)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="sweep files (runner JSONL or any ingestible file)")
    parser.add_argument("--noise-band", type=float, default=0.02, help="noise band of paired speedups (default 0.02)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.paths if not p.is_file()]
    if missing:
        print(f"check_decisions: not a file: {', '.join(missing)}", file=sys.stderr)
        return 2
    from kernaudit_pipeline.ingest import IngestError

    try:
        report = check(args.paths, args.noise_band)
    except IngestError as exc:
        print(f"check_decisions: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        for g in report["groups"]:
            off = "-" if g["off_fastest"] is None else f"{g['off_fastest']:.3f}x"
            if g["latency_vs_fastest"] is not None and g["latency_vs_fastest"] != g["off_fastest"]:
                off += f" (latency {g['latency_vs_fastest']:.3f}x the lowest)"
            speed = "-" if g["speedup"] is None else f"{g['speedup']:.3f}x"
            print(f"{'ok  ' if g['ok'] else 'FAIL'} {g['kernel_name']} / {g['shape_name']} / {g['device_name']}: "
                  f"{g['decision']} {g['config_id'] or '-'} at {speed} ({g['data_kind']}), off fastest {off}, "
                  f"clearly slower {g['clearly_slower']}, queue {g['queue']}"
                  + (f" -- {'; '.join(g['problems'])}" if g["problems"] else ""))
        print(f"{len(report['groups'])} group(s), {report['failed']} failed; {report['rows']} rows "
              f"({report['quarantined']} quarantined); review queue {report['queue']} item(s)")
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
