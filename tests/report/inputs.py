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
                        advisor_note=result.note(), history=history)
