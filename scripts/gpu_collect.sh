#!/usr/bin/env bash
# The GPU script: everything the H200 captures, written under $OUT, in modes that fit device calls.
#
#   bash scripts/gpu_collect.sh MODE [MODE ...]
#
#   main       the main capture with paired timing: every kernel in kernels/*.py (held-out ones in
#              kernels/heldout/ are not) except those in
#              SKIP_KERNELS (default none), full config spaces and shapes, pruning as
#              usual, all references (FlashInfer JIT-compiled in the background meanwhile);
#              then a torch.profiler trace of every reference (which library ran) and the
#              paired do_bench cross-check.        -> bench_h200.jsonl, references_trace.json[.gz],
#              references_trace.kernels.json, crosscheck.json
#   crosscheck the do_bench cross-check alone, on the best configs of this call's bench_h200.jsonl,
#              else of the committed samples/h200/bench_h200.jsonl (about 90 s) -> crosscheck.json
#   repeat:N   one independent runner invocation of issue 9's repeat subset -> repeat_N.jsonl
#   captures   ncu, torch.profiler, Proton and ptxas captures of the capture plan (from this
#              call's bench_h200.jsonl, else the committed one) -> ncu_raw.csv, ncu_details.csv,
#              torch_trace.json, proton.hatchet
#   smoke      a quick pass over every kernel (2 configs, first shape) to catch bugs -> smoke.jsonl
#
# A repeat that would start with under 150 s left, or captures under 120 s, is skipped and the
# log says so (run that mode in the next call). Every call also writes log_<modes>.txt and extras_<modes>.tar.gz (ncu listing, capture plan,
# ptxas logs, FlashInfer JIT log, nvidia-smi -q). A failing step never stops the others. The
# whole call ends inside BUDGET_S (default 530 s); each step gets a share of what is left.
# Wheels in .whl/ (FlashInfer and its tvm-ffi) are installed into /tmp/site first. Needs python3
# with torch, triton, numpy (nvidia-ml-py for the clock guard) and ncu for the captures. Never
# changes clocks.
set -uo pipefail

OUT="${OUT:-$PWD/gpu_out}"
PY="${PYTHON:-python3}"
BUDGET_S="${BUDGET_S:-530}"
SKIP_KERNELS="${SKIP_KERNELS:-}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
(( $# )) || { echo "usage: bash scripts/gpu_collect.sh main|repeat:N|captures|crosscheck|smoke ..." >&2; exit 2; }
for m in "$@"; do
  [[ "$m" =~ ^(main|captures|smoke|crosscheck|repeat:[0-9]+)$ ]] || { echo "gpu_collect.sh: unknown mode '$m'" >&2; exit 2; }
done
TAG="$(IFS=_; echo "$*" | tr ':' '-')"
export PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-/tmp/kernaudit-triton-cache}"
export FLASHINFER_WORKSPACE_BASE="${FLASHINFER_WORKSPACE_BASE:-/tmp/kernaudit-flashinfer}"
mkdir -p "$OUT"
EXTRA="$OUT/extras_$TAG"
mkdir -p "$EXTRA"
START=$(date +%s)
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
# Seconds for a step: what it wants, but never past what is left minus a reserve for later steps.
budget() { local want=$1 reserve=$2 l; l=$(( $(left) - reserve )); (( l < want )) && want=$l; (( want < 15 )) && want=15; echo "$want"; }

KERNELS=()
for f in kernels/*.py; do
  stem=$(basename "$f" .py)
  [[ "$stem" == _* || " $SKIP_KERNELS " == *" $stem "* ]] || KERNELS+=("$stem")
done
REPEAT_KERNELS=(gemm fp8_gemm flash_attention)
REPEAT_SHAPES=(llama3_8b_qkv_prefill llama3_8b_down_prefill b4_h32_kv8_s4096_d128)
RUN_ARGS=(--timeout-s 200 --max-seconds-per-config 0.5)

setup() {
  echo "== host ($(date -u +%FT%TZ))"
  nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
  nvidia-smi -q > "$EXTRA/nvidia_smi_q.txt" 2>&1
  if compgen -G ".whl/*.whl" > /dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}" && echo "wheels installed: $(ls .whl)"
  fi
  "$PY" -c 'import sys, torch, triton, numpy; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, "numpy", numpy.__version__)'
  "$PY" -c 'import pynvml; pynvml.nvmlInit(); print("nvml ok: clock guard on")' 2>&1 | tail -1
  command -v nvcc > /dev/null && nvcc --version | tail -2
  echo "kernels: ${KERNELS[*]} (skipped: $SKIP_KERNELS)"
}

mode_main() {
  echo "== FlashInfer JIT warm-up in the background (left $(left) s)"
  timeout 420 "$PY" scripts/gpu_flashinfer_warm.py > "$EXTRA/flashinfer_jit.log" 2>&1 &
  local warm=$!
  echo "== main capture, paired (left $(left) s)"
  "$PY" -m kernaudit_pipeline.bench.runner "${KERNELS[@]}" --out "$OUT/bench_h200.jsonl" "${RUN_ARGS[@]}" \
    --deadline-s "$(budget 330 130)"
  echo "runner exit $?"
  wait "$warm" 2>/dev/null; cat "$EXTRA/flashinfer_jit.log"
  echo "== every reference under torch.profiler (left $(left) s)"
  timeout "$(budget 75 60)" "$PY" -m kernaudit_pipeline.bench.capture references --out "$OUT/references_trace.json"
  echo "references trace exit $?"
  [[ -f "$OUT/references_trace.json" ]] && (( $(stat -c %s "$OUT/references_trace.json") > 12000000 )) \
    && gzip -f "$OUT/references_trace.json"
  mode_crosscheck
}

mode_crosscheck() {
  local from="$OUT/bench_h200.jsonl"
  [[ -f "$from" ]] || from="samples/h200/bench_h200.jsonl"
  echo "== paired do_bench cross-check on the best configs of $from (left $(left) s)"
  timeout "$(budget 150 10)" "$PY" -m kernaudit_pipeline.bench.crosscheck --jsonl "$from" --out "$OUT/crosscheck.json"
  echo "crosscheck exit $?"
}

mode_repeat() {
  local n=$1
  if (( $(left) < 150 )); then
    echo "== repeat $n SKIPPED: $(left) s left, a repeat needs about 150 s; run 'repeat:$n' in the next call"
    return
  fi
  echo "== repeat $n: ${REPEAT_KERNELS[*]} at ${REPEAT_SHAPES[*]} (left $(left) s)"
  "$PY" -m kernaudit_pipeline.bench.runner "${REPEAT_KERNELS[@]}" --shapes "${REPEAT_SHAPES[@]}" --no-peaks \
    --out "$OUT/repeat_$n.jsonl" "${RUN_ARGS[@]}" --deadline-s "$(budget 240 20)"
  echo "runner exit $?"
}

mode_smoke() {
  echo "== smoke (left $(left) s)"
  "$PY" -m kernaudit_pipeline.bench.runner "${KERNELS[@]}" --quick --max-configs 2 --no-peaks --timeout-s 120 \
    --out "$OUT/smoke.jsonl" --deadline-s "$(budget 120 60)"
  echo "runner exit $?"
}

mode_captures() {
  local have_ncu=0 plan_from="$OUT/bench_h200.jsonl"
  if (( $(left) < 120 )); then
    echo "== captures SKIPPED: $(left) s left, they need about 120 s"
    return
  fi
  [[ -f "$plan_from" ]] || plan_from="samples/h200/bench_h200.jsonl"
  echo "== capture plan from $plan_from (left $(left) s)"
  "$PY" -m kernaudit_pipeline.bench.capture plan --jsonl "$plan_from" --out "$EXTRA/capture_targets.json"
  if command -v ncu > /dev/null; then
    have_ncu=1
    ncu --version | tail -1
    ncu --query-metrics > /tmp/ncu_query_metrics.txt 2>&1
    grep -E '^(Device|launch__|derived__|sm__throughput|gpu__compute_memory|gpu__time_duration|sm__warps_active|sm__maximum_warps|dram__bytes|l1tex__t_(sectors|requests)_pipe_lsu_mem_local|sm__sass_inst_executed_op_local|smsp__average_warp|smsp__average_warps_issue_stalled_(lg_throttle|long_scoreboard)|smsp__warp_issue_stalled_(lg_throttle|long_scoreboard)|smsp__pcsamp_warps_issue_stalled_(lg_throttle|long_scoreboard))' \
      /tmp/ncu_query_metrics.txt > "$EXTRA/ncu_query_metrics_selected.txt"
  else
    echo "ncu not found: no hardware-counter capture"
  fi
  if (( have_ncu )); then
    echo "== ncu (left $(left) s)"
    local metrics sections=()
    metrics=$("$PY" -m kernaudit_pipeline.bench.capture metrics --listing /tmp/ncu_query_metrics.txt | head -1)
    for s in SpeedOfLight Occupancy LaunchStats WarpStateStats MemoryWorkloadAnalysis; do sections+=(--section "$s"); done
    timeout "$(budget 150 80)" ncu --clock-control none --profile-from-start off --nvtx \
      --metrics "$metrics" "${sections[@]}" --launch-count 60 -f -o "$EXTRA/ncu_report" \
      "$PY" -m kernaudit_pipeline.bench.capture run --targets "$EXTRA/capture_targets.json" --iters 1 \
      > "$EXTRA/ncu_stdout.txt" 2>&1
    echo "ncu exit $?"; tail -3 "$EXTRA/ncu_stdout.txt"
    if [[ -f "$EXTRA/ncu_report.ncu-rep" ]]; then
      ncu --import "$EXTRA/ncu_report.ncu-rep" --csv --page raw > "$OUT/ncu_raw.csv" 2> "$EXTRA/ncu_import_raw.err"
      ncu --import "$EXTRA/ncu_report.ncu-rep" --csv --page details > "$OUT/ncu_details.csv" 2> "$EXTRA/ncu_import_details.err"
      ncu --import "$EXTRA/ncu_report.ncu-rep" --csv --page raw --print-nvtx-rename kernel > "$EXTRA/ncu_raw_nvtx_named.csv" 2>&1 || true
      (( $(stat -c %s "$EXTRA/ncu_report.ncu-rep") > 8000000 )) && rm -f "$EXTRA/ncu_report.ncu-rep"
    fi
  fi
  echo "== torch.profiler trace (left $(left) s)"
  timeout "$(budget 60 40)" "$PY" -m kernaudit_pipeline.bench.capture torch --targets "$EXTRA/capture_targets.json" \
    --iters 3 --out "$OUT/torch_trace.json"
  [[ -f "$OUT/torch_trace.json" ]] && (( $(stat -c %s "$OUT/torch_trace.json") > 12000000 )) && gzip -f "$OUT/torch_trace.json"
  echo "== proton (left $(left) s)"
  timeout "$(budget 60 25)" "$PY" -m kernaudit_pipeline.bench.capture proton --targets "$EXTRA/capture_targets.json" \
    --iters 3 --out "$OUT/proton"
  echo "== ptxas -v and a Triton cache sample (left $(left) s)"
  timeout "$(budget 60 10)" "$PY" -m kernaudit_pipeline.bench.capture ptxas --targets "$EXTRA/capture_targets.json" \
    --out "$EXTRA/ptxas"
}

summarize() {
  echo "== summary (left $(left) s)"
  "$PY" - "$OUT" <<'PYEOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
check = out / "crosscheck.json"
if check.exists():
    for r in json.loads(check.read_text()).get("targets", []):
        print(f"crosscheck {r['kernel_name']} {r['shape_name']} {r['config_id']}: "
              + (f"runner {r['runner_speedup']:.4f} do_bench {r['dobench_speedup']:.4f} ({r['difference'] * 100:+.2f} %); "
                 + ", ".join(f"{k} {v * 100:+.2f} %" for k, v in r["differences"].items())
                 if "error" not in r else r["error"]))
for path in sorted(out.glob("*.jsonl")):
    rows = [json.loads(l) for l in path.read_text().splitlines() if l.strip()]
    summ = [r for r in rows if r.get("record_type") == "summary"]
    base = [r for r in rows if r.get("record_type") == "baseline"]
    print(f"{path.name}: {len(rows)} records, " + (f"wall {summ[-1]['sweep_wall_s']:.0f} s, {summ[-1]['status_counts']}" if summ else "no summary (cut short)"))
    for r in base:
        if r.get("baseline_variant") or r.get("run_status") != "OK":
            print(f"  reference {r['kernel_name']} {r['shape_name']} {r['config_id']}: {r['run_status']} "
                  f"{r.get('baseline_backend') or ''} {(r.get('run_message') or '')[:100]}")
    for b in (summ[-1]["best"] if summ else []):
        sp = b.get("speedup")
        ci = f" [{b['speedup_ci_low']:.3f}, {b['speedup_ci_high']:.3f}]" if b.get("speedup_ci_low") else ""
        print(f"  {b['kernel_name']:<22} {b['shape_name']:<30} {b['config_id']:<32} "
              + (f"x{sp:.3f}{ci}" if sp else "-") + f" vs {b.get('baseline_backend') or b.get('baseline_name')}")
PYEOF
}

main() {
  setup
  for m in "$@"; do
    case "$m" in
      main) mode_main ;;
      smoke) mode_smoke ;;
      captures) mode_captures ;;
      crosscheck) mode_crosscheck ;;
      repeat:*) mode_repeat "${m#repeat:}" ;;
    esac
  done
  summarize
  echo "== done in $(( $(date +%s) - START )) s"
}

main "$@" 2>&1 | tee "$OUT/log_$TAG.txt"
tar czf "$OUT/extras_$TAG.tar.gz" -C "$OUT" "extras_$TAG" && rm -rf "$EXTRA"
ls -la "$OUT"
