#!/usr/bin/env python3
"""Experiment (issue 15; not shipped): should the first five of a ranking be distinct tiles?

At bias_gelu_gemm M=1024 and M=4096 the model's first five were one tile (128 x 256, 8 warps)
with five GROUP_M / num_stages choices, so one wrong tile decision cost all five (best-of-top-5
1.255x and 1.277x). A top five that takes the best-predicted config of each distinct tile
(BLOCK_M, BLOCK_N, BLOCK_K, num_warps) first would have hedged that bet, but that was read off
the kernel it would fix. This scores the idea the way ``rank_validate.py`` scores the model:
each kernel left out in turn, fitted on the others, on every committed sweep, for the plain
order, the distinct-tile order and two hybrids (``ORDERS``) side by side.

    PYTHONPATH=. .venv/bin/python scripts/rank_distinct_top5.py

CPU only; needs the static audit of every kernel (cached under the data folder). Prints a
Markdown table.
"""

from __future__ import annotations

import math
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))


def _tile(f) -> tuple:
    """What the distinct-tile order keeps apart; kernels without block sizes use the config."""
    if f.block_m is None and f.block_n is None:
        return tuple(sorted((k, v) for k, v in f.config.items() if k not in ("num_stages", "GROUP_M")))
    return (f.block_m, f.block_n, f.block_k, f.num_warps)


def distinct_first(order: list, keep: int = 0) -> list:
    """``order`` with its first ``keep`` configs as predicted, then the best-predicted config
    of each tile not yet among them (in predicted order), then the rest as predicted."""
    seen = {_tile(s.features) for s in order[:keep]}
    head, tail = list(order[:keep]), []
    for s in order[keep:]:
        key = _tile(s.features)
        (tail if key in seen else head).append(s)
        seen.add(key)
    return head + tail


# The orders scored: the model's, distinct tiles from the first pick on, and two hybrids that
# keep the model's first two or three and spread only the rest of the five over other tiles.
ORDERS = {"model's order": None, "distinct tiles first": 0,
          "model's first 2, then distinct tiles": 2, "model's first 3, then distinct tiles": 3}


def main() -> int:
    import rank_validate as rv
    from kernaudit_pipeline.core.hardware import lookup
    from kernaudit_pipeline.rank import fit
    from kernaudit_pipeline.rank.model import predict
    from kernaudit_pipeline.rank.ranking import DEFAULT_DEVICE, space_features

    scratch = Path(tempfile.mkdtemp(prefix="rank-distinct-"))
    measurements = fit.load_measurements([rv._plain(p, scratch) for p in rv.DEFAULT_SWEEPS])
    default = lookup(DEFAULT_DEVICE).name
    features, names = {}, {}
    for device in sorted({fit.device_of(m, default) for m in measurements} | {default}):
        features[device], report = space_features(rv.CALIBRATION_KERNELS, device_name=device)
        names.update({d.stem: d.name for d in report.descriptions})
    samples = fit.samples_for(measurements, features, default)
    best_any: dict[tuple, float] = defaultdict(lambda: math.inf)
    for m in measurements:
        best_any[m.group] = min(best_any[m.group], m.value)
    rows: dict[str, list[tuple]] = {name: [] for name in ORDERS}
    per_shape = []
    kernels = [names[stem] for stem in rv.CALIBRATION_KERNELS]
    for result in fit.leave_one_kernel_out(samples, measurements, kernels):
        held, params = result.held_out, result.params
        groups: dict[tuple, list] = defaultdict(list)
        for s in samples:
            if s.features.kernel_name == held:
                groups[s.group].append(s)
        for g, group in sorted(groups.items()):
            kept = [s for s in group if s.features.spill_bytes < fit.HEAVY_SPILL_BYTES]
            if not kept:
                continue
            best = min(best_any[g], min(s.measured_us for s in group))
            order = sorted(kept, key=lambda s: (predict(s.features, params).total_s, s.features.config_id))
            scores = []
            for name, keep in ORDERS.items():
                ranked = order if keep is None else distinct_first(order, keep)
                scores.append((ranked[0].measured_us / best, min(s.measured_us for s in ranked[:5]) / best))
                rows[name].append(scores[-1])
            per_shape.append((held, g[1], [t5 for _, t5 in scores]))
    print("| first five (each kernel left out in turn) | shapes | top-1 ≤ 1.10× | best-of-top-5 ≤ 1.02× | "
          "median best-of-top-5 | worst best-of-top-5 |")
    print("|---|---|---|---|---|---|")
    for name, scores in rows.items():
        print(f"| {name} | {len(scores)} | {sum(t1 <= 1.10 for t1, _ in scores)} | "
              f"{sum(t5 <= 1.02 for _, t5 in scores)} | {statistics.median(t5 for _, t5 in scores):.3f}× | "
              f"{max(t5 for _, t5 in scores):.3f}× |")
    print("\n| kernel | shape | best-of-top-5: " + " | ".join(ORDERS) + " |\n|---|---|" + "---|" * len(ORDERS))
    for kernel, shape, t5s in per_shape:
        if max(t5s) - min(t5s) > 5e-4:
            print(f"| {kernel} | {shape} | " + " | ".join(f"{t:.3f}×" for t in t5s) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
