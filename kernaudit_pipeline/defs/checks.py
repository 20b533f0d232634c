"""Asset checks: the normalized table honours its schema and loses no row; the report is complete,
its counts add up and it needs nothing from the network."""


import json
import re
from collections import Counter

import pandas as pd
import pandera.pandas as pa
from dagster import (AssetCheckExecutionContext, AssetCheckResult, AssetCheckSeverity, AssetIn, AssetKey,
                     MetadataValue, asset_check)

from kernaudit_pipeline.core.verdicts import DataKind
from kernaudit_pipeline.defs.resources import AuditSettings
from kernaudit_pipeline.kernel_runs import KernelRuns
from kernaudit_pipeline.raw_traces import RawTraces


@asset_check(asset=AssetKey("kernel_runs"), description="kernel_runs validates against the pandera KernelRuns model.")
def kernel_runs_schema(context: AssetCheckExecutionContext, kernel_runs: pd.DataFrame) -> AssetCheckResult:
    try:
        KernelRuns.validate(kernel_runs, lazy=True)
    except pa.errors.SchemaErrors as exc:
        return AssetCheckResult(passed=False, severity=AssetCheckSeverity.ERROR,
                                metadata={"failures": len(exc.failure_cases)})
    return AssetCheckResult(passed=True, metadata={"rows": len(kernel_runs)})


@asset_check(asset=AssetKey("kernel_runs"), additional_ins={"raw_traces": AssetIn("raw_traces"),
                                                            "quarantine": AssetIn("quarantine")},
             description="Every input row is in kernel_runs or in quarantine, exactly once.")
def rows_accounted_for(context: AssetCheckExecutionContext, kernel_runs: pd.DataFrame,
                       raw_traces: RawTraces, quarantine: pd.DataFrame) -> AssetCheckResult:
    rows_in = len(raw_traces.rows) + len(raw_traces.quarantine)
    rows_out = len(kernel_runs) + len(quarantine)
    return AssetCheckResult(passed=rows_in == rows_out,
                            metadata={"rows_in": rows_in, "kernel_runs": len(kernel_runs),
                                      "quarantine": len(quarantine)})


# --- audit_report: the files as written, read back from this run's report folder ------------------

def _report_json(settings: AuditSettings, run_id: str) -> dict | None:
    path = settings.paths().reports / run_id / "report.json"
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _missing(settings: AuditSettings, run_id: str) -> AssetCheckResult:
    return AssetCheckResult(passed=False, severity=AssetCheckSeverity.ERROR,
                            description=f"no readable report.json in {settings.paths().reports / run_id}")


@asset_check(asset=AssetKey("audit_report"), description="Every (kernel, shape, device) group has exactly one "
             "decision in report.json, each saying whether its numbers are measured, modelled or predicted.")
def decision_per_group(context: AssetCheckExecutionContext, settings: AuditSettings) -> AssetCheckResult:
    payload = _report_json(settings, context.run.run_id)
    if payload is None:
        return _missing(settings, context.run.run_id)
    decisions = payload.get("decisions") or []
    keys = [(d.get("kernel_name"), d.get("shape_name"), d.get("device_name")) for d in decisions]
    groups = {tuple(g) for g in payload.get("groups") or []}
    kinds = {str(k) for k in DataKind}
    unlabelled = sum(1 for d in decisions if d.get("data_kind") not in kinds)
    uncovered = len(groups - set(keys))
    duplicated = len(keys) - len(set(keys))
    passed = bool(decisions) and not unlabelled and not uncovered and not duplicated
    return AssetCheckResult(passed=passed, severity=AssetCheckSeverity.WARN, metadata={
        "decisions": len(decisions), "groups": len(groups), "groups_without_decision": uncovered,
        "duplicated": duplicated, "without_data_kind": unlabelled,
        "by_decision": MetadataValue.json(dict(Counter(str(d.get("decision")) for d in decisions)))})


@asset_check(asset=AssetKey("audit_report"), description="The header's counts add up: the verdicts sum to the "
             "judged candidate runs, and candidates + baseline rows + profiler evidence rows = kernel_runs rows.")
def counts_add_up(context: AssetCheckExecutionContext, settings: AuditSettings) -> AssetCheckResult:
    payload = _report_json(settings, context.run.run_id)
    if payload is None:
        return _missing(settings, context.run.run_id)
    counts, statuses = payload.get("counts") or {}, payload.get("status_counts") or {}
    verdicts = sum(int(v) for v in statuses.values())
    parts = sum(int(counts.get(k) or 0) for k in ("candidates", "baseline_rows", "profiler_rows"))
    passed = verdicts == counts.get("candidates") and parts == counts.get("runs")
    return AssetCheckResult(passed=passed, severity=AssetCheckSeverity.ERROR, metadata={
        "runs": counts.get("runs"), "candidates": counts.get("candidates"), "verdicts": verdicts,
        "baseline_rows": counts.get("baseline_rows"), "profiler_rows": counts.get("profiler_rows")})


@asset_check(asset=AssetKey("audit_report"), description="report.html is self-contained (no script, style or "
             "image fetched from elsewhere) and every export it links to exists.")
def self_contained(context: AssetCheckExecutionContext, settings: AuditSettings) -> AssetCheckResult:
    folder = settings.paths().reports / context.run.run_id
    try:
        html = (folder / "report.html").read_text()
    except OSError:
        return _missing(settings, context.run.run_id)
    external = sorted(set(re.findall(r'<(?:script|img|link|iframe)\b[^>]*\b(?:src|href)="((?:https?:)?//[^"]+)"',
                                     html)))
    linked = set(re.findall(r'<a [^>]*href="([^"#:/][^":]*)"', html))  # relative links: the exports
    absent = sorted(name for name in linked if not (folder / name).is_file())
    return AssetCheckResult(passed=not external and not absent, severity=AssetCheckSeverity.ERROR, metadata={
        "html_bytes": len(html.encode()), "external_resources": MetadataValue.json(external[:20]),
        "missing_exports": MetadataValue.json(absent[:20]), "exports_linked": len(linked)})


REPORT_CHECKS = [decision_per_group, counts_add_up, self_contained]
