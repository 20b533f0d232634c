"""Pick the config before the GPU: a static cost model over the ahead-of-time compile.

- :mod:`.features`: what the model reads per (config, shape): tiles, warps, stages, registers,
  shared memory, occupancy and its limiter, waves and tail on the SM count, per-tile arithmetic
  intensity, L2 reuse from the grouping, and the shape's compute- or memory-boundness;
- :mod:`.model`: a roofline per SM, wave by wave, with a few fitted efficiencies
  (``calibration.json`` holds them and the model's stated error);
- :mod:`.ranking`: compile, drop what cannot win, order the rest (``kernaudit rank``);
- :mod:`.fit`: calibration and leave-one-kernel-out scoring on measured sweeps;
- :mod:`.search`: a measuring plan that spends GPU time only where the ranking is unsure
  (standard library only: it runs on the GPU host);
- :mod:`.frame`: the pipeline's view (``predict_frame``), every number labelled predicted.
"""

from __future__ import annotations
