#!/usr/bin/env bash
# Set everything up (if missing), then run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test deploy
if [ -f scripts/browser_deps.sh ]; then bash scripts/browser_deps.sh; fi
set +e
# Worker processes, one test file each (module fixtures run once): most of the suite's time is
# waiting on subprocesses it starts (hangs run out to their timeouts, deadlines expire, workers
# restart), so two workers overlap much of it on CI's two cores. Three were faster again, but
# on a loaded host a worker's start-up then ran over a test's short step limit.
# KERNAUDIT_TEST_WORKERS=0 runs it in one process; options after the script's name come last
# and win (e.g. `-n 0`).
.venv/bin/python -m pytest -n "${KERNAUDIT_TEST_WORKERS:-2}" --dist loadfile "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "test: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit "$rc"
