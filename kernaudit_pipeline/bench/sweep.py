"""One shape of one kernel, inside a worker: references, candidates, paired timing, rows.

For each shape, in this order:

1. the references (primary first): each prepared outside any timed region, checked against the
   module's fp32 ``reference`` with its own tolerance, profiled once to name the library that
   actually ran, timed on its own, and written as a ``baseline`` row;
2. the configs, a chunk of :data:`CHUNK_CONFIGS` at a time:

   a. each config of the chunk: compile (resources), prune (stack frame over the threshold,
      shared memory over the opt-in limit), check on fresh inputs; the ones that pass (and the
      incorrect ones, timed for the record and never a win) are *ready*;
   b. paired timing: one :class:`~kernaudit_pipeline.bench.timing.PairedSession` per ready
      config against the primary reference, run one block at a time in turn, so a config's
      blocks are spread over the time its chunk is timed;
   c. the chunk's ``run`` rows, written as soon as the chunk is done, except those of the
      ``references_top_k`` fastest correct configs so far (held until step 3);

3. the other references, paired against the ``references_top_k`` fastest correct configs, and
   the rows held for them.

Chunks keep a large space (hundreds of configs) from being all-or-nothing: a worker killed in
the middle of a shape loses only its open chunk, and memory holds one chunk's outputs.

The deadline (``Context.deadline``, a little before the supervisor's hard kill) ends a shape
with what it has: the open sessions stop after their current block and each writes its row,
flagged ``DEADLINE`` (stop reason and ``run_message``) when it has at least the rule's minimum
number of blocks, else ``NOT_RUN`` with that reason; configs not reached are ``NOT_RUN``.

A fatal CUDA error ends the worker (exit 3) after its row is written; the supervisor starts a
new worker for what is left. Runs in worker processes only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from kernaudit_pipeline.bench import correctness as corr
from kernaudit_pipeline.bench.records import (
    REF_TIMING_MARK, CheckResult, KernelInfo, RecordParts, RecordType, StaticInfo, build_record, reference_config_id,
)
from kernaudit_pipeline.bench.references import classify_kernels, profile_kernels, references_of
from kernaudit_pipeline.bench.stats import StopReason
from kernaudit_pipeline.bench.timing import PairedSession, Timed, estimate_us, prepare_timed, time_single
from kernaudit_pipeline.core.configs import config_id
from kernaudit_pipeline.core.verdicts import BaselineResult, RunStatus
from kernaudit_pipeline.kernel_spec import Reference, Shape

# Configs prepared and timed together; their rows are written when the chunk is done.
CHUNK_CONFIGS = 16
DEADLINE_BEFORE_PREPARE = "sweep deadline reached before this config was compiled and checked"


class FatalCudaError(Exception):
    """The CUDA context cannot be trusted any more: the worker must exit."""


@dataclass
class Context:
    """What every step of a worker shares."""

    mod: object
    kinfo: KernelInfo
    dev: object
    writer: object
    backend: object
    opts: object
    attempt: int
    seed: int
    rng: np.random.Generator
    # references whose paired timing killed an earlier worker: key -> why (this shape only)
    failed_refs: dict[str, str] = field(default_factory=dict)
    # wall-clock time (time.time()) after which the worker ends its shapes with what it has
    deadline: float | None = None

    def next_seed(self) -> int:
        self.seed += 1
        return self.seed

    def past_deadline(self) -> bool:
        return self.deadline is not None and time.time() >= self.deadline


@dataclass
class ReadyRef:
    ref: Reference
    fn: Callable[[], object] | None
    status: RunStatus
    message: str | None = None
    backend: str | None = None
    kernels: tuple[str, ...] = ()


@dataclass
class Ready:
    """A config that compiled, fits, and was checked: waiting for its paired timing."""

    cid: str
    config: dict
    static: StaticInfo
    check: CheckResult
    fn: Callable[[], object]
    matches: bool | None
    timed: Timed | None = None
    session: PairedSession | None = None
    reference_results: list[dict] = field(default_factory=list)
    note: str | None = None  # why the timing is to be read with care (cut short by the deadline)


def _mark(ctx: Context, shape: Shape, label: str) -> None:
    ctx.writer.mark(f"{shape.name}|{label}")


def _status_of(exc: BaseException) -> RunStatus:
    if corr.is_out_of_resources(exc):
        return RunStatus.OUT_OF_RESOURCES
    if corr.is_oom(exc):
        return RunStatus.OOM
    if corr.is_fatal_cuda(exc):
        return RunStatus.CRASHED
    return RunStatus.ERROR


def _after_error(ctx: Context, exc: BaseException) -> None:
    """Free memory after a recorded error; raise when the context is gone."""
    if corr.is_fatal_cuda(exc):
        raise FatalCudaError(corr.first_line(exc)) from None
    try:
        ctx.backend.empty_cache()
        ctx.backend.sync()
    except Exception as again:  # the device is not usable any more
        raise FatalCudaError(corr.first_line(again)) from None


def _common(ctx: Context, plan_shape) -> dict:
    return {"flops": plan_shape.flops, "bytes_moved": plan_shape.bytes_moved, "attempt": ctx.attempt}


# --------------------------------------------------------------------------------------------
# references
# --------------------------------------------------------------------------------------------
def _probe_backend(ctx: Context, ref: Reference, fn: Callable[[], object]) -> tuple[str | None, tuple[str, ...]]:
    if not ctx.opts.probe_backends or ctx.backend.device != "cuda":
        return ref.backend, ()
    try:
        kernels = profile_kernels(fn)
    except Exception as exc:  # the profiler is evidence, not a requirement
        print(f"[bench] backend probe of {ref.name} failed: {corr.first_line(exc, 160)}", flush=True)
        return ref.backend, ()
    return classify_kernels(kernels) or ref.backend, tuple(name[:160] for name, _ in kernels[:3])


def prepare_references(ctx: Context, shape: Shape, plan_shape, inputs: dict,
                       done: dict[str, dict]) -> list[ReadyRef]:
    """Check, probe and time every reference of the shape (rows written), or, for references
    an earlier worker already recorded (``done``: label -> its row's status, backend and
    message), only prepare them."""
    out: list[ReadyRef] = []
    for ref in references_of(ctx.mod):
        label = reference_config_id(ref.key)
        _mark(ctx, shape, label)
        if label in done:
            row = done[label]
            status = RunStatus(row.get("status") or RunStatus.ERROR)
            fn = None
            if status is RunStatus.OK:
                prepared = ref.prepare(inputs) if ref.prepare is not None else inputs
                fn = (lambda r=ref, x=prepared: r.fn(x))
            out.append(ReadyRef(ref, fn, status, row.get("message"), row.get("backend")))
            continue
        parts = dict(baseline_name=ref.name, baseline_variant=ref.key, baseline_backend=ref.backend,
                     **_common(ctx, plan_shape))
        why = ref.unavailable() if ref.unavailable is not None else None
        if why:
            ctx.writer.write(build_record(RecordType.BASELINE, ctx.kinfo, shape, ctx.dev,
                                          RunStatus.NOT_RUN, RecordParts(message=why, **parts)))
            out.append(ReadyRef(ref, None, RunStatus.NOT_RUN, why))
            continue
        try:
            check = corr.check_reference(ref, ctx.mod, shape, ctx.next_seed(), ctx.backend.device,
                                         ctx.backend.sync)
            prepared = ref.prepare(inputs) if ref.prepare is not None else inputs
            fn = (lambda r=ref, x=prepared: r.fn(x))
            backend, kernels = _probe_backend(ctx, ref, fn)
            timing = time_single(fn, ctx.backend, ctx.opts.rule, ctx.opts.warmup_s)
            status = RunStatus.OK if check.correct else RunStatus.FAILED_CORRECTNESS
            msg = None if check.correct else f"reference {corr.failure_message(check, ref.tolerance)}"
            parts.update(baseline_backend=backend, backend_kernels=kernels)
            ctx.writer.write(build_record(RecordType.BASELINE, ctx.kinfo, shape, ctx.dev, status,
                                          RecordParts(message=msg, check=check, timing=timing, **parts)))
            out.append(ReadyRef(ref, fn if check.correct else None, status, msg, backend, kernels))
        except Exception as exc:  # recorded; the sweep goes on without this reference
            status = _status_of(exc)
            ctx.writer.write(build_record(RecordType.BASELINE, ctx.kinfo, shape, ctx.dev, status,
                                          RecordParts(message=corr.first_line(exc), **parts)))
            out.append(ReadyRef(ref, None, status, corr.first_line(exc)))
            _after_error(ctx, exc)
    return out


# --------------------------------------------------------------------------------------------
# candidates
# --------------------------------------------------------------------------------------------
def prepare_config(ctx: Context, shape: Shape, plan_shape, config: dict, inputs: dict) -> Ready | None:
    """Compile, prune and check one config; writes its row and returns None unless it is to be
    timed."""
    mod, opts, dev = ctx.mod, ctx.opts, ctx.dev
    cid = config_id(config)
    base = dict(config=config, grid=plan_shape.grids.get(cid), **_common(ctx, plan_shape))

    def row(status: RunStatus, **kw) -> None:
        ctx.writer.write(build_record(RecordType.RUN, ctx.kinfo, shape, dev, status,
                                      RecordParts(**base, **kw)))

    try:
        static, _compiled = ctx.backend.compile(mod, shape, config, dev.max_shared_mem_bytes)
    except Exception as exc:
        status = RunStatus.OUT_OF_RESOURCES if corr.is_out_of_resources(exc) else RunStatus.COMPILE_ERROR
        row(status, message=corr.first_line(exc))
        if corr.is_fatal_cuda(exc):
            raise FatalCudaError(corr.first_line(exc)) from None
        return None
    limit = dev.max_shared_mem_bytes
    if limit is not None and static.shared_mem_bytes is not None and static.shared_mem_bytes > limit:
        row(RunStatus.OUT_OF_RESOURCES, static=static,
            message=f"shared memory {static.shared_mem_bytes} B > device opt-in limit {limit} B "
                    "(checked before launch)")
        return None
    frame = static.stack_frame_bytes or 0
    if opts.prune and frame > opts.spill_threshold_bytes:
        row(RunStatus.PRUNED_SPILL, static=static,
            message=f"pruned: {frame} B of local memory per thread > threshold {opts.spill_threshold_bytes}")
        return None
    before = ctx.backend.jit_cache_size(getattr(mod, "KERNEL", None))
    check = None
    try:
        check = corr.check_config(mod, shape, config, ctx.next_seed(), ctx.backend.device, ctx.backend.sync)
        after = ctx.backend.jit_cache_size(getattr(mod, "KERNEL", None))
        matches = None if before is None or after is None else before == after
        out = mod.launch(inputs, config)
        ctx.backend.sync()
        return Ready(cid, config, static, check, lambda: mod.launch(inputs, config, out=out), matches)
    except Exception as exc:
        row(_status_of(exc), static=static, check=check, message=corr.first_line(exc))
        _after_error(ctx, exc)
        return None


def _use_graph(ctx: Context, fn: Callable[[], object]) -> bool:
    if not ctx.opts.cuda_graph or ctx.backend.device != "cuda":
        return False
    return estimate_us(fn, ctx.backend) < ctx.opts.cuda_graph_below_us


def _fail_ready(ctx: Context, shape: Shape, plan_shape, r: Ready, exc: BaseException) -> None:
    ctx.writer.write(build_record(
        RecordType.RUN, ctx.kinfo, shape, ctx.dev, _status_of(exc),
        RecordParts(config=r.config, grid=plan_shape.grids.get(r.cid), static=r.static, check=r.check,
                    message=f"timing: {corr.first_line(exc)}", **_common(ctx, plan_shape))))
    _after_error(ctx, exc)


def _not_run(ctx: Context, shape: Shape, plan_shape, config: dict, message: str,
             r: Ready | None = None) -> None:
    """A config the deadline kept from a result: a NOT_RUN row saying how far it got."""
    ctx.writer.write(build_record(RecordType.RUN, ctx.kinfo, shape, ctx.dev, RunStatus.NOT_RUN, RecordParts(
        config=config, grid=plan_shape.grids.get(config_id(config)),
        static=r.static if r else None, check=r.check if r else None, message=message,
        **_common(ctx, plan_shape))))


def _start(ctx: Context, shape: Shape, plan_shape, r: Ready) -> bool:
    """Mark ``r`` as the config being timed, or write its NOT_RUN row once the deadline passed."""
    if ctx.past_deadline():
        _not_run(ctx, shape, plan_shape, r.config, "sweep deadline reached before this config was timed", r)
        return False
    _mark(ctx, shape, r.cid)
    return True


def _round_robin(ctx: Context, shape: Shape, plan_shape, sessions: list[tuple[Ready, PairedSession]],
                 on_error: Callable[[Ready, BaseException], None],
                 label: Callable[[Ready], str] = lambda r: r.cid,
                 stop: Callable[[], bool] | None = None) -> tuple[list[Ready], list[Ready]]:
    """Blocks of every session in turn until each stops, or until ``stop()`` says so (checked
    before every block). Returns (finished, still open when stopped)."""
    active = list(sessions)
    finished: list[Ready] = []
    while active:
        for item in list(active):
            if stop is not None and stop():
                return finished, [r for r, _ in active]
            r, s = item
            _mark(ctx, shape, label(r))
            try:
                s.run_block()
            except Exception as exc:
                active.remove(item)
                on_error(r, exc)
                continue
            if s.done:
                active.remove(item)
                finished.append(r)
    return finished, []


def _cut_short(ctx: Context, shape: Shape, plan_shape, r: Ready, s: PairedSession) -> object | None:
    """An open session at the deadline: its result, flagged, when it has the rule's minimum
    number of kept blocks; else a NOT_RUN row (returns None)."""
    have, need = len(s.block_log_medians), max(s.rule.min_blocks, 2)
    if have < need:
        _not_run(ctx, shape, plan_shape, r.config,
                 f"sweep deadline reached after {have} of the {need} blocks of paired timing "
                 "a result needs", r)
        return None
    s.reason = StopReason.DEADLINE
    r.note = (f"cut short by the sweep deadline after {have} blocks of paired timing "
              "(the stop rule had not been met)")
    return s.result()


def time_candidates(ctx: Context, shape: Shape, plan_shape, ready: list[Ready],
                    primary: ReadyRef) -> list[tuple[Ready, object]]:
    """Paired timing of every ready config against the primary reference (unpaired when the
    primary cannot run), until the deadline. Returns (config, PairedTiming or Timing); a
    config the deadline left without a result has its NOT_RUN row written here."""
    results: list[tuple[Ready, object]] = []
    if primary.fn is None:
        for r in ready:
            if not _start(ctx, shape, plan_shape, r):
                continue
            try:
                results.append((r, time_single(r.fn, ctx.backend, ctx.opts.rule, ctx.opts.warmup_s)))
            except Exception as exc:
                _fail_ready(ctx, shape, plan_shape, r, exc)
        return results
    sessions = []
    for r in ready:
        if not _start(ctx, shape, plan_shape, r):
            continue
        try:
            graph = _use_graph(ctx, r.fn)
            r.timed = prepare_timed(r.fn, ctx.backend, graph)
            ref_timed = prepare_timed(primary.fn, ctx.backend, graph)
            sessions.append((r, PairedSession(r.timed, ref_timed, ctx.backend, ctx.opts.paired_rule,
                                              ctx.rng, ctx.opts.between_run_rsd)))
        except Exception as exc:
            _fail_ready(ctx, shape, plan_shape, r, exc)
    done, cut = _round_robin(ctx, shape, plan_shape, sessions,
                             lambda r, exc: _fail_ready(ctx, shape, plan_shape, r, exc),
                             stop=ctx.past_deadline)
    by_cid = {r.cid: s for r, s in sessions}
    for r in done:
        results.append((r, by_cid[r.cid].result()))
    for r in cut:
        timing = _cut_short(ctx, shape, plan_shape, r, by_cid[r.cid])
        if timing is not None:
            results.append((r, timing))
    return results


def time_other_references(ctx: Context, shape: Shape, plan_shape, timed: list[tuple[Ready, object]],
                          refs: list[ReadyRef]) -> None:
    """The non-primary references, paired against the fastest correct configs; results go into
    each of those configs' ``reference_results``."""
    others = [x for x in refs if x.ref.key is not None]
    if not others:
        return
    ranked = [(r, t) for r, t in timed if r.check.correct and getattr(t, "speedup", None) is not None]
    ranked.sort(key=lambda rt: -rt[1].speedup.speedup)
    top = [r for r, _ in ranked[:max(0, ctx.opts.references_top_k)]]
    for ref in others:
        if ref.ref.key in ctx.failed_refs:
            ref = ReadyRef(ref.ref, None, RunStatus.CRASHED, ctx.failed_refs[ref.ref.key], ref.backend)
        if ref.fn is None:
            status = f"{ref.status}: {ref.message}" if ref.message else str(ref.status)
            for r in top:
                r.reference_results.append(BaselineResult(
                    name=ref.ref.name, backend=ref.backend or ref.ref.backend, speedup=None,
                    run_status=status).__dict__)
            continue
        sessions = []
        for r in top:
            _mark(ctx, shape, f"{REF_TIMING_MARK}{ref.ref.key}")
            try:
                ref_timed = prepare_timed(ref.fn, ctx.backend, r.timed.mode.value == "cuda_graph")
                sessions.append((r, PairedSession(r.timed, ref_timed, ctx.backend, ctx.opts.paired_rule,
                                                  ctx.rng, ctx.opts.between_run_rsd)))
            except Exception as exc:
                r.reference_results.append(BaselineResult(
                    name=ref.ref.name, backend=ref.backend, speedup=None,
                    run_status=f"ERROR: {corr.first_line(exc, 200)}").__dict__)
                _after_error(ctx, exc)

        def failed(r: Ready, exc: BaseException, ref=ref) -> None:
            r.reference_results.append(BaselineResult(
                name=ref.ref.name, backend=ref.backend, speedup=None,
                run_status=f"ERROR: {corr.first_line(exc, 200)}").__dict__)
            _after_error(ctx, exc)

        finished, _ = _round_robin(ctx, shape, plan_shape, sessions, failed,
                                   label=lambda r, key=ref.ref.key: f"{REF_TIMING_MARK}{key}")
        by_cid = {r.cid: s for r, s in sessions}
        for r in finished:
            sp = by_cid[r.cid].result().speedup
            r.reference_results.append(BaselineResult(
                name=ref.ref.name, backend=ref.backend or ref.ref.backend, speedup=sp.speedup,
                speedup_ci_low=sp.ci_low, speedup_ci_high=sp.ci_high, primary=False,
                run_status=str(RunStatus.OK)).__dict__)


def write_runs(ctx: Context, shape: Shape, plan_shape, timed: list[tuple[Ready, object]],
               primary: ReadyRef) -> None:
    for r, t in timed:
        paired_ = t if hasattr(t, "speedup") else None
        single = None if paired_ is not None else t
        if r.check.correct:
            status, msg = RunStatus.OK, None
            if paired_ is None:
                msg = f"unpaired: the primary reference did not run ({primary.status})"
        else:  # timed for the record, never a win: comparisons see FAILED_CORRECTNESS
            status = RunStatus.FAILED_CORRECTNESS
            msg = f"{corr.failure_message(r.check, ctx.mod.TOLERANCE)} (timed, never a win)"
        if r.note:
            msg = f"{msg}; {r.note}" if msg else r.note
        ctx.writer.write(build_record(RecordType.RUN, ctx.kinfo, shape, ctx.dev, status, RecordParts(
            config=r.config, grid=plan_shape.grids.get(r.cid), static=r.static, check=r.check,
            paired=paired_, timing=single, message=msg, launch_matches_compile=r.matches,
            baseline_name=primary.ref.name, baseline_backend=primary.backend or primary.ref.backend,
            reference_speedups=tuple(r.reference_results) if r.reference_results else None,
            **_common(ctx, plan_shape))))


def _fastest_correct(timed: list[tuple[Ready, object]], k: int) -> list[tuple[Ready, object]]:
    ranked = [(r, t) for r, t in timed if r.check.correct and getattr(t, "speedup", None) is not None]
    ranked.sort(key=lambda rt: -rt[1].speedup.speedup)
    return ranked[:max(0, k)]


def skip_shape(ctx: Context, plan_shape, cids: list[str], message: str) -> None:
    """NOT_RUN rows for the configs of a shape the worker will not reach."""
    configs = {config_id(c): c for c in ctx.mod.CONFIGS}
    for cid in cids:
        _not_run(ctx, plan_shape.shape, plan_shape, configs[cid], message)


def sweep_shape(ctx: Context, plan_shape, cids: list[str], refs_done: dict[str, dict]) -> None:
    """Everything for one shape, a chunk of configs at a time; raises :class:`FatalCudaError`
    when the worker must exit."""
    shape = plan_shape.shape
    _mark(ctx, shape, "inputs")
    inputs = ctx.mod.make_inputs(shape, ctx.backend.device, ctx.opts.seed)
    refs = prepare_references(ctx, shape, plan_shape, inputs, refs_done)
    primary = refs[0]
    configs = {config_id(c): c for c in ctx.mod.CONFIGS}
    # rows held back for the other references' timing: the fastest correct configs so far
    # (a config that drops out of the running top k can never re-enter it, so at most k wait)
    others = any(x.ref.key is not None for x in refs)
    keep = max(0, ctx.opts.references_top_k) if others else 0
    held: list[tuple[Ready, object]] = []
    for start in range(0, len(cids), CHUNK_CONFIGS):
        if ctx.past_deadline():
            skip_shape(ctx, plan_shape, cids[start:], DEADLINE_BEFORE_PREPARE)
            break
        chunk = cids[start:start + CHUNK_CONFIGS]
        ready: list[Ready] = []
        for n, cid in enumerate(chunk):
            if ctx.past_deadline():
                skip_shape(ctx, plan_shape, chunk[n:], DEADLINE_BEFORE_PREPARE)
                break
            _mark(ctx, shape, cid)
            r = prepare_config(ctx, shape, plan_shape, configs[cid], inputs)
            if r is not None:
                ready.append(r)
        timed = time_candidates(ctx, shape, plan_shape, ready, primary)
        pool = held + timed
        top = _fastest_correct(pool, keep)
        top_ids = {r.cid for r, _ in top}
        write_runs(ctx, shape, plan_shape, [(r, t) for r, t in pool if r.cid not in top_ids], primary)
        held = top
    if held and ctx.past_deadline():
        for r, _ in held:
            for ref in refs:
                if ref.ref.key is not None:
                    r.reference_results.append(BaselineResult(
                        name=ref.ref.name, backend=ref.backend or ref.ref.backend, speedup=None,
                        run_status=f"{RunStatus.NOT_RUN}: sweep deadline reached").__dict__)
    elif held:
        time_other_references(ctx, shape, plan_shape, held, refs)
    write_runs(ctx, shape, plan_shape, held, primary)
    ctx.backend.empty_cache()
