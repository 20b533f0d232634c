"""Compile-time resource audit: registers, spills and shared memory per config, no GPU needed.

Triton compiles for a ``GPUTarget`` on a CPU-only machine. The figures only match what the GPU
runs when the compile reproduces the JIT's launch-time specialization (pointer and integer
divisibility, stride-1 arguments as constexpr 1): :func:`kernel_spec.specialize` does that
from each kernel module's ``compile_args``. Without it registers and spills are over-reported
and the software pipeline collapses to a single stage.

Where each number comes from:

- registers, stack frame, static shared memory: ``cuobjdump -res-usage`` on the very cubin Triton
  built (what the driver loads);
- spill store and spill load bytes: the ``ptxas -v`` log of that build. Triton prints it when
  asked (``TRITON_DUMP_PTXAS_LOG``); when Triton's own cache served the cubin, ptxas is re-run
  on the cached PTX with Triton's flags and checked against the cubin;
- dynamic shared memory: ``metadata.shared``, what the launch requests.

Compiles run in spawned worker processes, each task under a deadline; a worker that overruns it
is killed and replaced, so one pathological config cannot stall a sweep. Results are cached as
one JSON file per compile key under the data folder.

Standard library only at import (plus this package's stdlib modules): the GPU host imports this.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import enum
import hashlib
import io
import json
import multiprocessing
import multiprocessing.connection
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any, Callable, Iterable, Iterator

from kernaudit_pipeline.kernel_spec import (
    Shape,
    Specialization,
    config_id,
    kernel_files,
    load_kernel_module,
    source_hash,
    specialize,
)
from kernaudit_pipeline.settings import data_paths

DEFAULT_TIMEOUT_S = 300.0
# Importing torch + triton in a fresh worker can be slow on a loaded machine; this bounds it.
WORKER_START_TIMEOUT_S = 300.0
CACHE_SCHEMA = 1
WARP_SIZE = 32
MAX_THREADS_PER_BLOCK = 1024
SM90_RESERVED_SMEM_BYTES = 1024
MAX_TMEM_COLUMNS = 512  # Blackwell tensor memory per CTA, the limit Triton checks at load


class CompileStatus(enum.StrEnum):
    OK = "OK"
    COMPILE_ERROR = "COMPILE_ERROR"
    COMPILE_TIMEOUT = "COMPILE_TIMEOUT"
    # Compiled, but the launch would be refused (shared memory over the opt-in limit, or too
    # many threads). Triton only raises OutOfResources when loading on a GPU, so it is computed.
    OUT_OF_RESOURCES = "OUT_OF_RESOURCES"


@dataclass(frozen=True)
class ArchSpec:
    """Just what the static verdict needs; the full GPU spec database lives elsewhere."""

    name: str
    capability: int
    smem_per_block_optin_bytes: int


ARCHS: MappingProxyType[str, ArchSpec] = MappingProxyType({
    "sm_80": ArchSpec("sm_80", 80, 166_912),   # A100: 163 KiB
    "sm_86": ArchSpec("sm_86", 86, 101_376),   # 99 KiB
    "sm_89": ArchSpec("sm_89", 89, 101_376),   # 99 KiB
    "sm_90": ArchSpec("sm_90", 90, 232_448),   # H100/H200: 227 KiB
    "sm_100": ArchSpec("sm_100", 100, 232_448),  # B200: 227 KiB
})


@dataclass(frozen=True)
class StaticResult:
    """One compiled (kernel, config, shape, arch)."""

    kernel_name: str
    config_id: str
    config: dict[str, Any]
    shape_name: str
    arch: str
    status: CompileStatus
    message: str
    registers_per_thread: int | None
    spill_stores_bytes: int | None
    spill_loads_bytes: int | None
    stack_frame_bytes: int | None
    shared_mem_static_bytes: int | None
    shared_mem_dynamic_bytes: int | None
    shared_mem_bytes: int | None
    shared_mem_limit_bytes: int
    threads_per_block: int | None
    tmem_columns: int | None  # Blackwell tensor memory columns
    # Wall time of triton.compile when this row was computed; small when Triton's own cache
    # (under the data folder) already held the binary.
    compile_seconds: float | None
    triton_version: str
    kernel_source_hash: str
    cached: bool

    @property
    def spills(self) -> bool | None:
        if self.spill_stores_bytes is None:
            return None
        return self.spill_stores_bytes > 0 or (self.spill_loads_bytes or 0) > 0


# ------------------------------------------------------------------------------------------
# Tool-log parsing (ptxas -v, cuobjdump -res-usage): plain text, so parsed line by line.
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PtxasUsage:
    """One function's figures from a ``ptxas -v`` log."""

    function: str
    registers: int | None
    stack_frame_bytes: int | None
    spill_stores_bytes: int | None
    spill_loads_bytes: int | None
    smem_bytes: int | None


@dataclass(frozen=True)
class CubinUsage:
    """One function's line from ``cuobjdump -res-usage``."""

    function: str
    registers: int
    stack_bytes: int
    shared_bytes: int
    local_bytes: int


_PTXAS_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PTXAS_PROPS = re.compile(r"Function properties for (\S+)")
_PTXAS_STACK = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_SMEM = re.compile(r"(\d+) bytes smem")
_CUOBJ_FUNC = re.compile(r"^\s*Function (\S+):\s*$")
_CUOBJ_FIELD = re.compile(r"([A-Z]+(?:\[\d+\])?):(\d+)")


def parse_ptxas_log(log: str) -> dict[str, PtxasUsage]:
    """Figures per function. ``Used N registers`` follows the entry being compiled;
    the stack/spill line follows ``Function properties for NAME``."""
    fields: dict[str, dict[str, int]] = {}
    entry: str | None = None
    props: str | None = None
    for line in log.splitlines():
        if m := _PTXAS_ENTRY.search(line):
            entry = m.group(1)
            fields.setdefault(entry, {})
            continue
        if m := _PTXAS_PROPS.search(line):
            props = m.group(1)
            fields.setdefault(props, {})
            continue
        if (m := _PTXAS_STACK.search(line)) and props is not None:
            fields[props].update(stack=int(m.group(1)), st=int(m.group(2)), ld=int(m.group(3)))
            continue
        if (m := _PTXAS_REGS.search(line)) and entry is not None:
            fields[entry]["regs"] = int(m.group(1))
            if s := _PTXAS_SMEM.search(line):
                fields[entry]["smem"] = int(s.group(1))
    return {
        name: PtxasUsage(name, f.get("regs"), f.get("stack"), f.get("st"), f.get("ld"), f.get("smem"))
        for name, f in fields.items()
    }


def parse_res_usage(text: str) -> dict[str, CubinUsage]:
    out: dict[str, CubinUsage] = {}
    current: str | None = None
    for line in text.splitlines():
        if m := _CUOBJ_FUNC.match(line):
            current = m.group(1)
            continue
        if current is not None and "REG:" in line:
            f = {k: int(v) for k, v in _CUOBJ_FIELD.findall(line)}
            out[current] = CubinUsage(current, f["REG"], f["STACK"], f["SHARED"], f["LOCAL"])
            current = None
    return out


# ------------------------------------------------------------------------------------------
# One compile (runs inside a worker, or in-process for tests)
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Resources:
    """Everything one compile yields, with both sources kept for cross-checking."""

    kernel_function: str
    ptxas: PtxasUsage
    cubin: CubinUsage
    ptxas_log_source: str  # "triton" (Triton's own ptxas run) or "rerun" (re-run on cached PTX)
    shared_mem_dynamic_bytes: int
    threads_per_block: int
    tmem_columns: int | None
    compile_seconds: float

    def numbers(self) -> dict[str, int | float]:
        """The StaticResult fields; the cubin is authoritative for what the driver loads."""
        return {
            "registers_per_thread": self.cubin.registers,
            "spill_stores_bytes": self.ptxas.spill_stores_bytes,
            "spill_loads_bytes": self.ptxas.spill_loads_bytes,
            "stack_frame_bytes": self.cubin.stack_bytes,
            "shared_mem_static_bytes": self.cubin.shared_bytes,
            "shared_mem_dynamic_bytes": self.shared_mem_dynamic_bytes,
            "shared_mem_bytes": self.cubin.shared_bytes + self.shared_mem_dynamic_bytes,
            "threads_per_block": self.threads_per_block,
            "tmem_columns": self.tmem_columns,
            "compile_seconds": self.compile_seconds,
        }


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _ptxas_rerun(ptx: str, metadata: Any, capability: int) -> str:
    """ptxas -v on the PTX with the flags Triton's ``make_cubin`` uses (line info, fmad,
    register-allocation level, ``ptx_options``); only needed when Triton's cache skipped ptxas."""
    from triton import knobs
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    ptxas = get_ptxas(capability).path
    fmad = [] if getattr(metadata, "enable_fp_fusion", True) else ["--fmad=false"]
    extra = metadata.ptx_options.split(" ") if getattr(metadata, "ptx_options", None) else []
    debug = ["-g"] if knobs.nvidia.disable_ptxas_opt else ["-lineinfo"]
    opt = ["--opt-level", "0"] if knobs.nvidia.disable_ptxas_opt else []
    with tempfile.TemporaryDirectory(prefix="kernaudit-ptxas-") as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        for reg_alloc in (["--regAllocOptLevel=2"], []):  # the flag Triton >= 3.7 passes
            cmd = [ptxas, *debug, *fmad, "-v", *opt, *reg_alloc, *extra,
                   f"--gpu-name={sm_arch_from_capability(capability)}", str(src), "-o", f"{src}.o"]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode == 0:
                return proc.stdout + proc.stderr
        raise RuntimeError(f"ptxas re-run failed: {_first_line(proc.stderr)}")


def _res_usage(cubin: bytes) -> dict[str, CubinUsage]:
    from triton import knobs

    with tempfile.TemporaryDirectory(prefix="kernaudit-cubin-") as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        proc = subprocess.run([knobs.nvidia.cuobjdump.path, "-res-usage", str(path)],
                              capture_output=True, text=True, check=True)
    return parse_res_usage(proc.stdout)


def compile_specialized(kernel: Any, spec: Specialization, capability: int, num_warps: int,
                        num_stages: int, *, force: bool = False) -> Resources:
    """Compile one specialization for ``cuda:capability`` and read its resources."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    src = ASTSource(fn=kernel, signature=dict(spec.signature), constexprs=dict(spec.constexprs),
                    attrs=dict(spec.attrs))
    target = GPUTarget("cuda", capability, WARP_SIZE)
    options = {"num_warps": num_warps, "num_stages": num_stages}
    env = {"TRITON_DUMP_PTXAS_LOG": "1"}
    if force:
        env["TRITON_ALWAYS_COMPILE"] = "1"
    printed = io.StringIO()
    start = time.perf_counter()
    with _environ(**env), contextlib.redirect_stdout(printed):
        ck = triton.compile(src, target=target, options=options)
    seconds = time.perf_counter() - start
    name = ck.metadata.name
    cubin_usage = _res_usage(ck.asm["cubin"]).get(name)
    if cubin_usage is None:
        raise RuntimeError(f"cuobjdump lists no function {name!r}")
    log_source = "triton"
    usage = parse_ptxas_log(printed.getvalue()).get(name)
    if usage is None or usage.registers is None:  # Triton's cache served the cubin
        log_source = "rerun"
        usage = parse_ptxas_log(_ptxas_rerun(ck.asm["ptx"], ck.metadata, capability)).get(name)
        agrees = (usage is not None and usage.registers == cubin_usage.registers
                  and usage.stack_frame_bytes == cubin_usage.stack_bytes)
        if not agrees and not force:
            return compile_specialized(kernel, spec, capability, num_warps, num_stages, force=True)
    if usage is None or usage.spill_stores_bytes is None:
        raise RuntimeError(f"ptxas log has no figures for {name!r}")
    return Resources(
        kernel_function=name,
        ptxas=usage,
        cubin=cubin_usage,
        ptxas_log_source=log_source,
        shared_mem_dynamic_bytes=int(ck.metadata.shared),
        threads_per_block=int(ck.metadata.num_warps) * int(ck.metadata.num_ctas) * WARP_SIZE,
        tmem_columns=getattr(ck.metadata, "tmem_size", None),
        compile_seconds=seconds,
    )


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    return lines[0] if lines else ""


def error_message(exc: BaseException, output: str = "") -> str:
    """One line. Triton's CompilationError puts the location first, a source excerpt in the
    middle and the reason last; MLIR failures print their diagnostic to stderr instead."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    kind = type(exc).__name__
    if not lines:
        text = kind
    elif len(lines) == 1:
        text = f"{kind}: {lines[0]}"
    elif lines[0].startswith("at "):
        text = f"{kind} {lines[0]} {lines[-1]}"
    else:
        text = f"{kind}: {lines[0]}"
        detail = next((ln for ln in lines[1:] if "error" in ln.lower() or "fatal" in ln.lower()), None)
        if detail:
            text = f"{text}: {detail}"
    diagnostics = [ln.strip() for ln in output.splitlines() if "error:" in ln]
    if diagnostics and diagnostics[0] not in text:
        text = f"{text} ({diagnostics[0]})"
    return text[:500]


# ------------------------------------------------------------------------------------------
# Worker processes
# ------------------------------------------------------------------------------------------
def _run_task(task: dict, modules: dict[str, ModuleType]) -> dict:
    path = task["module_path"]
    if path not in modules:
        modules[path] = load_kernel_module(Path(path))
    spec = Specialization(signature=task["signature"], constexprs=task["constexprs"],
                          attrs=task["attrs"])
    res = compile_specialized(modules[path].KERNEL, spec, task["capability"], task["num_warps"],
                              task["num_stages"], force=task["force"])
    return res.numbers()


def _warm_up() -> None:
    """Pay Triton's one-off costs (import, hashing its own libraries for the cache key) before
    the first deadline starts, so compile_seconds measures the compile."""
    import triton  # noqa: F401

    try:
        from triton.runtime.cache import triton_key

        triton_key()
    except ImportError:  # a Triton without it has nothing to warm
        pass


def _worker_main(conn: multiprocessing.connection.Connection, env: dict[str, str],
                 preload: list[str]) -> None:
    """Compile tasks until told to stop. C-level output (MLIR diagnostics, Triton's PTX dump on
    ptxas failure) goes to a private file so it never mixes with the table or the JSON."""
    os.environ.update(env)
    sink = tempfile.TemporaryFile()
    os.dup2(sink.fileno(), 1)
    os.dup2(sink.fileno(), 2)
    modules: dict[str, ModuleType] = {}
    try:
        _warm_up()
    except BaseException as exc:  # reported to the parent, which fails the sweep's tasks
        conn.send(("dead", error_message(exc)))
        return
    for path in preload:
        try:
            modules[path] = load_kernel_module(Path(path))
        except Exception:  # only that module's tasks fail, each with this error, in _run_task
            pass
    conn.send(("ready", None))
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        sys.stdout.flush()
        sys.stderr.flush()
        offset = sink.seek(0, os.SEEK_END)
        start = time.perf_counter()
        try:
            conn.send(("ok", _run_task(task, modules)))
        except Exception as exc:
            sys.stdout.flush()
            sys.stderr.flush()
            sink.seek(offset)
            output = sink.read().decode(errors="replace")
            # Triton's own errors (CompilationError, PTXASError) recur on every compile of the
            # same input and may be cached; anything else may be the environment's fault.
            conn.send(("error", {"message": error_message(exc, output),
                                 "compile_seconds": time.perf_counter() - start,
                                 "deterministic": type(exc).__module__.startswith("triton")}))


@dataclass(frozen=True)
class Outcome:
    """What came back for one task."""

    status: CompileStatus
    message: str
    numbers: dict[str, Any]
    cacheable: bool


class _Worker:
    def __init__(self, ctx: Any, env: dict[str, str], preload: list[str]) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, env, preload), daemon=True)
        self.proc.start()
        child.close()
        self.ready = False
        self.task: dict | None = None
        self.deadline = time.monotonic() + WORKER_START_TIMEOUT_S
        self.started = 0.0

    def assign(self, task: dict, timeout_s: float) -> None:
        self.task = task
        self.started = time.monotonic()
        self.deadline = self.started + timeout_s
        self.conn.send(task)

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=10)
        self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.proc.join(timeout=5)
        self.kill()


def compile_in_workers(tasks: list[dict], *, timeout_s: float, max_workers: int,
                       env: dict[str, str], on_done: Callable[[dict, Outcome], None]) -> dict[str, Outcome]:
    """Run each task in a spawned worker under its own deadline; an overrun kills the worker
    (replaced for the remaining tasks) and records COMPILE_TIMEOUT."""
    ctx = multiprocessing.get_context("spawn")
    preload = sorted({t["module_path"] for t in tasks})
    pending = deque(tasks)
    outcomes: dict[str, Outcome] = {}
    workers: list[_Worker] = []
    start_failures: list[str] = []

    def finish(task: dict, outcome: Outcome) -> None:
        outcomes[task["key"]] = outcome
        on_done(task, outcome)

    def spawn_needed() -> None:
        target = min(max_workers, len(pending) + sum(1 for w in workers if w.task is not None))
        while len(workers) < target:
            workers.append(_Worker(ctx, env, preload))

    try:
        while pending or any(w.task is not None for w in workers):
            if len(start_failures) >= max(2, max_workers) and not any(w.ready for w in workers):
                msg = f"compile worker failed to start: {start_failures[-1]}"
                while pending:
                    finish(pending.popleft(), Outcome(CompileStatus.COMPILE_ERROR, msg, {}, False))
                break
            spawn_needed()
            for w in list(workers):
                if w.ready and w.task is None and pending:
                    task = pending.popleft()
                    try:
                        w.assign(task, timeout_s)
                    except OSError:  # died after saying ready: retry the task elsewhere
                        pending.appendleft(task)
                        w.task = None
                        w.kill()
                        workers.remove(w)
            now = time.monotonic()
            wait_s = max(0.0, min((w.deadline for w in workers), default=now + 1.0) - now)
            ready = multiprocessing.connection.wait([w.conn for w in workers], timeout=min(wait_s, 1.0))
            for w in [w for w in workers if w.conn in ready]:
                try:
                    kind, payload = w.conn.recv()
                except (EOFError, OSError):
                    w.kill()
                    workers.remove(w)
                    code = w.proc.exitcode
                    if w.task is not None:
                        finish(w.task, Outcome(
                            CompileStatus.COMPILE_ERROR,
                            f"compile worker died (exit code {code}) while compiling", {}, False))
                    else:
                        start_failures.append(f"exit code {code}")
                    continue
                if kind == "ready":
                    w.ready = True
                elif kind == "dead":
                    start_failures.append(payload)
                    w.kill()
                    workers.remove(w)
                elif kind == "ok":
                    task, w.task = w.task, None
                    finish(task, Outcome(CompileStatus.OK, "", payload, True))
                else:
                    task, w.task = w.task, None
                    finish(task, Outcome(CompileStatus.COMPILE_ERROR, payload["message"],
                                         {"compile_seconds": payload["compile_seconds"]},
                                         payload["deterministic"]))
            now = time.monotonic()
            for w in [w for w in workers if now > w.deadline]:
                w.kill()
                workers.remove(w)
                if w.task is not None:
                    elapsed = now - w.started
                    finish(w.task, Outcome(
                        CompileStatus.COMPILE_TIMEOUT,
                        f"compile exceeded the {timeout_s:g} s timeout (killed after {elapsed:.2f} s)",
                        {"compile_seconds": elapsed}, False))
                else:
                    start_failures.append(f"did not start within {WORKER_START_TIMEOUT_S:g} s")
    finally:
        for w in workers:
            w.stop()
    return outcomes


# ------------------------------------------------------------------------------------------
# Cache
# ------------------------------------------------------------------------------------------
_CACHED_FIELDS: dict[str, tuple[type, ...]] = {
    "registers_per_thread": (int,), "spill_stores_bytes": (int,), "spill_loads_bytes": (int,),
    "stack_frame_bytes": (int,), "shared_mem_static_bytes": (int,),
    "shared_mem_dynamic_bytes": (int,), "shared_mem_bytes": (int,), "threads_per_block": (int,),
    "tmem_columns": (int,), "compile_seconds": (int, float),
}


def _jsonable_spec(spec: Specialization) -> dict:
    return {
        "signature": spec.signature,
        "constexprs": {k: repr(v) for k, v in spec.constexprs.items()},
        "attrs": sorted([list(k), v] for k, v in spec.attrs.items()),
    }


def cache_key(kernel_source_hash: str, config: dict, spec: Specialization, arch: str,
              triton_version: str) -> str:
    """The shape enters only through its specialization: shapes that specialize alike compile
    to the same binary."""
    blob = json.dumps({
        "schema": CACHE_SCHEMA, "kernel_source_hash": kernel_source_hash,
        "config": config, "specialization": _jsonable_spec(spec), "arch": arch,
        "triton_version": triton_version,
    }, sort_keys=True, default=repr)
    return hashlib.sha256(blob.encode()).hexdigest()


def _read_cache(path: Path) -> Outcome | None:
    """A missing, unreadable or malformed entry is a miss (and gets rewritten)."""
    try:
        payload = json.loads(path.read_text())
        status = CompileStatus(payload["status"])
        message = payload["message"]
        numbers = payload["numbers"]
        if payload.get("schema") != CACHE_SCHEMA or not isinstance(message, str) or not isinstance(numbers, dict):
            return None
        for name, value in numbers.items():
            if name not in _CACHED_FIELDS or not (value is None or (
                    isinstance(value, _CACHED_FIELDS[name]) and not isinstance(value, bool))):
                return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return Outcome(status, message, numbers, True)


def _write_cache(path: Path, outcome: Outcome, key_fields: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"schema": CACHE_SCHEMA, "status": outcome.status.value, "message": outcome.message,
               "numbers": outcome.numbers, "key": key_fields}
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, indent=1, sort_keys=True, default=repr))
    tmp.replace(path)


# ------------------------------------------------------------------------------------------
# Sweeps
# ------------------------------------------------------------------------------------------
class UnknownKernel(LookupError):
    pass


def resolve_kernel(module_or_name: ModuleType | str | Path) -> ModuleType:
    """A module, a path to one, a file stem in ``kernels/`` or a kernel's ``NAME``."""
    if isinstance(module_or_name, ModuleType):
        return module_or_name
    text = str(module_or_name)
    if text.endswith(".py") or os.sep in text:
        if not Path(text).exists():
            raise UnknownKernel(f"no kernel module {text}")
        return load_kernel_module(Path(text))
    files = kernel_files()
    for path in files:
        if path.stem == text:
            return load_kernel_module(path)
    known = []
    for path in files:
        try:
            name = getattr(load_kernel_module(path), "NAME", path.stem)
        except Exception:  # a module being written or broken is not the one asked for
            continue
        if name == text:
            return load_kernel_module(path)
        known.append(name)
    raise UnknownKernel(f"unknown kernel {text!r} (known: {', '.join(known) or 'none'})")


def _pick(items: list, wanted: Iterable | None, ident: Callable[[Any], str], what: str) -> list:
    if wanted is None:
        return list(items)
    by_id = {ident(x): x for x in items}
    out = []
    for w in wanted:
        if isinstance(w, str):
            if w not in by_id:
                raise KeyError(f"unknown {what} {w!r} (known: {', '.join(by_id)})")
            out.append(by_id[w])
        else:
            out.append(w)
    return out


class _Progress:
    """A rich bar on a terminal, one plain line per compile otherwise (logs, CI)."""

    def __init__(self, total: int, label: str, enabled: bool) -> None:
        self.total, self.done, self.enabled = total, 0, enabled and total > 0
        self._bar = None
        if self.enabled and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=Console(stderr=True), transient=True)
            self._bar.start()
            self._task = self._bar.add_task(label, total=total)

    def advance(self, text: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(self._task, advance=1, description=text)
        else:
            print(f"static [{self.done}/{self.total}] {text}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def _triton_version() -> str:
    import triton

    return triton.__version__


def audit_kernel(module_or_name: ModuleType | str | Path, shapes: list[Shape | str] | None = None,
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


@dataclass(frozen=True)
class PlanItem:
    """One kernel's share of a sweep."""

    module: ModuleType
    configs: list[dict]
    shapes: list[Shape]


def plan_for(module_or_name: ModuleType | str | Path, shapes: list[Shape | str] | None = None,
             configs: list[dict | str] | None = None, all_shapes: bool = False) -> PlanItem:
    """``shapes``/``configs`` take objects or names/ids; None means the module's own (and only
    its first shape unless ``all_shapes``)."""
    mod = resolve_kernel(module_or_name)
    cfgs = _pick(mod.CONFIGS, configs, config_id, f"config for {mod.NAME}")
    chosen = _pick(mod.SHAPES, shapes, lambda s: s.name, f"shape for {mod.NAME}")
    if shapes is None and not all_shapes:
        chosen = chosen[:1]
    return PlanItem(mod, [dict(c) for c in cfgs], chosen)


def audit_all(modules: Iterable[ModuleType | str | Path] | None = None,
              shapes: list[Shape | str] | None = None, configs: list[dict | str] | None = None,
              arch: str = "sm_90", timeout_s: float = DEFAULT_TIMEOUT_S,
              max_workers: int | None = None, cache_dir: str | Path | None = None, *,
              all_shapes: bool = False, use_cache: bool = True,
              progress: bool = True) -> list[StaticResult]:
    """One sweep over several kernels (all of ``kernels/`` by default) sharing one worker pool;
    ``shapes``/``configs`` apply to every kernel given."""
    plan = [plan_for(m, shapes, configs, all_shapes)
            for m in (modules if modules is not None else kernel_files())]
    return sweep(plan, arch=arch, timeout_s=timeout_s, max_workers=max_workers,
                 cache_dir=cache_dir, use_cache=use_cache, progress=progress)


def sweep(plan: list[PlanItem], *, arch: str = "sm_90", timeout_s: float = DEFAULT_TIMEOUT_S,
          max_workers: int | None = None, cache_dir: str | Path | None = None,
          use_cache: bool = True, progress: bool = True) -> list[StaticResult]:
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r} (known: {', '.join(ARCHS)})")
    if timeout_s <= 0:
        raise ValueError("timeout_s must be positive")
    spec_arch = ARCHS[arch]
    paths = data_paths()
    cache = Path(cache_dir) if cache_dir is not None else paths.static_cache
    version = _triton_version()

    rows: list[dict] = []
    tasks: dict[str, dict] = {}
    outcomes: dict[str, Outcome] = {}
    from_cache: set[str] = set()
    for item in plan:
        mod = item.module
        kname = mod.NAME
        khash = source_hash(Path(mod.__file__))
        for cfg in item.configs:
            for shape in item.shapes:
                row = {"kernel_name": kname, "config": cfg, "shape_name": shape.name,
                       "kernel_source_hash": khash}
                rows.append(row)
                try:
                    spec = specialize(mod.KERNEL, mod.compile_args(shape, cfg))
                except Exception as exc:
                    row["key"] = f"unspecializable:{len(rows)}"
                    outcomes[row["key"]] = Outcome(
                        CompileStatus.COMPILE_ERROR,
                        f"compile_args/specialize: {error_message(exc)}", {}, False)
                    continue
                key = row["key"] = cache_key(khash, cfg, spec, arch, version)
                if key in tasks or key in outcomes:
                    continue
                if use_cache and (hit := _read_cache(cache / f"{key}.json")) is not None:
                    outcomes[key] = hit
                    from_cache.add(key)
                    continue
                tasks[key] = {
                    "key": key, "module_path": str(Path(mod.__file__).resolve()),
                    "signature": spec.signature, "constexprs": spec.constexprs,
                    "attrs": spec.attrs, "capability": spec_arch.capability,
                    "num_warps": cfg.get("num_warps", 4), "num_stages": cfg.get("num_stages", 3),
                    "force": not use_cache, "label": f"{kname} {config_id(cfg)}",
                    "key_fields": {"kernel_name": kname, "kernel_source_hash": khash,
                                   "config": cfg, "arch": arch, "triton_version": version,
                                   "specialization": _jsonable_spec(spec)},
                }

    if tasks:
        bar = _Progress(len(tasks), f"compiling for {arch}", progress)

        def on_done(task: dict, outcome: Outcome) -> None:
            if outcome.cacheable:
                _write_cache(cache / f"{task['key']}.json", outcome, task["key_fields"])
            bar.advance(f"{task['label']} {outcome.status.value}")

        env = {"TRITON_CACHE_DIR": str(paths.root / "triton_cache")}
        if not use_cache:
            env["TRITON_ALWAYS_COMPILE"] = "1"
        try:
            outcomes.update(compile_in_workers(
                list(tasks.values()), timeout_s=timeout_s,
                max_workers=max(1, max_workers or os.cpu_count() or 1), env=env, on_done=on_done))
        finally:
            bar.close()

    return [_result(row, outcomes[row["key"]], spec_arch, version, row["key"] in from_cache)
            for row in rows]


def _result(row: dict, outcome: Outcome, arch: ArchSpec, version: str, cached: bool) -> StaticResult:
    n = {name: outcome.numbers.get(name) for name in _CACHED_FIELDS}
    if arch.capability >= 90 and (n.get("shared_mem_static_bytes") or 0) >= SM90_RESERVED_SMEM_BYTES:
        # The cubin's SHARED on sm_90+ includes the 1 KiB the driver reserves per block
        # (cudaDevAttrReservedSharedMemoryPerBlock); ncu reports it as static 0, and the
        # occupancy arithmetic adds the reserve itself, so it is taken out here.
        n["shared_mem_static_bytes"] -= SM90_RESERVED_SMEM_BYTES
        if n.get("shared_mem_bytes") is not None:
            n["shared_mem_bytes"] -= SM90_RESERVED_SMEM_BYTES
    status, message = outcome.status, outcome.message
    limit = arch.smem_per_block_optin_bytes
    if status is CompileStatus.OK:
        if n["shared_mem_bytes"] is not None and n["shared_mem_bytes"] > limit:
            status = CompileStatus.OUT_OF_RESOURCES
            message = (f"shared memory {n['shared_mem_bytes']} B (static {n['shared_mem_static_bytes']}"
                       f" + dynamic {n['shared_mem_dynamic_bytes']}) exceeds the {limit} B per-block"
                       f" opt-in limit of {arch.name}")
        elif n["threads_per_block"] is not None and n["threads_per_block"] > MAX_THREADS_PER_BLOCK:
            status = CompileStatus.OUT_OF_RESOURCES
            message = f"{n['threads_per_block']} threads per block exceed {MAX_THREADS_PER_BLOCK}"
        elif n["tmem_columns"] is not None and n["tmem_columns"] > MAX_TMEM_COLUMNS:
            status = CompileStatus.OUT_OF_RESOURCES
            message = f"{n['tmem_columns']} tensor-memory columns exceed {MAX_TMEM_COLUMNS}"
    return StaticResult(
        kernel_name=row["kernel_name"], config_id=config_id(row["config"]), config=row["config"],
        shape_name=row["shape_name"], arch=arch.name, status=status, message=message,
        registers_per_thread=n["registers_per_thread"], spill_stores_bytes=n["spill_stores_bytes"],
        spill_loads_bytes=n["spill_loads_bytes"], stack_frame_bytes=n["stack_frame_bytes"],
        shared_mem_static_bytes=n["shared_mem_static_bytes"],
        shared_mem_dynamic_bytes=n["shared_mem_dynamic_bytes"],
        shared_mem_bytes=n["shared_mem_bytes"], shared_mem_limit_bytes=limit,
        threads_per_block=n["threads_per_block"], tmem_columns=n["tmem_columns"],
        compile_seconds=n["compile_seconds"],
        triton_version=version, kernel_source_hash=row["kernel_source_hash"],
        cached=cached,
    )


_CONFIG_COLUMNS = {"BLOCK_M": "block_m", "BLOCK_N": "block_n", "BLOCK_K": "block_k",
                   "GROUP_M": "group_m", "num_warps": "num_warps", "num_stages": "num_stages"}


def to_frame(results: list[StaticResult]):
    """A pandas frame with ``kernel_runs`` column names (config flattened, arch as cc)."""
    import pandas as pd

    records = []
    for r in results:
        rec = dataclasses.asdict(r)
        rec["status"] = r.status.value
        rec["config"] = json.dumps(r.config, sort_keys=True)
        for key, column in _CONFIG_COLUMNS.items():
            rec[column] = r.config.get(key)
        cc = ARCHS[r.arch].capability
        rec["compute_capability"] = f"{cc // 10}.{cc % 10}"
        records.append(rec)
    return pd.DataFrame.from_records(records)


# ------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------
class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, never the usage block
        raise _UsageError(message)


def _fmt(value: Any) -> str:
    return "-" if value is None else str(value)


def format_table(results: list[StaticResult]) -> str:
    header = ["kernel", "config_id", "status", "regs", "spill_st_B", "spill_ld_B", "stack_B",
              "smem_B", "smem/limit", "compile_s"]
    lines = [header]
    for r in results:
        ratio = "-" if r.shared_mem_bytes is None else f"{100 * r.shared_mem_bytes / r.shared_mem_limit_bytes:.0f}%"
        secs = "-" if r.compile_seconds is None else f"{r.compile_seconds:.2f}" + (" (cached)" if r.cached else "")
        lines.append([r.kernel_name, r.config_id, r.status.value, _fmt(r.registers_per_thread),
                      _fmt(r.spill_stores_bytes), _fmt(r.spill_loads_bytes),
                      _fmt(r.stack_frame_bytes), _fmt(r.shared_mem_bytes), ratio, secs])
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    numeric = set(range(3, len(header)))
    out = []
    for row in lines:
        out.append("  ".join(c.rjust(w) if i in numeric else c.ljust(w)
                             for i, (c, w) in enumerate(zip(row, widths))).rstrip())
    return "\n".join(out)


def summary(results: list[StaticResult]) -> str:
    by = {s: sum(1 for r in results if r.status is s) for s in CompileStatus}
    spilling = sum(1 for r in results if r.spills)
    arch = results[0].arch if results else "-"
    return (f"{len(results)} rows for {arch}: {by[CompileStatus.OK]} ok, {spilling} spilling, "
            f"{by[CompileStatus.OUT_OF_RESOURCES]} out of resources, "
            f"{by[CompileStatus.COMPILE_ERROR]} compile errors, {by[CompileStatus.COMPILE_TIMEOUT]} timeouts")


def cli(argv: list[str]) -> int:
    parser = _Parser(prog="kernaudit static",
                     description="Compile each (kernel, config) ahead of time and print its "
                                 "registers, spills and shared memory; no GPU needed.")
    parser.add_argument("kernels", nargs="*", metavar="KERNEL",
                        help="kernel NAME or kernels/ file stem (default: every module in kernels/)")
    parser.add_argument("--arch", default="sm_90", choices=list(ARCHS))
    parser.add_argument("--all-shapes", action="store_true",
                        help="compile every shape, not only each kernel's first")
    parser.add_argument("--configs", default=None, metavar="ID[,ID...]",
                        help="only these config ids (e.g. BK64_BM128_BN256_GM8_s3_w8)")
    parser.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S)
    parser.add_argument("--jobs", type=int, default=None, help="parallel compiles (default: CPU count)")
    parser.add_argument("--json", action="store_true", help="print the rows as a JSON array")
    parser.add_argument("--no-cache", action="store_true",
                        help="recompile everything, bypassing the audit cache and Triton's own "
                             "(the results still refresh the audit cache)")
    try:
        args = parser.parse_args(argv)
        if args.timeout_s <= 0:
            parser.error("--timeout-s must be positive")
        if args.jobs is not None and args.jobs < 1:
            parser.error("--jobs must be at least 1")
    except _UsageError as exc:
        print(f"kernaudit static: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return int(exc.code or 0)

    modules: list[ModuleType] = []
    load_failed = False
    try:
        if args.kernels:
            modules = [resolve_kernel(name) for name in args.kernels]
        else:
            for path in kernel_files():
                try:
                    modules.append(load_kernel_module(path))
                except Exception as exc:  # a broken module must not hide the others
                    print(f"kernaudit static: cannot load {path.name}: {error_message(exc)}", file=sys.stderr)
                    load_failed = True
    except UnknownKernel as exc:
        print(f"kernaudit static: {exc.args[0]}", file=sys.stderr)
        return 2
    except Exception as exc:
        print(f"kernaudit static: cannot load kernel module: {error_message(exc)}", file=sys.stderr)
        return 2
    if not modules:
        print("kernaudit static: no kernel modules to audit", file=sys.stderr)
        return 2
    wanted = [c for c in args.configs.split(",") if c] if args.configs else None
    plan: list[PlanItem] = []
    for mod in modules:
        cfgs = None
        if wanted is not None:
            ids = {config_id(c) for c in mod.CONFIGS}
            cfgs = [c for c in wanted if c in ids]
            if not cfgs:
                continue
        try:
            plan.append(plan_for(mod, configs=cfgs, all_shapes=args.all_shapes))
        except Exception as exc:  # a module that breaks the contract
            print(f"kernaudit static: {Path(mod.__file__).name}: {error_message(exc)}", file=sys.stderr)
            load_failed = True
    if wanted is not None:
        known = {config_id(c) for item in plan for c in item.configs}
        missing = [c for c in wanted if c not in known]
        if missing:
            print(f"kernaudit static: unknown config id(s): {', '.join(missing)}", file=sys.stderr)
            return 2
    results = sweep(plan, arch=args.arch, timeout_s=args.timeout_s, max_workers=args.jobs,
                    use_cache=not args.no_cache)
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in results], indent=2))
    else:
        print(format_table(results))
        print(summary(results))
    return 1 if load_failed else 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
