"""What is particular to ``kernels/heldout/fused_moe_gemm.py``: the routing metadata (the
``moe_align_block_size`` equivalent), the per-pair reference, both baseline paths, the config
space, and, under Triton's CPU interpreter, that programs of blocks past the padded total write
nothing. The kernel's numerics on small shapes are in ``test_kernel_numerics.py``."""

from __future__ import annotations

import json
import os

import pytest
import torch

from kernaudit_pipeline.kernel_spec import Shape, config_id, load_kernel_module
from tests.kernels.support import SMEM_OPTIN_LIMIT_BYTES, interpreter_child


def _moe():
    return load_kernel_module("fused_moe_gemm")


def _shape(M: int, N: int, K: int, E: int, top_k: int) -> Shape:
    return Shape("t", {"M": M, "N": N, "K": K, "E": E, "TOP_K": top_k})


@pytest.mark.parametrize(("M", "E", "top_k", "block_m"),
                         [(3, 8, 2, 16), (50, 2, 2, 16), (37, 6, 3, 32), (200, 16, 4, 64),
                          (5, 128, 8, 256)])
def test_alignment_puts_every_pair_once_and_pads_each_expert(M: int, E: int, top_k: int,
                                                             block_m: int) -> None:
    """Every pair exactly once, grouped by expert in pair order, each expert's group padded
    with the sentinel to a multiple of BLOCK_M; one expert per block, the right one; the
    padded total; -1 past it; the length is vLLM's bound whatever the routing."""
    moe = _moe()
    inputs = moe.make_inputs(_shape(M, 16, 16, E, top_k), "cpu", M + E)
    ids = inputs["topk_ids"]
    assert ids.dtype == torch.int32 and ids.shape == (M, top_k)
    assert all(len(set(row)) == top_k for row in ids.tolist())  # distinct experts per token
    al = moe.align_block_size(ids, E, block_m)
    n = M * top_k
    sorted_ids, expert_ids = al["sorted_ids"].tolist(), al["expert_ids"].tolist()
    num_post = int(al["num_post"].item())
    em = n + E * (block_m - 1)
    assert len(sorted_ids) == em and len(expert_ids) == -(-em // block_m)
    assert sorted(p for p in sorted_ids if p != n) == list(range(n))
    flat = ids.flatten().tolist()
    counts = [flat.count(e) for e in range(E)]
    assert num_post == sum(-(-c // block_m) * block_m for c in counts) and num_post % block_m == 0
    assert all(p == n for p in sorted_ids[num_post:])
    assert all(e == -1 for e in expert_ids[num_post // block_m:])
    pos = 0
    for e in range(E):  # experts in order, each a run of whole blocks
        size = -(-counts[e] // block_m) * block_m
        run = sorted_ids[pos:pos + size]
        assert run[:counts[e]] == [p for p in range(n) if flat[p] == e]
        assert all(p == n for p in run[counts[e]:])
        assert expert_ids[pos // block_m:(pos + size) // block_m] == [e] * (size // block_m)
        pos += size
    assert pos == num_post
    # Cached for every BLOCK_M of the space by make_inputs, and what launch would use.
    assert {c["BLOCK_M"] for c in moe.CONFIGS} <= set(inputs["_align"])
    if block_m in inputs["_align"]:
        assert torch.equal(inputs["_align"][block_m]["sorted_ids"], al["sorted_ids"])
    meta = moe.align_block_size(ids.to("meta"), E, block_m)
    assert {k: v.shape for k, v in meta.items()} == {k: v.shape for k, v in al.items()}


def test_an_expert_without_tokens_owns_no_block() -> None:
    moe = _moe()
    ids = torch.tensor([[0, 3], [3, 0], [0, 2]], dtype=torch.int32)  # experts 1 and 4 unused
    al = moe.align_block_size(ids, 5, 16)
    assert int(al["num_post"]) == 48
    assert al["expert_ids"].tolist()[:3] == [0, 2, 3]
    assert al["sorted_ids"].tolist()[:3] == [0, 3, 4] and al["sorted_ids"].tolist()[32:34] == [1, 2]


def test_reference_equals_a_per_token_dense_loop() -> None:
    """Row t * TOP_K + j is token t times the weight of its j-th expert, in fp32."""
    moe = _moe()
    M, N, K, E, top_k = 9, 24, 40, 5, 3
    inputs = moe.make_inputs(_shape(M, N, K, E, top_k), "cpu", 2)
    x, w, ids = inputs["x"].double(), inputs["w"].double(), inputs["topk_ids"]
    expected = torch.stack([x[t] @ w[int(ids[t, j])].t()
                            for t in range(M) for j in range(top_k)])
    ref = moe.reference(inputs)
    assert ref.dtype == torch.float32 and ref.shape == (M * top_k, N)
    assert torch.allclose(ref.double(), expected, rtol=1e-5, atol=1e-5)


def test_both_baselines_compute_the_pairs_in_pair_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """``_grouped_mm`` and the per-expert loop give out[M * TOP_K, N] within TOLERANCE of the
    reference; when ``_grouped_mm`` raises, ``baseline`` falls back, remembers it per device
    and ``baseline_name`` says so."""
    moe = _moe()
    inputs = moe.make_inputs(_shape(20, 32, 64, 6, 2), "cpu", 5)
    ref = moe.reference(inputs)
    for fn in (moe.grouped_mm, moe.per_expert_matmul):
        out = fn(inputs)
        assert out.dtype == torch.bfloat16 and out.shape == ref.shape
        assert float((out.float() - ref).norm() / ref.norm()) <= moe.TOLERANCE.max_rel_l2
    monkeypatch.setattr(moe, "_BASELINE_RAN", {})
    assert moe.baseline_name("cpu") == moe.GROUPED_MM

    def broken(*args, **kwargs):
        raise RuntimeError("no grouped GEMM here")

    monkeypatch.setattr(moe, "_BASELINE_RAN", {})
    monkeypatch.setattr(torch, "_grouped_mm", broken)
    assert torch.equal(moe.baseline(inputs), moe.per_expert_matmul(inputs))
    assert moe.baseline_name("cpu") == moe.PER_EXPERT
    assert moe._BASELINE_RAN == {"cpu": moe.PER_EXPERT}


def test_inputs_that_do_not_chain_are_refused() -> None:
    moe = _moe()
    inputs = moe.make_inputs(_shape(16, 32, 64, 4, 2), "meta", 0)
    assert inputs["w"].shape == (4, 32, 64) and inputs["w"].stride() == (2048, 64, 1)
    with pytest.raises(ValueError, match="do not chain"):
        moe.kernel_args({**inputs, "topk_ids": inputs["topk_ids"][:8]}, moe.CONFIGS[0])
    with pytest.raises(ValueError, match="do not chain"):
        moe.kernel_args({**inputs, "w": inputs["w"][:, :, :32]}, moe.CONFIGS[0])


def test_space_is_vllms_tuning_space_subsampled() -> None:
    """vLLM's benchmark_moe.py axes, every tile but 256 x 256, some pipelines over the
    shared-memory limit and some accumulators that spill, GROUP_M swept on part of it."""
    moe = _moe()
    cfgs = moe.CONFIGS
    assert 400 <= len(cfgs) <= 450
    assert config_id(cfgs[0]) == "BK32_BM16_BN32_GM1_s3_w4"
    assert {c["BLOCK_M"] for c in cfgs} == {16, 32, 64, 128, 256}
    assert {c["BLOCK_N"] for c in cfgs} == {32, 64, 128, 256}
    assert {c["BLOCK_K"] for c in cfgs} == {32, 64, 128, 256}
    assert {c["GROUP_M"] for c in cfgs} == {1, 16, 32, 64}
    assert {c["num_warps"] for c in cfgs} == {4, 8}
    assert {c["num_stages"] for c in cfgs} == {2, 3, 4, 5}
    assert all(c["BLOCK_M"] * c["BLOCK_N"] <= 128 * 256 for c in cfgs)
    smem = [c["num_stages"] * (c["BLOCK_M"] + c["BLOCK_N"]) * c["BLOCK_K"] * 2 for c in cfgs]
    assert 10 <= sum(b > SMEM_OPTIN_LIMIT_BYTES for b in smem) <= 40
    assert max(smem) <= moe.SMEM_CAP
    acc_regs = [c["BLOCK_M"] * c["BLOCK_N"] // (32 * c["num_warps"]) for c in cfgs]
    assert sum(r >= 256 for r in acc_regs) >= 10
    assert len(moe.SHAPES) == 4 and [s["M"] for s in moe.SHAPES] == [16, 128, 1024, 4096]
    assert {(s["N"], s["K"], s["E"], s["TOP_K"]) for s in moe.SHAPES} == {(1536, 2048, 128, 8)}


def test_programs_past_the_padded_total_write_nothing() -> None:
    """Under the interpreter, with ``num_post`` cut to the first block: only the pairs of that
    block are written, every other row keeps its NaN poison, though the later blocks hold real
    pair ids and experts."""
    r = interpreter_child(__file__)[-1]
    assert r["later_blocks_with_pairs"] >= 2
    assert r["written_rows"] == r["first_block_pairs"], r
    assert r["first_block_rel_l2"] <= _moe().TOLERANCE.max_rel_l2, r


def _early_exit_child() -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1"
    moe = _moe()
    cfg = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 1,
           "num_warps": 4, "num_stages": 2}
    inputs = moe.make_inputs(_shape(40, 48, 64, 4, 2), "cpu", 11, dtype=torch.float16)
    al = moe.aligned(inputs, 16)
    n = 40 * 2
    first = [p for p in al["sorted_ids"][:16].tolist() if p != n]
    later = sum(1 for b in range(1, int(al["num_post"]) // 16)
                if int(al["expert_ids"][b]) >= 0)
    al["num_post"].fill_(16)
    out = torch.full((n, 48), float("nan"), dtype=torch.float16)
    moe.launch(inputs, cfg, out=out)
    written = (~torch.isnan(out).all(dim=1)).nonzero().flatten().tolist()
    ref = moe.reference(inputs)[first]
    rel = float((out[first].float() - ref).norm() / ref.norm())
    print(json.dumps({"written_rows": sorted(written), "first_block_pairs": sorted(first),
                      "later_blocks_with_pairs": later, "first_block_rel_l2": rel}))


if __name__ == "__main__":
    _early_exit_child()
