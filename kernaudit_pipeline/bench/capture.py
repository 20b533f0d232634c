"""Profiler captures of the same kernels the runner timed, for the ingestion and spill work.

Sub-commands (``python -m kernaudit_pipeline.bench.capture MODE ...``):

``plan --jsonl RUNS.jsonl --out TARGETS.json``
    Pick what to capture: per kernel, at its first shape, the fastest correct config of the
    sweep, the config that spills most (if any fits in shared memory), the baseline, and for
    the bf16 GEMM the ANCHORS pair 128x256x64 on 8 warps (clean) and on 4 warps (spills).
``run --targets T.json [--iters N]``
    The target program of Nsight Compute: each target is compiled and warmed up outside the
    profiled range, then launched ``iters`` times between ``cudaProfilerStart/Stop`` inside an
    NVTX range named ``kernaudit:<kernel>:<shape>:<config_id>``; run it under
    ``ncu --profile-from-start off --nvtx``. The launch order is the targets file's order.
``torch --targets T.json --out trace.json``
    The same launches under ``torch.profiler`` (CPU + CUDA), one ``record_function`` range per
    target, written with ``export_chrome_trace``.
``proton --targets T.json --out STEM``
    The same launches under Triton's Proton profiler, one scope per target; writes
    ``STEM.hatchet``.
``ptxas --targets T.json --out DIR``
    ``ptxas -v`` logs of each Triton target's PTX (``ptxas_<kernel>_<config>.log``) and a copy
    of the Triton cache directory of the GEMM's clean and spilling configs (``triton_cache/``).
``metrics --listing QUERY.txt``
    The wanted ncu metrics that ``ncu --query-metrics`` lists on this host, comma-joined.
``references --out trace.json [--shape KERNEL=SHAPE]``
    Every reference of every kernel (``REFERENCES``: cuBLAS, ``_scaled_mm``, SDPA's backends,
    FlashInfer...) at one shape under ``torch.profiler``, one ``record_function`` range each
    (``kernaudit:<kernel>:<shape>:baseline[<key>]``), so the trace shows which library's kernels
    each call dispatched to; a JSON summary of the kernel names per reference goes beside it.

torch, triton and the standard library only.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from kernaudit_pipeline.bench.records import reference_config_id
from kernaudit_pipeline.bench.references import classify_kernels, references_of
from kernaudit_pipeline.core.configs import config_id
from kernaudit_pipeline.kernel_spec import KERNELS_DIR, kernel_files, load_kernel_module

PROG = "kernaudit capture"
NVTX_PREFIX = "kernaudit"
GEMM_MODULE = "gemm"
# ANCHORS: the same 128x256x64 tile is clean on 8 warps (220 regs) and spills on 4 (255 regs).
GEMM_CLEAN = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8,
              "num_stages": 3}
GEMM_SPILL = {**GEMM_CLEAN, "num_warps": 4}
ANCHOR_IDS = (config_id(GEMM_CLEAN), config_id(GEMM_SPILL))

# The metrics the spill/stall/occupancy/roofline diagnostics read, by their ncu names. Only
# those that ``ncu --query-metrics`` lists on the host are requested (an unknown name aborts ncu).
WANTED_METRICS = (
    "launch__registers_per_thread",
    "launch__occupancy_limit_registers",
    "launch__occupancy_limit_shared_mem",
    "launch__occupancy_limit_warps",
    "launch__occupancy_limit_blocks",
    "launch__shared_mem_per_block_static",
    "launch__shared_mem_per_block_dynamic",
    "launch__shared_mem_config_size",
    "launch__grid_size",
    "launch__block_size",
    "launch__waves_per_multiprocessor",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__time_duration.sum",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "sm__maximum_warps_per_active_cycle_pct",
    "dram__bytes.sum",
    "derived__local_spilling_requests",
    "derived__local_spilling_requests_pct",
    "l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum",
    "l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum",
    "l1tex__t_requests_pipe_lsu_mem_local_op_ld.sum",
    "l1tex__t_requests_pipe_lsu_mem_local_op_st.sum",
    "sm__sass_inst_executed_op_local_ld.sum",
    "sm__sass_inst_executed_op_local_st.sum",
    "smsp__average_warp_latency_issue_stalled_lg_throttle",
    "smsp__average_warp_latency_issue_stalled_long_scoreboard",
    "smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
    "smsp__warp_issue_stalled_lg_throttle_per_warp_active.pct",
    "smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct",
    "smsp__pcsamp_warps_issue_stalled_lg_throttle",
    "smsp__pcsamp_warps_issue_stalled_long_scoreboard",
)
SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "MemoryWorkloadAnalysis")


# --------------------------------------------------------------------------------------------
# plan
# --------------------------------------------------------------------------------------------
def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def _local_bytes(row: dict) -> int:
    """Local memory per thread: ``stack_frame_bytes`` (older runner files: the spill columns)."""
    return int(row.get("stack_frame_bytes") or row.get("spill_stores_bytes") or 0)


def plan_targets(rows: list[dict], kernels_dir: Path = KERNELS_DIR,
                 shape_overrides: dict[str, str] | None = None) -> list[dict]:
    shape_overrides = shape_overrides or {}
    targets: list[dict] = []
    for path in kernel_files(kernels_dir):
        mod = load_kernel_module(path)
        shape = shape_overrides.get(path.stem) or shape_overrides.get(mod.NAME) or mod.SHAPES[0].name
        ids = {config_id(c): c for c in mod.CONFIGS}
        mine = [r for r in rows if r.get("record_type") == "run" and r.get("kernel_name") == mod.NAME]
        chosen: list[tuple[str, str]] = []
        ok = [r for r in mine if r.get("shape_name") == shape and r.get("run_status") == "OK"
              and r.get("latency_us")]
        if ok:
            chosen.append((min(ok, key=lambda r: r["latency_us"])["config_id"], "best"))
        else:  # no correct config: capture the fastest timed one, which the runner marked FAILED
            timed = [r for r in mine if r.get("shape_name") == shape and r.get("latency_us")]
            if timed:
                chosen.append((min(timed, key=lambda r: r["latency_us"])["config_id"],
                               "fastest_incorrect"))
        spilling = [r for r in mine if _local_bytes(r) > 0
                    and r.get("run_status") in ("OK", "PRUNED_SPILL", "FAILED_CORRECTNESS")]
        if spilling:
            chosen.append((max(spilling, key=_local_bytes)["config_id"], "most_spilling"))
        if path.stem == GEMM_MODULE:
            chosen += [(config_id(GEMM_CLEAN), "anchors_clean"), (config_id(GEMM_SPILL), "anchors_spill")]
        if not chosen and not rows:
            chosen.append((config_id(mod.CONFIGS[0]), "first"))
        seen = set()
        for cid, why in chosen:
            if cid in seen or cid not in ids:
                continue
            seen.add(cid)
            targets.append({"kernel_module": path.stem, "kernel_name": mod.NAME, "shape_name": shape,
                            "config_id": cid, "config": ids[cid], "why": why})
        targets.append({"kernel_module": path.stem, "kernel_name": mod.NAME, "shape_name": shape,
                        "config_id": "baseline", "config": None, "why": "baseline",
                        "baseline_name": mod.BASELINE_NAME})
    return targets


# --------------------------------------------------------------------------------------------
# launching the targets
# --------------------------------------------------------------------------------------------
def _label(t: dict) -> str:
    return f"{NVTX_PREFIX}:{t['kernel_name']}:{t['shape_name']}:{t['config_id']}"


def _prepared(targets: list[dict]) -> list[tuple[dict, Callable[[], object]]]:
    """Each target's inputs and a zero-argument launcher, compiled and run once (outside any
    profiled range). A target that fails here is reported and left out."""
    import torch

    out = []
    for i, t in enumerate(targets):
        mod = load_kernel_module(t["kernel_module"])
        shape = next(s for s in mod.SHAPES if s.name == t["shape_name"])
        try:
            inputs = mod.make_inputs(shape, "cuda", 1000 + i)
            if t["config"] is None:
                ref = references_of(mod)[0]
                prepared = ref.prepare(inputs) if ref.prepare is not None else inputs
                fn = (lambda r=ref, x=prepared: r.fn(x))
            else:
                res = mod.launch(inputs, t["config"])
                fn = (lambda m=mod, x=inputs, c=t["config"], o=res: m.launch(x, c, out=o))
            fn()
            torch.cuda.synchronize()
            out.append((t, fn))
            print(f"[capture] ready {_label(t)} ({t['why']})", flush=True)
        except Exception as exc:  # e.g. OutOfResources: the capture goes on without it
            print(f"[capture] skip {_label(t)}: {type(exc).__name__}: "
                  f"{str(exc).splitlines()[0] if str(exc) else ''}", flush=True)
            torch.cuda.empty_cache()
    return out


def mode_run(targets: list[dict], iters: int) -> int:
    import torch

    ready = _prepared(targets)
    for t, fn in ready:
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        torch.cuda.nvtx.range_push(_label(t))
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        torch.cuda.profiler.stop()
    print(f"[capture] ran {len(ready)} targets x {iters}", flush=True)
    return 0


def mode_torch(targets: list[dict], iters: int, out: Path) -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    ready = _prepared(targets)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for t, fn in ready:
            with record_function(_label(t)):
                for _ in range(iters):
                    fn()
                torch.cuda.synchronize()
    out.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(out))
    print(f"[capture] torch trace of {len(ready)} targets -> {out}", flush=True)
    return 0


def mode_proton(targets: list[dict], iters: int, out_stem: Path) -> int:
    import torch
    import triton.profiler as proton

    ready = _prepared(targets)
    out_stem.parent.mkdir(parents=True, exist_ok=True)
    proton.start(str(out_stem), hook="triton")
    try:
        for t, fn in ready:
            with proton.scope(_label(t)):
                for _ in range(iters):
                    fn()
                torch.cuda.synchronize()
    finally:
        proton.finalize()
    print(f"[capture] proton profile of {len(ready)} targets -> {out_stem}.hatchet", flush=True)
    return 0


def mode_references(out: Path, shape_overrides: dict[str, str], iters: int = 3) -> int:
    """Each reference of each kernel at one shape under torch.profiler; the trace and a summary
    of the GPU kernels each reference ran (``<out stem>.kernels.json``)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    ready = []
    for path in kernel_files():
        mod = load_kernel_module(path)
        wanted = shape_overrides.get(path.stem) or shape_overrides.get(mod.NAME)
        shape = next((s for s in mod.SHAPES if s.name == wanted), mod.SHAPES[0])
        for ref in references_of(mod):
            label = f"{NVTX_PREFIX}:{mod.NAME}:{shape.name}:{reference_config_id(ref.key)}"
            why = ref.unavailable() if ref.unavailable is not None else None
            if why:
                print(f"[capture] skip {label}: {why}", flush=True)
                continue
            try:
                inputs = mod.make_inputs(shape, "cuda", 7)
                prepared = ref.prepare(inputs) if ref.prepare is not None else inputs
                fn = (lambda r=ref, x=prepared: r.fn(x))
                fn()
                torch.cuda.synchronize()
                ready.append((label, ref, fn))
            except Exception as exc:  # recorded in the log; the other references go on
                print(f"[capture] skip {label}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                      flush=True)
                torch.cuda.empty_cache()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for label, _, fn in ready:
            with record_function(label):
                for _ in range(iters):
                    fn()
                torch.cuda.synchronize()
    out.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(out))
    summary = _kernels_by_range(json.loads(out.read_text()))
    for label, ref, _ in ready:
        kernels = summary.get(label, [])
        print(f"[capture] {label}: {classify_kernels(kernels)} <- {[k for k, _ in kernels[:2]]}", flush=True)
    out.with_suffix(".kernels.json").write_text(json.dumps(
        {label: {"declared_backend": ref.backend, "ran": classify_kernels(summary.get(label, [])),
                 "kernels": summary.get(label, [])[:5]} for label, ref, _ in ready}, indent=1))
    return 0


def _kernels_by_range(trace: dict) -> dict[str, list[tuple[str, float]]]:
    """GPU kernels per ``record_function`` range of a chrome trace, by the correlation of each
    kernel with the CPU launch inside the range's time span (largest total first)."""
    events = trace.get("traceEvents", [])
    ranges = [e for e in events if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith(NVTX_PREFIX)]
    launches = {e.get("args", {}).get("correlation"): e for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and e.get("args", {}).get("correlation") is not None}
    out: dict[str, dict[str, float]] = {}
    for k in (e for e in events if e.get("cat") == "kernel"):
        launch = launches.get(k.get("args", {}).get("correlation"))
        if launch is None:
            continue
        for r in ranges:
            if r["ts"] <= launch["ts"] <= r["ts"] + r.get("dur", 0):
                bucket = out.setdefault(r["name"], {})
                bucket[k["name"]] = bucket.get(k["name"], 0.0) + float(k.get("dur", 0.0))
    return {name: sorted(v.items(), key=lambda kv: -kv[1]) for name, v in out.items()}


def _ptxas_binary() -> str | None:
    import triton

    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if bundled.exists():
        return str(bundled)
    return shutil.which("ptxas") or (
        "/usr/local/cuda/bin/ptxas" if Path("/usr/local/cuda/bin/ptxas").exists() else None)


def mode_ptxas(targets: list[dict], out_dir: Path) -> int:
    import torch  # noqa: F401

    from kernaudit_pipeline.bench.compile import compile_static

    out_dir.mkdir(parents=True, exist_ok=True)
    ptxas = _ptxas_binary()
    print(f"[capture] ptxas: {ptxas}", flush=True)
    manifest = []
    for t in targets:
        if t["config"] is None:
            continue
        mod = load_kernel_module(t["kernel_module"])
        shape = next(s for s in mod.SHAPES if s.name == t["shape_name"])
        entry = {"kernel_name": t["kernel_name"], "shape_name": t["shape_name"],
                 "config_id": t["config_id"], "config": t["config"]}
        try:
            static, compiled = compile_static(mod, shape, t["config"], None, load=False)
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            manifest.append(entry)
            continue
        arch = getattr(compiled.metadata.target, "arch", 90)
        gpu_name = f"sm_{arch}a" if int(arch) >= 90 else f"sm_{arch}"
        entry.update(shared_mem_bytes=static.shared_mem_bytes, compiled_name=static.compiled_name,
                     gpu_name=gpu_name)
        if ptxas is not None and "ptx" in compiled.asm:
            with tempfile.TemporaryDirectory() as tmp:
                src = Path(tmp) / "kernel.ptx"
                src.write_text(compiled.asm["ptx"])
                proc = subprocess.run([ptxas, "-v", f"--gpu-name={gpu_name}", str(src), "-o",
                                       str(Path(tmp) / "kernel.cubin")],
                                      capture_output=True, text=True, timeout=600)
            log = out_dir / f"ptxas_{t['kernel_module']}_{t['config_id']}.log"
            log.write_text(proc.stdout + proc.stderr)
            entry.update(ptxas_log=log.name, ptxas_returncode=proc.returncode)
        if t["kernel_module"] == GEMM_MODULE and t["config_id"] in ANCHOR_IDS:
            # the LLVM IR is megabytes and says nothing the PTX and cubin do not
            files = [f for f in getattr(compiled, "metadata_group", {}).values()
                     if not str(f).endswith(".llir")]
            if files:
                dest = out_dir / "triton_cache" / Path(files[0]).parent.name
                dest.mkdir(parents=True, exist_ok=True)
                for f in files:
                    shutil.copy2(f, dest / Path(f).name)
                entry["triton_cache_dir"] = str(dest.relative_to(out_dir))
        manifest.append(entry)
        print(f"[capture] ptxas {t['kernel_name']} {t['config_id']}: "
              f"{entry.get('ptxas_log', entry.get('error', 'no ptxas'))}", flush=True)
    (out_dir / "ptxas_manifest.json").write_text(json.dumps(manifest, indent=1))
    return 0


def wanted_metrics(listing: str) -> list[str]:
    """The wanted metrics whose base name (before the first '.') ncu lists on this host."""
    names = set()
    for line in listing.splitlines():
        parts = line.split()
        if parts:
            names.add(parts[0].strip())
    return [m for m in WANTED_METRICS if m in names or m.split(".")[0] in names]


def cli(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog=PROG)
    p.add_argument("mode", choices=("plan", "run", "torch", "proton", "ptxas", "metrics", "references"))
    p.add_argument("--jsonl", help="runner JSONL to pick the best configs from (plan)")
    p.add_argument("--targets", help="targets JSON written by plan")
    p.add_argument("--out", help="output file, stem or directory")
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--shape", action="append", default=[], metavar="KERNEL=SHAPE",
                   help="capture this shape for this kernel (plan)")
    p.add_argument("--listing", help="saved `ncu --query-metrics` output (metrics)")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    try:
        if args.mode == "metrics":
            print(",".join(wanted_metrics(Path(args.listing).read_text())))
            return 0
        if args.mode == "references":
            return mode_references(Path(args.out), dict(s.split("=", 1) for s in args.shape), args.iters)
        if args.mode == "plan":
            rows = _read_jsonl(Path(args.jsonl)) if args.jsonl and Path(args.jsonl).exists() else []
            overrides = dict(s.split("=", 1) for s in args.shape)
            targets = plan_targets(rows, shape_overrides=overrides)
            Path(args.out).write_text(json.dumps(targets, indent=1))
            for t in targets:
                print(f"[capture] target {_label(t)} ({t['why']})")
            return 0
        targets = json.loads(Path(args.targets).read_text())
        if args.mode == "run":
            return mode_run(targets, args.iters)
        if args.mode == "torch":
            return mode_torch(targets, args.iters, Path(args.out))
        if args.mode == "proton":
            return mode_proton(targets, args.iters, Path(args.out))
        if args.mode == "ptxas":
            return mode_ptxas(targets, Path(args.out))
    except (OSError, ValueError, KeyError) as exc:
        print(f"{PROG}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        print(f"[capture] {args.mode} took {time.perf_counter() - t0:.1f} s", flush=True)
    return 2


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
