"""The ``recommendations`` stage: deterministic tuning rules with evidence.

Each rule reads one row (a kernel_runs row joined with its comparison and
spill diagnosis) and proposes one concrete action with a seed-style code.
The rules never touch the network. Rule order, first match wins:

1. FAILED                       -> fix_correctness_before_tuning
2. spill detected               -> raise num_warps when the fp32 accumulator
   alone needs >= ACC_REGS_WARPS_THRESHOLD registers per thread and warps can
   still double (the H200 table: 128x256 spills at 4 warps, not at 8);
   otherwise halve the larger tile dim (BLOCK_M on a tie), e.g.
   reduce_tile_size_to_32x64_to_relieve_register_pressure
3. invalid or noisy measurement -> remeasure_with_valid_latency_and_baseline
4. IMPROVED and clean           -> adopt_configuration_for_production_profile
5. NEUTRAL                      -> keep_baseline_gain_within_noise_band
6. REGRESSION and clean         -> keep_baseline_and_retune_tile_configuration
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from enum import StrEnum

import pandas as pd

from kernaudit_pipeline.comparisons import Status
from kernaudit_pipeline.spill_diagnostics import spill_detected

# Triton's default when a config does not say.
DEFAULT_NUM_WARPS = 4
MAX_NUM_WARPS_RULE = 8
# 128x256 fp32 accumulator over 4 warps = 256 regs/thread (spills); over 8 = 128 (fits).
ACC_REGS_WARPS_THRESHOLD = 128
MIN_TILE_DIM = 16


class Action(StrEnum):
    SHRINK_TILE = "shrink_tile"
    GROW_TILE = "grow_tile"
    INCREASE_WARPS = "increase_num_warps"
    DECREASE_WARPS = "decrease_num_warps"
    REDUCE_STAGES = "reduce_num_stages"
    REDUCE_BLOCK_K = "reduce_block_k"
    SPLIT_K = "split_k"
    ADOPT = "adopt"
    KEEP_BASELINE = "keep_baseline"
    FIX_CORRECTNESS = "fix_correctness"
    REMEASURE = "remeasure"


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
class Verification:
    state: VerificationState = VerificationState.UNVERIFIED
    note: str = "not verified"
    static_before: dict = field(default_factory=dict)
    static_after: dict = field(default_factory=dict)
    measured_speedup_before: float | None = None
    measured_speedup_after: float | None = None
    measured_speedup_after_ci: tuple[float, float] | None = None


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


def _int(value: object) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return int(f) if math.isfinite(f) else None


def _clean(value: object) -> object:
    if isinstance(value, float) and math.isnan(value):
        return None
    if value is pd.NA:
        return None
    if hasattr(value, "item"):
        return value.item()
    return value


CONFIG_KEYS = ("block_m", "block_n", "block_k", "group_m", "num_warps", "num_stages")


def current_config(row: dict | pd.Series) -> dict:
    return {k: _clean(row.get(k)) for k in CONFIG_KEYS if _clean(row.get(k)) is not None}


def accumulator_regs_per_thread(block_m: int, block_n: int, num_warps: int) -> float:
    """fp32 accumulator registers each thread holds for a BLOCK_M x BLOCK_N tile."""
    return block_m * block_n / (32 * num_warps)


def rec_id_for(kernel: str, shape: object, device: object, config: dict, code: str) -> str:
    payload = json.dumps([kernel, shape, device, config, code], sort_keys=True, default=str)
    return "rec-" + hashlib.sha256(payload.encode()).hexdigest()[:12]


def spill_fix(row: dict | pd.Series) -> tuple[Action, dict, str, str, float]:
    """Pick between more warps and a smaller tile from the accumulator's share."""
    cfg = current_config(row)
    bm, bn = _int(row.get("block_m")), _int(row.get("block_n"))
    warps = _int(row.get("num_warps")) or DEFAULT_NUM_WARPS
    if bm is None or bn is None:
        new = dict(cfg, num_stages=max(1, (_int(row.get("num_stages")) or 2) - 1))
        return (Action.REDUCE_STAGES, new, f"reduce_num_stages_to_{new['num_stages']}_to_relieve_register_pressure",
                "tile dims unknown; fewer pipeline stages hold fewer live registers", 0.4)
    acc = accumulator_regs_per_thread(bm, bn, warps)
    if acc >= ACC_REGS_WARPS_THRESHOLD and warps * 2 <= MAX_NUM_WARPS_RULE:
        new = dict(cfg, num_warps=warps * 2)
        return (Action.INCREASE_WARPS, new, f"increase_num_warps_to_{warps * 2}_to_relieve_register_pressure",
                f"the {bm}x{bn} fp32 accumulator alone needs {acc:.0f} registers/thread at {warps} warps; "
                f"{warps * 2} warps halve that to {acc / 2:.0f} while keeping the tile's data reuse", 0.7)
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


def recommend_row(row: dict | pd.Series) -> Recommendation:
    get = row.get
    status = str(get("status"))
    cfg = current_config(row)
    spill = bool(get("spill_detected")) if get("spill_detected") is not None else spill_detected(row)
    speedup = _clean(get("speedup"))
    evidence: list[Evidence] = []
    if speedup is not None:
        evidence.append(Evidence("speedup", round(float(speedup), 4), 1.0, "comparisons"))
    for col in ("spill_stores_bytes", "spill_loads_bytes", "registers_per_thread", "local_spill_requests"):
        if _clean(get(col)) is not None:
            evidence.append(Evidence(col, _clean(get(col)), 0 if "spill" in col else 255, "kernel_runs"))

    expected = ""
    if status == Status.FAILED:
        action, new, code = Action.FIX_CORRECTNESS, None, "fix_correctness_before_tuning"
        rationale, confidence = f"incorrect or failed run: {get('status_reason')}", 0.9
        expected = "a correct kernel; its speed is meaningless until then"
    elif spill:
        action, new, code, rationale, confidence = spill_fix(row)
        expected = "no spill stores/loads; fewer lg_throttle and long_scoreboard stalls; lower latency"
    elif status == Status.INCONCLUSIVE:
        action, new, code = Action.REMEASURE, None, "remeasure_with_valid_latency_and_baseline"
        rationale, confidence = f"no verdict possible: {get('status_reason')}", 0.8
        expected = "a valid latency and baseline, or more samples, to decide"
    elif status == Status.IMPROVED:
        action, new, code = Action.ADOPT, cfg, "adopt_configuration_for_production_profile"
        rationale, confidence = f"faster than the baseline and no spills: {get('status_reason')}", 0.8
        expected = f"{(float(speedup) - 1) * 100:.1f}% lower latency than the baseline"
    elif status == Status.NEUTRAL:
        action, new, code = Action.KEEP_BASELINE, None, "keep_baseline_gain_within_noise_band"
        rationale, confidence = f"{get('status_reason')}; a custom kernel must earn its maintenance", 0.6
        expected = "no change"
    else:
        action, new, code = Action.KEEP_BASELINE, None, "keep_baseline_and_retune_tile_configuration"
        rationale, confidence = f"clean but slower: {get('status_reason')}", 0.7
        expected = "baseline latency; retune tiles before shipping this kernel"
    kernel = str(get("kernel_name"))
    return Recommendation(
        rec_id=rec_id_for(kernel, _clean(get("shape_name")), _clean(get("device_name")), cfg, code),
        kernel_name=kernel,
        shape_name=_clean(get("shape_name")),
        device_name=_clean(get("device_name")),
        current_config=cfg,
        action=action,
        new_config=new,
        code=code,
        rationale=rationale,
        evidence=tuple(evidence),
        expected_effect=expected,
        confidence=confidence,
    )


def build_recommendations(diagnostics: pd.DataFrame) -> list[Recommendation]:
    return [recommend_row(row) for _, row in diagnostics.iterrows()]
