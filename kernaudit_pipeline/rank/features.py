"""The cost model's inputs for one (config, shape): what the static audit measured, what the
hardware allows, and how much work and traffic each program carries.

All of it comes from the ahead-of-time compile and the kernel module's own declarations (config,
grid, ``flops``, ``bytes_moved``), read through :class:`~kernaudit_pipeline.static_resources.
describe.KernelDescription`, so ranking never runs kernel code in this process and needs no GPU.

Per-program work and traffic depend on what a program does, which a config alone does not say.
Three families are recognised from the dims and config keys, each with its own (physical, not
fitted) traffic rule; anything else falls back to the even split of the kernel's own counts:

- ``matmul`` (dims M, N, K; BLOCK_M/N/K): a program computes a BLOCK_M x BLOCK_N output tile over
  all of K and loads a BLOCK_M x K panel of each M x K operand and a K x BLOCK_N panel of each
  K x N operand. The bytes per element of each come from ``bytes_moved`` itself (its M*K and K*N
  coefficients), so a fused kernel with two weights or fp8 operands is counted right. Padded
  rows (BLOCK_M > M) are computed and loaded all the same.
- ``attention`` (dims S, D; BLOCK_M, BLOCK_N): a program owns BLOCK_M queries of one head and
  streams K and V over the keys it sees (all S, about half with a causal mask).
- ``grouped_matmul`` (dims M, N, K, E, TOP_K; BLOCK_M/N/K: a mixture-of-experts GEMM as vLLM's
  ``fused_moe_kernel`` runs it): M tokens each routed to TOP_K of E experts; the token-expert
  pairs are grouped by expert and each expert's group padded to a multiple of BLOCK_M. The grid
  is launched for the worst case, and programs past the padded total exit at once, so the
  programs that work are the expected number of BLOCK_M blocks under uniform routing (an
  expert's count is Binomial(M, TOP_K / E)) times the N tiles. Each computes a BLOCK_M x BLOCK_N
  tile over all of K (padded rows included) and loads its gathered token rows and its expert's
  K x BLOCK_N panel; DRAM is the kernel's own fewest bytes (an expert's blocks are neighbours
  in the program order, so its weight panels are read from DRAM about once).
- ``split_kv`` (a PARTITION_SIZE key, decode attention): a program streams one partition of the
  cache; traffic and work are the kernel's totals split evenly over the programs, and the
  longest program streams a whole partition (or the longest context, if shorter: contexts are
  taken as spread evenly between the shape's CTX_MIN and CTX_MAX when it names them).
"""

from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass

from kernaudit_pipeline.core.hardware import GPUSpec, SMResources, canonical_dtype
from kernaudit_pipeline.spill_diagnostics.occupancy import Limiter, theoretical_occupancy
from kernaudit_pipeline.static_resources.describe import KernelDescription
from kernaudit_pipeline.static_resources.results import CompileStatus, StaticResult

ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "tf32": 4, "fp32": 4}


class Family(enum.StrEnum):
    MATMUL = "matmul"
    GROUPED_MATMUL = "grouped_matmul"
    ATTENTION = "attention"
    SPLIT_KV = "split_kv"
    GENERIC = "generic"


@dataclass(frozen=True)
class Features:
    """Everything the model reads for one (config, shape); ``None`` where unknown."""

    kernel_name: str
    shape_name: str
    config_id: str
    config: dict
    family: Family
    dtype: str
    # static audit
    registers_per_thread: int
    spill_bytes: int  # ptxas spill stores per thread (0 when none)
    shared_mem_bytes: int
    threads_per_block: int
    num_warps: int
    num_stages: int
    block_m: int | None
    block_n: int | None
    block_k: int | None
    group_m: int
    # hardware
    sm_count: int
    blocks_per_sm: int
    occupancy_pct: float
    limiter: str
    peak_flops: float  # dense tensor-core FLOP/s for the dtype
    dram_bytes_per_s: float
    l2_bytes: int
    # launch
    programs: int
    programs_per_sm: int  # on the busiest SM: ceil(programs / sm_count)
    waves: float  # programs / (sm_count * blocks_per_sm)
    tail_fraction: float  # share of the last wave's slots left empty
    # work and traffic
    flops: float  # the kernel's useful FLOPs (its own count)
    bytes_moved: float  # the fewest DRAM bytes (its own count)
    flops_per_program: float  # executed, padding included
    load_bytes_per_program: float  # global->shared/register operand loads
    dram_bytes: float  # DRAM traffic estimate after L2 reuse across waves
    stage_bytes: float  # shared memory one pipeline stage holds
    uses_wgmma: bool  # sm_90 warpgroup MMA (tiles of >= 64 rows on whole warpgroups)
    # the most any one program loads: the critical path when work is uneven (causal masks,
    # decode contexts of different lengths)
    max_load_bytes_per_program: float = 0.0
    # ptxas said the wgmmas are serialized / it injected waits on their accumulators
    wgmma_serialized: bool = False
    wgmma_waits_injected: bool = False
    # the hot loop (static_resources.sass_loop): instructions a warp issues per iteration, the
    # local-memory (spill) ops among them, and the iterations a program runs (on average, and
    # in the longest program); 0 where the SASS or the family's trip count is unknown
    loop_instructions: int = 0
    loop_local_ops: int = 0
    loop_trips: float = 0.0
    loop_trips_max: float = 0.0
    # the loop's tile loads (static_resources.ttgir_loads): 128-byte lines touched per byte
    # loaded, 1.0 when every contiguous run fills whole lines (or when unread); 2.0 for a bf16
    # weight read K-major 32 elements (64 bytes) per K step
    line_overfetch: float = 1.0

    @property
    def tile_intensity(self) -> float:
        """FLOPs per byte a program loads: the per-tile arithmetic intensity."""
        return self.flops_per_program / max(self.load_bytes_per_program, 1.0)

    @property
    def shape_intensity(self) -> float:
        """The kernel's own FLOPs per DRAM byte: above the ridge it is compute-bound."""
        return self.flops / max(self.bytes_moved, 1.0)

    @property
    def ridge_intensity(self) -> float:
        return self.peak_flops / self.dram_bytes_per_s

    @property
    def memory_bound(self) -> bool:
        return self.shape_intensity < self.ridge_intensity


def family_of(desc: KernelDescription, shape_dims: dict, config: dict) -> Family:
    if "PARTITION_SIZE" in config:
        return Family.SPLIT_KV
    if {"M", "N", "K"} <= set(shape_dims) and {"BLOCK_M", "BLOCK_N", "BLOCK_K"} <= set(config):
        return Family.GROUPED_MATMUL if {"E", "TOP_K"} <= set(shape_dims) else Family.MATMUL
    if {"S", "D"} <= set(shape_dims) and {"BLOCK_M", "BLOCK_N"} <= set(config):
        return Family.ATTENTION
    return Family.GENERIC


def _matmul_panels(desc: KernelDescription, dtype_bytes: int) -> tuple[float, float]:
    """Bytes per element of the M x K operand(s) and of the K x N operand(s)."""
    terms = desc.bytes_terms
    a = terms.get(("K", "M"), float(dtype_bytes))
    b = terms.get(("K", "N"), float(dtype_bytes))
    return a, b


def _merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _length(intervals: list[tuple[int, int]]) -> int:
    return sum(hi - lo for lo, hi in intervals)


def _overlap(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    return sum(max(0, min(h1, h2) - max(l1, l2)) for l1, h1 in a for l2, h2 in b)


# Waves of a grouped GEMM simulated one by one (see _grouped_dram_bytes).
MAX_SIMULATED_WAVES = 4096


def _grouped_dram_bytes(M: int, N: int, K: int, bm: int, bn: int, group_m: int, slots: int,
                        a_elem: float, b_elem: float, l2_reuse_bytes: float) -> float:
    """DRAM bytes of a grouped-order GEMM, wave by wave: a wave loads the A row-panels and B
    column-panels its programs touch; panels the previous wave touched are still in L2 when
    both waves' panels fit in ``l2_reuse_bytes``. This is what GROUP_M buys (or costs).

    Panels are tracked as intervals of panel indices, so the cost is per wave, not per program.
    Past ``MAX_SIMULATED_WAVES`` waves the mean bytes per program of the waves simulated stand
    for the rest, so a shape of absurd size in someone's module costs seconds, not hours. Every
    committed shape is under the cap (``scripts/rank_validate.py`` reports the same figures
    with it and without it)."""
    num_m, num_n = math.ceil(M / bm), math.ceil(N / bn)
    programs = num_m * num_n
    a_panel, b_panel = min(bm, M) * K * a_elem, min(bn, N) * K * b_elem
    per_group = group_m * num_n
    slots = max(1, slots)
    simulated = min(programs, MAX_SIMULATED_WAVES * slots)
    total = 0.0
    prev_m: list[tuple[int, int]] = []
    prev_n: list[tuple[int, int]] = []
    prev_bytes = 0.0
    for start in range(0, simulated, slots):
        end = min(programs, start + slots)
        ms: list[tuple[int, int]] = []
        ns: list[tuple[int, int]] = []
        pid = start
        while pid < end:  # group by group (a group is GROUP_M tile-rows x all tile-columns)
            group = pid // per_group
            first_m = group * group_m
            size_m = min(num_m - first_m, group_m)
            in_group = pid - group * per_group
            stop = min(end, (group + 1) * per_group)
            count = stop - pid
            ms.append((first_m, first_m + min(size_m, count)))
            ns.append((in_group // size_m, (in_group + count - 1) // size_m + 1))
            pid = stop
        ms, ns = _merge(ms), _merge(ns)
        n_m, n_n = _length(ms), _length(ns)
        wave_bytes = n_m * a_panel + n_n * b_panel
        if prev_bytes + wave_bytes <= l2_reuse_bytes:
            total += (n_m - _overlap(ms, prev_m)) * a_panel + (n_n - _overlap(ns, prev_n)) * b_panel
        else:
            total += wave_bytes
        prev_m, prev_n, prev_bytes = ms, ns, wave_bytes
    return total if simulated == programs else total * programs / simulated


@functools.lru_cache(maxsize=4096)
def expected_expert_blocks(tokens: int, experts: int, top_k: int, block_m: int) -> float:
    """Expected BLOCK_M blocks of a mixture-of-experts GEMM after padding each expert's pairs
    to a multiple of ``block_m``, under uniform routing: an expert's pair count is
    Binomial(tokens, top_k / experts) (each token picks top_k distinct experts)."""
    if tokens <= 0 or experts <= 0 or block_m <= 0:
        return 0.0
    p = min(max(top_k / experts, 0.0), 1.0)
    if p in (0.0, 1.0):
        return experts * math.ceil(tokens * p / block_m)
    mean, sd = tokens * p, math.sqrt(tokens * p * (1.0 - p))
    if sd >= 4.0 * block_m:
        # The count's residue modulo block_m is then uniform to within exp(-2 pi^2 16) ~ 1e-137:
        # E[ceil(C / b)] = E[C] / b + (b - 1) / (2 b), with no sum over a huge count.
        return experts * (mean / block_m + (block_m - 1) / (2.0 * block_m))
    log_p, log_q = math.log(p), math.log1p(-p)
    lg_n = math.lgamma(tokens + 1)
    blocks = 0.0
    # Counts beyond 40 standard deviations carry less than exp(-800) of the mass.
    for c in range(max(1, int(mean - 40.0 * sd)), min(tokens, int(mean + 40.0 * sd) + 1) + 1):
        pmf = math.exp(lg_n - math.lgamma(c + 1) - math.lgamma(tokens - c + 1) + c * log_p
                       + (tokens - c) * log_q)
        blocks += pmf * math.ceil(c / block_m)
    return experts * blocks


def _longest_partition_bytes(dims: dict, partition: int, moved: float, even: float) -> float:
    """Bytes the longest split-KV program streams: a full partition of the longest context.
    Bytes per token come from the kernel's own count over its total tokens."""
    lo, hi = dims.get("CTX_MIN"), dims.get("CTX_MAX")
    batch = dims.get("B", 1)
    heads = dims.get("KV_H", dims.get("HKV", 1))
    if not lo or not hi or not batch or not heads:
        return even
    tokens = batch * (lo + hi) / 2.0
    per_token_per_head = moved / tokens / heads
    return per_token_per_head * min(partition, hi)


def build(desc: KernelDescription, result: StaticResult, gpu: GPUSpec, sm: SMResources,
          l2_reuse_fraction: float = 0.5) -> Features | None:
    """The features of one compiled (config, shape); None when it cannot launch (or did not
    compile), since then there is nothing to predict."""
    if result.status is not CompileStatus.OK or result.registers_per_thread is None:
        return None
    cfg = dict(result.config)
    shape = desc.shape(result.shape_name)
    pair = desc.pairs.get((result.config_id, shape.name))
    if pair is None or not pair.grid:
        return None
    dims = dict(shape.dims)
    fam = family_of(desc, dims, cfg)
    dtype = canonical_dtype(desc.dtype) or "bf16"
    elem = ELEMENT_BYTES.get(dtype, 2)
    peak = (gpu.peak_tflops_for(dtype) or gpu.peak_tflops_for("bf16") or 1.0) * 1e12
    threads = result.threads_per_block or 32 * int(cfg.get("num_warps", 4))
    smem = result.shared_mem_bytes or 0
    occ = theoretical_occupancy(sm, registers_per_thread=result.registers_per_thread,
                                threads_per_block=threads, shared_mem_bytes=smem)
    if not occ.launchable:
        return None
    programs = math.prod(pair.grid)
    if fam is Family.GROUPED_MATMUL:  # launched for the worst case; the rest exit at once
        blocks = expected_expert_blocks(int(dims["M"]), int(dims["E"]), int(dims["TOP_K"]),
                                        int(cfg["BLOCK_M"]))
        programs = max(1, min(programs, math.ceil(blocks * math.ceil(dims["N"] / cfg["BLOCK_N"]))))
    bps = occ.blocks_per_sm
    slots = gpu.sm_count * bps
    waves = programs / slots
    tail = (math.ceil(waves) - waves) / math.ceil(waves) if programs else 0.0
    flops = desc.flops.get(shape.name) or 0.0
    moved = desc.bytes_moved.get(shape.name) or 0.0
    bm, bn, bk = cfg.get("BLOCK_M"), cfg.get("BLOCK_N"), cfg.get("BLOCK_K")
    stages = int(cfg.get("num_stages", 3))
    warps = int(cfg.get("num_warps", 4))
    group_m = int(cfg.get("GROUP_M", 1))
    dram = moved
    if fam is Family.MATMUL:
        M, N, K = dims["M"], dims["N"], dims["K"]
        a_elem, b_elem = _matmul_panels(desc, elem)
        useful = 2.0 * M * N * K
        per_mnk = flops / useful if useful else 1.0  # 2 for a gate+up pair of products
        flops_p = per_mnk * 2.0 * bm * bn * K
        load_p = bm * K * a_elem + bn * K * b_elem
        dram = _grouped_dram_bytes(M, N, K, bm, bn, max(1, group_m), slots, a_elem, b_elem,
                                   l2_reuse_fraction * gpu.l2_bytes)
        dram += moved - (M * K * a_elem + K * N * b_elem)  # the output and any extras, once
        stage = (bm * a_elem + bn * b_elem) * bk
        max_load = load_p
        trips = trips_max = float(math.ceil(K / bk))
    elif fam is Family.GROUPED_MATMUL:  # ``programs`` counts the ones that work (above)
        K = dims["K"]
        flops_p = 2.0 * bm * bn * K
        load_p = (bm + bn) * K * elem
        stage = (bm + bn) * bk * elem
        max_load = load_p
        trips = trips_max = float(math.ceil(K / bk))
    elif fam is Family.ATTENTION:
        S, D = dims["S"], dims["D"]
        keys = (S + bm) / 2.0 if shape.causal else float(S)
        keys = min(keys, S)
        flops_p = 4.0 * bm * keys * D
        load_p = bm * D * elem + 2.0 * keys * D * elem
        max_load = bm * D * elem + 2.0 * S * D * elem
        stage = 2.0 * bn * D * elem
        trips, trips_max = keys / bn, math.ceil(S / bn)
    else:
        flops_p = flops / programs if programs else 0.0
        load_p = moved / programs if programs else 0.0
        stage = smem / max(stages, 1)
        max_load = load_p
        trips = trips_max = 0.0
        if fam is Family.SPLIT_KV:
            max_load = _longest_partition_bytes(dims, int(cfg["PARTITION_SIZE"]), moved, load_p)
            if cfg.get("BLOCK_N"):  # tokens per iteration; the longest program streams max_load
                trips_max = math.ceil(min(int(cfg["PARTITION_SIZE"]), dims.get("CTX_MAX") or
                                          int(cfg["PARTITION_SIZE"])) / int(cfg["BLOCK_N"]))
                trips = trips_max * load_p / max_load if max_load else 0.0
    uses_wgmma = (float(sm.compute_capability) >= 9.0 and bm is not None and bm >= 64 and warps % 4 == 0)
    return Features(
        kernel_name=desc.name, shape_name=shape.name, config_id=result.config_id, config=cfg,
        family=fam, dtype=dtype,
        registers_per_thread=result.registers_per_thread,
        spill_bytes=int(result.spill_stores_bytes or 0), shared_mem_bytes=smem,
        threads_per_block=threads, num_warps=warps, num_stages=stages,
        block_m=bm, block_n=bn, block_k=bk, group_m=group_m,
        sm_count=gpu.sm_count, blocks_per_sm=bps, occupancy_pct=occ.occupancy_pct,
        limiter=str(occ.limiter.value if isinstance(occ.limiter, Limiter) else occ.limiter),
        peak_flops=peak, dram_bytes_per_s=gpu.mem_bandwidth_bytes_per_s, l2_bytes=gpu.l2_bytes,
        programs=programs, programs_per_sm=math.ceil(programs / gpu.sm_count), waves=waves,
        tail_fraction=tail, flops=flops, bytes_moved=moved, flops_per_program=flops_p,
        load_bytes_per_program=load_p, dram_bytes=max(dram, moved), stage_bytes=stage,
        uses_wgmma=uses_wgmma, max_load_bytes_per_program=max_load,
        wgmma_serialized=bool(result.wgmma_serialized),
        wgmma_waits_injected=bool(result.wgmma_waits_injected),
        loop_instructions=int(result.loop_instructions or 0),
        loop_local_ops=int(result.loop_local_ops or 0),
        loop_trips=float(trips), loop_trips_max=float(trips_max),
        line_overfetch=(result.loop_line_bytes / result.loop_load_bytes
                        if result.loop_load_bytes and result.loop_line_bytes else 1.0),
    )
