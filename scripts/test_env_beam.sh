#!/usr/bin/env bash
# The Apache Beam prepare-data pipeline's tests in their own venv (.venv-beam): apache-beam's pins stay away from
# TensorFlow's, and the pipeline needs no TensorFlow (tests/beam/test_beam_prepare.py, DirectRunner).
# Usage: bash scripts/test_env_beam.sh [pytest args] (scripts/test.sh runs it)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv-beam/bin/python ]; then
  python3 -m venv .venv-beam
fi
. .venv-beam/bin/activate
python -m pip install -q -e ".[beam]" "pytest>=8"
python -c "import apache_beam, sys; assert 'tensorflow' not in sys.modules; print('[test_env_beam] apache-beam', apache_beam.__version__)"
# --confcutdir: the main suite's tests/conftest.py (loopback Hub fixtures) is not needed here
python -m pytest -q -p no:cacheprovider --confcutdir tests/beam tests/beam "$@"
