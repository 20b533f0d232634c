"""What a kernel module declares, read inside a worker: its configs, shapes, roofline counts,
launch grids and the specialization each (config, shape) compiles to.

Why in a worker: importing a kernel module runs its code, and so does ``compile_args``. Either
can hang or crash; the parent only ever sees this description (plain data), produced under a
deadline (see :mod:`.workers`). The cost model (``kernaudit_pipeline.rank``) reads the same
description, so ranking a space never imports the module in the parent either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from kernaudit_pipeline.core.configs import config_id
from kernaudit_pipeline.kernel_spec import (
    ContractError, Shape, Specialization, check_declarations, load_kernel_module, source_hash,
    specialize,
)


@dataclass(frozen=True)
class Pair:
    """One (config, shape): the specialization to compile, or why there is none, and the grid."""

    spec: Specialization | None
    error: str = ""
    grid: tuple[int, ...] | None = None


@dataclass(frozen=True)
class KernelDescription:
    """A kernel module as data. ``configs``/``shapes`` are the requested ones (the module's own
    by default), ``pairs`` covers every requested (config id, shape name)."""

    path: str
    name: str
    dtype: str
    baseline_name: str
    source_hash: str
    configs: tuple[dict, ...]
    shapes: tuple[Shape, ...]
    module_config_ids: tuple[str, ...]
    module_shape_names: tuple[str, ...]
    flops: dict[str, float | None] = field(default_factory=dict)
    bytes_moved: dict[str, float | None] = field(default_factory=dict)
    pairs: dict[tuple[str, str], Pair] = field(default_factory=dict)
    # bytes_moved's coefficient of each product of two dims, e.g. {("K", "M"): 2.0} for a bf16
    # A (M x K): how many bytes each operand costs per element (see bilinear_terms).
    bytes_terms: dict[tuple[str, str], float] = field(default_factory=dict)

    @property
    def stem(self) -> str:
        return Path(self.path).stem

    def shape(self, name: str) -> Shape:
        return next(s for s in self.shapes if s.name == name)


def _one_line(exc: BaseException) -> str:
    first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
    return f"{type(exc).__name__}: {first}"[:500] if first else type(exc).__name__


def pick(items: list, wanted: list | None, ident: Any, what: str, *, objects_must_exist: bool = False) -> list:
    """``wanted`` (None: all of ``items``) resolved against ``items`` by ``ident``: an id string
    must name one of them; an object is taken as it is, or, with ``objects_must_exist``, must
    match one of them by its id."""
    if wanted is None:
        return list(items)
    by_id = {ident(x): x for x in items}
    out = []
    for w in wanted:
        key = w if isinstance(w, str) else ident(w)
        if isinstance(w, str) or objects_must_exist:
            if key not in by_id:
                raise KeyError(f"unknown {what} {key!r} (known: {', '.join(by_id)})")
            out.append(by_id[key])
        else:
            out.append(w)
    return out


def _count(fn: Any, shape: Shape) -> float | None:
    if fn is None:
        return None
    try:
        value = float(fn(shape))
    except Exception:  # a module without a usable roofline count: the model does without
        return None
    return value if value == value and value >= 0 else None


def bilinear_terms(count: Any, shape: Shape) -> dict[tuple[str, str], float]:
    """The coefficient of ``d1*d2`` in ``count(shape)`` for each pair of dims, by the mixed second
    difference f(2a,2b) - f(2a,b) - f(a,2b) + f(a,b) = c*a*b (terms linear in a or b cancel).

    For a GEMM's ``bytes_moved`` this reads off the element sizes of its operands: 2 for a bf16
    A per M*K, 4 per K*N for two bf16 weights, 1 for an fp8 operand. Exact for counts that are
    polynomials of degree at most one in each dim; a term in three dims shows up in each pair."""
    if count is None:
        return {}

    def at(**scale: int) -> float:
        dims = {d: v * scale.get(d, 1) for d, v in shape.dims.items()}
        return float(count(Shape(shape.name, dims, shape.label, shape.causal, shape.phase)))

    names = sorted(d for d, v in shape.dims.items() if isinstance(v, int) and v > 0)
    out: dict[tuple[str, str], float] = {}
    try:
        base = at()
        single = {d: at(**{d: 2}) for d in names}
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                mixed = at(**{a: 2, b: 2}) - single[a] - single[b] + base
                if mixed:
                    out[(a, b)] = mixed / (shape.dims[a] * shape.dims[b])
    except Exception:  # a count that cannot take other dims: no terms
        return {}
    return out


def check_contract(mod: ModuleType) -> None:
    """What the static audit needs of a kernel module (``kernel_spec``): a ``@triton.jit``
    KERNEL and ``compile_args``, with the name, configs and shapes every consumer checks."""
    check_declarations(mod, ("NAME", "KERNEL", "CONFIGS", "SHAPES", "compile_args"))
    if not hasattr(mod.KERNEL, "params"):
        raise ContractError("breaks the kernel contract: KERNEL is not a @triton.jit function")
    if not callable(mod.compile_args):
        raise ContractError("breaks the kernel contract: compile_args is not a function")


def describe_module(mod: ModuleType, configs: list | None = None,
                    shapes: list | None = None) -> KernelDescription:
    """Everything the parent needs from ``mod``; runs the module's own code."""
    check_contract(mod)
    cfgs = [dict(c) for c in pick(list(mod.CONFIGS), configs, config_id, f"config for {mod.NAME}")]
    shps = pick(list(mod.SHAPES), shapes, lambda s: s.name, f"shape for {mod.NAME}")
    pairs: dict[tuple[str, str], Pair] = {}
    grid_fn = getattr(mod, "grid", None)
    for cfg in cfgs:
        for shape in shps:
            try:
                spec = specialize(mod.KERNEL, mod.compile_args(shape, cfg))
            except Exception as exc:
                pairs[(config_id(cfg), shape.name)] = Pair(None, f"compile_args/specialize: {_one_line(exc)}")
                continue
            try:
                grid = tuple(int(g) for g in grid_fn(shape, cfg)) if grid_fn is not None else None
            except Exception:  # the grid feeds the cost model only
                grid = None
            pairs[(config_id(cfg), shape.name)] = Pair(spec, "", grid)
    path = Path(mod.__file__).resolve()
    return KernelDescription(
        path=str(path), name=str(mod.NAME), dtype=str(getattr(mod, "DTYPE", "")),
        baseline_name=str(getattr(mod, "BASELINE_NAME", "")), source_hash=source_hash(path),
        configs=tuple(cfgs), shapes=tuple(shps),
        module_config_ids=tuple(config_id(c) for c in mod.CONFIGS),
        module_shape_names=tuple(s.name for s in mod.SHAPES),
        flops={s.name: _count(getattr(mod, "flops", None), s) for s in shps},
        bytes_moved={s.name: _count(getattr(mod, "bytes_moved", None), s) for s in shps},
        pairs=pairs,
        bytes_terms=bilinear_terms(getattr(mod, "bytes_moved", None), shps[0]) if shps else {},
    )


def describe_path(path: str, configs: list | None, shapes: list | None,
                  modules: dict[str, ModuleType]) -> KernelDescription:
    """Import ``path`` (once per worker, kept in ``modules``) and describe it."""
    if path not in modules:
        modules[path] = load_kernel_module(Path(path))
    return describe_module(modules[path], configs, shapes)
