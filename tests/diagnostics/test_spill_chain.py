"""The spill -> stall evidence chain: flagged only with evidence, always cited."""

from __future__ import annotations

import json

import pytest

from kernaudit_pipeline.spill_diagnostics import (
    LG_THROTTLE_SHARE_PCT, LONG_SCOREBOARD_SHARE_PCT, diagnose_record, spill_chain, spill_detected,
)

# Figures ncu measured on the H200 for the 128x256x64 4-warp GEMM (ANCHORS: spills at 255 regs).
SPILLING = {"registers_per_thread": 255, "local_spill_requests": 3_411_968, "local_memory_bytes": 844_497_792,
            "stall_lg_throttle_pct": 40.46, "stall_long_scoreboard_pct": 22.94}
# ... and for the clean 128x256x64 8-warp one.
CLEAN = {"registers_per_thread": 207, "local_spill_requests": 0, "local_memory_bytes": 0,
         "stall_lg_throttle_pct": 5.77, "stall_long_scoreboard_pct": 21.19}


def test_measured_spilling_kernel_is_flagged_with_cited_evidence():
    causes, evidence, verdict = spill_chain(SPILLING)
    assert causes and "lg_throttle 40.5%" in verdict
    cited = {e.metric: e for e in evidence}
    assert cited["stall_lg_throttle_pct"].threshold == LG_THROTTLE_SHARE_PCT and cited["stall_lg_throttle_pct"].met
    assert cited["local_spill_requests"].value == 3_411_968 and cited["local_spill_requests"].op == ">"


def test_clean_kernel_is_never_flagged():
    assert spill_chain(CLEAN)[0] is False and not spill_detected(CLEAN)


def test_stalls_without_spill_evidence_are_not_blamed_on_spills():
    # an elementwise kernel: huge long_scoreboard (global loads), lg_throttle high too, no spills
    row = {"local_spill_requests": 0, "stall_lg_throttle_pct": 35.0, "stall_long_scoreboard_pct": 88.0,
           "spill_stores_bytes": 0}
    causes, _, verdict = spill_chain(row)
    assert not causes and verdict == "no spill evidence"
    assert not spill_chain({"stall_lg_throttle_pct": 90.0})[0]


def test_static_spills_alone_do_not_prove_stalls():
    causes, evidence, verdict = spill_chain({"spill_stores_bytes": 2048})
    assert not causes and "no stall figures" in verdict
    assert [(e.metric, e.value, e.threshold) for e in evidence] == [("spill_stores_bytes", 2048.0, 0)]


def test_static_spills_that_never_run():
    causes, _, verdict = spill_chain({"spill_stores_bytes": 808, "local_spill_requests": 0,
                                      "stall_lg_throttle_pct": 30.0})
    assert not causes and "not executed" in verdict


@pytest.mark.parametrize("row, expected", [
    ({"stack_frame_bytes": 784, "stall_lg_throttle_pct": 12.0, "source_format": "runner_jsonl"}, True),
    ({"spill_stores_bytes": 808, "stall_lg_throttle_pct": 9.9}, False),
    ({"local_spill_requests": 1000, "stall_long_scoreboard_pct": 55.0}, True),
    # long_scoreboard counts only with measured local spilling traffic
    ({"spill_stores_bytes": 808, "stall_long_scoreboard_pct": 80.0}, False),
    ({"local_spill_requests": 1000, "stall_long_scoreboard_pct": LONG_SCOREBOARD_SHARE_PCT - 0.1}, False),
])
def test_thresholds(row, expected):
    assert spill_chain(row)[0] is expected


def test_diagnose_record_is_json_for_assess():
    fields = diagnose_record({**SPILLING, "device_name": "NVIDIA H200", "threads_per_block": 128,
                              "shared_mem_bytes": 147_456, "latency_us": 162.08, "kernel_name": "gemm_bf16"})
    text = json.dumps(fields)  # no NaN, no numpy types
    assert "NaN" not in text
    assert fields["spill_causes_stalls"] is True and fields["occupancy_limiter"] == "shared_mem"
    assert {"metric", "value", "op", "threshold", "met"} <= set(fields["spill_evidence"][0])


# ---------------------------------------------------------------------------------------------
# which column means "spills" for which source (one meaning per column)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("row, spills", [
    # ptxas' spill figures, whatever the source
    ({"spill_stores_bytes": 2048, "source_format": "seed_json"}, True),
    ({"spill_stores_bytes": 0, "spill_loads_bytes": 0, "stack_frame_bytes": 800, "source_format": "ptxas_log"}, False),
    # the runner's local memory (Triton's n_spills * 4) is the spill figure of a Triton kernel
    ({"stack_frame_bytes": 808, "source_format": "runner_jsonl"}, True),
    ({"stack_frame_bytes": 808, "source_format": "ncu_raw", "kernel_module": "gemm_bf16"}, True),
    # ... but a CUDA kernel's frame holds local arrays: no spill without ptxas' figures or ncu's
    ({"stack_frame_bytes": 1760, "source_format": "ncu_details"}, False),
    ({"stack_frame_bytes": 1760, "local_spill_requests": 12, "source_format": "ncu_details"}, True),
    # ptxas' 0 wins over a frame, even for a Triton kernel
    ({"stack_frame_bytes": 784, "spill_stores_bytes": 0, "source_format": "triton_cache"}, False),
])
def test_spill_detection_reads_the_column_that_means_spills_for_the_source(row, spills):
    assert spill_detected(row) is spills
    assert spill_chain({**row, "stall_lg_throttle_pct": 40.0})[0] is spills


def test_a_frame_without_spill_stores_is_named_as_local_arrays():
    _, _, verdict = spill_chain({"stack_frame_bytes": 800, "spill_stores_bytes": 0, "source_format": "ptxas_log"})
    assert verdict == "a stack frame but no spill stores: local arrays, not spills"
