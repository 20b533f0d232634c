#!/usr/bin/env bash
# Regenerate examples/report.* from an audit of the embedded default in a scratch data folder.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
KERNAUDIT_DATA_DIR="$scratch" DAGSTER_HOME="$scratch/dagster_home" .venv/bin/kernaudit audit --quiet
mkdir -p examples/report
cp "$scratch"/reports/latest/report.md "$scratch"/reports/latest/report.json "$scratch"/reports/latest/*.csv examples/report/
cp "$scratch"/reports/latest/report.html examples/report/report.html
.venv/bin/kernaudit assess examples/seed_starter.json > examples/seed_assessment.json
echo "examples/report/ and examples/seed_assessment.json regenerated"
