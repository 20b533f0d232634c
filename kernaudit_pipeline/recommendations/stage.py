"""The ``recommendations`` asset's single entry point, one direction of flow.

    diagnostics frame
      -> ranking   one rule picks each group's config; one decision per group
      -> rules     per-config diagnoses (diagnostics table); the short review queue
      -> heuristics learned per kernel from the sweep
      -> verify    one Verifier (one compile budget, one memo) checks every proposal
      -> advisor   Claude, when a key is set: screened and verified like the rules
      -> StageResult: decisions, recommendations (the queue), heuristics, advisor, diagnoses

The rules and their verification never depend on the network; the advisor adds verified
suggestions when it can and says why when it cannot.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from kernaudit_pipeline.core.values import json_safe
from kernaudit_pipeline.core.verdicts import Decision
from kernaudit_pipeline.recommendations import advice, heuristics as heuristics_lib
from kernaudit_pipeline.recommendations.advisor import (
    AdvisorKind, AdvisorReply, AdvisorSettings, ask, render_prompts, scrub,
)
from kernaudit_pipeline.recommendations.model import (
    Heuristic, Recommendation, RejectedSuggestion, VerificationState, recommendation_to_json,
)
from kernaudit_pipeline.recommendations.ranking import GroupKey, GroupRanking, decide_all, group_rows, rank_groups
from kernaudit_pipeline.recommendations.rules import diagnoses, group_queue
from kernaudit_pipeline.recommendations.verify import Verifier, VerifySettings

log = logging.getLogger(__name__)
MAX_REASON_CHARS = 400


@dataclass(frozen=True)
class AdvisorReport:
    """What the advisor did: the client's reply (which advisor ran, usage), why, Claude's summary,
    and what became of its suggestions and hints."""

    reply: AdvisorReply
    reason: str
    summary: str = ""
    accepted: tuple[Recommendation, ...] = ()
    rejected: tuple[RejectedSuggestion, ...] = ()
    heuristics: tuple[Heuristic, ...] = ()
    rejected_heuristics: tuple[Heuristic, ...] = ()

    def __getattr__(self, name: str) -> Any:
        """The reply's fields (advisor_used, model, settings, tokens, cost, request_id, ...)."""
        if name == "reply":
            raise AttributeError(name)
        return getattr(self.reply, name)

    def note(self) -> str:
        """One line for reports: which advisor ran and why."""
        if self.advisor_used == AdvisorKind.CLAUDE:
            return (f"claude ({self.model}): {len(self.accepted)} suggestion(s) kept, {len(self.rejected)} "
                    f"rejected, {len(self.heuristics)} heuristic(s) kept; {self.reason}")
        return f"rules only: {self.reason}"

    def to_json(self) -> dict[str, Any]:
        r = self.reply
        return json_safe({
            "advisor_used": str(r.advisor_used), "reason": self.reason, "model": r.model,
            "note": self.note(), "summary": self.summary,
            "accepted": [recommendation_to_json(x) for x in self.accepted],
            "rejected": [x.to_json() for x in self.rejected],
            "heuristics": [h.to_json() for h in self.heuristics],
            "rejected_heuristics": [h.to_json() for h in self.rejected_heuristics],
            "usage": {"input_tokens": r.input_tokens, "output_tokens": r.output_tokens,
                      "cache_read_input_tokens": r.cache_read_input_tokens,
                      "cache_creation_input_tokens": r.cache_creation_input_tokens,
                      "cost_usd_estimate": r.cost_usd_estimate, "requests": r.requests,
                      "duration_s": r.duration_s, "request_id": r.request_id},
        })


@dataclass(frozen=True)
class StageResult:
    decisions: tuple[Decision, ...]
    recommendations: tuple[Recommendation, ...]  # the review queue
    heuristics: tuple[Heuristic, ...]  # learned from the sweep (Claude's hints are in advisor)
    advisor: AdvisorReport
    diagnoses: pd.DataFrame = field(default_factory=pd.DataFrame)  # per config, for the diagnostics table
    rankings: dict[GroupKey, GroupRanking] = field(default_factory=dict)
    compiles: int = 0
    duration_s: float | None = None

    def note(self) -> str:
        return self.advisor.note()

    def annotate(self, frame: pd.DataFrame) -> pd.DataFrame:
        """``frame`` (the diagnostics table the stage read) with each config's diagnosis columns:
        the per-config findings live there, not in the review queue."""
        extra = [c for c in self.diagnoses.columns if c.startswith("diagnosis")]
        if frame.empty or self.diagnoses.empty:
            return frame.assign(**{c: None for c in extra if c not in frame.columns})
        keys = ["kernel_name", "shape_name", "device_name"]
        if len(frame) == len(self.diagnoses) and all(
                frame[k].astype(str).tolist() == self.diagnoses[k].astype(str).tolist() for k in keys):
            return frame.assign(**{c: self.diagnoses[c].to_numpy() for c in extra})
        table = self.diagnoses.drop_duplicates([*keys, "config_id"])
        out = frame.merge(table, how="left", on=[*keys, "config_id"], suffixes=("", "_diag"))
        return out[[*frame.columns, *extra]]

    def decision_for(self, key: GroupKey) -> Decision | None:
        return next((d for d in self.decisions if (d.kernel_name, d.shape_name, d.device_name) == key), None)

    def to_json(self) -> dict[str, Any]:
        """The parts ``report.json`` carries: decisions, queue, heuristics, advisor."""
        return {"decisions": [d.to_json() for d in self.decisions],
                "recommendations": [recommendation_to_json(r) for r in self.recommendations],
                "heuristics": [h.to_json() for h in self.heuristics],
                "advisor": self.advisor.to_json()}

    def mlflow_params(self) -> dict[str, str]:
        return {"advisor_used": str(self.advisor.advisor_used), **self.advisor.settings.params()}

    def mlflow_tags(self) -> dict[str, str]:
        a = self.advisor
        return {"advisor_reason": scrub(a.reason)[:MAX_REASON_CHARS],
                **({"advisor_request_id": a.request_id} if a.request_id else {})}

    def mlflow_metrics(self) -> dict[str, float]:
        a = self.advisor
        kinds = Counter(str(d.decision) for d in self.decisions)
        out = {"advisor_input_tokens": float(a.input_tokens), "advisor_output_tokens": float(a.output_tokens),
               "advisor_cache_read_input_tokens": float(a.cache_read_input_tokens),
               "advisor_cache_creation_input_tokens": float(a.cache_creation_input_tokens),
               "advisor_claude_accepted": float(len(a.accepted)), "advisor_claude_rejected": float(len(a.rejected)),
               "decisions": float(len(self.decisions)), "review_queue": float(len(self.recommendations)),
               "heuristics": float(len(self.heuristics)), "verify_compiles": float(self.compiles)}
        out.update({f"decisions_{k.lower()}": float(v) for k, v in kinds.items()})
        if a.cost_usd_estimate is not None:
            out["advisor_cost_usd_estimate"] = float(a.cost_usd_estimate)
        if a.duration_s is not None:
            out["advisor_duration_s"] = float(a.duration_s)
        return out


def consult(frame: pd.DataFrame, rankings: dict[GroupKey, GroupRanking], decisions: list[Decision],
            queue: list[Recommendation], learned: list[Heuristic], verifier: Verifier,
            settings: AdvisorSettings, noise_band: float) -> AdvisorReport:
    """Ask Claude (when it can be asked) and keep what survives screening and verification."""
    sources = advice.kernel_sources(frame, verifier) if settings.include_source and settings.enabled else []
    evidence = advice.prompt_evidence(frame, rankings, decisions, queue, learned, max_rows=settings.max_rows,
                                      max_queue=settings.max_rule_rows, sources=sources)
    system, user = render_prompts(evidence)
    reply = ask(system, user, settings)
    if reply.output is None:
        return AdvisorReport(reply, reply.reason)
    try:
        kept, rejected = advice.screen(reply.output, frame, rankings, queue, verifier)
        hints_ok, hints_bad = advice.check_hints(reply.output.block_size_heuristics, rankings, noise_band)
    except Exception as exc:  # noqa: BLE001 - a bad suggestion must not fail the audit
        log.warning("advisor: screening failed: %s", exc)
        return AdvisorReport(reply, scrub(f"Claude's answer could not be screened: {type(exc).__name__}: {exc}"))
    total = len(kept) + len(rejected)
    reason = f"structured output validated; {len(kept)} of {total} suggestion(s) kept after screening and verification"
    return AdvisorReport(reply, reason, summary=scrub(reply.output.summary), accepted=tuple(kept),
                         rejected=tuple(rejected), heuristics=tuple(hints_ok), rejected_heuristics=tuple(hints_bad))


def run(frame: pd.DataFrame, *, verify_settings: VerifySettings | None = None,
        advisor_settings: AdvisorSettings | None = None, noise_band: float | None = None) -> StageResult:
    """The whole ``recommendations`` stage."""
    started = time.monotonic()
    vs = verify_settings or VerifySettings()
    band = vs.noise_band if noise_band is None else noise_band
    rankings = rank_groups(frame, band)
    decided = decide_all(rankings, band)
    queue: list[Recommendation] = []
    for key, rows in group_rows(frame):
        queue += group_queue(rankings[key], decided[key], rows)
    verifier = Verifier(vs, rankings)
    queue = verifier.verify(queue)
    learned = heuristics_lib.learn(frame, rankings, band)
    settings = advisor_settings or AdvisorSettings.from_env()
    report = consult(frame, rankings, list(decided.values()), queue, learned, verifier, settings, band)
    states = Counter(str(r.verification.state) for r in queue)
    log.info("recommendations: %d decisions, %d queue items (%s), %d heuristics, %d compiles; %s",
             len(decided), len(queue), dict(states), len(learned), verifier.compiles, report.note())
    return StageResult(
        decisions=tuple(decided.values()), recommendations=tuple(queue) + report.accepted,
        heuristics=tuple(learned), advisor=report, diagnoses=diagnoses(frame), rankings=rankings,
        compiles=verifier.compiles, duration_s=time.monotonic() - started)


__all__ = ["AdvisorReport", "StageResult", "VerificationState", "run"]
