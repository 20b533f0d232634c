"""The Verifier: real sm_90 recompiles (a few small ones) and the sweep's measurements, kept apart."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from kernaudit_pipeline.comparisons import build_comparisons
from kernaudit_pipeline.recommendations.model import (
    Action, Recommendation, Rule, StaticSnapshot, VerificationState,
)
from kernaudit_pipeline.recommendations.ranking import Candidate, decide, rank_groups
from kernaudit_pipeline.recommendations.rules import decision_item
from kernaudit_pipeline.recommendations.rules import diagnose_row as recommend_row
from kernaudit_pipeline.recommendations.verify import (
    UnsupportedConfig, Verifier, VerifySettings, configs_match, find_candidate, overall, static_verdict,
    template_config, to_kernel_config, versus_baseline, versus_current,
)
from kernaudit_pipeline.spill_diagnostics import diagnose

V = VerificationState
SHAPE = "llama3_8b_o_prefill"
BASE = dict(kernel_name="gemm_bf16", shape_name=SHAPE, device_name="NVIDIA H200", m=4096, n=4096, k=4096,
            block_k=64, group_m=8, num_stages=3, baseline_us=250.0, baseline_ci_low_us=249.0,
            baseline_ci_high_us=251.0, correct=True, run_status="OK", source_format="runner")


def _ci(lat: float) -> dict:
    return {"latency_us": lat, "latency_ci_low_us": lat * 0.99, "latency_ci_high_us": lat * 1.01}


@pytest.fixture(scope="module")
def verified(tmp_path_factory) -> dict[str, Recommendation]:
    """One batch: a spilling config, its clean neighbour, and a config over the shared-memory limit."""
    data = tmp_path_factory.mktemp("data")
    rows = [
        dict(BASE, block_m=128, block_n=256, num_warps=4, registers_per_thread=255, spill_stores_bytes=808,
             spill_loads_bytes=808, **_ci(1200.0)),
        dict(BASE, block_m=128, block_n=256, num_warps=8, registers_per_thread=220, spill_stores_bytes=0,
             spill_loads_bytes=0, **_ci(190.0)),
        dict(BASE, block_m=256, block_n=256, num_warps=8, num_stages=4, shared_mem_bytes=262_144,
             run_status="OUT_OF_RESOURCES"),
    ]
    frame = diagnose(build_comparisons(pd.DataFrame(rows)))
    rankings = rank_groups(frame)
    (g,) = rankings.values()
    recs = [recommend_row(frame.iloc[0]), recommend_row(frame.iloc[2]), decision_item(g, decide(g))]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KERNAUDIT_DATA_DIR", str(data))
        verifier = Verifier(VerifySettings(max_workers=2, cache_dir=data / "cache"), rankings)
        out = verifier.verify(recs)
    assert verifier.compiles <= 6  # one memo: the adopted config is compiled once for both uses
    return {"spill": out[0], "smem": out[1], "ship": out[2]}


@pytest.mark.slow
def test_spill_fix_recompiles_clean_and_shows_the_measured_gain(verified):
    rec = verified["spill"]
    assert rec.code == "increase_num_warps_to_8_to_relieve_register_pressure"
    v = rec.verification
    assert (v.state, v.fits, v.faster_than_current, v.faster_than_baseline) == (V.VERIFIED,) * 4
    assert v.static_before.spill_stores_bytes > 0 and v.static_before.registers_per_thread == 255
    assert v.static_after.spill_stores_bytes == 0 and v.static_after.spill_loads_bytes == 0
    assert v.static_after.registers_per_thread < 255
    assert v.static_after.shared_mem_bytes <= v.static_after.shared_mem_limit_bytes == 232_448
    assert v.static_after.arch == "sm_90" and v.static_after.compile_status == "OK"
    assert v.speedup_current == pytest.approx(250 / 1200)
    assert v.speedup_new == pytest.approx(250 / 190)
    lo, hi = v.speedup_new_ci
    assert lo < v.speedup_new < hi
    assert "no spills" in v.note and "intervals separate" in v.note


@pytest.mark.slow
def test_a_refuted_first_proposal_is_refined_from_the_recompile(verified):
    rec = verified["smem"]
    assert rec.rule == Rule.SMEM_OVERFLOW
    # 3 stages fit shared memory but 256x256 on 8 warps spills: the recompile says so, the rule refines
    assert rec.code == ("reduce_num_stages_to_3_to_fit_shared_memory_then_"
                        "reduce_tile_size_to_128x256_to_relieve_register_pressure")
    assert rec.new_config == {"block_m": 128, "block_n": 256, "block_k": 64, "group_m": 8, "num_warps": 8,
                              "num_stages": 3}
    v = rec.verification
    assert v.fits == V.VERIFIED and v.static_after.spill_stores_bytes == 0
    assert v.static_before.compile_status == "OUT_OF_RESOURCES"
    assert "refined after" in v.note and "still spills" in v.note
    # the refined config was measured by the sweep; the current one never ran: nothing to compare with
    assert v.faster_than_baseline == V.VERIFIED and v.speedup_current is None
    assert v.faster_than_current == V.UNVERIFIED and v.state == V.UNVERIFIED


@pytest.mark.slow
def test_shipping_a_measured_config_verifies_it_fits_and_beats_the_baseline(verified):
    rec = verified["ship"]
    assert rec.action == Action.ADOPT and rec.rule == Rule.SHIP_CONFIG
    v = rec.verification
    assert (v.fits, v.faster_than_current, v.faster_than_baseline, v.state) == (
        V.VERIFIED, V.NOT_APPLICABLE, V.VERIFIED, V.VERIFIED)
    assert v.static_after.spill_stores_bytes == 0 and v.speedup_new == pytest.approx(250 / 190)


def test_no_new_config_is_not_applicable():
    rec = recommend_row(dict(BASE, block_m=64, block_n=64, num_warps=4, status="FAILED", status_reason="wrong"))
    (out,) = Verifier(VerifySettings(max_compiles=0)).verify([rec])
    assert out.new_config is None and out.verification.state == V.NOT_APPLICABLE
    assert out.verification.fits == out.verification.faster_than_baseline == V.NOT_APPLICABLE


def test_rows_without_a_kernel_module_or_known_shape_stay_unverified():
    seed = recommend_row(dict(kernel_name="fused_fp8_gemm", block_m=64, block_n=64, registers_per_thread=142,
                              spill_stores_bytes=2048, status="REGRESSION", status_reason="x", speedup=0.73))
    synthetic = replace(seed, kernel_name="synthetic_only_kernel")
    out = Verifier(VerifySettings(max_compiles=None)).verify([seed, synthetic])
    assert [r.verification.state for r in out] == [V.UNVERIFIED, V.UNVERIFIED]
    assert "not one of fused_fp8_gemm's shapes" in out[0].verification.note
    assert "no kernel module named 'synthetic_only_kernel'" in out[1].verification.note
    assert out[0].code == seed.code  # the seed's contract is untouched by verification


def test_config_keys_convert_and_fill_from_the_kernel_configs():
    mod = Verifier().kernel("gemm_bf16")
    current = {"block_m": 16, "block_n": 64, "block_k": 256, "num_warps": 4, "num_stages": 4}
    template = template_config(mod, current)
    assert template["GROUP_M"] == 1  # the decode entry, not the first CONFIGS entry (GROUP_M 8)
    cfg = to_kernel_config(dict(current, block_m=32), mod, template)
    assert cfg == {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 256, "GROUP_M": 1, "num_warps": 4, "num_stages": 4}
    with pytest.raises(UnsupportedConfig, match="no SPLIT_K"):
        to_kernel_config(dict(current, split_k=2), mod, template)
    assert to_kernel_config(dict(current, split_k=1), mod, template)["BLOCK_K"] == 256


def test_split_k_on_a_kernel_without_it_needs_a_kernel_change():
    rec = recommend_row(dict(BASE, block_m=128, block_n=128, num_warps=8, registers_per_thread=128,
                             shared_mem_bytes=98_304, m=1280, n=2048, k=8192, grid_size=160,
                             status="REGRESSION", status_reason="x", speedup=0.9))
    assert rec.action == Action.SPLIT_K
    (out,) = Verifier(VerifySettings(max_compiles=None)).verify([rec])
    assert out.verification.state == V.UNVERIFIED
    assert "no SPLIT_K meta-parameter" in out.verification.note and "kernel change" in out.verification.note


def test_compile_budget_is_respected():
    rec = recommend_row(dict(BASE, block_m=128, block_n=256, num_warps=4, spill_stores_bytes=808,
                             status="REGRESSION", status_reason="x", speedup=0.2))
    (out,) = Verifier(VerifySettings(max_compiles=0)).verify([rec])
    assert out.verification.fits == V.UNVERIFIED and "max_compiles=0" in out.verification.note


def test_configs_match_on_core_keys():
    a = {"block_m": 128, "block_n": 256, "block_k": 64, "num_warps": 8, "num_stages": 3}
    assert configs_match(a, dict(a, group_m=8))
    assert not configs_match(a, dict(a, num_warps=4))
    assert not configs_match(a, {k: v for k, v in a.items() if k != "block_k"})
    assert configs_match(a, dict(a, split_k=1)) and not configs_match(a, dict(a, split_k=2))


def _snap(**kw) -> StaticSnapshot:
    base = dict(config_id="c", registers_per_thread=128, spill_stores_bytes=0, spill_loads_bytes=0,
                shared_mem_bytes=49_152, shared_mem_limit_bytes=232_448, blocks_per_sm=4, compile_status="OK",
                arch="sm_90")
    return StaticSnapshot(**(base | kw))


def test_static_verdicts():
    rec = recommend_row(dict(BASE, block_m=64, block_n=64, num_warps=4, registers_per_thread=64,
                             shared_mem_bytes=66_536, num_stages=4, status="REGRESSION", status_reason="x",
                             speedup=0.9))
    assert rec.rule == Rule.SMEM_OCCUPANCY
    before = _snap(blocks_per_sm=3)
    assert static_verdict(rec, before, _snap(blocks_per_sm=4))[0] == V.VERIFIED
    state, note = static_verdict(rec, before, _snap(blocks_per_sm=3))
    assert state == V.REFUTED and "occupancy not raised" in note
    assert static_verdict(rec, None, _snap(spill_stores_bytes=8))[0] == V.REFUTED
    assert static_verdict(rec, None, _snap(compile_status="COMPILE_TIMEOUT"))[0] == V.UNVERIFIED
    assert static_verdict(rec, None, _snap(compile_status="COMPILE_ERROR"), "compile worker failed to start")[0] \
        == V.UNVERIFIED
    assert static_verdict(rec, None, _snap(compile_status="COMPILE_ERROR"), "bad layout")[0] == V.REFUTED


def _cand(speedup: float, half: float | None = 0.01, *, paired: bool = True, kind: str = "measured",
          latency: float = 100.0) -> Candidate:
    from kernaudit_pipeline.core.verdicts import DataKind
    return Candidate(config_id="c", config={"block_m": 64}, speedup=speedup,
                     ci_low=None if half is None else speedup - half, ci_high=None if half is None else speedup + half,
                     paired=paired, latency_us=latency, rows=1, data_kind=DataKind(kind))


def test_the_three_measured_questions_are_answered_apart():
    assert versus_baseline(_cand(1.10), 0.02)[0] == V.VERIFIED
    state, note = versus_baseline(_cand(0.925), 0.02)
    assert state == V.REFUTED and "slower than the baseline" in note  # the 0.925x that was once approved
    assert versus_baseline(_cand(0.995, 0.001), 0.02)[0] == V.REFUTED  # measured slower, however slightly
    assert versus_baseline(_cand(1.01), 0.02)[0] == V.UNVERIFIED  # inside the noise band
    assert versus_baseline(_cand(1.08, paired=False), 0.02)[0] == V.UNVERIFIED  # unpaired: the 10 % band
    state, note = versus_baseline(_cand(1.5, kind="modelled"), 0.02)
    assert state == V.UNVERIFIED and "modelled" in note and "measured" not in note
    assert versus_baseline(None, 0.02)[0] == V.UNVERIFIED
    assert versus_current(_cand(0.5), _cand(1.0), 0.02, True)[0] == V.VERIFIED
    assert versus_current(_cand(0.5), _cand(0.4), 0.02, True)[0] == V.REFUTED
    assert versus_current(_cand(0.5, 0.1), _cand(0.55, 0.1), 0.02, True)[0] == V.UNVERIFIED  # overlap
    assert versus_current(_cand(0.5, None), _cand(0.505, None), 0.02, True)[0] == V.UNVERIFIED  # noise band
    assert versus_current(None, _cand(1.0), 0.02, True)[0] == V.UNVERIFIED
    assert versus_current(None, _cand(1.0), 0.02, False)[0] == V.NOT_APPLICABLE
    # a config can fit and beat its predecessor and still be slower than the baseline
    assert overall(V.VERIFIED, V.VERIFIED, V.REFUTED) == V.REFUTED
    assert overall(V.VERIFIED, V.NOT_APPLICABLE, V.VERIFIED) == V.VERIFIED
    assert overall(V.VERIFIED, V.UNVERIFIED, V.VERIFIED) == V.UNVERIFIED


def test_an_exact_config_id_match_wins_over_the_column_match():
    base = dict(kernel_name="paged_decode_attention", shape_name="s", device_name="NVIDIA H200", block_n=128,
                num_warps=4, num_stages=3, latency_us=10.0, run_status="OK", correct=True, baseline_us=12.0,
                source_format="runner")
    frame = build_comparisons(pd.DataFrame([dict(base, config_id="BN128_PARTITION_SIZE1024_w4_s3", latency_us=13.0),
                                            dict(base, config_id="BN128_PARTITION_SIZE512_w4_s3", latency_us=9.0)]))
    (g,) = rank_groups(frame).values()
    cfg = {"block_n": 128, "num_warps": 4, "num_stages": 3}
    assert find_candidate(g, cfg, "BN128_PARTITION_SIZE512_w4_s3").speedup == pytest.approx(12 / 9)
    assert find_candidate(g, cfg, "BN128_PARTITION_SIZE1024_w4_s3").speedup == pytest.approx(12 / 13)
