"""The CUDA binary tools kernaudit reads (``ptxas``, ``cuobjdump``): where to find them and how
to read what they print.

One home for both, shared by the static audit (which runs them on the binaries Triton builds)
and the ptxas-log ingest (which reads logs captured elsewhere).

Finding a tool, in order:

1. Triton's own knob (``triton.knobs.nvidia.<tool>``), which honours ``TRITON_PTXAS_PATH`` /
   ``TRITON_CUOBJDUMP_PATH`` and otherwise points at the binaries the Triton wheel bundles. It is
   the ptxas Triton itself compiles with, so its log describes the very cubin Triton built.
   For sm_100 and later Triton uses a separate ptxas (``ptxas_blackwell``).
2. The same bundled path looked up by hand (a Triton without ``knobs``).
3. ``PATH``, then ``/usr/local/cuda/bin``.

Both tools print plain text, so the parsers read it line by line (the one place regexes are the
right tool: there is no structured output to validate).

Standard library only at import; ``triton`` is imported only inside :func:`find_tool`.
"""

from __future__ import annotations

import enum
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

TOOL_TIMEOUT_S = 120.0
CUDA_BIN = Path("/usr/local/cuda/bin")


class Tool(enum.StrEnum):
    PTXAS = "ptxas"
    CUOBJDUMP = "cuobjdump"


class ToolError(RuntimeError):
    """A tool is missing, timed out or failed; the message is one line."""


def _knob_path(tool: Tool, capability: int | None) -> Path | None:
    try:
        from triton import knobs  # noqa: PLC0415 - optional, and heavy
    except ImportError:
        return None
    name = "ptxas_blackwell" if tool is Tool.PTXAS and (capability or 0) >= 100 else tool.value
    try:
        path = getattr(knobs.nvidia, name).path
    except (AttributeError, RuntimeError, OSError):  # a knob pointing at a missing binary
        return None
    return Path(path) if path and Path(path).exists() else None


def _bundled_path(tool: Tool) -> Path | None:
    try:
        import triton  # noqa: PLC0415
    except ImportError:
        return None
    candidate = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / tool.value
    return candidate if candidate.exists() else None


def find_tool(tool: Tool | str, capability: int | None = None) -> Path | None:
    """Where ``tool`` is (see the module docstring for the order); None when nowhere."""
    tool = Tool(tool)
    for found in (_knob_path(tool, capability), _bundled_path(tool)):
        if found is not None:
            return found
    on_path = shutil.which(tool.value)
    if on_path:
        return Path(on_path)
    fallback = CUDA_BIN / tool.value
    return fallback if fallback.exists() else None


def require_tool(tool: Tool | str, capability: int | None = None) -> Path:
    path = find_tool(tool, capability)
    if path is None:
        raise ToolError(f"{Tool(tool).value} not found (no Triton bundle, not on PATH, not in {CUDA_BIN})")
    return path


# ------------------------------------------------------------------------------------------
# ptxas -v
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PtxasUsage:
    """One function's figures from a ``ptxas -v`` log.

    ``line`` (0-based, of its ``Compiling entry function``) is set for entry functions, the
    kernels, with ``target`` (e.g. ``sm_90a``) when the log names one; a device function that
    only has a ``Function properties`` block has neither, and no registers.
    """

    function: str
    target: str | None
    line: int | None
    registers: int | None
    stack_frame_bytes: int | None
    spill_stores_bytes: int | None
    spill_loads_bytes: int | None
    smem_bytes: int | None

    @property
    def is_entry(self) -> bool:
        return self.line is not None


PTXAS_ENTRY_RE = re.compile(r"Compiling entry function '([^']*)'(?: for '(sm_\w+)')?")
PTXAS_PROPS_RE = re.compile(r"Function properties for (\S+)")
PTXAS_FRAME_RE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
PTXAS_USED_RE = re.compile(r"Used (\d+) registers")
# Older ptxas prints "16384+0 bytes smem" (static + reserved): the first figure is the kernel's.
PTXAS_SMEM_RE = re.compile(r"(\d+)(?:\+(\d+))? bytes smem")


def parse_ptxas_log(log: str) -> list[PtxasUsage]:
    """Every function the log describes, entries in log order, then device functions.

    For an entry, ptxas prints ``Compiling entry function 'F' for 'sm_90a'``, then ``Function
    properties for F`` with the stack/spill line, then ``Used N registers[, M bytes smem]``. A
    properties block for any other name is a device function's. The first ``Used`` line after
    an entry is its own; an entry without one (a truncated log) keeps ``registers=None``.
    """
    entries: list[dict] = []
    devices: dict[str, dict] = {}
    current: dict | None = None
    props: dict | None = None
    for line_no, line in enumerate(log.splitlines()):
        if m := PTXAS_ENTRY_RE.search(line):
            current = {"function": m.group(1), "target": m.group(2), "line": line_no}
            entries.append(current)
            props = None
            continue
        if m := PTXAS_PROPS_RE.search(line):
            name = m.group(1)
            props = current if current is not None and current["function"] == name else \
                devices.setdefault(name, {"function": name, "target": None, "line": None})
            continue
        if (m := PTXAS_FRAME_RE.search(line)) and props is not None:
            props["stack"], props["stores"], props["loads"] = (int(g) for g in m.groups())
            continue
        if (m := PTXAS_USED_RE.search(line)) and current is not None and "regs" not in current:
            current["regs"] = int(m.group(1))
            if s := PTXAS_SMEM_RE.search(line):
                current["smem"] = int(s.group(1))
    return [PtxasUsage(function=f["function"], target=f["target"], line=f["line"],
                       registers=f.get("regs"), stack_frame_bytes=f.get("stack"),
                       spill_stores_bytes=f.get("stores"), spill_loads_bytes=f.get("loads"),
                       smem_bytes=f.get("smem"))
            for f in [*entries, *devices.values()]]


# ptxas "Potential Performance Loss" diagnostics about Hopper's asynchronous wgmma pipeline:
# C7514/C7515/C7511 say the wgmmas were serialized, C7517 that the compiler injected
# warpgroup.wait to read accumulator registers (the MMAs no longer overlap what follows).
WGMMA_SERIALIZED_RE = re.compile(r"wgmma\.mma_async instructions are serialized")
WGMMA_WAIT_RE = re.compile(r"warpgroup\.wait is injected")


@dataclass(frozen=True)
class WgmmaDiagnostics:
    serialized: bool
    waits_injected: bool


def wgmma_diagnostics(log: str) -> WgmmaDiagnostics:
    """What a ptxas log says about the wgmma pipeline (both False when it says nothing)."""
    return WgmmaDiagnostics(serialized=WGMMA_SERIALIZED_RE.search(log) is not None,
                            waits_injected=WGMMA_WAIT_RE.search(log) is not None)


def ptxas_usage(log: str, function: str) -> PtxasUsage | None:
    """The entry ``function`` of a log (the first, if it was compiled for several targets)."""
    return next((u for u in parse_ptxas_log(log) if u.function == function and u.is_entry), None)


def run_ptxas(ptx: str, gpu_name: str, flags: list[str] | None = None, *,
              capability: int | None = None, timeout_s: float = TOOL_TIMEOUT_S) -> str:
    """``ptxas -v FLAGS --gpu-name=GPU`` on PTX text; returns its log (stdout + stderr)."""
    tool = require_tool(Tool.PTXAS, capability)
    with tempfile.TemporaryDirectory(prefix="kernaudit-ptxas-") as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        cmd = [str(tool), "-v", *(flags or []), f"--gpu-name={gpu_name}", str(src), "-o", f"{src}.o"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise ToolError(f"ptxas ran past {timeout_s:g} s") from None
    if proc.returncode != 0:
        first = next((ln.strip() for ln in proc.stderr.splitlines() if ln.strip()), "")
        raise ToolError(f"ptxas failed (exit {proc.returncode}): {first}")
    return proc.stdout + proc.stderr


# ------------------------------------------------------------------------------------------
# cuobjdump -res-usage
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CubinUsage:
    """One function's line from ``cuobjdump -res-usage``: what the driver will load.

    On sm_90 cubins ``shared_bytes`` includes the driver's 1 KiB per-block reserve.
    """

    function: str
    registers: int
    stack_bytes: int
    shared_bytes: int
    local_bytes: int


_CUOBJ_FUNC_RE = re.compile(r"^\s*Function (\S+):\s*$")
_CUOBJ_FIELD_RE = re.compile(r"([A-Z]+(?:\[\d+\])?):(\d+)")


def parse_res_usage(text: str) -> dict[str, CubinUsage]:
    """``{function: usage}``; a function whose line lacks REG/STACK/SHARED/LOCAL is left out."""
    out: dict[str, CubinUsage] = {}
    current: str | None = None
    for line in text.splitlines():
        if m := _CUOBJ_FUNC_RE.match(line):
            current = m.group(1)
            continue
        if current is not None and "REG:" in line:
            f = {k: int(v) for k, v in _CUOBJ_FIELD_RE.findall(line)}
            if all(k in f for k in ("REG", "STACK", "SHARED", "LOCAL")):
                out[current] = CubinUsage(current, f["REG"], f["STACK"], f["SHARED"], f["LOCAL"])
            current = None
    return out


def _cuobjdump(cubin: bytes | Path, flag: str, timeout_s: float) -> str:
    """``cuobjdump FLAG`` on a cubin (its bytes, or a file); its stdout."""
    tool = require_tool(Tool.CUOBJDUMP)
    with tempfile.TemporaryDirectory(prefix="kernaudit-cubin-") as tmp:
        if isinstance(cubin, (bytes, bytearray)):
            path = Path(tmp) / "k.cubin"
            path.write_bytes(cubin)
        else:
            path = Path(cubin)
        try:
            proc = subprocess.run([str(tool), flag, str(path)], capture_output=True,
                                  text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise ToolError(f"cuobjdump ran past {timeout_s:g} s") from None
    if proc.returncode != 0:
        first = next((ln.strip() for ln in proc.stderr.splitlines() if ln.strip()), "")
        raise ToolError(f"cuobjdump failed (exit {proc.returncode}): {first}")
    return proc.stdout


def cubin_res_usage(cubin: bytes | Path, *, timeout_s: float = TOOL_TIMEOUT_S) -> dict[str, CubinUsage]:
    """``cuobjdump -res-usage`` on a cubin (its bytes, or a file)."""
    return parse_res_usage(_cuobjdump(cubin, "-res-usage", timeout_s))


def cubin_sass(cubin: bytes | Path, *, timeout_s: float = TOOL_TIMEOUT_S) -> str:
    """``cuobjdump -sass`` on a cubin: the machine code the driver loads, as text."""
    return _cuobjdump(cubin, "-sass", timeout_s)


__all__ = [
    "CubinUsage", "PTXAS_FRAME_RE", "PtxasUsage", "Tool", "ToolError", "WgmmaDiagnostics",
    "cubin_res_usage", "cubin_sass", "find_tool", "parse_ptxas_log", "parse_res_usage", "ptxas_usage",
    "require_tool", "run_ptxas", "wgmma_diagnostics",
]
