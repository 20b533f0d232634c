"""Block-size heuristics per kernel, learned from the sweep and checked against it.

The seed asks for "block size heuristics". Three kinds are learned, each only where every row
that speaks to it agrees:

- warps for a tile: a BLOCK_M x BLOCK_N tile (x HEAD_DIM for attention) that spills at every
  config with W warps and at none with W' > W: "128x256 tiles spill at 4 warps; use 8". A tile
  that spills at every warp count tried says "use a smaller tile".
- stages for a tile: a BLOCK_M x BLOCK_N x BLOCK_K tile that cannot launch (shared memory) at
  S stages while every config at S' < S ran: "... do not fit at 4 stages; use at most 3".
- a config for a shape regime: the config that is chosen, or within the noise band of the
  chosen one, in the most measured groups of a kernel, for small M (at most 64 rows, decode)
  and large M separately, or for all shapes of a kernel without an M.

Verification says what the measurements add: a warps heuristic is VERIFIED when the sweep timed
the recommended warps faster wherever both were timed (or the spilling ones were pruned and the
recommended ones ran correctly), REFUTED when the spilling warps measured faster where both ran.
A stages heuristic rests on the launches themselves. A regime heuristic is VERIFIED when the
config is within the noise band of the chosen config in every group of the regime.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

import pandas as pd

from kernaudit_pipeline.comparisons import DEFAULT_NOISE_BAND, data_kind_of
from kernaudit_pipeline.core.configs import config_label
from kernaudit_pipeline.core.values import as_int, finite_float, is_missing
from kernaudit_pipeline.core.verdicts import DataKind, RunStatus
from kernaudit_pipeline.recommendations.model import Heuristic, HeuristicKind, VerificationState
from kernaudit_pipeline.recommendations.ranking import Candidate, GroupKey, GroupRanking, is_timed_ok, tied_with

V = VerificationState
SMALL_M = 64  # at most this many rows per GEMM: the decode regime
OOR = frozenset({RunStatus.OUT_OF_RESOURCES, RunStatus.PRUNED_SMEM})


def _spill_state(row: Mapping) -> bool | None:
    """True: spills (or was pruned for spilling); False: compiled clean; None: unknown."""
    if str(row.get("run_status")) == RunStatus.PRUNED_SPILL:
        return True
    values = [finite_float(row.get(c)) for c in ("spill_stores_bytes", "stack_frame_bytes")]
    known = [v for v in values if v is not None]
    if not known:
        return None
    return any(v > 0 for v in known)


def _tile(row: Mapping) -> tuple[tuple[str, int], ...] | None:
    keys = ("block_m", "block_n", "head_dim") if as_int(row.get("block_m")) else ("block_n", "head_dim")
    tile = tuple((k, as_int(row.get(k))) for k in keys if as_int(row.get(k)) is not None)
    return tile if any(k.startswith("block") for k, _ in tile) else None


def _tile_text(tile: tuple[tuple[str, int], ...]) -> str:
    d = dict(tile)
    dims = "x".join(str(d[k]) for k in ("block_m", "block_n", "block_k") if k in d)
    if "block_m" not in d and "block_n" in d:
        dims = f"BLOCK_N={d['block_n']}"
    return dims + (f" (head_dim {d['head_dim']})" if "head_dim" in d else "")


def _kind(rows: list[Mapping]) -> DataKind:
    kinds = {data_kind_of(r) for r in rows}
    for k in (DataKind.PREDICTED, DataKind.MODELLED):
        if k in kinds:
            return k
    return DataKind.MEASURED


def _by_kernel(frame: pd.DataFrame) -> dict[tuple[str, str | None], list[Mapping]]:
    out: dict[tuple[str, str | None], list[Mapping]] = defaultdict(list)
    for _, row in frame.iterrows():
        device = row.get("device_name")
        out[(str(row.get("kernel_name")), None if is_missing(device) else str(device))].append(row)
    return out


def _measured_warps(rankings: Mapping[GroupKey, GroupRanking], kernel: str, device: str | None,
                    tile: tuple, bad: int, good: int) -> tuple[int, int]:
    """(groups where the good warps measured faster, groups where the bad ones did)."""
    wins = losses = 0
    want = dict(tile)
    for key, g in rankings.items():
        if key[0] != kernel or key[2] != device:
            continue
        def best(warps: int) -> Candidate | None:
            found = [c for c in g.candidates if c.config.get("num_warps") == warps
                     and all(c.config.get(k) == v for k, v in want.items() if k != "head_dim")
                     and ("head_dim" not in want or g.shape_dims.get("D") == want["head_dim"])]
            return found[0] if found else None
        b, w = best(bad), best(good)
        if b is None or w is None:
            continue
        faster = (w.speedup or 0) > (b.speedup or 0) if w.speedup and b.speedup else w.latency_us < b.latency_us
        wins += faster
        losses += not faster
    return wins, losses


def warps_for_tile(frame: pd.DataFrame, rankings: Mapping[GroupKey, GroupRanking]) -> list[Heuristic]:
    out: list[Heuristic] = []
    for (kernel, device), rows in _by_kernel(frame).items():
        counts: dict[tuple, dict[int, list[bool]]] = defaultdict(lambda: defaultdict(list))
        timed_ok: dict[tuple, set[int]] = defaultdict(set)
        for row in rows:
            tile, warps, state = _tile(row), as_int(row.get("num_warps")), _spill_state(row)
            if tile is None or warps is None or state is None:
                continue
            counts[tile][warps].append(state)
            if is_timed_ok(row):
                timed_ok[tile].add(warps)
        for tile, by_warps in sorted(counts.items()):
            spilling = sorted(w for w, s in by_warps.items() if all(s))
            clean = sorted(w for w, s in by_warps.items() if not any(s))
            if not spilling:
                continue
            tile_rows = [r for r in rows if _tile(r) == tile]
            bad = spilling[-1]
            good = next((w for w in clean if w > bad), None)
            if good is None:
                if clean:
                    continue  # clean only at fewer warps: not a warps story
                tried = ", ".join(map(str, sorted(by_warps)))
                n = sum(len(v) for v in by_warps.values())
                out.append(Heuristic(
                    kernel, device, HeuristicKind.WARPS_FOR_TILE,
                    f"{_tile_text(tile)} tiles spill at every warp count tried ({tried}); use a smaller tile",
                    when=dict(tile), avoid={"num_warps": sorted(by_warps)}, use={}, support=n,
                    verification=V.VERIFIED, note=f"all {n} compiles of this tile spill", data_kind=_kind(tile_rows)))
                continue
            n_bad, n_good = len(by_warps[bad]), len(by_warps[good])
            wins, losses = _measured_warps(rankings, kernel, device, tile, bad, good)
            if losses > wins:
                state, note = V.REFUTED, f"yet {bad} warps measured faster in {losses} of {wins + losses} shape(s)"
            elif wins:
                state, note = V.VERIFIED, f"{good} warps measured faster in {wins} of {wins + losses} shape(s)"
            elif good in timed_ok[tile]:
                state, note = V.VERIFIED, f"the {bad}-warp configs were not timed; {good} warps ran correctly"
            else:
                state, note = V.UNVERIFIED, f"{good} warps were not timed correctly in the sweep"
            out.append(Heuristic(
                kernel, device, HeuristicKind.WARPS_FOR_TILE,
                f"{_tile_text(tile)} tiles spill at {bad} warps; use {good}",
                when=dict(tile), avoid={"num_warps": bad}, use={"num_warps": good}, support=n_bad + n_good,
                verification=state,
                note=f"{n_bad} config(s) at {bad} warps spill, {n_good} at {good} do not; {note}",
                data_kind=_kind(tile_rows)))
    return out


def stages_for_tile(frame: pd.DataFrame) -> list[Heuristic]:
    out: list[Heuristic] = []
    for (kernel, device), rows in _by_kernel(frame).items():
        by_tile: dict[tuple, dict[int, list[bool]]] = defaultdict(lambda: defaultdict(list))
        for row in rows:
            stages = as_int(row.get("num_stages"))
            base = _tile(row)
            if stages is None or base is None:
                continue
            tile = tuple(sorted({**dict(base), **({"block_k": as_int(row.get("block_k"))}
                                                  if as_int(row.get("block_k")) else {})}.items()))
            status = str(row.get("run_status"))
            if status in OOR:
                by_tile[tile][stages].append(False)
            elif is_timed_ok(row):
                by_tile[tile][stages].append(True)
        for tile, by_stages in sorted(by_tile.items()):
            failing = sorted(s for s, ok in by_stages.items() if not any(ok))
            fitting = sorted(s for s, ok in by_stages.items() if all(ok))
            if not failing:
                continue
            first_bad = failing[0]
            below = [s for s in fitting if s < first_bad]
            if any(s > first_bad for s in fitting):
                continue  # fits again at more stages: shared memory is not the story
            n = sum(len(v) for v in by_stages.values())
            tile_rows = [r for r in rows if _tile(r) is not None]
            if below:
                text = (f"{_tile_text(tile)} tiles do not fit shared memory at {first_bad} stages; "
                        f"use at most {below[-1]}")
                use = {"num_stages": below[-1]}
            else:
                text = f"{_tile_text(tile)} tiles do not fit shared memory at any stage count tried; use a smaller tile"
                use = {}
            out.append(Heuristic(
                kernel, device, HeuristicKind.STAGES_FOR_TILE, text, when=dict(tile),
                avoid={"num_stages": failing}, use=use, support=n, verification=V.VERIFIED,
                note=(f"{sum(len(by_stages[s]) for s in failing)} launch(es) at {', '.join(map(str, failing))} "
                      f"stage(s) failed with OUT_OF_RESOURCES"
                      + (f"; {sum(len(by_stages[s]) for s in below)} at fewer stages ran" if below else "")),
                data_kind=_kind(tile_rows)))
    return out


def _regime(g: GroupRanking) -> str:
    m = g.shape_dims.get("M")
    if m is None:
        return "all shapes"
    return f"M <= {SMALL_M}" if m <= SMALL_M else f"M > {SMALL_M}"


def config_for_shapes(rankings: Mapping[GroupKey, GroupRanking],
                      noise_band: float = DEFAULT_NOISE_BAND) -> list[Heuristic]:
    out: list[Heuristic] = []
    regimes: dict[tuple[str, str | None, str], list[GroupRanking]] = defaultdict(list)
    for key, g in rankings.items():
        if g.chosen is not None and g.fastest is not None:
            regimes[(key[0], key[2], _regime(g))].append(g)
    for (kernel, device, regime), groups in sorted(regimes.items(), key=lambda kv: tuple(map(str, kv[0]))):
        good: dict[str, list[GroupRanking]] = defaultdict(list)
        configs: dict[str, Mapping] = {}
        for g in groups:
            for c in g.candidates:
                if c is g.chosen or tied_with(g.fastest, c, noise_band):
                    good[c.config_id].append(g)
                    configs[c.config_id] = c.config
        if not good:
            continue
        speed = {cid: sum((g.candidate(cid).speedup or 0) for g in gs) for cid, gs in good.items()}
        best = max(good, key=lambda cid: (len(good[cid]), speed[cid], cid))
        k, n = len(good[best]), len(groups)
        if 2 * k < n:
            continue  # no config holds up in most shapes: nothing general to say
        shapes = ", ".join(sorted(str(g.key[1]) for g in good[best]))
        out.append(Heuristic(
            kernel, device, HeuristicKind.CONFIG_FOR_SHAPES,
            f"for {regime}, use {config_label(configs[best])} ({best}): best or within the ±{noise_band:.0%} "
            f"noise band in {k} of {n} shape(s)",
            when={"regime": regime}, avoid={}, use=dict(configs[best]), support=k, counterexamples=n - k,
            verification=V.VERIFIED if k == n else V.UNVERIFIED,
            note=f"shapes: {shapes}" + ("" if k == n else f"; {n - k} shape(s) prefer another config"),
            data_kind=groups[0].data_kind))
    return out


def learn(frame: pd.DataFrame, rankings: Mapping[GroupKey, GroupRanking],
          noise_band: float = DEFAULT_NOISE_BAND) -> list[Heuristic]:
    """Every heuristic the sweep supports, per kernel and device."""
    if frame.empty:
        return []
    return [*warps_for_tile(frame, rankings), *stages_for_tile(frame), *config_for_shapes(rankings, noise_band)]
