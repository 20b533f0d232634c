"""Best measured config per (kernel, shape, device): eligibility, ties, vLLM tables."""

from __future__ import annotations

import pandas as pd
import pytest

from kernaudit_pipeline.best_config import (
    best_configs, block_size_heuristics, m_bucket, nearest_m, vllm_entry, vllm_filename, vllm_tables,
)
from kernaudit_pipeline.comparisons import build_comparisons

BASE = dict(kernel_name="gemm_x", shape_name="s", device_name="NVIDIA H200", m=4096, n=4096, k=4096,
            block_k=64, group_m=8, num_warps=8, num_stages=3, baseline_us=120.0, correct=True,
            run_status="OK", source_format="runner")


def _frame(*rows: dict) -> pd.DataFrame:
    return build_comparisons(pd.DataFrame([BASE | r for r in rows]))


def _ci(lat: float, half: float) -> dict:
    return {"latency_us": lat, "latency_ci_low_us": lat - half, "latency_ci_high_us": lat + half}


def test_fastest_wins_when_nothing_is_tied():
    (best,) = best_configs(_frame(
        dict(block_m=128, block_n=256, registers_per_thread=220, shared_mem_bytes=147_456, **_ci(90.0, 0.5)),
        dict(block_m=128, block_n=128, registers_per_thread=160, shared_mem_bytes=98_304, **_ci(100.0, 0.5)),
    ))
    assert best.config["block_n"] == 256 and best.tied_with == ()
    assert best.runner_up["block_n"] == 128 and best.runner_up_latency_us == 100.0
    assert best.speedup == pytest.approx(120 / 90)


def test_overlapping_intervals_tie_and_fewer_registers_win():
    (best,) = best_configs(_frame(
        dict(block_m=128, block_n=256, registers_per_thread=220, shared_mem_bytes=147_456, **_ci(90.0, 3.0)),
        dict(block_m=128, block_n=128, registers_per_thread=160, shared_mem_bytes=98_304, **_ci(95.0, 3.0)),
    ), noise_band=0.0)
    assert best.config["block_n"] == 128
    assert best.tied_with == ("128x256x64_w8_s3",)
    assert "lower registers" in best.reason


def test_equal_registers_fall_back_to_shared_memory():
    (best,) = best_configs(_frame(
        dict(block_m=128, block_n=128, num_stages=4, registers_per_thread=160, shared_mem_bytes=131_072,
             latency_us=100.0),
        dict(block_m=128, block_n=128, num_stages=3, registers_per_thread=160, shared_mem_bytes=98_304,
             latency_us=101.0),  # within the 2 % noise band, no intervals
    ))
    assert best.config["num_stages"] == 3


def test_outside_the_noise_band_and_without_overlap_the_fastest_wins():
    (best,) = best_configs(_frame(
        dict(block_m=128, block_n=256, registers_per_thread=220, **_ci(90.0, 0.5)),
        dict(block_m=64, block_n=64, registers_per_thread=64, **_ci(100.0, 0.5)),
    ))
    assert best.config["block_m"] == 128


def test_only_correct_timed_rows_compete():
    (best,) = best_configs(_frame(
        dict(block_m=256, block_n=256, latency_us=10.0, correct=False),              # fast and wrong
        dict(block_m=256, block_n=128, latency_us=20.0, run_status="TIMEOUT"),        # did not finish
        dict(block_m=128, block_n=64, latency_us=None, run_status="PRUNED_SPILL"),    # not timed
        dict(block_m=64, block_n=64, latency_us=150.0),
    ))
    assert best.config["block_m"] == 64 and best.candidates == 1


def test_groups_are_per_kernel_shape_device():
    frame = _frame(
        dict(block_m=128, block_n=256, latency_us=90.0),
        dict(block_m=64, block_n=64, latency_us=80.0, device_name="NVIDIA H100 80GB HBM3"),
        dict(block_m=16, block_n=64, block_k=256, group_m=1, latency_us=30.0, shape_name="decode", m=16),
    )
    got = {b.key: b.config["block_m"] for b in best_configs(frame)}
    assert got == {("gemm_x", "s", "NVIDIA H200"): 128, ("gemm_x", "s", "NVIDIA H100 80GB HBM3"): 64,
                   ("gemm_x", "decode", "NVIDIA H200"): 16}


def test_block_size_heuristics_and_vllm_tables():
    frame = _frame(
        dict(block_m=128, block_n=256, latency_us=90.0),
        dict(block_m=16, block_n=64, block_k=256, group_m=1, num_warps=4, num_stages=4, latency_us=30.0,
             shape_name="decode", m=16),
    )
    heur = block_size_heuristics(best_configs(frame))
    assert [(h.m, h.m_bucket, h.config["block_m"]) for h in heur] == [(16, 16, 16), (4096, 4096, 128)]
    tables = vllm_tables(heur)
    table = tables[("gemm_x", "NVIDIA H200", 4096, 4096)]
    assert table == {
        "16": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 256, "GROUP_SIZE_M": 1,
               "num_warps": 4, "num_stages": 4},
        "4096": {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8,
                 "num_warps": 8, "num_stages": 3},
    }
    # vLLM's run-time lookup: the nearest tuned M
    assert nearest_m(table, 1)["BLOCK_SIZE_M"] == 16
    assert nearest_m(table, 3000)["BLOCK_SIZE_M"] == 128
    assert vllm_filename(4096, 4096, "NVIDIA H200") == "N=4096,K=4096,device_name=NVIDIA_H200.json"


def test_m_bucket_and_incomplete_entries():
    assert (m_bucket(1), m_bucket(20), m_bucket(100), m_bucket(5000)) == (1, 16, 96, 4096)
    with pytest.raises(ValueError, match="group_m"):
        vllm_entry({"block_m": 64, "block_n": 64, "block_k": 32, "num_warps": 4, "num_stages": 3})
