#!/usr/bin/env bash
# The torch_xla backend's tests in their own venv (.venv-xla): torch_xla 2.9 needs exactly torch 2.9.x, while
# the main test venv (.venv, scripts/test.sh) has torch 2.13. XLA runs on the CPU here (PJRT_DEVICE=CPU).
# Usage: bash scripts/test_env_torch_xla.sh [pytest args] (scripts/test.sh runs it)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv-xla/bin/python ]; then
  python3 -m venv .venv-xla
fi
. .venv-xla/bin/activate
python -m pip install -q --upgrade pip
# torch first, pinned, so the project's dependencies cannot pull another torch
python -m pip install -q "torch==2.9.1" "torch_xla==2.9.0" accelerate "pytest>=8"
python -m pip install -q -e ".[torch-xla]"
python -c "import torch, torch_xla; assert torch.__version__.startswith('2.9.'), torch.__version__"
export PJRT_DEVICE=CPU
export USE_TF=0  # transformers without TensorFlow: TF loaded before torch_xla aborts on duplicate LLVM options
export XLA_FLAGS="${XLA_FLAGS:---xla_backend_optimization_level=0}"  # 3x faster XLA:CPU compiles for tiny models
python -m pytest -q -p no:cacheprovider tests/test_torch_xla*.py "$@"
