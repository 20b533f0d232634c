#!/usr/bin/env bash
# Create .venv from the hashed lock files (once, and again whenever a lock changes).
#   bash scripts/setup.sh               runtime only (requirements.lock)
#   bash scripts/setup.sh test deploy   runtime plus the named groups (requirements-<group>.lock)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
locks=(requirements.lock)
for group in "$@"; do
  [ -f "requirements-$group.lock" ] || { echo "setup: no lock for group '$group'" >&2; exit 2; }
  locks+=("requirements-$group.lock")
done
stamp=.venv/.kernaudit-locks.sha256
want=$(cat "${locks[@]}" pyproject.toml | sha256sum | cut -d' ' -f1)
have=$(cat "$stamp" 2>/dev/null || true)
# A stamp covering more groups than asked for satisfies a smaller request.
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
if ! grep -qx "$want" <<<"$have"; then
  echo "setup: installing ${locks[*]} into .venv (first time takes a few minutes)"
  .venv/bin/python -m pip install --quiet --upgrade pip
  args=()
  for lock in "${locks[@]}"; do args+=(-r "$lock"); done
  .venv/bin/python -m pip install --quiet --require-hashes "${args[@]}"
  .venv/bin/python -m pip install --quiet --no-deps --no-build-isolation -e .
  { echo "$want"; cat "$stamp" 2>/dev/null || true; } > "$stamp.new" && mv "$stamp.new" "$stamp"
fi
