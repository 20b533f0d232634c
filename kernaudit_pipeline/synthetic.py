"""Deterministic synthetic benchmark tables for Triton attention kernel runs.

The seed asks for "normalized synthetic benchmark tables representing Triton
attention kernel runs across varying tile sizes". These are not measurements;
every row says so: ``data_kind = "modelled"``, ``source_format = "synthetic"``, and a
device label (``DEVICE_LABEL``) that names no real card, so a modelled row can never
be taken for, or grouped with, a run on a real H200. The numbers come from a
small model calibrated on the H200 figures in ANCHORS.md, so registers,
spills, shared memory and latency agree with each other:

Registers. Each thread holds its share of the fp32 accumulators. For flash
attention those are the O tile (BLOCK_M x D) and the S/P tile
(BLOCK_M x BLOCK_N): ``acc = (BLOCK_M*D + BLOCK_M*BLOCK_N) / (32*num_warps)``.
Demand is ``REG_BASE + REG_PER_ACC * acc``. Fitted on the H200 matmul table
(acc 32 -> 64 regs, acc 128 -> 220/244 regs) this gives REG_BASE = 8 and
REG_PER_ACC = 1.75. Past 255 registers the excess spills, 4 bytes each:
the fit predicts 804 B for 128x256/4 warps (measured 808 B) and 776 B for
256x256/8 warps (measured 776 B). Those measured figures are local memory per
thread (the stack frame, Triton's ``n_spills * 4``), so the modelled figure is
written to ``stack_frame_bytes``; the model does not tell ptxas spill stores
and loads apart from the frame, so ``spill_stores_bytes`` and
``spill_loads_bytes`` carry the same modelled figure.

Shared memory. The Q tile stays resident, K and V tiles are pipelined:
``BLOCK_M*D*2 + num_stages * 2*BLOCK_N*D*2`` bytes (bf16), the same
arithmetic that gives 147,456 B for the 128x256x64/3-stage matmul. Over the
sm_90 opt-in limit of 232,448 B the config cannot launch (OUT_OF_RESOURCES).

Latency. Prefill is compute-bound: ``flops / (rate * tile_eff * stage_eff)``
with the rate anchored on SDPA FLASH (346 TFLOP/s non-causal, 318 causal) and
``tile_eff`` interpolated in log2(tile area) through the matmul table's
efficiency points (1/8 of a 128x256 tile -> 0.47, 1/2 -> 0.93, full -> 1.0).
Decode is memory-bound: KV bytes over the measured 4.24 TB/s copy rate times a
tile efficiency. Spills multiply latency by ``1 + 0.176*sqrt(spill_bytes)``
(fitted: 808 B -> 6.0x slower, 3,248 B -> 11x; the table shows 6.1x and
12x). Each latency gets 1 % lognormal noise from a seeded generator and
median/p10/p90/bootstrap-CI over 64 simulated samples.

A few rows are deliberately corrupted (``--faults``, default 3) so that the
quarantine path is exercised on the embedded default; each says so in its
``run_message``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kernaudit_pipeline.core.configs import config_id
from kernaudit_pipeline.core.hardware import SM_RESOURCES
from kernaudit_pipeline.kernel_runs import COLUMNS
from kernaudit_pipeline.settings import SYNTHETIC_DIR

MODEL_VERSION = "synthetic-attention-v1"
# Not a device name torch or ncu would print: modelled rows form groups of their own. The
# compute capability stays 9.0, so the occupancy arithmetic uses sm_90's limits.
DEVICE_LABEL = "synthetic model (H200-calibrated)"
REG_BASE = 8.0
REG_PER_ACC = 1.75
MAX_REGS = SM_RESOURCES["9.0"].max_regs_per_thread
SMEM_LIMIT_BYTES = SM_RESOURCES["9.0"].smem_per_block_optin_bytes  # sm_90 opt-in shared memory per block
SPILL_PENALTY = 0.176
SDPA_FLASH_TFLOPS = {False: 346.0, True: 318.0}  # ANCHORS.md, B4 H32 S4096 D128
TRITON_RATE_OVER_SDPA = 1.06  # best Triton tile vs FA2, assumed
COPY_BW_BYTES_PER_S = 4.24e12  # ANCHORS.md, device-to-device copy
DECODE_BASELINE_EFF = 0.55  # PyTorch gather + SDPA moves the KV twice-ish
# (log2 of tile area relative to 128x256, efficiency) from the H200 matmul table
TILE_EFF_POINTS = ((-3.0, 0.474), (-1.0, 0.928), (0.0, 1.0))
STAGE_EFF = {1: 0.78, 2: 0.93, 3: 1.0, 4: 1.0, 5: 0.99}
NOISE_SIGMA = 0.01
SAMPLES = 64

BLOCK_MS = (32, 64, 128, 256)
BLOCK_NS = (32, 64, 128)
NUM_WARPS = (4, 8)
NUM_STAGES = (2, 3, 4)


@dataclass(frozen=True)
class AttnShape:
    name: str
    phase: str
    batch: int
    num_heads: int
    num_kv_heads: int
    seq_len: int
    head_dim: int
    causal: bool


SHAPES = (
    AttnShape("prefill_b4_h32_kv8_s4096_d128_causal", "prefill", 4, 32, 8, 4096, 128, True),
    AttnShape("prefill_b4_h32_kv8_s4096_d128", "prefill", 4, 32, 8, 4096, 128, False),
    AttnShape("prefill_b8_h32_kv8_s1024_d64_causal", "prefill", 8, 32, 8, 1024, 64, True),
    AttnShape("decode_b32_h32_kv8_ctx4096_d128", "decode", 32, 32, 8, 4096, 128, False),
    AttnShape("decode_b64_h32_kv8_ctx2048_d128", "decode", 64, 32, 8, 2048, 128, False),
)


def attention_flops(s: AttnShape) -> float:
    q_len = 1 if s.phase == "decode" else s.seq_len
    flops = 4.0 * s.batch * s.num_heads * q_len * s.seq_len * s.head_dim
    return flops / 2 if s.causal else flops


def attention_bytes(s: AttnShape) -> float:
    q_len = 1 if s.phase == "decode" else s.seq_len
    q_and_o = 2 * s.batch * s.num_heads * q_len * s.head_dim * 2
    kv = 2 * s.batch * s.num_kv_heads * s.seq_len * s.head_dim * 2
    return float(q_and_o + kv)


def registers_and_spills(block_m: int, block_n: int, head_dim: int, num_warps: int) -> tuple[int, int]:
    acc = (block_m * head_dim + block_m * block_n) / (32 * num_warps)
    demand = REG_BASE + REG_PER_ACC * acc
    regs = min(MAX_REGS, int(math.ceil(demand / 8) * 8))
    spill_bytes = int(max(0.0, demand - MAX_REGS) * 4)
    return min(regs, MAX_REGS), spill_bytes


def shared_memory_bytes(block_m: int, block_n: int, head_dim: int, num_stages: int) -> int:
    return block_m * head_dim * 2 + num_stages * 2 * block_n * head_dim * 2


def tile_efficiency(block_m: int, block_n: int) -> float:
    x = math.log2(block_m * block_n / (128 * 256))
    xs, ys = zip(*TILE_EFF_POINTS)
    return float(np.interp(x, xs, ys))


def _samples(rng: np.random.Generator, median_us: float) -> np.ndarray:
    return median_us * np.exp(rng.normal(0.0, NOISE_SIGMA, SAMPLES))


def _summary(rng: np.random.Generator, samples: np.ndarray) -> dict[str, float]:
    boots = np.median(rng.choice(samples, size=(1000, samples.size), replace=True), axis=1)
    return {
        "median": float(np.median(samples)),
        "p10": float(np.percentile(samples, 10)),
        "p90": float(np.percentile(samples, 90)),
        "ci_low": float(np.percentile(boots, 2.5)),
        "ci_high": float(np.percentile(boots, 97.5)),
    }


def generate(seed: int = 0, faults: int = 3) -> pd.DataFrame:
    """The full sweep as a normalized ``kernel_runs`` frame (deterministic per seed)."""
    rng = np.random.default_rng(seed)
    rows: list[dict] = []
    for shape in SHAPES:
        flops, nbytes = attention_flops(shape), attention_bytes(shape)
        if shape.phase == "prefill":
            base_us = flops / (SDPA_FLASH_TFLOPS[shape.causal] * 1e12) * 1e6
            baseline_name = "F.scaled_dot_product_attention[FLASH]"
        else:
            base_us = nbytes / (COPY_BW_BYTES_PER_S * DECODE_BASELINE_EFF) * 1e6
            baseline_name = "gather+F.scaled_dot_product_attention"
        base = _summary(rng, _samples(rng, base_us))
        for bm in BLOCK_MS:
            for bn in BLOCK_NS:
                for warps in NUM_WARPS:
                    for stages in NUM_STAGES:
                        regs, spill = registers_and_spills(bm, bn, shape.head_dim, warps)
                        smem = shared_memory_bytes(bm, bn, shape.head_dim, stages)
                        row = {
                            "kernel_name": "flash_attention_fwd" if shape.phase == "prefill" else "paged_decode_attention",
                            "config_id": config_id({"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": warps,
                                                    "num_stages": stages}),
                            "block_m": bm, "block_n": bn, "num_warps": warps, "num_stages": stages,
                            "shape_name": shape.name, "phase": shape.phase, "batch": shape.batch,
                            "num_heads": shape.num_heads, "num_kv_heads": shape.num_kv_heads,
                            "seq_len": shape.seq_len, "head_dim": shape.head_dim, "causal": shape.causal,
                            "dtype": "bf16", "registers_per_thread": regs, "spill_stores_bytes": spill,
                            "spill_loads_bytes": spill, "stack_frame_bytes": spill,
                            "shared_mem_bytes": smem, "shared_mem_dynamic_bytes": smem,
                            "shared_mem_static_bytes": 0, "threads_per_block": 32 * warps,
                            "flops": flops, "bytes_moved": nbytes,
                            "baseline_name": baseline_name, "baseline_us": base["median"],
                            "baseline_ci_low_us": base["ci_low"], "baseline_ci_high_us": base["ci_high"],
                            "device_name": DEVICE_LABEL, "compute_capability": "9.0",
                            "data_kind": "modelled", "source_format": "synthetic",
                            "source_file": f"{MODEL_VERSION}(seed={seed})",
                            "source_row": len(rows),
                        }
                        q_len = 1 if shape.phase == "decode" else shape.seq_len
                        row["grid_size"] = math.ceil(q_len / bm) * shape.batch * shape.num_heads
                        if smem > SMEM_LIMIT_BYTES:
                            row.update(run_status="OUT_OF_RESOURCES",
                                       run_message=f"shared memory {smem} B > {SMEM_LIMIT_BYTES} B opt-in limit")
                            rows.append(row)
                            continue
                        eff = tile_efficiency(bm, bn) * STAGE_EFF[stages]
                        if shape.phase == "prefill":
                            rate = SDPA_FLASH_TFLOPS[shape.causal] * TRITON_RATE_OVER_SDPA * eff
                            ideal_us = flops / (rate * 1e12) * 1e6
                        else:
                            # decode: BLOCK_N sets the KV stream width; BLOCK_M only pads the query group
                            bw_eff = {32: 0.62, 64: 0.78, 128: 0.84}[bn] * STAGE_EFF[stages]
                            ideal_us = nbytes / (COPY_BW_BYTES_PER_S * bw_eff) * 1e6 * (1 + 0.02 * (bm // 32))
                        latency = ideal_us * (1.0 + SPILL_PENALTY * math.sqrt(spill))
                        s = _summary(rng, _samples(rng, latency))
                        row.update(latency_us=s["median"], latency_p10_us=s["p10"], latency_p90_us=s["p90"],
                                   latency_ci_low_us=s["ci_low"], latency_ci_high_us=s["ci_high"],
                                   latency_samples=SAMPLES, correct=True, max_rel_error=float(rng.uniform(1e-3, 4e-3)),
                                   run_status="OK", run_message=f"modelled by {MODEL_VERSION}; no GPU timed it")
                        rows.append(row)
    frame = pd.DataFrame(rows)
    if faults:
        frame = _inject_faults(frame, faults, rng)
    return frame.reindex(columns=list(COLUMNS))


def _inject_faults(frame: pd.DataFrame, count: int, rng: np.random.Generator) -> pd.DataFrame:
    """Corrupt a few timed rows in ways real traces get corrupted."""
    timed = frame.index[frame["run_status"] == "OK"].to_numpy()
    picks = rng.choice(timed, size=min(count, timed.size), replace=False)
    faults = (("latency_us", -frame.loc[picks[0], "latency_us"], "negative latency"),
              ("registers_per_thread", 300, "registers over the 255 hardware limit"),
              ("num_warps", 3, "num_warps not a power of two"))
    for idx, (col, value, what) in zip(picks, faults * (count // 3 + 1)):
        frame[col] = frame[col].astype(object)
        frame.loc[idx, col] = value
        frame.loc[idx, "run_message"] = f"synthetic fault injection: {what}"
    return frame


def write_tables(out_dir: Path = SYNTHETIC_DIR, seed: int = 0, faults: int = 3) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "attention_runs.csv"
    generate(seed, faults).to_csv(path, index=False)
    return path
