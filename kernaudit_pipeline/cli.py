"""The ``kernaudit`` console script: one subcommand per stage.

Subcommand modules are imported lazily so that ``kernaudit bench`` works on a
GPU host that has only torch, triton and numpy.
"""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS = {
    "assess": ("kernaudit_pipeline.assess", "assess seed-format JSON items (status, spills, speedup, recommendation)"),
    "ingest": ("kernaudit_pipeline.ingest", "detect and normalize profiler/benchmark files into kernel_runs + quarantine"),
    "static": ("kernaudit_pipeline.static_resources", "compile-time resource table (registers, spills, SRAM) per config"),
    "audit": ("kernaudit_pipeline.audit", "materialize the whole asset graph in-process and print the report path"),
    "bench": ("kernaudit_pipeline.bench.runner", "GPU runner: time kernels against baselines, write JSONL traces"),
    "synth": ("kernaudit_pipeline.synthetic", "regenerate the committed synthetic attention benchmark tables"),
    "review": ("kernaudit_pipeline.review", "approve or reject recommendations (append-only audit trail)"),
    "export": ("kernaudit_pipeline.config_export", "export approved configs as vLLM-style JSON"),
    "history": ("kernaudit_pipeline.history", "audit history: list audits, accept one as the reference, compare"),
}


def usage() -> str:
    lines = ["usage: kernaudit COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"kernaudit: unknown command {name!r} (try: {', '.join(SUBCOMMANDS)})", file=sys.stderr)
        return 2
    module_name = SUBCOMMANDS[name][0]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        print(f"kernaudit {name}: unavailable here ({exc})", file=sys.stderr)
        return 2
    try:
        return int(module.cli(rest) or 0)
    except KeyboardInterrupt:
        print(f"kernaudit {name}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `kernaudit assess f.json | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
