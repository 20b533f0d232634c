"""Cross-check the runner's paired speedup against ``triton.testing.do_bench``, in paired form.

    python -m kernaudit_pipeline.bench.crosscheck --jsonl bench_h200.jsonl --out crosscheck.jsonl

For each target (kernel, shape) the best config of the given runner capture is timed in the
same process two ways against the kernel's primary reference (prepared as the runner does):

- the runner's method (:class:`~kernaudit_pipeline.bench.timing.PairedSession`: blocks of
  randomly ordered pairs, L2 flushed before each sample, clock guard);
- ``do_bench(warmup=25, rep=100, return_mode="median")`` on the candidate and on the
  reference back to back, in random order, ``rounds`` times; the speedup is the median of the
  per-round ratios (do_bench flushes L2 itself).

A row agrees when the two speedups are within 2 % (issue 9's target). GPU host only, except
:func:`compare` and :func:`pick_targets`, which the CPU tests run with the test double.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from kernaudit_pipeline.bench.paired import PairedRule
from kernaudit_pipeline.bench.records import read_jsonl
from kernaudit_pipeline.bench.references import references_of
from kernaudit_pipeline.bench.timing import PairedSession, Timed
from kernaudit_pipeline.core.configs import config_id
from kernaudit_pipeline.core.verdicts import TimingMode
from kernaudit_pipeline.kernel_spec import kernel_files, load_kernel_module

AGREEMENT = 0.02
TARGETS = (("gemm_bf16", "llama3_8b_qkv_prefill"), ("gemm_bf16", "llama3_8b_down_prefill"),
           ("flash_attention_fwd", "b4_h32_kv8_s4096_d128"), ("fused_fp8_gemm", "llama3_8b_qkv_prefill"),
           ("paged_decode_attention", "decode_b8_ctx2k_8k"))


def pick_targets(rows: list[dict], targets=TARGETS) -> list[tuple[str, str, str]]:
    """The highest paired speedup among the correct configs of each target in a capture."""
    out = []
    for kernel, shape in targets:
        ok = [r for r in rows if r.get("record_type") == "run" and r.get("run_status") == "OK"
              and r.get("kernel_name") == kernel and r.get("shape_name") == shape and r.get("speedup")]
        if ok:
            out.append((kernel, shape, max(ok, key=lambda r: r["speedup"])["config_id"]))
    return out


def dobench_paired(cand: Callable[[], object], ref: Callable[[], object], bench: Callable[[Callable], float],
                   rounds: int, rng: np.random.Generator) -> tuple[float, list[float]]:
    ratios = []
    for _ in range(rounds):
        if rng.integers(0, 2):
            c = bench(cand)
            r = bench(ref)
        else:
            r = bench(ref)
            c = bench(cand)
        ratios.append(r / c)
    return float(np.median(ratios)), ratios


def runner_paired(cand: Callable[[], object], ref: Callable[[], object], backend, rng: np.random.Generator,
                  rule: PairedRule = PairedRule()):
    session = PairedSession(Timed(cand, 1, TimingMode.EVENTS), Timed(ref, 1, TimingMode.EVENTS), backend, rule,
                            rng, between_run_rsd=0.0)
    while not session.done:
        session.run_block()
    return session.result()


def compare(mod, shape, config: dict, backend, bench: Callable[[Callable], float], rounds: int = 7,
            seed: int = 0) -> dict:
    """One target timed both ways; the row written to the cross-check JSONL."""
    rng = np.random.default_rng(seed)
    inputs = mod.make_inputs(shape, backend.device, seed)
    primary = references_of(mod)[0]
    prepared = primary.prepare(inputs) if primary.prepare is not None else inputs
    out = mod.launch(inputs, config)

    def cand():
        return mod.launch(inputs, config, out=out)

    def ref():
        return primary.fn(prepared)

    t0 = time.perf_counter()
    ours = runner_paired(cand, ref, backend, rng)
    runner_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    theirs, ratios = dobench_paired(cand, ref, bench, rounds, rng)
    dobench_s = time.perf_counter() - t0
    sp = ours.speedup
    diff = theirs / sp.speedup - 1.0
    return {"kernel_name": mod.NAME, "shape_name": shape.name, "config_id": config_id(config),
            "baseline_name": primary.name, "runner_speedup": sp.speedup, "runner_ci_low": sp.ci_low,
            "runner_ci_high": sp.ci_high, "runner_pairs": sp.pairs, "runner_blocks": sp.blocks,
            "runner_latency_us": ours.candidate.median_us, "runner_baseline_us": ours.reference.median_us,
            "dobench_speedup": theirs, "dobench_ratios": ratios, "difference": diff,
            "agrees_within_2pct": abs(diff) <= AGREEMENT, "runner_s": runner_s, "dobench_s": dobench_s,
            "sm_clock_min_mhz": ours.clocks.min_mhz, "sm_clock_max_mhz": ours.clocks.max_mhz}


def _do_bench(fn: Callable[[], object]) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m kernaudit_pipeline.bench.crosscheck", description=__doc__.splitlines()[0])
    p.add_argument("--jsonl", type=Path, required=True, help="runner capture to take the best configs from")
    p.add_argument("--out", type=Path, required=True, help="JSONL of the comparisons")
    p.add_argument("--rounds", type=int, default=7, help="paired do_bench rounds per target (default 7)")
    args = p.parse_args(argv)
    from kernaudit_pipeline.bench.timing import make_backend

    rows = read_jsonl(args.jsonl.read_text()) if args.jsonl.exists() else []
    targets = pick_targets(rows)
    if not targets:
        print(f"crosscheck: no target was timed OK in {args.jsonl}", file=sys.stderr)
        return 2
    mods = {load_kernel_module(p).NAME: load_kernel_module(p) for p in kernel_files()}
    backend = make_backend("cuda")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    results = []
    with args.out.open("w") as fh:
        for i, (kernel, shape_name, cid) in enumerate(targets):
            mod = mods[kernel]
            shape = next(s for s in mod.SHAPES if s.name == shape_name)
            config = next(c for c in mod.CONFIGS if config_id(c) == cid)
            try:
                row = compare(mod, shape, config, backend, _do_bench, args.rounds, seed=i)
            except Exception as exc:  # one target failing must not lose the others
                row = {"kernel_name": kernel, "shape_name": shape_name, "config_id": cid,
                       "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
            results.append(row)
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            backend.empty_cache()
    print(f"{'kernel':<22} {'shape':<28} {'config':<30} {'runner':>8} {'do_bench':>8} {'diff':>7}")
    for r in results:
        if "error" in r:
            print(f"{r['kernel_name']:<22} {r['shape_name']:<28} {r['config_id']:<30} error: {r['error']}")
            continue
        print(f"{r['kernel_name']:<22} {r['shape_name']:<28} {r['config_id']:<30} {r['runner_speedup']:8.4f} "
              f"{r['dobench_speedup']:8.4f} {r['difference'] * 100:+6.2f}%{'' if r['agrees_within_2pct'] else '  (>2 %)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
