"""One Verifier checks every proposed config before anyone sees it as verified.

It answers the three questions of :class:`~kernaudit_pipeline.recommendations.model.Verification`
separately:

- ``fits``: the new config is recompiled with the static audit (the same specialization as the
  JIT, the same compiler for before and after) and must launch within the device's shared memory
  and, for a spill fix, compile without spills; for the occupancy rule it must fit more blocks
  per SM. Without a kernel module to compile (a seed or foreign kernel) a config that ran
  correctly on the device in the sweep fits by that fact.
- ``faster_than_current``: the sweep's measurement of the new config against the config it
  replaces (intervals, else the noise band).
- ``faster_than_baseline``: the sweep's measurement against the baseline: VERIFIED when the
  interval is above 1 + the noise band, REFUTED when the config was measured slower than the
  baseline (point estimate below 1), UNVERIFIED inside the noise or when not measured. Modelled
  or predicted figures never verify it.

There is one Verifier per stage run: one compile budget (``max_compiles``) and one memo of
compiles and kernel descriptions, shared by the rules' proposals and the advisor's. Kernel
modules are never imported here: the static audit describes them (configs, shapes, source path)
inside its timed workers, so a module that hangs at import cannot hang the audit. A rule's proposal
that the recompile refutes (still spills, still too much shared memory) is refined from the
recompile's own numbers, at most ``refine_steps`` times, and its code records the chain.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from kernaudit_pipeline.comparisons import DEFAULT_NOISE_BAND
from kernaudit_pipeline.core.configs import COLUMN_TO_KERNEL, KERNEL_TO_COLUMN, LAUNCH_KEYS, config_id
from kernaudit_pipeline.core.verdicts import DataKind
from kernaudit_pipeline.kernel_spec import Shape
from kernaudit_pipeline.recommendations.limits import device_limits, occupancy
from kernaudit_pipeline.recommendations.model import (
    Recommendation, Rule, Source, StaticSnapshot, Verification, VerificationState, rec_id_for,
)
from kernaudit_pipeline.recommendations.ranking import Candidate, GroupKey, GroupRanking, decision_band
from kernaudit_pipeline.recommendations.rules import smem_overflow_fix, spill_fix

V = VerificationState
CORE_KEYS = ("block_m", "block_n", "block_k", "num_warps", "num_stages")
# Static-audit messages that say the compile could not run at all (not that the config is bad).
INFRA_FAILURES = ("compile worker failed to start", "compile worker died")
# Rules whose purpose is a config without spills (the recompile must show none).
SPILL_FREE_RULES = frozenset({Rule.REGISTER_SPILL, Rule.SMEM_OVERFLOW})
# Configs adopted as the sweep measured them: a small spill is allowed there (it was timed with it);
# every other proposal must compile without spills.
ADOPT_AS_MEASURED = frozenset({Rule.SHIP_CONFIG, Rule.ADOPT})


class UnsupportedConfig(ValueError):
    """The config names a meta-parameter the kernel does not have."""


@dataclass(frozen=True)
class VerifySettings:
    arch: str | None = None  # None: the device's own (sm_90 for H100/H200)
    timeout_s: float = 300.0
    max_compiles: int | None = None
    max_workers: int | None = None
    cache_dir: str | Path | None = None
    refine_steps: int = 2
    noise_band: float = DEFAULT_NOISE_BAND


# ---------------------------------------------------------------------------------------------
# Config keys. A kernel is known by its description (``static_resources.KernelDescription``:
# name, configs, shapes, path); its meta-parameters are the keys its configs set.
# ---------------------------------------------------------------------------------------------
def kernel_meta_params(kernel: Any) -> set[str]:
    return {k for cfg in kernel.configs for k in cfg} - set(LAUNCH_KEYS)


def to_kernel_config(cfg: Mapping, kernel: Any, template: Mapping | None = None) -> dict:
    """Row keys (``block_m``) to the kernel's (``BLOCK_M``), other meta-parameters from ``template``."""
    params = kernel_meta_params(kernel)
    out = dict(template or {})
    for key, value in cfg.items():
        kkey = COLUMN_TO_KERNEL.get(key, key.upper())
        if key == "split_k" and value == 1 and kkey not in params:
            continue
        if kkey not in params and kkey not in LAUNCH_KEYS:
            raise UnsupportedConfig(f"{kernel.name} has no {kkey} meta-parameter")
        out[kkey] = int(value)
    return out


def to_row_config(kernel_cfg: Mapping) -> dict:
    return {KERNEL_TO_COLUMN.get(k, k.lower()): v for k, v in kernel_cfg.items()}


def template_config(kernel: Any, cfg: Mapping) -> dict:
    """The kernel's config that agrees with ``cfg`` on most keys (ties: the first)."""
    configs = list(kernel.configs)

    def score(pos: int) -> tuple[int, int]:
        low = to_row_config(configs[pos])
        agree = sum(1 for k, v in cfg.items() if low.get(k) == v)
        clash = sum(1 for k, v in cfg.items() if k in low and low[k] != v)
        return (agree - clash, -pos)
    return dict(configs[max(range(len(configs)), key=score)]) if configs else {}


def find_shape(kernel: Any, shape_name: str | None, dims: Mapping) -> Shape | None:
    for shape in kernel.shapes:
        if shape_name and shape.name == shape_name:
            return shape
    for shape in kernel.shapes:
        if dims and all(dims.get(k) == v for k, v in shape.dims.items()):
            return shape
    return None


def configs_match(a: Mapping, b: Mapping) -> bool:
    """Same config: core keys equal when either side has them; others when both do."""
    for key in CORE_KEYS:
        if (key in a or key in b) and a.get(key) != b.get(key):
            return False
    for key in set(a) & set(b) - set(CORE_KEYS):
        if a[key] != b[key]:
            return False
    return a.get("split_k", 1) == b.get("split_k", 1)


def find_candidate(g: GroupRanking | None, cfg: Mapping, cid: str | None = None) -> Candidate | None:
    """The group's measured candidate of this config (an exact config id wins)."""
    if g is None or not cfg:
        return None
    if cid and (exact := g.candidate(cid)) is not None:
        return exact
    return next((c for c in g.candidates if configs_match(dict(c.config), cfg)), None)


# ---------------------------------------------------------------------------------------------
# Static verdicts
# ---------------------------------------------------------------------------------------------
def snapshot(result: Any, device_name: str | None) -> StaticSnapshot:
    blocks = occ = limiter = None
    if result.registers_per_thread is not None and result.shared_mem_bytes is not None:
        threads = result.threads_per_block or 32 * int(result.config.get("num_warps", 4))
        view = occupancy(result.registers_per_thread, threads, result.shared_mem_bytes, device_name)
        blocks, occ, limiter = view.blocks_per_sm, round(view.occupancy_pct, 2), view.limiter
    return StaticSnapshot(
        config_id=result.config_id, registers_per_thread=result.registers_per_thread,
        spill_stores_bytes=result.spill_stores_bytes, spill_loads_bytes=result.spill_loads_bytes,
        shared_mem_bytes=result.shared_mem_bytes, shared_mem_limit_bytes=result.shared_mem_limit_bytes,
        blocks_per_sm=blocks, occupancy_pct=occ, occupancy_limiter=limiter,
        compile_status=str(getattr(result.status, "value", result.status)), arch=result.arch,
    )


def _spill_bytes(s: StaticSnapshot) -> int:
    return (s.spill_stores_bytes or 0) + (s.spill_loads_bytes or 0)


def static_verdict(rec: Recommendation, before: StaticSnapshot | None, after: StaticSnapshot,
                   message: str = "") -> tuple[VerificationState, str]:
    status = after.compile_status
    if status == "COMPILE_TIMEOUT":
        return V.UNVERIFIED, f"the recompile of {after.config_id} timed out"
    if status == "COMPILE_ERROR" and message.startswith(INFRA_FAILURES):
        return V.UNVERIFIED, f"the recompile of {after.config_id} could not run: {message}"
    if status == "COMPILE_ERROR":
        return V.REFUTED, f"{after.config_id} does not compile: {message}"
    if status == "OUT_OF_RESOURCES":
        return V.REFUTED, f"{after.config_id} cannot launch: {message}"
    if after.spill_stores_bytes is None:
        return V.UNVERIFIED, f"the recompile of {after.config_id} reported no spill figures"
    spill = _spill_bytes(after)
    was = ""
    if before and before.spill_stores_bytes is not None:
        was = (f" (the current config: {before.spill_stores_bytes:,} B spill stores + "
               f"{before.spill_loads_bytes or 0:,} B loads)")
    if spill > 0 and rec.rule not in ADOPT_AS_MEASURED:
        return V.REFUTED, (f"{after.config_id} still spills {after.spill_stores_bytes:,} B stores + "
                           f"{after.spill_loads_bytes or 0:,} B loads on {after.arch}")
    spills = "no spills" if spill == 0 else f"spills {after.spill_stores_bytes:,} B stores (measured as is)"
    text = (f"recompiled for {after.arch}: {after.registers_per_thread} registers/thread, {spills}{was}, "
            f"{after.shared_mem_bytes:,} B shared memory within the {after.shared_mem_limit_bytes:,} B limit")
    if rec.rule == Rule.SMEM_OCCUPANCY and before is not None and before.blocks_per_sm is not None:
        if (after.blocks_per_sm or 0) <= before.blocks_per_sm:
            return V.REFUTED, (f"{after.config_id} still fits only {after.blocks_per_sm} block(s)/SM "
                               f"(was {before.blocks_per_sm}); occupancy not raised")
        text += f"; {before.blocks_per_sm} -> {after.blocks_per_sm} blocks/SM"
    return V.VERIFIED, text


# ---------------------------------------------------------------------------------------------
# Measured verdicts
# ---------------------------------------------------------------------------------------------
def _kind_text(c: Candidate) -> str | None:
    if c.data_kind == DataKind.MODELLED:
        return "modelled by the synthetic generator; no GPU timed it"
    if c.data_kind == DataKind.PREDICTED:
        return "predicted by the static cost model; no GPU timed it"
    return None


def versus_baseline(new: Candidate | None, noise_band: float) -> tuple[VerificationState, str]:
    if new is None:
        return V.UNVERIFIED, "not measured in the sweep"
    if (kind := _kind_text(new)) is not None:
        return V.UNVERIFIED, f"{new.label}: {kind}"
    if new.speedup is None:
        return V.UNVERIFIED, f"{new.label} was timed, but no baseline was"
    lo, hi = new.interval()
    band = decision_band(new, noise_band)
    ci = f" [{lo:.3f}, {hi:.3f}]" if new.ci_low is not None and new.ci_high is not None else ""
    paired = "paired" if new.paired else "unpaired"
    text = f"{new.label} measured {new.speedup:.3f}x{ci} the baseline ({paired})"
    if new.speedup < 1.0:
        return V.REFUTED, text + ": slower than the baseline"
    if lo > 1.0 + band:
        return V.VERIFIED, text
    return V.UNVERIFIED, text + f": within the ±{band:.0%} noise band"


def versus_current(current: Candidate | None, new: Candidate | None, noise_band: float,
                   has_current: bool) -> tuple[VerificationState, str]:
    if not has_current:
        return V.NOT_APPLICABLE, ""
    if new is None:
        return V.UNVERIFIED, "the new config was not measured"
    if current is None:
        return V.UNVERIFIED, "the current config was not timed correctly, nothing to compare"
    if (kind := _kind_text(new)) is not None:
        return V.UNVERIFIED, kind
    if new.speedup is None or current.speedup is None:
        gain = current.latency_us / new.latency_us
        text = f"{current.latency_us:.3f} -> {new.latency_us:.3f} us"
    else:
        gain = new.speedup / current.speedup
        text = f"{current.speedup:.3f}x -> {new.speedup:.3f}x the baseline"
        a, b = current.interval(), new.interval()
        if current.ci_low is not None and new.ci_low is not None:
            if b[0] > a[1]:
                return V.VERIFIED, text + " (intervals separate)"
            if b[1] < a[0]:
                return V.REFUTED, text + ": slower, intervals separate"
            return V.UNVERIFIED, text + ": intervals overlap, no significant gain"
    if gain > 1 + noise_band:
        return V.VERIFIED, text
    if gain < 1 - noise_band:
        return V.REFUTED, text + ": slower"
    return V.UNVERIFIED, text + f": within the ±{noise_band:.0%} noise band"


def overall(fits: VerificationState, current: VerificationState, baseline: VerificationState) -> VerificationState:
    if V.REFUTED in (fits, current, baseline):
        return V.REFUTED
    if fits == V.VERIFIED and baseline == V.VERIFIED and current in (V.VERIFIED, V.NOT_APPLICABLE):
        return V.VERIFIED
    return V.UNVERIFIED


# ---------------------------------------------------------------------------------------------
# Compiles
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CompileRequest:
    kernel: Any  # a static_resources.KernelDescription
    shape: Shape
    config: dict  # kernel keys
    arch: str

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.kernel.name, self.shape.name, config_id(self.config), self.arch)


@dataclass
class _Work:
    rec: Recommendation
    kernel: Any = None
    shape: Shape | None = None
    arch: str | None = None
    template: dict | None = None
    before_req: CompileRequest | None = None
    after_req: CompileRequest | None = None
    fits: VerificationState = V.UNVERIFIED
    note: str = ""
    chain: tuple[str, ...] = ()
    done: bool = False


class Verifier:
    """Memoized static compiles with one budget for the whole stage, plus the measured checks."""

    def __init__(self, settings: VerifySettings | None = None,
                 rankings: Mapping[GroupKey, GroupRanking] | None = None) -> None:
        self.settings = settings or VerifySettings()
        self.rankings = dict(rankings or {})
        self.results: dict[tuple[str, str, str, str], Any] = {}
        self.pending: dict[tuple[str, str, str, str], CompileRequest] = {}
        self.over_budget: set[tuple[str, str, str, str]] = set()
        self.failed: dict[tuple[str, str, str, str], str] = {}
        self._kernels: dict[str, Any] | None = None
        self.kernel_failures: dict[str, str] = {}

    # -- kernels and compiles -------------------------------------------------------------------
    def kernel(self, kernel_name: str) -> Any | None:
        """The description of the ``kernels/`` module whose NAME is ``kernel_name``; None for seed,
        synthetic or foreign names. Every module is described once, in the static audit's workers."""
        if self._kernels is None:
            from kernaudit_pipeline import static_resources as sr  # noqa: PLC0415 - heavy only when needed
            from kernaudit_pipeline.kernel_spec import kernel_files  # noqa: PLC0415

            self._kernels = {}
            files = kernel_files()
            for path, desc in zip(files, sr.describe_kernels(files, timeout_s=self.settings.timeout_s,
                                                             max_workers=self.settings.max_workers)):
                if isinstance(desc, sr.KernelFailure):
                    self.kernel_failures[path.stem] = desc.reason
                else:
                    self._kernels[desc.name] = desc
        return self._kernels.get(kernel_name)

    @property
    def compiles(self) -> int:
        return len(self.results)

    def request(self, req: CompileRequest) -> None:
        if req.key in self.results or req.key in self.pending or req.key in self.failed:
            return
        budget = self.settings.max_compiles
        if budget is not None and len(self.results) + len(self.pending) >= budget:
            self.over_budget.add(req.key)
            return
        self.pending[req.key] = req

    def run_compiles(self) -> None:
        if not self.pending:
            return
        from kernaudit_pipeline import static_resources as sr  # noqa: PLC0415
        batches: dict[tuple[str, str], list[CompileRequest]] = {}
        for req in self.pending.values():
            batches.setdefault((req.arch, req.kernel.name), []).append(req)
        for (arch, _name), reqs in batches.items():
            plan = [sr.PlanItem(r.kernel, [dict(r.config)], [r.shape]) for r in reqs]
            report = sr.sweep_report(plan, arch=arch, timeout_s=self.settings.timeout_s,
                                     max_workers=self.settings.max_workers, cache_dir=self.settings.cache_dir,
                                     progress=True)  # a bar with an ETA (core.progress)
            if report.failures:  # one kernel per batch: its results cannot be told apart, keep none
                reason = "; ".join(f"{f.module}: {f.reason}" for f in report.failures)
                self.failed.update({r.key: reason for r in reqs})
                continue
            for req, res in zip(reqs, report.results, strict=True):
                self.results[req.key] = res
        self.pending.clear()

    def _arch_for(self, device_name: str | None) -> str:
        from kernaudit_pipeline.static_resources import ARCHS  # noqa: PLC0415
        arch = self.settings.arch or device_limits(device_name).arch
        return arch if arch in ARCHS else "sm_90"

    # -- recommendations ------------------------------------------------------------------------
    def _prepare(self, work: _Work) -> None:
        rec = work.rec
        if not rec.new_config:
            work.fits, work.note, work.done = V.NOT_APPLICABLE, "no new config to verify", True
            return
        if self.settings.max_compiles == 0:
            work.note, work.done = "static check not run (max_compiles=0)", True
            return
        kernel = self.kernel(rec.kernel_name)
        if kernel is None:
            work.note = (f"no kernel module named {rec.kernel_name!r} in kernels/ (seed, synthetic or "
                         "foreign row): the static check cannot compile it")
            work.done = True
            return
        shape = find_shape(kernel, rec.shape_name, rec.shape_dims)
        if shape is None:
            shown = rec.shape_name or rec.shape_dims or "none"
            work.note = f"the row's shape ({shown}) is not one of {kernel.name}'s shapes; not compiled"
            work.done = True
            return
        work.kernel, work.shape, work.arch = kernel, shape, self._arch_for(rec.device_name)
        work.template = template_config(kernel, rec.current_config or rec.new_config)
        try:
            after = to_kernel_config(rec.new_config, kernel, work.template)
        except UnsupportedConfig as exc:
            work.note = f"{exc}: this needs a kernel change and cannot be compiled as is"
            work.done = True
            return
        try:
            before = to_kernel_config(rec.current_config, kernel, work.template) if rec.current_config else None
        except UnsupportedConfig:
            before = None
        work.after_req = CompileRequest(kernel, shape, after, work.arch)
        self.request(work.after_req)
        if before is not None:
            work.before_req = CompileRequest(kernel, shape, before, work.arch)
            self.request(work.before_req)

    def _refine(self, work: _Work, after: StaticSnapshot) -> Recommendation | None:
        """A next proposal from the recompile's numbers, for rule-made spill/shared-memory fixes."""
        rec = work.rec
        if rec.source != Source.RULES or rec.rule not in SPILL_FREE_RULES:
            return None
        pseudo = dict(rec.new_config or {}, kernel_name=rec.kernel_name, device_name=rec.device_name,
                      registers_per_thread=after.registers_per_thread,
                      spill_stores_bytes=after.spill_stores_bytes, spill_loads_bytes=after.spill_loads_bytes,
                      shared_mem_bytes=after.shared_mem_bytes, head_dim=rec.shape_dims.get("D"))
        step = smem_overflow_fix(pseudo)
        if step is None and _spill_bytes(after) > 0:
            step = spill_fix(pseudo)
        if step is None:
            return None
        action, new, code, rationale, _conf = step
        if not new or new == rec.new_config:
            return None
        chained = f"{rec.code}_then_{code}"
        what = (f"{after.shared_mem_bytes:,} B shared memory over the limit" if after.compile_status == "OUT_OF_RESOURCES"
                else f"{_spill_bytes(after)} B of spills")
        return replace(
            rec, action=action, new_config=new, code=chained,
            rec_id=rec_id_for(rec.kernel_name, rec.shape_name, rec.device_name, rec.current_config, chained, new),
            rationale=f"{rec.rationale}. The recompile of {after.config_id} refuted the first proposal "
                      f"({what}), so: {rationale}",
        )

    def _static_round(self, works: list[_Work]) -> None:
        for step in range(self.settings.refine_steps + 1):
            self.run_compiles()
            again: list[_Work] = []
            for w in works:
                if w.done or w.after_req is None:
                    continue
                res = self.results.get(w.after_req.key)
                if res is None:
                    w.fits, w.done = V.UNVERIFIED, True
                    failed = self.failed.get(w.after_req.key)
                    w.note = (f"the static audit could not describe or compile it: {failed}" if failed
                              else "compile budget exhausted (max_compiles); not compiled")
                    continue
                before_res = self.results.get(w.before_req.key) if w.before_req else None
                before = snapshot(before_res, w.rec.device_name) if before_res is not None else None
                after = snapshot(res, w.rec.device_name)
                state, note = static_verdict(w.rec, before, after, res.message)
                if state == V.REFUTED and step < self.settings.refine_steps:
                    refined = self._refine(w, after)
                    cfg = None
                    if refined is not None:
                        try:
                            cfg = to_kernel_config(refined.new_config, w.kernel, w.template)
                        except UnsupportedConfig:
                            cfg = None
                    if cfg is not None:
                        w.chain += (note,)
                        w.rec = refined
                        w.after_req = CompileRequest(w.kernel, w.shape, cfg, w.arch)
                        self.request(w.after_req)
                        again.append(w)
                        continue
                w.fits, w.note, w.done = state, note, True
                filled = to_row_config(dict(w.after_req.config))
                w.rec = replace(w.rec, new_config={**filled, **(w.rec.new_config or {})},
                                verification=replace(w.rec.verification, static_before=before, static_after=after))
            if not again:
                break

    def verify(self, recs: list[Recommendation]) -> list[Recommendation]:
        """Each recommendation with its ``verification`` filled in (same order)."""
        works = [_Work(rec) for rec in recs]
        for w in works:
            self._prepare(w)
        self._static_round(works)
        return [self._finish(w) for w in works]

    def _finish(self, w: _Work) -> Recommendation:
        rec = w.rec
        if not rec.new_config:
            return replace(rec, verification=Verification(
                state=V.NOT_APPLICABLE, note="no config to verify", fits=V.NOT_APPLICABLE,
                faster_than_current=V.NOT_APPLICABLE, faster_than_baseline=V.NOT_APPLICABLE))
        g = self.rankings.get((rec.kernel_name, rec.shape_name, rec.device_name))
        new = find_candidate(g, rec.new_config, rec.new_config_id)
        current = find_candidate(g, rec.current_config)
        fits, fits_note = w.fits, w.note
        if fits == V.UNVERIFIED and new is not None and new.data_kind == DataKind.MEASURED:
            # no recompile, but the config ran correctly on the device in the sweep: it fits
            if new.spills and rec.rule in SPILL_FREE_RULES:
                fits, fits_note = V.REFUTED, f"{fits_note}; it ran in the sweep but spills"
            else:
                fits = V.VERIFIED
                fits_note = (f"{fits_note}; it ran correctly on {rec.device_name or 'the device'} in the sweep"
                             if fits_note else f"ran correctly on {rec.device_name or 'the device'} in the sweep")
        band = self.settings.noise_band
        b_state, b_note = versus_baseline(new, band)
        c_state, c_note = versus_current(current, new, band, bool(rec.current_config))
        parts = [f"fits: {fits_note}"] if fits_note else []
        if w.chain:
            parts.insert(0, "refined after: " + "; ".join(w.chain))
        if c_note:
            parts.append(f"vs current: {c_note}")
        parts.append(f"vs baseline: {b_note}")
        v = rec.verification
        return replace(rec, verification=replace(
            v, state=overall(fits, c_state, b_state), note=" | ".join(parts), fits=fits,
            faster_than_current=c_state, faster_than_baseline=b_state,
            speedup_new=None if new is None else new.speedup,
            speedup_new_ci=None if new is None or new.ci_low is None else (new.ci_low, new.ci_high),
            speedup_current=None if current is None else current.speedup,
            speedup_current_ci=None if current is None or current.ci_low is None else (current.ci_low,
                                                                                       current.ci_high),
            speedup_paired=None if new is None else new.paired,
            data_kind=None if new is None else new.data_kind))
