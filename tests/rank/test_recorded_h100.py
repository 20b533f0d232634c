"""The committed device records of 2026-12-05 to 12-07 (H100, and the H200 for w4a16_gemm and
fp8_block_gemm: issue 9's cross-check, issue 15's held-out searches)
read back the way docs/benchmarks.md reports them: the scripts and modules that produced the
figures, run on the recorded files, give the same figures (nothing here needs a GPU)."""

from __future__ import annotations

import gzip
import importlib.util
import json
import shutil
import statistics
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RANK = REPO / "samples" / "rank"
CROSSCHECK = REPO / "samples" / "h100" / "crosscheck_2026-12-05.json"
STEM = "swiglu_h100_{}_m16_m1024_2026-12-05"


def _rank_validate():
    spec = importlib.util.spec_from_file_location("rank_validate", REPO / "scripts" / "rank_validate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _unpack(name: str, tmp: Path) -> Path:
    out = tmp / name.removesuffix(".gz")
    with gzip.open(RANK / name, "rb") as src, out.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    return out


def test_the_live_search_table_reads_the_two_rung_summary(tmp_path):
    rv = _rank_validate()
    exhaustive = _unpack(STEM.format("exhaustive") + ".jsonl.gz", tmp_path)
    search = _unpack(STEM.format("search") + ".jsonl.gz", tmp_path)
    lines = rv._live_search([RANK / (STEM.format("search") + ".summary.json")], [search], [exhaustive])
    rows = {line.split(" | ")[1]: line for line in lines if line.startswith("| swiglu_gemm")}
    assert set(rows) == {"llama3_8b_gate_up_m16", "llama3_8b_gate_up_m1024"}
    # the summary's GPU-seconds (both rungs) against the exhaustive sweep's checks + timing
    assert "6.4 / 30.4 (21 %)" in rows["llama3_8b_gate_up_m16"]
    assert "4.3 / 38.1 (11 %)" in rows["llama3_8b_gate_up_m1024"]
    assert "(6 confirmed)" in rows["llama3_8b_gate_up_m16"]
    assert "(2 confirmed)" in rows["llama3_8b_gate_up_m1024"]
    # the pick's paired value in the exhaustive run over that run's best
    assert "`BK32_BM128_BN128_GM8_s5_w8` | 1.000×" in rows["llama3_8b_gate_up_m1024"]
    assert "`BK64_BM16_BN128_GM1_s3_w4` | 1.000×" in rows["llama3_8b_gate_up_m16"]
    assert lines[-1] == "All shapes searched: 10.7 of 68.5 GPU-s (16 %)."


def test_the_held_out_searches_of_2026_12_06_read_together(tmp_path):
    """Several searches (one device call each) in one table: the figures docs/benchmarks.md
    reports for the rmsnorm_gemm buckets, matched to their exhaustive sweeps by shape."""
    rv = _rank_validate()
    stems = ["rmsnorm_h100_{}_m16_m1024_2026-12-06", "rmsnorm_h100_{}_m128_m4096_2026-12-06"]
    exhaustive = [_unpack(s.format("exhaustive") + ".jsonl.gz", tmp_path) for s in stems]
    search = [_unpack(s.format("search") + ".jsonl.gz", tmp_path) for s in stems]
    lines = rv._live_search([RANK / (s.format("search") + ".summary.json") for s in stems], search, exhaustive)
    rows = {line.split(" | ")[1]: line for line in lines if line.startswith("| rmsnorm_gemm")}
    assert len(rows) == 4
    assert all(" | 1.000× | " in row for row in rows.values())  # the pick is the exhaustive best
    assert "3.0 / 42.4 (7 %)" in rows["llama3_8b_norm_qkv_m16"]
    assert "6.9 / 25.1 (28 %)" in rows["llama3_8b_norm_qkv_m4096"]
    assert lines[-1] == "All shapes searched: 20.6 of 138.8 GPU-s (15 %)."


SEARCHES = [STEM.format("search"), "swiglu_h100_search_m128_m4096_2026-12-06",
            "rmsnorm_h100_search_m16_m1024_2026-12-06", "rmsnorm_h100_search_m128_m4096_2026-12-06",
            "fp8_block_h200_search_m128_m1024_2026-12-06",
            "fused_moe_h100_search_m16_2026-12-07", "fused_moe_h100_search_m128_m1024_2026-12-07",
            "w8a8_int8_h100_search_m1024_m4096_2026-12-07", "w8a8_int8_h100_search_m16_m128_2026-12-07"]


@pytest.mark.parametrize("stem", SEARCHES)
def test_the_search_out_file_keeps_one_row_per_measured_config(stem):
    summary = json.loads((RANK / (stem + ".summary.json")).read_text())
    with gzip.open(RANK / (stem + ".jsonl.gz"), "rt") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    for s in summary:
        # a batch the deadline cut short writes NOT_RUN rows, which the search does not count
        mine = [r for r in rows if r["record_type"] == "run" and r["shape_name"] == s["shape_name"]
                and r["run_status"] != "NOT_RUN"]
        ids = [r["config_id"] for r in mine]
        assert len(ids) == len(set(ids)) == s["measured"]
        assert set(ids) == set(s["measured_config_ids"])
        confirmed = set(s["confirmed_config_ids"])
        screening = {r["config_id"] for r in mine if "screening rung" in (r.get("run_message") or "")}
        assert not confirmed & screening and len(confirmed | screening) == len(ids)
        if s["stop_reason"] == "DEADLINE":  # cut off in the screening rung: nothing confirmed
            assert not confirmed
            continue
        assert s["best_config_id"] in confirmed
        assert abs(s["gpu_seconds"] - s["gpu_seconds_screen"] - s["gpu_seconds_confirm"]) < 0.05


def test_the_crosscheck_verdicts_follow_from_their_recorded_rounds():
    doc = json.loads(CROSSCHECK.read_text())
    assert doc["device_name"].startswith("NVIDIA H100")
    assert len(doc["targets"]) == 5
    for t in doc["targets"]:
        judged = t["dobench"]["graph_short"]
        assert len(judged["ratios"]) == judged["rounds"] == 31
        assert abs(statistics.median(judged["ratios"]) - t["dobench_speedup"]) < 1e-9
        diff = t["dobench_speedup"] / t["runner_speedup"] - 1.0
        assert abs(diff - t["difference"]) < 1e-9
        assert t["agrees_within_2pct"] == (abs(diff) <= 0.02)
        assert t["runner_ci_low"] <= t["runner_speedup"] <= t["runner_ci_high"]
    assert max(abs(t["difference"]) for t in doc["targets"]) < 0.013


# docs/benchmarks.md: a pre-registered ranking's pick and best of its first five, over the
# exhaustive best (paired 1/speedup), per M bucket, with the configs the sweep timed. The first
# w8a16 call's deadline cut M=4096 at 320 of 404; a second call swept it whole.
HELD_OUT_SCORES = {
    ("w8a16_gemm.h100.ranking.json", "w8a16_h100_exhaustive_m16_m128_m1024_m4096_2026-12-06.jsonl.gz"): {
        "llama3_8b_w8a16_o_proj_m16": (404, 1.000, 1.000),
        "llama3_8b_w8a16_o_proj_m128": (404, 1.076, 1.071),
        "llama3_8b_w8a16_o_proj_m1024": (404, 1.038, 1.000),
        "llama3_8b_w8a16_o_proj_m4096": (320, 1.004, 1.000)},
    ("w8a16_gemm.h100.ranking.json", "w8a16_h100_exhaustive_m4096_rerun_2026-12-06.jsonl.gz"): {
        "llama3_8b_w8a16_o_proj_m4096": (404, 1.039, 1.002)},
    # the fourth held-out kernel, on the H200 (its H200 ranking); M=1024 was cut at 176 of 401
    # (the model's pick among them unmeasured) and M=4096 not reached, so neither is scored
    ("w4a16_gemm.ranking.json", "w4a16_h200_exhaustive_m16_m128_m1024_2026-12-06.jsonl.gz"): {
        "llama3_8b_w4a16_down_proj_m16": (401, 1.004, 1.004),
        "llama3_8b_w4a16_down_proj_m128": (401, 1.240, 1.000)},
    # the fifth, on the H200 (its H200 ranking); one call had room for M=128 and M=1024 only
    ("fp8_block_gemm.ranking.json", "fp8_block_h200_exhaustive_m128_m1024_2026-12-06.jsonl.gz"): {
        "deepseek_v3_fp8_block_shared_gate_up_m128": (398, 1.078, 1.000),
        "deepseek_v3_fp8_block_shared_gate_up_m1024": (398, 1.150, 1.138)},
    # the sixth, on the H100 that came (its H100 ranking); M=4096 not swept
    ("fused_moe_gemm.h100.ranking.json", "fused_moe_h100_exhaustive_m16_m128_m1024_2026-12-07.jsonl.gz"): {
        "qwen3_30b_a3b_moe_gate_up_m16": (406, 1.521, 1.507),
        "qwen3_30b_a3b_moe_gate_up_m128": (406, 1.063, 1.061),
        "qwen3_30b_a3b_moe_gate_up_m1024": (406, 1.461, 1.083)},
    # the seventh, on the H100 that came (its H100 ranking, committed in 85033f6), 2026-12-07:
    # near the best at small M, well off it where the tensor cores bind
    ("bias_gelu_gemm.h100.ranking.json", "bias_gelu_h100_exhaustive_m16_m128_m1024_2026-12-07.jsonl.gz"): {
        "starcoder2_15b_tp2_fc1_m16": (396, 1.010, 1.000),
        "starcoder2_15b_tp2_fc1_m128": (396, 1.005, 1.005),
        "starcoder2_15b_tp2_fc1_m1024": (396, 1.285, 1.255)},
    ("bias_gelu_gemm.h100.ranking.json", "bias_gelu_h100_exhaustive_m4096_2026-12-07.jsonl.gz"): {
        "starcoder2_15b_tp2_fc1_m4096": (396, 1.350, 1.277)},
    # the same bucket again on a fresh H100 half an hour later: the same best, the same miss
    ("bias_gelu_gemm.h100.ranking.json", "bias_gelu_h100_exhaustive_m4096_rerun_2026-12-07.jsonl.gz"): {
        "starcoder2_15b_tp2_fc1_m4096": (396, 1.356, 1.281)},
    # the eighth, w8a8_int8_gemm, on the H100 that came (its H100 ranking, committed in 01d00ce),
    # 2026-12-07 evening: the model's pick is the exhaustive best at M=1024 and M=4096. The
    # second call's deadline cut M=128 at 70 of 394 (the model's pick not among them): not scored
    ("w8a8_int8_gemm.h100.ranking.json", "w8a8_int8_h100_exhaustive_m1024_m4096_2026-12-07.jsonl.gz"): {
        "qwen2_5_32b_tp2_down_proj_m1024": (394, 1.000, 1.000),
        "qwen2_5_32b_tp2_down_proj_m4096": (394, 1.000, 1.000)},
    ("w8a8_int8_gemm.h100.ranking.json", "w8a8_int8_h100_exhaustive_m16_m128_2026-12-07.jsonl.gz"): {
        "qwen2_5_32b_tp2_down_proj_m16": (394, 1.036, 1.000)},
}


@pytest.mark.parametrize("ranking_file,sweep_file", list(HELD_OUT_SCORES))
def test_a_held_out_kernel_scores_from_its_committed_ranking(ranking_file, sweep_file):
    """The ranking committed before any GPU time (the H100 one, which gpu_rank.sh used on the
    H100 that came) against the exhaustive sweep: the held-out figures need no recompile, only
    the two committed files."""
    scores = HELD_OUT_SCORES[(ranking_file, sweep_file)]
    ranking = [g for g in json.loads((RANK / ranking_file).read_text()) if g["shape_name"] in scores]
    with gzip.open(RANK / sweep_file, "rt") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    assert {g["shape_name"] for g in ranking} == set(scores)
    for g in ranking:
        measured = {r["config_id"]: 1.0 / r["speedup"] for r in rows if r["record_type"] == "run"
                    and r["shape_name"] == g["shape_name"] and r["run_status"] == "OK"}
        assert all(r["correct"] for r in rows if r["record_type"] == "run" and r["run_status"] == "OK")
        best = min(measured.values())
        order = [r["config_id"] for r in g["ranked"] if r["config_id"] in measured]
        count, top1, top5 = scores[g["shape_name"]]
        assert len(measured) == count and order[0] == g["ranked"][0]["config_id"]
        assert round(measured[order[0]] / best, 3) == top1
        assert round(min(measured[c] for c in order[:5]) / best, 3) == top5


# The live searches of 2026-12-06, each in the order of the ranking committed before any GPU
# time, against the exhaustive sweep of the same space: (stop, configs measured, the pick's
# value over the exhaustive best, at most, and its share of the sweep's GPU-seconds, at most)
LIVE_SEARCHES = {
    # its own H100 call; M=1024 ended by the deadline, M=4096 not reached
    ("w8a16_h100_search_2026-12-06.summary.json", "w8a16_h100_exhaustive_m16_m128_m1024_m4096_2026-12-06.jsonl.gz"): {
        "llama3_8b_w8a16_o_proj_m16": ("NO_PLAUSIBLE_WINNER", 32, 1.000, 0.04),
        "llama3_8b_w8a16_o_proj_m128": ("NO_PLAUSIBLE_WINNER", 72, 1.000, 0.08),
        "llama3_8b_w8a16_o_proj_m1024": ("DEADLINE", 88, 1.000, 0.14)},
    # the H200 call right after the exhaustive sweep, on the same warm machine
    ("w4a16_h200_search_m16_m128_2026-12-06.summary.json", "w4a16_h200_exhaustive_m16_m128_m1024_2026-12-06.jsonl.gz"): {
        "llama3_8b_w4a16_down_proj_m16": ("NO_PLAUSIBLE_WINNER", 40, 1.005, 0.05),
        "llama3_8b_w4a16_down_proj_m128": ("NO_PLAUSIBLE_WINNER", 40, 1.005, 0.05)},
    # fp8_block_gemm: the same H200 call as its exhaustive sweep, right after it
    ("fp8_block_h200_search_m128_m1024_2026-12-06.summary.json", "fp8_block_h200_exhaustive_m128_m1024_2026-12-06.jsonl.gz"): {
        "deepseek_v3_fp8_block_shared_gate_up_m128": ("NO_PLAUSIBLE_WINNER", 56, 1.000, 0.09),
        "deepseek_v3_fp8_block_shared_gate_up_m1024": ("NO_PLAUSIBLE_WINNER", 96, 1.000, 0.16)},
    # fused_moe_gemm on an H100, 2026-12-07: the picks are near the best, but the searches
    # measured most of the space (over the 25 %): the model's order was poor there
    ("fused_moe_h100_search_m16_2026-12-07.summary.json", "fused_moe_h100_exhaustive_m16_m128_m1024_2026-12-07.jsonl.gz"): {
        "qwen3_30b_a3b_moe_gate_up_m16": ("DEADLINE", 320, 1.004, 0.41)},
    ("fused_moe_h100_search_m128_m1024_2026-12-07.summary.json", "fused_moe_h100_exhaustive_m16_m128_m1024_2026-12-07.jsonl.gz"): {
        "qwen3_30b_a3b_moe_gate_up_m128": ("NO_PLAUSIBLE_WINNER", 360, 1.002, 0.47),
        "qwen3_30b_a3b_moe_gate_up_m1024": ("DEADLINE", 208, 1.005, 0.31)},
    # bias_gelu_gemm on an H100, 2026-12-07: the first live run of the corrected order and the
    # kept-up worker; near the best everywhere, for 3-13 % of the GPU-seconds, although the
    # model's own first picks at M=1024 and M=4096 were 1.29x and 1.35x
    ("bias_gelu_h100_search_m16_m128_m1024_2026-12-07.summary.json", "bias_gelu_h100_exhaustive_m16_m128_m1024_2026-12-07.jsonl.gz"): {
        "starcoder2_15b_tp2_fc1_m16": ("NO_PLAUSIBLE_WINNER", 176, 1.001, 0.13),
        "starcoder2_15b_tp2_fc1_m128": ("NO_PLAUSIBLE_WINNER", 104, 1.000, 0.09),
        "starcoder2_15b_tp2_fc1_m1024": ("NO_PLAUSIBLE_WINNER", 40, 1.000, 0.04)},
    ("bias_gelu_h100_search_m4096_2026-12-07.summary.json", "bias_gelu_h100_exhaustive_m4096_2026-12-07.jsonl.gz"): {
        "starcoder2_15b_tp2_fc1_m4096": ("NO_PLAUSIBLE_WINNER", 40, 1.000, 0.04)},
    ("bias_gelu_h100_search_m4096_rerun_2026-12-07.summary.json", "bias_gelu_h100_exhaustive_m4096_rerun_2026-12-07.jsonl.gz"): {
        "starcoder2_15b_tp2_fc1_m4096": ("NO_PLAUSIBLE_WINNER", 40, 1.000, 0.04)},
    # w8a8_int8_gemm on an H100, 2026-12-07 evening; M=128's sweep was cut, so its search (104
    # configs, 4.6 GPU-s) has no exhaustive best to be read against
    ("w8a8_int8_h100_search_m1024_m4096_2026-12-07.summary.json", "w8a8_int8_h100_exhaustive_m1024_m4096_2026-12-07.jsonl.gz"): {
        "qwen2_5_32b_tp2_down_proj_m1024": ("NO_PLAUSIBLE_WINNER", 80, 1.000, 0.08),
        "qwen2_5_32b_tp2_down_proj_m4096": ("NO_PLAUSIBLE_WINNER", 40, 1.000, 0.06)},
    ("w8a8_int8_h100_search_m16_m128_2026-12-07.summary.json", "w8a8_int8_h100_exhaustive_m16_m128_2026-12-07.jsonl.gz"): {
        "qwen2_5_32b_tp2_down_proj_m16": ("NO_PLAUSIBLE_WINNER", 64, 1.000, 0.06)},
}


@pytest.mark.parametrize("summary_file,sweep_file", list(LIVE_SEARCHES))
def test_a_live_search_picked_near_the_exhaustive_best_for_a_fraction_of_its_gpu_time(summary_file, sweep_file):
    """Each pick, read inside the exhaustive sweep (one clock), is within the issue's 1.02x of
    its best, for the recorded share of that sweep's GPU-seconds at most (checks and timing
    loops of every row, references included): a few per cent where the model's order was good,
    most of the sweep where it was not."""
    from kernaudit_pipeline.rank.search import row_gpu_seconds

    summaries = {s["shape_name"]: s for s in json.loads((RANK / summary_file).read_text())}
    with gzip.open(RANK / sweep_file, "rt") as fh:
        full = [json.loads(line) for line in fh if line.strip()]
    for shape, (stop, measured, within, share) in LIVE_SEARCHES[(summary_file, sweep_file)].items():
        s = summaries[shape]
        ex = [r for r in full if r.get("shape_name") == shape and r["record_type"] in ("run", "baseline")]
        timed = {r["config_id"]: 1.0 / r["speedup"] for r in ex if r["record_type"] == "run" and r["run_status"] == "OK"}
        assert s["stop_reason"] == stop and s["measured"] == measured
        assert s["candidates"] == len(timed)  # the search walked the space the sweep timed
        assert timed[s["best_config_id"]] / min(timed.values()) <= within <= 1.02
        assert s["gpu_seconds"] / sum(row_gpu_seconds(r) for r in ex) < share


def test_a_kernel_named_held_out_is_never_fitted_on():
    """``rank_validate.py --kernels ... K --held-out K`` once fitted the shipped calibration on K
    and then reported K as "never fitted on"."""
    rv = _rank_validate()
    assert rv.fitted_kernels(["gemm", "w8a8_int8_gemm", "fp8_gemm"], ["w8a8_int8_gemm"]) == ["gemm", "fp8_gemm"]
    assert rv.fitted_kernels(rv.CALIBRATION_KERNELS, []) == rv.CALIBRATION_KERNELS
