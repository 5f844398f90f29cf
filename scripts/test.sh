#!/usr/bin/env bash
# The README's test command (and CI's, .ci/run): every test environment, on a fresh machine or not.
#   1. Debian's chromium for the browser test (skipped where it cannot be installed);
#   2. the main environment, .venv: `pip install -e ".[tensorflow-demo,test]"` (TensorFlow trainer, tf_keras
#      callbacks, demo), then `python -m pytest tests --ignore=tests/current`;
#   3. every scripts/test_env_*.sh in sorted order (current releases, torch_xla, ...); each creates and fills
#      its own venv and runs its own tests.
# All environments run even when one fails; the exit status is 1 if any failed.
# Usage: bash scripts/test.sh                 # everything
#        bash scripts/test.sh tests/test_x.py  # only these pytest arguments, in the main environment
set -uo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  # Debian's chromium for the browser test (Playwright drives it; no browser download). Skipped without it.
  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium) >/dev/null \
    || echo "warning: could not install chromium; the browser test will be skipped"
fi
[ -x .venv/bin/python ] || python3 -m venv .venv || exit 1
(
  set -e
  . .venv/bin/activate
  python -m pip install -q --upgrade pip
  python -m pip install -q -e ".[tensorflow-demo,test]"
) || { echo "FAILED: installing the main environment (.venv)"; exit 1; }

failed=()
if [ "$#" -gt 0 ]; then
  .venv/bin/python -m pytest "$@" || failed+=("main environment: pytest $*")
else
  echo "== main environment (.venv): python -m pytest tests --ignore=tests/current"
  .venv/bin/python -m pytest tests --ignore=tests/current || failed+=("main environment (.venv)")
  for env_script in $(ls scripts/test_env_*.sh | sort); do
    echo "== $env_script"
    bash "$env_script" || failed+=("$env_script")
  done
fi
if [ "${#failed[@]}" -gt 0 ]; then
  printf 'FAILED: %s\n' "${failed[@]}"
  exit 1
fi
echo "all test environments passed"
