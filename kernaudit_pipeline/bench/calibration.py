"""Constants the runner's statistics take from measurements, each with where it came from.

No imports: the CLI reads these while building its parser.
"""

from __future__ import annotations

# Relative between-run SD of a paired speedup (log scale) that widens every speedup CI
# (bench/paired.py). Calibrated on the three committed H200 repeats (samples/h200/repeats,
# 2026-12-04) by scripts/analyze_repeats.py: pooled across-run variance minus the within-run
# (bootstrap) part gives 0.33 %; taken as 0.4 % because nearly all of it comes from the one repeat
# in a separate device call (two repeats of one call alone give 0.05 %). docs/benchmarks.md has
# the coverage figures, leave-one-repeat-out and hold-out included.
BETWEEN_RUN_RSD = 0.004
