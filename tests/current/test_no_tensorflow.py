"""The current stack without TensorFlow: ``hf-tpu train`` with no ``--backend`` trains on the Keras backend
(Keras 3 + JAX are installed here) and the training process imports no ``tensorflow`` module.

keras-hub (``[keras]``) requires tensorflow-text, so TensorFlow is installed in this venv; the training run here
stands for ``pip install ".[jax]"`` (no keras-hub): ``sys.modules["keras_hub"] = None`` makes keras-hub absent
(``find_spec`` gives None, ``import`` fails), and the export then writes no ``keras_hub/`` preset. Anything else that
imports TensorFlow (Keras, transformers, datasets, the step, the card) shows up in ``sys.modules`` at exit.

Run: ``KERAS_BACKEND=jax JAX_PLATFORMS=cpu .venv-current/bin/python -m pytest -q tests/current/test_no_tensorflow.py``.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO_ROOT, tiny_train_args

pytest.importorskip("jax")


def test_default_backend_here_is_keras():
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.backends import BACKEND_REGISTRY, backend_entry
    from hf_tpu_ext.console import default_backend, requested_backend

    assert default_backend() == "keras"
    assert backend_entry(None) is BACKEND_REGISTRY["keras"]
    assert requested_backend(["--output_dir", "x"]) == "keras"
    assert requested_backend(["--output_dir", "x", "--backend=tensorflow"]) == "tensorflow"
    assert parse_args(["--output_dir", "x"])[2].backend == "keras"


def test_train_without_backend_flag_imports_no_tensorflow(tmp_path):
    out = tmp_path / "run"
    args = tiny_train_args(out, "--max_steps", "4", "--logging_steps", "2", "--eval_strategy", "no",
                           "--save_strategy", "no", "--report_to", "none", "--log_level", "debug")
    code = textwrap.dedent(f"""
        import json, sys
        sys.modules["keras_hub"] = None  # [jax] without [keras]
        from hf_tpu_ext.cli import main
        rc = main(["train", *{[str(a) for a in args]!r}])
        loaded = sorted(m for m in sys.modules if m == "tensorflow" or m.startswith("tensorflow."))
        print(json.dumps({{"rc": rc, "tensorflow": loaded[:5], "keras_hub": sys.modules.get("keras_hub", 0)}}))
    """)
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=REPO_ROOT,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"rc": 0, "tensorflow": [], "keras_hub": None}
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["backend"] == "keras" and summary["global_step"] == 4
    assert (out / "model.safetensors").is_file() and not (out / "keras_hub").exists()
    # DEBUG: the README says keras_hub/ needs [keras]; --log_level info (and the default) leave it out
    assert ('DEBUG hf_tpu_ext.backends.keras.export: keras-hub is not installed: no keras_hub/ preset in ' in proc.stderr
            and 'pip install "hf-tpu-ext[keras]" adds it' in proc.stderr)
    assert ("precision float32, compiler path: XLA (JAX). Why: float32 is the default off a TPU; --bf16 auto uses "
            "bf16 where the hardware has it." in proc.stderr)
    assert {"keras", "jax", "jaxlib", "transformers"} <= set(summary["framework_versions"])
