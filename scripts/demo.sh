#!/usr/bin/env bash
# The end-to-end demo, recorded: every command and its real output go to
# docs/demo/transcript.md, then scripts/screenshots.py photographs the report,
# the Dagster UI and the MLflow UI of the same audit into docs/demo/.
#   bash scripts/demo.sh            # a fresh data folder under /tmp, removed at the end
# Paths in the transcript are shown relative to the repository ("./") and the
# demo's data folder as $KERNAUDIT_DATA_DIR; nothing else is edited.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=$(mktemp -d /tmp/kernaudit-demo.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export KERNAUDIT_DATA_DIR=$WORK/data DAGSTER_HOME=$WORK/data/dagster_home PYTHONUNBUFFERED=1
unset ANTHROPIC_API_KEY
OUT=docs/demo/transcript.md
mkdir -p docs/demo
PATH=$ROOT/.venv/bin:$PATH
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}

clean() { sed -e "s|$WORK/data|\$KERNAUDIT_DATA_DIR|g" -e "s|$ROOT/|./|g" -e "s|$ROOT|.|g"; }

# shown ARGS...: the command as a person would type it (quoted only where needed)
shown() {
  local arg
  for arg in "$@"; do
    if [[ $arg =~ ^[A-Za-z0-9_./=:,@%+-]+$ ]]; then printf ' %s' "$arg"; else printf " '%s'" "$arg"; fi
  done
  printf '\n'
}

# step TITLE MAXLINES COMMAND...: run it, record the command, its output (cut after MAXLINES
# lines, saying so), its exit status and how long it took.
step() {
  local title=$1 max=$2; shift 2
  local log=$WORK/step.log start end rc
  start=$(date +%s)
  set +e
  if [ "${STDOUT_ONLY:-}" = 1 ]; then "$@" >"$log" 2>/dev/null; else "$@" >"$log" 2>&1; fi
  rc=$?
  set -e
  end=$(date +%s)
  local lines; lines=$(wc -l <"$log")
  {
    { printf '\n## %s\n\n```console\n$' "$title"; shown "$@"; } | clean
    head -n "$max" "$log" | clean
    if [ "$lines" -gt "$max" ]; then printf '… (%s more lines)\n' "$((lines - max))"; fi
    printf '```\n\nexit %s · %s s\n' "$rc" "$((end - start))"
  } >>"$OUT"
  echo "demo: $title: exit $rc ($((end - start)) s)" >&2
  return 0
}

{
  echo "# kernaudit: the recorded end-to-end demo"
  echo
  echo "Recorded by \`bash scripts/demo.sh\` on $(date -u +%Y-%m-%d) ($(uname -sm), $(nproc) CPU cores, no GPU)."
  echo "Every block is a command and its real output; long outputs are cut after a fixed number of"
  echo "lines, and the cut says how many lines it left out. The screenshots next to this file were"
  echo "taken from this very audit by \`scripts/screenshots.py\`."
} >"$OUT"

# pip's warnings name this machine's package mirror: setup's own lines (stdout) only
if [ "${KERNAUDIT_SKIP_SETUP:-}" != 1 ]; then
  STDOUT_ONLY=1 step "Set up (idempotent; its own lines only, not pip's warnings)" 15 bash scripts/setup.sh
fi
step "The seed's acceptance examples" 40 kernaudit assess examples/seed_starter.json --brief
step "Ahead-of-time sm_90 compile: the 128x256 tile with 4 and with 8 warps" 30 \
  kernaudit static gemm_bf16 --configs BK64_BM128_BN256_GM8_s3_w4,BK64_BM128_BN256_GM8_s3_w8
step "Where the GPU steps would run on this host, and on a faked 3-GPU host" 10 \
  python -m kernaudit_pipeline.gpu_devices
step "… the same with KERNAUDIT_GPU_DEVICES=0,1,2" 10 \
  env KERNAUDIT_GPU_DEVICES=0,1,2 python -m kernaudit_pipeline.gpu_devices
step "The full audit (Dagster, in-process; static compile limited to 2 configs per kernel): its stages, then every decision" 90 \
  kernaudit audit --static-max-configs 2
step "The report folder" 20 ls "$KERNAUDIT_DATA_DIR/reports/latest/"
step "The report's headline (Markdown export)" 30 head -n 30 "$KERNAUDIT_DATA_DIR/reports/latest/report.md"
step "Audit history: the first audit is the reference" 10 kernaudit history list
step "A second audit on the same traces (no static compile this time; --quiet: only the decisions and the paths)" 40 kernaudit audit --quiet --no-static
step "Compared with the accepted audit" 20 kernaudit history compare
step "Recommendations waiting for review" 15 kernaudit review list --state PENDING_REVIEW
REC=$(kernaudit review list --json | python -c "
import json, sys
recs = json.load(sys.stdin)
changes = [r for r in recs if r['new_config']]
verified = [r for r in changes if r['verification']['state'] == 'VERIFIED']
print((verified or changes or recs)[0]['rec_id'])")
step "A person approves one recommendation (a verified config change when there is one)" 10 kernaudit review approve "$REC" --reviewer demo --comment "evidence and verification read"
step "Only approved configs are exported" 20 kernaudit export
step "Accept the second audit as the new reference" 10 kernaudit history accept "$(kernaudit history list | tail -n 1 | awk '{print $1}')"
step "History after accepting" 10 kernaudit history list
step "Screenshots of the dashboard, the Dagster UI and the MLflow UI" 20 \
  python scripts/screenshots.py --data-dir "$KERNAUDIT_DATA_DIR" --out docs/demo
echo "demo: wrote $OUT" >&2
