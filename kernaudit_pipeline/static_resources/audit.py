"""Sweeps: describe the kernel modules, then compile every (config, shape) not already cached.

Both steps run in one :class:`~.workers.WorkerPool`. Describing a module (importing it, calling
``compile_args``) happens in a worker under the same deadline as a compile, and so does a
worker's start-up, so neither a module that hangs at import nor one that hangs in
``compile_args`` can hang the audit: it becomes a one-line failure for that module.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any, Iterable

from kernaudit_pipeline.core.configs import config_id
from kernaudit_pipeline.core.progress import Progress
from kernaudit_pipeline.kernel_spec import Shape, kernel_files
from kernaudit_pipeline.settings import data_paths
from kernaudit_pipeline.static_resources.tasks import HANDLER
from kernaudit_pipeline.static_resources.cache import (
    CachedOutcome, cache_key, jsonable_spec, read_entry, write_entry,
)
from kernaudit_pipeline.static_resources.describe import KernelDescription, pick
from kernaudit_pipeline.static_resources.results import (
    ARCHS, CompileStatus, StaticResult, make_result,
)
from kernaudit_pipeline.static_resources.workers import Outcome, OutcomeKind, WorkerPool

DEFAULT_TIMEOUT_S = 300.0
# Importing a kernel module and running its compile_args over the space: seconds, not minutes.
DEFAULT_MODULE_TIMEOUT_S = 60.0
ModuleRef = ModuleType | str | Path | KernelDescription


class UnknownKernel(LookupError):
    """A kernel asked for by a name no module in ``kernels/`` has, or a path that is not there."""


class KernelLoadError(RuntimeError):
    """A kernel module could not be described (it failed or hung at import or in
    ``compile_args``); the message is one line."""


@dataclass(frozen=True)
class PlanItem:
    """One kernel's share of a sweep. ``configs``/``shapes`` take objects or ids/names; None
    means the module's own (and only its first shape unless ``all_shapes``)."""

    module: ModuleRef
    configs: list[dict | str] | None = None
    shapes: list[Shape | str] | None = None
    all_shapes: bool = False


@dataclass(frozen=True)
class KernelFailure:
    module: str
    reason: str


@dataclass(frozen=True)
class SweepReport:
    results: list[StaticResult]
    descriptions: list[KernelDescription]
    failures: list[KernelFailure]


def triton_version() -> str:
    try:
        return metadata.version("triton")
    except metadata.PackageNotFoundError:
        return "unknown"


def module_path(ref: ModuleRef) -> Path | None:
    """The file behind ``ref``; None when ``ref`` is a kernel NAME (known only by describing)."""
    if isinstance(ref, KernelDescription):
        return Path(ref.path)
    if isinstance(ref, ModuleType):
        return Path(ref.__file__).resolve()
    text = str(ref)
    if text.endswith(".py") or os.sep in text:
        path = Path(text)
        if not path.is_file():
            raise UnknownKernel(f"no kernel module {text}")
        return path.resolve()
    for path in kernel_files(heldout=True):
        if path.stem == text:
            return path.resolve()
    return None


class _Progress:
    """core.progress's bar: rich on a terminal, plain lines with done/total and an ETA otherwise."""

    def __init__(self, total: int, label: str, enabled: bool) -> None:
        self.total, self.done = total, 0
        self._bar = Progress(label, total) if enabled and total > 0 else None
        if self._bar is not None:
            self._bar.__enter__()

    def advance(self, text: str) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.advance(note=text)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)


class _LazyPool:
    """The pool is started only when a worker is needed (a fully cached sweep of described
    modules starts none)."""

    def __init__(self, max_workers: int, timeout_s: float, env: dict[str, str]) -> None:
        self.args = (max_workers, timeout_s, env)
        self.pool: WorkerPool | None = None

    def get(self) -> WorkerPool:
        if self.pool is None:
            max_workers, timeout_s, env = self.args
            self.pool = WorkerPool(HANDLER, max_workers=max_workers,
                                   start_timeout_s=timeout_s, env=env)
        return self.pool

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


def _describe_failure(outcome: Outcome, timeout_s: float) -> str:
    if outcome.kind is OutcomeKind.TIMEOUT:
        return (f"import or compile_args did not finish within {timeout_s:g} s; "
                "the module was not audited")
    if outcome.kind is OutcomeKind.NOT_STARTED:
        return f"compile {outcome.message}"
    if outcome.kind is OutcomeKind.DIED:
        return f"the {outcome.message} while importing the module or running compile_args"
    return f"cannot load: {outcome.message}"


def _describe(requests: list[tuple[str, Path, list | None, list | None]], pool: _LazyPool,
              timeout_s: float) -> dict[str, KernelDescription | KernelFailure]:
    """``(key, path, configs, shapes)`` -> a description or a failure per key."""
    if not requests:
        return {}
    tasks = [{"kind": "describe", "key": key, "module_path": str(path), "configs": configs,
              "shapes": shapes} for key, path, configs, shapes in requests]
    outcomes = pool.get().run(tasks, timeout_s=timeout_s)
    out: dict[str, KernelDescription | KernelFailure] = {}
    for key, path, _, _ in requests:
        o = outcomes[key]
        out[key] = o.payload if o.kind is OutcomeKind.OK else KernelFailure(
            path.name, _describe_failure(o, timeout_s))
    return out


def describe_kernels(refs: Iterable[ModuleRef], *, timeout_s: float = DEFAULT_TIMEOUT_S,
                     max_workers: int | None = None, pool: _LazyPool | None = None,
                     module_timeout_s: float | None = None) -> list[KernelDescription | KernelFailure]:
    """One description (or failure) per ref, in order; names are matched against every
    module's ``NAME`` (which means describing every module in ``kernels/``). ``timeout_s``
    bounds a worker's start-up, ``module_timeout_s`` (default: the smaller of 60 s and
    ``timeout_s``) the import and compile_args of one module."""
    module_timeout_s = module_timeout_s or min(DEFAULT_MODULE_TIMEOUT_S, timeout_s)
    refs = list(refs)
    own = pool is None
    pool = pool or _LazyPool(max(1, max_workers or os.cpu_count() or 1), timeout_s, _worker_env(True))
    try:
        paths: list[Path | None] = [module_path(r) for r in refs]
        requests = [(f"d{i}", p, None, None) for i, (r, p) in enumerate(zip(refs, paths))
                    if p is not None and not isinstance(r, KernelDescription)]
        if any(p is None for p in paths):
            requests += [(f"k:{p}", p, None, None) for p in kernel_files()
                         if all(p.resolve() != q for q in paths)]
        got = _describe(requests, pool, module_timeout_s)
        by_name = {d.name: d for d in got.values() if isinstance(d, KernelDescription)}
        by_name.update({d.stem: d for d in got.values() if isinstance(d, KernelDescription)})
        out: list[KernelDescription | KernelFailure] = []
        for i, (ref, path) in enumerate(zip(refs, paths)):
            if isinstance(ref, KernelDescription):
                out.append(ref)
            elif path is not None:
                out.append(got[f"d{i}"])
            elif str(ref) in by_name:
                out.append(by_name[str(ref)])
            else:
                known = sorted({d.name for d in got.values() if isinstance(d, KernelDescription)})
                raise UnknownKernel(f"unknown kernel {str(ref)!r} (known: {', '.join(known) or 'none'})")
        return out
    finally:
        if own:
            pool.close()


def _worker_env(use_cache: bool) -> dict[str, str]:
    env = {"TRITON_CACHE_DIR": str(data_paths().root / "triton_cache")}
    if not use_cache:
        env["TRITON_ALWAYS_COMPILE"] = "1"
    return env


def sweep_report(plan: list[PlanItem], *, arch: str = "sm_90", timeout_s: float = DEFAULT_TIMEOUT_S,
                 max_workers: int | None = None, cache_dir: str | Path | None = None,
                 use_cache: bool = True, progress: bool = True,
                 module_timeout_s: float | None = None) -> SweepReport:
    """Describe each item's module (unless it is a description already), then compile what the
    cache lacks. A module that cannot be described is a :class:`KernelFailure`, not rows.
    ``timeout_s`` bounds each compile and each worker's start-up; ``module_timeout_s`` (default:
    the smaller of 60 s and ``timeout_s``) a module's import and compile_args."""
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r} (known: {', '.join(ARCHS)})")
    if timeout_s <= 0:
        raise ValueError("timeout_s must be positive")
    spec_arch = ARCHS[arch]
    cache = Path(cache_dir) if cache_dir is not None else data_paths().static_cache
    version = triton_version()
    module_timeout_s = module_timeout_s or min(DEFAULT_MODULE_TIMEOUT_S, timeout_s)
    pool = _LazyPool(max(1, max_workers or os.cpu_count() or 1), timeout_s, _worker_env(use_cache))
    try:
        # Items naming their configs/shapes as objects describe exactly those (they may be
        # outside the module's own space); the rest describe the whole space.
        refs = [item.module if (item.configs is None or all(isinstance(c, str) for c in item.configs))
                and (item.shapes is None or all(isinstance(s, str) for s in item.shapes))
                else _Explicit(item) for item in plan]
        explicit = [(f"x{i}", module_path(r.item.module), r.item.configs, r.item.shapes)
                    for i, r in enumerate(refs) if isinstance(r, _Explicit)]
        got = _describe(explicit, pool, module_timeout_s)
        plain = describe_kernels([r for r in refs if not isinstance(r, _Explicit)],
                                 timeout_s=timeout_s, pool=pool, module_timeout_s=module_timeout_s)
        plain_iter = iter(plain)
        described = [got[f"x{i}"] if isinstance(r, _Explicit) else next(plain_iter)
                     for i, r in enumerate(refs)]

        rows: list[dict] = []
        tasks: dict[str, dict] = {}
        outcomes: dict[str, CachedOutcome] = {}
        from_cache: set[str] = set()
        failures = [d for d in described if isinstance(d, KernelFailure)]
        descriptions = [d for d in described if isinstance(d, KernelDescription)]
        for item, desc in zip(plan, described):
            if isinstance(desc, KernelFailure):
                continue
            cfgs = pick(list(desc.configs), item.configs, config_id, f"config for {desc.name}",
                        objects_must_exist=True)
            shapes = pick(list(desc.shapes), item.shapes, lambda s: s.name, f"shape for {desc.name}",
                          objects_must_exist=True)
            if item.shapes is None and not item.all_shapes:
                shapes = shapes[:1]
            for cfg in cfgs:
                for shape in shapes:
                    row = {"kernel_name": desc.name, "config": cfg, "shape_name": shape.name,
                           "kernel_source_hash": desc.source_hash}
                    rows.append(row)
                    pair = desc.pairs[(config_id(cfg), shape.name)]
                    if pair.spec is None:
                        row["key"] = f"unspecializable:{len(rows)}"
                        outcomes[row["key"]] = CachedOutcome(CompileStatus.COMPILE_ERROR, pair.error, {})
                        continue
                    key = row["key"] = cache_key(desc.source_hash, cfg, pair.spec, arch, version)
                    if key in tasks or key in outcomes:
                        continue
                    if use_cache and (hit := read_entry(cache / f"{key}.json")) is not None:
                        outcomes[key] = hit
                        from_cache.add(key)
                        continue
                    spec = pair.spec
                    tasks[key] = {
                        "kind": "compile", "key": key, "module_path": desc.path,
                        "signature": spec.signature, "constexprs": spec.constexprs,
                        "attrs": spec.attrs, "capability": spec_arch.capability,
                        "num_warps": cfg.get("num_warps", 4), "num_stages": cfg.get("num_stages", 3),
                        "force": not use_cache, "label": f"{desc.name} {config_id(cfg)}",
                        "key_fields": {"kernel_name": desc.name, "kernel_source_hash": desc.source_hash,
                                       "config": cfg, "arch": arch, "triton_version": version,
                                       "specialization": jsonable_spec(spec)},
                    }
        if tasks:
            outcomes.update(_compile(list(tasks.values()), pool.get(), cache, timeout_s, arch, progress))
    finally:
        pool.close()
    results = [make_result(kernel_name=row["kernel_name"], config=row["config"],
                           shape_name=row["shape_name"], arch=spec_arch,
                           status=outcomes[row["key"]].status, message=outcomes[row["key"]].message,
                           numbers=outcomes[row["key"]].numbers, triton_version=version,
                           kernel_source_hash=row["kernel_source_hash"], cached=row["key"] in from_cache)
               for row in rows]
    return SweepReport(results, descriptions, failures)


@dataclass(frozen=True)
class _Explicit:
    item: PlanItem


def _compile(tasks: list[dict], pool: WorkerPool, cache: Path, timeout_s: float, arch: str,
             progress: bool) -> dict[str, CachedOutcome]:
    bar = _Progress(len(tasks), f"compiling for {arch}", progress)
    out: dict[str, CachedOutcome] = {}

    def on_done(task: dict, o: Outcome) -> None:
        if o.kind is OutcomeKind.OK:
            result = CachedOutcome(CompileStatus.OK, "", o.payload)
            write_entry(cache / f"{task['key']}.json", result, task["key_fields"])
        elif o.kind is OutcomeKind.TIMEOUT:
            result = CachedOutcome(CompileStatus.COMPILE_TIMEOUT, f"compile {o.message}",
                                   {"compile_seconds": o.seconds})
        elif o.kind is OutcomeKind.ERROR:
            result = CachedOutcome(CompileStatus.COMPILE_ERROR, o.message, {"compile_seconds": o.seconds})
            if o.deterministic:
                write_entry(cache / f"{task['key']}.json", result, task["key_fields"])
        elif o.kind is OutcomeKind.DIED:
            result = CachedOutcome(CompileStatus.COMPILE_ERROR, f"compile {o.message} while compiling", {})
        else:
            result = CachedOutcome(CompileStatus.COMPILE_ERROR, f"compile {o.message}", {})
        out[task["key"]] = result
        bar.advance(f"{task['label']} {result.status.value}")

    try:
        pool.run(tasks, timeout_s=timeout_s, on_done=on_done)
    finally:
        bar.close()
    return out


def sweep(plan: list[PlanItem], **kwargs: Any) -> list[StaticResult]:
    """:func:`sweep_report`'s rows; raises :class:`KernelLoadError` if a module failed."""
    report = sweep_report(plan, **kwargs)
    if report.failures:
        raise KernelLoadError("; ".join(f"{f.module}: {f.reason}" for f in report.failures))
    return report.results


def audit_all(modules: Iterable[ModuleRef] | None = None, shapes: list[Shape | str] | None = None,
              configs: list[dict | str] | None = None, arch: str = "sm_90",
              timeout_s: float = DEFAULT_TIMEOUT_S, max_workers: int | None = None,
              cache_dir: str | Path | None = None, *, all_shapes: bool = False,
              use_cache: bool = True, progress: bool = True) -> list[StaticResult]:
    """One sweep over several kernels (all of ``kernels/`` by default) sharing one worker pool;
    ``shapes``/``configs`` apply to every kernel given."""
    plan = [PlanItem(m, configs, shapes, all_shapes)
            for m in (modules if modules is not None else kernel_files())]
    return sweep(plan, arch=arch, timeout_s=timeout_s, max_workers=max_workers,
                 cache_dir=cache_dir, use_cache=use_cache, progress=progress)


def audit_kernel(module_or_name: ModuleRef, shapes: list[Shape | str] | None = None,
                 configs: list[dict | str] | None = None, arch: str = "sm_90",
                 timeout_s: float = DEFAULT_TIMEOUT_S, max_workers: int | None = None,
                 cache_dir: str | Path | None = None, *, all_shapes: bool = False,
                 use_cache: bool = True, progress: bool = True) -> list[StaticResult]:
    """Compile every config of one kernel; one row per (config, shape).

    By default only the kernel's first shape is compiled: the shape reaches the compiler only
    through ``compile_args`` (which integers are 1 or divisible by 16, which strides are 1), and
    the audited shapes specialize alike, so further shapes would repeat the same binary.
    ``all_shapes`` compiles each shape; shapes that specialize alike still share one compile
    (and one cache entry). ``use_cache=False`` recompiles everything, bypassing Triton's cache
    too, and refreshes the cache entries.
    """
    return audit_all([module_or_name], shapes=shapes, configs=configs, arch=arch,
                     timeout_s=timeout_s, max_workers=max_workers, cache_dir=cache_dir,
                     all_shapes=all_shapes, use_cache=use_cache, progress=progress)


def resolve_kernel(module_or_name: ModuleType | str | Path) -> ModuleType:
    """Import a kernel module in this process: a module, a path, a ``kernels/`` stem or a
    ``NAME``. For callers that need the module object itself (the recommendation verifier);
    the sweep never calls it."""
    from kernaudit_pipeline.kernel_spec import load_kernel_module  # noqa: PLC0415

    if isinstance(module_or_name, ModuleType):
        return module_or_name
    path = module_path(module_or_name)
    if path is not None:
        return load_kernel_module(path)
    text = str(module_or_name)
    known = []
    for path in kernel_files(heldout=True):
        try:
            mod = load_kernel_module(path)
        except Exception:  # a module being written or broken is not the one asked for
            continue
        if getattr(mod, "NAME", path.stem) == text:
            return mod
        known.append(getattr(mod, "NAME", path.stem))
    raise UnknownKernel(f"unknown kernel {text!r} (known: {', '.join(known) or 'none'})")
