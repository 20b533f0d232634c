#!/usr/bin/env bash
# MLflow tracking server on PostgreSQL, artifacts served through it (clients need no
# storage credentials). Point kernaudit at it with MLFLOW_TRACKING_URI=http://HOST:5000
# and KERNAUDIT_MLFLOW_UI_URL=http://HOST:5000 (the link shown in the Dagster UI).
set -euo pipefail
: "${KERNAUDIT_PG_HOST:?}" "${KERNAUDIT_PG_USER:?}" "${KERNAUDIT_PG_PASSWORD:?}"
: "${KERNAUDIT_PG_PORT:=5432}" "${KERNAUDIT_PG_MLFLOW_DB:=mlflow}"
: "${KERNAUDIT_MLFLOW_ARTIFACTS:=/srv/kernaudit/mlartifacts}"   # or s3://bucket/prefix
cmd=(mlflow server
  --host "${KERNAUDIT_MLFLOW_HOST:-0.0.0.0}" --port "${KERNAUDIT_MLFLOW_PORT:-5000}"
  --backend-store-uri "postgresql+psycopg2://${KERNAUDIT_PG_USER}:${KERNAUDIT_PG_PASSWORD}@${KERNAUDIT_PG_HOST}:${KERNAUDIT_PG_PORT}/${KERNAUDIT_PG_MLFLOW_DB}"
  --serve-artifacts --artifacts-destination "${KERNAUDIT_MLFLOW_ARTIFACTS}")
if [ "${1:-}" = "--dry-run" ]; then   # print the command, one argument a line, and stop
  printf '%s\n' "${cmd[@]}"
  exit 0
fi
exec "${cmd[@]}"
