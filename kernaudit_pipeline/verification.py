"""Check every proposed config before anyone sees it as verified.

Static check: the new config is recompiled with the static audit (same
specialization as the JIT, same compiler for before and after) to show the
spill is gone, shared memory fits and, for the occupancy rule, that more
blocks fit per SM. Measured check: when the sweep timed the new config on the
same (kernel, shape, device), its speedup and interval are attached and
compared with the current config's.

``state`` is VERIFIED only when both checks verify, REFUTED when either
refutes, NOT_APPLICABLE when there is no new config, and UNVERIFIED otherwise,
with the note saying which part is missing (no kernel module, shape unknown,
not measured, modelled rather than measured, compile timed out ...).

A rule's proposal that the recompile refutes (still spills, still too much
shared memory) is refined from the recompile's own numbers, at most
``refine_steps`` times, and the code records the chain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pandas as pd

from kernaudit_pipeline.comparisons import DEFAULT_NOISE_BAND
from kernaudit_pipeline.core.values import finite_float as _num
from kernaudit_pipeline.core.configs import config_id
from kernaudit_pipeline.kernel_spec import Shape
from kernaudit_pipeline.recommendations import (
    Action, Recommendation, Rule, Source, StaticSnapshot, VerificationState,
    current_config, device_limits, group_key, is_timed_ok, occupancy, rec_id_for,
    smem_overflow_fix, spill_fix,
)

V = VerificationState
LOWER_TO_KERNEL = {"block_m": "BLOCK_M", "block_n": "BLOCK_N", "block_k": "BLOCK_K",
                   "group_m": "GROUP_M", "split_k": "SPLIT_K",
                   "num_warps": "num_warps", "num_stages": "num_stages"}
KERNEL_TO_LOWER = {v: k for k, v in LOWER_TO_KERNEL.items()}
LAUNCH_KEYS = ("num_warps", "num_stages")
CORE_KEYS = ("block_m", "block_n", "block_k", "num_warps", "num_stages")
# Static-audit messages that say the compile could not run at all (not that the config is bad).
INFRA_FAILURES = ("compile worker failed to start", "compile worker died")


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
# Kernel modules and config keys
# ---------------------------------------------------------------------------------------------
_MODULES: dict[str, ModuleType | None] = {}


def kernel_module(kernel_name: str) -> ModuleType | None:
    """The ``kernels/`` module whose NAME is ``kernel_name``; None for seed or synthetic-only names."""
    if kernel_name not in _MODULES:
        from kernaudit_pipeline import static_resources  # noqa: PLC0415 - torch/triton only when needed
        try:
            mod = static_resources.resolve_kernel(kernel_name)
            _MODULES[kernel_name] = mod if getattr(mod, "NAME", None) == kernel_name else None
        except (LookupError, FileNotFoundError):
            _MODULES[kernel_name] = None
    return _MODULES[kernel_name]


def kernel_meta_params(module: ModuleType) -> set[str]:
    return {p.name for p in module.KERNEL.params if p.is_constexpr}


def to_kernel_config(cfg: dict, module: ModuleType, template: dict | None = None) -> dict:
    """Row keys (``block_m``) to the module's (``BLOCK_M``), other constexprs filled from ``template``."""
    params = kernel_meta_params(module)
    out = {k: v for k, v in (template or {}).items()}
    for key, value in cfg.items():
        kkey = LOWER_TO_KERNEL.get(key, key.upper())
        if key == "split_k" and value == 1 and kkey not in params:
            continue
        if kkey not in params and kkey not in LAUNCH_KEYS:
            raise UnsupportedConfig(f"{module.NAME} has no {kkey} meta-parameter")
        out[kkey] = int(value)
    return out


def to_row_config(kernel_cfg: dict) -> dict:
    return {KERNEL_TO_LOWER.get(k, k.lower()): v for k, v in kernel_cfg.items()}


def template_config(module: ModuleType, cfg: dict) -> dict:
    """The module's CONFIGS entry that agrees with ``cfg`` on most keys (ties: the first)."""
    def score(entry: dict) -> tuple[int, int]:
        low = to_row_config(entry)
        agree = sum(1 for k, v in cfg.items() if low.get(k) == v)
        clash = sum(1 for k, v in cfg.items() if k in low and low[k] != v)
        return (agree - clash, -module.CONFIGS.index(entry))
    return dict(max(module.CONFIGS, key=score)) if module.CONFIGS else {}


def find_shape(module: ModuleType, shape_name: str | None, dims: dict) -> Shape | None:
    for shape in module.SHAPES:
        if shape_name and shape.name == shape_name:
            return shape
    for shape in module.SHAPES:
        if dims and all(dims.get(k) == v for k, v in shape.dims.items()):
            return shape
    return None


def configs_match(a: dict, b: dict) -> bool:
    """Same config: core keys equal when either side has them; others when both do."""
    for key in CORE_KEYS:
        if (key in a or key in b) and a.get(key) != b.get(key):
            return False
    for key in set(a) & set(b) - set(CORE_KEYS):
        if a[key] != b[key]:
            return False
    return a.get("split_k", 1) == b.get("split_k", 1)


# ---------------------------------------------------------------------------------------------
# Compiles, batched through one static-audit sweep per round
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CompileRequest:
    module: ModuleType
    shape: Shape
    config: dict  # kernel keys
    arch: str

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.module.NAME, self.shape.name, config_id(self.config), self.arch)


class Compiler:
    """Memoized static compiles with a budget; one sweep (one worker pool) per round."""

    def __init__(self, settings: VerifySettings) -> None:
        self.settings = settings
        self.results: dict[tuple[str, str, str, str], Any] = {}
        self.pending: dict[tuple[str, str, str, str], CompileRequest] = {}
        self.over_budget: set[tuple[str, str, str, str]] = set()

    def request(self, req: CompileRequest) -> None:
        if req.key in self.results or req.key in self.pending:
            return
        budget = self.settings.max_compiles
        if budget is not None and len(self.results) + len(self.pending) >= budget:
            self.over_budget.add(req.key)
            return
        self.pending[req.key] = req

    def run(self) -> None:
        if not self.pending:
            return
        from kernaudit_pipeline import static_resources as sr  # noqa: PLC0415
        by_arch: dict[str, list[CompileRequest]] = {}
        for req in self.pending.values():
            by_arch.setdefault(req.arch, []).append(req)
        for arch, reqs in by_arch.items():
            plan = [sr.PlanItem(r.module, [dict(r.config)], [r.shape]) for r in reqs]
            results = sr.sweep(plan, arch=arch, timeout_s=self.settings.timeout_s,
                               max_workers=self.settings.max_workers, cache_dir=self.settings.cache_dir,
                               progress=False)
            for req, res in zip(reqs, results, strict=True):
                self.results[req.key] = res
        self.pending.clear()

    def get(self, req: CompileRequest) -> Any | None:
        return self.results.get(req.key)


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
    if spill > 0:
        return V.REFUTED, (f"{after.config_id} still spills {after.spill_stores_bytes:,} B stores + "
                           f"{after.spill_loads_bytes or 0:,} B loads on {after.arch}")
    text = (f"recompiled for {after.arch}: {after.registers_per_thread} registers/thread, no spills{was}, "
            f"{after.shared_mem_bytes:,} B shared memory within the {after.shared_mem_limit_bytes:,} B limit")
    if rec.rule == Rule.SMEM_OCCUPANCY and before is not None and before.blocks_per_sm is not None:
        if (after.blocks_per_sm or 0) <= before.blocks_per_sm:
            return V.REFUTED, (f"{after.config_id} still fits only {after.blocks_per_sm} block(s)/SM "
                               f"(was {before.blocks_per_sm}); occupancy not raised")
        text += f"; {before.blocks_per_sm} -> {after.blocks_per_sm} blocks/SM"
    return V.VERIFIED, text


# ---------------------------------------------------------------------------------------------
# Measured check
# ---------------------------------------------------------------------------------------------
def _ci(row: pd.Series) -> tuple[float, float] | None:
    lo, hi = row.get("speedup_ci_low"), row.get("speedup_ci_high")
    try:
        lo, hi = float(lo), float(hi)
    except (TypeError, ValueError):
        return None
    return (lo, hi) if math.isfinite(lo) and math.isfinite(hi) else None


def _speedup(row: pd.Series | None) -> float | None:
    if row is None:
        return None
    try:
        f = float(row.get("speedup"))
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


class FrameIndex:
    """Rows of the diagnostics frame by (kernel, shape, device)."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self.groups: dict[tuple, list[tuple[dict, pd.Series]]] = {}
        for _, row in frame.iterrows():
            self.groups.setdefault(group_key(row), []).append((current_config(row), row))

    def find(self, key: tuple, cfg: dict, timed_only: bool = False, kernel_config_id: str | None = None
             ) -> pd.Series | None:
        """The row of this config; an exact ``config_id`` match wins (it also tells apart
        meta-parameters that have no kernel_runs column, e.g. PARTITION_SIZE)."""
        found = [row for c, row in self.groups.get(key, []) if configs_match(c, cfg)
                 and (not timed_only or is_timed_ok(row))]
        exact = [row for row in found if kernel_config_id and str(row.get("config_id")) == kernel_config_id]
        found = exact or found
        if not found:
            return None
        return max(found, key=lambda r: (is_timed_ok(r), _num(r.get("latency_samples")) or 0.0))


def measured_verdict(rec: Recommendation, before: pd.Series | None, after: pd.Series | None,
                     noise_band: float) -> tuple[VerificationState, str, dict]:
    fields: dict[str, Any] = {}
    if after is None:
        return V.UNVERIFIED, "gain not measured: the sweep has no timed run of the new config", fields
    s_after, ci_after = _speedup(after), _ci(after)
    s_before = _speedup(before) if before is not None and is_timed_ok(before) else None
    ci_before = _ci(before) if s_before is not None else None
    fields.update(measured_speedup_after=s_after, measured_speedup_after_ci=ci_after,
                  measured_speedup_before=s_before, measured_speedup_before_ci=ci_before,
                  measured_source=str(after.get("source_format")) if pd.notna(after.get("source_format")) else None)
    if str(after.get("source_format")) == "synthetic":
        return V.UNVERIFIED, (f"speedup {s_after:.2f}x is modelled by the synthetic generator, "
                              "not measured"), fields
    if s_after is None:
        return V.UNVERIFIED, "the new config's run has no speedup", fields
    if s_before is None:
        return V.VERIFIED, f"measured {s_after:.2f}x the baseline", fields
    if rec.action == Action.ADOPT:
        return (V.VERIFIED if s_after > 1.0 else V.REFUTED), f"measured {s_after:.2f}x the baseline", fields
    text = f"measured {s_before:.2f}x -> {s_after:.2f}x the baseline"
    if ci_before and ci_after:
        if ci_after[0] > ci_before[1]:
            return V.VERIFIED, text + " (intervals separate)", fields
        if ci_after[1] < ci_before[0]:
            return V.REFUTED, text + ": slower, intervals separate", fields
        return V.UNVERIFIED, text + ": intervals overlap, no significant gain", fields
    gain = s_after / s_before
    if gain > 1 + noise_band:
        return V.VERIFIED, text, fields
    if gain < 1 - noise_band:
        return V.REFUTED, text + ": slower", fields
    return V.UNVERIFIED, text + f": within the ±{noise_band:.0%} noise band", fields


def combine(static: VerificationState, measured: VerificationState) -> VerificationState:
    if V.REFUTED in (static, measured):
        return V.REFUTED
    if static == V.VERIFIED and measured == V.VERIFIED:
        return V.VERIFIED
    return V.UNVERIFIED


# ---------------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------------
@dataclass
class _Work:
    rec: Recommendation
    module: ModuleType | None = None
    shape: Shape | None = None
    arch: str | None = None
    template: dict | None = None
    before_req: CompileRequest | None = None
    after_req: CompileRequest | None = None
    static_state: VerificationState = V.UNVERIFIED
    static_note: str = ""
    chain: tuple[str, ...] = ()
    done: bool = False


def _arch_for(device_name: str | None, settings: VerifySettings) -> str:
    from kernaudit_pipeline.static_resources import ARCHS  # noqa: PLC0415
    arch = settings.arch or device_limits(device_name).arch
    return arch if arch in ARCHS else "sm_90"


def _prepare(work: _Work, settings: VerifySettings, compiler: Compiler) -> None:
    rec = work.rec
    if not rec.new_config:
        work.static_state, work.static_note, work.done = V.NOT_APPLICABLE, "no new config to verify", True
        return
    module = kernel_module(rec.kernel_name)
    if module is None:
        work.static_note = (f"no kernel module named {rec.kernel_name!r} in kernels/ (seed or synthetic "
                            "row): the static check cannot compile it")
        work.done = True
        return
    shape = find_shape(module, rec.shape_name, rec.shape_dims)
    if shape is None:
        shown = rec.shape_name or rec.shape_dims or "none"
        work.static_note = f"the row's shape ({shown}) is not one of {module.NAME}'s shapes; not compiled"
        work.done = True
        return
    work.module, work.shape, work.arch = module, shape, _arch_for(rec.device_name, settings)
    work.template = template_config(module, rec.current_config)
    try:
        after = to_kernel_config(rec.new_config, module, work.template)
    except UnsupportedConfig as exc:
        work.static_note = f"{exc}: this needs a kernel change and cannot be compiled as is"
        work.done = True
        return
    try:
        before = to_kernel_config(rec.current_config, module, work.template) if rec.current_config else None
    except UnsupportedConfig:
        before = None
    work.after_req = CompileRequest(module, shape, after, work.arch)
    compiler.request(work.after_req)
    if before is not None:
        work.before_req = CompileRequest(module, shape, before, work.arch)
        compiler.request(work.before_req)


def _refine(work: _Work, after: StaticSnapshot) -> Recommendation | None:
    """A next proposal from the recompile's numbers, for rule-made spill/shared-memory fixes."""
    rec = work.rec
    if rec.source != Source.RULES:
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
    return replace(
        rec, action=action, new_config=new, code=chained,
        rec_id=rec_id_for(rec.kernel_name, rec.shape_name, rec.device_name, rec.current_config, chained),
        rationale=f"{rec.rationale}. The recompile of {after.config_id} refuted the first proposal "
                  f"({_describe(after)}), so: {rationale}",
    )


def _describe(s: StaticSnapshot) -> str:
    if s.compile_status == "OUT_OF_RESOURCES":
        return f"{s.shared_mem_bytes:,} B shared memory over the limit"
    return f"{_spill_bytes(s)} B of spills"


def verify_recommendations(recs: list[Recommendation], frame: pd.DataFrame | None = None,
                           settings: VerifySettings | None = None) -> list[Recommendation]:
    """Each recommendation with its ``verification`` filled in (same order)."""
    settings = settings or VerifySettings()
    frame = frame if frame is not None else pd.DataFrame()
    index = FrameIndex(frame)
    compiler = Compiler(settings)
    works = [_Work(rec) for rec in recs]
    for w in works:
        _prepare(w, settings, compiler)

    for step in range(settings.refine_steps + 1):
        compiler.run()
        again: list[_Work] = []
        for w in works:
            if w.done or w.after_req is None:
                continue
            res = compiler.get(w.after_req)
            if res is None:
                w.static_state, w.done = V.UNVERIFIED, True
                w.static_note = "compile budget exhausted (max_compiles); not compiled"
                continue
            before_res = compiler.get(w.before_req) if w.before_req else None
            before = snapshot(before_res, w.rec.device_name) if before_res is not None else None
            after = snapshot(res, w.rec.device_name)
            state, note = static_verdict(w.rec, before, after, res.message)
            if state == V.REFUTED and step < settings.refine_steps and w.rec.rule in (
                    Rule.REGISTER_SPILL, Rule.SMEM_OVERFLOW):
                refined = _refine(w, after)
                if refined is not None:
                    try:
                        cfg = to_kernel_config(refined.new_config, w.module, w.template)
                    except UnsupportedConfig:
                        cfg = None
                    if cfg is not None:
                        w.chain += (note,)
                        w.rec = refined
                        w.after_req = CompileRequest(w.module, w.shape, cfg, w.arch)
                        compiler.request(w.after_req)
                        again.append(w)
                        continue
            w.static_state, w.static_note, w.done = state, note, True
            filled = to_row_config(dict(w.after_req.config))
            w.rec = replace(w.rec, new_config={**filled, **(w.rec.new_config or {})},
                            verification=replace(w.rec.verification, static_before=before, static_after=after))
        if not again:
            break

    out: list[Recommendation] = []
    for w in works:
        rec = w.rec
        if rec.new_config:
            key = (rec.kernel_name, rec.shape_name, rec.device_name)
            ids = [config_id(r.config) if r is not None else None for r in (w.before_req, w.after_req)]
            before_row = index.find(key, rec.current_config, kernel_config_id=ids[0]) if rec.current_config else None
            after_row = index.find(key, rec.new_config, timed_only=True, kernel_config_id=ids[1])
            m_state, m_note, m_fields = measured_verdict(rec, before_row, after_row, settings.noise_band)
        else:
            m_state, m_note, m_fields = V.NOT_APPLICABLE, "", {}
        if w.static_state == V.NOT_APPLICABLE:
            state = V.NOT_APPLICABLE
        else:
            state = combine(w.static_state, m_state)
        parts = [f"static: {w.static_note}"] if w.static_note else []
        if w.chain:
            parts.insert(0, "refined after: " + "; ".join(w.chain))
        if m_note:
            parts.append(f"measured: {m_note}")
        v = rec.verification
        if v.static_before is None and rec.current_config:
            row = index.find((rec.kernel_name, rec.shape_name, rec.device_name), rec.current_config)
            if row is not None:
                v = replace(v, static_before=reported_snapshot(row))
        out.append(replace(rec, verification=replace(
            v, state=state, static_state=w.static_state, measured_state=m_state,
            note=" | ".join(parts) or "nothing to verify", **m_fields)))
    return out


def reported_snapshot(row: pd.Series) -> StaticSnapshot | None:
    """The footprint the row itself reports (not recompiled here)."""
    def num(col: str) -> int | None:
        try:
            f = float(row.get(col))
        except (TypeError, ValueError):
            return None
        return int(f) if math.isfinite(f) else None
    if all(num(c) is None for c in ("registers_per_thread", "spill_stores_bytes", "shared_mem_bytes")):
        return None
    return StaticSnapshot(
        config_id=None if pd.isna(row.get("config_id")) else str(row.get("config_id")),
        registers_per_thread=num("registers_per_thread"), spill_stores_bytes=num("spill_stores_bytes"),
        spill_loads_bytes=num("spill_loads_bytes"), shared_mem_bytes=num("shared_mem_bytes"),
        shared_mem_limit_bytes=device_limits(row.get("device_name")).smem_per_block_max_bytes,
        compile_status="reported")
