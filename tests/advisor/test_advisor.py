"""The Claude advisor against a fake Anthropic server on loopback, through the real SDK."""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import asdict

import pandas as pd
import pytest

from kernaudit_pipeline.advisor import (
    AdvisorKind, AdvisorSettings, advise, advisor_markdown, advisor_output_schema, estimate_cost_usd,
)
from kernaudit_pipeline.comparisons import build_comparisons
from kernaudit_pipeline.recommendations import Source, VerificationState, build_recommendations
from kernaudit_pipeline.spill_diagnostics import diagnose
from tests.advisor.fake_anthropic import FakeAnthropic, Reply, error_body, message_body

KERNEL = "fixture_gemm"  # no module in kernels/: verification cannot compile it, by design here


def _frame(kernel: str = KERNEL, shape: str = "m4096_n4096_k4096") -> pd.DataFrame:
    base = dict(kernel_name=kernel, shape_name=shape, device_name="NVIDIA H200", m=4096, n=4096, k=4096,
                block_k=64, group_m=8, num_stages=3, baseline_us=300.0, correct=True, run_status="OK",
                source_format="runner")
    rows = [
        dict(base, block_m=128, block_n=256, num_warps=4, registers_per_thread=255, spill_stores_bytes=808,
             spill_loads_bytes=808, shared_mem_bytes=147_456, latency_us=1500.0),
        dict(base, block_m=128, block_n=256, num_warps=8, registers_per_thread=220, spill_stores_bytes=0,
             spill_loads_bytes=0, shared_mem_bytes=147_456, latency_us=250.0),
        dict(base, block_m=64, block_n=64, block_k=32, num_warps=4, registers_per_thread=64, spill_stores_bytes=0,
             spill_loads_bytes=0, shared_mem_bytes=24_576, latency_us=520.0),
    ]
    return diagnose(build_comparisons(pd.DataFrame(rows)))


def _good_output(kernel: str = KERNEL) -> dict:
    suggestion = {
        "kernel_name": kernel, "shape_name": "m4096_n4096_k4096", "device_name": "NVIDIA H200",
        "current_config": {"block_m": 64, "block_n": 64, "block_k": 32, "num_warps": 4, "num_stages": 3},
        "action": "grow_tile",
        "new_config": {"block_m": 128, "block_n": 128, "block_k": 64, "group_m": 8, "num_warps": 8,
                       "num_stages": 3},
        "code": "increase_tile_size_to_128x128_to_raise_arithmetic_intensity",
        "rationale": "64x64 tiles reach 0.58x; the 128x256 tile on 8 warps reaches 1.2x",
        "evidence": [{"metric": "speedup", "value": 0.577, "threshold": 1.0, "source": "kernel_runs"}],
        "expected_effect": "close to the best measured tile", "confidence": 0.6,
    }
    stranger = dict(suggestion, kernel_name="not_audited_kernel", code="adopt_something_else")
    return {
        "summary": "The 4-warp 128x256 config spills; 8 warps fix it.",
        "recommendations": [suggestion, stranger],
        "block_size_heuristics": [
            {"kernel_name": kernel, "device_name": "NVIDIA H200", "m_max": 4096, "block_m": 128, "block_n": 256,
             "block_k": 64, "group_m": 8, "num_warps": 8, "num_stages": 3, "rationale": "large M: big tiles"},
        ],
    }


@pytest.fixture()
def api_key(monkeypatch: pytest.MonkeyPatch) -> str:
    key = "sk-ant-test-" + secrets.token_hex(20)  # built at runtime: no key-shaped literal in the repo
    monkeypatch.setenv("ANTHROPIC_API_KEY", key)
    monkeypatch.delenv("KERNAUDIT_CLAUDE_MODEL", raising=False)
    return key


def _settings(**kw) -> AdvisorSettings:
    return AdvisorSettings(**{"max_retries": 2, "timeout_s": 10.0, **kw})


def _run(fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch, frame: pd.DataFrame | None = None,
         **settings) -> tuple:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
    frame = _frame() if frame is None else frame
    rules = build_recommendations(frame)
    return advise(frame, rules, _settings(**settings)), rules


def test_success_structured_output_validated_verified_and_costed(api_key, monkeypatch):
    with FakeAnthropic([Reply(200, message_body(json.dumps(_good_output()), input_tokens=1500,
                                                output_tokens=420))]) as fake:
        result, rules = _run(fake, monkeypatch)
    assert result.advisor_used == AdvisorKind.CLAUDE, result.advisor_reason
    assert len(fake.received) == 1
    sent = fake.received[0]
    assert sent.path == "/v1/messages"
    assert sent.api_key == api_key
    assert sent.body["output_config"] == {"format": {"type": "json_schema", "schema": advisor_output_schema()}}
    user = sent.body["messages"][0]["content"]
    assert KERNEL in user and "spill_stores_bytes" in user and "increase_num_warps_to_8" in user
    assert "@triton.jit" not in user  # no source unless opted in
    # one suggestion kept (labelled unverified: no kernel module), one rejected with the reason
    assert [r.source for r in result.claude_accepted] == [Source.CLAUDE]
    kept = result.claude_accepted[0]
    assert kept.verification.state == VerificationState.UNVERIFIED
    assert "no kernel module" in kept.verification.note
    assert [x.recommendation.kernel_name for x in result.claude_rejected] == ["not_audited_kernel"]
    assert "not in the audit's evidence" in result.claude_rejected[0].reason
    assert result.recommendations[:len(rules)] == tuple(rules)
    assert result.recommendations[len(rules):] == (kept,)
    assert len(result.heuristics) == 1 and result.heuristics[0].hint["m_max"] == 4096
    assert (result.input_tokens, result.output_tokens) == (1500, 420)
    assert result.cost_usd_estimate == pytest.approx(estimate_cost_usd("claude-sonnet-5-5", 1500, 420))
    assert result.cost_usd_estimate == pytest.approx((1500 * 2.0 + 420 * 10.0) / 1e6)
    assert result.mlflow_metrics()["advisor_output_tokens"] == 420.0
    assert result.request_id == "req_fake0001"


def test_schema_invalid_output_falls_back_to_rules_and_says_why(api_key, monkeypatch):
    bad = _good_output()
    bad["recommendations"][0]["confidence"] = 3.0  # outside [0, 1]
    del bad["summary"]
    with FakeAnthropic([Reply(200, message_body(json.dumps(bad), input_tokens=900, output_tokens=80))]) as fake:
        result, rules = _run(fake, monkeypatch)
    assert result.advisor_used == AdvisorKind.RULES_ONLY
    assert "schema-invalid output" in result.advisor_reason
    assert result.recommendations == tuple(rules)
    assert result.claude_accepted == ()
    assert (result.input_tokens, result.output_tokens) == (900, 80)  # the spend is still reported


def test_truncated_output_is_a_failure_not_partial_data(api_key, monkeypatch):
    text = json.dumps(_good_output())[:200]
    with FakeAnthropic([Reply(200, message_body(text, stop_reason="max_tokens"))]) as fake:
        result, _ = _run(fake, monkeypatch)
    assert result.advisor_used == AdvisorKind.RULES_ONLY
    assert "truncated" in result.advisor_reason


def test_429_then_success_is_retried(api_key, monkeypatch):
    script = [Reply(429, error_body("rate_limit_error", "slow down"), headers={"retry-after-ms": "20"}),
              Reply(200, message_body(json.dumps(_good_output())))]
    with FakeAnthropic(script) as fake:
        result, _ = _run(fake, monkeypatch)
    assert len(fake.received) == 2
    assert result.advisor_used == AdvisorKind.CLAUDE, result.advisor_reason


def test_repeated_5xx_falls_back_after_the_retries(api_key, monkeypatch):
    script = [Reply(500, error_body("api_error", "boom"), headers={"retry-after-ms": "10"}),
              Reply(529, error_body("overloaded_error", "overloaded"), headers={"retry-after-ms": "10"}),
              Reply(503, error_body("api_error", "unavailable"), headers={"retry-after-ms": "10"})]
    with FakeAnthropic(script) as fake:
        result, rules = _run(fake, monkeypatch, max_retries=2)
    assert len(fake.received) == 3  # one call + two retries
    assert result.advisor_used == AdvisorKind.RULES_ONLY
    assert "server error (503) after retries" in result.advisor_reason
    assert result.recommendations == tuple(rules)


def test_timeout_falls_back(api_key, monkeypatch):
    with FakeAnthropic([Reply(200, message_body(json.dumps(_good_output())), delay_s=2.0)]) as fake:
        result, rules = _run(fake, monkeypatch, timeout_s=0.5, max_retries=0)
    assert result.advisor_used == AdvisorKind.RULES_ONLY
    assert "timed out" in result.advisor_reason
    assert result.recommendations == tuple(rules)


def test_no_api_key_means_rules_only_and_no_request(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with FakeAnthropic([]) as fake:
        result, rules = _run(fake, monkeypatch)
    assert fake.received == []
    assert result.advisor_used == AdvisorKind.RULES_ONLY
    assert "no ANTHROPIC_API_KEY" in result.advisor_reason
    assert result.recommendations == tuple(rules)


def test_model_comes_from_the_environment(api_key, monkeypatch):
    monkeypatch.setenv("KERNAUDIT_CLAUDE_MODEL", "claude-haiku-4-5")
    settings = AdvisorSettings.from_env(max_retries=0)
    assert (settings.model, settings.max_retries) == ("claude-haiku-4-5", 0)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")  # nothing listens: a connection failure
    result = advise(_frame(), [], settings)
    assert result.advisor_used == AdvisorKind.RULES_ONLY and "connection failed" in result.advisor_reason


def test_kernel_source_only_when_opted_in(api_key, monkeypatch):
    frame = _frame(kernel="gemm_bf16", shape="not_a_module_shape")
    empty = {"summary": "nothing to add", "recommendations": [], "block_size_heuristics": []}
    script = [Reply(200, message_body(json.dumps(empty))), Reply(200, message_body(json.dumps(empty)))]
    with FakeAnthropic(script) as fake:
        _run(fake, monkeypatch, frame=frame)
        _run(fake, monkeypatch, frame=frame, include_source=True)
    without, with_source = (r.body["messages"][0]["content"] for r in fake.received)
    assert "@triton.jit" not in without
    assert "@triton.jit" in with_source and "kernels/gemm.py" in with_source


def test_api_key_never_leaks(api_key, monkeypatch, caplog, tmp_path):
    caplog.set_level(logging.DEBUG)
    results = []
    with FakeAnthropic([Reply(200, message_body(json.dumps(_good_output())))]) as fake:
        results.append(_run(fake, monkeypatch)[0])
    # a leaky upstream that echoes the key in its error body, every time
    echo = [Reply(500, echo_api_key=True, headers={"retry-after-ms": "10"}) for _ in range(2)]
    with FakeAnthropic(echo) as fake:
        results.append(_run(fake, monkeypatch, max_retries=1)[0])
    assert results[0].advisor_used == AdvisorKind.CLAUDE
    assert results[1].advisor_used == AdvisorKind.RULES_ONLY
    assert "[REDACTED]" in results[1].advisor_reason  # the echoed key was there, and was scrubbed

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

    texts = [caplog.text, stored] + [repr(r) for r in results] + [advisor_markdown(r) for r in results]
    texts += [json.dumps(asdict(r), default=str) for r in results]
    for text in texts:
        assert api_key not in text
        assert api_key[len("sk-ant-"):] not in text


@pytest.mark.slow
def test_refuted_claude_config_is_rejected_with_the_reason(api_key, monkeypatch, tmp_path):
    """A real recompile: Claude proposes the 128x256 tile on 4 warps, which spills."""
    monkeypatch.setenv("KERNAUDIT_DATA_DIR", str(tmp_path))
    frame = _frame(kernel="gemm_bf16", shape="llama3_8b_o_prefill")
    out = _good_output(kernel="gemm_bf16")
    s = out["recommendations"][0]
    s.update(shape_name="llama3_8b_o_prefill", code="increase_tile_size_to_128x256_with_4_warps",
             new_config={"block_m": 128, "block_n": 256, "block_k": 64, "group_m": 8, "num_warps": 4,
                         "num_stages": 3})
    out["recommendations"] = [s]
    out["block_size_heuristics"] = []
    with FakeAnthropic([Reply(200, message_body(json.dumps(out)))]) as fake:
        result, _ = _run(fake, monkeypatch, frame=frame)
    assert result.advisor_used == AdvisorKind.CLAUDE, result.advisor_reason
    assert result.claude_accepted == ()
    (rejected,) = result.claude_rejected
    assert rejected.recommendation.verification.state == VerificationState.REFUTED
    assert "still spills" in rejected.reason
    after = rejected.recommendation.verification.static_after
    assert after.spill_stores_bytes > 0 and after.registers_per_thread == 255


def test_the_stage_runs_rules_and_verification_without_the_network(monkeypatch):
    from kernaudit_pipeline.advisor import recommendations_stage
    from kernaudit_pipeline.verification import VerifySettings
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    frame = _frame()
    result = recommendations_stage(frame, verify_settings=VerifySettings(max_compiles=0))
    assert result.advisor_used == AdvisorKind.RULES_ONLY
    codes = [r.code for r in result.recommendations]
    assert codes == [r.code for r in build_recommendations(frame)]
    spill = next(r for r in result.recommendations if r.code.startswith("increase_num_warps_to_8"))
    # fixture_gemm has no kernel module, so the static check cannot run; the sweep did time the fix
    assert spill.verification.static_state == VerificationState.UNVERIFIED
    assert spill.verification.measured_state == VerificationState.VERIFIED
    assert spill.verification.measured_speedup_after == pytest.approx(300 / 250)
    assert "rules only: no ANTHROPIC_API_KEY" in result.note()
