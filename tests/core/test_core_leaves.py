"""The core leaf modules: the one home of key maps, readers and verdict records."""

import json
import math
import subprocess
import sys

import pandas as pd
import pytest

from kernaudit_pipeline.core import configs, values
from kernaudit_pipeline.core.verdicts import DataKind, Decision, DecisionKind


@pytest.mark.parametrize("cfg", [
    {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3},
    {"BLOCK_N": 128, "PARTITION_SIZE": 512, "num_warps": 4, "num_stages": 2},
])
def test_config_id_round_trips(cfg):
    assert configs.parse_config_id(configs.config_id(cfg)) == cfg


@pytest.mark.parametrize("text", ["baseline:torch.matmul", "", None, "BM", "foo12_bar", "BM1x2"])
def test_parse_config_id_refuses_non_ids(text):
    assert configs.parse_config_id(text) is None


def test_maps_are_inverse_and_read_only():
    for k, col in configs.KERNEL_TO_COLUMN.items():
        assert configs.COLUMN_TO_KERNEL[col] == k
    with pytest.raises(TypeError):
        configs.KERNEL_TO_COLUMN["X"] = "x"  # type: ignore[index]
    assert configs.shape_columns({"M": 1, "KV_H": 8, "Q": 3}) == {"m": 1, "num_kv_heads": 8}
    assert configs.row_shape_dims({"m": 16, "head_dim": 128.0, "n": float("nan")}) == {"M": 16, "D": 128}


def test_row_config_skips_missing_cells():
    row = {"block_m": 64, "block_n": pd.NA, "num_warps": 4.0, "num_stages": None}
    assert configs.row_config(row) == {"block_m": 64, "num_warps": 4}
    assert configs.config_label({"block_m": 64, "block_n": 32, "num_warps": 4}) == "64x32_w4"


@pytest.mark.parametrize("value,expected", [
    (1.5, 1.5), ("2", 2.0), (True, None), (float("inf"), None), (float("nan"), None),
    (pd.NA, None), (None, None), ("x", None), (10**400, None), ("1e400", None),
])
def test_finite_float(value, expected):
    assert values.finite_float(value) == expected


def test_json_safe_is_strict_json():
    import numpy as np
    text = json.dumps(values.json_safe({"a": np.float32(1.5), "b": float("nan"), "c": (1, pd.NA),
                                         3: np.int64(4), "d": np.array([1.0, np.inf])}),
                      allow_nan=False)
    assert json.loads(text) == {"a": 1.5, "b": None, "c": [1, None], "3": 4, "d": [1.0, None]}


def test_decision_to_json():
    d = Decision("gemm_bf16", "qkv", "NVIDIA H200", DecisionKind.KEEP_BASELINE, "BM128", 0.95,
                 0.94, math.nan, "torch.matmul", DataKind.MEASURED, "slower")
    out = d.to_json()
    assert out["decision"] == "KEEP_BASELINE" and out["data_kind"] == "measured"
    assert out["speedup_ci_high"] is None
    json.dumps(out, allow_nan=False)


def test_core_imports_only_the_standard_library():
    """The GPU runner uses core/ on hosts without pandas: importing it must not pull pandas in."""
    code = ("import sys; import kernaudit_pipeline.core.configs, kernaudit_pipeline.core.hardware, "
            "kernaudit_pipeline.core.values, kernaudit_pipeline.core.verdicts; "
            "bad = [m for m in ('pandas', 'numpy', 'torch', 'dagster') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
