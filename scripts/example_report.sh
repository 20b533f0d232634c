#!/usr/bin/env bash
# Regenerate examples/report/ and examples/seed_assessment.json from an audit of the embedded
# default in a scratch data folder (set KERNAUDIT_SKIP_SETUP=1 to use the installed .venv as it is).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${KERNAUDIT_SKIP_SETUP:-}" != 1 ]; then bash scripts/setup.sh; fi
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
KERNAUDIT_DATA_DIR="$scratch" DAGSTER_HOME="$scratch/dagster_home" .venv/bin/kernaudit audit --quiet
rm -rf examples/report
mkdir -p examples/report
cp "$scratch"/reports/latest/report.html "$scratch"/reports/latest/report.md "$scratch"/reports/latest/report.json \
   "$scratch"/reports/latest/*.csv examples/report/
.venv/bin/kernaudit assess examples/seed_starter.json > examples/seed_assessment.json
echo "examples/report/ ($(du -sh examples/report | cut -f1)) and examples/seed_assessment.json regenerated"
