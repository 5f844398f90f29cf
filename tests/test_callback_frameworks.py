"""The callbacks registry across frameworks: tf_keras, Keras 3 and torch (transformers Trainer).

``get_callback`` picks the implementation for the model it is used with or the ``framework=`` argument; a
missing framework fails with the pip extra that brings it; resolving names imports no other framework.
"""

import subprocess
import sys
import textwrap

import pytest

import hf_tpu_ext.callbacks as registry
from hf_tpu_ext.errors import ArgumentError, MissingExtraError, UnknownCallbackError


@pytest.fixture
def clean_registry():
    """Undo registrations a test makes (every framework's tables)."""
    saved = {fw: (dict(registry._TABLES[fw]), dict(registry._DESCRIPTION_TABLES[fw])) for fw in registry.FRAMEWORKS}
    yield registry
    for fw, (table, descriptions) in saved.items():
        registry._TABLES[fw].clear()
        registry._TABLES[fw].update(table)
        registry._DESCRIPTION_TABLES[fw].clear()
        registry._DESCRIPTION_TABLES[fw].update(descriptions)


def test_framework_names_and_aliases():
    assert [registry.normalize_framework(n) for n in ("tf_keras", "tensorflow", "keras", "keras3", "torch",
                                                      "torch_xla", "PyTorch")] == [
        "tf_keras", "tf_keras", "keras", "keras", "torch", "torch", "torch"]
    with pytest.raises(ArgumentError, match=r"Unknown callback framework 'mxnet'; use 'tf_keras' \(alias 'tensorflow'\)"):
        registry.normalize_framework("mxnet")
    assert registry.callback_frameworks()["push_to_hub"] == ["tf_keras", "keras", "torch"]
    # the Keras 3 classes are looked up lazily in hf_tpu_ext.callbacks.keras.<module>
    assert {name: targets["keras"] for name, (_, targets) in registry._BUILTINS.items()} == {
        "masked_lm_metrics": "hf_tpu_ext.callbacks.keras.masked_lm_metrics:MaskedLMMetrics",
        "push_to_hub": "hf_tpu_ext.callbacks.keras.push_to_hub:PushToHubCallback",
        "throughput": "hf_tpu_ext.callbacks.keras.throughput:ThroughputCallback",
        "xla_recompile_guard": "hf_tpu_ext.callbacks.keras.xla_recompile_guard:XLARecompileGuard",
    }
    with pytest.raises(ArgumentError, match="framework='torch' and backend='tensorflow' disagree"):
        registry.get_callback_class("throughput", framework="torch", backend="tensorflow")


def test_framework_of_models_trainers_and_callbacks():
    import keras
    import tf_keras
    import torch
    from transformers import Trainer, TrainerCallback

    assert registry.framework_of(tf_keras.Sequential([tf_keras.layers.Dense(2)])) == "tf_keras"
    assert registry.framework_of(keras.Sequential([keras.layers.Dense(2)])) == "keras"
    assert registry.framework_of(torch.nn.Linear(2, 2)) == "torch"
    assert registry.framework_of(Trainer) == "torch"
    assert registry.framework_of(type("MyTrainer", (Trainer,), {})) == "torch"
    assert registry.framework_of(TrainerCallback) == "torch"
    assert registry.framework_of(keras.callbacks.Callback()) == "keras"
    assert registry.framework_of(tf_keras.callbacks.Callback) == "tf_keras"
    assert registry.framework_of(object()) is None


def test_get_callback_picks_the_class_for_the_model(clean_registry):
    import keras
    import tf_keras
    import torch

    tf_model = tf_keras.Sequential([tf_keras.layers.Dense(2)])
    cb = registry.get_callback("throughput", model=tf_model, global_batch_size=8, seq_length=16)
    assert type(cb).__module__ == "hf_tpu_ext.callbacks.tf_keras.throughput"
    assert isinstance(cb, tf_keras.callbacks.Callback)
    assert (cb.global_batch_size, cb.seq_length) == (8, 16)

    torch_cb = registry.get_callback("throughput", model=torch.nn.Linear(2, 2), seq_length=32)
    assert type(torch_cb).__module__ == "hf_tpu_ext.callbacks.torch.throughput"

    # a Keras 3 callback registered without framework=: the framework comes from its base class
    @registry.register_callback("test_k3_only")
    class K3Only(keras.callbacks.Callback):
        """A Keras 3 callback."""

    assert registry._KERAS_REGISTRY["test_k3_only"] is K3Only
    assert "test_k3_only" not in registry._REGISTRY
    k3_model = keras.Sequential([keras.layers.Dense(2)])
    assert isinstance(registry.get_callback("test_k3_only", model=k3_model), K3Only)
    assert registry.callback_frameworks()["test_k3_only"] == ["keras"]
    with pytest.raises(UnknownCallbackError) as err:
        registry.get_callback("test_k3_only", model=tf_model)
    assert str(err.value).startswith(
        "Callback 'test_k3_only' has no tf_keras implementation (it has: keras). Known tf_keras callbacks: ")

    with pytest.raises(ArgumentError, match="framework='torch' does not match the model, a tf_keras model"):
        registry.get_callback("throughput", framework="torch", model=tf_model)
    with pytest.raises(ArgumentError, match=r"Cannot tell the framework of builtins.dict; pass framework="):
        registry.get_callback("throughput", model={})
    with pytest.raises(ArgumentError, match=r"must decorate a keras.callbacks.Callback \(Keras 3\) subclass"):
        registry.register_callback("test_bad_k3", framework="keras")(tf_keras.callbacks.Callback)


def test_missing_framework_names_the_extra(monkeypatch):
    # a None entry in sys.modules is how Python spells "not importable": find_spec returns None
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(MissingExtraError) as err:
        registry.get_callback("throughput", framework="torch")
    assert str(err.value) == ("Callback 'throughput' for torch (transformers Trainer) needs: "
                              "pip install 'hf-tpu-ext[torch]' (missing: torch).")
    assert isinstance(err.value, ImportError)
    monkeypatch.setitem(sys.modules, "keras", None)
    with pytest.raises(MissingExtraError, match=r"Callback 'xla_recompile_guard' for Keras 3 needs: pip install 'hf-tpu-ext\[keras\]'"):
        registry.get_callback_class("xla_recompile_guard", framework="keras")


def test_hf_tpu_train_without_tensorflow_names_the_extra(tmp_path):
    code = textwrap.dedent("""
        import sys
        sys.modules["tensorflow"] = None
        sys.modules["tf_keras"] = None
        from hf_tpu_ext.cli import main
        sys.exit(main(["train", "--output_dir", sys.argv[1], *sys.argv[2:]]))
    """)

    def last_line(*args):
        out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "out"), *args], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 1, out.stderr
        return out.stderr.strip().splitlines()[-1]

    # asked for by name: the TensorFlow extra; left to the default (no JAX in this venv either): both extras
    assert last_line("--backend", "tensorflow") == (
        "hf-tpu train: error: the TensorFlow backend needs: pip install 'hf-tpu-ext[tensorflow]' "
        "(missing: tensorflow, tf_keras).")
    assert last_line() == (
        'hf-tpu train: error: No training backend is installed: pip install "hf-tpu-ext[jax]" (Keras 3 on JAX, '
        'the default) or pip install "hf-tpu-ext[tensorflow]" (TensorFlow 2.21 + transformers 4), then rerun.')
    assert not (tmp_path / "out").exists()


def test_hf_tpu_demo_without_gradio_or_a_framework_names_the_extra(tmp_path):
    code = textwrap.dedent("""
        import sys
        for name in sys.argv[1].split(","):
            sys.modules[name] = None
        from hf_tpu_ext.cli import main
        sys.exit(main(["demo", sys.argv[2]]))
    """)
    lines = {}
    for blocked in ("gradio", "torch,tensorflow"):
        out = subprocess.run([sys.executable, "-c", code, blocked, str(tmp_path)], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 1, out.stderr
        lines[blocked] = out.stderr.strip().splitlines()[-1]
    assert lines["gradio"] == "hf-tpu demo: error: hf-tpu demo needs: pip install 'hf-tpu-ext[demo]' (missing: gradio)."
    assert lines["torch,tensorflow"] == (
        "hf-tpu demo: error: hf-tpu demo runs the model with PyTorch or TensorFlow, and neither is installed: "
        "pip install 'hf-tpu-ext[demo,torch]' (or '[demo,tensorflow]').")


def test_resolving_names_imports_only_the_framework_asked_for():
    code = textwrap.dedent("""
        import sys
        import hf_tpu_ext.callbacks as registry
        print("IMPORTED", sorted(m for m in ("tensorflow", "tf_keras", "keras", "torch", "gradio") if m in sys.modules))
        registry.available_callbacks("keras"), registry.callback_frameworks()
        registry.resolve_callbacks(["throughput", "xla_recompile_guard"], "torch")
        print("TORCH", sorted(m for m in ("tensorflow", "tf_keras", "keras", "gradio") if m in sys.modules))
        print(registry.get_callback_class("throughput", framework="tensorflow").__module__)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["IMPORTED []", "TORCH []", "hf_tpu_ext.callbacks.tf_keras.throughput"]


def test_keras_entry_point_group(tmp_path, monkeypatch, clean_registry):
    (tmp_path / "hftpu_k3_plugin.py").write_text(textwrap.dedent('''
        import keras

        class K3Plugin(keras.callbacks.Callback):
            """A Keras 3 plug-in."""
    '''))
    dist = tmp_path / "hftpu_k3_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: hftpu-k3-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[hf_tpu_ext.keras_callbacks]\nk3_plugin = hftpu_k3_plugin:K3Plugin\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    assert registry.available_callbacks("keras")["k3_plugin"] == "Third-party callback (hftpu_k3_plugin:K3Plugin)."
    assert "k3_plugin" not in registry.available_callbacks("tf_keras")
    assert registry.callback_frameworks()["k3_plugin"] == ["keras"]
    cls = registry.get_callback_class("k3_plugin", framework="keras")
    assert (cls.__module__, cls.__name__) == ("hftpu_k3_plugin", "K3Plugin")


def test_trainer_script_without_framework_gets_the_torch_callbacks(tmp_path):
    # transformers 4 with TensorFlow installed loads tf_keras on `from transformers import Trainer`
    code = textwrap.dedent("""
        import sys
        from transformers import Trainer, TrainerCallback
        from hf_tpu_ext.callbacks import get_callback
        cb = get_callback("throughput", seq_length=32, global_batch_size=8)
        push = get_callback("push_to_hub", output_dir=sys.argv[1], hub_model_id="me/m")
        print("LOADED", "tf_keras" in sys.modules, "torch" in sys.modules)
        print(type(cb).__module__, isinstance(cb, TrainerCallback), hasattr(cb, "on_init_end"))
        print(type(push).__module__, isinstance(push, TrainerCallback))
    """)
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-3:] == [
        "LOADED True True",
        "hf_tpu_ext.callbacks.torch.throughput True True",
        "hf_tpu_ext.callbacks.torch.push_to_hub True",
    ]


def test_keras_script_with_torch_loaded_gets_the_keras_callback(monkeypatch):
    import tf_keras  # noqa: F401
    import torch  # noqa: F401

    # transformers 4's TF classes import torch when it is installed: with no Trainer loaded, the script is Keras
    monkeypatch.delitem(sys.modules, "transformers.trainer", raising=False)
    assert registry.loaded_frameworks() == ["tf_keras", "torch"]
    assert registry.default_framework() == "tf_keras"
    cb = registry.get_callback("throughput", global_batch_size=8, seq_length=32)
    assert isinstance(cb, tf_keras.callbacks.Callback)
    monkeypatch.setitem(sys.modules, "transformers.trainer", sys.modules.get("transformers"))
    assert registry.default_framework() == "torch"
    # only one framework loaded: that one, whatever else is installed
    monkeypatch.delitem(sys.modules, "torch")
    assert registry.loaded_frameworks() == ["tf_keras"]
    assert registry.default_framework() == "tf_keras"
