#!/usr/bin/env bash
# Start the Celery worker of one GPU host: it serves only that host's queue, with one
# process per GPU (each step pins itself to its device with CUDA_VISIBLE_DEVICES).
#   deploy/celery/start-worker.sh hosta          # on hosta
#   deploy/celery/start-worker.sh --cpu          # on a CPU machine: the default queue
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-}" = "--cpu" ]; then
  exec dagster-celery worker start -A dagster_celery.app -y deploy/celery/worker.yaml -q dagster -n "cpu-$(hostname)"
fi
host="${1:?usage: start-worker.sh HOST | --cpu}"
gpus="$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)"
exec dagster-celery worker start -A dagster_celery.app -y deploy/celery/worker.yaml -q "gpu-${host}" -n "gpu-${host}" -- -c "${gpus}"
