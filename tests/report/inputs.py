"""Real report inputs from the library stages (no Dagster): the committed traces
through normalize -> comparisons -> diagnose -> rules, plus a real static compile
row set when asked. Shared by the report and browser tests."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from kernaudit_pipeline import comparisons, kernel_runs, raw_traces, spill_diagnostics
from kernaudit_pipeline.audit_report import ReportInputs
from kernaudit_pipeline.settings import H200_SAMPLES_DIR, SYNTHETIC_DIR, data_paths

# Real H200 runner and ncu rows (when committed) plus the synthetic attention tables: a fixed
# list, so these tests do not depend on which other sample files exist.
SAMPLE_NAMES = ("bench_h200.jsonl", "ncu_raw.csv")


def sample_files() -> list[Path]:
    return [H200_SAMPLES_DIR / n for n in SAMPLE_NAMES if (H200_SAMPLES_DIR / n).exists()] + sorted(
        SYNTHETIC_DIR.glob("*.csv"))


def library_inputs(data_dir: Path, *, rename: dict[str, str] | None = None, static: pd.DataFrame | None = None,
                   history: pd.DataFrame | None = None) -> ReportInputs:
    """``rename`` maps kernel names to others (e.g. a hostile one) before anything is computed."""
    from kernaudit_pipeline.recommendations import stage
    from kernaudit_pipeline.recommendations.advisor import AdvisorSettings
    from kernaudit_pipeline.recommendations.verify import VerifySettings

    data_paths(data_dir).ensure()
    traces = raw_traces.read_files(sample_files(), raw_traces.TraceMode.COMMITTED_SAMPLES,
                                   "committed samples (test): " + ", ".join(p.name for p in sample_files()))
    rows = [dict(r) for r in traces.rows]
    for row in rows:
        row["kernel_name"] = (rename or {}).get(row.get("kernel_name"), row.get("kernel_name"))
    checked = kernel_runs.normalize(rows)
    comp = comparisons.build_comparisons(checked.kernel_runs, 0.02)
    diag = spill_diagnostics.diagnose(comp, peaks=traces.peaks)
    result = stage.run(diag, verify_settings=VerifySettings(max_compiles=0, noise_band=0.02),
                       advisor_settings=AdvisorSettings.from_env(enabled=False))
    return ReportInputs(run_id="test-run", mode_note=traces.mode_note, files=traces.files,
                        kernel_runs=checked.kernel_runs, quarantine=checked.quarantine, diagnostics=diag,
                        static=static if static is not None else pd.DataFrame(),
                        recommendations=list(result.recommendations), rules=traces.rules,
                        advisor_note=result.note(), history=history, decisions=result.decisions,
                        advisor=result.advisor, heuristics=result.heuristics)


BACKENDS = {"torch.matmul": "cuBLAS", "torch._scaled_mm": "CUTLASS (f8f8bf16_rowwise)",
            "torch.nn.functional.scaled_dot_product_attention": "FlashAttention-2"}


def constructed_decisions(diag: pd.DataFrame) -> tuple:
    """Decision records built here from the fastest correct config of each group, the way the
    decision engine hands them over (core.verdicts.Decision), so the report is tested against the
    real record type. One group is left without a config (NO_DECISION), one gets a second
    reference, one is labelled modelled."""
    from kernaudit_pipeline.audit_report.frames import best_per_group
    from kernaudit_pipeline.core.configs import parse_config_id
    from kernaudit_pipeline.core.verdicts import BaselineResult, DataKind, Decision, DecisionKind

    out = []
    for i, (_, row) in enumerate(best_per_group(diag).iterrows()):
        speedup = row.get("speedup")
        lo, hi = row.get("speedup_ci_low"), row.get("speedup_ci_high")
        timed = pd.notna(speedup)
        kind = DecisionKind.NO_DECISION if not timed or i == 2 else (
            DecisionKind.SHIP_CONFIG if speedup > 1.02 else DecisionKind.KEEP_BASELINE)
        name = row.get("baseline_name") if pd.notna(row.get("baseline_name")) else None
        refs = (BaselineResult(name="torch.compile", backend="Inductor (Triton)", speedup=0.97, speedup_ci_low=0.95,
                               speedup_ci_high=0.99),) if i == 0 else ()
        out.append(Decision(
            kernel_name=row["kernel_name"], shape_name=row.get("shape_name"), device_name=row.get("device_name"),
            decision=kind, config_id=None if kind == DecisionKind.NO_DECISION else row["config_id"],
            speedup=float(speedup) if timed else None, speedup_ci_low=float(lo) if pd.notna(lo) else None,
            speedup_ci_high=float(hi) if pd.notna(hi) else None, baseline_name=name,
            baseline_backend=BACKENDS.get(name), data_kind=DataKind.MODELLED if row.get("source_format") == "synthetic"
            else DataKind.MEASURED,
            reason=("the CI lies above 1 + noise band" if kind == DecisionKind.SHIP_CONFIG else
                    "the best correct config is slower than the baseline" if kind == DecisionKind.KEEP_BASELINE
                    else "its CI straddles 1.0: noise"),
            config=parse_config_id(row["config_id"]) or {},
            evidence={"registers_per_thread": row.get("registers_per_thread"),
                      "occupancy_limiter": row.get("occupancy_limiter")},
            baselines=refs, candidates=int(((diag["kernel_name"] == row["kernel_name"])
                                            & (diag["shape_name"] == row.get("shape_name"))).sum())))
    return tuple(out)
