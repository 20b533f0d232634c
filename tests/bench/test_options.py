"""How `kernaudit bench`'s arguments become the sweep's options: one home for each default,
--quick only where the user set nothing, and bad values refused in one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kernaudit_pipeline.bench.options import QUICK, BenchOptions
from kernaudit_pipeline.bench.paired import PairedRule
from kernaudit_pipeline.bench.runner import BenchError, options_from
from kernaudit_pipeline.bench.stats import StopRule
from kernaudit_pipeline.cli import build_parser


def _options(*argv: str) -> BenchOptions:
    return options_from(build_parser().parse_args(["bench", *argv]))


def test_the_defaults_are_the_timing_rules_own():
    o = _options()
    assert o == BenchOptions()
    assert (o.min_blocks, o.min_time_s, o.speedup_rsd_target) == \
        (PairedRule.min_blocks, PairedRule.min_time_s, PairedRule.rsd_target)
    assert (o.rsd_target, o.min_samples, o.max_seconds_per_config) == \
        (StopRule.rsd_target, StopRule.min_samples, StopRule.max_seconds)


def test_quick_fills_only_what_the_user_left_unset():
    o = _options("--quick")
    assert (o.min_samples, o.max_seconds_per_config, o.min_blocks, o.min_time_s) == \
        (QUICK.min_samples, QUICK.max_seconds_per_config, QUICK.min_blocks, QUICK.min_time_s)
    # a value the user typed wins, even when it equals the non-quick default
    o = _options("--quick", "--min-blocks", str(BenchOptions.min_blocks), "--min-time-s", "0.5")
    assert o.min_blocks == BenchOptions.min_blocks and o.min_time_s == 0.5
    assert o.min_samples == QUICK.min_samples


def test_parsing_twice_gives_the_same_options():
    args = build_parser().parse_args(["bench", "--quick"])
    assert options_from(args) == options_from(args)
    assert args.min_blocks is None  # the arguments are left as parsed


@pytest.mark.parametrize("argv, needle", [
    (["--min-time-s", "0"], "--min-time-s must be positive"),
    (["--max-seconds-per-config", "-1"], "--max-seconds-per-config must be positive"),
    (["--min-blocks", "1"], "--min-blocks must be at least 2"),
    (["--clock-fraction", "1.5"], "--clock-fraction must be in (0, 1]"),
])
def test_bad_values_are_refused(argv, needle):
    with pytest.raises(BenchError, match=needle.replace("(", r"\(").replace("]", r"\]")):
        _options(*argv)


def test_building_the_cli_imports_no_numpy():
    """The defaults are read on every `kernaudit` start: their home is standard library only."""
    code = ("import sys; from kernaudit_pipeline.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('numpy', 'pandas', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
