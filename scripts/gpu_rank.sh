#!/usr/bin/env bash
# The held-out kernel on the GPU in one call (issue 15): the exhaustive paired sweep of
# kernels/heldout/swiglu_gemm.py over its whole space (394 configs x 4 M buckets), then
# `kernaudit bench --search` over the same space, in the order the static cost model predicted
# before any GPU time (samples/rank/swiglu_gemm.ranking.json, from `kernaudit rank swiglu_gemm
# --json` on a CPU). Both runs use the same runner options, so their GPU-seconds compare.
#
#   bash scripts/gpu_rank.sh                  # ends inside BUDGET_S (default 530 s)
#
# KERNEL=rmsnorm_gemm runs the second held-out kernel the same way (its ranking:
# samples/rank/rmsnorm_gemm.ranking.json); the files below are then named rmsnorm_* (TAG).
#
# Writes under $OUT (default ./gpu_out), at most 4 files:
#   gpu_rank_log.txt            everything printed, with the host and versions
#   swiglu_exhaustive.jsonl     runner rows of the exhaustive sweep (.gz if over 16 MB)
#   swiglu_search.jsonl         runner rows of the search (same schema)
#   swiglu_search_summary.json  per shape: measured/candidates, stop reason, pick, ties, GPU-s
# Then, on any CPU:
#   PYTHONPATH=. .venv/bin/python scripts/rank_validate.py \
#       --sweeps samples/h200/bench_h200.jsonl gpu_out/swiglu_exhaustive.jsonl \
#       --search-summary gpu_out/swiglu_search_summary.json --search-run gpu_out/swiglu_search.jsonl
#
# Both runs prune configs whose local memory reaches 512 B per thread (what the ranking drops:
# heavy spills were always far from the best on the H200); smaller spills are timed. The
# exhaustive sweep precompiles in $JOBS processes (default 16); the search then finds Triton's
# cache warm (compiling is CPU time; the GPU-seconds compared are checks and timing loops).
# STEPS="exhaustive" or "search" runs one of the two (a call with room for one; the search then
# precompiles its own batches); SEARCH_ARGS passes --search-* options. Knobs for a CPU rehearsal
# on the runner's test double: KERNEL, KERNELS_DIR, RANKING, SHAPES (space-separated names). Needs python3 with torch,
# triton and numpy. Never changes clocks.
set -uo pipefail

OUT="${OUT:-$PWD/gpu_out}"
PY="${PYTHON:-python3}"
BUDGET_S="${BUDGET_S:-530}"
JOBS="${JOBS:-16}"
KERNEL="${KERNEL:-swiglu_gemm}"
TAG="${TAG:-${KERNEL%_gemm}}"                 # output file prefix: swiglu_, rmsnorm_, ...
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KERNELS_DIR="${KERNELS_DIR:-$ROOT/kernels}"
RANKING_GIVEN="${RANKING:-}"
RANKING="${RANKING:-$ROOT/samples/rank/${KERNEL}.ranking.json}"
SHAPES="${SHAPES:-}"
SEARCH_RESERVE_S="${SEARCH_RESERVE_S:-170}"  # kept for the search while the exhaustive sweep runs
STEPS="${STEPS:-exhaustive search}"          # either or both, for a call that has room for one
SEARCH_ARGS="${SEARCH_ARGS:-}"                # extra --search-* options
[[ " $STEPS " == *" search "* ]] || SEARCH_RESERVE_S=5
cd "$ROOT" || exit 1
export PYTHONUNBUFFERED=1
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-/tmp/kernaudit-triton-cache}"
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_rank_log.txt") 2>&1
START=$(date +%s)
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
# Seconds for a step: what it wants, but never past what is left minus a reserve for later steps.
budget() { local want=$1 reserve=$2 l; l=$(( $(left) - reserve )); (( l < want )) && want=$l; (( want < 20 )) && want=20; echo "$want"; }

echo "== host ($(date -u +%FT%TZ))"
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
# The ranking predicted for the GPU that came, where one was committed for it (an H100 has less
# DRAM bandwidth than the H200 the default ranking is for): samples/rank/KERNEL.h100.ranking.json
GPU_NAME="$(command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
if [[ -z "$RANKING_GIVEN" && "$GPU_NAME" == *H100* && -f "$ROOT/samples/rank/${KERNEL}.h100.ranking.json" ]]; then
  RANKING="$ROOT/samples/rank/${KERNEL}.h100.ranking.json"
fi
"$PY" -c 'import sys, torch, triton, numpy; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, "numpy", numpy.__version__, "cpus", __import__("os").cpu_count())'
echo "kernel $KERNEL from $KERNELS_DIR, ranking $RANKING, shapes: ${SHAPES:-all}, budget ${BUDGET_S} s"

COMMON=("$KERNEL" --kernels-dir "$KERNELS_DIR" --spill-threshold-bytes 511 --no-peaks --references-top-k 0
        --timeout-s 120 --max-seconds-per-config 0.5 --min-time-s 0.05 --min-blocks 4 --jobs "$JOBS")
if [[ -n "$SHAPES" ]]; then
  read -r -a shape_list <<< "$SHAPES"
  COMMON+=(--shapes "${shape_list[@]}")
fi

if [[ " $STEPS " == *" exhaustive "* ]]; then
  echo "== exhaustive paired sweep (left $(left) s)"
  t0=$(date +%s)
  "$PY" -m kernaudit_pipeline.bench.runner "${COMMON[@]}" --out "$OUT/${TAG}_exhaustive.jsonl" \
    --precompile-s 150 --deadline-s "$(budget "$BUDGET_S" "$SEARCH_RESERVE_S")"
  echo "exhaustive exit $?, $(( $(date +%s) - t0 )) s wall"
  PRECOMPILE_SEARCH=0   # Triton's cache is warm
fi

if [[ " $STEPS " == *" search "* ]]; then
  echo "== search in the predicted order (left $(left) s)"
  t0=$(date +%s)
  read -r -a search_extra <<< "$SEARCH_ARGS"
  "$PY" -m kernaudit_pipeline.bench.runner "${COMMON[@]}" --search --ranking "$RANKING" "${search_extra[@]}" \
    --out "$OUT/${TAG}_search.jsonl" --search-summary "$OUT/${TAG}_search_summary.json" \
    --precompile-s "${PRECOMPILE_SEARCH:-100}" --deadline-s "$(budget "$BUDGET_S" 5)"
  echo "search exit $?, $(( $(date +%s) - t0 )) s wall"
fi

echo "== GPU-seconds (checks + timing loops of every row)"
"$PY" - "$OUT/${TAG}_exhaustive.jsonl" "$OUT/${TAG}_search.jsonl" <<'EOF'
import json, sys
from collections import defaultdict
from kernaudit_pipeline.rank.search import row_gpu_seconds
for path in sys.argv[1:]:
    try:
        rows = [json.loads(line) for line in open(path) if line.strip()]
    except OSError as exc:
        print(path, "unreadable:", exc)
        continue
    by = defaultdict(float)
    status = defaultdict(int)
    for r in rows:
        if r.get("record_type") in ("run", "baseline"):
            by[r.get("shape_name")] += row_gpu_seconds(r)
            status[f"{r.get('record_type')}:{r.get('run_status')}"] += 1
    print(path.rsplit("/", 1)[-1], {k: round(v, 1) for k, v in by.items()}, "total", round(sum(by.values()), 1), dict(status))
try:  # the search's own count: both rungs, the screening rows its --out replaced included
    for s in json.load(open(sys.argv[2].replace("_search.jsonl", "_search_summary.json"))):
        print("search summary", s["shape_name"], f"{s['measured']}/{s['candidates']} measured,",
              len(s.get("confirmed_config_ids") or []), "confirmed,", round(s["gpu_seconds"], 2), "GPU-s")
except (OSError, ValueError, KeyError) as exc:
    print("no search summary:", type(exc).__name__)
EOF
for f in "$OUT/${TAG}_exhaustive.jsonl" "$OUT/${TAG}_search.jsonl"; do
  if [[ -f "$f" ]] && (( $(stat -c %s "$f") > 16000000 )); then gzip -9 -f "$f" && echo "gzipped $f"; fi
done
echo "== done in $(( $(date +%s) - START )) s; files:"
ls -la "$OUT"
