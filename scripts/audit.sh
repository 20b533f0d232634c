#!/usr/bin/env bash
# Set everything up, then run the main job (the full audit) on the embedded default.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/kernaudit audit --quiet "$@"
