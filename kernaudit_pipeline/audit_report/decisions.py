"""How a decision reads, wherever it is shown (report.html, report.md, the terminal).

A decision is the ``Decision.to_json()`` record of :mod:`kernaudit_pipeline.core.verdicts`:
one per (kernel, shape, device). This module turns it into display fields, once, so the
dashboard, the Markdown and ``kernaudit audit``'s closing table say the same thing:

- the baseline by what actually ran: ``cuBLAS via torch.matmul``, ``FlashAttention-2 via SDPA``,
  ``CUTLASS via torch._scaled_mm`` (``baseline_backend`` from the runner), or the called name with
  "backend not recorded" when the trace did not say;
- the paired speedup with its 95 % interval;
- whether the numbers are measured, modelled or predicted;
- one line of evidence: the decision's reason, then the config's registers, spills, shared
  memory, occupancy and roofline position (from the decision's evidence, else its run row);
- the other references the config was timed against, each with its speedup.
"""

from __future__ import annotations

from collections.abc import Mapping

from kernaudit_pipeline.audit_report.formatting import fmt_ci, fmt_num, is_blank
from kernaudit_pipeline.core.verdicts import DataKind, DecisionKind

ORDER = {str(DecisionKind.SHIP_CONFIG): 0, str(DecisionKind.KEEP_BASELINE): 1, str(DecisionKind.NO_DECISION): 2}
LABELS = {str(DecisionKind.SHIP_CONFIG): "ship config", str(DecisionKind.KEEP_BASELINE): "keep baseline",
          str(DecisionKind.NO_DECISION): "no decision"}
SHORT_NAMES = {"torch.nn.functional.scaled_dot_product_attention": "SDPA", "F.scaled_dot_product_attention": "SDPA"}
DATA_NOTES = {str(DataKind.MEASURED): "timed on a GPU",
              str(DataKind.MODELLED): "the synthetic generator's model, not a measurement",
              str(DataKind.PREDICTED): "the static cost model, no GPU at all"}


def baseline_label(name: object, backend: object) -> str:
    """``cuBLAS via torch.matmul``; the called name alone says the backend is unknown."""
    name = None if is_blank(name) else str(name)
    backend = None if is_blank(backend) else str(backend)
    shown = SHORT_NAMES.get(name, name) if name else None
    if backend and shown:
        return f"{backend} via {shown}"
    if backend:
        return backend
    if shown:
        return f"{shown} (backend not recorded)"
    return "no baseline"


def speedup_text(speedup: object, low: object = None, high: object = None) -> str:
    """``1.234× [1.201, 1.262]``, ``1.234× (no CI)``, or "–"."""
    if is_blank(speedup):
        return "–"
    ci = fmt_ci(low, high)
    return f"{float(speedup):.3f}× " + (ci if ci else "(no CI)")


def _first(values: Mapping[str, object], *keys: str) -> object:
    for key in keys:
        value = values.get(key)
        if not is_blank(value):
            return value
    return None


def evidence_facts(evidence: Mapping[str, object]) -> list[str]:
    """The config's resources in a fixed order, each fact only when known."""
    facts = []
    regs = _first(evidence, "registers_per_thread", "registers")
    if regs is not None:
        facts.append(f"{fmt_num(regs, 0)} regs/thread")
    spill = _first(evidence, "spill_stores_bytes", "spill_bytes")
    stack = _first(evidence, "stack_frame_bytes")
    if spill is not None and float(spill) > 0:
        facts.append(f"{fmt_num(float(spill), 0)} B spilled")
    elif stack is not None and float(stack) > 0:
        facts.append(f"{fmt_num(float(stack), 0)} B stack frame")
    elif spill is not None:
        facts.append("no spills")
    smem = _first(evidence, "shared_mem_bytes")
    if smem is not None:
        facts.append(f"{fmt_num(float(smem), 0)} B smem")
    occ = _first(evidence, "occupancy_pct")
    if occ is not None:
        limiter = _first(evidence, "occupancy_limiter")
        facts.append(f"occupancy {float(occ):.1f} %" + (f" ({limiter}-limited)" if limiter else ""))
    stall = _first(evidence, "stall_lg_throttle_pct")
    if stall is not None:
        facts.append(f"lg_throttle {float(stall):.1f} % of stalls")
    bottleneck = _first(evidence, "bottleneck")
    sol = _first(evidence, "compute_sol_pct") if str(bottleneck).startswith("compute") else _first(
        evidence, "memory_sol_pct")
    if bottleneck is not None:
        facts.append(f"{bottleneck}" + (f", {float(sol):.0f} % of SOL" if sol is not None else ""))
    mode = _first(evidence, "timing_mode")
    if mode is not None:
        facts.append(f"timed with {mode}")
    return facts


def references(decision: Mapping[str, object]) -> list[str]:
    """The other references (not the primary baseline), each ``name: speedup [CI]`` or why it did not run."""
    out = []
    for ref in decision.get("baselines") or []:
        if ref.get("primary"):
            continue
        label = baseline_label(ref.get("name"), ref.get("backend"))
        if is_blank(ref.get("speedup")):
            out.append(f"{label}: not timed" + (f" ({ref['run_status']})" if ref.get("run_status") else ""))
        else:
            out.append(f"{label}: {speedup_text(ref.get('speedup'), ref.get('speedup_ci_low'), ref.get('speedup_ci_high'))}")
    return out


def view(decision: Mapping[str, object], row: Mapping[str, object] | None = None) -> dict:
    """A decision with its display fields; ``row`` is the chosen config's run row, for evidence it lacks."""
    evidence = {**(row or {}), **{k: v for k, v in (decision.get("evidence") or {}).items() if not is_blank(v)}}
    kind = str(decision.get("decision"))
    data_kind = str(decision.get("data_kind") or "")
    return {
        **decision,
        "label": LABELS.get(kind, kind),
        "baseline_label": baseline_label(decision.get("baseline_name"), decision.get("baseline_backend")),
        "speedup_text": speedup_text(decision.get("speedup"), decision.get("speedup_ci_low"),
                                     decision.get("speedup_ci_high")),
        "data_note": DATA_NOTES.get(data_kind, "source not stated"),
        "facts": evidence_facts(evidence),
        "references": references(decision),
        "config_text": decision.get("config_id") or ("–" if kind != str(DecisionKind.KEEP_BASELINE) else "baseline"),
    }


def sort_key(decision: Mapping[str, object]) -> tuple:
    """Act-on-first order: ships by speedup, then keep-baseline, then no decision; by name within."""
    speedup = decision.get("speedup")
    return (ORDER.get(str(decision.get("decision")), 9),
            -(float(speedup) if not is_blank(speedup) and str(decision.get("decision")) == "SHIP_CONFIG" else 0.0),
            str(decision.get("kernel_name")), str(decision.get("shape_name")), str(decision.get("device_name")))
