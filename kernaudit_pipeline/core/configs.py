"""Config and shape vocabulary: the one home of every key map.

A kernel module spells its meta-parameters in upper case (``BLOCK_M``), the ``kernel_runs``
table in lower case (``block_m``) and vLLM's config files in its own way (``BLOCK_SIZE_M``).
Shapes name their dims ``M``/``N``/``K`` or ``B``/``H``/``S``/``D`` while the table has
``m``/``batch``/``seq_len``/``head_dim``. Every translation between them lives here, with the
config id format and the key that groups rows into one decision.

Standard library only: the GPU runner imports this on hosts with nothing but torch, triton and
numpy.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType

from kernaudit_pipeline.core.values import as_int, is_missing

# kernel meta-parameter -> kernel_runs column
KERNEL_TO_COLUMN: Mapping[str, str] = MappingProxyType({
    "BLOCK_M": "block_m", "BLOCK_N": "block_n", "BLOCK_K": "block_k", "GROUP_M": "group_m",
    "SPLIT_K": "split_k", "num_warps": "num_warps", "num_stages": "num_stages",
})
COLUMN_TO_KERNEL: Mapping[str, str] = MappingProxyType({v: k for k, v in KERNEL_TO_COLUMN.items()})
# config columns a kernel_runs row carries (split_k only where a kernel has it)
CONFIG_COLUMNS: tuple[str, ...] = ("block_m", "block_n", "block_k", "group_m", "num_warps", "num_stages")
LAUNCH_KEYS: tuple[str, ...] = ("num_warps", "num_stages")
TRITON_DEFAULT_NUM_WARPS = 4
TRITON_DEFAULT_NUM_STAGES = 3
VALID_NUM_WARPS: tuple[int, ...] = (1, 2, 4, 8, 16, 32)

# kernel_runs column -> the key vLLM's fused_moe / w8a8 Triton config files use
COLUMN_TO_VLLM: Mapping[str, str] = MappingProxyType({
    "block_m": "BLOCK_SIZE_M", "block_n": "BLOCK_SIZE_N", "block_k": "BLOCK_SIZE_K",
    "group_m": "GROUP_SIZE_M", "num_warps": "num_warps", "num_stages": "num_stages",
})
VLLM_REQUIRED: tuple[str, ...] = tuple(COLUMN_TO_VLLM)

# shape dim -> kernel_runs column (HKV is an alias some kernels use for KV_H)
DIM_TO_COLUMN: Mapping[str, str] = MappingProxyType({
    "M": "m", "N": "n", "K": "k", "B": "batch", "H": "num_heads", "KV_H": "num_kv_heads",
    "HKV": "num_kv_heads", "S": "seq_len", "D": "head_dim",
})
COLUMN_TO_DIM: Mapping[str, str] = MappingProxyType({
    "m": "M", "n": "N", "k": "K", "batch": "B", "num_heads": "H", "num_kv_heads": "KV_H",
    "seq_len": "S", "head_dim": "D",
})

# One decision per group: the same kernel, at the same shape, on the same device.
GROUP_KEY: tuple[str, ...] = ("kernel_name", "shape_name", "device_name")

# config_id abbreviations; anything else keeps its own name
_SHORT: Mapping[str, str] = MappingProxyType({
    "BLOCK_M": "BM", "BLOCK_N": "BN", "BLOCK_K": "BK", "GROUP_M": "GM", "BLOCK_D": "BD",
    "BLOCK_KV": "BKV", "PARTITION_SIZE": "PS", "SPLIT_K": "SK", "num_warps": "w", "num_stages": "s",
})
_LONG: Mapping[str, str] = MappingProxyType({v: k for k, v in _SHORT.items()})
_ID_PART = re.compile(r"^([A-Za-z_]+?)(-?\d+)$")


def config_id(config: Mapping[str, object]) -> str:
    """A stable, readable id: keys sorted, launch options last, e.g.
    ``BK64_BM128_BN256_GM8_s3_w8``."""
    parts = []
    for key in sorted(config, key=lambda k: (k.startswith("num_"), k)):
        parts.append(f"{_SHORT.get(key, key)}{config[key]}")
    return "_".join(parts)


def parse_config_id(text: object) -> dict[str, int] | None:
    """The kernel config behind a :func:`config_id`, or None when ``text`` is not one.

    Only the abbreviated keys round-trip; ids with free-form parts (baselines, foreign
    kernels) are not configs.
    """
    if not isinstance(text, str) or not text:
        return None
    out: dict[str, int] = {}
    for part in text.split("_"):
        m = _ID_PART.match(part)
        if not m or m.group(1) not in _LONG:
            return None
        out[_LONG[m.group(1)]] = int(m.group(2))
    return out


def row_config(row: Mapping[str, object]) -> dict[str, int]:
    """The config columns a row has values for, lower case (``{"block_m": 128, ...}``)."""
    out = {}
    for col in (*CONFIG_COLUMNS, "split_k"):
        v = as_int(row.get(col))
        if v is not None:
            out[col] = v
    return out


def kernel_config_to_columns(config: Mapping[str, object]) -> dict[str, object]:
    """``{"BLOCK_M": 128, "num_warps": 8}`` -> ``{"block_m": 128, "num_warps": 8}`` (keys the
    table has no column for are left out)."""
    return {KERNEL_TO_COLUMN[k]: v for k, v in config.items() if k in KERNEL_TO_COLUMN}


def columns_to_kernel_config(columns: Mapping[str, object]) -> dict[str, object]:
    return {COLUMN_TO_KERNEL[k]: v for k, v in columns.items() if k in COLUMN_TO_KERNEL}


def shape_columns(dims: Mapping[str, object]) -> dict[str, object]:
    """``{"M": 4096, "KV_H": 8}`` -> ``{"m": 4096, "num_kv_heads": 8}``."""
    return {DIM_TO_COLUMN[k]: v for k, v in dims.items() if k in DIM_TO_COLUMN}


def row_shape_dims(row: Mapping[str, object]) -> dict[str, int]:
    out = {}
    for col, dim in COLUMN_TO_DIM.items():
        v = as_int(row.get(col))
        if v is not None:
            out[dim] = v
    return out


def group_key(row: Mapping[str, object]) -> tuple[str, str | None, str | None]:
    """(kernel, shape, device) with missing parts as None."""
    def text(v: object) -> str | None:
        return None if is_missing(v) else str(v)
    return (str(row.get("kernel_name")), text(row.get("shape_name")), text(row.get("device_name")))


def config_label(cfg: Mapping[str, object]) -> str:
    """Short readable config name for people: ``128x256x64_w8_s3``."""
    if "block_m" in cfg:
        tile = "x".join(str(cfg[k]) for k in ("block_m", "block_n", "block_k") if k in cfg)
    else:  # e.g. decode attention: only the K/V block is tiled
        tile = "_".join(f"b{k[-1]}{cfg[k]}" for k in ("block_n", "block_k") if k in cfg)
    parts = [tile] if tile else []
    if "num_warps" in cfg:
        parts.append(f"w{cfg['num_warps']}")
    if "num_stages" in cfg:
        parts.append(f"s{cfg['num_stages']}")
    if (as_int(cfg.get("split_k")) or 1) > 1:
        parts.append(f"splitk{cfg['split_k']}")
    return "_".join(parts) or "unknown"


def is_power_of_two(value: object) -> bool:
    v = as_int(value)
    return v is not None and v > 0 and (v & (v - 1)) == 0
