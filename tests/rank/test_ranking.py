"""kernaudit rank end to end on real sm_90 compiles (the tutorial matmul fixture: one clean
config, one heavy spiller, one small tile), and the pipeline's frames."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from kernaudit_pipeline.cli import main
from kernaudit_pipeline.rank.frame import PREDICTION_COLUMNS, compare_with_measured, predict_frame
from kernaudit_pipeline.rank.ranking import rank_kernels

FIXTURE = Path(__file__).resolve().parents[1] / "static" / "fixtures" / "tiny_matmul.py"
CLEAN, SPILL, SMALL = "BK64_BM128_BN256_GM8_s3_w8", "BK64_BM128_BN256_GM8_s3_w4", "BK32_BM64_BN64_GM8_s3_w4"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KERNAUDIT_DATA_DIR", str(root))
        yield root


@pytest.fixture(scope="module")
def report(data_dir):
    return rank_kernels([FIXTURE], max_workers=2)


def test_each_shape_is_ranked_and_the_heavy_spill_dropped(report):
    assert not report.failures
    assert [r.shape_name for r in report.rankings] == ["sq1024", "odd_m", "sq2048"]
    for r in report.rankings:
        assert [x.config_id for x in r.dropped] == [SPILL]
        assert "heavy spills" in r.dropped[0].reason
        assert {x.config_id for x in r.ranked} == {CLEAN, SMALL}
        assert [x.predicted_rank for x in r.ranked] == [1, 2]
        assert all(x.data_kind == "predicted" for x in r.ranked) and r.data_kind == "predicted"
        times = [x.predicted_us for x in r.ranked]
        assert times == sorted(times) and r.ranked[0].relative_to_best == 1.0
    # at 2048^3 the 128x256 tile wins on arithmetic intensity
    big = report.rankings[2]
    assert big.ranked[0].config_id == CLEAN and not big.memory_bound


def test_json_output_is_the_documented_list(report, capsys):
    assert main(["rank", str(FIXTURE), "--json", "--shapes", "sq2048", "--top", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(o["kernel_name"], o["shape_name"]) for o in out] == [("tiny_matmul_fp16", "sq2048")]
    (best,) = out[0]["ranked"]
    assert best["config_id"] == CLEAN and best["predicted_us"] > 0 and best["data_kind"] == "predicted"
    assert out[0]["dropped"][0]["config_id"] == SPILL


def test_table_output_says_predicted(report, capsys):
    assert main(["rank", str(FIXTURE), "--shapes", "sq1024"]) == 0
    out = capsys.readouterr().out
    assert "PREDICTED" in out and CLEAN in out and "dropped: 1 heavy spill" in out


@pytest.mark.parametrize("argv, needle", [
    (["rank", "no_such_kernel"], "unknown kernel 'no_such_kernel'"),
    (["rank", str(FIXTURE), "--shapes", "nope"], "unknown shape 'nope'"),
    (["rank", str(FIXTURE), "--top", "0"], "--top must be at least 1"),
    (["rank", str(FIXTURE), "--device", "NVIDIA GeForce 256"], "unknown GPU"),
    (["rank", str(FIXTURE), "--calibration", "/nonexistent.json"], "no such file"),
    (["rank", str(FIXTURE), "--calibration", "/dev/null"], "/dev/null: not a regular file"),
    (["rank", str(FIXTURE), "--calibration", str(Path(__file__).parent)], "not a regular file"),
])
def test_bad_input_is_one_line_exit_2(report, argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_an_unusable_calibration_is_refused_before_any_compile(tmp_path, capsys):
    """It used to fall back to the priors and rank as if calibrated (stating ±15 %)."""
    bad = tmp_path / "cal.json"
    bad.write_text('{"params": {"e_wgma": 0.9}}')
    assert main(["rank", str(FIXTURE), "--calibration", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "params.e_wgma: not a parameter of the model" in err[0], err


def test_predict_frame_ranks_what_the_static_audit_compiled(report, data_dir):
    static = pd.DataFrame({"kernel_name": ["tiny_matmul_fp16"] * 2, "config_id": [CLEAN, SPILL]})
    # the fixture is no module of kernels/: point the describe step at it through its NAME
    frame = predict_frame(static.assign(kernel_name=str(FIXTURE)))
    assert list(frame.columns) == PREDICTION_COLUMNS
    assert set(frame["config_id"]) == {CLEAN, SPILL}  # SMALL was not in the static frame
    assert set(frame["data_kind"]) == {"predicted"}
    ranked = frame[frame["predicted_us"].notna()]
    assert set(ranked["config_id"]) == {CLEAN} and set(ranked["predicted_rank"]) == {1}
    assert frame.loc[frame["config_id"] == SPILL, "dropped_reason"].str.contains("heavy").all()
    assert predict_frame(pd.DataFrame()).empty


def test_disagreements_are_flagged_beyond_the_stated_error():
    pred = pd.DataFrame({"kernel_name": "k", "shape_name": "s", "config_id": ["a", "b", "c", "d"],
                         "predicted_us": [10.0, 11.0, 12.0, 13.0], "predicted_rank": [1, 2, 3, 4],
                         "stated_error": 0.1})
    runs = pd.DataFrame({"kernel_name": "k", "shape_name": "s", "config_id": ["a", "b", "c", "d", "a"],
                         "latency_us": [20.0, 22.0, 24.0, 40.0, 20.2], "run_status": "OK"})
    cmp = compare_with_measured(pred, runs).set_index("config_id")
    assert list(cmp["disagrees"]) == [False, False, False, True]
    assert cmp.loc["d", "measured_rank"] == 4 and cmp.loc["a", "measured_us"] == pytest.approx(20.1)
    assert cmp.loc["b", "predicted_on_measured_scale_us"] == pytest.approx(11.0 * 2.0, rel=0.01)
    assert set(cmp["data_kind"]) == {"predicted"}


def test_modelled_rows_are_no_measurement_and_missing_columns_are_no_error():
    pred = pd.DataFrame({"kernel_name": "k", "shape_name": "s", "config_id": ["a", "b"],
                         "predicted_us": [10.0, 11.0], "predicted_rank": [1, 2], "stated_error": 0.1})
    runs = pd.DataFrame({"kernel_name": "k", "shape_name": "s", "config_id": ["a", "b"],
                         "latency_us": [20.0, 22.0], "run_status": "OK", "data_kind": ["measured", "modelled"]})
    assert list(compare_with_measured(pred, runs)["config_id"]) == ["a"]
    assert compare_with_measured(pred, runs.drop(columns=["latency_us"])).empty
    assert len(compare_with_measured(pred, runs.drop(columns=["run_status", "data_kind"]))) == 2


def test_the_assets_rank_and_compare(report, data_dir):
    from dagster import build_asset_context

    from kernaudit_pipeline.defs.ranking import predicted_ranking, predicted_vs_measured
    from kernaudit_pipeline.defs.resources import AuditSettings

    static = pd.DataFrame({"kernel_name": [str(FIXTURE)] * 3, "config_id": [CLEAN, SPILL, SMALL]})
    settings = AuditSettings(data_dir=str(data_dir))
    predicted = predicted_ranking(build_asset_context(), settings, static)
    assert set(predicted["data_kind"]) == {"predicted"} and predicted["predicted_us"].notna().sum() == 6
    runs = pd.DataFrame({"kernel_name": "tiny_matmul_fp16", "shape_name": "sq2048",
                         "config_id": [CLEAN, SMALL], "latency_us": [100.0, 900.0], "run_status": "OK",
                         "data_kind": "measured"})
    both = predicted_vs_measured(build_asset_context(), predicted, runs)
    assert list(both["config_id"]) == [CLEAN, SMALL] and list(both["measured_rank"]) == [1, 2]
    assert predicted_ranking(build_asset_context(), AuditSettings(static_enabled=False), static).empty
