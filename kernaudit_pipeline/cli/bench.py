"""``kernaudit bench``: the GPU runner (also ``python -m kernaudit_pipeline.bench.runner``).

Times every config of each kernel in pairs against its primary reference (alternating, random
order, L2 flushed before each sample), checks correctness first, and writes JSONL rows with the
paired speedup and its 95 % CI. Nothing heavy is imported until ``run``.
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kernaudit_pipeline.bench.options import QUICK, SCREEN_MAX_BLOCKS, SCREEN_TIME_S
    from kernaudit_pipeline.bench.options import BenchOptions as D  # the one home of the defaults
    from kernaudit_pipeline.kernel_spec import KERNELS_DIR
    from kernaudit_pipeline.rank.search import SearchSettings

    p = parser
    p.add_argument("kernels", nargs="*", metavar="KERNEL",
                   help="kernel module stems or NAMEs (default: every module in kernels/)")
    p.add_argument("--shapes", nargs="+", metavar="NAME", help="only these shape names")
    p.add_argument("--configs", nargs="+", metavar="ID", help="only these config ids")
    p.add_argument("--max-configs", type=int, help="only the first N configs of each kernel")
    p.add_argument("--out", default="bench_runs.jsonl", help="JSONL file to write (replaced)")
    p.add_argument("--no-prune", action="store_true", help="also time configs that spill")
    p.add_argument("--spill-threshold-bytes", type=int, default=D.spill_threshold_bytes,
                   help="prune configs whose local memory per thread exceeds this "
                        f"(default {D.spill_threshold_bytes})")
    p.add_argument("--rsd-target", type=float, default=D.rsd_target,
                   help="unpaired timing (references, peaks): stop when the RSD reaches this fraction "
                        f"(default {D.rsd_target})")
    p.add_argument("--min-samples", type=int, default=None,
                   help=f"unpaired timing: at least this many samples (default {D.min_samples}; --quick: "
                        f"{QUICK.min_samples})")
    p.add_argument("--max-seconds-per-config", type=float, default=None,
                   help="time cap for one unpaired timing; paired timing stops at twice this "
                        f"(default {D.max_seconds_per_config} s; --quick: {QUICK.max_seconds_per_config} s)")
    p.add_argument("--min-blocks", type=int, default=None,
                   help=f"paired timing: at least this many blocks of pairs per config (default {D.min_blocks}; "
                        f"--quick: {QUICK.min_blocks})")
    p.add_argument("--min-time-s", type=float, default=None,
                   help=f"paired timing: at least this much timed GPU time per config (default {D.min_time_s} s; "
                        f"--quick: {QUICK.min_time_s} s)")
    p.add_argument("--speedup-rsd-target", type=float, default=D.speedup_rsd_target,
                   help="paired timing: stop when the standard error of the block speedups "
                        f"reaches this fraction (default {D.speedup_rsd_target})")
    p.add_argument("--between-run-rsd", type=float, default=D.between_run_rsd,
                   help="between-run component that widens each speedup CI (calibrated on the "
                        f"committed repeats by scripts/analyze_repeats.py; default {D.between_run_rsd})")
    p.add_argument("--clock-fraction", type=float, default=D.clock_fraction,
                   help="discard blocks timed while the SM clock was below this fraction of its "
                        f"maximum, as nvbench does (default {D.clock_fraction})")
    p.add_argument("--cuda-graph", action="store_true",
                   help="time kernels under --cuda-graph-below-us as replays of a CUDA graph")
    p.add_argument("--cuda-graph-below-us", type=float, default=D.cuda_graph_below_us,
                   help=f"the latency under which --cuda-graph applies (default {D.cuda_graph_below_us} us)")
    p.add_argument("--references-top-k", type=int, default=D.references_top_k,
                   help=f"time the other references against this many best configs per shape "
                        f"(default {D.references_top_k})")
    p.add_argument("--no-backend-probe", action="store_true",
                   help="do not profile each reference to name the library that ran")
    p.add_argument("--timeout-s", type=float, default=D.timeout_s,
                   help="kill a worker whose current step (import, compile, check, timing) exceeds this "
                        f"(default {D.timeout_s} s)")
    p.add_argument("--deadline-s", type=float, default=None,
                   help="stop the whole sweep after this many seconds (the rest: NOT_RUN)")
    p.add_argument("--jobs", type=int, default=None,
                   help="parallel precompile processes (default: CPU count - 2, max 12)")
    p.add_argument("--precompile-s", type=float, default=150.0,
                   help="budget for the parallel precompile in seconds (default 150)")
    p.add_argument("--no-peaks", action="store_true", help="skip the peak ceilings")
    p.add_argument("--quick", action="store_true",
                   help="first shape of each kernel, fewer samples and blocks, shorter caps")
    p.add_argument("--kernels-dir", default=str(KERNELS_DIR),
                   help="folder of kernel modules (default: the project's kernels/)")
    # search mode (bench/search.py over rank/search.py)
    p.add_argument("--search", action="store_true",
                   help="measure one KERNEL's configs in the static cost model's predicted order and stop "
                        "when no unmeasured config can plausibly beat the best measured one")
    p.add_argument("--ranking", default=None, metavar="FILE",
                   help="--search: the JSON of kernaudit rank KERNEL --json to follow (default: rank here, "
                        "which compiles the space on this host's CPU)")
    p.add_argument("--search-summary", default=None, metavar="FILE",
                   help="--search: write a JSON summary per shape here (measured, why it stopped, the pick, "
                        "ties, GPU-seconds)")
    p.add_argument("--search-initial", type=int, default=8,
                   help="--search: configs measured before the stop rule is first asked (default 8)")
    p.add_argument("--search-batch", type=int, default=8,
                   help="--search: configs measured per worker run after that (default 8)")
    p.add_argument("--search-max-fraction", type=float, default=1.0,
                   help="--search: never measure more than this share of the candidates (default 1.0)")
    p.add_argument("--search-stated-error", type=float, default=None,
                   help="--search: the model's error to allow (default: the one the ranking states)")
    p.add_argument("--search-screen-time-s", type=float, default=SCREEN_TIME_S,
                   help="--search: walk the predicted order with short paired timings of about this much GPU "
                        f"time per config (a screening rung; at most {SCREEN_MAX_BLOCKS} blocks of half this or "
                        f"{D.block_s * 1e3:g} ms, whichever is shorter, bound it), then re-measure the contenders "
                        "at full precision; "
                        f"0 measures every config at full precision (default {SCREEN_TIME_S} s)")
    p.add_argument("--search-confirm", type=int, default=SearchSettings.confirm_max,
                   help="--search: at most this many screened contenders re-measured at full precision "
                        f"(default {SearchSettings.confirm_max})")
    p.add_argument("--search-fixed-order", action="store_true",
                   help="--search: walk the model's order as ranked; by default the order is corrected "
                        "after each batch by what the shape's measurements say about each config value")
    p.add_argument("--search-fresh-workers", action="store_true",
                   help="--search: start a new worker for each batch (as before 2026-12-07); by default one "
                        "worker is kept up for the batches, and a batch it fails goes to fresh workers")


def run(args: argparse.Namespace) -> int:
    from kernaudit_pipeline.bench.runner import BenchError, run_bench
    from kernaudit_pipeline.cli.errors import UserError

    try:
        if args.search:
            from kernaudit_pipeline.bench.search import run_search

            return run_search(args, list(sys.argv[1:]))
        return run_bench(args, list(sys.argv[1:]))
    except BenchError as exc:
        raise UserError(str(exc)) from None
