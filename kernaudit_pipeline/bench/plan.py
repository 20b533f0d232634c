"""What the parent process knows about a kernel module, learned without importing it.

Importing a kernel module runs its code (and torch's, and Triton's): a module that hangs at
import, or in ``compile_args``, would hang the parent. So a timed ``plan`` worker imports the
module and writes a :class:`KernelPlan` as JSON; the parent plans, supervises and writes failure
rows from that alone. Standard library only.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType

from kernaudit_pipeline.bench.records import KernelInfo
from kernaudit_pipeline.core.configs import config_id
from kernaudit_pipeline.kernel_spec import Shape, check_declarations, source_hash


@dataclass(frozen=True)
class ShapePlan:
    shape: Shape
    flops: float
    bytes_moved: float
    grids: dict[str, tuple[int, ...]]  # config id -> launch grid


@dataclass(frozen=True)
class ReferencePlan:
    key: str | None  # None: the primary reference
    name: str
    backend: str | None


@dataclass(frozen=True)
class KernelPlan:
    path: str
    info: KernelInfo
    configs: tuple[dict, ...]
    shapes: tuple[ShapePlan, ...]
    references: tuple[ReferencePlan, ...] = field(default_factory=tuple)

    @property
    def stem(self) -> str:
        return Path(self.path).stem

    @property
    def name(self) -> str:
        return self.info.name

    def shape(self, name: str) -> ShapePlan:
        for s in self.shapes:
            if s.shape.name == name:
                return s
        raise KeyError(f"{self.name}: no shape {name!r}")

    def config(self, cid: str) -> dict:
        for c in self.configs:
            if config_id(c) == cid:
                return c
        raise KeyError(f"{self.name}: no config {cid!r}")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> KernelPlan:
        raw = json.loads(text)
        shapes = tuple(
            ShapePlan(shape=Shape(**s["shape"]), flops=float(s["flops"]),
                      bytes_moved=float(s["bytes_moved"]),
                      grids={k: tuple(v) for k, v in s["grids"].items()})
            for s in raw["shapes"])
        return cls(path=raw["path"], info=KernelInfo(**raw["info"]),
                   configs=tuple(dict(c) for c in raw["configs"]), shapes=shapes,
                   references=tuple(ReferencePlan(**r) for r in raw.get("references", ())))


def plan_module(path: Path, mod: ModuleType) -> KernelPlan:
    """Read a kernel module's contract into a plan (runs in the worker, which imported it)."""
    from kernaudit_pipeline.bench.references import references_of

    check_declarations(mod)
    info = KernelInfo(module=path.stem, name=mod.NAME, dtype=mod.DTYPE,
                      baseline_name=mod.BASELINE_NAME, source_hash=source_hash(path),
                      tolerance_rel_l2=float(mod.TOLERANCE.max_rel_l2))
    configs = tuple(dict(c) for c in mod.CONFIGS)
    shapes = tuple(
        ShapePlan(shape=s, flops=float(mod.flops(s)), bytes_moved=float(mod.bytes_moved(s)),
                  grids={config_id(c): tuple(int(g) for g in mod.grid(s, c)) for c in configs})
        for s in mod.SHAPES)
    refs = tuple(ReferencePlan(key=r.key, name=r.name, backend=r.backend)
                 for r in references_of(mod))
    return KernelPlan(path=str(path), info=info, configs=configs, shapes=shapes, references=refs)
