"""The records of the recommendations stage, and their JSON schema.

Everything else in the package builds on these: the ranking and the rules make
``Recommendation`` and ``Heuristic`` records, the verifier fills their
``Verification``, the review trail binds a person's approval to
:func:`content_sha256` of a record, and the export writes only what that hash
still matches. The pydantic models mirror the dataclasses: they validate the
stored ``recommendations.json`` and, in their ``AdvisorOutput`` part, are the
structured-output type Claude must answer in.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kernaudit_pipeline.core.values import json_safe
from kernaudit_pipeline.core.verdicts import DataKind, DecisionKind


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


# Actions that propose no kernel config (nothing to compile, nothing to export).
NO_CONFIG_ACTIONS = frozenset({Action.KEEP_BASELINE, Action.FIX_CORRECTNESS, Action.REMEASURE})


class Rule(StrEnum):
    """Which rule (or advisor) produced a recommendation.

    The first group diagnoses one config (the per-config rules ``assess`` and the
    diagnostics table use); the second states a group's decision in the review queue.
    """

    SMEM_OVERFLOW = "smem_overflow"
    FAILED = "failed"
    REGISTER_SPILL = "register_spill"
    ADOPT = "adopt"
    SMEM_OCCUPANCY = "smem_limited_occupancy"
    GRID_FILL = "under_filled_grid"
    REMEASURE = "remeasure"
    NEUTRAL = "neutral"
    CLEAN_REGRESSION = "clean_regression"
    SHIP_CONFIG = "ship_config"
    KEEP_BASELINE = "keep_baseline"
    NO_DECISION = "no_decision"
    CLAUDE = "claude"


class Source(StrEnum):
    RULES = "rules"
    CLAUDE = "claude"


class ReviewState(StrEnum):
    PENDING_REVIEW = "PENDING_REVIEW"
    APPROVED = "APPROVED"
    REJECTED = "REJECTED"
    # approved once, but the recommendation's content changed since: approve it again
    STALE = "STALE"


class VerificationState(StrEnum):
    VERIFIED = "VERIFIED"
    UNVERIFIED = "UNVERIFIED"
    REFUTED = "REFUTED"
    NOT_APPLICABLE = "NOT_APPLICABLE"


class HeuristicKind(StrEnum):
    WARPS_FOR_TILE = "warps_for_tile"      # "128x256 tiles spill at 4 warps; use 8"
    STAGES_FOR_TILE = "stages_for_tile"    # "128x256x128 tiles do not fit 3 stages; use at most 2"
    CONFIG_FOR_SHAPES = "config_for_shapes"  # "BM64 BN128 BK128 w4 s3 is best for M <= 16"
    CLAUDE_HINT = "claude_hint"            # Claude's block-size hint for an M bucket


@dataclass(frozen=True)
class Evidence:
    metric: str
    value: float | int | str | None
    threshold: float | int | str | None = None
    source: str = ""


@dataclass(frozen=True)
class StaticSnapshot:
    """Compile-time footprint of one config (from a recompile, or as the row reports it)."""

    __pydantic_config__ = ConfigDict(extra="forbid")  # validated as part of a stored record

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
    """Three separate questions, never one word for all of them.

    ``fits``: does the new config compile and launch within the device's registers and shared
    memory (and, for a spill fix, without spilling)? That is static evidence.
    ``faster_than_current``: was the new config measured faster than the config it replaces?
    ``faster_than_baseline``: was it measured faster than the baseline (its paired interval above
    1 + the noise band)? Modelled or predicted numbers never verify a measured claim.

    ``state`` sums them up: REFUTED when any of them is refuted, VERIFIED only when ``fits`` and
    ``faster_than_baseline`` are verified and ``faster_than_current`` is verified or does not
    apply, UNVERIFIED otherwise; NOT_APPLICABLE when there is no config to check.
    """

    __pydantic_config__ = ConfigDict(extra="forbid")  # validated as part of a stored record

    state: VerificationState = VerificationState.UNVERIFIED
    note: str = "not verified"
    fits: VerificationState = VerificationState.UNVERIFIED
    faster_than_current: VerificationState = VerificationState.UNVERIFIED
    faster_than_baseline: VerificationState = VerificationState.UNVERIFIED
    static_before: StaticSnapshot | None = None
    static_after: StaticSnapshot | None = None
    speedup_current: float | None = None
    speedup_current_ci: tuple[float, float] | None = None
    speedup_new: float | None = None
    speedup_new_ci: tuple[float, float] | None = None
    speedup_paired: bool | None = None
    data_kind: DataKind | None = None  # where the measured part comes from
    measured_source: str | None = None


def refuted_fit(v: Verification) -> bool:
    """Refuted for a reason other than speed (it does not compile, launch, or lose its spills):
    such a config can be neither approved nor exported. A config refuted only because it was
    measured slower can be approved by a person, and exported with ``--allow-slower``."""
    return v.fits == VerificationState.REFUTED or (
        v.state == VerificationState.REFUTED
        and VerificationState.REFUTED not in (v.faster_than_baseline, v.faster_than_current))


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
    # Problem dims (M, N, K or B, H, S, D ...): the vLLM export keys configs by M and names files by N, K.
    shape_dims: dict = field(default_factory=dict)
    # The group decision this item states or serves (None for a single config's diagnosis).
    decision: DecisionKind | None = None
    data_kind: DataKind = DataKind.MEASURED
    dtype: str | None = None
    # The kernel's own id of the new config (it also names meta-parameters without a column).
    new_config_id: str | None = None


@dataclass(frozen=True)
class Heuristic:
    """A per-kernel block-size rule learned from the sweep (or suggested by Claude), checked."""

    kernel_name: str
    device_name: str | None
    kind: HeuristicKind
    text: str
    when: dict  # the configs or shapes it is about, e.g. {"block_m": 128, "block_n": 256}
    avoid: dict  # e.g. {"num_warps": 4}
    use: dict  # e.g. {"num_warps": 8}
    support: int  # rows (or groups) that agree
    counterexamples: int = 0
    verification: VerificationState = VerificationState.UNVERIFIED
    note: str = ""
    source: Source = Source.RULES
    data_kind: DataKind = DataKind.MEASURED

    def to_json(self) -> dict[str, Any]:
        return json_safe(asdict(self))


@dataclass(frozen=True)
class RejectedSuggestion:
    """An advisor suggestion that was not kept, and why (reported, never queued)."""

    recommendation: Recommendation | None
    reason: str
    summary: str = ""

    def to_json(self) -> dict[str, Any]:
        rec = None if self.recommendation is None else recommendation_to_json(self.recommendation)
        return {"summary": self.summary, "reason": self.reason, "recommendation": rec}


# ---------------------------------------------------------------------------------------------
# Pydantic mirror: the stored record's schema and the advisor's structured-output type.
# ---------------------------------------------------------------------------------------------
Warps = Literal[1, 2, 4, 8, 16, 32]


class TileConfig(BaseModel):
    """A tile/warp config in the rows' lowercase keys; absent keys are unknown."""

    model_config = ConfigDict(extra="forbid")
    block_m: int | None = Field(default=None, ge=1, le=4096)
    block_n: int | None = Field(default=None, ge=1, le=4096)
    block_k: int | None = Field(default=None, ge=1, le=4096)
    group_m: int | None = Field(default=None, ge=1, le=4096)
    num_warps: Warps | None = None
    num_stages: int | None = Field(default=None, ge=1, le=16)
    split_k: int | None = Field(default=None, ge=1, le=1024)


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


class BlockSizeHint(BaseModel):
    """Best config for batch sizes up to ``m_max`` (a vLLM-style M bucket)."""

    model_config = ConfigDict(extra="forbid")
    kernel_name: str = Field(min_length=1)
    device_name: str | None = None
    m_max: int = Field(ge=1)
    block_m: int = Field(ge=1, le=4096)
    block_n: int = Field(ge=1, le=4096)
    block_k: int | None = Field(default=None, ge=1, le=4096)
    group_m: int | None = Field(default=None, ge=1, le=4096)
    num_warps: Warps
    num_stages: int = Field(ge=1, le=16)
    rationale: str


class AdvisorOutput(BaseModel):
    """What Claude answers: ``messages.parse`` validates the reply against this type."""

    model_config = ConfigDict(extra="forbid")
    summary: str
    recommendations: list[AdvisorSuggestion]
    block_size_heuristics: list[BlockSizeHint]


# Stored configs may carry a kernel's own meta-parameters (e.g. partition_size), filled in by
# verification from the kernel's CONFIGS; Claude's TileConfig stays closed.
StoredConfig = dict[str, int]


class RecommendationModel(AdvisorSuggestion):
    current_config: StoredConfig  # type: ignore[assignment]
    new_config: StoredConfig | None = None  # type: ignore[assignment]
    rec_id: str = Field(pattern=r"^rec-[0-9a-f]{12}$")
    verification: Verification
    source: Source
    review_state: ReviewState
    rule: Rule | None = None
    shape_dims: dict[str, int] = Field(default_factory=dict)
    decision: DecisionKind | None = None
    data_kind: DataKind = DataKind.MEASURED
    dtype: str | None = None
    new_config_id: str | None = None


def recommendation_json_schema() -> dict[str, Any]:
    """JSON schema of one stored recommendation record."""
    return RecommendationModel.model_json_schema()


def recommendation_to_json(rec: Recommendation) -> dict[str, Any]:
    """The record as plain JSON types (enums become their values, tuples lists)."""
    return json_safe(asdict(rec))


def recommendation_from_json(data: Mapping[str, Any]) -> Recommendation:
    """Validate a stored record (pydantic) and rebuild the frozen dataclass."""
    m = RecommendationModel.model_validate(data)
    return Recommendation(
        rec_id=m.rec_id, kernel_name=m.kernel_name, shape_name=m.shape_name, device_name=m.device_name,
        current_config=dict(m.current_config), action=m.action,
        new_config=None if m.new_config is None else dict(m.new_config),
        code=m.code, rationale=m.rationale,
        evidence=tuple(Evidence(**e.model_dump()) for e in m.evidence),
        expected_effect=m.expected_effect,
        verification=m.verification,
        confidence=m.confidence, source=m.source, review_state=m.review_state, rule=m.rule,
        shape_dims=dict(m.shape_dims), decision=m.decision, data_kind=m.data_kind, dtype=m.dtype,
        new_config_id=m.new_config_id,
    )


def rec_id_for(kernel: str, shape: object, device: object, config: Mapping, code: str,
               new_config: Mapping | None = None, source: Source = Source.RULES) -> str:
    """A stable id: the same finding on the same group keeps its id across audits."""
    parts: list[object] = [kernel, shape, device, dict(config), code]
    if new_config:
        parts.append(dict(new_config))
    if source != Source.RULES:
        parts.append(str(source))
    payload = json.dumps(json_safe(parts), sort_keys=True, default=str)
    return "rec-" + hashlib.sha256(payload.encode()).hexdigest()[:12]


def canonical_content(rec: Recommendation) -> str:
    """The text an approval signs: every field except the review state, keys sorted, compact.

    The review state is the trail's to say, so it is left out; anything else that changes
    (the config, the code, the verification, the evidence) changes the hash.
    """
    body = recommendation_to_json(rec)
    body.pop("review_state", None)
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def content_sha256(rec: Recommendation) -> str:
    return hashlib.sha256(canonical_content(rec).encode()).hexdigest()
