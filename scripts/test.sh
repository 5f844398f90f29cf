#!/usr/bin/env bash
# The README's test command (and CI's, .ci/run): every test environment, on a fresh machine or not.
#   1. Debian's chromium for the browser test (skipped where it cannot be installed);
#   2. the main environment, .venv: `pip install -e ".[tensorflow-demo,test]"` (TensorFlow trainer, tf_keras
#      callbacks, demo), then `python -m pytest tests --ignore=tests/current`;
#   3. every scripts/test_env_*.sh in sorted order (current releases, torch_xla, ...); each creates and fills
#      its own venv and runs its own tests.
# Steps 2 and 3 run side by side, two lanes (most tests wait on subprocesses, installs and a loopback Hub, so two
# lanes finish in ~60% of the time of one on 2 cores); each environment's output is printed whole when it ends,
# under its own heading. HF_TPU_TEST_LANES=1 runs them one after the other, printing as they go.
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

if [ "$#" -gt 0 ]; then
  .venv/bin/python -m pytest "$@" || { echo "FAILED: main environment: pytest $*"; exit 1; }
  exit 0
fi

env_scripts=$(ls scripts/test_env_*.sh | sort)
# the other environments' lane: its scripts in turn, each one's output kept in a log and its exit status in a file
run_env_lane() {
  local logs=$1 env_script name
  for env_script in $env_scripts; do
    name=$(basename "$env_script" .sh)
    local began=$SECONDS rc
    bash "$env_script" >"$logs/$name.log" 2>&1
    rc=$?
    echo $rc >"$logs/$name.rc"
    echo "== [second lane] $env_script ended: exit status $rc after $((SECONDS - began)) s"
  done
}

failed=()
start=$SECONDS
if [ "${HF_TPU_TEST_LANES:-2}" = 1 ]; then
  echo "== main environment (.venv): python -m pytest tests --ignore=tests/current"
  .venv/bin/python -m pytest tests --ignore=tests/current --durations=25 || failed+=("main environment (.venv)")
  for env_script in $env_scripts; do
    echo "== $env_script"
    bash "$env_script" || failed+=("$env_script")
  done
else
  logs=$(mktemp -d)
  trap 'kill 0 2>/dev/null; rm -rf "$logs"' INT TERM
  echo "== in a second lane: $(echo $env_scripts | tr '\n' ' ')(their output follows the main environment's)"
  run_env_lane "$logs" &
  lane=$!
  echo "== main environment (.venv): python -m pytest tests --ignore=tests/current"
  .venv/bin/python -m pytest tests --ignore=tests/current --durations=25 || failed+=("main environment (.venv)")
  echo "== main environment done after $((SECONDS - start)) s; waiting for the second lane"
  wait "$lane"
  for env_script in $env_scripts; do
    name=$(basename "$env_script" .sh)
    echo "== $env_script"
    cat "$logs/$name.log" 2>/dev/null
    [ "$(cat "$logs/$name.rc" 2>/dev/null)" = 0 ] || failed+=("$env_script")
  done
  rm -rf "$logs"
fi
echo "== all environments done after $((SECONDS - start)) s"
if [ "${#failed[@]}" -gt 0 ]; then
  printf 'FAILED: %s\n' "${failed[@]}"
  exit 1
fi
echo "all test environments passed"
