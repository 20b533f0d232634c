"""The decisions as ``kernaudit audit`` prints them at the end: one row per decision, then where to look.

A rich table on a terminal, plain aligned columns otherwise (a pipe, a log, CI), so the
same lines can be grepped. Every decision is printed; nothing is cut.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO

from kernaudit_pipeline.audit_report import decisions as decision_text
from kernaudit_pipeline.audit_report.formatting import fmt_ci, fmt_num, is_blank

HEADERS = ("decision", "kernel", "shape", "device", "config", "speedup [95% CI]", "against", "data")
BEST_HEADERS = ("kernel", "shape", "device", "fastest correct config", "speedup [95% CI]", "status")


def decision_rows(decisions: Sequence[dict]) -> list[tuple[str, ...]]:
    rows = []
    for d in sorted(decisions, key=decision_text.sort_key):
        v = decision_text.view(d)
        rows.append((str(d.get("decision")), str(d.get("kernel_name")), str(d.get("shape_name") or "–"),
                     str(d.get("device_name") or "–"), str(v["config_text"]), v["speedup_text"], v["baseline_label"],
                     str(d.get("data_kind") or "–")))
    return rows


def best_rows(best: Sequence[dict]) -> list[tuple[str, ...]]:
    """Without decisions: the fastest correct config of each group, so the terminal still names every group."""
    return [(str(r.get("kernel_name")), str(r.get("shape_name") or "–"), str(r.get("device_name") or "–"),
             str(r.get("config_id") or "–"),
             "–" if is_blank(r.get("speedup")) else
             f"{fmt_num(float(r['speedup']), 3)}× {fmt_ci(r.get('speedup_ci_low'), r.get('speedup_ci_high')) or '(no CI)'}",
             str(r.get("status"))) for r in best]


def plain_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell, two spaces apart; nothing truncated."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], stream: TextIO | None = None,
                use_rich: bool | None = None) -> None:
    stream = stream or sys.stdout
    if use_rich is None:
        use_rich = getattr(stream, "isatty", lambda: False)()
    if use_rich:
        try:
            from rich.console import Console
            from rich.table import Table
        except ImportError:
            use_rich = False
    if use_rich:
        table = Table(title=title, title_justify="left", show_lines=False)
        for h in headers:
            table.add_column(h, overflow="fold")
        styles = {"SHIP_CONFIG": "bold green", "KEEP_BASELINE": "bold red", "NO_DECISION": "bold yellow"}
        for r in rows:
            table.add_row(*r, style=styles.get(r[0]))
        Console(file=stream, soft_wrap=False).print(table)
        return
    print(title, file=stream)
    print(plain_table(headers, rows), file=stream)


def print_decisions(payload: dict, stream: TextIO | None = None, use_rich: bool | None = None) -> int:
    """The decisions of a report.json payload (or, without any, every group's fastest config); returns rows."""
    decisions = payload.get("decisions") or []
    if decisions:
        counts = ", ".join(f"{n} {k}" for k, n in (payload.get("decision_counts") or {}).items())
        print_table(f"Decisions ({len(decisions)}: {counts})", HEADERS, decision_rows(decisions), stream, use_rich)
        return len(decisions)
    best = payload.get("best") or []
    print_table(f"No decision was handed over: the fastest correct config of each of {len(best)} groups "
                "(for reference, not a decision)", BEST_HEADERS, best_rows(best), stream, use_rich)
    return len(best)
