"""``kernaudit bench``: time each kernel's configs, paired against its references, on a GPU.

Runs as ``kernaudit bench [KERNEL ...] [options]`` or ``python -m kernaudit_pipeline.bench.runner``
on any GPU host with torch, triton and numpy. The options are in ``cli/bench.py``. In order:

1. plan: each kernel module is imported by a ``plan`` worker (never by this process), killed
   at ``--timeout-s`` if its import or its config/shape code hangs;
2. peaks: the measured ceilings (copy bandwidth, cuBLAS bf16, fp8 ``_scaled_mm``);
3. precompile: every (config, shape) compiled in parallel processes into Triton's cache;
4. per kernel, a ``sweep`` worker (respawned after a crash): per shape, the references, then
   each config compiled, pruned, checked and timed in pairs against the primary reference
   (``bench/sweep.py``), the other references against the best configs;
5. a ``summary`` line and a short table.

The JSONL schema is in ``bench/records.py``; the timing method in ``bench/timing.py`` and
``bench/paired.py``; the clock guard in ``bench/clocks.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from kernaudit_pipeline.bench.options import FAKE_DEVICE_ENV, QUICK, BenchOptions
from kernaudit_pipeline.bench.plan import KernelPlan
from kernaudit_pipeline.bench.records import DeviceInfo
from kernaudit_pipeline.bench.summary import print_table, summary_record
from kernaudit_pipeline.bench.supervisor import (
    Group, Sweep, plan_failure_row, plan_kernels, precompile, run_group, run_peaks,
)
from kernaudit_pipeline.core.configs import config_id
from kernaudit_pipeline.kernel_spec import kernel_files


class BenchError(Exception):
    """Input the user can fix: one line, exit 2."""


def nvidia_smi_query(fields: str) -> list[str] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    first = out.strip().splitlines()[0] if out.strip() else ""
    return [p.strip() for p in first.split(",")] if first else None


def options_from(args) -> BenchOptions:
    # timing options left unset take --quick's value under --quick, else the default (options.py)
    base = QUICK if args.quick else BenchOptions()
    timing = {name: getattr(base, name) if getattr(args, name) is None else getattr(args, name)
              for name in ("min_samples", "max_seconds_per_config", "min_blocks", "min_time_s")}
    given = {**vars(args), **timing}
    for name in ("rsd_target", "max_seconds_per_config", "timeout_s", "min_time_s", "speedup_rsd_target"):
        if given[name] <= 0:
            raise BenchError(f"--{name.replace('_', '-')} must be positive")
    if not 0 < args.clock_fraction <= 1:
        raise BenchError("--clock-fraction must be in (0, 1]")
    if args.between_run_rsd < 0:
        raise BenchError("--between-run-rsd must be >= 0")
    if timing["min_blocks"] < 2:
        raise BenchError("--min-blocks must be at least 2")
    return BenchOptions(
        rsd_target=args.rsd_target, **timing,
        speedup_rsd_target=args.speedup_rsd_target, between_run_rsd=args.between_run_rsd,
        clock_fraction=args.clock_fraction, cuda_graph=args.cuda_graph,
        cuda_graph_below_us=args.cuda_graph_below_us, references_top_k=args.references_top_k,
        probe_backends=not args.no_backend_probe, prune=not args.no_prune,
        spill_threshold_bytes=args.spill_threshold_bytes, timeout_s=args.timeout_s,
        device="cpu" if os.environ.get(FAKE_DEVICE_ENV) == "cpu" else "cuda")


def resolve(names: list[str], kernels_dir: Path, work_dir: Path, timeout_s: float,
            deadline: float) -> tuple[list[KernelPlan], list]:
    """Plans of the named kernels (file stems or NAMEs; all by default) and plan failures."""
    files = kernel_files(kernels_dir)
    if not files:
        raise BenchError(f"no kernel modules in {kernels_dir}")
    stems = {p.stem: p for p in kernel_files(kernels_dir, heldout=True)}  # held-out: by name only
    wanted = files if not names or not all(n in stems for n in names) else [stems[n] for n in dict.fromkeys(names)]
    plans, failures = plan_kernels(wanted, work_dir, timeout_s, deadline)
    if not names or all(n in stems for n in names):
        return plans, failures
    picked, seen = [], set()
    for name in names:
        match = [p for p in plans if name in (p.stem, p.name)]
        failed = [f for f in failures if f.path.stem == name]
        if not match and not failed:
            known = ", ".join(sorted(stems))
            raise BenchError(f"unknown kernel {name!r} (known: {known})"
                             + (f"; {len(failures)} modules could not be planned" if failures else ""))
        for p in match:
            if p.stem not in seen:
                seen.add(p.stem)
                picked.append(p)
    return picked, [f for f in failures if f.path.stem in names]


def select(plans: list[KernelPlan], args) -> list[Group]:
    groups = []
    for plan in plans:
        shapes = [s.shape.name for s in plan.shapes]
        if args.shapes:
            shapes = [s for s in shapes if s in args.shapes]
        elif args.quick:
            shapes = shapes[:1]
        configs = [config_id(c) for c in plan.configs]
        if args.configs:
            configs = [c for c in configs if c in args.configs]
        if args.max_configs is not None:
            configs = configs[:args.max_configs]
        if shapes:
            groups.append(Group(plan, shapes, configs))
    return groups


def device_info(options: BenchOptions) -> DeviceInfo:
    """What the parent knows about the device (the workers fill in the rest)."""
    if options.device == "cpu":
        return DeviceInfo(device_name="fake-cpu (test double)")
    import torch

    if not torch.cuda.is_available():
        raise BenchError(f"no CUDA GPU visible (torch {torch.__version__}, "
                         "torch.cuda.is_available() is False)")
    import triton

    smi = nvidia_smi_query("name,driver_version,compute_cap")
    props = torch.cuda.get_device_properties(0)
    return DeviceInfo(device_name=props.name, compute_capability=f"{props.major}.{props.minor}",
                      sm_count=int(props.multi_processor_count),
                      max_shared_mem_bytes=int(getattr(props, "shared_memory_per_block_optin", 0)) or None,
                      driver_version=smi[1] if smi and len(smi) > 1 else None,
                      cuda_version=torch.version.cuda, torch_version=torch.__version__,
                      triton_version=triton.__version__)


def open_sweep(out: Path, options, deadline: float, work: Path) -> Sweep:
    """The sweep's state, with ``out`` emptied for its rows and the device read once."""
    device = device_info(options)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("")
    return Sweep(out=out, options=options, deadline=deadline, work_dir=work,
                 driver_version=device.driver_version, device=device)


def run_bench(args, argv: list[str]) -> int:
    options = options_from(args)
    started_wall = time.time()
    deadline = time.monotonic() + (args.deadline_s if args.deadline_s else 10 * 86400)
    with tempfile.TemporaryDirectory(prefix="kernaudit-bench-") as tmp:
        work = Path(tmp)
        plans, failures = resolve(list(args.kernels), Path(args.kernels_dir), work, options.timeout_s, deadline)
        groups = select(plans, args)
        if not groups and not failures:
            raise BenchError("no (kernel, shape) pairs match the filters")
        sweep = open_sweep(Path(args.out), options, deadline, work)
        device = sweep.device
        for failure in failures:
            print(f"[bench] {failure.message}", flush=True)
            sweep.emit(plan_failure_row(failure, device))
        if not args.no_peaks and options.device == "cuda":
            run_peaks(sweep)
        jobs = args.jobs if args.jobs is not None else max(1, min(12, (os.cpu_count() or 2) - 2))
        precompile(groups, sweep, jobs, args.precompile_s)
        for group in groups:
            print(f"[bench] {group.plan.name}: {len(group.shapes)} shapes x {len(group.configs)} configs",
                  flush=True)
            run_group(group, sweep)
        summary = summary_record(sweep, started_wall, argv, args.deadline_s,
                                 sorted({g.plan.name for g in groups}),
                                 sorted({s for g in groups for s in g.shapes}))
        sweep.emit(summary)
    print_table(sweep.rows)
    print(f"[bench] wrote {len(sweep.rows)} rows to {sweep.out} (sweep {summary['sweep_wall_s']:.1f} s, "
          f"GPU busy {summary['gpu_busy_s']:.1f} s, options {asdict(options)['device']})")
    if failures and not groups:  # nothing was timed: a run that only says why is a failed run
        print(f"kernaudit bench: nothing to time: {len(failures)} kernel module(s) could not be "
              f"planned; their rows in {sweep.out} say why", file=sys.stderr)
        return 1
    if failures:
        print(f"kernaudit bench: {len(failures)} kernel module(s) could not be planned; "
              "their rows say why", file=sys.stderr)
    return 0


if __name__ == "__main__":
    from kernaudit_pipeline.cli import main

    sys.exit(main(["bench", *sys.argv[1:]]))
