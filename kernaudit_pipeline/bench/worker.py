"""The worker process: the only place a kernel module is imported and its code run.

``python -m kernaudit_pipeline.bench.worker SPEC.json`` runs one of five modes:

- ``plan``: import the kernel module and write its :class:`~kernaudit_pipeline.bench.plan.KernelPlan`
  (shapes, configs, grids, FLOP and byte counts, references) for the parent;
- ``sweep``: one kernel's shapes (``bench/sweep.py``), rows appended to ``rows_path`` as they
  finish, the step in flight written to ``progress_path`` for the supervisor;
- ``serve``: a ``sweep`` worker that stays up for one batch after another (``bench --search``);
- ``precompile``: fill Triton's on-disk cache for a slice of (config, shape) pairs;
- ``peaks``: the measured ceilings (``bench/peaks.py``).

Each step writes its progress marker before it starts, so when the parent kills a worker that
ran over ``--timeout-s`` (start-up included: importing the module, calling ``compile_args``)
it knows which config or reference to blame. A worker exits with :data:`EXIT_CUDA_FATAL` after
an error that leaves the CUDA context unusable.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kernaudit_pipeline.bench.options import BenchOptions
from kernaudit_pipeline.bench.records import to_json_line

EXIT_CUDA_FATAL = 3


class Writer:
    """Appends one line per record and flushes, so a crash loses nothing written."""

    def __init__(self, path: Path, progress: Path | None = None):
        self.path = path
        self.progress = progress

    def write(self, record: object) -> None:
        with self.path.open("a") as fh:
            fh.write(to_json_line(record) + "\n")

    def mark(self, what: str) -> None:
        if self.progress is not None:
            self.progress.write_text(what)
        print(f"[bench] {what}", flush=True)


def plan_worker(spec: dict) -> int:
    from kernaudit_pipeline.bench.plan import plan_module
    from kernaudit_pipeline.kernel_spec import load_kernel_module

    writer = Writer(Path(spec["rows_path"]), Path(spec["progress_path"]))
    writer.mark("import")
    path = Path(spec["kernel_path"])
    mod = load_kernel_module(path)
    writer.mark("plan")
    Path(spec["plan_path"]).write_text(plan_module(path, mod).to_json())
    writer.mark("done")
    return 0


def _sweep_items(spec: dict, mod, plan, backend, writer: Writer) -> int:
    """Sweep the (shape, config) items of one spec with a module and a device already set up:
    a ``sweep`` worker's one run, or one batch of a ``serve`` worker."""
    import numpy as np

    from kernaudit_pipeline.bench.sweep import DEADLINE_BEFORE_PREPARE, Context, FatalCudaError, skip_shape, sweep_shape

    opts = BenchOptions(**spec["options"])
    attempt = int(spec.get("attempt", 0))
    ctx = Context(mod=mod, kinfo=plan.info, dev=backend.device_info(spec.get("driver_version")),
                  writer=writer, backend=backend, opts=opts, attempt=attempt,
                  seed=opts.seed + 7919 * attempt, rng=np.random.default_rng(opts.seed + attempt),
                  deadline=spec.get("deadline_epoch"))
    by_shape: dict[str, list[str]] = {}
    for shape_name, cid in spec["items"]:
        by_shape.setdefault(shape_name, []).append(cid)
    refs_done = spec.get("references_done", {})
    failed_refs = spec.get("failed_references", {})
    try:
        for shape_name in spec["shapes"]:
            ctx.failed_refs = dict(failed_refs.get(shape_name, {}))
            if ctx.past_deadline():
                skip_shape(ctx, plan.shape(shape_name), by_shape.get(shape_name, []), DEADLINE_BEFORE_PREPARE)
                continue
            sweep_shape(ctx, plan.shape(shape_name), by_shape.get(shape_name, []),
                        refs_done.get(shape_name, {}))
    except FatalCudaError as exc:
        print(f"[bench] CUDA context unusable, worker exits: {exc}", flush=True)
        return EXIT_CUDA_FATAL
    writer.mark("done")
    return 0


def _set_up(spec: dict, writer: Writer):
    """Import the kernel module and open the device: what every run of a ``sweep`` worker
    pays before its first config (about 6 s of torch and triton imports on the H100 host)."""
    from kernaudit_pipeline.bench.plan import KernelPlan
    from kernaudit_pipeline.bench.timing import make_backend
    from kernaudit_pipeline.kernel_spec import load_kernel_module

    opts = BenchOptions(**spec["options"])
    writer.mark("import")
    plan = KernelPlan.from_json(Path(spec["plan_path"]).read_text())
    mod = load_kernel_module(Path(plan.path))
    writer.mark("device")
    return plan, mod, make_backend(opts.device, opts.clock_fraction)


def sweep_worker(spec: dict) -> int:
    writer = Writer(Path(spec["rows_path"]), Path(spec["progress_path"]))
    plan, mod, backend = _set_up(spec, writer)
    return _sweep_items(spec, mod, plan, backend, writer)


def serve_worker(spec: dict) -> int:
    """A sweep worker that stays up for batch after batch of one kernel (``kernaudit bench
    --search``): set up once, then for each ``<n>.json`` that appears in ``inbox`` (a sweep
    spec with its own rows and progress files), sweep it and write ``<n>.done`` holding the
    exit code a ``sweep`` worker would have returned; ``<n>.stop`` ends it. A batch that ends
    the CUDA context ends the worker with that code, as a ``sweep`` worker would. It runs in a
    session of its own (the supervisor kills it by process group), so it also ends when its
    parent is gone: killed with its command, it must not hold the GPU waiting for a batch."""
    import os
    import time

    parent = os.getppid()
    writer = Writer(Path(spec["rows_path"]), Path(spec["progress_path"]))
    plan, mod, backend = _set_up(spec, writer)
    inbox = Path(spec["inbox"])
    writer.mark("ready")
    n = 0
    while True:
        batch, stop = inbox / f"{n}.json", inbox / f"{n}.stop"
        while not batch.exists() and not stop.exists():
            if os.getppid() != parent:
                print("[bench] the supervisor is gone; serving worker exits", flush=True)
                return 0
            time.sleep(0.01)
        if stop.exists():
            return 0
        item = json.loads(batch.read_text())
        rc = _sweep_items(item, mod, plan, backend, Writer(Path(item["rows_path"]), Path(item["progress_path"])))
        if rc != 0:
            return rc
        (inbox / f"{n}.done").write_text(str(rc))
        n += 1


def precompile_worker(spec: dict) -> int:
    """Fill Triton's on-disk cache for a slice of (kernel, config) x shapes, in parallel with
    other such workers, so the timed sweep does not wait on one compile at a time."""
    from kernaudit_pipeline.bench.compile import compile_static
    from kernaudit_pipeline.bench.correctness import first_line
    from kernaudit_pipeline.bench.plan import KernelPlan
    from kernaudit_pipeline.kernel_spec import load_kernel_module

    done = 0
    for task in spec["tasks"]:
        plan = KernelPlan.from_json(Path(task["plan_path"]).read_text())
        mod = load_kernel_module(Path(plan.path))
        config = plan.config(task["config_id"])
        for shape_name in task["shapes"]:
            try:
                compile_static(mod, plan.shape(shape_name).shape, config, None, load=False)
                done += 1
            except Exception as exc:  # the timed sweep records it properly
                print(f"[precompile] {plan.name} {task['config_id']} {shape_name}: "
                      f"{first_line(exc, 160)}", flush=True)
    print(f"[precompile] {done} compiles", flush=True)
    return 0


def peaks_worker(spec: dict) -> int:
    from kernaudit_pipeline.bench import peaks
    from kernaudit_pipeline.bench.timing import make_backend

    opts = BenchOptions(**spec["options"])
    writer = Writer(Path(spec["rows_path"]), Path(spec["progress_path"]))
    writer.mark("device")
    backend = make_backend(opts.device, opts.clock_fraction)
    dev = backend.device_info(spec.get("driver_version"))
    for record in peaks.measure_peaks(dev, backend, opts.rule, writer.mark):
        writer.write(record)
    writer.mark("done")
    return 0


MODES = {"plan": plan_worker, "sweep": sweep_worker, "serve": serve_worker, "precompile": precompile_worker,
         "peaks": peaks_worker}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m kernaudit_pipeline.bench.worker SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    mode = MODES.get(spec.get("mode"))
    if mode is None:
        print(f"unknown worker mode {spec.get('mode')!r}", file=sys.stderr)
        return 2
    return mode(spec)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
