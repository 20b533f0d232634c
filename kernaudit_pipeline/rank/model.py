"""The cost model: a roofline per SM, wave by wave, with a few fitted efficiencies.

For one (config, shape), with ``n`` = programs on the busiest SM (``ceil(programs / SMs)``,
which is where wave quantization and the tail come in):

- compute: ``n * flops_per_program / (peak_per_SM * e)``, where ``e`` is the tensor-core
  efficiency of the MMA path (wgmma on sm_90 for tiles of >= 64 rows on whole warpgroups,
  mma.sync otherwise), lower for narrow tiles (fewer columns to amortize each operand fetch
  from shared memory), for 2-stage pipelines (nothing to overlap the next load with), with fewer
  resident blocks (one block's softmax or epilogue has no other block's MMAs to hide behind), and where
  ptxas reported that it serialized the wgmmas or injected waits on their accumulators;
- L2 -> SM: ``n * load_bytes_per_program / (L2 bandwidth per SM)``: small tiles re-read their
  operands many times and hit this ceiling, however fast the tensor cores are;
- DRAM: the L2-reuse-aware byte count (``features.dram_bytes``) over the bandwidth the
  in-flight loads can sustain (Little's law: active SMs x resident blocks x stages in flight x
  stage bytes, over the memory latency), capped at the achievable DRAM bandwidth;
- the longest program (a causal block on the diagonal's far side, a decode partition of the
  longest context) streaming its bytes alone at what its own in-flight stages sustain;
- the hot loop (``features.loop_*``, read from the cubin's SASS), block by block: within one
  block the warps that issue the MMAs also run the loop's other work (a fused norm's
  reduction, a weight tile's dequantization, reloads of spilled registers), so a program takes
  its MMA time *plus* ``trips`` times its loop body at ``cpi`` per instruction (a spill reload
  ``local_op`` longer); the resident blocks of one round run side by side, so this serial time
  counts once per round, ``ceil(n / blocks_per_SM)`` rounds. This and the compute term are two
  bounds on the same timeline (the tensor cores' throughput, one block's serial path), so the
  larger of the two enters the soft maximum. With several blocks resident the compute term is
  the larger; a lone block (255 registers, a deep pipeline's shared memory) is where the loop's
  work shows. Without the SASS (``loop_instructions`` 0) the term is left out;
- the issue slots those loop bodies take: every warp's instructions through the SM's four
  schedulers, one per cycle each;
- short contiguous runs: a tile whose fastest dimension spans less than a 128-byte line (a
  K-major weight read 32 bf16 per K step) brings each line in pieces over several K steps, so
  the memory system handles more requests per byte. The L2, DRAM and longest-program terms are
  scaled by ``1 + short_run * (line_overfetch - 1)`` (``features.line_overfetch``: lines
  touched per byte loaded, from the compiler's load layouts);
- these overlap, combined as a soft maximum ``(a^p + b^p + ...)^(1/p)``;
- plus a per-round overhead (pipeline fill and epilogue of each round of resident programs,
  ``ceil(n / blocks_per_SM)`` rounds), a launch constant, and a spill factor that grows with
  the square of the spill bytes (small spills cost little; at 512 B/thread it is large).

Every term is a time, so the model transfers to a kernel it was not fitted on as long as its
family's traffic rule holds (``features``). The fitted parameters and the model's stated error
come from ``calibration.json`` (written by ``scripts/rank_validate.py``).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kernaudit_pipeline.rank.features import Features

CALIBRATION_FILE = Path(__file__).with_name("calibration.json")
# Spills at or above this many bytes per thread are never ranked (ANCHORS: always far from best).
HEAVY_SPILL_BYTES = 512


@dataclass(frozen=True)
class Params:
    """Fitted efficiencies and constants; defaults are physical priors for an H100/H200."""

    e_wgmma: float = 0.80        # share of dense peak a well-fed wgmma tile reaches
    e_mma: float = 0.30          # the same for mma.sync tiles (BLOCK_M < 64 on sm_90)
    narrow_n: float = 0.15       # efficiency loss per 64/BLOCK_N (operand reuse across columns)
    short_k: float = 0.05        # efficiency loss per 32/BLOCK_K (loop overhead per K step)
    two_stage: float = 0.15      # efficiency lost with num_stages <= 2
    l2_bytes_per_s: float = 10e12  # L2 -> SM bandwidth, whole chip
    e_dram: float = 0.80         # share of DRAM peak the loads can reach
    mem_latency_s: float = 1.5e-6  # memory latency in Little's law
    softmax_p: float = 4.0       # soft-maximum exponent
    round_overhead_s: float = 1.0e-6  # pipeline fill + epilogue per round of programs
    launch_s: float = 4.0e-6     # launch and drain
    spill_k: float = 2.5         # spill factor: 1 + spill_k * (spill_bytes / 512)^2
    lone_block: float = 0.10     # efficiency lost per 1/(resident blocks): nothing to overlap with
    serialized: float = 0.30     # efficiency lost when ptxas serializes the wgmmas
    waits: float = 0.15          # efficiency lost when ptxas injects waits on their accumulators
    cpi_s: float = 2.0e-9        # average time a warp spends per loop instruction (~4 cycles)
    local_op_s: float = 15e-9    # extra time per local-memory (spill) op in the loop
    issue_s: float = 0.505e-9    # one warp instruction per scheduler per cycle at 1.98 GHz
    short_run: float = 0.3       # memory time added per extra line touched, per line of bytes loaded

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Params:
        known = {f.name for f in fields(cls)}
        return cls(**{k: float(v) for k, v in data.items() if k in known})


# The parameters the fit may move, with their bounds (everything else keeps its prior).
FITTED: dict[str, tuple[float, float]] = {
    "e_wgmma": (0.3, 1.0), "e_mma": (0.05, 0.8), "narrow_n": (0.0, 1.0), "two_stage": (0.0, 0.6),
    "l2_bytes_per_s": (3e12, 30e12), "e_dram": (0.4, 1.0), "mem_latency_s": (0.2e-6, 6e-6),
    "round_overhead_s": (0.0, 10e-6), "launch_s": (0.0, 20e-6),
    "serialized": (0.0, 0.8), "waits": (0.0, 0.6), "lone_block": (0.0, 1.0), "short_k": (0.0, 0.5),
    "cpi_s": (0.505e-9, 10e-9), "local_op_s": (0.0, 100e-9), "short_run": (0.0, 2.0),
}


@dataclass(frozen=True)
class Calibration:
    """Parameters plus how well they did: ``stated_error`` is the relative error, within a
    shape, that 90 % of predictions stay inside on kernels the fit did not see (the worst
    leave-one-kernel-out figure); the search and the audit's disagreement flag rely on it."""

    params: Params
    stated_error: float = 0.15
    fitted_on: tuple[str, ...] = ()
    note: str = "priors (not fitted)"

    def to_json(self) -> str:
        return json.dumps({"params": self.params.to_dict(), "stated_error": self.stated_error,
                           "fitted_on": list(self.fitted_on), "note": self.note}, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> Calibration:
        """Read a calibration file, refusing what the model cannot use: an unknown parameter
        (a misspelt one would silently keep its prior), a value that is not a finite number or
        lies outside the range the fit may move it in (``FITTED``; a zero efficiency or
        bandwidth would divide by zero), or a stated error outside [0, 10)."""
        try:
            doc = _CalibrationDoc.model_validate_json(text)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(part) for part in err["loc"]) or "the document"
            raise CalibrationError(f"{where}: {err['msg']}") from None
        for name, value in doc.params.items():
            if name not in PARAM_RANGES:
                raise CalibrationError(f"params.{name}: not a parameter of the model "
                                       f"(known: {', '.join(PARAM_RANGES)})")
            if not math.isfinite(value):  # an integer too large for a float reads as inf
                raise CalibrationError(f"params.{name}: not a finite number")
            low, high = PARAM_RANGES[name]
            slack = 1e-9 * max(abs(low), abs(high))  # a bounded fit may land on a bound
            if not low - slack <= value <= high + slack:
                raise CalibrationError(f"params.{name}: {value:g} is outside [{low:g}, {high:g}]")
        return cls(Params.from_dict(doc.params), doc.stated_error, doc.fitted_on, doc.note)


class CalibrationError(ValueError):
    """A calibration file the model cannot use; the message is one line."""


class _CalibrationDoc(BaseModel):
    """The calibration file as written by ``Calibration.to_json``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    params: dict[str, float] = Field(default_factory=dict)
    stated_error: float = Field(0.15, ge=0.0, lt=10.0, allow_inf_nan=False)
    fitted_on: tuple[str, ...] = ()
    note: str = ""


# Where each parameter may lie: the fit's own bounds, and for the three it never moves a range
# that keeps the terms meaningful (a soft maximum with p >= 1, a non-negative spill factor, a
# positive issue time).
PARAM_RANGES: dict[str, tuple[float, float]] = {
    **FITTED, "softmax_p": (1.0, 64.0), "spill_k": (0.0, 100.0), "issue_s": (1e-12, 1e-6)}


def load_calibration(path: Path | None = None) -> Calibration:
    """The calibration at ``path``; with none given, the shipped one, or the priors when it is
    missing. A file that cannot be read or used raises :class:`CalibrationError`: a ranking
    from priors presented as calibrated would state the wrong error."""
    if path is None:
        if not CALIBRATION_FILE.is_file():
            return Calibration(Params())
        path = CALIBRATION_FILE
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise CalibrationError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        return Calibration.from_json(text)
    except CalibrationError as exc:
        raise CalibrationError(f"{path}: {exc}") from None


@dataclass(frozen=True)
class Breakdown:
    """One prediction and the terms behind it (seconds), for explanations and tests."""

    total_s: float
    compute_s: float
    l2_s: float
    dram_s: float
    critical_s: float
    overhead_s: float
    spill_factor: float
    loop_s: float = 0.0
    issue_s: float = 0.0

    @property
    def bound(self) -> str:
        terms = {"compute": self.compute_s, "l2": self.l2_s, "dram": self.dram_s,
                 "longest program": self.critical_s, "loop latency": self.loop_s,
                 "issue": self.issue_s}
        return max(terms, key=terms.get)  # the first of equals: compute before loop latency


def predict(f: Features, params: Params) -> Breakdown:
    n = f.programs_per_sm
    sms = f.sm_count
    e = params.e_wgmma if f.uses_wgmma else params.e_mma
    if f.block_n:
        e /= 1.0 + params.narrow_n * 64.0 / min(f.block_n, 256)
    if f.block_k:
        e /= 1.0 + params.short_k * 32.0 / f.block_k
    if f.num_stages <= 2:
        e *= 1.0 - params.two_stage
    resident = min(f.blocks_per_sm, n)
    e /= 1.0 + params.lone_block / max(resident, 1)
    if f.wgmma_serialized:
        e *= 1.0 - params.serialized
    elif f.wgmma_waits_injected:
        e *= 1.0 - params.waits
    compute = n * f.flops_per_program / (f.peak_flops / sms * e)
    l2 = n * f.load_bytes_per_program / (params.l2_bytes_per_s / sms)
    active = min(f.programs, sms)
    inflight = active * resident * max(f.num_stages - 1, 1) * f.stage_bytes
    bandwidth = min(f.dram_bytes_per_s * params.e_dram, inflight / params.mem_latency_s)
    dram = f.dram_bytes / max(bandwidth, 1.0)
    # The longest program streams alone at what its own in-flight stages sustain.
    stream = min(max(f.num_stages - 1, 1) * f.stage_bytes / params.mem_latency_s,
                 params.l2_bytes_per_s / sms)
    critical = f.max_load_bytes_per_program / max(stream, 1.0)
    fetch = 1.0 + params.short_run * max(f.line_overfetch - 1.0, 0.0)
    l2, dram, critical = l2 * fetch, dram * fetch, critical * fetch
    rounds = math.ceil(n / max(f.blocks_per_sm, 1))
    per_iteration = f.loop_instructions * params.cpi_s + f.loop_local_ops * params.local_op_s
    mma_longest = f.flops_per_program / (f.peak_flops / sms * e)
    if f.loop_trips > 0:
        mma_longest *= f.loop_trips_max / f.loop_trips
    loop = (rounds * (mma_longest + f.loop_trips_max * per_iteration)
            if f.loop_trips_max and f.loop_instructions else 0.0)
    issue = n * f.loop_trips * f.loop_instructions * f.num_warps / 4.0 * params.issue_s
    p = params.softmax_p
    core = (max(compute, loop) ** p + l2 ** p + dram ** p + critical ** p + issue ** p) ** (1.0 / p)
    overhead = rounds * params.round_overhead_s
    spill = 1.0 + params.spill_k * (f.spill_bytes / HEAVY_SPILL_BYTES) ** 2
    total = (core + overhead) * spill + params.launch_s
    return Breakdown(total, compute, l2, dram, critical, overhead, spill, loop, issue)


def predict_us(f: Features, params: Params) -> float:
    return predict(f, params).total_s * 1e6


def with_values(params: Params, names: list[str], values: list[float]) -> Params:
    return replace(params, **dict(zip(names, (float(v) for v in values))))
