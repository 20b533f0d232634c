"""The contract every module in ``kernels/`` fulfils.

Standard library only: the GPU runner imports this on hosts that have no
pandas, dagster or mlflow.

A kernel module (``kernels/<name>.py``) defines, at module level:

``NAME: str``
    The kernel's audit name, e.g. ``"gemm_bf16"``.
``KERNEL``
    The ``@triton.jit`` function under audit.
``DTYPE: str``
    Element type of the main operands (``"bf16"``, ``"fp16"``, ``"fp8e4m3"``).
``BASELINE_NAME: str``
    What the PyTorch baseline calls, e.g. ``"torch.matmul"``.
``CONFIGS: list[dict]``
    The config space. Keys are the kernel's constexpr meta-parameters in upper
    case (``BLOCK_M``, ``BLOCK_N``, ``BLOCK_K``, ``GROUP_M`` ...) plus
    ``num_warps`` and ``num_stages``. It deliberately holds configs that spill
    and configs that exceed shared memory.
``SHAPES: list[Shape]``
    Problem shapes (see :class:`Shape`).
``TOLERANCE: Tolerance``
    Correctness tolerance against the higher-precision reference.
``make_inputs(shape: Shape, device: str, seed: int) -> dict``
    Fresh random inputs (never zeros).
``launch(inputs: dict, config: dict, out=None) -> torch.Tensor``
    Runs the Triton kernel. When ``out`` is given it is written in place
    (the runner poisons it first to catch unwritten elements).
``baseline(inputs: dict) -> torch.Tensor``
    The PyTorch baseline being compared against (same dtype as the kernel).
``REFERENCES: list[Reference]`` (optional)
    Every implementation the kernel is timed against, primary first (``key=None``): each
    with its name, the library expected to run, its own tolerance and, where it needs other
    operands (bf16 copies of fp8 weights, a FlashInfer plan), a ``prepare`` step that runs
    outside the timed region. Without it, ``baseline`` is the only (primary) reference.
``reference(inputs: dict) -> torch.Tensor``
    The answer in higher precision (fp32 or fp64) for correctness checks.
``flops(shape: Shape) -> int`` and ``bytes_moved(shape: Shape) -> int``
    The roofline model: useful FLOPs and the fewest DRAM bytes the kernel must
    move (each input read once, each output written once).
``compile_args(shape: Shape, config: dict) -> dict[str, object]``
    One value per ``KERNEL`` parameter, exactly as ``launch`` would pass it:
    a :class:`Ptr` for each tensor, the real ``int``/``float`` for scalars,
    and the config's values for constexpr parameters. The static audit turns
    this into an ahead-of-time compile that reproduces the JIT's launch-time
    specialization (see :func:`specialize`).
``grid(shape: Shape, config: dict) -> tuple[int, ...]``
    The launch grid, for waves/tail analysis.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from kernaudit_pipeline.core.configs import (  # config_id is re-exported for kernels/
    LAUNCH_KEYS, VALID_NUM_WARPS, config_id,
)

# Triton's JIT marks integer and pointer arguments divisible by this with
# tt.divisibility, and turns integers equal to 1 into constexprs.
DIVISIBILITY = 16


@dataclass(frozen=True)
class Ptr:
    """A tensor argument in ``compile_args``; ``dtype`` is Triton's name
    (``fp16``, ``bf16``, ``fp32``, ``fp8e4nv``, ``i32`` ...)."""

    dtype: str
    # Tensors from torch's caching allocator are 256-byte aligned, so the JIT
    # marks them divisible by 16. A deliberately offset view would not be.
    aligned: bool = True


# The largest shape dimension a module may declare, beyond any tensor a GPU holds. A zero,
# negative or fractional size has no time to predict (M=0 was ranked, at 2e12 us) and no time
# worth measuring (the runner timed N=0 and called the empty result correct).
MAX_DIM = 2**40


class ContractError(ValueError):
    """The module does not declare what kernaudit needs of it (the contract above)."""


class ShapeError(ContractError):
    """A shape whose dimensions no GPU runs."""


def check_dims(name: str, dims: object) -> None:
    """Raise :class:`ShapeError` unless ``dims`` maps names to whole numbers in [1, MAX_DIM].
    Here, not in the static audit, so that the GPU runner (torch, triton, numpy and the
    standard library only) refuses the same shapes as ``kernaudit static`` and ``rank``."""
    if not isinstance(dims, dict) or not dims:
        raise ShapeError(f"breaks the kernel contract: shape {name!r} has no dims")
    for key, value in dims.items():
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DIM:
            raise ShapeError(f"breaks the kernel contract: shape {name!r} dimension "
                             f"{key}={value!r} is not a whole number in [1, {MAX_DIM:,}]")


@dataclass(frozen=True)
class Shape:
    """One problem shape. ``dims`` holds the named sizes (``M``, ``N``, ``K``
    or ``B``, ``H``, ``KV_H``, ``S``, ``D`` ...), each a whole number in [1, MAX_DIM] (checked
    when the shape is made, so a module declaring M=0 fails to load wherever it is loaded),
    and ``label`` says where the shape comes from (e.g. ``"llama3-8b qkv_proj prefill"``)."""

    name: str
    dims: dict[str, int]
    label: str = ""
    causal: bool | None = None
    phase: str = "prefill"  # prefill | decode

    def __post_init__(self) -> None:
        check_dims(self.name, self.dims)

    def __getitem__(self, key: str) -> int:
        return self.dims[key]

    def get(self, key: str, default: int | None = None) -> int | None:
        return self.dims.get(key, default)


def check_declarations(mod: ModuleType, needs: tuple[str, ...] = ("NAME", "CONFIGS", "SHAPES")) -> None:
    """Raise :class:`ContractError` unless ``mod`` has ``needs`` and declares a name, a config
    space and shapes that every consumer can key rows by. Here, in one place, because the GPU
    runner and the static audit both read these: the runner once timed a module with no
    configs and exited 0 with no rows, timed two shapes of one name into rows no one could
    tell apart, and met ``num_warps="four"`` only as an internal error."""
    missing = [a for a in needs if not hasattr(mod, a)]
    if missing:
        raise ContractError(f"breaks the kernel contract: no {', '.join(missing)}")
    if not isinstance(mod.NAME, str) or not mod.NAME.strip():
        raise ContractError(f"breaks the kernel contract: NAME must be a non-empty string, not {mod.NAME!r}")
    for attr in ("CONFIGS", "SHAPES"):
        value = getattr(mod, attr)
        if not isinstance(value, (list, tuple)) or not value:
            raise ContractError(f"breaks the kernel contract: {attr} must be a non-empty list")
    if not all(isinstance(c, dict) for c in mod.CONFIGS):
        raise ContractError("breaks the kernel contract: every config must be a dict")
    seen: set[str] = set()
    for cfg in mod.CONFIGS:
        for key in LAUNCH_KEYS:
            value = cfg.get(key)
            # num_stages=0 is Triton's "no software pipelining" (it compiles for sm_90)
            ok = isinstance(value, int) and not isinstance(value, bool) and (
                value in VALID_NUM_WARPS if key == "num_warps" else value >= 0)
            if key in cfg and not ok:
                allowed = f"one of {VALID_NUM_WARPS}" if key == "num_warps" else "a whole number >= 0"
                raise ContractError(f"breaks the kernel contract: config {cfg!r}: {key}={value!r} "
                                    f"is not {allowed}")
        cid = config_id(cfg)
        if cid in seen:
            raise ContractError(f"breaks the kernel contract: config {cid} is declared twice")
        seen.add(cid)
    if not all(isinstance(s, Shape) for s in mod.SHAPES):
        raise ContractError("breaks the kernel contract: every shape must be a kernel_spec.Shape")
    names: set[str] = set()
    for shape in mod.SHAPES:  # dims again: a module may change a shape's dims after making it
        check_dims(shape.name, shape.dims)
        if not isinstance(shape.name, str) or not shape.name.strip():
            raise ContractError(f"breaks the kernel contract: a shape's name must be a non-empty "
                                f"string, not {shape.name!r}")
        if shape.name in names:
            raise ContractError(f"breaks the kernel contract: shape {shape.name!r} is declared twice")
        names.add(shape.name)


@dataclass(frozen=True)
class Tolerance:
    """Max ‖out − ref‖ / ‖ref‖ accepted, and the max elementwise error allowed."""

    max_rel_l2: float
    atol: float = 0.0
    rtol: float = 0.0


@dataclass(frozen=True)
class Reference:
    """One implementation a kernel is timed against, paired, at every shape.

    ``fn`` takes what ``prepare`` returned (the module's inputs when there is no ``prepare``)
    and returns the output, which is checked against the module's fp32 ``reference`` with
    ``tolerance``. ``backend`` is the library expected to run; the runner checks it in a
    profiler trace and records the kernel names it saw. ``unavailable`` returns why the
    reference cannot run on this host (a missing package), or None.
    """

    key: str | None  # None: the primary reference; else a short id such as "cudnn"
    name: str
    backend: str | None
    fn: Callable[[dict], object]
    tolerance: Tolerance
    prepare: Callable[[dict], dict] | None = None
    unavailable: Callable[[], str | None] | None = None


@dataclass(frozen=True)
class Specialization:
    """What ``triton.compiler.ASTSource`` needs to compile like the JIT does."""

    signature: dict[str, str]
    constexprs: dict[str, object]
    attrs: dict[tuple[int, ...], list[list[object]]] = field(default_factory=dict)


def specialize(kernel, args: dict[str, object]) -> Specialization:
    """Reproduce the JIT's launch-time specialization for an AOT compile.

    Pointers become ``*dtype`` with ``tt.divisibility=16`` when aligned;
    integers equal to 1 become constexpr 1; other integers divisible by 16
    get ``tt.divisibility=16``; constexpr parameters take their value.
    Without this, a CPU compile over-reports registers and spills and
    compiles a single-stage pipeline.
    """
    signature: dict[str, str] = {}
    constexprs: dict[str, object] = {}
    attrs: dict[tuple[int, ...], list[list[object]]] = {}
    for i, param in enumerate(kernel.params):
        name = param.name
        if name not in args:
            raise KeyError(f"compile_args gives no value for parameter {name!r}")
        value = args[name]
        if param.is_constexpr:
            signature[name] = "constexpr"
            constexprs[name] = value
        elif isinstance(value, Ptr):
            signature[name] = f"*{value.dtype}"
            if value.aligned:
                attrs[(i,)] = [["tt.divisibility", DIVISIBILITY]]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            if value == 1:
                signature[name] = "constexpr"
                constexprs[name] = 1
                continue
            signature[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
            if value % DIVISIBILITY == 0:
                attrs[(i,)] = [["tt.divisibility", DIVISIBILITY]]
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            raise TypeError(f"parameter {name!r}: unsupported compile arg {value!r}")
    return Specialization(signature=signature, constexprs=constexprs, attrs=attrs)


KERNELS_DIR = Path(__file__).resolve().parent.parent / "kernels"


# Kernels kept out of the default audit: a held-out kernel is one the config-ranking model was never
# fitted on (kernels/heldout/README.md). Named explicitly (``kernaudit rank swiglu_gemm``,
# ``bench --kernels swiglu_gemm``) they load like any other; the embedded audit, the sensor and
# ingest's identities see only ``kernels/*.py``, so a fresh clone's audit does not compile them.
HELDOUT_SUBDIR = "heldout"


def kernel_files(kernels_dir: Path = KERNELS_DIR, *, heldout: bool = False) -> list[Path]:
    """The kernel modules under audit; with ``heldout``, the held-out ones after them."""
    dirs = [kernels_dir, kernels_dir / HELDOUT_SUBDIR] if heldout else [kernels_dir]
    return [p for d in dirs for p in sorted(d.glob("*.py")) if not p.name.startswith("_")]


def source_hash(path: Path) -> str:
    """sha256 of a kernel module's bytes; the cache key and the sensor's cursor."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def load_kernel_module(path_or_name: str | Path, kernels_dir: Path = KERNELS_DIR) -> ModuleType:
    """Import ``kernels/<name>.py`` (or ``kernels/heldout/<name>.py``) by path (``kernels/`` is not a package on
    sys.path on every host)."""
    path = Path(path_or_name)
    if not path.suffix:
        path = kernels_dir / f"{path_or_name}.py"
        if not path.exists():
            path = kernels_dir / HELDOUT_SUBDIR / f"{path_or_name}.py"
    if not path.exists():
        raise FileNotFoundError(f"no kernel module {path}")
    mod_name = f"kernaudit_kernels.{path.stem}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    spec.loader.exec_module(module)
    return module
