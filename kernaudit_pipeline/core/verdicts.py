"""The closed vocabularies of a verdict, and the decision record every output follows.

These are contracts: the runner writes ``RunStatus`` and ``TimingMode`` into its JSONL, the
comparisons stage writes ``Status``, the decision engine writes ``Decision`` into
``report.json`` ``decisions``, and the report, the review queue, the export and the terminal
summary read them back. Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from kernaudit_pipeline.core.values import json_safe


class RunStatus(StrEnum):
    """What happened to one (config, shape) in the runner or the static audit."""

    OK = "OK"
    FAILED_CORRECTNESS = "FAILED_CORRECTNESS"
    OUT_OF_RESOURCES = "OUT_OF_RESOURCES"
    COMPILE_ERROR = "COMPILE_ERROR"
    COMPILE_TIMEOUT = "COMPILE_TIMEOUT"
    PRUNED_SPILL = "PRUNED_SPILL"
    PRUNED_SMEM = "PRUNED_SMEM"
    TIMEOUT = "TIMEOUT"
    CRASHED = "CRASHED"
    OOM = "OOM"
    ERROR = "ERROR"
    NOT_RUN = "NOT_RUN"


# run statuses that mean the kernel ran and produced something untrustworthy
FAILED_RUN_STATUSES = frozenset({
    RunStatus.FAILED_CORRECTNESS, RunStatus.CRASHED, RunStatus.TIMEOUT, RunStatus.OOM,
    RunStatus.COMPILE_ERROR, RunStatus.COMPILE_TIMEOUT, RunStatus.ERROR,
})


class Status(StrEnum):
    """The comparisons stage's verdict on one candidate row.

    INCONCLUSIVE is reserved for a missing or invalid measurement; configs that were never
    timed say why (PRUNED_SPILL, OUT_OF_RESOURCES, NOT_RUN), and a measured speedup whose CI
    straddles 1.0 outside the noise band is NOISY.
    """

    IMPROVED = "IMPROVED"
    REGRESSION = "REGRESSION"
    NEUTRAL = "NEUTRAL"
    NOISY = "NOISY"
    FAILED = "FAILED"
    PRUNED_SPILL = "PRUNED_SPILL"
    OUT_OF_RESOURCES = "OUT_OF_RESOURCES"
    NOT_RUN = "NOT_RUN"
    INCONCLUSIVE = "INCONCLUSIVE"


class DecisionKind(StrEnum):
    SHIP_CONFIG = "SHIP_CONFIG"      # a Triton config beats the baseline: CI above 1 + noise band
    KEEP_BASELINE = "KEEP_BASELINE"  # the best correct config is slower than the baseline
    NO_DECISION = "NO_DECISION"      # noise, nothing correct, or nothing timed


class DataKind(StrEnum):
    """Where a number comes from; shown wherever the number is."""

    MEASURED = "measured"    # timed on a real GPU
    MODELLED = "modelled"    # the synthetic generator's model (samples/synthetic)
    PREDICTED = "predicted"  # the static cost model (kernaudit rank), no GPU at all


class TimingMode(StrEnum):
    EVENTS = "events"          # CUDA events around each call, L2 flushed before each sample
    CUDA_GRAPH = "cuda_graph"  # replays of a captured graph: launch gaps removed (small kernels)


@dataclass(frozen=True)
class BaselineResult:
    """A reference timed paired against the chosen config (issue: several baselines)."""

    name: str                     # what was called, e.g. "torch._scaled_mm"
    backend: str | None           # what actually ran, e.g. "CUTLASS (f8f8bf16_rowwise)"
    speedup: float | None
    speedup_ci_low: float | None = None
    speedup_ci_high: float | None = None
    primary: bool = False
    run_status: str | None = None  # why a reference could not run, when it could not


@dataclass(frozen=True)
class Decision:
    """One (kernel, shape, device) group's verdict. Every other output follows it."""

    kernel_name: str
    shape_name: str | None
    device_name: str | None
    decision: DecisionKind
    config_id: str | None
    speedup: float | None
    speedup_ci_low: float | None
    speedup_ci_high: float | None
    baseline_name: str | None
    data_kind: DataKind
    reason: str
    config: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    baseline_backend: str | None = None
    # registers, spills, shared memory, occupancy limiter, roofline position of the config
    evidence: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))
    baselines: tuple[BaselineResult, ...] = ()
    tied_with: tuple[str, ...] = ()
    candidates: int = 0

    def to_json(self) -> dict:
        return json_safe({
            "kernel_name": self.kernel_name, "shape_name": self.shape_name,
            "device_name": self.device_name, "decision": str(self.decision),
            "config_id": self.config_id, "config": dict(self.config),
            "speedup": self.speedup, "speedup_ci_low": self.speedup_ci_low,
            "speedup_ci_high": self.speedup_ci_high, "baseline_name": self.baseline_name,
            "baseline_backend": self.baseline_backend, "data_kind": str(self.data_kind),
            "reason": self.reason, "evidence": dict(self.evidence),
            "baselines": [b.__dict__ for b in self.baselines],
            "tied_with": list(self.tied_with), "candidates": self.candidates,
        })
