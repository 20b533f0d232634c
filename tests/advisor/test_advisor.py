"""The Claude advisor against a fake Anthropic server on loopback, through the real SDK.

The stage runs for real (ranking, rules, Verifier); only the hosted API is replaced, by a real
HTTP server on 127.0.0.1. No test asserts how long anything took.
"""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import asdict

import pandas as pd
import pytest

from kernaudit_pipeline.comparisons import build_comparisons
from kernaudit_pipeline.core.verdicts import DecisionKind
from kernaudit_pipeline.recommendations import stage
from kernaudit_pipeline.recommendations.advisor import (
    ENV_BUDGET, ENV_RETRIES, ENV_TIMEOUT, AdvisorKind, AdvisorSettings, estimate_cost_usd,
)
from kernaudit_pipeline.recommendations.model import HeuristicKind, Source, VerificationState
from kernaudit_pipeline.recommendations.verify import VerifySettings
from kernaudit_pipeline.spill_diagnostics import diagnose
from tests.advisor.fake_anthropic import FakeAnthropic, Reply, error_body, message_body, structured_body

KERNEL = "fixture_gemm"  # no module in kernels/: verification cannot compile it, by design here
SHAPE = "m4096_n4096_k4096"
H200 = "NVIDIA H200"


def _frame(kernel: str = KERNEL, shape: str = SHAPE, baseline_us: float = 240.0) -> pd.DataFrame:
    """Three configs; at 240 us baseline the best (250 us) is within noise: no decision, no fix."""
    base = dict(kernel_name=kernel, shape_name=shape, device_name=H200, m=4096, n=4096, k=4096,
                block_k=64, group_m=8, num_stages=3, baseline_us=baseline_us, correct=True, run_status="OK",
                source_format="runner", baseline_name="torch.matmul")
    rows = [
        dict(base, block_m=128, block_n=256, num_warps=4, registers_per_thread=255, spill_stores_bytes=808,
             spill_loads_bytes=808, shared_mem_bytes=147_456, latency_us=1500.0),
        dict(base, block_m=128, block_n=256, num_warps=8, registers_per_thread=220, spill_stores_bytes=0,
             spill_loads_bytes=0, shared_mem_bytes=147_456, latency_us=250.0),
        dict(base, block_m=64, block_n=64, block_k=32, num_warps=4, registers_per_thread=64, spill_stores_bytes=0,
             spill_loads_bytes=0, shared_mem_bytes=24_576, latency_us=520.0),
    ]
    return diagnose(build_comparisons(pd.DataFrame(rows)))


def _suggestion(kernel: str = KERNEL, **kw) -> dict:
    return {
        "kernel_name": kernel, "shape_name": SHAPE, "device_name": H200,
        "current_config": {"block_m": 64, "block_n": 64, "block_k": 32, "num_warps": 4, "num_stages": 3},
        "action": "grow_tile",
        "new_config": {"block_m": 128, "block_n": 128, "block_k": 64, "group_m": 8, "num_warps": 8,
                       "num_stages": 3},
        "code": "increase_tile_size_to_128x128_to_raise_arithmetic_intensity",
        "rationale": "64x64 tiles reach 0.46x; the 128x256 tile on 8 warps reaches 0.96x",
        "evidence": [{"metric": "speedup", "value": 0.4615, "threshold": 1.0, "source": "kernel_runs"}],
        "expected_effect": "close to the best measured tile", "confidence": 0.6, **kw,
    }


def _good_output(kernel: str = KERNEL) -> dict:
    return {
        "summary": "The 4-warp 128x256 config spills; 8 warps fix it.",
        "recommendations": [_suggestion(kernel), _suggestion(kernel, kernel_name="not_audited_kernel",
                                                             code="adopt_something_else"),
                            _suggestion(kernel, code="shrink_to_7x3", new_config={"block_m": 7, "block_n": 3})],
        "block_size_heuristics": [
            {"kernel_name": kernel, "device_name": H200, "m_max": 4096, "block_m": 64, "block_n": 64,
             "block_k": 32, "group_m": 8, "num_warps": 4, "num_stages": 3, "rationale": "a slow tile"},
            {"kernel_name": kernel, "device_name": H200, "m_max": 8192, "block_m": 128, "block_n": 256,
             "block_k": 64, "group_m": 8, "num_warps": 8, "num_stages": 3, "rationale": "large M: big tiles"},
        ],
    }


@pytest.fixture()
def api_key(monkeypatch: pytest.MonkeyPatch) -> str:
    key = "sk-ant-test-" + secrets.token_hex(20)  # built at runtime: no key-shaped literal in the repo
    monkeypatch.setenv("ANTHROPIC_API_KEY", key)
    for name in ("KERNAUDIT_CLAUDE_MODEL", ENV_TIMEOUT, ENV_RETRIES, ENV_BUDGET):
        monkeypatch.delenv(name, raising=False)
    return key


def _settings(**kw) -> AdvisorSettings:
    return AdvisorSettings(**{"max_retries": 2, "timeout_s": 10.0, "budget_s": 60.0, **kw})


def _run(fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch, frame: pd.DataFrame | None = None,
         verify: VerifySettings | None = None, **settings) -> stage.StageResult:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
    frame = _frame() if frame is None else frame
    return stage.run(frame, verify_settings=verify or VerifySettings(max_compiles=0),
                     advisor_settings=_settings(**settings))


def _rules_only(frame: pd.DataFrame | None = None) -> stage.StageResult:
    return stage.run(_frame() if frame is None else frame, verify_settings=VerifySettings(max_compiles=0),
                     advisor_settings=AdvisorSettings(enabled=False))


def test_success_parsed_screened_verified_and_costed(api_key, monkeypatch):
    with FakeAnthropic([Reply(200, structured_body(_good_output(), input_tokens=1500, output_tokens=420))]) as fake:
        result = _run(fake, monkeypatch)
    a = result.advisor
    assert a.advisor_used == AdvisorKind.CLAUDE, a.reason
    assert len(fake.received) == 1
    sent = fake.received[0]
    assert sent.path == "/v1/messages" and sent.api_key == api_key
    assert any("messages.parse" in v for v in sent.headers.values())  # the SDK's parse helper sent it
    schema = sent.body["output_config"]["format"]
    assert schema["type"] == "json_schema" and set(schema["schema"]["properties"]) == {
        "summary", "recommendations", "block_size_heuristics"}
    user = sent.body["messages"][0]["content"]
    assert KERNEL in user and "spill_stores_bytes" in user and "NO_DECISION" in user
    assert "128x256 tiles spill at 4 warps; use 8" in user  # the learned heuristic is shown
    assert "@triton.jit" not in user  # no source unless opted in
    # one suggestion kept (unverified: no kernel module to compile, not measured), two rejected
    (kept,) = a.accepted
    assert kept.source == Source.CLAUDE and kept.verification.state == VerificationState.UNVERIFIED
    assert "static check not run" in kept.verification.note and "not measured" in kept.verification.note
    reasons = {r.summary: r.reason for r in a.rejected}
    assert "not in the audit's evidence" in reasons["adopt_something_else"]
    assert "block_m=7 is not a power of two" in reasons["shrink_to_7x3"]
    # it joins the queue as the group's one config change
    assert result.recommendations[-1] == kept
    assert sum(1 for r in result.recommendations if r.new_config) == 1
    # the hints: the slow tile for M <= 4096 is refuted by the measured M=4096 shape; nothing was
    # measured with 4096 < M <= 8192, so the other one stays unverified
    (hint,) = a.heuristics
    assert hint.kind == HeuristicKind.CLAUDE_HINT and hint.verification == VerificationState.UNVERIFIED
    assert "no measured shape" in hint.note
    (bad,) = a.rejected_heuristics
    assert bad.verification == VerificationState.REFUTED and "measured slower" in bad.note
    assert a.summary.startswith("The 4-warp 128x256 config spills")
    assert (a.input_tokens, a.output_tokens) == (1500, 420)
    assert a.cost_usd_estimate == pytest.approx(estimate_cost_usd("claude-sonnet-5-5", 1500, 420))
    assert a.cost_usd_estimate == pytest.approx((1500 * 2.0 + 420 * 10.0) / 1e6)
    assert result.mlflow_metrics()["advisor_output_tokens"] == 420.0
    assert a.request_id == "req_fake0001"
    report = result.to_json()["advisor"]  # what report.json carries
    assert report["summary"] == a.summary and len(report["rejected"]) == 2
    assert {r["reason"] for r in report["rejected"]} == set(reasons.values())
    assert report["heuristics"][0]["kind"] == "claude_hint"


def test_a_second_target_for_a_group_is_rejected(api_key, monkeypatch):
    frame = _frame(baseline_us=400.0)  # now 128x256 w8 ships at 1.6x
    out = _good_output()
    out["recommendations"] = [_suggestion()]
    with FakeAnthropic([Reply(200, structured_body(out))]) as fake:
        result = _run(fake, monkeypatch, frame=frame)
    assert result.decisions[0].decision == DecisionKind.SHIP_CONFIG
    assert result.advisor.accepted == ()
    (rejected,) = result.advisor.rejected
    assert "already has a config change" in rejected.reason and "one target per group" in rejected.reason
    changes = [r for r in result.recommendations if r.new_config]
    assert len(changes) == 1 and changes[0].new_config["block_n"] == 256


def test_schema_invalid_output_falls_back_to_rules_and_says_why(api_key, monkeypatch):
    bad = _good_output()
    bad["recommendations"][0]["confidence"] = 3.0  # outside [0, 1]
    del bad["summary"]
    with FakeAnthropic([Reply(200, structured_body(bad, input_tokens=900, output_tokens=80))]) as fake:
        result = _run(fake, monkeypatch)
    a = result.advisor
    assert a.advisor_used == AdvisorKind.RULES_ONLY
    assert "schema-invalid output" in a.reason
    assert result.recommendations == _rules_only().recommendations
    assert a.accepted == ()
    assert (a.input_tokens, a.output_tokens) == (900, 80)  # the spend is still reported


def test_truncated_output_is_a_failure_not_partial_data(api_key, monkeypatch):
    text = json.dumps(_good_output())[:200]
    with FakeAnthropic([Reply(200, message_body(text, stop_reason="max_tokens", output_tokens=8192))]) as fake:
        result = _run(fake, monkeypatch)
    assert result.advisor.advisor_used == AdvisorKind.RULES_ONLY
    assert "truncated" in result.advisor.reason and result.advisor.output_tokens == 8192


def test_429_then_success_is_retried(api_key, monkeypatch):
    script = [Reply(429, error_body("rate_limit_error", "slow down"), headers={"retry-after-ms": "20"}),
              Reply(200, structured_body(_good_output()))]
    with FakeAnthropic(script) as fake:
        result = _run(fake, monkeypatch)
    assert len(fake.received) == 2
    assert result.advisor.advisor_used == AdvisorKind.CLAUDE, result.advisor.reason


def test_repeated_5xx_falls_back_after_the_retries(api_key, monkeypatch):
    script = [Reply(500, error_body("api_error", "boom"), headers={"retry-after-ms": "10"}),
              Reply(529, error_body("overloaded_error", "overloaded"), headers={"retry-after-ms": "10"}),
              Reply(503, error_body("api_error", "unavailable"), headers={"retry-after-ms": "10"})]
    with FakeAnthropic(script) as fake:
        result = _run(fake, monkeypatch, max_retries=2)
    assert len(fake.received) == 3  # one call + two retries
    assert result.advisor.advisor_used == AdvisorKind.RULES_ONLY
    assert "server error (503) after retries" in result.advisor.reason
    assert result.recommendations == _rules_only().recommendations


def test_a_request_timeout_falls_back(api_key, monkeypatch):
    with FakeAnthropic([Reply(200, structured_body(_good_output()), delay_s=2.0)]) as fake:
        result = _run(fake, monkeypatch, timeout_s=0.5, max_retries=0)
    assert result.advisor.advisor_used == AdvisorKind.RULES_ONLY
    assert "timed out" in result.advisor.reason


def test_a_hung_endpoint_is_abandoned_when_the_total_budget_is_spent(api_key, monkeypatch):
    """The server never answers; the per-request timeout is far away; the budget decides."""
    with FakeAnthropic([Reply(hang=True)]) as fake:
        result = _run(fake, monkeypatch, timeout_s=300.0, max_retries=5, budget_s=0.5)
    a = result.advisor
    assert a.advisor_used == AdvisorKind.RULES_ONLY
    assert "no answer within the total budget of 0.5 s" in a.reason and ENV_BUDGET in a.reason
    assert len(fake.received) == 1
    assert result.recommendations == _rules_only().recommendations


def test_time_limits_come_from_the_environment(api_key, monkeypatch):
    monkeypatch.setenv(ENV_TIMEOUT, "7.5")
    monkeypatch.setenv(ENV_RETRIES, "1")
    monkeypatch.setenv(ENV_BUDGET, "30")
    s = AdvisorSettings.from_env()
    assert (s.timeout_s, s.max_retries, s.budget_s, s.problem) == (7.5, 1, 30.0, None)
    defaults = AdvisorSettings()
    assert defaults.budget_s < 60 and defaults.timeout_s * (defaults.max_retries + 1) >= defaults.budget_s / 3
    monkeypatch.setenv(ENV_TIMEOUT, "soon")
    monkeypatch.setenv(ENV_RETRIES, "-3")
    bad = AdvisorSettings.from_env()
    assert "KERNAUDIT_CLAUDE_TIMEOUT_S='soon' is not a number" in bad.problem and ENV_RETRIES in bad.problem
    with FakeAnthropic([]) as fake:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
        result = stage.run(_frame(), verify_settings=VerifySettings(max_compiles=0), advisor_settings=bad)
    assert fake.received == [] and result.advisor.advisor_used == AdvisorKind.RULES_ONLY
    assert "not configured" in result.advisor.reason


def test_no_api_key_means_rules_only_and_no_request(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with FakeAnthropic([]) as fake:
        result = _run(fake, monkeypatch)
    assert fake.received == []
    assert result.advisor.advisor_used == AdvisorKind.RULES_ONLY
    assert "no ANTHROPIC_API_KEY" in result.advisor.reason
    assert "rules only: no ANTHROPIC_API_KEY" in result.note()


def test_model_comes_from_the_environment(api_key, monkeypatch):
    monkeypatch.setenv("KERNAUDIT_CLAUDE_MODEL", "claude-haiku-4-5")
    settings = AdvisorSettings.from_env(max_retries=0)
    assert (settings.model, settings.max_retries) == ("claude-haiku-4-5", 0)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")  # nothing listens: a connection failure
    result = stage.run(_frame(), verify_settings=VerifySettings(max_compiles=0), advisor_settings=settings)
    assert result.advisor.advisor_used == AdvisorKind.RULES_ONLY and "connection failed" in result.advisor.reason


def test_kernel_source_only_when_opted_in(api_key, monkeypatch):
    frame = _frame(kernel="gemm_bf16", shape="not_a_module_shape")
    empty = {"summary": "nothing to add", "recommendations": [], "block_size_heuristics": []}
    script = [Reply(200, structured_body(empty)), Reply(200, structured_body(empty))]
    with FakeAnthropic(script) as fake:
        _run(fake, monkeypatch, frame=frame)
        _run(fake, monkeypatch, frame=frame, include_source=True)
    without, with_source = (r.body["messages"][0]["content"] for r in fake.received)
    assert "@triton.jit" not in without
    assert "@triton.jit" in with_source and "kernels/gemm.py" in with_source


def test_api_key_never_leaks(api_key, monkeypatch, caplog, tmp_path):
    caplog.set_level(logging.DEBUG)
    results = []
    with FakeAnthropic([Reply(200, structured_body(_good_output()))]) as fake:
        results.append(_run(fake, monkeypatch))
    # a leaky upstream that echoes the key in its error body, every time
    echo = [Reply(500, echo_api_key=True, headers={"retry-after-ms": "10"}) for _ in range(2)]
    with FakeAnthropic(echo) as fake:
        results.append(_run(fake, monkeypatch, max_retries=1))
    assert results[0].advisor.advisor_used == AdvisorKind.CLAUDE
    assert results[1].advisor.advisor_used == AdvisorKind.RULES_ONLY
    assert "[REDACTED]" in results[1].advisor.reason  # the echoed key was there, and was scrubbed

    import mlflow
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    mlflow.set_experiment("advisor-leak-test")
    for result in results:
        with mlflow.start_run():
            mlflow.log_params(result.mlflow_params())
            mlflow.log_metrics(result.mlflow_metrics())
            mlflow.set_tags(result.mlflow_tags())
    runs = mlflow.search_runs(experiment_names=["advisor-leak-test"], output_format="list")
    assert len(runs) == 2
    stored = json.dumps([{"params": r.data.params, "tags": r.data.tags, "metrics": r.data.metrics} for r in runs])
    assert "advisor_reason" in stored and "claude-sonnet-5-5" in stored

    texts = [caplog.text, stored] + [repr(r.advisor) for r in results]
    texts += [json.dumps(r.to_json(), default=str) for r in results]
    texts += [json.dumps(asdict(r.advisor), default=str) for r in results]
    for text in texts:
        assert api_key not in text
        assert api_key[len("sk-ant-"):] not in text


@pytest.mark.slow
def test_refuted_claude_config_is_rejected_with_the_reason(api_key, monkeypatch, tmp_path):
    """A real recompile: Claude proposes the 128x256 tile on 4 warps, which spills."""
    monkeypatch.setenv("KERNAUDIT_DATA_DIR", str(tmp_path))
    frame = _frame(kernel="gemm_bf16", shape="llama3_8b_o_prefill")
    out = _good_output(kernel="gemm_bf16")
    s = _suggestion("gemm_bf16", shape_name="llama3_8b_o_prefill", code="increase_tile_size_to_128x256_with_4_warps",
                    new_config={"block_m": 128, "block_n": 256, "block_k": 64, "group_m": 8, "num_warps": 4,
                                "num_stages": 3})
    out["recommendations"] = [s]
    out["block_size_heuristics"] = []
    with FakeAnthropic([Reply(200, structured_body(out))]) as fake:
        result = _run(fake, monkeypatch, frame=frame,
                      verify=VerifySettings(max_workers=2, cache_dir=tmp_path / "cache"))
    a = result.advisor
    assert a.advisor_used == AdvisorKind.CLAUDE, a.reason
    assert a.accepted == ()
    (rejected,) = a.rejected
    assert rejected.recommendation.verification.state == VerificationState.REFUTED
    assert "still spills" in rejected.reason
    after = rejected.recommendation.verification.static_after
    assert after.spill_stores_bytes > 0 and after.registers_per_thread == 255


def test_the_stage_runs_rules_and_verification_without_the_network(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    result = stage.run(_frame(baseline_us=400.0), verify_settings=VerifySettings(max_compiles=0))
    assert result.advisor.advisor_used == AdvisorKind.RULES_ONLY
    (decision,) = result.decisions
    assert decision.decision == DecisionKind.SHIP_CONFIG and decision.config_id == "BK64_BM128_BN256_GM8_s3_w8"
    (ship,) = result.recommendations
    v = ship.verification
    # no compile here: it fits because it ran correctly in the sweep; 1.6x the baseline
    assert (v.fits, v.faster_than_baseline, v.state) == (VerificationState.VERIFIED,) * 3
    assert v.speedup_new == pytest.approx(400 / 250)
