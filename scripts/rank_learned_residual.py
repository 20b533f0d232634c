#!/usr/bin/env python3
"""Experiment (issue 15; not shipped): does a learned correction on top of the physical cost
model rank held-out kernels better?

For each kernel with a committed sweep, leave it out: fit the physical model on the others
(``rank.fit.fit``), then train a regressor on the others' remaining log residuals (centred per
group, near-best rows weighted up, each group weighted equally) from dimensionless features
(tile sizes, warps, stages, resident blocks, registers, spills, occupancy, waves and tail, each
term's share of the predicted time, loop instructions per MMA, memory- vs compute-bound), and
rank the left-out kernel by prediction x exp(correction). Scored like ``rank_validate.py``:
top-1 and best-of-top-5 over the exhaustive best of each measured group.

    PYTHONPATH=. .venv/bin/python scripts/rank_learned_residual.py [--learner gbr|hgb|ridge ...]

CPU only; needs the static audit of every kernel (cached under the data folder) and
scikit-learn. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

KERNELS = ["gemm", "fp8_gemm", "flash_attention", "paged_decode_attention", "swiglu_gemm",
           "rmsnorm_gemm", "w8a16_gemm", "w4a16_gemm", "fp8_block_gemm"]
NEAR_BEST = 5.0


def _features(f, b) -> list[float]:
    total = b.total_s
    resident = min(f.blocks_per_sm, f.programs_per_sm)
    macs_per_iter = (f.block_m or 1) * (f.block_n or 1) * (f.block_k or 1) / 4096
    return [math.log2(f.block_m or 1), math.log2(f.block_n or 1), math.log2(f.block_k or 1),
            math.log2(f.num_warps), f.num_stages, resident, float(resident == 1),
            f.registers_per_thread / 255, float(f.spill_bytes > 0), float(f.uses_wgmma),
            f.occupancy_pct / 100, f.tail_fraction, math.log(max(f.waves, 1e-3)),
            b.compute_s / total, b.loop_s / total, b.dram_s / total, b.l2_s / total,
            b.critical_s / total, b.issue_s / total, b.overhead_s / total,
            math.log1p(f.loop_instructions * f.num_warps / macs_per_iter) if f.loop_instructions else 0.0,
            float(f.memory_bound), math.log(f.shape_intensity / f.ridge_intensity),
            float(f.wgmma_serialized), float(f.wgmma_waits_injected)]


def _groups(samples):
    by = defaultdict(list)
    for s in samples:
        by[s.group].append(s)
    return {g: v for g, v in sorted(by.items()) if len(v) >= 2}


def _table(params, samples):
    """Rows of (features, centred log residual, weight, group, log prediction)."""
    from kernaudit_pipeline.rank.model import predict

    rows = []
    for group, members in _groups(samples).items():
        best = min(s.measured_us for s in members)
        preds = [predict(s.features, params) for s in members]
        logs = [math.log(s.measured_us) - math.log(b.total_s) for s, b in zip(members, preds)]
        weights = [1 / (1 + NEAR_BEST * (s.measured_us / best - 1)) for s in members]
        centre = sum(w * x for w, x in zip(weights, logs)) / sum(weights)
        for s, b, x, w in zip(members, preds, logs, weights):
            rows.append((_features(s.features, b), x - centre, w / len(members), group,
                         math.log(b.total_s), s))
    return rows


def _scores(rows, correction):
    from kernaudit_pipeline.rank.model import HEAVY_SPILL_BYTES

    by = defaultdict(list)
    for row, c in zip(rows, correction):
        by[row[3]].append((row[4] + c, row[5]))
    out = []
    for group, members in sorted(by.items()):
        best = min(s.measured_us for _, s in members)
        kept = sorted(((lp, s) for lp, s in members if s.features.spill_bytes < HEAVY_SPILL_BYTES),
                      key=lambda t: (t[0], t[1].features.config_id))
        out.append((group, kept[0][1].measured_us / best, min(s.measured_us for _, s in kept[:5]) / best))
    return out


def _learner(name: str):
    from sklearn.ensemble import GradientBoostingRegressor, HistGradientBoostingRegressor
    from sklearn.linear_model import Ridge

    if name == "gbr":
        return GradientBoostingRegressor(n_estimators=300, max_depth=3, learning_rate=0.03,
                                         min_samples_leaf=40, subsample=0.8, random_state=0)
    if name == "hgb":
        return HistGradientBoostingRegressor(max_iter=300, max_depth=3, learning_rate=0.03,
                                             min_samples_leaf=40, random_state=0)
    return Ridge(alpha=10.0)


def main(argv: list[str] | None = None) -> int:
    import numpy as np

    import rank_validate as rv
    from kernaudit_pipeline.core.hardware import lookup
    from kernaudit_pipeline.rank import fit
    from kernaudit_pipeline.rank.ranking import DEFAULT_DEVICE, space_features

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learner", nargs="+", default=["gbr", "hgb", "ridge"], choices=["gbr", "hgb", "ridge"])
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="rank-residual-"))
    measurements = fit.load_measurements([rv._plain(p, scratch) for p in rv.DEFAULT_SWEEPS])
    default = lookup(DEFAULT_DEVICE).name
    features = {}
    for device in sorted({fit.device_of(m, default) for m in measurements} | {default}):
        features[device], report = space_features(KERNELS, device_name=device)
        for failure in report.failures:
            print(f"rank_learned_residual: {failure.module}: {failure.reason}", file=sys.stderr)
    samples = fit.samples_for(measurements, features, default)
    names = sorted({s.features.kernel_name for s in samples})
    results: dict[str, list] = {"physical model": [], **{f"+ {n}": [] for n in args.learner}}
    for held in names:
        train = [s for s in samples if s.features.kernel_name != held]
        test = [s for s in samples if s.features.kernel_name == held]
        params = fit.fit(train)
        tr, te = _table(params, train), _table(params, test)
        x_tr = np.array([r[0] for r in tr])
        y_tr = np.array([r[1] for r in tr])
        w_tr = np.array([r[2] for r in tr])
        x_te = np.array([r[0] for r in te])
        results["physical model"] += _scores(te, [0.0] * len(te))
        for name in args.learner:
            mean, std = x_tr.mean(axis=0), x_tr.std(axis=0) + 1e-9
            model = _learner(name)
            model.fit((x_tr - mean) / std, y_tr, sample_weight=w_tr / w_tr.mean())
            results[f"+ {name}"] += _scores(te, list(model.predict((x_te - mean) / std)))
    print("| ranking (each kernel left out in turn) | shapes | top-1 ≤ 1.10× | best-of-top-5 ≤ 1.02× | median top-1 | worst top-1 | worst best-of-top-5 |")
    print("|---|---|---|---|---|---|---|")
    for name, scores in results.items():
        print(f"| {name} | {len(scores)} | {sum(s[1] <= 1.10 for s in scores)} | {sum(s[2] <= 1.02 for s in scores)} | "
              f"{statistics.median(s[1] for s in scores):.3f}× | {max(s[1] for s in scores):.3f}× | {max(s[2] for s in scores):.3f}× |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
