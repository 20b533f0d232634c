"""The ``recommendations`` stage: deterministic tuning rules with evidence.

Each rule reads one row (a kernel_runs row joined with its comparison and
spill diagnosis) and proposes one concrete action with a seed-style code.
The rules never touch the network. Rule order, first match wins:

1. shared memory over the block limit (or OUT_OF_RESOURCES)
                                -> fewer stages, a smaller BLOCK_K, or last
                                   a narrower BLOCK_N
2. FAILED                       -> fix_correctness_before_tuning
3. spill detected               -> raise num_warps when the fp32 accumulator
   alone needs >= ACC_REGS_WARPS_THRESHOLD registers per thread and warps can
   still double (the H200 table: 128x256 spills at 4 warps, not at 8), and
   halve the larger tile dim while the accumulator stays over budget;
   otherwise halve the larger tile dim (BLOCK_M on a tie), e.g.
   reduce_tile_size_to_32x64_to_relieve_register_pressure. Attention counts
   the BLOCK_M x HEAD_DIM output tile too; decode attention (no BLOCK_M) the
   BLOCK_N x HEAD_DIM K/V tile.
4. IMPROVED and clean           -> adopt_configuration_for_production_profile
   (with group context: only the group's best measured config is adopted;
   other improving configs are told to switch to it)
5. occupancy limited by shared memory while registers would allow more
   blocks per SM                -> fewer stages, or a smaller BLOCK_K
6. under-filled grid (waves and tail on the device's SM count)
                                -> a smaller tile or split-K
7. invalid or noisy measurement -> remeasure_with_valid_latency_and_baseline
8. NEUTRAL                      -> keep_baseline_gain_within_noise_band
9. REGRESSION and clean         -> keep the baseline; with group context the
   next best measured config of the same (kernel, shape, device) is named

Rules 1, 5 and 6 estimate the new config's footprint; ``verification``
recompiles it before anyone sees it as verified.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from kernaudit_pipeline.core.hardware import SM_RESOURCES, SMResources, resources_for
from kernaudit_pipeline.core.hardware import lookup as lookup_gpu
from kernaudit_pipeline.occupancy import theoretical_occupancy
from kernaudit_pipeline.comparisons import (
    DEFAULT_NOISE_BAND, FAILED_RUN_STATUSES, SKIPPED_RUN_STATUSES, Status,
)
from kernaudit_pipeline.spill_diagnostics import spill_detected
from kernaudit_pipeline.core.values import finite_float as _num, as_int as _int, plain as _clean

# Triton's default when a config does not say.
DEFAULT_NUM_WARPS = 4
MAX_NUM_WARPS_RULE = 8
# 128x256 fp32 accumulator over 4 warps = 256 regs/thread (spills); over 8 = 128 (fits).
ACC_REGS_WARPS_THRESHOLD = 128
# What the accumulator may hold after a fix (128x256 on 8 warps: 220 regs in total, no spill).
ACC_REGS_BUDGET = 128
MIN_TILE_DIM = 16
MIN_BLOCK_K = 16
# Fewer stages than this starve the async copy pipeline; prefer a smaller BLOCK_K first.
MIN_PIPELINE_STAGES = 3
# Below this fraction of the SM slots busy on average over the waves, the grid is under-filled.
WAVE_EFFICIENCY_MIN = 0.80
WAVE_GAIN_MIN = 0.05
SPLIT_K_FACTORS = (2, 4)
MIN_K_ITERATIONS_PER_SPLIT = 4
OUT_OF_SMEM_STATUSES = frozenset({"OUT_OF_RESOURCES", "PRUNED_SMEM"})


class Action(StrEnum):
    SHRINK_TILE = "shrink_tile"
    GROW_TILE = "grow_tile"
    INCREASE_WARPS = "increase_num_warps"
    DECREASE_WARPS = "decrease_num_warps"
    REDUCE_STAGES = "reduce_num_stages"
    REDUCE_BLOCK_K = "reduce_block_k"
    SPLIT_K = "split_k"
    ADOPT = "adopt"
    SWITCH_CONFIG = "switch_config"
    KEEP_BASELINE = "keep_baseline"
    FIX_CORRECTNESS = "fix_correctness"
    REMEASURE = "remeasure"


class Rule(StrEnum):
    """Which rule (or advisor) produced a recommendation."""

    SMEM_OVERFLOW = "smem_overflow"
    FAILED = "failed"
    REGISTER_SPILL = "register_spill"
    ADOPT = "adopt"
    SWITCH_TO_BEST = "switch_to_best"
    SMEM_OCCUPANCY = "smem_limited_occupancy"
    GRID_FILL = "under_filled_grid"
    REMEASURE = "remeasure"
    NEUTRAL = "neutral"
    CLEAN_REGRESSION = "clean_regression"
    CLAUDE = "claude"


class Source(StrEnum):
    RULES = "rules"
    CLAUDE = "claude"


class ReviewState(StrEnum):
    PENDING_REVIEW = "PENDING_REVIEW"
    APPROVED = "APPROVED"
    REJECTED = "REJECTED"


class VerificationState(StrEnum):
    VERIFIED = "VERIFIED"
    UNVERIFIED = "UNVERIFIED"
    REFUTED = "REFUTED"
    NOT_APPLICABLE = "NOT_APPLICABLE"


@dataclass(frozen=True)
class Evidence:
    metric: str
    value: float | int | str | None
    threshold: float | int | str | None = None
    source: str = ""


@dataclass(frozen=True)
class StaticSnapshot:
    """Compile-time footprint of one config (from a recompile or the row itself)."""

    config_id: str | None = None
    registers_per_thread: int | None = None
    spill_stores_bytes: int | None = None
    spill_loads_bytes: int | None = None
    shared_mem_bytes: int | None = None
    shared_mem_limit_bytes: int | None = None
    blocks_per_sm: int | None = None
    occupancy_pct: float | None = None
    occupancy_limiter: str | None = None
    compile_status: str | None = None
    arch: str | None = None


@dataclass(frozen=True)
class Verification:
    """``static_state``: did the recompile show the spill gone and the config fitting?
    ``measured_state``: did the sweep (or a GPU re-run) measure the gain?
    ``state`` combines them: REFUTED if either refutes, VERIFIED only if both verify."""

    state: VerificationState = VerificationState.UNVERIFIED
    note: str = "not verified"
    static_state: VerificationState = VerificationState.UNVERIFIED
    measured_state: VerificationState = VerificationState.UNVERIFIED
    static_before: StaticSnapshot | None = None
    static_after: StaticSnapshot | None = None
    measured_speedup_before: float | None = None
    measured_speedup_before_ci: tuple[float, float] | None = None
    measured_speedup_after: float | None = None
    measured_speedup_after_ci: tuple[float, float] | None = None
    measured_source: str | None = None


@dataclass(frozen=True)
class Recommendation:
    rec_id: str
    kernel_name: str
    shape_name: str | None
    device_name: str | None
    current_config: dict
    action: Action
    new_config: dict | None
    code: str
    rationale: str
    evidence: tuple[Evidence, ...]
    expected_effect: str
    verification: Verification = field(default_factory=Verification)
    confidence: float = 0.5
    source: Source = Source.RULES
    review_state: ReviewState = ReviewState.PENDING_REVIEW
    rule: Rule | None = None
    # Problem dims (M, N, K or B, H, S, D ...): the vLLM export keys configs by M.
    shape_dims: dict = field(default_factory=dict)
    # The next best measured config of the same (kernel, shape, device), when one is known.
    alternative_config: dict | None = None


# ---------------------------------------------------------------------------------------------
# JSON schema: a pydantic mirror of the record. It validates stored recommendations and, in its
# ``AdvisorSuggestion`` part, is the structured-output schema Claude must follow.
# ---------------------------------------------------------------------------------------------
class TileConfig(BaseModel):
    """A tile/warp config in the rows' lowercase keys; absent keys are unknown."""

    model_config = ConfigDict(extra="forbid")
    block_m: int | None = Field(default=None, ge=1)
    block_n: int | None = Field(default=None, ge=1)
    block_k: int | None = Field(default=None, ge=1)
    group_m: int | None = Field(default=None, ge=1)
    num_warps: int | None = Field(default=None, ge=1, le=32)
    num_stages: int | None = Field(default=None, ge=1)
    split_k: int | None = Field(default=None, ge=1)


class EvidenceModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    metric: str
    value: float | int | str | None
    threshold: float | int | str | None = None
    source: str = ""


class AdvisorSuggestion(BaseModel):
    """The part of a recommendation an advisor fills; the rest is kernaudit's to decide."""

    model_config = ConfigDict(extra="forbid")
    kernel_name: str = Field(min_length=1)
    shape_name: str | None = None
    device_name: str | None = None
    current_config: TileConfig
    action: Action
    new_config: TileConfig | None = None
    code: str = Field(min_length=1, description="seed-style snake_case code, e.g. "
                      "reduce_tile_size_to_32x64_to_relieve_register_pressure")
    rationale: str
    evidence: list[EvidenceModel]
    expected_effect: str
    confidence: float = Field(ge=0.0, le=1.0)


class StaticSnapshotModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    config_id: str | None = None
    registers_per_thread: int | None = None
    spill_stores_bytes: int | None = None
    spill_loads_bytes: int | None = None
    shared_mem_bytes: int | None = None
    shared_mem_limit_bytes: int | None = None
    blocks_per_sm: int | None = None
    occupancy_pct: float | None = None
    occupancy_limiter: str | None = None
    compile_status: str | None = None
    arch: str | None = None


class VerificationModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    state: VerificationState
    note: str
    static_state: VerificationState = VerificationState.UNVERIFIED
    measured_state: VerificationState = VerificationState.UNVERIFIED
    static_before: StaticSnapshotModel | None = None
    static_after: StaticSnapshotModel | None = None
    measured_speedup_before: float | None = None
    measured_speedup_before_ci: tuple[float, float] | None = None
    measured_speedup_after: float | None = None
    measured_speedup_after_ci: tuple[float, float] | None = None
    measured_source: str | None = None


# Stored configs may carry a kernel's own meta-parameters (e.g. partition_size), filled in by
# verification from the kernel's CONFIGS; Claude's TileConfig stays closed.
StoredConfig = dict[str, int]


class RecommendationModel(AdvisorSuggestion):
    current_config: StoredConfig  # type: ignore[assignment]
    new_config: StoredConfig | None = None  # type: ignore[assignment]
    rec_id: str = Field(pattern=r"^rec-[0-9a-f]{12}$")
    verification: VerificationModel
    source: Source
    review_state: ReviewState
    rule: Rule | None = None
    shape_dims: dict[str, int] = Field(default_factory=dict)
    alternative_config: StoredConfig | None = None


def recommendation_json_schema() -> dict[str, Any]:
    """JSON schema of one stored recommendation record."""
    return RecommendationModel.model_json_schema()


def _json_default(value: object) -> object:
    if isinstance(value, float) and math.isnan(value):
        return None
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def recommendation_to_json(rec: Recommendation) -> dict[str, Any]:
    """The record as plain JSON types (enums become their values, tuples lists)."""
    return json.loads(json.dumps(asdict(rec), default=_json_default))


def recommendation_from_json(data: dict[str, Any]) -> Recommendation:
    """Validate a stored record (pydantic) and rebuild the frozen dataclass."""
    m = RecommendationModel.model_validate(data)
    v = m.verification

    def snap(s: StaticSnapshotModel | None) -> StaticSnapshot | None:
        return None if s is None else StaticSnapshot(**s.model_dump())

    return Recommendation(
        rec_id=m.rec_id, kernel_name=m.kernel_name, shape_name=m.shape_name, device_name=m.device_name,
        current_config=dict(m.current_config), action=m.action,
        new_config=None if m.new_config is None else dict(m.new_config),
        code=m.code, rationale=m.rationale,
        evidence=tuple(Evidence(**e.model_dump()) for e in m.evidence),
        expected_effect=m.expected_effect,
        verification=Verification(
            state=v.state, note=v.note, static_state=v.static_state, measured_state=v.measured_state,
            static_before=snap(v.static_before), static_after=snap(v.static_after),
            measured_speedup_before=v.measured_speedup_before,
            measured_speedup_before_ci=v.measured_speedup_before_ci,
            measured_speedup_after=v.measured_speedup_after,
            measured_speedup_after_ci=v.measured_speedup_after_ci,
            measured_source=v.measured_source),
        confidence=m.confidence, source=m.source, review_state=m.review_state, rule=m.rule,
        shape_dims=dict(m.shape_dims),
        alternative_config=None if m.alternative_config is None else dict(m.alternative_config),
    )


# ---------------------------------------------------------------------------------------------
# Row helpers
# ---------------------------------------------------------------------------------------------


def _text(value: object) -> str | None:
    v = _clean(value)
    return None if v is None else str(v)


CONFIG_KEYS = ("block_m", "block_n", "block_k", "group_m", "num_warps", "num_stages", "split_k")
SHAPE_DIM_COLUMNS = {"m": "M", "n": "N", "k": "K", "batch": "B", "num_heads": "H",
                     "num_kv_heads": "KV_H", "seq_len": "S", "head_dim": "D"}


def current_config(row: dict | pd.Series) -> dict:
    out = {}
    for k in CONFIG_KEYS:
        v = _int(row.get(k))
        if v is not None:
            out[k] = v
    return out


def shape_dims(row: dict | pd.Series) -> dict:
    out = {}
    for col, dim in SHAPE_DIM_COLUMNS.items():
        v = _int(row.get(col))
        if v is not None:
            out[dim] = v
    return out


def config_label(cfg: dict) -> str:
    """Short readable config name used inside codes: ``128x256x64_w8_s3``."""
    if "block_m" in cfg:
        tile = "x".join(str(cfg[k]) for k in ("block_m", "block_n", "block_k") if k in cfg)
    else:  # e.g. decode attention: only the K/V block is tiled
        tile = "_".join(f"b{k[-1]}{cfg[k]}" for k in ("block_n", "block_k") if k in cfg)
    parts = [tile] if tile else []
    if "num_warps" in cfg:
        parts.append(f"w{cfg['num_warps']}")
    if "num_stages" in cfg:
        parts.append(f"s{cfg['num_stages']}")
    if cfg.get("split_k", 1) > 1:
        parts.append(f"splitk{cfg['split_k']}")
    return "_".join(parts) or "unknown"


def accumulator_regs_per_thread(block_m: int, block_n: int, num_warps: int,
                                head_dim: int | None = None) -> float:
    """fp32 accumulator registers each thread holds for a BLOCK_M x BLOCK_N tile.

    For attention (``head_dim`` given) the O tile (BLOCK_M x D) and the score tile
    (BLOCK_M x BLOCK_N) are both live.
    """
    cols = block_n + (head_dim or 0)
    return block_m * cols / (32 * num_warps)


def rec_id_for(kernel: str, shape: object, device: object, config: dict, code: str,
               source: Source = Source.RULES) -> str:
    parts: list[object] = [kernel, shape, device, config, code]
    if source != Source.RULES:
        parts.append(str(source))
    payload = json.dumps(parts, sort_keys=True, default=str)
    return "rec-" + hashlib.sha256(payload.encode()).hexdigest()[:12]


# ---------------------------------------------------------------------------------------------
# Device limits and occupancy (model-level; the recompile is what verifies)
# ---------------------------------------------------------------------------------------------
# When a row names no known device, shared-memory limits default to sm_90's (the audit's
# reference device class); the SM count stays unknown, so the wave rule does not fire.
REFERENCE_CC = "9.0"


@dataclass(frozen=True)
class DeviceLimits:
    """A flat view of ``gpu_specs`` for the rules; ``sm_count`` is None for an unknown device."""

    sm_count: int | None
    smem_per_block_max_bytes: int
    smem_per_sm_bytes: int
    regs_per_sm: int
    max_warps_per_sm: int
    max_blocks_per_sm: int
    arch: str
    known_device: bool


def _sm(device_name: object, compute_capability: object = None) -> SMResources:
    return resources_for(device_name, compute_capability) or SM_RESOURCES[REFERENCE_CC]


def device_limits(device_name: object, compute_capability: object = None) -> DeviceLimits:
    spec = lookup_gpu(device_name)
    sm = _sm(device_name, compute_capability)
    return DeviceLimits(
        sm_count=spec.sm_count if spec else None,
        smem_per_block_max_bytes=sm.smem_per_block_optin_bytes,
        smem_per_sm_bytes=sm.smem_per_sm_bytes,
        regs_per_sm=sm.regs_per_sm,
        max_warps_per_sm=sm.max_warps_per_sm,
        max_blocks_per_sm=sm.max_blocks_per_sm,
        arch="sm_" + sm.compute_capability.replace(".", ""),
        known_device=spec is not None,
    )


@dataclass(frozen=True)
class OccupancyView:
    blocks_per_sm: int
    limiter: str | None  # registers | shared_mem | warps | blocks (ncu's names); None: cannot launch
    blocks_by_registers: int
    blocks_by_shared_mem: int
    occupancy_pct: float


def occupancy(registers_per_thread: int, threads_per_block: int, shared_mem_bytes: int,
              device_name: object = None, compute_capability: object = None) -> OccupancyView:
    """Blocks per SM and their limiter, by :mod:`occupancy` (cuda_occupancy.h arithmetic)."""
    occ = theoretical_occupancy(_sm(device_name, compute_capability), registers_per_thread=registers_per_thread,
                                threads_per_block=threads_per_block, shared_mem_bytes=shared_mem_bytes)
    return OccupancyView(occ.blocks_per_sm, None if occ.limiter is None else str(occ.limiter),
                         occ.limit_registers, occ.limit_shared_mem, occ.occupancy_pct)


def row_occupancy(row: dict | pd.Series) -> OccupancyView | None:
    """The diagnostics' occupancy columns when present, else computed from the row's resources."""
    blocks, by_regs, by_smem = (_int(row.get(c)) for c in (
        "blocks_per_sm", "occupancy_limit_registers", "occupancy_limit_shared_mem"))
    if None not in (blocks, by_regs, by_smem):
        return OccupancyView(blocks, _text(row.get("occupancy_limiter")), by_regs, by_smem,
                             _num(row.get("occupancy_pct")) or 0.0)
    regs = _int(row.get("registers_per_thread"))
    smem = _int(row.get("shared_mem_bytes"))
    warps = _int(row.get("num_warps")) or DEFAULT_NUM_WARPS
    threads = _int(row.get("threads_per_block")) or 32 * warps
    if regs is None or smem is None:
        return None
    return occupancy(regs, threads, smem, row.get("device_name"), row.get("compute_capability"))


# ---------------------------------------------------------------------------------------------
# Rule bodies
# ---------------------------------------------------------------------------------------------
RuleResult = tuple[Action, dict | None, str, str, float]


def spill_fix(row: dict | pd.Series) -> RuleResult:
    """Pick between more warps and a smaller tile from the accumulator's share."""
    cfg = current_config(row)
    bm, bn = _int(row.get("block_m")), _int(row.get("block_n"))
    warps = _int(row.get("num_warps")) or DEFAULT_NUM_WARPS
    head_dim = _int(row.get("head_dim"))
    if bm is None and bn is not None and head_dim:
        return _decode_spill_fix(cfg, bn, warps, head_dim)
    if bm is None or bn is None:
        new = dict(cfg, num_stages=max(1, (_int(row.get("num_stages")) or 2) - 1))
        return (Action.REDUCE_STAGES, new, f"reduce_num_stages_to_{new['num_stages']}_to_relieve_register_pressure",
                "tile dims unknown; fewer pipeline stages hold fewer live registers", 0.4)
    acc = accumulator_regs_per_thread(bm, bn, warps, head_dim)
    if acc >= ACC_REGS_WARPS_THRESHOLD:
        nw = warps
        while accumulator_regs_per_thread(bm, bn, nw, head_dim) > ACC_REGS_BUDGET and nw * 2 <= MAX_NUM_WARPS_RULE:
            nw *= 2
        nbm, nbn = bm, bn
        while accumulator_regs_per_thread(nbm, nbn, nw, head_dim) > ACC_REGS_BUDGET:
            if nbm >= nbn and nbm // 2 >= MIN_TILE_DIM:
                nbm //= 2
            elif nbn // 2 >= MIN_TILE_DIM:
                nbn //= 2
            else:
                break
        after = accumulator_regs_per_thread(nbm, nbn, nw, head_dim)
        what = "O and score tiles alone need" if head_dim else "fp32 accumulator alone needs"
        if (nbm, nbn) == (bm, bn) and nw != warps:
            new = dict(cfg, num_warps=nw)
            return (Action.INCREASE_WARPS, new, f"increase_num_warps_to_{nw}_to_relieve_register_pressure",
                    f"the {bm}x{bn} {what} {acc:.0f} registers/thread at {warps} warps; "
                    f"{nw} warps cut that to {after:.0f} while keeping the tile's data reuse", 0.7)
        if (nbm, nbn) != (bm, bn):
            new = dict(cfg, block_m=nbm, block_n=nbn, num_warps=nw)
            with_warps = f"_with_{nw}_warps" if nw != warps else ""
            return (Action.SHRINK_TILE, new,
                    f"reduce_tile_size_to_{nbm}x{nbn}{with_warps}_to_relieve_register_pressure",
                    f"the {bm}x{bn} {what} {acc:.0f} registers/thread at {warps} warps; "
                    + (f"{nw} warps are the most this rule uses, so " if nw != warps or warps * 2 > MAX_NUM_WARPS_RULE
                       else "")
                    + f"{nbm}x{nbn} on {nw} warps brings it to {after:.0f}", 0.65)
    if bm >= bn and bm // 2 >= MIN_TILE_DIM:
        nbm, nbn = bm // 2, bn
    elif bn // 2 >= MIN_TILE_DIM:
        nbm, nbn = bm, bn // 2
    else:
        nbm, nbn = bm, bn
    new = dict(cfg, block_m=nbm, block_n=nbn)
    return (Action.SHRINK_TILE, new, f"reduce_tile_size_to_{nbm}x{nbn}_to_relieve_register_pressure",
            f"the accumulator is only {acc:.0f} registers/thread, so the pressure comes from operands and "
            f"pipelining: halving the larger tile dim ({bm}x{bn} -> {nbm}x{nbn}) halves the live tile", 0.6)


def _decode_spill_fix(cfg: dict, bn: int, warps: int, head_dim: int) -> RuleResult:
    """Decode attention (no BLOCK_M): each program streams BLOCK_N keys of HEAD_DIM; the
    BLOCK_N x HEAD_DIM tile per thread plays the accumulator's part."""
    tile = accumulator_regs_per_thread(bn, head_dim, warps)
    nw, nbn = warps, bn
    while accumulator_regs_per_thread(nbn, head_dim, nw) > ACC_REGS_BUDGET and nw * 2 <= MAX_NUM_WARPS_RULE:
        nw *= 2
    while accumulator_regs_per_thread(nbn, head_dim, nw) > ACC_REGS_BUDGET and nbn // 2 >= MIN_TILE_DIM:
        nbn //= 2
    if (nw, nbn) == (warps, bn):  # already within budget: halve the K/V block anyway
        nbn = max(MIN_TILE_DIM, bn // 2)
    after = accumulator_regs_per_thread(nbn, head_dim, nw)
    new = dict(cfg, block_n=nbn, num_warps=nw)
    if nbn == bn:
        code = f"increase_num_warps_to_{nw}_to_relieve_register_pressure"
        action = Action.INCREASE_WARPS
    else:
        code = (f"reduce_block_n_to_{nbn}" + (f"_with_{nw}_warps" if nw != warps else "")
                + "_to_relieve_register_pressure")
        action = Action.SHRINK_TILE
    return (action, new, code,
            f"the {bn}x{head_dim} K/V tile is {tile:.0f} values per thread on {warps} warp(s); "
            f"BLOCK_N={nbn} on {nw} warp(s) makes it {after:.0f}", 0.5)


def _estimated_smem_bytes(row: dict | pd.Series) -> int | None:
    """The row's shared memory, or the GEMM pipeline estimate stages*(BM+BN)*BK*elem."""
    smem = _int(row.get("shared_mem_bytes"))
    if smem is not None:
        return smem
    bm, bn, bk, st = (_int(row.get(c)) for c in ("block_m", "block_n", "block_k", "num_stages"))
    if None in (bm, bn, bk, st):
        return None
    elem = {"fp8": 1, "fp32": 4, "tf32": 4}.get(str(row.get("dtype") or "")[:4].rstrip("e"), 2)
    return st * (bm + bn) * bk * elem


def _smem_shrink(cfg: dict, smem: int, target_bytes: int) -> tuple[Action, dict, int] | None:
    """Fewest-change config whose estimated shared memory is at most target_bytes.

    Shared memory is dominated by the pipelined operand buffers, proportional to
    num_stages and to BLOCK_K. Stages go first while at least MIN_PIPELINE_STAGES
    remain; then BLOCK_K halves; then stages go down to 2; last, the largest
    streamed tile dim halves (BLOCK_N, the K/V block of attention kernels).
    """
    stages, bk = cfg.get("num_stages"), cfg.get("block_k")
    if not stages:
        return _tile_halving(cfg, smem, target_bytes)
    per_stage = smem / stages
    for s in range(stages - 1, MIN_PIPELINE_STAGES - 1, -1):
        if per_stage * s <= target_bytes:
            return Action.REDUCE_STAGES, dict(cfg, num_stages=s), int(per_stage * s)
    if bk:
        nbk = bk
        while nbk // 2 >= MIN_BLOCK_K:
            nbk //= 2
            if smem * nbk / bk <= target_bytes:
                return Action.REDUCE_BLOCK_K, dict(cfg, block_k=nbk), int(smem * nbk / bk)
    for s in range(min(stages - 1, MIN_PIPELINE_STAGES - 1), 1, -1):
        if per_stage * s <= target_bytes:
            return Action.REDUCE_STAGES, dict(cfg, num_stages=s), int(per_stage * s)
    return _tile_halving(cfg, smem, target_bytes)


def _tile_halving(cfg: dict, smem: int, target_bytes: int) -> tuple[Action, dict, int] | None:
    bm, bn, bk = cfg.get("block_m"), cfg.get("block_n"), cfg.get("block_k")
    nbn = bn
    while nbn and nbn // 2 >= MIN_TILE_DIM:
        nbn //= 2
        # GEMM operand buffers scale with (BM + BN); attention K/V buffers with BN alone
        est = smem * (bm + nbn) / (bm + bn) if bm and bk else smem * nbn / bn
        if est <= target_bytes:
            return Action.SHRINK_TILE, dict(cfg, block_n=nbn), int(est)
    return None


def _smem_fix_code(action: Action, new: dict, purpose: str) -> str:
    what = {Action.REDUCE_STAGES: f"num_stages_to_{new.get('num_stages')}",
            Action.REDUCE_BLOCK_K: f"block_k_to_{new.get('block_k')}"}.get(action, f"block_n_to_{new.get('block_n')}")
    return f"reduce_{what}_to_{purpose}"


def smem_overflow_fix(row: dict | pd.Series) -> RuleResult | None:
    limits = device_limits(row.get("device_name"), row.get("compute_capability"))
    smem = _estimated_smem_bytes(row)
    status = _text(row.get("run_status"))
    if smem is None:
        return None
    if smem <= limits.smem_per_block_max_bytes and status not in OUT_OF_SMEM_STATUSES:
        return None
    if smem <= limits.smem_per_block_max_bytes:
        return None  # out of resources for another reason (registers, threads): not this rule
    found = _smem_shrink(current_config(row), smem, limits.smem_per_block_max_bytes)
    if found is None:
        return None
    action, new, est = found
    return (action, new, _smem_fix_code(action, new, "fit_shared_memory"),
            f"needs {smem:,} B of shared memory per block, over the {limits.smem_per_block_max_bytes:,} B "
            f"opt-in limit of {limits.arch}; the launch fails. {config_label(new)} needs about {est:,} B", 0.8)


def smem_occupancy_fix(row: dict | pd.Series) -> RuleResult | None:
    view = row_occupancy(row)
    smem = _int(row.get("shared_mem_bytes"))
    if view is None or smem is None or view.limiter != "shared_mem":
        return None
    flagged = row.get("smem_limited")
    if _clean(flagged) is not None and not bool(flagged):
        return None  # the SRAM diagnosis says shared memory does not bind
    if view.blocks_by_registers <= view.blocks_by_shared_mem:
        return None  # registers (or warps) would cap occupancy anyway: less SRAM buys nothing
    limits = device_limits(row.get("device_name"), row.get("compute_capability"))
    want = view.blocks_by_shared_mem + 1
    target = limits.smem_per_sm_bytes // want - _sm(row.get("device_name")).smem_reserved_per_block_bytes
    found = _smem_shrink(current_config(row), smem, target)
    if found is None:
        return None
    action, new, est = found
    return (action, new, _smem_fix_code(action, new, "raise_occupancy"),
            f"shared memory ({smem:,} B/block) limits occupancy to {view.blocks_by_shared_mem} block(s)/SM "
            f"while registers would allow {view.blocks_by_registers}; {config_label(new)} needs about "
            f"{est:,} B, room for {want}", 0.5)


def wave_efficiency(grid_size: int, slots: int) -> tuple[float, float]:
    """(waves, efficiency): efficiency = average busy fraction of the SM slots over the waves."""
    waves = grid_size / slots
    return waves, waves / math.ceil(waves)


def grid_fill_fix(row: dict | pd.Series) -> RuleResult | None:
    grid = _int(row.get("grid_size"))
    if grid is None or grid <= 0:
        return None
    limits = device_limits(row.get("device_name"), row.get("compute_capability"))
    if limits.sm_count is None:
        return None  # an unknown device's SM count is unknown: no wave arithmetic
    view = row_occupancy(row)
    per_sm = max(1, view.blocks_per_sm) if view else 1
    slots = limits.sm_count * per_sm
    waves, eff = wave_efficiency(grid, slots)
    if eff >= WAVE_EFFICIENCY_MIN:
        return None
    cfg = current_config(row)
    bm, bn, bk = cfg.get("block_m"), cfg.get("block_n"), cfg.get("block_k")
    m, n, k = (_int(row.get(c)) for c in ("m", "n", "k"))
    split = cfg.get("split_k", 1)
    candidates: list[tuple[float, int, Action, dict]] = []
    for dim in ("block_m", "block_n"):
        cur = cfg.get(dim)
        if not cur or cur // 2 < MIN_TILE_DIM:
            continue
        new = dict(cfg, **{dim: cur // 2})
        if bm and bn and m and n:
            new_grid = math.ceil(m / new["block_m"]) * math.ceil(n / new["block_n"]) * split
        else:
            new_grid = grid * 2
        if new_grid == grid:
            continue
        candidates.append((wave_efficiency(new_grid, slots)[1], 0, Action.SHRINK_TILE, new))
    if k and bk:
        for s in SPLIT_K_FACTORS:
            if k / (bk * split * s) < MIN_K_ITERATIONS_PER_SPLIT:
                continue
            candidates.append((wave_efficiency(grid * s, slots)[1], 1, Action.SPLIT_K, dict(cfg, split_k=split * s)))
    if not candidates:
        return None
    best_eff, _, action, new = max(candidates, key=lambda c: (round(c[0], 3), -c[1]))
    if best_eff < eff + WAVE_GAIN_MIN:
        return None
    sms = limits.sm_count
    if action == Action.SPLIT_K:
        code = f"split_k_by_{new['split_k']}_to_fill_{sms}_sms"
        how = f"splitting K {new['split_k']} ways"
    else:
        code = f"reduce_tile_size_to_{new.get('block_m')}x{new.get('block_n')}_to_fill_{sms}_sms"
        how = f"a {new.get('block_m')}x{new.get('block_n')} tile"
    return (action, new, code,
            f"a grid of {grid} blocks on {sms} SMs x {per_sm} block(s)/SM is {waves:.2f} waves: the SMs are "
            f"busy {eff:.0%} of the time on average; {how} raises that to {best_eff:.0%}", 0.45)


# ---------------------------------------------------------------------------------------------
# Group context: the measured ranking of a (kernel, shape, device)
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GroupContext:
    """What the group's sweep measured, for rules that compare configs."""

    best_config: dict | None
    best_speedup: float | None
    best_status: str | None
    ranked: tuple[tuple[dict, float | None, float], ...] = ()  # (config, speedup, latency_us), fastest first

    def next_best_excluding(self, cfg: dict) -> tuple[dict, float | None] | None:
        for other, speedup, _lat in self.ranked:
            if other != cfg:
                return other, speedup
        return None

    def is_best(self, cfg: dict) -> bool:
        return self.best_config is not None and cfg == self.best_config


def _evidence(row: dict | pd.Series) -> list[Evidence]:
    get = row.get
    evidence: list[Evidence] = []
    speedup = _num(get("speedup"))
    if speedup is not None:
        evidence.append(Evidence("speedup", round(speedup, 4), 1.0, "comparisons"))
    for col in ("spill_stores_bytes", "spill_loads_bytes", "registers_per_thread", "local_spill_requests"):
        if _clean(get(col)) is not None:
            evidence.append(Evidence(col, _clean(get(col)), 0 if "spill" in col else 255, "kernel_runs"))
    return evidence


def recommend_row(row: dict | pd.Series, context: GroupContext | None = None) -> Recommendation:
    get = row.get
    status = str(get("status"))
    cfg = current_config(row)
    spill = bool(get("spill_detected")) if _clean(get("spill_detected")) is not None else spill_detected(row)
    speedup = _num(get("speedup"))
    evidence = _evidence(row)
    limits = device_limits(get("device_name"), get("compute_capability"))
    alternative = None

    expected = ""
    overflow = smem_overflow_fix(row)
    if overflow is not None:
        action, new, code, rationale, confidence = overflow
        rule = Rule.SMEM_OVERFLOW
        evidence.append(Evidence("shared_mem_bytes", _estimated_smem_bytes(row), limits.smem_per_block_max_bytes,
                                 "kernel_runs" if _int(get("shared_mem_bytes")) is not None else "estimate"))
        expected = "the config launches (today it fails with OUT_OF_RESOURCES)"
    elif status == Status.FAILED:
        action, new, code, rule = Action.FIX_CORRECTNESS, None, "fix_correctness_before_tuning", Rule.FAILED
        rationale, confidence = f"incorrect or failed run: {get('status_reason')}", 0.9
        expected = "a correct kernel; its speed is meaningless until then"
    elif spill:
        action, new, code, rationale, confidence = spill_fix(row)
        rule = Rule.REGISTER_SPILL
        expected = "no spill stores/loads; fewer lg_throttle and long_scoreboard stalls; lower latency"
    elif status == Status.IMPROVED and (context is None or context.is_best(cfg)
                                        or context.best_status != Status.IMPROVED):
        action, new, code, rule = Action.ADOPT, cfg, "adopt_configuration_for_production_profile", Rule.ADOPT
        rationale, confidence = f"faster than the baseline and no spills: {get('status_reason')}", 0.8
        if context is not None and context.is_best(cfg) and len(context.ranked) > 1:
            rationale += f"; the best of {len(context.ranked)} measured configs of this shape"
        expected = f"{(float(speedup) - 1) * 100:.1f}% lower latency than the baseline"
    elif status == Status.IMPROVED and context is not None and context.best_config is not None:
        best = context.best_config
        action, new, rule = Action.SWITCH_CONFIG, dict(best), Rule.SWITCH_TO_BEST
        code = f"switch_to_{config_label(best)}_best_measured_configuration"
        rationale = (f"faster than the baseline ({speedup:.2f}x) but {config_label(best)} measured "
                     f"{context.best_speedup:.2f}x on the same shape and device")
        confidence = 0.75
        evidence.append(Evidence("best_measured_speedup", round(context.best_speedup or 0.0, 4),
                                 round(speedup or 0.0, 4), "best_config"))
        expected = f"{context.best_speedup:.2f}x the baseline instead of {speedup:.2f}x"
    elif (occ := smem_occupancy_fix(row)) is not None:
        action, new, code, rationale, confidence = occ
        rule = Rule.SMEM_OCCUPANCY
        view = row_occupancy(row)
        evidence.append(Evidence("blocks_per_sm_by_shared_mem", view.blocks_by_shared_mem,
                                 view.blocks_by_registers, "occupancy"))
        evidence.append(Evidence("shared_mem_bytes", _int(get("shared_mem_bytes")), None, "kernel_runs"))
        expected = "one more resident block per SM to hide memory latency"
    elif (grid := grid_fill_fix(row)) is not None:
        action, new, code, rationale, confidence = grid
        rule = Rule.GRID_FILL
        view = row_occupancy(row)
        slots = limits.sm_count * (max(1, view.blocks_per_sm) if view else 1)
        waves, eff = wave_efficiency(_int(get("grid_size")), slots)
        evidence.append(Evidence("grid_size", _int(get("grid_size")), slots, "kernel_runs"))
        evidence.append(Evidence("wave_efficiency", round(eff, 4), WAVE_EFFICIENCY_MIN, "model"))
        expected = "fewer idle SMs in the last wave; lower latency if the kernel is not memory-bound"
    elif status == Status.INCONCLUSIVE:
        action, new, code, rule = Action.REMEASURE, None, "remeasure_with_valid_latency_and_baseline", Rule.REMEASURE
        rationale, confidence = f"no verdict possible: {get('status_reason')}", 0.8
        expected = "a valid latency and baseline, or more samples, to decide"
    elif status == Status.NEUTRAL:
        action, new, code, rule = Action.KEEP_BASELINE, None, "keep_baseline_gain_within_noise_band", Rule.NEUTRAL
        rationale, confidence = f"{get('status_reason')}; a custom kernel must earn its maintenance", 0.6
        expected = "no change"
    else:
        action, new, rule = Action.KEEP_BASELINE, None, Rule.CLEAN_REGRESSION
        code = "keep_baseline_and_retune_tile_configuration"
        rationale, confidence = f"clean but slower: {get('status_reason')}", 0.7
        expected = "baseline latency; retune tiles before shipping this kernel"
        nxt = context.next_best_excluding(cfg) if context is not None else None
        if nxt is not None:
            alt, alt_speedup = nxt
            alternative = dict(alt)
            code = f"keep_baseline_next_best_measured_{config_label(alt)}"
            alt_text = "unknown" if alt_speedup is None else f"{alt_speedup:.2f}x"
            rationale += f"; the next best measured config here is {config_label(alt)} at {alt_text}"
            if alt_speedup is not None:
                evidence.append(Evidence("next_best_speedup", round(alt_speedup, 4), 1.0, "best_config"))
    if alternative is None and context is not None and rule not in (Rule.ADOPT, Rule.SWITCH_TO_BEST):
        if context.best_config is not None and context.best_config != cfg:
            alternative = dict(context.best_config)

    kernel = str(get("kernel_name"))
    shape = _text(get("shape_name"))
    device = _text(get("device_name"))
    return Recommendation(
        rec_id=rec_id_for(kernel, shape, device, cfg, code),
        kernel_name=kernel,
        shape_name=shape,
        device_name=device,
        current_config=cfg,
        action=action,
        new_config=new,
        code=code,
        rationale=rationale,
        evidence=tuple(evidence),
        expected_effect=expected,
        confidence=confidence,
        rule=rule,
        shape_dims=shape_dims(row),
        alternative_config=alternative,
    )


def group_contexts(diagnostics: pd.DataFrame, noise_band: float = DEFAULT_NOISE_BAND
                   ) -> dict[tuple[str, str | None, str | None], GroupContext]:
    """Measured ranking per (kernel, shape, device), from ``best_config``."""
    from kernaudit_pipeline.best_config import best_configs, eligible_rows  # noqa: PLC0415

    out: dict[tuple[str, str | None, str | None], GroupContext] = {}
    bests = {b.key: b for b in best_configs(diagnostics, noise_band=noise_band)}
    elig = eligible_rows(diagnostics)
    for key, rows in group_rows(elig):
        ranked = tuple(
            (current_config(r), _num(r.get("speedup")), float(r["latency_us"]))
            for _, r in rows.sort_values("latency_us", kind="stable").iterrows()
        )
        best = bests.get(key)
        out[key] = GroupContext(
            best_config=None if best is None else dict(best.config),
            best_speedup=None if best is None else best.speedup,
            best_status=None if best is None else best.status,
            ranked=ranked,
        )
    return out


def group_key(row: dict | pd.Series) -> tuple[str, str | None, str | None]:
    return (str(row.get("kernel_name")), _text(row.get("shape_name")), _text(row.get("device_name")))


def group_rows(frame: pd.DataFrame):
    """Yield ((kernel, shape, device), rows) groups in first-seen order."""
    if frame.empty:
        return
    keys = [group_key(r) for _, r in frame.iterrows()]
    frame = frame.assign(_gkey=keys)
    for key, rows in frame.groupby("_gkey", sort=False):
        yield key, rows.drop(columns="_gkey")


def build_recommendations(diagnostics: pd.DataFrame, *, noise_band: float = DEFAULT_NOISE_BAND,
                          use_group_context: bool = True) -> list[Recommendation]:
    """One recommendation per row, with the group's measured ranking when it has one.

    Rows that describe the same (kernel, shape, device, config) with the same
    outcome (e.g. a runner row and its ncu row) collapse into one record.
    """
    contexts = group_contexts(diagnostics, noise_band) if use_group_context and not diagnostics.empty else {}
    recs: dict[str, Recommendation] = {}
    for _, row in diagnostics.iterrows():
        ctx = contexts.get(group_key(row))
        rec = recommend_row(row, ctx)
        recs.setdefault(rec.rec_id, rec)
    return list(recs.values())


def is_timed_ok(row: dict | pd.Series) -> bool:
    """A correct, completed, timed row (what the measured ranking may use)."""
    status = _text(row.get("run_status"))
    if status in FAILED_RUN_STATUSES or status in SKIPPED_RUN_STATUSES:
        return False
    correct = _clean(row.get("correct"))
    if correct is not None and not bool(correct):
        return False
    if str(row.get("status")) == Status.FAILED:
        return False
    lat = _num(row.get("latency_us"))
    return lat is not None and lat > 0
