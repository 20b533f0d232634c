#!/usr/bin/env bash
# Set everything up (if missing), then run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test deploy
if [ -f scripts/browser_deps.sh ]; then bash scripts/browser_deps.sh; fi
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "test: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit "$rc"
