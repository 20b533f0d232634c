"""Each per-config rule fires on a crafted row, with the right code, config and evidence."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from kernaudit_pipeline.comparisons import build_comparisons
from kernaudit_pipeline.recommendations.limits import accumulator_regs_per_thread
from kernaudit_pipeline.recommendations.model import (
    Action, Recommendation, ReviewState, Rule, Source, content_sha256, recommendation_from_json,
    recommendation_json_schema, recommendation_to_json,
)
from kernaudit_pipeline.recommendations.rules import diagnose_row as recommend_row
from kernaudit_pipeline.recommendations.rules import diagnoses
from kernaudit_pipeline.spill_diagnostics import diagnose

ROOT = Path(__file__).resolve().parents[2]
H200 = "NVIDIA H200"


def _row(**kw) -> dict:
    base = dict(kernel_name="k", status="REGRESSION", status_reason="slower", speedup=0.5, device_name=H200)
    return base | kw


def _evidence(rec: Recommendation) -> dict:
    return {e.metric: (e.value, e.threshold) for e in rec.evidence}


def test_seed_contract_is_exact_through_the_cli():
    out = subprocess.run([sys.executable, "-m", "kernaudit_pipeline.cli", "assess", "examples/seed_starter.json",
                          "--brief"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [
        {"status": "REGRESSION", "spill_detected": True, "speedup_ratio": 0.73,
         "recommendation": "reduce_tile_size_to_32x64_to_relieve_register_pressure"},
        {"status": "IMPROVED", "spill_detected": False, "speedup_ratio": 1.57,
         "recommendation": "adopt_configuration_for_production_profile"},
    ]


def test_spill_with_a_small_accumulator_shrinks_the_tile():
    rec = recommend_row(_row(block_m=64, block_n=64, num_warps=4, registers_per_thread=142, spill_stores_bytes=2048))
    assert rec.rule == Rule.REGISTER_SPILL and rec.action == Action.SHRINK_TILE
    assert rec.code == "reduce_tile_size_to_32x64_to_relieve_register_pressure"
    assert rec.new_config == {"block_m": 32, "block_n": 64, "num_warps": 4}
    assert _evidence(rec)["spill_stores_bytes"] == (2048, 0)
    assert _evidence(rec)["registers_per_thread"] == (142, 255)


def test_spill_with_a_big_accumulator_doubles_the_warps():
    """ANCHORS: 128x256 spills on 4 warps (255 regs, 808 B) and not on 8 (220 regs)."""
    assert accumulator_regs_per_thread(128, 256, 4) == 256
    rec = recommend_row(_row(block_m=128, block_n=256, block_k=64, num_warps=4, num_stages=3,
                             registers_per_thread=255, spill_stores_bytes=808))
    assert rec.action == Action.INCREASE_WARPS
    assert rec.code == "increase_num_warps_to_8_to_relieve_register_pressure"
    assert rec.new_config == {"block_m": 128, "block_n": 256, "block_k": 64, "num_warps": 8, "num_stages": 3}


@pytest.mark.parametrize(("bm", "bn", "warps", "code", "new"), [
    # 8 warps already: only the tile can give (256x256 on 8 warps spills in ANCHORS, 128x256 does not)
    (256, 256, 8, "reduce_tile_size_to_128x256_to_relieve_register_pressure", (128, 256, 8)),
    # 4 warps: double the warps and still halve, 512 -> 256 -> 128 accumulator registers
    (256, 256, 4, "reduce_tile_size_to_128x256_with_8_warps_to_relieve_register_pressure", (128, 256, 8)),
])
def test_spill_fix_brings_the_accumulator_within_budget(bm, bn, warps, code, new):
    rec = recommend_row(_row(block_m=bm, block_n=bn, num_warps=warps, spill_stores_bytes=776))
    assert rec.code == code
    assert (rec.new_config["block_m"], rec.new_config["block_n"], rec.new_config["num_warps"]) == new


def test_attention_spill_counts_the_output_tile():
    rec = recommend_row(_row(kernel_name="flash_attention_fwd", block_m=128, block_n=64, num_warps=4, head_dim=128,
                             spill_stores_bytes=400))
    assert accumulator_regs_per_thread(128, 64, 4, head_dim=128) == 192
    assert rec.code == "increase_num_warps_to_8_to_relieve_register_pressure"


def test_shared_memory_over_the_limit_reduces_stages():
    rec = recommend_row(_row(status="FAILED", run_status="OUT_OF_RESOURCES", block_m=256, block_n=256,
                             block_k=64, num_warps=8, num_stages=4, shared_mem_bytes=262_144))
    assert rec.rule == Rule.SMEM_OVERFLOW and rec.action == Action.REDUCE_STAGES
    assert rec.code == "reduce_num_stages_to_3_to_fit_shared_memory"
    assert rec.new_config["num_stages"] == 3
    assert _evidence(rec)["shared_mem_bytes"] == (262_144, 232_448)


def test_shared_memory_over_the_limit_prefers_a_smaller_block_k_to_two_stages():
    # 288 KiB at 3 stages: 2 stages would fit but starve the pipeline; BLOCK_K 64 keeps 3
    rec = recommend_row(_row(status="FAILED", run_status="OUT_OF_RESOURCES", block_m=128, block_n=256,
                             block_k=128, num_warps=8, num_stages=3, shared_mem_bytes=294_912))
    assert rec.action == Action.REDUCE_BLOCK_K
    assert rec.code == "reduce_block_k_to_64_to_fit_shared_memory"
    assert rec.new_config == {"block_m": 128, "block_n": 256, "block_k": 64, "num_warps": 8, "num_stages": 3}


def test_shared_memory_limited_occupancy_reduces_stages():
    # 64 regs x 128 threads would allow 8 blocks/SM; 66.5 KB/block allows only 3
    rec = recommend_row(_row(block_m=64, block_n=64, block_k=64, num_warps=4, num_stages=4,
                             registers_per_thread=64, shared_mem_bytes=66_536))
    assert rec.rule == Rule.SMEM_OCCUPANCY
    assert rec.code == "reduce_num_stages_to_3_to_raise_occupancy"
    assert _evidence(rec)["blocks_per_sm_by_shared_mem"] == (3, 8)


def test_shared_memory_limited_occupancy_respects_the_sram_diagnosis():
    row = _row(block_m=64, block_n=64, block_k=64, num_warps=4, num_stages=4, registers_per_thread=64,
               shared_mem_bytes=66_536, smem_limited=False)
    assert recommend_row(row).rule == Rule.CLEAN_REGRESSION


def test_no_smem_rule_when_registers_bind_anyway():
    # 220 registers x 256 threads: one block per SM whatever the shared memory
    rec = recommend_row(_row(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3,
                             registers_per_thread=220, shared_mem_bytes=147_456))
    assert rec.rule == Rule.CLEAN_REGRESSION


def test_under_filled_grid_splits_k_or_shrinks_the_tile():
    row = _row(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3, registers_per_thread=128,
               shared_mem_bytes=98_304, m=1280, n=2048, k=8192, grid_size=160)
    rec = recommend_row(row)
    assert rec.rule == Rule.GRID_FILL and rec.action == Action.SPLIT_K
    assert rec.code == "split_k_by_4_to_fill_132_sms"
    ev = _evidence(rec)
    assert ev["grid_size"] == (160, 264)  # 132 SMs x 2 blocks/SM
    assert ev["wave_efficiency"][0] == pytest.approx(160 / 264, abs=1e-4)
    # a short K leaves too little work per split: the tile shrinks instead
    short = recommend_row(row | {"k": 512, "m": 640, "n": 1024, "grid_size": 40})
    assert short.action == Action.SHRINK_TILE and short.code == "reduce_tile_size_to_64x128_to_fill_132_sms"


def test_grid_rule_needs_a_known_device():
    row = _row(device_name="Unknown GPU 9000", block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3,
               registers_per_thread=128, shared_mem_bytes=98_304, m=1280, n=2048, k=8192, grid_size=160)
    assert recommend_row(row).rule == Rule.CLEAN_REGRESSION


def test_failed_and_inconclusive_rows():
    assert recommend_row(_row(status="FAILED", status_reason="wrong")).code == "fix_correctness_before_tuning"
    rec = recommend_row(_row(status="INCONCLUSIVE", status_reason="no latency", speedup=None))
    assert rec.code == "remeasure_with_valid_latency_and_baseline" and rec.new_config is None


def _sweep() -> pd.DataFrame:
    base = dict(kernel_name="gemm_x", shape_name="s", device_name=H200, m=4096, n=4096, k=4096, block_k=64,
                group_m=8, num_stages=3, correct=True, run_status="OK", source_format="runner")
    rows = [
        dict(base, block_m=128, block_n=256, num_warps=8, latency_us=90.0, registers_per_thread=220),
        dict(base, block_m=128, block_n=128, num_warps=8, latency_us=110.0, registers_per_thread=160),
        dict(base, block_m=64, block_n=64, num_warps=4, latency_us=200.0, registers_per_thread=64),
    ]
    return pd.DataFrame(rows)


def test_diagnoses_are_one_per_config_for_the_diagnostics_table():
    frame = diagnose(build_comparisons(_sweep().assign(baseline_us=100.0)))
    table = diagnoses(frame)
    assert len(table) == len(frame)
    assert list(table["diagnosis"]) == ["adopt_configuration_for_production_profile",
                                        "keep_baseline_and_retune_tile_configuration",
                                        "keep_baseline_and_retune_tile_configuration"]
    assert set(table["config_id"]) == {"BK64_BM128_BN256_GM8_s3_w8", "BK64_BM128_BN128_GM8_s3_w8",
                                       "BK64_BM64_BN64_GM8_s3_w4"}


def test_record_round_trips_through_its_json_schema():
    frame = diagnose(build_comparisons(_sweep().assign(baseline_us=100.0)))
    for _, row in frame.iterrows():
        rec = recommend_row(row)
        assert rec.review_state == ReviewState.PENDING_REVIEW and rec.source == Source.RULES
        data = recommendation_to_json(rec)
        json.dumps(data)  # plain JSON
        back = recommendation_from_json(json.loads(json.dumps(data)))
        assert back == rec
        assert content_sha256(back) == content_sha256(rec)
    schema = recommendation_json_schema()
    for key in ("kernel_name", "current_config", "action", "new_config", "code", "rationale", "evidence",
                "expected_effect", "verification", "confidence", "source", "review_state"):
        assert key in schema["properties"], key
    assert set(schema["$defs"]["Action"]["enum"]) == {str(a) for a in Action}


def test_schema_rejects_a_malformed_record():
    frame = diagnose(build_comparisons(_sweep().assign(baseline_us=100.0)))
    good = recommendation_to_json(recommend_row(frame.iloc[0]))
    for path, bad in ((("action",), "teleport"), (("current_config", "block_m"), "big"), (("confidence",), 1.5),
                      (("rec_id",), "rec-xyz"), (("verification", "state"), "PROBABLY")):
        data = json.loads(json.dumps(good))
        target = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = bad
        with pytest.raises(ValueError):
            recommendation_from_json(data)


def test_decode_attention_spill_uses_the_kv_block():
    rec = recommend_row(_row(kernel_name="paged_decode_attention", block_n=256, num_warps=1, num_stages=2,
                             head_dim=128, spill_stores_bytes=1024))
    assert rec.code == "increase_num_warps_to_8_to_relieve_register_pressure"
    rec = recommend_row(_row(kernel_name="paged_decode_attention", block_n=512, num_warps=4, num_stages=2,
                             head_dim=128, spill_stores_bytes=1024))
    assert rec.code == "reduce_block_n_to_256_with_8_warps_to_relieve_register_pressure"


def test_shared_memory_overflow_falls_back_to_a_smaller_kv_block():
    # two stages already: only a narrower K/V block can fit
    rec = recommend_row(_row(status="FAILED", run_status="OUT_OF_RESOURCES", kernel_name="paged_decode_attention",
                             block_n=512, num_warps=8, num_stages=2, shared_mem_bytes=283_648))
    assert rec.action == Action.SHRINK_TILE
    assert rec.code == "reduce_block_n_to_256_to_fit_shared_memory"


def test_rules_read_the_diagnostics_occupancy_columns():
    """spill_diagnostics.diagnose adds occupancy limits; the rule uses them rather than recomputing."""
    frame = diagnose(build_comparisons(pd.DataFrame([dict(
        kernel_name="k", device_name=H200, block_m=64, block_n=64, block_k=64, num_warps=4, num_stages=4,
        registers_per_thread=64, shared_mem_bytes=66_536, latency_us=120.0, baseline_us=100.0, correct=True,
        source_format="runner")])))
    row = frame.iloc[0]
    assert row["occupancy_limiter"] == "shared_mem" and bool(row["smem_limited"])
    assert (row["occupancy_limit_shared_mem"], row["occupancy_limit_registers"]) == (3, 8)
    assert recommend_row(frame.iloc[0]).rule == Rule.SMEM_OCCUPANCY
