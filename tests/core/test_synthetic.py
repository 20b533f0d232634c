"""The synthetic attention tables: deterministic and internally consistent."""

import numpy as np
import pandas as pd

from kernaudit_pipeline import synthetic
from kernaudit_pipeline.settings import SYNTHETIC_DIR


def clean():
    return synthetic.generate(seed=0, faults=0)


def test_deterministic_and_committed_table_is_current(tmp_path):
    a, b = synthetic.generate(seed=7), synthetic.generate(seed=7)
    pd.testing.assert_frame_equal(a, b)
    path = synthetic.write_tables(tmp_path, seed=0, faults=3)
    # Compared as values, not bytes: numpy's transcendental functions may differ in the last
    # bit between CPUs (SIMD dispatch), which changes the shortest repr of a few floats. A
    # generator change moves values by far more than 1e-12 relative.
    fresh, committed = pd.read_csv(path), pd.read_csv(SYNTHETIC_DIR / "attention_runs.csv")
    assert list(fresh.columns) == list(committed.columns), \
        "committed synthetic table is stale: run `kernaudit synth`"
    pd.testing.assert_frame_equal(fresh, committed, check_exact=False, rtol=1e-12, atol=0.0,
                                  obj="committed synthetic table (stale? run `kernaudit synth`)")


def test_sweep_covers_tiles_warps_stages_and_phases():
    df = clean()
    assert set(df["block_m"]) == set(synthetic.BLOCK_MS) and set(df["block_n"]) == set(synthetic.BLOCK_NS)
    assert set(df["num_warps"]) == set(synthetic.NUM_WARPS) and set(df["num_stages"]) == set(synthetic.NUM_STAGES)
    assert set(df["phase"]) == {"prefill", "decode"}


def test_model_reproduces_anchor_calibration_points():
    # acc 32 -> 64 regs (64x64 matmul, 4 warps); 128x256/4 warps -> ~808 B of spills
    regs = synthetic.REG_BASE + synthetic.REG_PER_ACC * 32
    assert abs(regs - 64) <= 8
    demand = synthetic.REG_BASE + synthetic.REG_PER_ACC * (128 * 256 / 128)
    assert abs((demand - 255) * 4 - 808) < 0.02 * 808
    assert synthetic.shared_memory_bytes(128, 64, 64, 3) == 128 * 64 * 2 + 3 * 2 * 64 * 64 * 2


def test_more_accumulator_per_thread_means_more_registers_then_spills():
    df = clean()
    acc = (df["block_m"] * df["head_dim"] + df["block_m"] * df["block_n"]) / (32 * df["num_warps"])
    order = np.argsort(acc.to_numpy(), kind="stable")
    regs = df["registers_per_thread"].to_numpy()[order]
    assert np.all(np.diff(regs) >= 0)
    assert (df["registers_per_thread"] <= 255).all()
    assert (df.loc[df["spill_stores_bytes"] > 0, "registers_per_thread"] == 255).all()


def test_spills_slow_down_and_oversized_smem_does_not_launch():
    df = clean()
    timed = df[df["run_status"] == "OK"]
    for _, g in timed.groupby(["shape_name", "block_m", "num_stages", "block_n"]):
        if g["spill_stores_bytes"].nunique() > 1:
            spilled = g.loc[g["spill_stores_bytes"].idxmax()]
            clean_row = g.loc[g["spill_stores_bytes"].idxmin()]
            assert spilled["latency_us"] > clean_row["latency_us"]
    over = df[df["shared_mem_bytes"] > synthetic.SMEM_LIMIT_BYTES]
    assert len(over) and over["latency_us"].isna().all() and (over["run_status"] == "OUT_OF_RESOURCES").all()


def test_ci_brackets_median():
    df = clean().dropna(subset=["latency_us"])
    assert (df["latency_ci_low_us"] <= df["latency_us"]).all() and (df["latency_us"] <= df["latency_ci_high_us"]).all()


def test_rows_say_they_are_modelled_on_no_real_card():
    from kernaudit_pipeline.comparisons import build_comparisons, data_kind_of
    from kernaudit_pipeline.core.hardware import lookup

    df = clean()
    assert set(df["data_kind"]) == {"modelled"} and set(df["source_format"]) == {"synthetic"}
    assert set(df["device_name"]) == {synthetic.DEVICE_LABEL} and lookup(synthetic.DEVICE_LABEL) is None
    assert all(data_kind_of(r) == "modelled" for _, r in df.head(5).iterrows())
    messages = " ".join(df["run_message"].dropna().astype(str))
    assert "measured" not in messages.replace("not measured", "")  # a model never claims a measurement
    verdicts = build_comparisons(df)
    assert "measured" not in " ".join(verdicts["status_reason"].astype(str))
