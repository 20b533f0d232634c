"""``kernaudit bench --search``: measure only what the cost model cannot rule out.

Thin glue between the measuring plan (``kernaudit_pipeline.rank.search``) and the runner's
public steps (plan, precompile, ``run_group``): for each shape, the configs are taken in the
order the static cost model predicted (``kernaudit rank KERNEL --json``, passed with
``--ranking``, or computed here when absent), measured a batch at a time by the runner's own
workers (paired against the primary reference, as in a full sweep; one worker is kept up for
the batches, ``bench/served.py``), and the search stops when
no unmeasured config can plausibly beat the best measured one. By default the walk is measured
with short screening timings (``--search-screen-time-s``), and the few configs that could still
be the best are then measured again with the sweep's own options (``--search-confirm``): the
walk is where the GPU time would go, the confirmation keeps the pick as precise as a sweep's.
Each shape's references are checked and timed once, by the first batch.

It writes the runner's JSONL rows (the same schema as a full sweep) to ``--out``, one row per
measured config (its full-precision row where it was confirmed, else its screening row, marked
in ``run_message``), and a summary per shape to ``--search-summary``: what each rung measured,
why it stopped, the best config with its paired speedup and CI, the configs tied with it, and
the GPU-seconds spent (checks and timing loops of every row any rung wrote, references
included), which is what an exhaustive sweep of the same space is compared against.

Runs on the GPU host: torch, triton, numpy and the standard library.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from kernaudit_pipeline.bench.runner import BenchError, open_sweep, options_from, resolve, select
from kernaudit_pipeline.bench.summary import summary_record
from kernaudit_pipeline.bench.options import screening
from kernaudit_pipeline.bench.served import ServedWorker
from kernaudit_pipeline.bench.supervisor import WRAP_UP_S, Group, Sweep, precompile, run_group
from kernaudit_pipeline.core.configs import config_id
from kernaudit_pipeline.core.values import finite_float, json_safe
from kernaudit_pipeline.rank.search import (
    Candidate, Observation, SearchResult, SearchSettings, conclude, observation_from_row,
    row_gpu_seconds, search_two_rungs,
)

DEFAULT_STATED_ERROR = 0.2
# Configs compiled per precompile round, per process: a round's fixed cost is its processes
# importing torch and triton (about 6 s on the H100 host), so rounds of one batch of 8 configs
# spent more wall time starting than compiling (w8a16_gemm on 2026-12-06: 28 rounds, ~190 s).
PRECOMPILE_PER_PROCESS = 4


class _DeadlineReached(Exception):
    """The sweep's --deadline-s passed: the search ends where it is."""


def load_ranking(path: Path, kernel_name: str) -> tuple[dict[str, list[Candidate]], float | None]:
    """``kernaudit rank --json`` output: candidates per shape (best first) and the model's
    stated error. Checked by hand, not by a schema library: this runs on the GPU host, where
    the runner has only the standard library, torch, triton and numpy. Anything the search
    would trip over later (a prediction that is not a positive finite number, a config ranked
    twice, a shape ranked twice, a stated error out of range) is refused here in one line."""
    try:
        payload = json.loads(Path(path).read_text())
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: nesting too deep to parse
        raise BenchError(f"--ranking {path}: not a readable ranking ({type(exc).__name__})") from None
    if not isinstance(payload, list):
        raise BenchError(f"--ranking {path}: expected the JSON list kernaudit rank --json prints")
    out: dict[str, list[Candidate]] = {}
    stated = None
    for item in payload:
        if not isinstance(item, dict) or item.get("kernel_name") != kernel_name:
            continue
        shape = item.get("shape_name")
        if not isinstance(shape, str) or not shape:
            raise BenchError(f"--ranking {path}: an entry for {kernel_name} has no shape_name")
        if shape in out:
            raise BenchError(f"--ranking {path}: shape {shape} is ranked twice")
        ranked = item.get("ranked")
        ranked = [] if ranked is None else ranked
        if not isinstance(ranked, list):
            raise BenchError(f"--ranking {path}: {shape}: ranked is not a list")
        candidates: list[Candidate] = []
        for r in ranked:
            cid = r.get("config_id") if isinstance(r, dict) else None
            if not isinstance(cid, str) or not cid or r.get("predicted_us") is None:
                raise BenchError(f"--ranking {path}: a ranked entry lacks config_id or predicted_us")
            predicted = finite_float(r["predicted_us"])
            if predicted is None or predicted <= 0:
                raise BenchError(f"--ranking {path}: {shape} {cid}: predicted_us must be a positive finite number")
            config = r.get("config")
            candidates.append(Candidate.of(cid, predicted, config if isinstance(config, dict) else None))
        ids = [c.config_id for c in candidates]
        if len(set(ids)) != len(ids):
            twice = next(i for i in ids if ids.count(i) > 1)
            raise BenchError(f"--ranking {path}: {shape}: config {twice} is ranked twice")
        out[shape] = candidates
        if "stated_error" in item and item["stated_error"] is not None:
            value = finite_float(item["stated_error"])
            if value is None or not 0 <= value < 10:
                raise BenchError(f"--ranking {path}: {shape}: stated_error must be a fraction >= 0 (0.2 = 20 %)")
            stated = value
    if not out:
        raise BenchError(f"--ranking {path} ranks nothing for {kernel_name}")
    return out, stated


def compute_ranking(stem: str) -> tuple[dict[str, list[Candidate]], float]:
    """Rank here, with the static cost model (the static audit compiles on this host's CPU)."""
    from kernaudit_pipeline.rank.ranking import rank_kernels

    report = rank_kernels([stem])
    if report.failures:
        raise BenchError(f"cannot rank {stem}: {report.failures[0].reason}")
    out = {r.shape_name: [Candidate.of(x.config_id, x.predicted_us, x.config) for x in r.ranked]
           for r in report.rankings}
    return out, report.rankings[0].stated_error if report.rankings else DEFAULT_STATED_ERROR


def compile_ahead(ids: list[str], order: list[str], compiled: set[str], chunk: int) -> list[str]:
    """What to precompile before measuring ``ids``: nothing if all are compiled, else the ones
    that are not, topped up with the next uncompiled configs in predicted order to ``chunk``
    (the walk measures them next if it goes on; compiling is CPU time, not GPU time)."""
    missing = [i for i in ids if i not in compiled]
    if not missing:
        return []
    wanted = set(missing)
    for cid in order:
        if len(missing) >= chunk:
            break
        if cid not in compiled and cid not in wanted:
            missing.append(cid)
            wanted.add(cid)
    return missing


def settings_from(args, stated: float) -> SearchSettings:
    if args.search_initial < 1 or args.search_batch < 1:
        raise BenchError("--search-initial and --search-batch must be at least 1")
    if not 0 < args.search_max_fraction <= 1:
        raise BenchError("--search-max-fraction must be in (0, 1]")
    if not (stated >= 0 and stated < 10):
        raise BenchError("--search-stated-error must be a fraction >= 0 (0.2 = 20 %)")
    if args.search_confirm < 0 or not args.search_screen_time_s >= 0:
        raise BenchError("--search-confirm and --search-screen-time-s must be at least 0")
    two_rungs = args.search_screen_time_s > 0
    return SearchSettings(stated_error=stated, initial=args.search_initial, batch=args.search_batch,
                          max_fraction=args.search_max_fraction,
                          confirm_max=args.search_confirm if two_rungs else 0,
                          confirm_min=min(SearchSettings.confirm_min, args.search_confirm) if two_rungs else 0,
                          adapt=not getattr(args, "search_fixed_order", False))


SCREEN_NOTE = ("search screening rung: a short paired timing ({:g} s of GPU time), not re-measured at "
               "full precision (it could not be the best)")


def final_rows(rows: list[dict], shape: str, confirmed: set[str], screen_time_s: float) -> list[dict]:
    """What ``--out`` keeps of one shape's search: every reference row, and one row per
    measured config, the full-precision one where the config was confirmed, else its
    screening row (marked as such in ``run_message``)."""
    out, runs = [], {}
    for r in rows:
        if r.get("shape_name") != shape or r.get("record_type") not in ("run", "baseline"):
            continue
        if r.get("record_type") == "baseline":
            out.append(r)
            continue
        cid = r.get("config_id")
        if r.get("_rung") == "confirm" or cid not in runs:
            runs[cid] = r
    for cid, r in runs.items():
        row = {k: v for k, v in r.items() if k != "_rung"}
        if r.get("_rung") == "screen" and cid not in confirmed and row.get("run_status") == "OK" \
                and not row.get("run_message"):
            row["run_message"] = SCREEN_NOTE.format(screen_time_s)
        out.append(row)
    return out


def run_search(args, argv: list[str]) -> int:
    options = options_from(args)
    started_wall = time.time()
    deadline = time.monotonic() + (args.deadline_s if args.deadline_s else 10 * 86400)
    if len(args.kernels) != 1:
        raise BenchError("--search takes exactly one KERNEL")
    settings_from(args, args.search_stated_error if args.search_stated_error is not None else DEFAULT_STATED_ERROR)
    with tempfile.TemporaryDirectory(prefix="kernaudit-search-") as tmp:
        work = Path(tmp)
        plans, failures = resolve(list(args.kernels), Path(args.kernels_dir), work, options.timeout_s, deadline)
        if failures:
            raise BenchError(failures[0].message)
        groups = select(plans, args)
        if not groups:
            raise BenchError("no (kernel, shape) pairs match the filters")
        (group,) = groups
        plan = group.plan
        if args.ranking:
            ranking, stated = load_ranking(Path(args.ranking), plan.name)
        else:
            ranking, stated = compute_ranking(plan.stem)
        stated = args.search_stated_error if args.search_stated_error is not None else (stated or DEFAULT_STATED_ERROR)
        out = Path(args.out)
        sweep = open_sweep(out, options, deadline, work)
        # every row any rung writes lands here first; --out then keeps one row per config
        rungs = Sweep(out=work / "rungs.jsonl", options=options, deadline=deadline, work_dir=work,
                      driver_version=sweep.driver_version, device=sweep.device)
        settings = settings_from(args, stated)
        screen_s = args.search_screen_time_s
        rung_options = {"screen": screening(options, screen_s) if screen_s > 0 else options, "confirm": options}
        jobs = args.jobs if args.jobs is not None else 12
        summaries = []
        batches = {"n": 0}
        # the kernel's own configs, for a ranking file that does not carry them (older ones)
        configs = {config_id(c): c for c in plan.configs}
        # one worker for the batches (set up once); a batch it fails goes to fresh workers
        served = None if getattr(args, "search_fresh_workers", False) else ServedWorker(plan, rungs, work / "served")
        try:
            for shape in group.shapes:
                allowed = set(group.configs)
                candidates = [c if c.config or c.config_id not in configs
                              else Candidate.of(c.config_id, c.predicted_us, configs[c.config_id])
                              for c in ranking.get(shape, []) if c.config_id in allowed]
                if not candidates:
                    print(f"[search] {plan.name} {shape}: the ranking has no candidates; skipped", flush=True)
                    continue
                first_row = len(rungs.rows)
                refs_done: dict[str, dict[str, dict]] = {}  # the references are checked and timed once a shape
                seen: dict[str, list[Observation]] = {"screen": [], "confirm": []}
                order = [c.config_id for c in candidates]
                compiled: set[str] = set()  # precompiled for this shape (Triton specializes on it)

                def measure(ids: list[str], rung: str) -> list[Observation]:
                    # a worker started now would be told to wrap up at once: its configs would come
                    # back NOT_RUN, and counting them as measured would end the search as EXHAUSTED
                    if time.monotonic() >= deadline - WRAP_UP_S:
                        raise _DeadlineReached
                    # each worker run gets its own folder: the supervisor names its files by kernel
                    # and attempt, which repeat from one batch to the next
                    batches["n"] += 1
                    rungs.work_dir = work / f"batch{batches['n']}"
                    rungs.work_dir.mkdir()
                    ahead = compile_ahead(list(ids), order, compiled, max(len(ids), jobs * PRECOMPILE_PER_PROCESS))
                    if args.precompile_s > 0 and ahead:  # 0: Triton's cache is warm
                        precompile([Group(plan, [shape], ahead)], rungs, jobs, args.precompile_s)
                        compiled.update(ahead)
                    before = len(rungs.rows)
                    opts = rung_options[rung]
                    # the reference's library is probed once per shape, with its first check
                    rungs.options = replace(opts, probe_backends=opts.probe_backends and not refs_done)
                    left = list(ids)
                    if served is not None:
                        got, failed = served.run([shape], [(shape, i) for i in ids], refs_done)
                        left = [i for i in ids if (shape, i) not in got] if failed else []
                        if failed:
                            print(f"[search] serving worker failed ({failed}); {len(left)} configs of the "
                                  "batch go to fresh workers", flush=True)
                    if left:
                        run_group(Group(plan, [shape], left), rungs, references_done=refs_done)
                    for r in rungs.rows[before:]:
                        r["_rung"] = rung
                    rows = {r.get("config_id"): r for r in rungs.rows[before:]
                            if r.get("record_type") == "run" and r.get("shape_name") == shape}
                    observations = [observation_from_row(rows[i]) if i in rows
                                    else Observation.failed(i, 0.0, "no row written") for i in ids]
                    if any(r.get("stop_reason") == "DEADLINE" or r.get("run_status") == "NOT_RUN"
                           for r in rows.values()) and time.monotonic() >= deadline - WRAP_UP_S:
                        # the batch was cut short: keep what it measured, a config the deadline kept
                        # from running was not measured
                        seen[rung] += [o for o, i in zip(observations, ids)
                                       if i in rows and rows[i].get("run_status") != "NOT_RUN"]
                        raise _DeadlineReached
                    seen[rung] += observations
                    return observations

                t0 = time.monotonic()
                try:
                    result = search_two_rungs(candidates, lambda ids: measure(ids, "screen"),
                                              lambda ids: measure(ids, "confirm"), settings)
                    stop_name, stop_text = result.stop_reason.name, result.stop_reason.value
                except _DeadlineReached:
                    result = conclude(SearchResult(candidates=len(candidates), measured=seen["screen"],
                                                   confirmed=seen["confirm"]))
                    stop_name, stop_text = "DEADLINE", "the sweep's --deadline-s passed"
                rows = rungs.rows[first_row:]
                confirmed = {o.config_id for o in result.confirmed}
                for row in final_rows(rows, shape, confirmed, screen_s):
                    sweep.emit(row)
                summaries.append(_summary(plan.name, shape, result, stop_name, stop_text, stated, settings,
                                          rows, screen_s, rung_options, time.monotonic() - t0))
                s = summaries[-1]
                print(f"[search] {plan.name} {shape}: {s['measured']}/{s['candidates']} measured"
                      + (f" ({len(confirmed)} confirmed at full precision)" if screen_s > 0 else "")
                      + f", {s['gpu_seconds']:.1f} GPU-s, best {s['best_config_id']} ({stop_text})", flush=True)
        finally:
            if served is not None:
                served.close()
        sweep.options = options
        summary = summary_record(sweep, started_wall, argv, args.deadline_s, [plan.name], list(group.shapes))
        summary["search_gpu_busy_s_all_rungs"] = sum(row_gpu_seconds(r) for r in rungs.rows)
        # batches the kept-up worker measured, and how many such workers were started (one
        # unless a batch failed); None with --search-fresh-workers
        summary["search_served_batches"] = served.batches if served is not None else None
        summary["search_serving_workers_started"] = served.starts if served is not None else None
        sweep.emit(summary)
    if args.search_summary:
        Path(args.search_summary).write_text(json.dumps(json_safe(summaries), indent=1) + "\n")
    print(f"[search] wrote {len(sweep.rows)} rows to {out}"
          + (f" and {len(summaries)} shape summaries to {args.search_summary}" if args.search_summary else ""))
    return 0


def _summary(kernel: str, shape: str, result: SearchResult, stop_name: str, stop_text: str, stated: float,
             settings: SearchSettings, rows: list[dict], screen_s: float, rung_options: dict,
             wall_s: float) -> dict:
    """One shape's search summary: what was measured at each rung, why it stopped, the pick
    and its ties, and the GPU-seconds of every row any rung wrote (references included)."""
    best = result.best
    by_rung = {rung: sum(row_gpu_seconds(r) for r in rows if r.get("_rung") == rung) for rung in ("screen", "confirm")}
    return {
        "record_type": "search", "kernel_name": kernel, "shape_name": shape,
        "candidates": result.candidates, "measured": len(result.measured),
        "measured_config_ids": [o.config_id for o in result.measured],
        "confirmed_config_ids": [o.config_id for o in result.confirmed],
        "stop_reason": stop_name, "stop_reason_text": stop_text,
        "best_config_id": best.config_id if best else None,
        "best_speedup": best.speedup if best else None,
        "best_speedup_ci": [1.0 / best.ci_high, 1.0 / best.ci_low] if best and best.speedup else None,
        "best_latency_us": best.latency_us if best else None,
        "tied_config_ids": result.tied, "stated_error": stated,
        # the stop rule's last comparison: the next candidate's optimistic value against the
        # best's CI, and what the bound was made of
        "stop_rule": {"next_optimistic": result.next_optimistic, "best_ci_high": result.best_ci_high,
                      "slope": result.slope, "error_allowed": result.error_allowed},
        "gpu_seconds": sum(row_gpu_seconds(r) for r in rows),
        "gpu_seconds_screen": by_rung["screen"], "gpu_seconds_confirm": by_rung["confirm"],
        "gpu_seconds_runs": result.gpu_seconds, "wall_s": wall_s,
        "screen_time_s": screen_s,
        "screen_options": ({k: getattr(rung_options["screen"], k) for k in
                            ("min_time_s", "min_blocks", "max_blocks", "min_pairs", "block_s",
                             "speedup_rsd_target")} if screen_s > 0 else None),
        "settings": {"initial": settings.initial, "batch": settings.batch, "z": settings.z,
                     "prior_weight": settings.prior_weight, "tie_margin": settings.tie_margin,
                     "max_fraction": settings.max_fraction, "confirm_max": settings.confirm_max,
                     "confirm_min": settings.confirm_min, "adapt": settings.adapt,
                     "adapt_shrink": settings.adapt_shrink, "slope_prior_sd": settings.slope_prior_sd},
    }
