"""Best measured config per (kernel, shape, device), and vLLM-style block-size tables.

Only correct, completed, timed rows compete. The fastest median wins unless
other configs are statistically tied with it: their latency intervals overlap,
or their medians lie within the noise band. Among tied configs the one with
fewer registers per thread, then less shared memory, wins: it leaves more
room for occupancy and for the next compiler version.

vLLM keys tuned Triton configs by batch size M in one JSON file per weight
shape (N, K) and device, and picks the nearest M at run time; the tables here
follow that layout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from kernaudit_pipeline.comparisons import DEFAULT_NOISE_BAND
from kernaudit_pipeline.recommendations import (
    config_label, current_config, group_rows, is_timed_ok, shape_dims,
)
from kernaudit_pipeline.core.values import finite_float as _num

# The batch sizes vLLM's Triton tuning scripts sweep; an M is reported under its nearest one.
VLLM_TUNING_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)
VLLM_KEYS = {"block_m": "BLOCK_SIZE_M", "block_n": "BLOCK_SIZE_N", "block_k": "BLOCK_SIZE_K",
             "group_m": "GROUP_SIZE_M", "num_warps": "num_warps", "num_stages": "num_stages"}
VLLM_REQUIRED = ("block_m", "block_n", "block_k", "group_m", "num_warps", "num_stages")


@dataclass(frozen=True)
class BestConfig:
    kernel_name: str
    shape_name: str | None
    device_name: str | None
    shape_dims: dict
    config: dict
    config_id: str | None
    latency_us: float
    latency_ci_us: tuple[float, float] | None
    speedup: float | None
    speedup_ci: tuple[float, float] | None
    status: str | None
    registers_per_thread: int | None
    shared_mem_bytes: int | None
    candidates: int
    tied_with: tuple[str, ...]
    reason: str
    runner_up: dict | None = None
    runner_up_latency_us: float | None = None

    @property
    def key(self) -> tuple[str, str | None, str | None]:
        return (self.kernel_name, self.shape_name, self.device_name)


def eligible_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Correct, completed and timed rows only."""
    if frame.empty:
        return frame
    mask = [is_timed_ok(r) for _, r in frame.iterrows()]
    return frame[mask]


def _ci(row: pd.Series, lo: str, hi: str) -> tuple[float, float] | None:
    a, b = _num(row.get(lo)), _num(row.get(hi))
    return None if a is None or b is None else (a, b)


def statistically_tied(fast: pd.Series, other: pd.Series, noise_band: float = DEFAULT_NOISE_BAND) -> bool:
    """Overlapping latency intervals, or medians within the noise band of the faster one."""
    f_lat, o_lat = float(fast["latency_us"]), float(other["latency_us"])
    if o_lat <= f_lat * (1.0 + noise_band):
        return True
    f_ci = _ci(fast, "latency_ci_low_us", "latency_ci_high_us")
    o_ci = _ci(other, "latency_ci_low_us", "latency_ci_high_us")
    return f_ci is not None and o_ci is not None and o_ci[0] <= f_ci[1]


def _resource_key(row: pd.Series) -> tuple[float, float, float]:
    regs = _num(row.get("registers_per_thread"))
    smem = _num(row.get("shared_mem_bytes"))
    return (math.inf if regs is None else regs, math.inf if smem is None else smem, float(row["latency_us"]))


def choose(rows: pd.DataFrame, noise_band: float = DEFAULT_NOISE_BAND) -> tuple[pd.Series, list[pd.Series], str]:
    """(winner, tied rows, reason) among one group's eligible rows."""
    ordered = [r for _, r in rows.sort_values("latency_us", kind="stable").iterrows()]
    fastest = ordered[0]
    tied = [r for r in ordered[1:] if statistically_tied(fastest, r, noise_band)]
    if not tied:
        return fastest, [], "fastest median latency; no other config statistically tied"
    pool = [fastest, *tied]
    winner = min(pool, key=_resource_key)
    if winner is fastest:
        reason = (f"fastest median; tied with {len(tied)} config(s) and also the lowest "
                  "registers/shared memory among them")
    else:
        reason = (f"statistically tied with the fastest ({config_label(current_config(fastest))}, "
                  f"{float(fastest['latency_us']):.2f} us); chosen for lower registers, then shared memory")
    return winner, [r for r in pool if r is not winner], reason


def best_configs(frame: pd.DataFrame, noise_band: float = DEFAULT_NOISE_BAND) -> list[BestConfig]:
    out: list[BestConfig] = []
    for key, rows in group_rows(eligible_rows(frame)):
        winner, tied, reason = choose(rows, noise_band)
        rest = [r for _, r in rows.sort_values("latency_us", kind="stable").iterrows() if r is not winner
                and current_config(r) != current_config(winner)]
        runner = rest[0] if rest else None
        regs, smem = _num(winner.get("registers_per_thread")), _num(winner.get("shared_mem_bytes"))
        status = winner.get("status")
        out.append(BestConfig(
            kernel_name=key[0], shape_name=key[1], device_name=key[2],
            shape_dims=shape_dims(winner),
            config=current_config(winner),
            config_id=None if pd.isna(winner.get("config_id")) else str(winner.get("config_id")),
            latency_us=float(winner["latency_us"]),
            latency_ci_us=_ci(winner, "latency_ci_low_us", "latency_ci_high_us"),
            speedup=_num(winner.get("speedup")),
            speedup_ci=_ci(winner, "speedup_ci_low", "speedup_ci_high"),
            status=None if status is None or pd.isna(status) else str(status),
            registers_per_thread=None if regs is None else int(regs),
            shared_mem_bytes=None if smem is None else int(smem),
            candidates=len(rows),
            tied_with=tuple(config_label(current_config(r)) for r in tied),
            reason=reason,
            runner_up=None if runner is None else current_config(runner),
            runner_up_latency_us=None if runner is None else float(runner["latency_us"]),
        ))
    return out


# ---------------------------------------------------------------------------------------------
# Block-size heuristics per M bucket, vLLM layout
# ---------------------------------------------------------------------------------------------
def m_bucket(m: int) -> int:
    """The vLLM tuning batch size nearest to M (ties go to the smaller one, as vLLM's min() does)."""
    return min(VLLM_TUNING_BATCH_SIZES, key=lambda b: abs(b - m))


def nearest_m(table: dict[str, dict], m: int) -> dict:
    """vLLM's run-time lookup: the config tuned for the M nearest to this batch size."""
    if not table:
        raise KeyError("empty config table")
    keys = sorted(int(k) for k in table)
    return table[str(min(keys, key=lambda x: abs(x - m)))]


def vllm_entry(config: dict) -> dict[str, int]:
    """One vLLM config entry; raises ValueError naming any missing key."""
    missing = [k for k in VLLM_REQUIRED if config.get(k) is None]
    if missing:
        raise ValueError(f"config lacks {', '.join(missing)} for a vLLM entry")
    return {VLLM_KEYS[k]: int(config[k]) for k in VLLM_REQUIRED}


def device_file_name(device_name: str | None) -> str:
    """vLLM names devices as torch reports them with spaces turned into underscores."""
    return (device_name or "unknown_device").strip().replace(" ", "_")


def vllm_filename(n: int, k: int, device_name: str | None) -> str:
    return f"N={n},K={k},device_name={device_file_name(device_name)}.json"


@dataclass(frozen=True)
class BlockSizeHeuristic:
    kernel_name: str
    device_name: str | None
    n: int
    k: int
    m: int
    m_bucket: int
    config: dict
    speedup: float | None
    shape_name: str | None


def block_size_heuristics(bests: list[BestConfig]) -> list[BlockSizeHeuristic]:
    """The best config per measured M of each (kernel, device, N, K) family, sorted by M."""
    out = [
        BlockSizeHeuristic(b.kernel_name, b.device_name, b.shape_dims["N"], b.shape_dims["K"], b.shape_dims["M"],
                           m_bucket(b.shape_dims["M"]), dict(b.config), b.speedup, b.shape_name)
        for b in bests if {"M", "N", "K"} <= set(b.shape_dims)
    ]
    return sorted(out, key=lambda h: (h.kernel_name, str(h.device_name), h.n, h.k, h.m))


def vllm_tables(heuristics: list[BlockSizeHeuristic]) -> dict[tuple[str, str | None, int, int], dict[str, dict]]:
    """{(kernel, device, N, K): {"M": vLLM entry}} from complete configs only."""
    tables: dict[tuple[str, str | None, int, int], dict[str, dict]] = {}
    for h in heuristics:
        try:
            entry = vllm_entry(h.config)
        except ValueError:
            continue
        tables.setdefault((h.kernel_name, h.device_name, h.n, h.k), {})[str(h.m)] = entry
    return tables
