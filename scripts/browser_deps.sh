#!/usr/bin/env bash
# Headless Chromium for the browser tests (tests/browser, marked `browser`):
# Debian's own package, driven by Playwright through its executable path,
# since Playwright's browser download cannot work offline.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "browser_deps: /usr/bin/chromium is missing; install Debian's 'chromium' package (needs root)" >&2
  exit 0  # the browser tests skip with that reason
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
/usr/bin/chromium --version
