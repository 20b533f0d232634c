"""The Claude advisor: tuning commentary and block-size heuristics on top of the rules.

The prompt (Jinja2 templates ``advisor_system.j2`` / ``advisor_user.j2``)
holds the normalized evidence: the runs as CSV, the best measured config per
(kernel, shape, device) and the rules' recommendations with their
verification. Kernel source goes in only with ``include_source=True``.

Claude answers in structured output (``output_config.format`` = the JSON
schema of :class:`AdvisorOutput`), validated with pydantic; free text is never
parsed. Every config it proposes, including the heuristics', goes through the
same static verification as the rules' (``verification.py``); refuted or
out-of-evidence suggestions are kept in ``rejected`` with the reason.

With no ``ANTHROPIC_API_KEY``, or on any failure (timeout, 429/5xx after the
SDK's retries with backoff, schema-invalid or truncated output), the audit
goes on with the rules alone and the result says which advisor ran and why.
The key is read from the environment only, is never stored in a result or
settings object, and is scrubbed from any error text surfaced.

Cost is an estimate from a small price table (USD per million tokens, list
prices of the Claude model pages); unknown models get no cost.
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable

import pandas as pd
from jinja2 import Environment, PackageLoader, StrictUndefined
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kernaudit_pipeline.audit_report import md_escape
from kernaudit_pipeline.best_config import best_configs
from kernaudit_pipeline.core.values import finite_float as _num
from kernaudit_pipeline.recommendations import (
    Action, AdvisorSuggestion, Evidence, Recommendation, Rule, Source, VerificationState, config_label,
    device_limits, group_key, rec_id_for, shape_dims,
)

log = logging.getLogger(__name__)

DEFAULT_MODEL = "claude-sonnet-5-5"
ENV_MODEL = "KERNAUDIT_CLAUDE_MODEL"
ENV_API_KEY = "ANTHROPIC_API_KEY"
# (input, output) USD per million tokens: list prices, an estimate (batch, cache and regional
# pricing differ). Cache reads are billed at 0.1x and 5-minute cache writes at 1.25x input.
PRICES_USD_PER_MTOK: MappingProxyType[str, tuple[float, float]] = MappingProxyType({
    "claude-sonnet-5-5": (2.0, 10.0),
    "claude-sonnet-5": (2.0, 10.0),
    "claude-opus-5-5": (4.0, 20.0),
    "claude-opus-5": (5.0, 25.0),
    "claude-sonnet-4-6": (3.0, 15.0),
    "claude-sonnet-4-5": (3.0, 15.0),
    "claude-opus-4-6": (5.0, 25.0),
    "claude-opus-4-5": (5.0, 25.0),
    "claude-haiku-4-5": (1.0, 5.0),
})
CACHE_READ_FACTOR = 0.1
CACHE_WRITE_FACTOR = 1.25
EVIDENCE_COLUMNS = (
    "kernel_name", "shape_name", "device_name", "m", "n", "k", "batch", "seq_len", "head_dim",
    "block_m", "block_n", "block_k", "group_m", "num_warps", "num_stages",
    "registers_per_thread", "spill_stores_bytes", "spill_loads_bytes", "shared_mem_bytes", "grid_size",
    "latency_us", "latency_ci_low_us", "latency_ci_high_us", "baseline_us", "speedup", "status",
    "correct", "run_status", "local_spill_requests", "stall_lg_throttle_pct", "stall_long_scoreboard_pct",
    "achieved_occupancy_pct", "occupancy_pct", "occupancy_limiter", "blocks_per_sm", "smem_limited",
    "spill_causes_stalls", "sm_throughput_pct", "memory_throughput_pct", "compute_sol_pct", "memory_sol_pct",
    "efficiency_pct", "headroom_pct", "at_roofline", "bottleneck", "source_format",
)
NO_CONFIG_ACTIONS = frozenset({Action.KEEP_BASELINE, Action.FIX_CORRECTNESS, Action.REMEASURE})
VALID_WARPS = frozenset({1, 2, 4, 8, 16, 32})
_KEY_PATTERN = re.compile(r"sk-ant-[A-Za-z0-9_\-]{8,}")
REDACTED = "[REDACTED]"
MAX_REASON_CHARS = 400


class AdvisorKind(StrEnum):
    CLAUDE = "claude"
    RULES_ONLY = "rules_only"


@dataclass(frozen=True)
class AdvisorSettings:
    """What may be configured and logged; the API key is deliberately not a field."""

    model: str = DEFAULT_MODEL
    max_tokens: int = 8192
    timeout_s: float = 120.0
    max_retries: int = 3
    include_source: bool = False
    max_rows: int = 80
    max_rule_rows: int = 60
    enabled: bool = True

    @classmethod
    def from_env(cls, **overrides: Any) -> "AdvisorSettings":
        """Defaults, then ``KERNAUDIT_CLAUDE_MODEL``, then explicit overrides."""
        values: dict[str, Any] = {}
        if os.environ.get(ENV_MODEL):
            values["model"] = os.environ[ENV_MODEL]
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


# ---------------------------------------------------------------------------------------------
# Structured output
# ---------------------------------------------------------------------------------------------
class BlockSizeHint(BaseModel):
    """Best config for batch sizes up to ``m_max`` (vLLM-style M bucket)."""

    model_config = ConfigDict(extra="forbid")
    kernel_name: str = Field(min_length=1)
    device_name: str | None = None
    m_max: int = Field(ge=1)
    block_m: int = Field(ge=1)
    block_n: int = Field(ge=1)
    block_k: int | None = Field(default=None, ge=1)
    group_m: int | None = Field(default=None, ge=1)
    num_warps: int = Field(ge=1)
    num_stages: int = Field(ge=1)
    rationale: str


class AdvisorOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    summary: str
    recommendations: list[AdvisorSuggestion]
    block_size_heuristics: list[BlockSizeHint]


def advisor_output_schema() -> dict[str, Any]:
    """The JSON schema sent as ``output_config.format`` (the SDK's strict-schema transform)."""
    from anthropic import transform_schema  # noqa: PLC0415
    return transform_schema(AdvisorOutput.model_json_schema())


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RejectedSuggestion:
    recommendation: Recommendation
    reason: str


@dataclass(frozen=True)
class HeuristicResult:
    hint: dict
    verification_state: VerificationState
    verification_note: str


@dataclass(frozen=True)
class AdvisorResult:
    advisor_used: AdvisorKind
    advisor_reason: str
    model: str | None
    recommendations: tuple[Recommendation, ...]
    claude_accepted: tuple[Recommendation, ...] = ()
    claude_rejected: tuple[RejectedSuggestion, ...] = ()
    heuristics: tuple[HeuristicResult, ...] = ()
    rejected_heuristics: tuple[HeuristicResult, ...] = ()
    summary: str = ""
    settings: AdvisorSettings = field(default_factory=AdvisorSettings)
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cost_usd_estimate: float | None = None
    request_id: str | None = None
    duration_s: float | None = None

    def note(self) -> str:
        """One line for reports: which advisor ran and why."""
        if self.advisor_used == AdvisorKind.CLAUDE:
            return (f"claude ({self.model}): {len(self.claude_accepted)} suggestion(s) kept, "
                    f"{len(self.claude_rejected)} rejected; {self.advisor_reason}")
        return f"rules only: {self.advisor_reason}"

    def mlflow_params(self) -> dict[str, str]:
        s = self.settings
        return {"advisor_used": str(self.advisor_used), "advisor_model": s.model,
                "advisor_max_tokens": str(s.max_tokens), "advisor_timeout_s": str(s.timeout_s),
                "advisor_max_retries": str(s.max_retries), "advisor_include_source": str(s.include_source)}

    def mlflow_tags(self) -> dict[str, str]:
        return {"advisor_reason": scrub(self.advisor_reason)[:MAX_REASON_CHARS],
                **({"advisor_request_id": self.request_id} if self.request_id else {})}

    def mlflow_metrics(self) -> dict[str, float]:
        out = {"advisor_input_tokens": float(self.input_tokens),
               "advisor_output_tokens": float(self.output_tokens),
               "advisor_cache_read_input_tokens": float(self.cache_read_input_tokens),
               "advisor_cache_creation_input_tokens": float(self.cache_creation_input_tokens),
               "advisor_claude_accepted": float(len(self.claude_accepted)),
               "advisor_claude_rejected": float(len(self.claude_rejected))}
        if self.cost_usd_estimate is not None:
            out["advisor_cost_usd_estimate"] = float(self.cost_usd_estimate)
        if self.duration_s is not None:
            out["advisor_duration_s"] = float(self.duration_s)
        return out


def estimate_cost_usd(model: str, input_tokens: int, output_tokens: int,
                      cache_read_tokens: int = 0, cache_write_tokens: int = 0) -> float | None:
    price = PRICES_USD_PER_MTOK.get(model)
    if price is None:
        return None
    pin, pout = price
    return (input_tokens * pin + output_tokens * pout + cache_read_tokens * pin * CACHE_READ_FACTOR
            + cache_write_tokens * pin * CACHE_WRITE_FACTOR) / 1e6


def scrub(text: object, secrets: tuple[str, ...] = ()) -> str:
    """Remove the API key (and anything shaped like an Anthropic key) from surfaced text."""
    out = str(text)
    key = os.environ.get(ENV_API_KEY)
    for secret in (*secrets, key):
        if secret and len(secret) >= 8:
            out = out.replace(secret, REDACTED)
    return _KEY_PATTERN.sub(REDACTED, out)


def _failure_reason(exc: BaseException) -> str:
    import anthropic  # noqa: PLC0415
    if isinstance(exc, anthropic.APITimeoutError):
        what = "request timed out"
    elif isinstance(exc, anthropic.RateLimitError):
        what = "rate limited (429) after retries"
    elif isinstance(exc, anthropic.InternalServerError):
        what = f"server error ({exc.status_code}) after retries"
    elif isinstance(exc, anthropic.APIStatusError):
        what = f"API error ({exc.status_code})"
    elif isinstance(exc, anthropic.APIConnectionError):
        what = "connection failed"
    elif isinstance(exc, ValidationError):
        first = exc.errors()[0]
        what = f"schema-invalid output at {'.'.join(map(str, first['loc'])) or 'top level'}: {first['msg']}"
        return scrub(f"Claude advisor failed: {what}")[:MAX_REASON_CHARS]
    else:
        what = type(exc).__name__
    detail = str(exc).splitlines()[0] if str(exc) else ""
    return scrub(f"Claude advisor failed: {what}: {detail}")[:MAX_REASON_CHARS]


class AdvisorOutputError(ValueError):
    """The response came back but cannot be used (refusal, truncation, no JSON block)."""


# ---------------------------------------------------------------------------------------------
# Prompt
# ---------------------------------------------------------------------------------------------
def _env() -> Environment:
    return Environment(loader=PackageLoader("kernaudit_pipeline", "templates"), undefined=StrictUndefined,
                       autoescape=False, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


def _priority(row: pd.Series, best_cfgs: set[tuple]) -> tuple:
    spill = any((_num(row.get(c)) or 0.0) > 0 for c in ("spill_stores_bytes", "spill_loads_bytes")
                if pd.notna(row.get(c)))
    is_best = (group_key(row), tuple(sorted(_row_cfg(row).items()))) in best_cfgs
    lat = row.get("latency_us")
    return (not is_best, not spill, str(row.get("status")) != "FAILED",
            float(lat) if pd.notna(lat) else float("inf"))


def _row_cfg(row: pd.Series) -> dict:
    from kernaudit_pipeline.recommendations import current_config  # noqa: PLC0415
    return current_config(row)


def evidence_csv(frame: pd.DataFrame, max_rows: int, best_cfgs: set[tuple]) -> tuple[str, int]:
    """The most telling rows (best per group, spilling, failed, then fastest) as compact CSV."""
    if frame.empty:
        return "(no rows)", 0
    cols = [c for c in EVIDENCE_COLUMNS if c in frame.columns and frame[c].notna().any()]
    ranked = sorted(((pos, _priority(frame.iloc[pos], best_cfgs)) for pos in range(len(frame))),
                    key=lambda t: t[1])
    keep = sorted(pos for pos, _ in ranked[:max_rows])
    shown = frame.iloc[keep][cols].sort_values([c for c in ("kernel_name", "shape_name", "latency_us") if c in cols],
                                              na_position="last", kind="stable")
    for c in shown.columns:
        values = pd.to_numeric(shown[c], errors="coerce") if shown[c].dtype == object else shown[c]
        if not pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values):
            continue
        present = values.dropna()
        if len(present) and len(present) == shown[c].notna().sum():
            whole = bool(((present % 1) == 0).all())
            shown[c] = values.astype("Int64") if whole else values.astype(float).round(4)
    return shown.to_csv(index=False).strip(), len(shown)


def render_prompts(frame: pd.DataFrame, rule_recs: list[Recommendation], settings: AdvisorSettings,
                   sources: list[dict] | None = None) -> tuple[str, str]:
    """(system, user) prompts from the evidence."""
    env = _env()
    bests = best_configs(frame) if not frame.empty else []
    best_keys = {(b.key, tuple(sorted(b.config.items()))) for b in bests}
    runs_csv, shown = evidence_csv(frame, settings.max_rows, best_keys)
    devices = sorted({str(d) for d in frame.get("device_name", pd.Series(dtype=object)).dropna()}) or ["unknown"]
    rules = [{"rec_id": r.rec_id, "kernel_name": r.kernel_name, "shape_name": r.shape_name or "-",
              "current": config_label(r.current_config), "code": r.code,
              "new": config_label(r.new_config) if r.new_config else "-",
              "verification": (f"{r.verification.state} (static {r.verification.static_state}, "
                               f"measured {r.verification.measured_state})")}
             for r in rule_recs if r.action not in NO_CONFIG_ACTIONS][:settings.max_rule_rows]
    system = env.get_template("advisor_system.j2").render(actions=[str(a) for a in Action])
    user = env.get_template("advisor_user.j2").render(
        devices=[{"name": d, **asdict(device_limits(d))} for d in devices],
        runs_csv=runs_csv, rows_shown=shown, rows_total=len(frame),
        best_configs=[{"kernel_name": b.kernel_name, "shape_name": b.shape_name or "-",
                       "device_name": b.device_name or "-", "config": config_label(b.config),
                       "latency_us": round(b.latency_us, 3),
                       "speedup": "-" if b.speedup is None else round(b.speedup, 3),
                       "registers_per_thread": b.registers_per_thread if b.registers_per_thread is not None else "-",
                       "shared_mem_bytes": b.shared_mem_bytes if b.shared_mem_bytes is not None else "-",
                       "tied_with": ", ".join(b.tied_with) or "-"} for b in bests],
        rules=rules, rules_shown=len(rules),
        rules_total=sum(r.action not in NO_CONFIG_ACTIONS for r in rule_recs),
        sources=sources or [],
    )
    return system, user


def kernel_sources(frame: pd.DataFrame) -> list[dict]:
    """Source text of the kernel modules behind the frame's kernels (opt-in only)."""
    from kernaudit_pipeline.verification import kernel_module  # noqa: PLC0415
    out = []
    for name in sorted({str(k) for k in frame.get("kernel_name", pd.Series(dtype=object)).dropna()}):
        mod = kernel_module(name)
        if mod is not None and getattr(mod, "__file__", None):
            path = Path(mod.__file__)
            out.append({"kernel_name": name, "path": f"kernels/{path.name}", "text": path.read_text()})
    return out


# ---------------------------------------------------------------------------------------------
# Suggestions -> recommendations
# ---------------------------------------------------------------------------------------------
def _config_problem(cfg: dict) -> str | None:
    for key in ("block_m", "block_n", "block_k"):
        v = cfg.get(key)
        if v is not None and (v < 16 or v & (v - 1)):
            return f"{key}={v} is not a power of two of at least 16"
    if cfg.get("num_warps") is not None and cfg["num_warps"] not in VALID_WARPS:
        return f"num_warps={cfg['num_warps']} is not one of {sorted(VALID_WARPS)}"
    if cfg.get("num_stages") is not None and not 1 <= cfg["num_stages"] <= 8:
        return f"num_stages={cfg['num_stages']} is outside 1..8"
    return None


def to_recommendation(s: AdvisorSuggestion, frame: pd.DataFrame) -> tuple[Recommendation, str | None]:
    """The suggestion as a CLAUDE recommendation, and why it must be rejected (or None)."""
    current = s.current_config.model_dump(exclude_none=True)
    new = s.new_config.model_dump(exclude_none=True) if s.new_config else None
    rows = frame[[group_key(r)[0] == s.kernel_name and (s.shape_name is None or group_key(r)[1] == s.shape_name)
                  and (s.device_name is None or group_key(r)[2] == s.device_name)
                  for _, r in frame.iterrows()]] if not frame.empty else frame
    first = rows.iloc[0] if len(rows) else None
    shape = s.shape_name if s.shape_name is not None else (None if first is None else group_key(first)[1])
    device = s.device_name if s.device_name is not None else (None if first is None else group_key(first)[2])
    rec = Recommendation(
        rec_id=rec_id_for(s.kernel_name, shape, device, current, s.code, Source.CLAUDE),
        kernel_name=s.kernel_name, shape_name=shape, device_name=device, current_config=current,
        action=s.action, new_config=new, code=s.code, rationale=s.rationale,
        evidence=tuple(Evidence(**e.model_dump()) for e in s.evidence), expected_effect=s.expected_effect,
        confidence=s.confidence, source=Source.CLAUDE, rule=Rule.CLAUDE,
        shape_dims={} if first is None else shape_dims(first),
    )
    if first is None:
        return rec, (f"{s.kernel_name} / {s.shape_name or '-'} / {s.device_name or '-'} is not in the audit's "
                     "evidence")
    if s.action not in NO_CONFIG_ACTIONS and not new:
        return rec, f"action {s.action} needs a new config and none was given"
    for cfg in (new or {}, current):
        if problem := _config_problem(cfg):
            return rec, problem
    return rec, None


def hint_recommendation(h: BlockSizeHint, frame: pd.DataFrame) -> Recommendation | None:
    """A heuristic as a pseudo recommendation on the kernel's measured shape nearest in M."""
    if frame.empty or "m" not in frame.columns:
        return None
    rows = frame[(frame["kernel_name"] == h.kernel_name) & frame["m"].notna()]
    if h.device_name and "device_name" in rows.columns:
        rows = rows[rows["device_name"] == h.device_name]
    if rows.empty:
        return None
    distance = (rows["m"].astype(float) - h.m_max).abs().to_numpy()
    row = rows.iloc[int(distance.argmin())]
    cfg = {k: v for k, v in h.model_dump().items()
           if k in ("block_m", "block_n", "block_k", "group_m", "num_warps", "num_stages") and v is not None}
    code = f"heuristic_m_le_{h.m_max}_{config_label(cfg)}"
    kernel, shape, device = group_key(row)
    return Recommendation(
        rec_id=rec_id_for(kernel, shape, device, {}, code, Source.CLAUDE), kernel_name=kernel, shape_name=shape,
        device_name=device, current_config={}, action=Action.ADOPT, new_config=cfg, code=code,
        rationale=h.rationale, evidence=(), expected_effect="", source=Source.CLAUDE, rule=Rule.CLAUDE,
        shape_dims=shape_dims(row), confidence=0.3,
    )


Verifier = Callable[[list[Recommendation], pd.DataFrame], list[Recommendation]]


def _default_verifier(recs: list[Recommendation], frame: pd.DataFrame) -> list[Recommendation]:
    from kernaudit_pipeline.verification import verify_recommendations  # noqa: PLC0415
    return verify_recommendations(recs, frame)


# ---------------------------------------------------------------------------------------------
# The call
# ---------------------------------------------------------------------------------------------
def _rules_only(rule_recs: list[Recommendation], settings: AdvisorSettings, reason: str,
                **usage: Any) -> AdvisorResult:
    log.info("advisor: rules only (%s)", reason)
    return AdvisorResult(advisor_used=AdvisorKind.RULES_ONLY, advisor_reason=scrub(reason), model=None,
                         recommendations=tuple(rule_recs), settings=settings, **usage)


def _usage_fields(message: Any, model: str) -> dict[str, Any]:
    u = getattr(message, "usage", None)
    if u is None:
        return {}
    fields = {"input_tokens": int(u.input_tokens or 0), "output_tokens": int(u.output_tokens or 0),
              "cache_read_input_tokens": int(getattr(u, "cache_read_input_tokens", 0) or 0),
              "cache_creation_input_tokens": int(getattr(u, "cache_creation_input_tokens", 0) or 0)}
    fields["cost_usd_estimate"] = estimate_cost_usd(
        model, fields["input_tokens"], fields["output_tokens"], fields["cache_read_input_tokens"],
        fields["cache_creation_input_tokens"])
    return fields


def parse_output(message: Any) -> AdvisorOutput:
    """Validate the structured answer; refusals and truncations are failures, not partial data."""
    stop = getattr(message, "stop_reason", None)
    if stop == "refusal":
        raise AdvisorOutputError("the model refused")
    if stop == "max_tokens":
        raise AdvisorOutputError("output truncated at max_tokens; raise max_tokens")
    texts = [b.text for b in message.content if getattr(b, "type", None) == "text"]
    if not texts:
        raise AdvisorOutputError("no text block in the response")
    return AdvisorOutput.model_validate_json("".join(texts))


def advise(frame: pd.DataFrame, rule_recs: list[Recommendation], settings: AdvisorSettings | None = None,
           *, verifier: Verifier | None = None) -> AdvisorResult:
    """Rules plus Claude's verified suggestions; never raises for advisor failures."""
    settings = settings or AdvisorSettings.from_env()
    if not settings.enabled:
        return _rules_only(rule_recs, settings, "the Claude advisor is disabled")
    key = os.environ.get(ENV_API_KEY, "").strip()
    if not key:
        return _rules_only(rule_recs, settings, f"no {ENV_API_KEY} in the environment")
    usage: dict[str, Any] = {}
    started = time.monotonic()
    request_id = None
    try:
        import anthropic  # noqa: PLC0415
        sources = kernel_sources(frame) if settings.include_source else None
        system, user = render_prompts(frame, rule_recs, settings, sources)
        client = anthropic.Anthropic(api_key=key, max_retries=settings.max_retries, timeout=settings.timeout_s)
        log.info("advisor: asking %s (max_tokens=%d, timeout=%.0fs, retries=%d, source=%s)", settings.model,
                 settings.max_tokens, settings.timeout_s, settings.max_retries, settings.include_source)
        message = client.messages.create(
            model=settings.model, max_tokens=settings.max_tokens, system=system,
            messages=[{"role": "user", "content": user}],
            output_config={"format": {"type": "json_schema", "schema": advisor_output_schema()}},
        )
        request_id = getattr(message, "_request_id", None)
        usage = _usage_fields(message, settings.model)
        output = parse_output(message)
        accepted, rejected, heur_ok, heur_bad = _screen_and_verify(output, frame, verifier or _default_verifier)
    except Exception as exc:  # noqa: BLE001 - any advisor failure degrades to the rules, with the reason
        return _rules_only(rule_recs, settings, _failure_reason(exc), request_id=request_id,
                           duration_s=time.monotonic() - started, **usage)
    reason = (f"structured output validated; {len(accepted)} of {len(accepted) + len(rejected)} "
              "suggestion(s) survived verification")
    log.info("advisor: %s", reason)
    return AdvisorResult(
        advisor_used=AdvisorKind.CLAUDE, advisor_reason=reason, model=settings.model,
        recommendations=tuple(rule_recs) + tuple(accepted), claude_accepted=tuple(accepted),
        claude_rejected=tuple(rejected), heuristics=tuple(heur_ok), rejected_heuristics=tuple(heur_bad),
        summary=scrub(output.summary), settings=settings, request_id=request_id,
        duration_s=time.monotonic() - started, **usage,
    )


def _screen_and_verify(output: AdvisorOutput, frame: pd.DataFrame, verifier: Verifier
                       ) -> tuple[list[Recommendation], list[RejectedSuggestion],
                                  list[HeuristicResult], list[HeuristicResult]]:
    candidates: list[Recommendation] = []
    rejected: list[RejectedSuggestion] = []
    for s in output.recommendations:
        rec, problem = to_recommendation(s, frame)
        if problem:
            rejected.append(RejectedSuggestion(rec, problem))
        else:
            candidates.append(rec)
    hints = [(h, hint_recommendation(h, frame)) for h in output.block_size_heuristics]
    hint_recs = [r for _, r in hints if r is not None]
    verified = verifier(candidates + hint_recs, frame) if candidates or hint_recs else []
    accepted: list[Recommendation] = []
    for rec in verified[:len(candidates)]:
        if rec.verification.state == VerificationState.REFUTED:
            rejected.append(RejectedSuggestion(rec, f"verification refuted it: {rec.verification.note}"))
        else:
            accepted.append(rec)
    heur_ok: list[HeuristicResult] = []
    heur_bad: list[HeuristicResult] = []
    checked = iter(verified[len(candidates):])
    for h, r in hints:
        if r is None:
            heur_bad.append(HeuristicResult(h.model_dump(), VerificationState.UNVERIFIED,
                                            f"{h.kernel_name} has no measured M-shaped rows in the evidence"))
            continue
        v = next(checked)
        result = HeuristicResult(h.model_dump(), v.verification.state, v.verification.note)
        (heur_bad if v.verification.state == VerificationState.REFUTED else heur_ok).append(result)
    return accepted, rejected, heur_ok, heur_bad


def advisor_markdown(result: AdvisorResult) -> str:
    """A Markdown section for the report: which advisor ran, and what it said."""
    lines = ["## Tuning advisor", "", f"Advisor: **{result.advisor_used}**. {md_escape(result.advisor_reason)}", ""]
    if result.advisor_used == AdvisorKind.CLAUDE:
        cost = "unknown" if result.cost_usd_estimate is None else f"${result.cost_usd_estimate:.4f} (estimate)"
        lines += [f"Model {md_escape(result.model)}; {result.input_tokens} input and {result.output_tokens} "
                  f"output tokens; cost {cost}.", "", md_escape(result.summary), ""]
    if result.claude_accepted:
        lines += ["| id | kernel | shape | code | new config | verification |", "|---|---|---|---|---|---|"]
        lines += [f"| {r.rec_id} | {md_escape(r.kernel_name)} | {md_escape(r.shape_name)} | {md_escape(r.code)} | "
                  f"{md_escape(config_label(r.new_config or {}))} | {r.verification.state}: "
                  f"{md_escape(r.verification.note)} |" for r in result.claude_accepted]
        lines.append("")
    if result.claude_rejected:
        lines += ["Rejected suggestions:", ""]
        lines += [f"- {md_escape(x.recommendation.code)}: {md_escape(x.reason)}" for x in result.claude_rejected]
        lines.append("")
    if result.heuristics or result.rejected_heuristics:
        lines += ["| kernel | M up to | config | verification |", "|---|---|---|---|"]
        for h in (*result.heuristics, *result.rejected_heuristics):
            lines.append(f"| {md_escape(h.hint['kernel_name'])} | {h.hint['m_max']} | "
                         f"{md_escape(config_label(h.hint))} | {h.verification_state}: "
                         f"{md_escape(h.verification_note)} |")
    return scrub("\n".join(lines)) + "\n"


def recommendations_stage(frame: pd.DataFrame, *, verify_settings: Any = None,
                          advisor_settings: AdvisorSettings | None = None) -> AdvisorResult:
    """The whole ``recommendations`` stage: rules, their verification, then the advisor.

    The rules and their verification never depend on the network; the advisor
    adds verified suggestions when it can and says why when it cannot.
    """
    from kernaudit_pipeline.recommendations import build_recommendations  # noqa: PLC0415
    from kernaudit_pipeline.verification import VerifySettings, verify_recommendations  # noqa: PLC0415
    vs = verify_settings or VerifySettings()
    rules = verify_recommendations(build_recommendations(frame), frame, vs)
    return advise(frame, rules, advisor_settings, verifier=lambda recs, f: verify_recommendations(recs, f, vs))
