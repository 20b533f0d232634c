"""The Claude advisor: a client, nothing else.

It renders the prompt from evidence the stage prepared (Jinja2 templates ``advisor_system.j2``
and ``advisor_user.j2``), asks the Messages API through the anthropic SDK's ``messages.parse``
with :class:`~kernaudit_pipeline.recommendations.model.AdvisorOutput` as the output type (the SDK
sends its JSON schema as the structured-output format and validates the answer with pydantic;
free text is never parsed here), and reports the usage. What the suggestions are worth is the
stage's business: it screens and verifies them like the rules' own.

Time is bounded three ways, all configurable from the environment:

- ``KERNAUDIT_CLAUDE_TIMEOUT_S`` (default 20): one request;
- ``KERNAUDIT_CLAUDE_RETRIES`` (default 2): the SDK's own retries of 408/409/429/5xx and
  connection errors, with its backoff;
- ``KERNAUDIT_CLAUDE_BUDGET_S`` (default 55): the whole call, retries and backoff included.
  The call runs in a daemon thread; when the budget is spent the audit goes on without it.

With no ``ANTHROPIC_API_KEY``, or on any failure, the reply says which advisor ran (rules only)
and why. The key is read from the environment only, is never a field of a settings or result
object, and is scrubbed from any text surfaced. Cost is an estimate from a small price table
(USD per million tokens, list prices); unknown models get no cost.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field, fields
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined

from kernaudit_pipeline.recommendations.model import Action, AdvisorOutput

log = logging.getLogger(__name__)

DEFAULT_MODEL = "claude-sonnet-5-5"
ENV_MODEL = "KERNAUDIT_CLAUDE_MODEL"
ENV_TIMEOUT = "KERNAUDIT_CLAUDE_TIMEOUT_S"
ENV_RETRIES = "KERNAUDIT_CLAUDE_RETRIES"
ENV_BUDGET = "KERNAUDIT_CLAUDE_BUDGET_S"
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
    timeout_s: float = 20.0
    max_retries: int = 2
    budget_s: float = 55.0
    include_source: bool = False
    max_rows: int = 80
    max_rule_rows: int = 60
    enabled: bool = True
    problem: str | None = None  # a bad environment value: the advisor does not run, and says why

    @classmethod
    def from_env(cls, **overrides: Any) -> "AdvisorSettings":
        """Defaults, then the ``KERNAUDIT_CLAUDE_*`` variables, then explicit overrides."""
        values: dict[str, Any] = {}
        problems: list[str] = []
        if os.environ.get(ENV_MODEL, "").strip():
            values["model"] = os.environ[ENV_MODEL].strip()
        for env, name, cast, low, high in ((ENV_TIMEOUT, "timeout_s", float, 0.1, 600.0),
                                           (ENV_RETRIES, "max_retries", int, 0, 10),
                                           (ENV_BUDGET, "budget_s", float, 0.1, 3600.0)):
            text = os.environ.get(env, "").strip()
            if not text:
                continue
            try:
                value = cast(text)
            except ValueError:
                problems.append(f"{env}={text[:40]!r} is not a number")
                continue
            if not low <= value <= high:
                problems.append(f"{env}={value} is outside {low}..{high}")
                continue
            values[name] = value
        values.update({k: v for k, v in overrides.items() if v is not None})
        if problems:
            values["problem"] = "; ".join(problems)
        return cls(**values)

    def params(self) -> dict[str, str]:
        return {f"advisor_{f.name}": str(getattr(self, f.name)) for f in fields(self) if f.name != "problem"}


# ---------------------------------------------------------------------------------------------
# Prompt
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PromptEvidence:
    """What the stage shows Claude, already reduced to plain rows and text."""

    devices: list[dict]
    runs_csv: str
    rows_shown: int
    rows_total: int
    decisions: list[dict]
    queue: list[dict]
    queue_total: int
    heuristics: list[str]
    sources: list[dict] = field(default_factory=list)


def _env() -> Environment:
    return Environment(loader=PackageLoader("kernaudit_pipeline", "templates"), undefined=StrictUndefined,
                       autoescape=False, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


def render_prompts(evidence: PromptEvidence) -> tuple[str, str]:
    """(system, user) prompts."""
    env = _env()
    system = env.get_template("advisor_system.j2").render(actions=[str(a) for a in Action])
    user = env.get_template("advisor_user.j2").render(
        devices=evidence.devices, runs_csv=evidence.runs_csv, rows_shown=evidence.rows_shown,
        rows_total=evidence.rows_total, decisions=evidence.decisions, queue=evidence.queue,
        queue_shown=len(evidence.queue), queue_total=evidence.queue_total, heuristics=evidence.heuristics,
        sources=evidence.sources)
    return system, user


# ---------------------------------------------------------------------------------------------
# The call
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AdvisorReply:
    advisor_used: AdvisorKind
    reason: str
    model: str | None
    settings: AdvisorSettings
    output: AdvisorOutput | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cost_usd_estimate: float | None = None
    request_id: str | None = None
    duration_s: float | None = None
    requests: int = 0


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
    from pydantic import ValidationError  # noqa: PLC0415

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
        where = ".".join(map(str, first["loc"])) or "top level"
        return scrub(f"Claude advisor failed: schema-invalid output at {where}: {first['msg']}")[:MAX_REASON_CHARS]
    else:
        what = type(exc).__name__
    detail = str(exc).splitlines()[0] if str(exc) else ""
    return scrub(f"Claude advisor failed: {what}: {detail}")[:MAX_REASON_CHARS]


class _Capture:
    """The last response body, read by an httpx event hook: usage is reported even when the
    answer fails validation or is truncated."""

    def __init__(self) -> None:
        self.body: dict | None = None
        self.request_id: str | None = None
        self.requests = 0

    def hook(self, response: Any) -> None:
        self.requests += 1
        self.request_id = response.headers.get("request-id") or self.request_id
        try:
            response.read()
            data = json.loads(response.content or b"{}")
        except (ValueError, OSError):
            return
        if isinstance(data, dict) and data.get("type") == "message":
            self.body = data


def _usage(body: dict | None, model: str) -> dict[str, Any]:
    usage = (body or {}).get("usage")
    if not isinstance(usage, dict):
        return {}

    def count(key: str) -> int:
        value = usage.get(key)
        return int(value) if isinstance(value, int) and 0 <= value < 10**12 else 0

    out = {"input_tokens": count("input_tokens"), "output_tokens": count("output_tokens"),
           "cache_read_input_tokens": count("cache_read_input_tokens"),
           "cache_creation_input_tokens": count("cache_creation_input_tokens")}
    out["cost_usd_estimate"] = estimate_cost_usd(model, out["input_tokens"], out["output_tokens"],
                                                 out["cache_read_input_tokens"], out["cache_creation_input_tokens"])
    return out


def ask(system: str, user: str, settings: AdvisorSettings | None = None) -> AdvisorReply:
    """One structured-output request within the settings' time budget; never raises."""
    settings = settings or AdvisorSettings.from_env()

    def rules_only(reason: str, **extra: Any) -> AdvisorReply:
        log.info("advisor: rules only (%s)", scrub(reason))
        return AdvisorReply(AdvisorKind.RULES_ONLY, scrub(reason)[:MAX_REASON_CHARS], None, settings, **extra)

    if not settings.enabled:
        return rules_only("the Claude advisor is disabled")
    if settings.problem:
        return rules_only(f"the Claude advisor is not configured: {settings.problem}")
    key = os.environ.get(ENV_API_KEY, "").strip()
    if not key:
        return rules_only(f"no {ENV_API_KEY} in the environment")
    import anthropic  # noqa: PLC0415

    capture = _Capture()
    client = anthropic.Anthropic(
        api_key=key, max_retries=settings.max_retries, timeout=settings.timeout_s,
        http_client=anthropic.DefaultHttpxClient(event_hooks={"response": [capture.hook]}))
    outcome: dict[str, Any] = {}

    def call() -> None:
        try:
            outcome["message"] = client.messages.parse(
                model=settings.model, max_tokens=settings.max_tokens, system=system,
                messages=[{"role": "user", "content": user}], output_format=AdvisorOutput)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            outcome["error"] = exc

    log.info("advisor: asking %s (max_tokens=%d, timeout=%.0fs, retries=%d, budget=%.0fs, source=%s)",
             settings.model, settings.max_tokens, settings.timeout_s, settings.max_retries, settings.budget_s,
             settings.include_source)
    started = time.monotonic()
    worker = threading.Thread(target=call, name="kernaudit-claude", daemon=True)
    worker.start()
    worker.join(settings.budget_s)
    duration = time.monotonic() - started
    if worker.is_alive():
        client.close()  # fail the request in flight; the daemon thread cannot outlive the process
        return rules_only(f"Claude advisor failed: no answer within the total budget of {settings.budget_s:g} s "
                          f"({ENV_BUDGET}; each request {settings.timeout_s:g} s, {settings.max_retries} retries)",
                          duration_s=duration, requests=capture.requests, **_usage(capture.body, settings.model))
    usage = _usage(capture.body, settings.model)
    message = outcome.get("message")
    request_id = getattr(message, "_request_id", None) or capture.request_id
    extra = dict(duration_s=duration, requests=capture.requests, request_id=request_id, **usage)
    stop = (capture.body or {}).get("stop_reason") or getattr(message, "stop_reason", None)
    if stop == "refusal":
        return rules_only("Claude advisor failed: the model refused", **extra)
    if stop == "max_tokens":
        return rules_only("Claude advisor failed: output truncated at max_tokens; raise max_tokens", **extra)
    if "error" in outcome:
        return rules_only(_failure_reason(outcome["error"]), **extra)
    output = getattr(message, "parsed_output", None)
    if not isinstance(output, AdvisorOutput):
        return rules_only("Claude advisor failed: no structured output in the response", **extra)
    return AdvisorReply(AdvisorKind.CLAUDE, "structured output validated", settings.model, settings,
                        output=output, **extra)
