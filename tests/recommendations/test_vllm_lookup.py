"""The export is a vLLM drop-in: load it the way vLLM documents its tuned-config lookup.

Re-implemented here from vLLM's documentation and docstrings (not copied): the file name is
``N={N},K={K},device_name={device}`` plus ``,dtype={dtype}`` for quantized weights and
``,block_shape=[{block_n},{block_k}]`` for block-quantized ones, ``.json``; the device name is
the one torch reports with whitespace (and ``/``) runs turned into ``_``; the file maps an
irregular grid of batch sizes to configs, loaded as ``{int(key): config}``; "to evaluate the
kernel on a given batch size bs, the closest batch size in the grid should be picked".
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from kernaudit_pipeline import cli
from kernaudit_pipeline.comparisons import build_comparisons
from kernaudit_pipeline.recommendations import review, stage
from kernaudit_pipeline.recommendations.advisor import AdvisorSettings
from kernaudit_pipeline.recommendations.verify import VerifySettings
from kernaudit_pipeline.spill_diagnostics import diagnose

VLLM_KEYS = {"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages"}


def vllm_config_file_name(n: int, k: int, device_name: str, dtype: str | None = None,
                          block_shape: list[int] | None = None) -> str:
    device = re.sub(r"[\s/]+", "_", device_name)
    dtype_selector = "" if not dtype else f",dtype={dtype}"
    block_selector = "" if not block_shape or not all(block_shape) else f",block_shape=[{block_shape[0]},{block_shape[1]}]"
    return f"N={n},K={k},device_name={device}{dtype_selector}{block_selector}.json"


def vllm_get_configs(folder: Path, n: int, k: int, device_name: str, dtype: str | None = None) -> dict | None:
    path = folder / vllm_config_file_name(n, k, device_name, dtype)
    if not path.exists():
        return None
    with open(path) as f:
        return {int(key): val for key, val in json.load(f).items()}


def vllm_pick(configs: dict[int, dict], batch: int) -> dict:
    return configs[min(configs.keys(), key=lambda x: abs(x - batch))]


def _rows(kernel: str, dtype: str) -> list[dict]:
    base = dict(kernel_name=kernel, device_name="NVIDIA H200", n=6144, k=4096, group_m=8, correct=True,
                run_status="OK", source_format="runner", dtype=dtype)
    return [
        dict(base, shape_name="decode", m=16, block_m=16, block_n=64, block_k=256, group_m=1, num_warps=4,
             num_stages=4, latency_us=30.0, baseline_us=60.0),
        dict(base, shape_name="decode", m=16, block_m=64, block_n=64, block_k=64, num_warps=4, num_stages=3,
             latency_us=45.0, baseline_us=60.0),
        dict(base, shape_name="mid", m=256, block_m=64, block_n=128, block_k=64, num_warps=4, num_stages=4,
             latency_us=40.0, baseline_us=55.0),
        dict(base, shape_name="prefill", m=4096, block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3,
             latency_us=200.0, baseline_us=260.0),
        dict(base, shape_name="prefill", m=4096, block_m=64, block_n=64, block_k=32, num_warps=4, num_stages=3,
             latency_us=500.0, baseline_us=260.0),
    ]


@pytest.fixture()
def exported(tmp_path: Path) -> Path:
    frame = diagnose(build_comparisons(pd.DataFrame(_rows("gemm_x", "bf16") + _rows("fp8_x", "fp8e4m3"))))
    result = stage.run(frame, verify_settings=VerifySettings(max_compiles=0),
                       advisor_settings=AdvisorSettings(enabled=False))
    review.save_recommendations(list(result.recommendations), tmp_path)
    ships = [r for r in result.recommendations if r.new_config]
    assert len(ships) == 6  # three shapes of two kernels, each shipping its fastest config
    for rec in ships:
        assert cli.main(["review", "approve", rec.rec_id, "--reviewer", "lead", "--comment", "ok",
                         "--data-dir", str(tmp_path)]) == 0
    assert cli.main(["export", "--data-dir", str(tmp_path)]) == 0
    return tmp_path / "exports"


def test_vllm_finds_each_file_by_its_own_name(exported):
    bf16 = vllm_get_configs(exported / "gemm_x", 6144, 4096, "NVIDIA H200")
    fp8 = vllm_get_configs(exported / "fp8_x", 6144, 4096, "NVIDIA H200", dtype="fp8_w8a8")
    assert bf16 is not None and fp8 is not None
    assert vllm_get_configs(exported / "fp8_x", 6144, 4096, "NVIDIA H200") is None  # dtype is part of the name
    assert vllm_get_configs(exported / "gemm_x", 4096, 6144, "NVIDIA H200") is None  # N and K are not swapped
    for table in (bf16, fp8):
        assert sorted(table) == [16, 256, 4096]  # every approved M bucket in one file
        for entry in table.values():
            assert set(entry) == VLLM_KEYS and all(type(v) is int for v in entry.values())


@pytest.mark.parametrize(("batch", "bucket"), [(1, 16), (16, 16), (100, 16), (200, 256), (256, 256),
                                               (2000, 256), (2200, 4096), (8192, 4096)])
def test_vllm_picks_the_nearest_m(exported, batch, bucket):
    table = vllm_get_configs(exported / "gemm_x", 6144, 4096, "NVIDIA H200")
    expected = {16: (16, 64, 256), 256: (64, 128, 64), 4096: (128, 256, 64)}[bucket]
    got = vllm_pick(table, batch)
    assert (got["BLOCK_SIZE_M"], got["BLOCK_SIZE_N"], got["BLOCK_SIZE_K"]) == expected


def test_dtype_selectors_follow_vllms_names():
    """vLLM names a quantized config file by its scheme (``get_config_dtype_str``): fp8 and int8
    operands with scales are ``fp8_w8a8`` and ``int8_w8a8``; unquantized weights have none, and
    a dtype with no convention is refused rather than written under a made-up name."""
    from kernaudit_pipeline.recommendations.export import vllm_dtype

    assert vllm_dtype("fp8e4m3") == "fp8_w8a8" and vllm_dtype("torch.int8") == "int8_w8a8"
    assert vllm_dtype("bf16") is None and vllm_dtype(None) is None
    with pytest.raises(ValueError, match="no vLLM config-file selector"):
        vllm_dtype("int4")
