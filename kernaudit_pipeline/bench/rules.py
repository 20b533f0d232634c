"""When the runner stops sampling: the two rules and their defaults, the one home of both.

Standard library only, so the options and the CLI that read these defaults stay light (the
statistics that apply the rules, ``stats`` and ``paired``, need numpy).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StopRule:
    """When to stop adding samples; ``rsd_target`` is a fraction (0.01 = 1 %)."""

    rsd_target: float = 0.01
    min_samples: int = 10
    max_seconds: float = 1.0
    max_samples: int = 5000


@dataclass(frozen=True)
class PairedRule:
    """How many pairs and blocks to take for one config.

    ``block_s`` sizes a block (pairs = block_s / time of one pair, within
    [min_pairs, max_pairs]); sampling stops after ``min_blocks`` and ``min_time_s`` of timed
    GPU time once the robust standard error of the block log-speedups
    (``paired.robust_block_se``) is at most ``rsd_target``, or at ``max_blocks`` /
    ``max_seconds``."""

    min_blocks: int = 6
    max_blocks: int = 40
    min_pairs: int = 4
    max_pairs: int = 64
    block_s: float = 0.015
    min_time_s: float = 0.1
    max_seconds: float = 1.5
    rsd_target: float = 0.004
