#!/usr/bin/env bash
# The Apache Beam prepare-data pipeline in its own environment (.venv-beam): apache-beam's pins are kept away from
# TensorFlow's. Installs hf-tpu-ext without its TensorFlow dependencies plus the [beam] extra, then runs tests/beam.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
[ -x .venv-beam/bin/python ] || "$PY" -m venv .venv-beam
# the [beam] extra's requirements, read from pyproject.toml (the package itself goes in with --no-deps)
mapfile -t BEAM_REQS < <(.venv-beam/bin/python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["beam"]))')
.venv-beam/bin/pip install -q "${BEAM_REQS[@]}" "pytest>=8"
.venv-beam/bin/pip install -q --no-deps -e .
echo "[test_env_beam] .venv-beam/bin/python -m pytest -q --confcutdir tests/beam tests/beam"
exec .venv-beam/bin/python -m pytest -q -p no:cacheprovider --confcutdir tests/beam tests/beam "$@"
