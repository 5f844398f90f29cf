#!/usr/bin/env bash
# The current-releases environment (.venv-current, Python 3.11): Keras 3 + JAX (CPU) + keras-hub, transformers 5
# + torch (CPU), huggingface_hub 1.x/2.x, current gradio, and this package's core with the extras that fit
# ([jax,keras,torch,demo]: [jax] is `hf-tpu train --backend keras`; not [tensorflow], which needs transformers 4). Checks `pip check`, then runs tests/current.
# scripts/test.sh runs it; alone: bash scripts/test_env_current.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=$(command -v python3.11 || command -v python3)
[ -x .venv-current/bin/python ] || "$PYTHON" -m venv .venv-current
. .venv-current/bin/activate
python -m pip install -q --upgrade pip
# torch pinned and first: the CPU wheel (an unpinned torch pulls a multi-GB CUDA build); the rest at their
# newest releases, so this environment follows what users get today. tensorflow: the Keras 3 TensorFlow
# backend (keras-hub's tokenizers need it too, through tensorflow-text); datasets + evaluate: the masked_lm metric
python -m pip install -q "torch==2.13.0"
python -m pip install -q "torch==2.13.0" "jax[cpu]" "keras>=3.15" keras-hub tensorflow "transformers>=5" \
  "huggingface_hub>=1.0" gradio accelerate datasets evaluate "pytest>=8"
python -m pip install -q -e ".[jax,keras,torch,demo]"
python -m pip check
python - <<'PY'
from importlib.metadata import version
print("current releases:", ", ".join(f"{d} {version(d)}" for d in (
    "keras", "keras-hub", "jax", "torch", "transformers", "huggingface_hub", "gradio", "tensorflow")))
PY
export KERAS_BACKEND="${KERAS_BACKEND:-jax}"
export JAX_PLATFORMS=cpu
python -m pytest -q -p no:cacheprovider --durations=25 tests/current "$@"
