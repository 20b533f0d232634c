#!/usr/bin/env bash
# The one script that runs on a GPU host: benchmark sweep, pruning comparison and profiler
# captures, all written under $OUT (default ./gpu_out). Needs python3 with torch, triton and
# numpy, and Nsight Compute (ncu) for the hardware-counter capture. Never changes clocks.
#
#   bash scripts/gpu_collect.sh                 # full run, ends inside BUDGET_S (default 540 s)
#   SMOKE=1 bash scripts/gpu_collect.sh         # one config per kernel, to catch bugs first
#
# Output files (8, each small): log.txt, bench_h200.jsonl (pruned sweep, all kernels),
# bench_h200_gemm_noprune.jsonl (one kernel/shape with --no-prune), ncu_raw.csv,
# ncu_details.csv, torch_trace.json, proton.hatchet, extras.tar.gz (ncu metric listing,
# capture targets, ptxas -v logs, a Triton cache directory sample, nvidia-smi -q).
set -uo pipefail

OUT="${OUT:-$PWD/gpu_out}"
PY="${PYTHON:-python3}"
BUDGET_S="${BUDGET_S:-540}"
SMOKE="${SMOKE:-0}"
KERNELS="${KERNELS:-}"             # empty: every module in kernels/
NOPRUNE_KERNEL="${NOPRUNE_KERNEL:-gemm}"
NOPRUNE_SHAPE="${NOPRUNE_SHAPE:-llama3_8b_qkv_prefill}"
export PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-/tmp/kernaudit-triton-cache}"
mkdir -p "$OUT"
EXTRA="$OUT/extras"
mkdir -p "$EXTRA"
START=$(date +%s)
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
# Seconds for a stage: its share, but never past what is left minus a reserve for later stages.
budget() { local want=$1 reserve=$2 l; l=$(( $(left) - reserve )); (( l < want )) && want=$l; (( want < 10 )) && want=10; echo "$want"; }

main() {
  echo "== host"
  nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
  nvidia-smi -q > "$EXTRA/nvidia_smi_q.txt" 2>&1
  "$PY" -c 'import sys, torch, triton, numpy; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, "numpy", numpy.__version__); print(torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0))'
  local have_ncu=0
  if command -v ncu >/dev/null; then
    have_ncu=1
    ncu --version | tail -1
    ncu --query-metrics > /tmp/ncu_query_metrics.txt 2>&1
    echo "ncu lists $(wc -l < /tmp/ncu_query_metrics.txt) base metrics"
    # Keep only the families the diagnostics read (the full listing is about 1 MB).
    grep -E '^(Device|launch__|derived__|sm__throughput|gpu__compute_memory|gpu__time_duration|sm__warps_active|sm__maximum_warps|dram__bytes|l1tex__t_(sectors|requests)_pipe_lsu_mem_local|sm__sass_inst_executed_op_local|smsp__average_warp|smsp__average_warps_issue_stalled_(lg_throttle|long_scoreboard)|smsp__warp_issue_stalled_(lg_throttle|long_scoreboard)|smsp__pcsamp_warps_issue_stalled_(lg_throttle|long_scoreboard))' \
      /tmp/ncu_query_metrics.txt > "$EXTRA/ncu_query_metrics_selected.txt"
  else
    echo "ncu not found: no hardware-counter capture"
  fi

  echo "== pruned sweep (left $(left) s)"
  local sweep_args=(--out "$OUT/bench_h200.jsonl" --timeout-s 150)
  if [[ "$SMOKE" == 1 ]]; then
    sweep_args+=(--quick --max-configs 1 --deadline-s "$(budget 150 120)")
    "$PY" -m kernaudit_pipeline.bench.runner $KERNELS "${sweep_args[@]}"
    "$PY" -m kernaudit_pipeline.bench.runner gemm --quick --no-prune --no-peaks --out "$OUT/bench_h200_gemm_noprune.jsonl" \
      --configs BK64_BM128_BN256_GM8_s3_w8 BK64_BM128_BN256_GM8_s3_w4 BK64_BM256_BN256_GM8_s4_w8 \
      --deadline-s "$(budget 60 90)"
  else
    sweep_args+=(--max-seconds-per-config 0.5 --deadline-s "$(budget 330 200)")
    "$PY" -m kernaudit_pipeline.bench.runner $KERNELS "${sweep_args[@]}"
    echo "== unpruned sweep of $NOPRUNE_KERNEL / $NOPRUNE_SHAPE (left $(left) s)"
    "$PY" -m kernaudit_pipeline.bench.runner "$NOPRUNE_KERNEL" --shapes "$NOPRUNE_SHAPE" --no-prune --no-peaks \
      --max-seconds-per-config 0.5 --timeout-s 90 --out "$OUT/bench_h200_gemm_noprune.jsonl" \
      --deadline-s "$(budget 90 130)"
  fi

  echo "== capture plan (left $(left) s)"
  "$PY" -m kernaudit_pipeline.bench.capture plan --jsonl "$OUT/bench_h200.jsonl" --out "$EXTRA/capture_targets.json"

  if (( have_ncu )); then
    echo "== ncu (left $(left) s)"
    local metrics
    metrics=$("$PY" -m kernaudit_pipeline.bench.capture metrics --listing /tmp/ncu_query_metrics.txt | head -1)
    echo "metrics: $metrics"
    local sections=()
    for s in SpeedOfLight Occupancy LaunchStats WarpStateStats MemoryWorkloadAnalysis; do sections+=(--section "$s"); done
    timeout "$(budget 120 70)" ncu --clock-control none --profile-from-start off --nvtx \
      --metrics "$metrics" "${sections[@]}" --launch-count 60 -f -o "$EXTRA/ncu_report" \
      "$PY" -m kernaudit_pipeline.bench.capture run --targets "$EXTRA/capture_targets.json" --iters 1 \
      > "$EXTRA/ncu_stdout.txt" 2>&1
    echo "ncu exit $?"; tail -5 "$EXTRA/ncu_stdout.txt"
    if [[ -f "$EXTRA/ncu_report.ncu-rep" ]]; then
      ncu --import "$EXTRA/ncu_report.ncu-rep" --csv --page raw > "$OUT/ncu_raw.csv" 2> "$EXTRA/ncu_import_raw.err"
      ncu --import "$EXTRA/ncu_report.ncu-rep" --csv --page details > "$OUT/ncu_details.csv" 2> "$EXTRA/ncu_import_details.err"
      ncu --import "$EXTRA/ncu_report.ncu-rep" --csv --page raw --print-nvtx-rename kernel > "$EXTRA/ncu_raw_nvtx_named.csv" 2>&1 || true
      echo "ncu raw rows $(($(wc -l < "$OUT/ncu_raw.csv") - 2)), details lines $(wc -l < "$OUT/ncu_details.csv")"
      local rep_size
      rep_size=$(stat -c %s "$EXTRA/ncu_report.ncu-rep")
      (( rep_size > 8000000 )) && rm -f "$EXTRA/ncu_report.ncu-rep"
    fi
  fi

  echo "== torch.profiler trace (left $(left) s)"
  timeout "$(budget 60 40)" "$PY" -m kernaudit_pipeline.bench.capture torch --targets "$EXTRA/capture_targets.json" \
    --iters 3 --out "$OUT/torch_trace.json"
  echo "== proton (left $(left) s)"
  timeout "$(budget 60 25)" "$PY" -m kernaudit_pipeline.bench.capture proton --targets "$EXTRA/capture_targets.json" \
    --iters 3 --out "$OUT/proton"
  echo "== ptxas -v and Triton cache sample (left $(left) s)"
  timeout "$(budget 60 10)" "$PY" -m kernaudit_pipeline.bench.capture ptxas --targets "$EXTRA/capture_targets.json" \
    --out "$EXTRA/ptxas"

  for f in "$OUT"/torch_trace.json; do
    [[ -f "$f" ]] && (( $(stat -c %s "$f") > 12000000 )) && gzip -f "$f"
  done
  echo "== summary (left $(left) s)"
  "$PY" - "$OUT/bench_h200.jsonl" "$OUT/bench_h200_gemm_noprune.jsonl" <<'EOF'
import json, sys
for path in sys.argv[1:]:
    try:
        rows = [json.loads(l) for l in open(path) if l.strip()]
    except OSError:
        print(path, "missing"); continue
    peaks = {r["peak_name"]: r.get("peak_tflops") or r.get("peak_gb_per_s") for r in rows if r["record_type"] == "peak"}
    summ = [r for r in rows if r["record_type"] == "summary"]
    print(path.rsplit("/", 1)[-1], "peaks", {k: round(v, 1) for k, v in peaks.items() if v})
    if summ:
        s = summ[-1]
        print("  wall %.1f s, gpu busy %.1f s, compile %.1f s, statuses %s" % (s["sweep_wall_s"], s["gpu_busy_s"], s["compile_s"], s["status_counts"]))
        for b in s["best"]:
            sp = b["speedup"]
            print("  %-22s %-30s %-32s %9.1f us vs %s %s" % (b["kernel_name"], b["shape_name"], b["config_id"], b["latency_us"],
                  "%.1f us" % b["baseline_us"] if b["baseline_us"] else "-", "x%.3f" % sp if sp else ""))
EOF
  echo "== done in $(( $(date +%s) - START )) s"
}

main 2>&1 | tee "$OUT/log.txt"
tar czf "$OUT/extras.tar.gz" -C "$OUT" extras && rm -rf "$EXTRA"
ls -la "$OUT"
