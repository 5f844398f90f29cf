#!/usr/bin/env bash
# Install the test dependencies into .venv and run the whole suite (the README's test command).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  # Debian's chromium for the browser test (Playwright drives it; no browser download). Skipped without it.
  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium) >/dev/null \
    || echo "warning: could not install chromium; the browser test will be skipped"
fi
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -e ".[test]"
python -m pytest "$@"
