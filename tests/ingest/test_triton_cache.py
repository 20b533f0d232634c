"""Triton cache directories, from real sm_90 compiles on this CPU (no GPU needed).

ANCHORS.md: 128x256x64 with 4 warps (3 stages) spills at 255 registers; 64x64x32 with 4 warps
does not. The cache ingest must read the same from the cubin and the cached PTX.
"""

from __future__ import annotations

import subprocess

import pytest
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernaudit_pipeline.ingest import SourceFormat, detect_format, ingest_paths, validate
from kernaudit_pipeline.ingest.triton_cache import _tool
from kernaudit_pipeline.kernel_spec import Shape, load_kernel_module, specialize

SHAPE = Shape("t", {"M": 2048, "N": 2048, "K": 2048})
CLEAN = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 3}
SPILL = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 3}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("triton_cache")
    gemm = load_kernel_module("gemm")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_CACHE_DIR", str(root))
        compiled = {}
        for label, cfg in (("clean", CLEAN), ("spill", SPILL)):
            spec = specialize(gemm.KERNEL, gemm.compile_args(SHAPE, cfg))
            src = ASTSource(gemm.KERNEL, spec.signature, spec.constexprs, spec.attrs)
            compiled[label] = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                             options={"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]})
    return root, compiled


def _ptxas_v(compiled) -> str:
    """Independent check: ptxas -v on the kernel's own PTX."""
    out = subprocess.run([str(_tool("ptxas")), "-v", "--gpu-name=sm_90a", "-", "-o", "/dev/null"],
                         input=compiled.asm["ptx"], capture_output=True, text=True, check=True)
    return out.stderr


def test_cache_dir_is_detected_as_a_whole(cache_dir):
    root, _ = cache_dir
    assert detect_format(root) is SourceFormat.TRITON_CACHE


def test_cache_rows_carry_cubin_resources_and_spills(cache_dir):
    root, compiled = cache_dir
    result = ingest_paths([root])
    (summary,) = result.summaries
    assert summary.source_format == "triton_cache"
    assert summary.records_in == summary.rows + summary.quarantined + summary.other_records
    by_shared = {r["shared_mem_dynamic_bytes"]: r for r in result.rows.to_dict("records")}
    clean = by_shared[compiled["clean"].metadata.shared]
    spill = by_shared[compiled["spill"].metadata.shared]
    for row, label in ((clean, "clean"), (spill, "spill")):
        log = _ptxas_v(compiled[label])
        assert f"Used {row['registers_per_thread']} registers" in log
        assert row["kernel_name"] == "gemm_bf16" and row["num_warps"] == 4 and row["num_stages"] == 3
        assert row["compute_capability"] == "9.0" and row["shared_mem_static_bytes"] == 0
        assert row["source_file"].endswith(".json") and not row["source_file"].startswith("/")
    assert clean["spill_stores_bytes"] == 0 and clean["stack_frame_bytes"] == 0
    assert spill["registers_per_thread"] == 255
    assert spill["spill_stores_bytes"] > 0 and spill["stack_frame_bytes"] > 0
    assert f"{spill['spill_stores_bytes']} bytes spill stores" in _ptxas_v(compiled["spill"])
    checked = validate(result)
    assert len(checked.kernel_runs) == 2 and checked.quarantine.empty


def test_broken_metadata_is_quarantined(cache_dir, tmp_path):
    root, _ = cache_dir
    import shutil
    copy = tmp_path / "cache"
    shutil.copytree(root, copy)
    victim = next(p for p in sorted(copy.glob("*/*.json")) if not p.name.startswith("__grp__")
                  and p.with_suffix(".cubin").exists())
    victim.write_text('{"name": "gemm_kernel", "num_warps": 4')
    result = ingest_paths([copy])
    assert len(result.rows) == 1 and len(result.quarantine) == 1
    assert "metadata JSON unreadable" in result.quarantine[0]["reason"]
