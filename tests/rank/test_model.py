"""Features and the cost model on hand-built static rows: the physics each term stands for."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from kernaudit_pipeline.core.configs import config_id
from kernaudit_pipeline.core.hardware import lookup
from kernaudit_pipeline.kernel_spec import Shape
from kernaudit_pipeline.rank.features import Family, _grouped_dram_bytes, build
from kernaudit_pipeline.rank.model import Calibration, CalibrationError, Params, load_calibration, predict
from kernaudit_pipeline.static_resources import ARCHS, CompileStatus
from kernaudit_pipeline.static_resources.describe import KernelDescription, Pair
from kernaudit_pipeline.static_resources.results import make_result

H200 = lookup("NVIDIA H200")
SHAPES = (Shape("m4096", {"M": 4096, "N": 14336, "K": 4096}),
          Shape("m16", {"M": 16, "N": 14336, "K": 4096}))


def _cfg(bm, bn, bk, warps, stages, group_m=8):
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m,
            "num_warps": warps, "num_stages": stages}


def _desc(configs, weights=2) -> KernelDescription:
    """A GEMM-like kernel with ``weights`` K x N operands (2: a fused gate/up pair)."""
    pairs = {(config_id(c), s.name): Pair(None, "", (math.ceil(s["M"] / c["BLOCK_M"]) * math.ceil(s["N"] / c["BLOCK_N"]),))
             for c in configs for s in SHAPES}
    return KernelDescription(
        path="/k.py", name="k", dtype="bf16", baseline_name="b", source_hash="0" * 64,
        configs=tuple(configs), shapes=SHAPES, module_config_ids=tuple(config_id(c) for c in configs),
        module_shape_names=tuple(s.name for s in SHAPES),
        flops={s.name: 2.0 * weights * s["M"] * s["N"] * s["K"] for s in SHAPES},
        bytes_moved={s.name: 2.0 * (s["M"] * s["K"] + weights * s["K"] * s["N"] + s["M"] * s["N"]) for s in SHAPES},
        pairs=pairs, bytes_terms={("K", "M"): 2.0, ("K", "N"): 2.0 * weights, ("M", "N"): 2.0})


def _row(cfg, shape="m4096", regs=200, spill=0, serialized=False, waits=False, status=CompileStatus.OK):
    smem = cfg["num_stages"] * (cfg["BLOCK_M"] + 2 * cfg["BLOCK_N"]) * cfg["BLOCK_K"] * 2
    numbers = {"registers_per_thread": regs, "spill_stores_bytes": spill, "spill_loads_bytes": spill,
               "stack_frame_bytes": spill, "shared_mem_static_bytes": 0, "shared_mem_dynamic_bytes": smem,
               "shared_mem_bytes": smem, "threads_per_block": 32 * cfg["num_warps"],
               "wgmma_serialized": int(serialized), "wgmma_waits_injected": int(waits)}
    return make_result(kernel_name="k", config=cfg, shape_name=shape, arch=ARCHS["sm_90"], status=status,
                       message="", numbers=numbers, triton_version="t", kernel_source_hash="0" * 64, cached=True)


def _features(cfg, **kw):
    return build(_desc([cfg]), _row(cfg, **kw), H200, H200.sm)


def test_matmul_traffic_counts_both_weights_and_the_padding():
    f = _features(_cfg(128, 128, 64, 8, 3))
    assert f.family is Family.MATMUL and f.uses_wgmma
    assert f.programs == 32 * 112 and f.programs_per_sm == math.ceil(3584 / 132)
    # one x panel (128 x 4096 bf16) and two weight panels (2 x 4096 x 128 bf16)
    assert f.load_bytes_per_program == 128 * 4096 * 2 + 128 * 4096 * 4
    assert f.flops_per_program == 2 * 2 * 128 * 128 * 4096
    small = _features(_cfg(64, 128, 64, 4, 3), shape="m16")
    assert small.flops_per_program == 2 * 2 * 64 * 128 * 4096  # 48 padded rows computed anyway
    assert small.memory_bound and not f.memory_bound
    assert not _features(_cfg(32, 64, 64, 4, 3)).uses_wgmma  # < 64 rows: mma.sync


def test_grouping_decides_how_often_the_weights_come_from_dram():
    """GROUP_M=1 walks a whole row of N tiles per wave: the weight panels (117 MiB) cannot stay
    in L2, so each of the 32 tile-rows re-reads them; GROUP_M=8 shares them over 8 rows."""
    args = dict(M=4096, N=14336, K=4096, bm=128, bn=128, slots=132, a_elem=2.0, b_elem=4.0,
                l2_reuse_bytes=30e6)
    weights = 4096 * 14336 * 4
    one = _grouped_dram_bytes(group_m=1, **args)
    eight = _grouped_dram_bytes(group_m=8, **args)
    assert one > 25 * weights and eight < 6 * weights and eight < one / 4
    # a single tile-row (decode) reads the weights once, grouped or not
    decode = dict(args, M=16)
    assert _grouped_dram_bytes(group_m=1, **decode) == pytest.approx(weights + 16 * 4096 * 2)


def test_past_the_simulated_waves_the_mean_per_program_stands_for_the_rest(monkeypatch):
    """A shape of absurd size (M = 10**12 in someone's module took minutes per config, linear in
    M) simulates MAX_SIMULATED_WAVES waves and scales their bytes by the programs: within a per
    cent of the full simulation where both can run, and the shipped cap is above every
    committed shape, so their figures are the full simulation's."""
    import kernaudit_pipeline.rank.features as features

    args = dict(M=64 * 4096, N=14336, K=4096, bm=128, bn=128, slots=132, a_elem=2.0, b_elem=4.0,
                l2_reuse_bytes=30e6, group_m=8)  # 2048 tile-rows x 112 tile-columns, 1,738 waves
    full = _grouped_dram_bytes(**args)
    monkeypatch.setattr(features, "MAX_SIMULATED_WAVES", 100)
    capped = _grouped_dram_bytes(**args)
    assert capped != full and capped == pytest.approx(full, rel=0.01)
    monkeypatch.undo()
    huge = _grouped_dram_bytes(**dict(args, M=10**12))
    assert huge == pytest.approx(full * 10**12 / (64 * 4096), rel=0.01)


def test_each_penalty_slows_the_prediction():
    params = Params()
    base = _features(_cfg(128, 128, 64, 8, 3))
    t = predict(base, params).total_s
    assert predict(replace(base, spill_bytes=256), params).total_s > t
    assert predict(replace(base, wgmma_serialized=True), params).total_s > t
    assert predict(replace(base, wgmma_waits_injected=True), params).total_s > t
    assert predict(replace(base, num_stages=2), params).total_s > t
    # small spills cost little, 512 B a lot
    small = predict(replace(base, spill_bytes=64), params).total_s
    heavy = predict(replace(base, spill_bytes=512), params).total_s
    assert small < 1.05 * t < 2 * t < heavy


def test_the_bound_follows_the_shape():
    params = Params()
    assert predict(_features(_cfg(128, 256, 32, 8, 3), regs=220), params).bound == "compute"
    assert predict(_features(_cfg(16, 64, 128, 4, 4), shape="m16", regs=96), params).bound == "dram"
    # the small-tile prefill re-reads operands from L2 more than it computes
    assert predict(_features(_cfg(32, 32, 64, 4, 3), regs=64), params).bound in ("l2", "dram")


def test_launch_limits_drop_the_config():
    assert _features(_cfg(128, 256, 64, 8, 5)) is None  # 5 x 160 KiB of shared memory
    assert _features(_cfg(128, 128, 64, 8, 3), status=CompileStatus.COMPILE_ERROR) is None


def test_the_shipped_calibration_loads_and_falls_back(tmp_path):
    shipped = load_calibration()
    assert isinstance(shipped, Calibration) and 0 < shipped.stated_error < 1
    assert set(shipped.params.to_dict()) == set(Params().to_dict())
    again = Calibration.from_json(shipped.to_json())
    assert again == shipped
    partial = tmp_path / "partial.json"
    partial.write_text('{"params": {"e_wgmma": 0.9}}')  # the rest keep their priors
    assert load_calibration(partial).params == replace(Params(), e_wgmma=0.9)


def _shipped_with(**changes) -> str:
    doc = json.loads(load_calibration().to_json())
    for key, value in changes.items():
        if key in doc["params"] or key.startswith("p_"):
            doc["params"][key.removeprefix("p_")] = value
        else:
            doc[key] = value
    return json.dumps(doc)


BAD_CALIBRATIONS = {
    "not json": ("{not json", "the document: Invalid JSON"),
    "empty": ("", "the document: Invalid JSON"),
    "a list": ("[1, 2]", "the document: Input should be an object"),
    "nested too deep": ("[" * 5000 + "]" * 5000, "recursion limit"),
    "bytes": (b"\x00\xff\xfe", "the document: Invalid JSON"),
    "misspelt parameter": (_shipped_with(p_e_wgma=0.9), "params.e_wgma: not a parameter of the model"),
    "zero efficiency": (_shipped_with(e_wgmma=0.0), "params.e_wgmma: 0 is outside [0.3, 1]"),
    "negative bandwidth": (_shipped_with(l2_bytes_per_s=-1e12), "params.l2_bytes_per_s: -1e+12 is outside"),
    "a string number": (_shipped_with(e_dram="0.9"), "params.e_dram: Input should be a valid number"),
    "a boolean": (_shipped_with(cpi_s=True), "params.cpi_s: Input should be a valid number"),
    "null": (_shipped_with(e_mma=None), "params.e_mma: Input should be a valid number"),
    "an integer too large": (_shipped_with(softmax_p=10**400), "params.softmax_p: not a finite number"),
    "NaN stated error": (_shipped_with(stated_error=float("nan")), "stated_error: Input should be a finite number"),
    "negative stated error": (_shipped_with(stated_error=-0.1), "stated_error: Input should be greater than or equal to 0"),
    "stated error of 1000 %": (_shipped_with(stated_error=10.0), "stated_error: Input should be less than 10"),
    "unknown top-level key": (_shipped_with(parmas={}), "parmas: Extra inputs are not permitted"),
    "fitted_on a string": (_shipped_with(fitted_on="gemm"), "fitted_on: Input should be a valid"),
    "params a list": (_shipped_with(params=[0.9]), "params: Input should be an object"),
    "soft maximum below 1": (_shipped_with(softmax_p=0.5), "params.softmax_p: 0.5 is outside [1, 64]"),
}


@pytest.mark.parametrize("case", list(BAD_CALIBRATIONS))
def test_a_calibration_the_model_cannot_use_is_refused_in_one_line(case, tmp_path):
    """A user's ``--calibration`` file used to fall back to the priors on any error, so a
    ranking came out stating the priors' ±15 % as if calibrated. Each of these is refused,
    naming the file and the field."""
    text, expected = BAD_CALIBRATIONS[case]
    path = tmp_path / "cal.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(CalibrationError) as info:
        load_calibration(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and expected in message and "\n" not in message


def test_a_missing_calibration_file_is_refused_unless_it_is_the_shipped_default(tmp_path):
    with pytest.raises(CalibrationError, match="cannot read"):
        load_calibration(tmp_path / "absent.json")
    with pytest.raises(CalibrationError, match="cannot read"):
        load_calibration(tmp_path)  # a directory


def test_the_hot_loop_costs_a_lone_block_its_serial_path():
    """A block's warps run the loop's non-MMA work between their MMAs: with one block per SM
    (255 registers) a longer loop body, or spill reloads in it, slows the prediction; with
    several blocks resident the tensor cores' throughput stays the bound."""
    params = Params()
    lone = replace(_features(_cfg(128, 128, 64, 8, 3), regs=255), loop_instructions=100)
    assert lone.blocks_per_sm == 1 and lone.loop_trips == lone.loop_trips_max == 4096 / 64
    base = predict(lone, params)
    heavy = predict(replace(lone, loop_instructions=1200), params)
    assert heavy.total_s > base.total_s and heavy.bound == "loop latency"
    assert predict(replace(lone, loop_local_ops=20), params).total_s > base.total_s
    shared = replace(lone, blocks_per_sm=2)  # the same loop, two blocks side by side
    assert predict(replace(shared, loop_instructions=100), params).bound == "compute"
    # no SASS read: the term is left out, not guessed
    assert predict(replace(lone, loop_instructions=0), params).loop_s == 0.0


def test_short_contiguous_runs_cost_memory_time_not_tensor_core_time():
    """The same tile read in 64-byte runs (lines touched twice per byte) takes longer where the
    shape is memory-bound (M=16: reading the weights) and barely changes where it is
    compute-bound; with the term switched off the layout does not matter at all."""
    cfg = _cfg(16, 128, 32, 4, 4)
    params = Params()
    for shape, memory_bound in (("m16", True), ("m4096", False)):
        numbers = {"loop_load_bytes": 9216, "loop_line_bytes": 18432}
        row = _row(cfg, shape=shape)
        short = replace(row, **numbers)
        base_f = build(_desc([cfg]), row, H200, H200.sm)
        short_f = build(_desc([cfg]), short, H200, H200.sm)
        assert base_f.line_overfetch == 1.0 and short_f.line_overfetch == 2.0
        assert short_f.memory_bound is memory_bound
        base, slow = predict(base_f, params), predict(short_f, params)
        assert slow.dram_s == pytest.approx(base.dram_s * (1 + params.short_run))
        assert slow.compute_s == base.compute_s
        if memory_bound:
            assert slow.total_s > base.total_s * (1 + params.short_run / 2)
        off = replace(params, short_run=0.0)
        assert predict(short_f, off).total_s == predict(base_f, off).total_s
