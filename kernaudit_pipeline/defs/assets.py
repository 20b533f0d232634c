"""The asset chain. Each asset calls the library module of the same name.

``raw_traces`` is graph-backed (its runner steps are in ``bench_steps.py``) and built by
:func:`build_raw_traces` for the devices the environment declares; ``audit_history`` and
its check are in ``audit_history.py``.
"""


from dataclasses import asdict

import pandas as pd
from dagster import (AssetExecutionContext, AssetOut, AssetsDefinition, MaterializeResult, MetadataValue, Output,
                     ResourceParam, asset, graph_asset, multi_asset)
from dagster_mlflow.resources import MlFlow

from kernaudit_pipeline import comparisons as comparisons_lib
from kernaudit_pipeline import gpu_devices
from kernaudit_pipeline import kernel_runs as kernel_runs_lib
from kernaudit_pipeline import kernel_sources as kernel_sources_lib
from kernaudit_pipeline import raw_traces as raw_traces_lib
from kernaudit_pipeline import spill_diagnostics as spill_diagnostics_lib
from kernaudit_pipeline.defs import bench_steps
from kernaudit_pipeline.defs.metadata import table
from kernaudit_pipeline.defs.resources import AuditSettings
from kernaudit_pipeline.defs.run_tags import selected_modules

RAW_TRACES_DESCRIPTION = (
    "GPU benchmark runs (the runner, one step per GPU, each pinned with CUDA_VISIBLE_DEVICES) or, without a "
    "GPU, the committed H200 sample traces plus the synthetic tables. GPU-tagged: each device has its own pool "
    "('gpu' on a one-GPU host or when the devices are found at run start, 'gpu-<id>' for declared devices), "
    "limited to one step.")


@asset(group_name="sources", description="Hashes of the kernel modules in kernels/; the sensor's cursor.")
def kernel_sources(context: AssetExecutionContext) -> pd.DataFrame:
    frame = pd.DataFrame([asdict(s) for s in kernel_sources_lib.observe()])
    context.add_output_metadata({"kernels": len(frame), "table": table(frame)})
    return frame


@asset(group_name="static", description="Ahead-of-time sm_90 compile of every (kernel, config): "
       "registers, spills, stack, shared memory. Needs no GPU.")
def static_resources(context: AssetExecutionContext, settings: AuditSettings,
                     kernel_sources: pd.DataFrame) -> pd.DataFrame:
    from kernaudit_pipeline import static_resources as static_lib

    if not settings.static_enabled:
        context.log.info("static audit disabled by settings")
        return pd.DataFrame()
    wanted = set(settings.static_kernels) | set(selected_modules(context.run.tags) or [])
    results = []
    for module in kernel_sources["module"]:
        if wanted and module not in wanted:
            continue
        configs = None
        if settings.static_max_configs:
            from kernaudit_pipeline.kernel_spec import load_kernel_module

            configs = load_kernel_module(module).CONFIGS[: settings.static_max_configs]
        results += static_lib.audit_kernel(module, configs=configs, arch=settings.static_arch,
                                           timeout_s=settings.static_timeout_s,
                                           cache_dir=settings.paths().static_cache)
    frame = static_lib.to_frame(results)
    spilling = frame[frame.get("spill_stores_bytes", pd.Series(dtype=float)).fillna(0) > 0] if len(frame) else frame
    context.add_output_metadata({
        "configs_compiled": len(frame),
        "spilling_configs": len(spilling),
        "statuses": MetadataValue.json(frame["status"].astype(str).value_counts().to_dict() if len(frame) else {}),
        "spills": table(spilling, ["kernel_name", "config_id", "registers_per_thread", "spill_stores_bytes",
                                   "stack_frame_bytes", "shared_mem_bytes"]),
    })
    return frame


def build_raw_traces(devices: list[gpu_devices.GpuDevice] | None,
                     step_tags: bench_steps.StepTags | None = None) -> AssetsDefinition:
    """``raw_traces``: the runner steps for ``devices`` (None or empty: found at run start), then the merge."""
    steps = bench_steps.runner_steps(devices, step_tags)

    @graph_asset(name="raw_traces", group_name="traces", description=RAW_TRACES_DESCRIPTION)
    def raw_traces():
        return bench_steps.merge_traces([step() for step in steps])

    return raw_traces


@multi_asset(
    group_name="tables",
    outs={
        "kernel_runs": AssetOut(description="Normalized runs, validated by the pandera KernelRuns model."),
        "quarantine": AssetOut(description="Rows that failed parsing or validation, with the reason."),
    },
)
def kernel_runs(context: AssetExecutionContext, raw_traces: raw_traces_lib.RawTraces):
    checked = kernel_runs_lib.normalize(raw_traces.rows)
    quarantine = pd.concat([pd.DataFrame(raw_traces.quarantine, columns=list(kernel_runs_lib.QUARANTINE_COLUMNS)),
                            checked.quarantine], ignore_index=True)
    rows_in = len(raw_traces.rows) + len(raw_traces.quarantine)
    yield Output(checked.kernel_runs, "kernel_runs", metadata={
        "rows": len(checked.kernel_runs), "rows_in": rows_in, "quarantined": len(quarantine),
        "by_source": MetadataValue.json(checked.kernel_runs["source_format"].value_counts().to_dict()),
    })
    yield Output(quarantine, "quarantine", metadata={
        "rows": len(quarantine), "reasons": table(quarantine, ["source_file", "source_row", "reason"], limit=20),
    })


@asset(group_name="analysis", description="speedup = baseline_us / latency_us with a status per run "
       "(IMPROVED, REGRESSION, NEUTRAL inside the noise band, FAILED, INCONCLUSIVE).")
def comparisons(context: AssetExecutionContext, settings: AuditSettings, kernel_runs: pd.DataFrame,
                static_resources: pd.DataFrame) -> pd.DataFrame:
    runs = kernel_runs_lib.attach_static_resources(kernel_runs, static_resources)
    frame = comparisons_lib.build_comparisons(runs, settings.noise_band)
    worst = frame[frame["status"] == "REGRESSION"].nsmallest(5, "speedup")
    context.add_output_metadata({
        "statuses": MetadataValue.json(frame["status"].value_counts().to_dict()),
        "top_regressions": table(worst[["kernel_name", "shape_name", "config_id", "speedup"]]),
    })
    return frame


@asset(group_name="analysis", description="Spill detection with the spill-to-stall evidence chain, "
       "occupancy and its limiter, SRAM efficiency and roofline position.")
def spill_diagnostics(context: AssetExecutionContext, comparisons: pd.DataFrame,
                      raw_traces: raw_traces_lib.RawTraces) -> pd.DataFrame:
    frame = spill_diagnostics_lib.diagnose(comparisons, peaks=raw_traces.peaks)
    spills = frame[frame["spill_detected"]]
    context.add_output_metadata({
        "spilling_rows": len(spills),
        "top_spills": table(spills.sort_values("spill_stores_bytes", ascending=False),
                                ["kernel_name", "shape_name", "config_id", "registers_per_thread",
                                 "spill_stores_bytes", "stall_lg_throttle_pct", "stall_long_scoreboard_pct"]),
    })
    return frame


@asset(group_name="analysis", description="One decision per (kernel, shape, device) (ship a config, keep the "
       "baseline, or no decision, with the reason), a short review queue verified by recompiles and the sweep's "
       "measurements, block-size heuristics learned from the sweep, and Claude's checked advice when a key is set. "
       "Every queue item starts PENDING_REVIEW.")
def recommendations(context: AssetExecutionContext, settings: AuditSettings, spill_diagnostics: pd.DataFrame):
    from kernaudit_pipeline.recommendations import review, stage
    from kernaudit_pipeline.recommendations.advisor import AdvisorSettings
    from kernaudit_pipeline.recommendations.verify import VerifySettings

    paths = settings.paths()
    verify = VerifySettings(timeout_s=settings.static_timeout_s, cache_dir=paths.static_cache,
                            noise_band=settings.noise_band,
                            max_compiles=(0 if not settings.static_enabled else
                                          None if settings.verify_max_compiles < 0 else settings.verify_max_compiles))
    advice = AdvisorSettings.from_env(enabled=settings.advisor != "off")
    result = stage.run(spill_diagnostics, verify_settings=verify, advisor_settings=advice)
    store = review.save_recommendations(list(result.recommendations), paths.root)
    recs = list(result.recommendations)
    decisions = pd.Series([str(d.decision) for d in result.decisions]).value_counts().to_dict() if result.decisions else {}
    states = pd.Series([str(r.verification.state) for r in recs]).value_counts().to_dict() if recs else {}
    frame = pd.DataFrame([{"kernel_name": d.kernel_name, "shape_name": d.shape_name, "device_name": d.device_name,
                           "decision": str(d.decision), "config_id": d.config_id, "speedup": d.speedup,
                           "speedup_ci_low": d.speedup_ci_low, "data_kind": str(d.data_kind)}
                          for d in result.decisions])
    context.add_output_metadata({
        "decisions": MetadataValue.json(decisions), "decision_table": table(frame, limit=100),
        "review_queue": len(recs),
        "heuristics": table(pd.DataFrame([{"kernel_name": h.kernel_name, "heuristic": h.text,
                                           "verification": str(h.verification), "data_kind": str(h.data_kind)}
                                          for h in result.heuristics]), limit=100),
        "advisor": result.note(), "verification": MetadataValue.json(states), "store": MetadataValue.path(str(store)),
    })
    return result


@asset(group_name="report",
       description="Comparator dashboard (HTML), Markdown, JSON and CSV exports, logged to MLflow.")
def audit_report(context: AssetExecutionContext, settings: AuditSettings, mlflow: ResourceParam[MlFlow],
                 raw_traces: raw_traces_lib.RawTraces,
                 kernel_runs: pd.DataFrame, quarantine: pd.DataFrame, spill_diagnostics: pd.DataFrame,
                 static_resources: pd.DataFrame, recommendations, audit_history: pd.DataFrame) -> MaterializeResult:
    import mlflow as mlflow_api

    from kernaudit_pipeline import audit_report as report_lib
    from kernaudit_pipeline import tracking

    active = mlflow_api.active_run()  # dagster-mlflow opened it for this Dagster run

    from kernaudit_pipeline import history as history_lib

    reference = history_lib.compare(settings.paths().history_db, context.run.run_id,
                                    settings.noise_band).reference_run_id
    inputs = report_lib.ReportInputs(
        run_id=context.run.run_id, mode_note=raw_traces.mode_note, files=raw_traces.files, kernel_runs=kernel_runs,
        quarantine=quarantine, diagnostics=recommendations.annotate(spill_diagnostics), static=static_resources,
        recommendations=list(recommendations.recommendations), rules=raw_traces.rules,
        advisor_note=recommendations.note(), history=audit_history, history_reference=reference,
        decisions=tuple(recommendations.decisions),
        advisor=recommendations.advisor, heuristics=tuple(recommendations.heuristics),
        mlflow_run_url=tracking.run_url(active.info.run_id, active.info.experiment_id) if active else None,
    )
    out_dir = settings.paths().reports / context.run.run_id
    files = report_lib.write_report(inputs, out_dir)
    mlflow_run_id = tracking.log_audit(mlflow, inputs, files)
    mlflow.log_params(recommendations.mlflow_params())
    mlflow.log_metrics(recommendations.mlflow_metrics())
    mlflow.set_tags(recommendations.mlflow_tags())
    latest = settings.paths().reports / "latest"
    latest.unlink(missing_ok=True)
    latest.symlink_to(out_dir, target_is_directory=True)
    return MaterializeResult(metadata={
        "report_html": MetadataValue.path(str(files.html)),
        "report_md": MetadataValue.path(str(files.markdown)),
        "mlflow_run_id": mlflow_run_id,
        "mlflow_run": MetadataValue.url(tracking.run_url(mlflow_run_id)),
        "runs": len(kernel_runs),
        "quarantined": len(quarantine),
        "top_regressions": table(spill_diagnostics[spill_diagnostics["status"] == "REGRESSION"].nsmallest(
            5, "speedup")[["kernel_name", "shape_name", "config_id", "speedup"]]),
        "top_spills": table(spill_diagnostics[spill_diagnostics["spill_detected"]].sort_values(
            "spill_stores_bytes", ascending=False), ["kernel_name", "shape_name", "config_id", "spill_stores_bytes",
                                                     "stall_lg_throttle_pct", "stall_long_scoreboard_pct"], limit=10),
        "preview": MetadataValue.md(files.markdown.read_text()[:6000]),
    })
