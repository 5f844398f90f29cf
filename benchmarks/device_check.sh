#!/usr/bin/env bash
# Accelerator check on a fresh GPU machine: install jax with CUDA and this project's [jax] extra in a venv, then run
# benchmarks/device_check.py (the Keras backend's compiled step at RoBERTa-base shapes, bf16): tokens/s, step time,
# MFU against the chip's datasheet peak, compilations (must be 1), device memory. Results: $OUT/device_check.json
# when OUT is set (and $OUT/device_check_env.txt: the installed versions). Before it, the FSDP line:
# benchmarks/compiled_memory.py on the chips (bert-base, modernbert-large: state and temporaries per chip,
# replicated / fsdp / fsdp + --gradient_checkpointing; $OUT/compiled_memory.json), ~1-3 min.
#
# Usage (repository root):
#   bash benchmarks/device_check.sh [ARGS...]   # ARGS go to the Python module, e.g. --batch 32 --steps 30
#   bash benchmarks/device_check.sh --plan      # print the install commands and the CUDA choice, run nothing
#   bash benchmarks/device_check.sh --dry-run   # no install: tiny shapes on the CPU with $PYTHON (default python3)
#
# What it installs (from PyPI, into ${DEVICE_CHECK_VENV:-.venv-device}): this project with its [jax] extra (keras,
# keras-hub, jax, transformers, huggingface_hub, ...), then jax[cuda13] (driver >= 580) or jax[cuda12] (older
# drivers, and the fallback when CUDA 13's plugin finds no GPU) at the jax version the extra installed: NVIDIA's
# CUDA runtime, cuDNN, cuBLAS and NCCL wheels come with it. uv is used when it is on PATH (faster; DEVICE_CHECK_UV=0:
# pip), else pip.
# Time: the install ~1-3 min, the check ~1-2 min (compilation included); the check is cut at
# ${DEVICE_CHECK_TIMEOUT:-480} s.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV="${DEVICE_CHECK_VENV:-.venv-device}"
PY="$VENV/bin/python"
PLAN=0

run() {  # echo a command, then run it (only echo with --plan)
  echo "+ $*"
  if [ "$PLAN" = 0 ]; then "$@"; fi
}

driver_major() {  # the NVIDIA driver's major version, or 0 without nvidia-smi
  local version
  version="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1 || true)"
  version="${version%%.*}"
  case "$version" in '' | *[!0-9]*) echo 0 ;; *) echo "$version" ;; esac
}

cuda_extras() {  # the jax CUDA extras to try, in order
  if [ "$(driver_major)" -ge 580 ]; then echo "cuda13 cuda12"; else echo "cuda12"; fi
}

use_uv() { [ "${DEVICE_CHECK_UV:-1}" != 0 ] && command -v uv >/dev/null 2>&1; }

pip_install() {
  if use_uv; then run uv pip install --python "$PY" "$@"; else run "$PY" -m pip install -q "$@"; fi
}

pip_uninstall() {
  if use_uv; then run uv pip uninstall --python "$PY" "$@"; else run "$PY" -m pip uninstall -q -y "$@"; fi
}

make_venv() {
  if [ -x "$PY" ]; then echo "+ reusing $VENV"; return; fi
  if use_uv; then run uv venv -q "$VENV"; else run python3 -m venv "$VENV"; fi
  if ! use_uv; then run "$PY" -m pip install -q --upgrade pip; fi
}

gpu_seen() {  # jax sees a GPU
  "$PY" -c 'import jax, sys; sys.exit(0 if jax.devices()[0].platform == "gpu" else 1)' 2>/dev/null
}

install() {
  make_venv
  pip_install -e ".[jax]"
  local jax_version extra
  if [ "$PLAN" = 1 ]; then
    jax_version='<the jax version [jax] installed>'
  else
    jax_version="$("$PY" -c 'import jax; print(jax.__version__)')"
  fi
  echo "NVIDIA driver $(driver_major): jax CUDA extras to try: $(cuda_extras)"
  for extra in $(cuda_extras); do
    if [ "$PLAN" = 1 ]; then
      pip_install "jax[$extra]==$jax_version"
      echo "  (then: stop here if jax sees a GPU, else try the next extra)"
      continue
    fi
    if pip_install "jax[$extra]==$jax_version" && gpu_seen; then
      echo "jax $jax_version with $extra sees the GPU"
      return 0
    fi
    echo "jax[$extra] gave no GPU; trying the next" >&2
    pip_uninstall "jax-$extra-plugin" "jax-$extra-pjrt" || true  # two CUDA plugins would both claim the GPU
  done
  [ "$PLAN" = 1 ] && return 0
  echo "device_check: no jax CUDA build found a GPU (nvidia-smi: driver $(driver_major)); see the messages above" >&2
  return 1
}

compiled_memory() {  # FSDP: the compiled step's memory per chip, replicated / --fsdp / --fsdp + remat (not run)
  run env KERAS_BACKEND=jax timeout "${DEVICE_CHECK_TIMEOUT:-480}" "$PY" -m benchmarks.compiled_memory --accelerator \
    --models bert-base modernbert-large ${OUT:+--json "$OUT/compiled_memory.json"} || true
}

main() {
  case "${1:-}" in
    --plan) PLAN=1; shift ;;
    --dry-run)
      shift
      KERAS_BACKEND=jax JAX_PLATFORMS=cpu exec "${PYTHON:-python3}" -m benchmarks.device_check --dry-run "$@" ;;
  esac
  install
  if [ "$PLAN" = 1 ]; then
    compiled_memory
    echo "+ KERAS_BACKEND=jax timeout ${DEVICE_CHECK_TIMEOUT:-480} $PY -m benchmarks.device_check $*"
    return 0
  fi
  if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null || true
      "$PY" -c 'import importlib.metadata as m; print("\n".join(sorted(f"{d.metadata[\"Name\"]}=={d.version}" for d in
m.distributions() if d.metadata["Name"].lower().startswith(("jax", "keras", "nvidia-c")))))' || true
    } > "$OUT/device_check_env.txt"
  fi
  compiled_memory
  KERAS_BACKEND=jax timeout "${DEVICE_CHECK_TIMEOUT:-480}" "$PY" -m benchmarks.device_check "$@"
}

main "$@"
