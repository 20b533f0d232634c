#!/usr/bin/env bash
# The Dagster UI (asset graph, runs, checks) on the project's definitions and data folder.
#   bash scripts/ui.sh                # http://127.0.0.1:3000 ; data in ./data
#   bash scripts/ui.sh -p 3001        # any other `dagster dev` option
# The data folder is $KERNAUDIT_DATA_DIR (default ./data); its Dagster home gets the project's
# dagster.yaml (pools, run monitoring) before the UI starts, as `kernaudit audit` does, and the UI
# runs from there, so Dagster reads that copy (from the repository root it would also find the
# root's dagster.yaml and warn that it ignores it). Launch audits from Jobs -> audit_job so the
# run is named audit_job in Dagster and in MLflow.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
export KERNAUDIT_DATA_DIR="${KERNAUDIT_DATA_DIR:-$ROOT/data}"
export DAGSTER_HOME="${DAGSTER_HOME:-$KERNAUDIT_DATA_DIR/dagster_home}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
"$ROOT/.venv/bin/python" -c "from kernaudit_pipeline.audit import prepare_dagster_home; print('DAGSTER_HOME:', prepare_dagster_home())"
cd "$DAGSTER_HOME"
exec "$ROOT/.venv/bin/dagster" dev -w "$ROOT/workspace.yaml" "$@"
