"""The ``kernaudit`` console script: one argparse tree, one module per subcommand.

Each subcommand lives in ``cli/<command>.py`` and exposes ``add_arguments(parser)`` and
``run(args) -> int``. Those modules import nothing heavy at import time (the implementation is
imported inside ``run``), so building the whole tree is cheap and ``kernaudit bench`` works on a
GPU host that has only torch, triton and numpy.

Every failure ends in one line on stderr: :class:`~kernaudit_pipeline.cli.errors.UserError`
for input the user can fix (exit 2), anything unexpected as "internal error" with the
traceback written to a log file under the data folder that the line names (exit 1).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from collections.abc import Mapping
from datetime import datetime, timezone
from types import MappingProxyType

from kernaudit_pipeline.cli.errors import EXIT_FAILURE, EXIT_USAGE, UserError, one_line

PROG = "kernaudit"

# command -> (module under kernaudit_pipeline.cli, one-line help). Order is the help's order.
COMMANDS: Mapping[str, tuple[str, str]] = MappingProxyType({
    "assess": ("assess", "assess seed-format JSON items: status, spills, speedup, recommendation"),
    "ingest": ("ingest", "detect and normalize profiler and benchmark files into kernel_runs and quarantine"),
    "static": ("static", "compile-time resources (registers, spills, shared memory) per config, no GPU"),
    "rank": ("rank", "order a config space by predicted time (static cost model), no GPU"),
    "bench": ("bench", "GPU runner: paired timing of kernels against their baselines, JSONL out"),
    "audit": ("audit", "materialize the whole asset graph in-process and print the decisions"),
    "review": ("review", "approve or reject recommendations (append-only, hash-chained trail)"),
    "export": ("export", "export approved configs as vLLM config files"),
    "history": ("history", "audit history: list audits, accept a reference, compare"),
    "synth": ("synth", "regenerate the committed synthetic (modelled) attention tables"),
})


class Parser(argparse.ArgumentParser):
    """argparse that raises :class:`UserError` instead of printing usage and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{message} (see: {self.prog} --help)")


def _load(module: str):
    return importlib.import_module(f"kernaudit_pipeline.cli.{module}")


def _available() -> dict[str, object]:
    """Every subcommand module, imported (they are light)."""
    return {name: _load(module) for name, (module, _) in COMMANDS.items()}


def build_parser() -> Parser:
    root = Parser(prog=PROG, description="A local auditor of Triton kernel latency and memory.")
    sub = root.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name, module in _available().items():
        help_ = COMMANDS[name][1]
        if getattr(module, "LEGACY", False):  # parsed by its own module until moved here
            sub.add_parser(name, help=help_, description=help_, add_help=False)
            continue
        parser = sub.add_parser(name, help=help_, description=help_)
        module.add_arguments(parser)
        parser.set_defaults(_run=module.run, _command=name)
    return root


def _internal_error(command: str, exc: BaseException) -> int:
    """Write the traceback to a log file in the data folder; print one line naming it."""
    where = ""
    try:
        from kernaudit_pipeline.settings import data_paths

        logs = data_paths().root / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%f")
        path = logs / f"{command}-{stamp}.log"
        path.write_text("".join(traceback.format_exception(exc)))
        where = f" (details: {path})"
    except OSError:
        pass
    print(one_line(f"{PROG} {command}: internal error: {type(exc).__name__}: {exc}{where}"), file=sys.stderr)
    return EXIT_FAILURE


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and not argv[0].startswith("-") else ""
    try:
        parser = build_parser()
        if not argv:
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        legacy = _available().get(command)
        if getattr(legacy, "LEGACY", False):
            return int(legacy.run_legacy(argv[1:]) or 0)
        args = parser.parse_args(argv)
        if not getattr(args, "_run", None):
            parser.print_help()
            return 0
        return int(args._run(args) or 0)
    except UserError as exc:
        print(f"{PROG} {command}: {exc}" if command else f"{PROG}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"{PROG} {command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `kernaudit assess f.json | head`
        try:
            sys.stderr.close()
        finally:
            return 0
    except SystemExit as exc:  # --help, or a library calling sys.exit
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_FAILURE)
    except MemoryError:
        print(f"{PROG} {command}: out of memory", file=sys.stderr)
        return EXIT_FAILURE
    except Exception as exc:  # noqa: BLE001 - the last line of defence: never a traceback
        return _internal_error(command or "main", exc)


__all__ = ["COMMANDS", "EXIT_FAILURE", "EXIT_USAGE", "Parser", "UserError", "build_parser", "main"]
