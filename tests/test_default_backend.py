"""``--backend`` unset: the Keras backend when Keras 3 and JAX are installed, else TensorFlow, else one line naming
both extras (``hf_tpu_ext.console.default_backend``, the one place that decides; ``args.py``, the backend registry
and ``hf-tpu train``'s pre-parse ask it). This venv has TensorFlow and no JAX; the current-releases venv's side is
``tests/current/test_no_tensorflow.py``."""

import importlib.util

import pytest

from hf_tpu_ext.console import NO_BACKEND_MESSAGE, default_backend
from hf_tpu_ext.errors import MissingExtraError


def _only(*modules):
    """A ``find_spec`` that finds only ``modules``."""
    return lambda name: importlib.util.find_spec(name) if name in modules else None


def test_this_venv_defaults_to_tensorflow():
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.backends import BACKEND_REGISTRY, backend_entry

    assert importlib.util.find_spec("jax") is None  # the TensorFlow venv: no JAX
    assert default_backend() == "tensorflow"
    assert backend_entry(None) is BACKEND_REGISTRY["tensorflow"]
    assert parse_args(["--output_dir", "x"])[2].backend == "tensorflow"
    assert parse_args(["--output_dir", "x", "--backend", "torch_xla"])[2].backend == "torch_xla"


def test_keras_and_jax_win_and_neither_is_one_line():
    fake_jax = lambda name: object() if name == "jax" else importlib.util.find_spec(name)  # noqa: E731
    assert default_backend(fake_jax) == "keras"  # keras 3 is installed here (TensorFlow 2.21 brings it)
    assert default_backend(_only("tensorflow", "tf_keras")) == "tensorflow"
    fake_xla_only = lambda name: object() if name == "torch_xla" else None  # noqa: E731
    assert default_backend(fake_xla_only) == "torch_xla"  # a [torch-xla] venv trains on what it installed
    for find_spec in (_only(), _only("keras"), _only("jax", "tensorflow")):
        with pytest.raises(MissingExtraError) as err:
            default_backend(find_spec)
        assert str(err.value) == NO_BACKEND_MESSAGE == (
            'No training backend is installed: pip install "hf-tpu-ext[jax]" (Keras 3 on JAX, the default) or pip '
            'install "hf-tpu-ext[tensorflow]" (TensorFlow 2.21 + transformers 4), then rerun.')


def test_core_only_train_names_both_extras(tmp_path):
    from test_missing_extras import _run_core_only

    out = _run_core_only(["train", "--output_dir", "run", "--max_steps", "2"], tmp_path)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == f"hf-tpu train: error: {NO_BACKEND_MESSAGE}"
    assert not (tmp_path / "run").exists()
