"""Deterministic tuning rules: per-config diagnoses, and one short review queue per group.

Per-config diagnoses (:func:`diagnose_row`) read one row (a ``kernel_runs`` row joined with its
comparison and spill diagnosis) and name one concrete fix with a seed-style code. They are what
``kernaudit assess`` prints per item and what the diagnostics table shows per config; they are
not review items. Rule order, first match wins:

1. a config outside physical bounds (a tile that is not a positive power of two, num_warps not
   in {1, 2, 4, 8, 16, 32}) -> reject_invalid_config, never a new config derived from it
2. shared memory over the block limit (or OUT_OF_RESOURCES) -> fewer stages, a smaller
   BLOCK_K, or last a narrower BLOCK_N
3. FAILED -> fix_correctness_before_tuning
4. spill detected -> raise num_warps when the fp32 accumulator alone needs >=
   ACC_REGS_WARPS_THRESHOLD registers per thread and warps can still double (the H200 table:
   128x256 spills at 4 warps, not at 8), and halve the larger tile dim while the accumulator
   stays over budget; otherwise halve the larger tile dim (BLOCK_M on a tie), e.g.
   reduce_tile_size_to_32x64_to_relieve_register_pressure. Attention counts the
   BLOCK_M x HEAD_DIM output tile too; decode attention (no BLOCK_M) the BLOCK_N x HEAD_DIM tile.
5. IMPROVED and clean -> adopt_configuration_for_production_profile
6. occupancy limited by shared memory while registers would allow more blocks per SM ->
   fewer stages, or a smaller BLOCK_K
7. under-filled grid (waves and tail on the device's SM count) -> a smaller tile or split-K
8. invalid or noisy measurement -> remeasure_with_valid_latency_and_baseline
9. NEUTRAL -> keep_baseline_gain_within_noise_band
10. REGRESSION and clean -> keep_baseline_and_retune_tile_configuration

The review queue (:func:`group_queue`) holds at most two items per (kernel, shape, device),
and at most one of them changes the config:

- the group's decision (``ranking.decide``): SHIP_CONFIG adopts the chosen config; KEEP_BASELINE
  and NO_DECISION propose no config and say why (keep the baseline, fix correctness, remeasure);
- for a group that does not ship, one untested fix: the per-config rule applied to the group's
  best config (or, when nothing was timed, to the configs that could not run), only when the
  fix is a config the sweep has not already measured, pruned or failed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd

from kernaudit_pipeline.core.configs import (
    TRITON_DEFAULT_NUM_WARPS, VALID_NUM_WARPS, config_label, is_power_of_two, row_config, row_shape_dims,
)
from kernaudit_pipeline.core.hardware import SM_RESOURCES
from kernaudit_pipeline.core.values import as_int, finite_float, is_missing, plain
from kernaudit_pipeline.core.verdicts import Decision, DecisionKind, Status
from kernaudit_pipeline.recommendations.limits import (
    accumulator_regs_per_thread, device_limits, row_occupancy,
)
from kernaudit_pipeline.recommendations.model import (
    Action, Evidence, Recommendation, Rule, rec_id_for,
)
from kernaudit_pipeline.recommendations.ranking import (
    GroupRanking, config_key, is_timed_ok,
)
from kernaudit_pipeline.spill_diagnostics import spill_detected

MAX_NUM_WARPS_RULE = 8
# 128x256 fp32 accumulator over 4 warps = 256 regs/thread (spills); over 8 = 128 (fits).
ACC_REGS_WARPS_THRESHOLD = 128
# What the accumulator may hold after a fix (128x256 on 8 warps: 220 regs in total, no spill).
ACC_REGS_BUDGET = 128
MIN_TILE_DIM = 16
MIN_BLOCK_K = 16
# Fewer stages than this starve the async copy pipeline; prefer a smaller BLOCK_K first.
MIN_PIPELINE_STAGES = 3
# Below this fraction of the SM slots busy on average over the waves, the grid is under-filled.
WAVE_EFFICIENCY_MIN = 0.80
WAVE_GAIN_MIN = 0.05
SPLIT_K_FACTORS = (2, 4)
MIN_K_ITERATIONS_PER_SPLIT = 4
OUT_OF_SMEM_STATUSES = frozenset({"OUT_OF_RESOURCES", "PRUNED_SMEM"})
TILE_KEYS = ("block_m", "block_n", "block_k", "group_m", "split_k")
MAX_TILE_DIM = 4096
# No block holds more fp32 accumulator values than 255 registers x 1024 threads: a larger
# BLOCK_M x BLOCK_N cannot compile without spilling it all, on any NVIDIA GPU.
MAX_ACCUMULATOR = SM_RESOURCES["9.0"].max_regs_per_thread * SM_RESOURCES["9.0"].max_threads_per_block
ADOPT_CODE = "adopt_configuration_for_production_profile"


def config_problem(cfg: Mapping[str, object]) -> str | None:
    """Why a config is outside physical bounds, or None. Such a config is never recommended."""
    for key in TILE_KEYS:
        if key not in cfg:
            continue
        v = cfg[key]
        if not is_power_of_two(v) or as_int(v) != finite_float(v) or as_int(v) > MAX_TILE_DIM:
            return f"{key}={v} is not a power of two between 1 and {MAX_TILE_DIM}"
    bm, bn = as_int(cfg.get("block_m")), as_int(cfg.get("block_n"))
    if bm and bn and bm * bn > MAX_ACCUMULATOR:
        return (f"a {bm}x{bn} tile's fp32 accumulator ({bm * bn:,} values) exceeds what one block can hold "
                f"in registers ({MAX_ACCUMULATOR:,})")
    if "num_warps" in cfg and as_int(cfg["num_warps"]) not in VALID_NUM_WARPS:
        return f"num_warps={cfg['num_warps']} is not one of {', '.join(map(str, VALID_NUM_WARPS))}"
    if "num_stages" in cfg and not 1 <= (as_int(cfg["num_stages"]) or 0) <= 16:
        return f"num_stages={cfg['num_stages']} is outside 1..16"
    return None


def raw_config_problem(row: Mapping) -> str | None:
    """Like :func:`config_problem`, on the row's raw cells (before rounding to integers)."""
    raw = {}
    for key in (*TILE_KEYS, "num_warps", "num_stages"):
        value = row.get(key)
        if is_missing(value):
            continue
        f = finite_float(value)
        if f is None:
            return f"{key}={value!r} is not a number"
        raw[key] = f
    return config_problem(raw)




# ---------------------------------------------------------------------------------------------
# One config's diagnosis
# ---------------------------------------------------------------------------------------------
def _text(value: object) -> str | None:
    return None if is_missing(value) else str(value)


def row_evidence(row: Mapping) -> list[Evidence]:
    evidence: list[Evidence] = []
    speedup = finite_float(row.get("speedup"))
    if speedup is not None:
        evidence.append(Evidence("speedup", round(speedup, 4), 1.0, "comparisons"))
    for col in ("spill_stores_bytes", "spill_loads_bytes", "registers_per_thread", "local_spill_requests"):
        value = plain(row.get(col))
        if value is not None:
            evidence.append(Evidence(col, value, 0 if "spill" in col else SM_RESOURCES["9.0"].max_regs_per_thread,
                                      "kernel_runs"))
    return evidence


def diagnose_row(row: Mapping) -> Recommendation:
    """One config's diagnosis: the seed's per-item contract (``kernaudit assess``)."""
    get = row.get
    status = str(get("status"))
    cfg = row_config(row)
    flagged = plain(get("spill_detected"))
    spill = bool(flagged) if flagged is not None else spill_detected(row)
    speedup = finite_float(get("speedup"))
    evidence = row_evidence(row)
    limits = device_limits(get("device_name"), get("compute_capability"))
    expected = ""
    problem = raw_config_problem(row)
    if problem is not None:
        action, new, code, rule = Action.REMEASURE, None, "reject_invalid_config", Rule.REMEASURE
        rationale, confidence = f"the config is outside physical bounds: {problem}; nothing is derived from it", 0.9
        expected = "a valid config and a new measurement"
    elif (overflow := smem_overflow_fix(row)) is not None:
        action, new, code, rationale, confidence = overflow
        rule = Rule.SMEM_OVERFLOW
        evidence.append(Evidence("shared_mem_bytes", _estimated_smem_bytes(row), limits.smem_per_block_max_bytes,
                                 "kernel_runs" if as_int(get("shared_mem_bytes")) is not None else "estimate"))
        expected = "the config launches (today it fails with OUT_OF_RESOURCES)"
    elif status == Status.FAILED:
        action, new, code, rule = Action.FIX_CORRECTNESS, None, "fix_correctness_before_tuning", Rule.FAILED
        rationale, confidence = f"incorrect or failed run: {get('status_reason')}", 0.9
        expected = "a correct kernel; its speed is meaningless until then"
    elif spill:
        action, new, code, rationale, confidence = spill_fix(row)
        rule = Rule.REGISTER_SPILL
        expected = "no spill stores/loads; fewer lg_throttle and long_scoreboard stalls; lower latency"
    elif status == Status.IMPROVED:
        action, new, code, rule = Action.ADOPT, cfg, ADOPT_CODE, Rule.ADOPT
        rationale, confidence = f"faster than the baseline and no spills: {get('status_reason')}", 0.8
        expected = f"{(float(speedup) - 1) * 100:.1f}% lower latency than the baseline"
    elif (occ := smem_occupancy_fix(row)) is not None:
        action, new, code, rationale, confidence = occ
        rule = Rule.SMEM_OCCUPANCY
        view = row_occupancy(row)
        evidence.append(Evidence("blocks_per_sm_by_shared_mem", view.blocks_by_shared_mem,
                                 view.blocks_by_registers, "occupancy"))
        evidence.append(Evidence("shared_mem_bytes", as_int(get("shared_mem_bytes")), None, "kernel_runs"))
        expected = "one more resident block per SM to hide memory latency"
    elif (grid := grid_fill_fix(row)) is not None:
        action, new, code, rationale, confidence = grid
        rule = Rule.GRID_FILL
        view = row_occupancy(row)
        slots = limits.sm_count * (max(1, view.blocks_per_sm) if view else 1)
        _waves, eff = wave_efficiency(as_int(get("grid_size")), slots)
        evidence.append(Evidence("grid_size", as_int(get("grid_size")), slots, "kernel_runs"))
        evidence.append(Evidence("wave_efficiency", round(eff, 4), WAVE_EFFICIENCY_MIN, "model"))
        expected = "fewer idle SMs in the last wave; lower latency if the kernel is not memory-bound"
    elif status in (Status.INCONCLUSIVE, Status.NOISY, Status.PRUNED_SPILL, Status.OUT_OF_RESOURCES, Status.NOT_RUN):
        action, new, code, rule = Action.REMEASURE, None, "remeasure_with_valid_latency_and_baseline", Rule.REMEASURE
        rationale, confidence = f"no verdict possible: {get('status_reason')}", 0.8
        expected = "a valid latency and baseline, or more samples, to decide"
    elif status == Status.NEUTRAL:
        action, new, code, rule = Action.KEEP_BASELINE, None, "keep_baseline_gain_within_noise_band", Rule.NEUTRAL
        rationale, confidence = f"{get('status_reason')}; a custom kernel must earn its maintenance", 0.6
        expected = "no change"
    else:
        action, new, rule = Action.KEEP_BASELINE, None, Rule.CLEAN_REGRESSION
        code = "keep_baseline_and_retune_tile_configuration"
        rationale, confidence = f"clean but slower: {get('status_reason')}", 0.7
        expected = "baseline latency; retune tiles before shipping this kernel"
    if new is not None and action != Action.ADOPT and config_problem(new) is not None:
        # a rule never hands out a config outside physical bounds
        action, new, code, rule = Action.REMEASURE, None, "reject_invalid_config", Rule.REMEASURE
        rationale = f"the fix would leave physical bounds ({config_problem(new)}); {rationale}"
    kernel, shape, device = str(get("kernel_name")), _text(get("shape_name")), _text(get("device_name"))
    return Recommendation(
        rec_id=rec_id_for(kernel, shape, device, cfg, code, new), kernel_name=kernel, shape_name=shape,
        device_name=device, current_config=cfg, action=action, new_config=new, code=code, rationale=rationale,
        evidence=tuple(evidence), expected_effect=expected, confidence=confidence, rule=rule,
        shape_dims=row_shape_dims(row), dtype=_text(get("dtype")),
    )


DIAGNOSIS_COLUMNS = ("kernel_name", "shape_name", "device_name", "config_id", "diagnosis", "diagnosis_rule",
                     "diagnosis_config", "diagnosis_detail")


def diagnoses(frame: pd.DataFrame) -> pd.DataFrame:
    """Each candidate row's diagnosis, for the diagnostics table (not the review queue)."""
    out = []
    for _, row in frame.iterrows():
        rec = diagnose_row(row)
        out.append({"kernel_name": rec.kernel_name, "shape_name": rec.shape_name, "device_name": rec.device_name,
                    "config_id": config_key(row), "diagnosis": rec.code, "diagnosis_rule": str(rec.rule),
                    "diagnosis_config": None if not rec.new_config else config_label(rec.new_config),
                    "diagnosis_detail": rec.rationale})
    return pd.DataFrame(out, columns=list(DIAGNOSIS_COLUMNS))


# ---------------------------------------------------------------------------------------------
# The review queue: one decision item per group, and at most one config change
# ---------------------------------------------------------------------------------------------
def _no_decision_item(d: Decision) -> tuple[Action, str, str]:
    reason = d.reason
    if reason.startswith("nothing correct"):
        return Action.FIX_CORRECTNESS, "fix_correctness_before_tuning", "a correct kernel, then a new sweep"
    if reason.startswith("nothing timed"):
        return Action.REMEASURE, "remeasure_no_config_timed_correctly", "at least one config timed correctly"
    if reason.startswith("no baseline") or reason.startswith("no candidate"):
        return (Action.REMEASURE, "remeasure_with_valid_latency_and_baseline",
                "a baseline timed with the candidates, to decide")
    return (Action.REMEASURE, "remeasure_paired_gain_within_noise_band",
            "a paired measurement (candidate and baseline interleaved) tight enough to decide")


def decision_item(g: GroupRanking, d: Decision) -> Recommendation:
    """The group's decision as one review item."""
    kernel, shape, device = g.key
    c = g.chosen
    evidence = [Evidence("speedup", round(d.speedup, 4), 1.0, "ranking")] if d.speedup is not None else []
    if d.speedup_ci_low is not None and d.speedup_ci_high is not None:
        evidence += [Evidence("speedup_ci_low", round(d.speedup_ci_low, 4), None, "ranking"),
                     Evidence("speedup_ci_high", round(d.speedup_ci_high, 4), None, "ranking")]
    for col in ("registers_per_thread", "spill_stores_bytes", "stack_frame_bytes", "shared_mem_bytes"):
        if d.evidence.get(col) is not None:
            evidence.append(Evidence(col, d.evidence[col], None, "kernel_runs"))
    new = None
    current: dict = {}
    if d.decision == DecisionKind.SHIP_CONFIG:
        action, rule, code, confidence = Action.ADOPT, Rule.SHIP_CONFIG, ADOPT_CODE, 0.8
        new = dict(c.config)
        expected = (f"{(d.speedup - 1) * 100:.1f}% lower latency than {g.baseline_name or 'the baseline'} "
                    f"on {shape or 'this shape'}")
    elif d.decision == DecisionKind.KEEP_BASELINE:
        action, rule, code, confidence = Action.KEEP_BASELINE, Rule.KEEP_BASELINE, "keep_baseline_best_config_slower", 0.8
        current = dict(c.config)
        expected = f"{g.baseline_name or 'the baseline'} stays; retune the kernel before it competes here"
    else:
        action, code, expected = _no_decision_item(d)
        rule, confidence = Rule.NO_DECISION, 0.6
        current = {} if c is None else dict(c.config)
    return Recommendation(
        rec_id=rec_id_for(kernel, shape, device, current, code, new), kernel_name=kernel, shape_name=shape,
        device_name=device, current_config=current, action=action, new_config=new, code=code,
        rationale=d.reason, evidence=tuple(evidence), expected_effect=expected, confidence=confidence, rule=rule,
        shape_dims=dict(g.shape_dims), decision=d.decision, data_kind=g.data_kind, dtype=g.dtype,
        new_config_id=None if new is None else c.config_id,
    )


def _same(a: Mapping, b: Mapping) -> bool:
    """Same config on every key both name (a proposal names only the keys it changes)."""
    shared = set(a) & set(b)
    return bool(shared) and all(a[k] == b[k] for k in shared)


def _fix_for(row: Mapping) -> tuple[tuple, Rule] | None:
    if raw_config_problem(row) is not None:
        return None
    for fn, rule in ((smem_overflow_fix, Rule.SMEM_OVERFLOW), (_spill_if, Rule.REGISTER_SPILL),
                     (smem_occupancy_fix, Rule.SMEM_OCCUPANCY), (grid_fill_fix, Rule.GRID_FILL)):
        found = fn(row)
        if found is not None and found[1]:
            return found, rule
    return None


def _spill_if(row: Mapping):
    flagged = plain(row.get("spill_detected"))
    spilling = bool(flagged) if flagged is not None else spill_detected(row)
    return spill_fix(row) if spilling else None


def untested_fix(g: GroupRanking, rows: pd.DataFrame, d: Decision) -> Recommendation | None:
    """At most one config the sweep has not tried, derived by the per-config rules.

    From the group's chosen config when one was timed, else from the configs that could not
    run. A fix the sweep already measured (it lost), pruned or failed is not proposed again.
    """
    records = [r for _, r in rows.iterrows()]
    known = [row_config(r) for r in records]
    if g.chosen is not None:
        basis = [r for r in records if is_timed_ok(r) and config_key(r) == g.chosen.config_id][:1]
    else:
        basis = sorted((r for r in records if not is_timed_ok(r) and str(r.get("status")) != Status.FAILED),
                       key=lambda r: (finite_float(r.get("spill_stores_bytes")) or 0.0,
                                      finite_float(r.get("shared_mem_bytes")) or 0.0, config_key(r)))
    for row in basis:
        found = _fix_for(row)
        if found is None:
            continue
        (action, new, code, rationale, confidence), rule = found
        if config_problem(new) is not None or any(_same(new, k) and set(new) <= set(k) for k in known):
            continue
        cfg = row_config(row)
        kernel, shape, device = g.key
        return Recommendation(
            rec_id=rec_id_for(kernel, shape, device, cfg, code, new), kernel_name=kernel, shape_name=shape,
            device_name=device, current_config=cfg, action=action, new_config=new, code=code,
            rationale=(f"{rationale}. Not measured in this sweep: time it before it can ship "
                       f"(the group's decision is {d.decision})"),
            evidence=tuple(row_evidence(row)), expected_effect="a faster config than the sweep's best, if measured",
            confidence=min(confidence, 0.5), rule=rule, shape_dims=dict(g.shape_dims), decision=d.decision,
            data_kind=g.data_kind, dtype=g.dtype,
        )
    return None


def group_queue(g: GroupRanking, d: Decision, rows: pd.DataFrame) -> list[Recommendation]:
    """The review items of one group: its decision, and for a group that does not ship at most
    one untested config change."""
    items = [decision_item(g, d)]
    if d.decision != DecisionKind.SHIP_CONFIG:
        fix = untested_fix(g, rows, d)
        if fix is not None:
            items.append(fix)
    return items


# ---------------------------------------------------------------------------------------------
# Rule bodies (estimates; the verifier's recompile checks them)
# ---------------------------------------------------------------------------------------------
RuleResult = tuple[Action, dict | None, str, str, float]


def spill_fix(row: Mapping) -> RuleResult:
    """Pick between more warps and a smaller tile from the accumulator's share."""
    cfg = row_config(row)
    bm, bn = as_int(row.get("block_m")), as_int(row.get("block_n"))
    warps = as_int(row.get("num_warps")) or TRITON_DEFAULT_NUM_WARPS
    head_dim = as_int(row.get("head_dim"))
    if bm is None and bn is not None and head_dim:
        return _decode_spill_fix(cfg, bn, warps, head_dim)
    if bm is None or bn is None:
        new = dict(cfg, num_stages=max(1, (as_int(row.get("num_stages")) or 2) - 1))
        return (Action.REDUCE_STAGES, new, f"reduce_num_stages_to_{new['num_stages']}_to_relieve_register_pressure",
                "tile dims unknown; fewer pipeline stages hold fewer live registers", 0.4)
    acc = accumulator_regs_per_thread(bm, bn, warps, head_dim)
    if acc >= ACC_REGS_WARPS_THRESHOLD:
        nw = warps
        while accumulator_regs_per_thread(bm, bn, nw, head_dim) > ACC_REGS_BUDGET and nw * 2 <= MAX_NUM_WARPS_RULE:
            nw *= 2
        nbm, nbn = bm, bn
        while accumulator_regs_per_thread(nbm, nbn, nw, head_dim) > ACC_REGS_BUDGET:
            if nbm >= nbn and nbm // 2 >= MIN_TILE_DIM:
                nbm //= 2
            elif nbn // 2 >= MIN_TILE_DIM:
                nbn //= 2
            else:
                break
        after = accumulator_regs_per_thread(nbm, nbn, nw, head_dim)
        what = "O and score tiles alone need" if head_dim else "fp32 accumulator alone needs"
        if (nbm, nbn) == (bm, bn) and nw != warps:
            new = dict(cfg, num_warps=nw)
            return (Action.INCREASE_WARPS, new, f"increase_num_warps_to_{nw}_to_relieve_register_pressure",
                    f"the {bm}x{bn} {what} {acc:.0f} registers/thread at {warps} warps; "
                    f"{nw} warps cut that to {after:.0f} while keeping the tile's data reuse", 0.7)
        if (nbm, nbn) != (bm, bn):
            new = dict(cfg, block_m=nbm, block_n=nbn, num_warps=nw)
            with_warps = f"_with_{nw}_warps" if nw != warps else ""
            return (Action.SHRINK_TILE, new,
                    f"reduce_tile_size_to_{nbm}x{nbn}{with_warps}_to_relieve_register_pressure",
                    f"the {bm}x{bn} {what} {acc:.0f} registers/thread at {warps} warps; "
                    + (f"{nw} warps are the most this rule uses, so " if nw != warps or warps * 2 > MAX_NUM_WARPS_RULE
                       else "")
                    + f"{nbm}x{nbn} on {nw} warps brings it to {after:.0f}", 0.65)
    if bm >= bn and bm // 2 >= MIN_TILE_DIM:
        nbm, nbn = bm // 2, bn
    elif bn // 2 >= MIN_TILE_DIM:
        nbm, nbn = bm, bn // 2
    else:
        nbm, nbn = bm, bn
    new = dict(cfg, block_m=nbm, block_n=nbn)
    return (Action.SHRINK_TILE, new, f"reduce_tile_size_to_{nbm}x{nbn}_to_relieve_register_pressure",
            f"the accumulator is only {acc:.0f} registers/thread, so the pressure comes from operands and "
            f"pipelining: halving the larger tile dim ({bm}x{bn} -> {nbm}x{nbn}) halves the live tile", 0.6)


def _decode_spill_fix(cfg: dict, bn: int, warps: int, head_dim: int) -> RuleResult:
    """Decode attention (no BLOCK_M): each program streams BLOCK_N keys of HEAD_DIM; the
    BLOCK_N x HEAD_DIM tile per thread plays the accumulator's part."""
    tile = accumulator_regs_per_thread(bn, head_dim, warps)
    nw, nbn = warps, bn
    while accumulator_regs_per_thread(nbn, head_dim, nw) > ACC_REGS_BUDGET and nw * 2 <= MAX_NUM_WARPS_RULE:
        nw *= 2
    while accumulator_regs_per_thread(nbn, head_dim, nw) > ACC_REGS_BUDGET and nbn // 2 >= MIN_TILE_DIM:
        nbn //= 2
    if (nw, nbn) == (warps, bn):  # already within budget: halve the K/V block anyway
        nbn = max(MIN_TILE_DIM, bn // 2)
    after = accumulator_regs_per_thread(nbn, head_dim, nw)
    new = dict(cfg, block_n=nbn, num_warps=nw)
    if nbn == bn:
        code = f"increase_num_warps_to_{nw}_to_relieve_register_pressure"
        action = Action.INCREASE_WARPS
    else:
        code = (f"reduce_block_n_to_{nbn}" + (f"_with_{nw}_warps" if nw != warps else "")
                + "_to_relieve_register_pressure")
        action = Action.SHRINK_TILE
    return (action, new, code,
            f"the {bn}x{head_dim} K/V tile is {tile:.0f} values per thread on {warps} warp(s); "
            f"BLOCK_N={nbn} on {nw} warp(s) makes it {after:.0f}", 0.5)


def _estimated_smem_bytes(row: Mapping) -> int | None:
    """The row's shared memory, or the GEMM pipeline estimate stages*(BM+BN)*BK*elem."""
    smem = as_int(row.get("shared_mem_bytes"))
    if smem is not None:
        return smem
    bm, bn, bk, st = (as_int(row.get(c)) for c in ("block_m", "block_n", "block_k", "num_stages"))
    if None in (bm, bn, bk, st):
        return None
    elem = {"fp8": 1, "fp32": 4, "tf32": 4}.get(str(row.get("dtype") or "")[:4].rstrip("e"), 2)
    return st * (bm + bn) * bk * elem


def _smem_shrink(cfg: dict, smem: int, target_bytes: int) -> tuple[Action, dict, int] | None:
    """Fewest-change config whose estimated shared memory is at most target_bytes.

    Shared memory is dominated by the pipelined operand buffers, proportional to
    num_stages and to BLOCK_K. Stages go first while at least MIN_PIPELINE_STAGES
    remain; then BLOCK_K halves; then stages go down to 2; last, the largest
    streamed tile dim halves (BLOCK_N, the K/V block of attention kernels).
    """
    stages, bk = cfg.get("num_stages"), cfg.get("block_k")
    if not stages:
        return _tile_halving(cfg, smem, target_bytes)
    per_stage = smem / stages
    for s in range(stages - 1, MIN_PIPELINE_STAGES - 1, -1):
        if per_stage * s <= target_bytes:
            return Action.REDUCE_STAGES, dict(cfg, num_stages=s), int(per_stage * s)
    if bk:
        nbk = bk
        while nbk // 2 >= MIN_BLOCK_K:
            nbk //= 2
            if smem * nbk / bk <= target_bytes:
                return Action.REDUCE_BLOCK_K, dict(cfg, block_k=nbk), int(smem * nbk / bk)
    for s in range(min(stages - 1, MIN_PIPELINE_STAGES - 1), 1, -1):
        if per_stage * s <= target_bytes:
            return Action.REDUCE_STAGES, dict(cfg, num_stages=s), int(per_stage * s)
    return _tile_halving(cfg, smem, target_bytes)


def _tile_halving(cfg: dict, smem: int, target_bytes: int) -> tuple[Action, dict, int] | None:
    bm, bn, bk = cfg.get("block_m"), cfg.get("block_n"), cfg.get("block_k")
    nbn = bn
    while nbn and nbn // 2 >= MIN_TILE_DIM:
        nbn //= 2
        # GEMM operand buffers scale with (BM + BN); attention K/V buffers with BN alone
        est = smem * (bm + nbn) / (bm + bn) if bm and bk else smem * nbn / bn
        if est <= target_bytes:
            return Action.SHRINK_TILE, dict(cfg, block_n=nbn), int(est)
    return None


def _smem_fix_code(action: Action, new: dict, purpose: str) -> str:
    what = {Action.REDUCE_STAGES: f"num_stages_to_{new.get('num_stages')}",
            Action.REDUCE_BLOCK_K: f"block_k_to_{new.get('block_k')}"}.get(action, f"block_n_to_{new.get('block_n')}")
    return f"reduce_{what}_to_{purpose}"


def smem_overflow_fix(row: Mapping) -> RuleResult | None:
    limits = device_limits(row.get("device_name"), row.get("compute_capability"))
    smem = _estimated_smem_bytes(row)
    status = None if is_missing(row.get("run_status")) else str(row.get("run_status"))
    if smem is None:
        return None
    if smem <= limits.smem_per_block_max_bytes and status not in OUT_OF_SMEM_STATUSES:
        return None
    if smem <= limits.smem_per_block_max_bytes:
        return None  # out of resources for another reason (registers, threads): not this rule
    found = _smem_shrink(row_config(row), smem, limits.smem_per_block_max_bytes)
    if found is None:
        return None
    action, new, est = found
    return (action, new, _smem_fix_code(action, new, "fit_shared_memory"),
            f"needs {smem:,} B of shared memory per block, over the {limits.smem_per_block_max_bytes:,} B "
            f"opt-in limit of {limits.arch}; the launch fails. {config_label(new)} needs about {est:,} B", 0.8)


def smem_occupancy_fix(row: Mapping) -> RuleResult | None:
    view = row_occupancy(row)
    smem = as_int(row.get("shared_mem_bytes"))
    if view is None or smem is None or view.limiter != "shared_mem":
        return None
    flagged = row.get("smem_limited")
    if plain(flagged) is not None and not bool(flagged):
        return None  # the SRAM diagnosis says shared memory does not bind
    if view.blocks_by_registers <= view.blocks_by_shared_mem:
        return None  # registers (or warps) would cap occupancy anyway: less SRAM buys nothing
    limits = device_limits(row.get("device_name"), row.get("compute_capability"))
    want = view.blocks_by_shared_mem + 1
    target = limits.smem_per_sm_bytes // want - limits.smem_reserved_per_block_bytes
    found = _smem_shrink(row_config(row), smem, target)
    if found is None:
        return None
    action, new, est = found
    return (action, new, _smem_fix_code(action, new, "raise_occupancy"),
            f"shared memory ({smem:,} B/block) limits occupancy to {view.blocks_by_shared_mem} block(s)/SM "
            f"while registers would allow {view.blocks_by_registers}; {config_label(new)} needs about "
            f"{est:,} B, room for {want}", 0.5)


def wave_efficiency(grid_size: int, slots: int) -> tuple[float, float]:
    """(waves, efficiency): efficiency = average busy fraction of the SM slots over the waves."""
    waves = grid_size / slots
    return waves, waves / math.ceil(waves)


def grid_fill_fix(row: Mapping) -> RuleResult | None:
    grid = as_int(row.get("grid_size"))
    if grid is None or grid <= 0:
        return None
    limits = device_limits(row.get("device_name"), row.get("compute_capability"))
    if limits.sm_count is None:
        return None  # an unknown device's SM count is unknown: no wave arithmetic
    view = row_occupancy(row)
    per_sm = max(1, view.blocks_per_sm) if view else 1
    slots = limits.sm_count * per_sm
    waves, eff = wave_efficiency(grid, slots)
    if eff >= WAVE_EFFICIENCY_MIN:
        return None
    cfg = row_config(row)
    bm, bn, bk = cfg.get("block_m"), cfg.get("block_n"), cfg.get("block_k")
    m, n, k = (as_int(row.get(c)) for c in ("m", "n", "k"))
    split = cfg.get("split_k", 1)
    candidates: list[tuple[float, int, Action, dict]] = []
    for dim in ("block_m", "block_n"):
        cur = cfg.get(dim)
        if not cur or cur // 2 < MIN_TILE_DIM:
            continue
        new = dict(cfg, **{dim: cur // 2})
        if bm and bn and m and n:
            new_grid = math.ceil(m / new["block_m"]) * math.ceil(n / new["block_n"]) * split
        else:
            new_grid = grid * 2
        if new_grid == grid:
            continue
        candidates.append((wave_efficiency(new_grid, slots)[1], 0, Action.SHRINK_TILE, new))
    if k and bk:
        for s in SPLIT_K_FACTORS:
            if k / (bk * split * s) < MIN_K_ITERATIONS_PER_SPLIT:
                continue
            candidates.append((wave_efficiency(grid * s, slots)[1], 1, Action.SPLIT_K, dict(cfg, split_k=split * s)))
    if not candidates:
        return None
    best_eff, _, action, new = max(candidates, key=lambda c: (round(c[0], 3), -c[1]))
    if best_eff < eff + WAVE_GAIN_MIN:
        return None
    sms = limits.sm_count
    if action == Action.SPLIT_K:
        code = f"split_k_by_{new['split_k']}_to_fill_{sms}_sms"
        how = f"splitting K {new['split_k']} ways"
    else:
        code = f"reduce_tile_size_to_{new.get('block_m')}x{new.get('block_n')}_to_fill_{sms}_sms"
        how = f"a {new.get('block_m')}x{new.get('block_n')} tile"
    return (action, new, code,
            f"a grid of {grid} blocks on {sms} SMs x {per_sm} block(s)/SM is {waves:.2f} waves: the SMs are "
            f"busy {eff:.0%} of the time on average; {how} raises that to {best_eff:.0%}", 0.45)


# ---------------------------------------------------------------------------------------------
# Group context: the measured ranking of a (kernel, shape, device)
# ---------------------------------------------------------------------------------------------
