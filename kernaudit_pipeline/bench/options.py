"""The options a sweep runs with; the parent writes them into every worker's spec.

The timing rules' defaults live with the rules (``rules.StopRule``, ``rules.PairedRule``);
the options start from them. Standard library only: the CLI reads these defaults on every start.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kernaudit_pipeline.bench.calibration import BETWEEN_RUN_RSD
from kernaudit_pipeline.bench.clocks import DEFAULT_FRACTION
from kernaudit_pipeline.bench.rules import PairedRule, StopRule

FAKE_DEVICE_ENV = "KERNAUDIT_BENCH_FAKE_DEVICE"  # "cpu": workers use the CPU timing double (tests)


@dataclass(frozen=True)
class BenchOptions:
    # unpaired timing (baseline rows, peaks): nvbench-style RSD rule plus a time cap
    rsd_target: float = StopRule.rsd_target
    min_samples: int = StopRule.min_samples
    max_seconds_per_config: float = StopRule.max_seconds
    # paired timing of each config against the primary reference
    min_blocks: int = PairedRule.min_blocks
    max_blocks: int = PairedRule.max_blocks
    min_pairs: int = PairedRule.min_pairs
    block_s: float = PairedRule.block_s
    min_time_s: float = PairedRule.min_time_s
    speedup_rsd_target: float = PairedRule.rsd_target
    between_run_rsd: float = BETWEEN_RUN_RSD
    clock_fraction: float = DEFAULT_FRACTION
    # small kernels: time replays of a captured CUDA graph (opt-in)
    cuda_graph: bool = False
    cuda_graph_below_us: float = 20.0
    # the other references, timed paired against the best configs of each shape
    references_top_k: int = 2
    probe_backends: bool = True
    # pruning and isolation
    prune: bool = True
    spill_threshold_bytes: int = 0
    timeout_s: float = 180.0
    seed: int = 20240601
    warmup_s: float = 0.02
    device: str = "cuda"

    @property
    def rule(self) -> StopRule:
        return StopRule(rsd_target=self.rsd_target, min_samples=self.min_samples,
                        max_seconds=self.max_seconds_per_config)

    @property
    def paired_rule(self) -> PairedRule:
        return PairedRule(min_blocks=self.min_blocks, max_blocks=self.max_blocks, min_pairs=self.min_pairs,
                          block_s=self.block_s, min_time_s=self.min_time_s,
                          max_seconds=max(self.max_seconds_per_config, self.min_time_s) * 2,
                          rsd_target=self.speedup_rsd_target)


# ``--quick``: the timing a smoke run uses where the user set nothing else.
QUICK = BenchOptions(min_samples=5, max_seconds_per_config=0.25, min_blocks=3, min_time_s=0.02)

# ``bench --search``'s screening rung: GPU time per config of the short paired timings that
# order the walk down the predicted ranking (the contenders are then re-measured with the
# sweep's own options).
SCREEN_TIME_S = 0.01
# The screening rung's block cap: with the sweep's block length it bounds a screening timing,
# whatever --search-screen-time-s asks (6 x 15 ms by default).
SCREEN_MAX_BLOCKS = 6


def screening(options: BenchOptions, time_s: float = SCREEN_TIME_S) -> BenchOptions:
    """``options`` cut to a screening measurement: about ``time_s`` of paired GPU time in 3 to 6
    short blocks of as few as 2 pairs (the block cap, not a time cap, bounds it: the unpaired
    rule that times the reference's own row keeps the sweep's settings), a looser precision
    target, no other references. Its CI is wide but honest (the same block statistics), which
    is what the walk's stop rule and the choice of contenders read."""
    return replace(options, min_time_s=time_s, min_blocks=3, max_blocks=SCREEN_MAX_BLOCKS, min_pairs=2,
                   block_s=min(options.block_s, time_s / 2),
                   speedup_rsd_target=max(options.speedup_rsd_target, 0.01), references_top_k=0)
