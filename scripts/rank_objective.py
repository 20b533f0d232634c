#!/usr/bin/env python3
"""Experiment (issue 15; not shipped unless it wins): does the fit's objective decide the pick?

The shipped fit is least squares on group-centred log residuals, each config weighted
1 / (1 + 5 (t / t_best - 1)): it asks the model for every config's time, while a ranking is
scored only on its first pick and first five. This refits the same model under other
objectives (``OBJECTIVES``) and scores each the way ``rank_validate.py`` does: every kernel
left out in turn, fitted on the others, on every committed sweep; then the held-out kernel
(``rank_validate.HELD_OUT_KERNELS``) with the fit on all the others.

    PYTHONPATH=. .venv/bin/python scripts/rank_objective.py [--kernels STEM ...] [--held-out STEM ...]

CPU only; needs the static audit of every kernel (cached under the data folder). Prints a
Markdown table.
"""

from __future__ import annotations

import functools
import math
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

TAU_PRED = 0.05    # log-time scale on which the model's order is softened (5 %)
TAU_TRUE = 0.02    # the same for the measured order: configs within ~2 % of the best share the label


def listwise(params, samples, weight: float = 1.0) -> list[float]:
    """One residual per group: sqrt(KL(measured soft-best || predicted soft-best)). The target
    spreads over configs within a few percent of the measured best; the prediction is a softmax
    over the model's negative log times. Zero when the model puts its mass on the measured best
    configs, whatever it says about the rest."""
    from kernaudit_pipeline.rank import fit
    from kernaudit_pipeline.rank.model import predict

    out = []
    for group in fit._groups(samples).values():
        lt = [math.log(s.measured_us) for s in group]
        lp = [math.log(predict(s.features, params).total_s) for s in group]
        t0, p0 = min(lt), min(lp)
        target = [math.exp(-(x - t0) / TAU_TRUE) for x in lt]
        zt = sum(target)
        target = [x / zt for x in target]
        logits = [-(x - p0) / TAU_PRED for x in lp]
        lz = math.log(sum(math.exp(x) for x in logits))
        kl = sum(q * (math.log(q) - (x - lz)) for q, x in zip(target, logits) if q > 1e-12)
        out.append(math.sqrt(weight * max(kl, 0.0)))
    return out


def combined(params, samples) -> list[float]:
    from kernaudit_pipeline.rank import fit

    return fit.residuals(params, samples) + listwise(params, samples, weight=1.0)


def objectives():
    from kernaudit_pipeline.rank import fit

    return {"shipped: log residuals, near-best weight 5": fit.residuals,
            "log residuals, near-best weight 20": functools.partial(fit.residuals, near_best=20.0),
            "listwise (soft best, KL)": listwise,
            "log residuals + listwise": combined}


def main() -> int:
    import argparse

    import rank_validate as rv

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", nargs="+", default=rv.CALIBRATION_KERNELS,
                        help="the kernels left out in turn (module stems)")
    parser.add_argument("--held-out", nargs="*", default=rv.HELD_OUT_KERNELS,
                        help="kernels never fitted on, scored with the fit on --kernels")
    args = parser.parse_args()
    from kernaudit_pipeline.core.hardware import lookup
    from kernaudit_pipeline.rank import fit
    from kernaudit_pipeline.rank.ranking import DEFAULT_DEVICE, space_features

    scratch = Path(tempfile.mkdtemp(prefix="rank-objective-"))
    measurements = fit.load_measurements([rv._plain(p, scratch) for p in rv.DEFAULT_SWEEPS])
    default = lookup(DEFAULT_DEVICE).name
    stems = list(dict.fromkeys([*args.kernels, *args.held_out]))
    features, names = {}, {}
    for device in sorted({fit.device_of(m, default) for m in measurements} | {default}):
        features[device], report = space_features(stems, device_name=device)
        names.update({d.stem: d.name for d in report.descriptions})
    samples = fit.samples_for(measurements, features, default)
    held = [names[s] for s in args.held_out if s in names]
    kernels = [names[s] for s in rv.fitted_kernels(args.kernels, args.held_out) if s in names]
    calib = [s for s in samples if s.features.kernel_name in kernels]
    summary, per_shape = [], defaultdict(dict)
    for label, objective in objectives().items():
        t0 = time.monotonic()
        loko = fit.leave_one_kernel_out(calib, measurements, kernels, objective=objective)
        scores = [g for r in loko for g in r.scores]
        full = fit.fit(calib, objective=objective)
        held_scores = fit.score(full, [s for s in samples if s.features.kernel_name in held], measurements)
        for g in scores + held_scores:
            per_shape[(g.kernel_name, g.shape_name, g.source)][label] = (g.top1, g.top5)
        summary.append((label, scores, held_scores, max(r.error for r in loko), time.monotonic() - t0))
        print(f"{label}: done in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    print("| objective | LOKO shapes | top-1 ≤ 1.10× | best-of-top-5 ≤ 1.02× | median top-1 | "
          "worst top-1 | held-out top-1 ≤ 1.10× | held-out best-of-top-5 ≤ 1.02× | stated error |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, scores, held_scores, err, _ in summary:
        print(f"| {label} | {len(scores)} | {sum(g.top1 <= 1.10 for g in scores)} | "
              f"{sum(g.top5 <= 1.02 for g in scores)} | {statistics.median(g.top1 for g in scores):.3f}× | "
              f"{max(g.top1 for g in scores):.3f}× | {sum(g.top1 <= 1.10 for g in held_scores)} of "
              f"{len(held_scores)} | {sum(g.top5 <= 1.02 for g in held_scores)} of {len(held_scores)} | "
              f"±{100 * err:.1f} % |")
    labels = [s[0] for s in summary]
    print("\n| kernel | shape | run | " + " | ".join(f"{x}: top-1 / top-5" for x in labels) + " |")
    print("|---|---|---|" + "---|" * len(labels))
    for (kernel, shape, source), by in sorted(per_shape.items()):
        cells = [by.get(x) for x in labels]
        print(f"| {kernel} | {shape} | {source} | "
              + " | ".join(f"{c[0]:.3f}× / {c[1]:.3f}×" if c else "–" for c in cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
