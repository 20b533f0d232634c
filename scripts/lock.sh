#!/usr/bin/env bash
# Regenerate the hashed lock files from requirements/*.in with pip-tools (one lock per group):
#   requirements.lock          runtime (what `bash scripts/audit.sh` installs)
#   requirements-test.lock     the test suite (pytest, playwright), constrained by the runtime lock
#   requirements-deploy.lock   several-host deployment (PostgreSQL, Celery, Kubernetes), likewise
# Existing pins are kept unless a .in file asks otherwise (pip-compile's default); pass
# --upgrade to move everything to the newest allowed release.
set -euo pipefail
cd "$(dirname "$0")/.."
tools=${PIP_TOOLS_VENV:-/tmp/kernaudit-pip-tools}
[ -x "$tools/bin/pip-compile" ] || { python3 -m venv "$tools" && "$tools/bin/pip" install -q pip-tools==7.7.0; }
compile() {
  "$tools/bin/pip-compile" --quiet --generate-hashes --allow-unsafe --strip-extras \
    --no-emit-index-url --no-emit-find-links "$@"
}
compile "$@" -o requirements.lock requirements/runtime.in
# pip resolves torch==2.13.0 to the local CPU wheel (2.13.0+cpu) on these machines; the lock
# keeps the public version, which that wheel satisfies, with the wheel's hash.
sed -i 's/^torch==2\.13\.0+cpu /torch==2.13.0 /' requirements.lock
compile "$@" -o requirements-test.lock requirements/test.in
compile "$@" -o requirements-deploy.lock requirements/deploy.in
echo "lock: $(grep -c '^[A-Za-z0-9]' requirements.lock) runtime, $(grep -c '^[A-Za-z0-9]' requirements-test.lock) test, $(grep -c '^[A-Za-z0-9]' requirements-deploy.lock) deploy pins"
