"""The framework-free core beside current releases (run in .venv-current by scripts/test_env_current.sh).

``pip install .`` (no extra) must leave transformers 5 and huggingface_hub 1.x/2.x in place, ``pip check``
must be clean, and the core modules must import without TensorFlow, torch, Keras, JAX or gradio.
"""

import json
import subprocess
import sys
import textwrap
from importlib.metadata import version
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
TF_VENV_HINT = "python -m venv .venv-tf && .venv-tf/bin/pip install 'hf-tpu-ext[tensorflow]'"


def _major(dist: str) -> int:
    return int(version(dist).split(".")[0])


def test_current_releases_are_installed_and_pip_check_is_clean():
    assert _major("transformers") == 5
    assert _major("huggingface_hub") >= 1
    assert _major("keras") == 3
    assert version("torch").startswith("2.13.0")
    out = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == "No broken requirements found."


def test_pip_install_core_changes_nothing_else(tmp_path):
    # --no-index: any requirement the environment does not already satisfy would fail the resolution here
    report = tmp_path / "report.json"
    out = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation", "--quiet",
         "--report", str(report), str(REPO_ROOT)],
        capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    installs = {item["metadata"]["name"]: item["metadata"]["version"] for item in json.loads(report.read_text())["install"]}
    assert installs == {"hf-tpu-ext": version("hf-tpu-ext")}


CORE_MODULES = [
    "hf_tpu_ext", "hf_tpu_ext.cli", "hf_tpu_ext.errors", "hf_tpu_ext.extras", "hf_tpu_ext.callbacks",
    "hf_tpu_ext.commands.callbacks", "spaces_demo.app",
]
FRAMEWORKS = ["tensorflow", "tf_keras", "torch", "keras", "keras_hub", "jax", "gradio"]


def test_core_imports_without_any_framework():
    code = textwrap.dedent(f"""
        import importlib, json, pkgutil, sys
        import hf_tpu_ext.hub
        names = {CORE_MODULES!r} + ["hf_tpu_ext.hub." + m.name for m in pkgutil.iter_modules(hf_tpu_ext.hub.__path__)]
        for name in names:
            importlib.import_module(name)
        from hf_tpu_ext.callbacks import callback_frameworks, resolve_callbacks
        frameworks = callback_frameworks()
        print(json.dumps({{"modules": names, "loaded": [m for m in {FRAMEWORKS!r} if m in sys.modules],
                          "throughput": frameworks["throughput"]}}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert {"hf_tpu_ext.hub.model_card", "hf_tpu_ext.hub.push_queue", "hf_tpu_ext.hub.resume"} <= set(result["modules"])
    assert result["loaded"] == []
    assert result["throughput"] == ["tf_keras", "keras", "torch"]


def test_cli_names_the_missing_extra():
    # TensorFlow is here (keras-hub's tokenizers need it) but tf_keras and transformers 4 are not
    train = subprocess.run([sys.executable, "-m", "hf_tpu_ext", "train", "--backend", "tensorflow", "--output_dir",
                            "unused-out"],
                           capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert train.returncode == 1
    # [tensorflow] would move transformers and huggingface_hub back here: a venv of its own
    found = f"transformers {version('transformers')}, huggingface_hub {version('huggingface_hub')}"
    assert train.stderr.strip().splitlines()[-1] == (
        "hf-tpu train: error: the TensorFlow backend needs [tensorflow] in a venv of its own (missing here: tf_keras, "
        f"transformers 4.x (found {version('transformers')}); installing it here would replace {found}, which "
        "[tensorflow] pins to transformers>=4.57,<5, huggingface_hub>=0.36,<1.0): "
        "python -m venv .venv-tf && .venv-tf/bin/pip install 'hf-tpu-ext[tensorflow]'.")
    assert not (REPO_ROOT / "unused-out").exists()

    listed = subprocess.run([sys.executable, "-m", "hf_tpu_ext", "callbacks"], capture_output=True, text=True,
                            timeout=300, cwd=REPO_ROOT)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.strip().splitlines()
    assert [line.split()[:2] for line in lines[:4]] == [
        [name, "tf_keras,keras,torch"] for name in ("masked_lm_metrics", "push_to_hub", "throughput", "xla_recompile_guard")]
    assert lines[4:] == [f"(tf_keras is not installed here: {TF_VENV_HINT} (a venv of its own: installing "
                         f"[tensorflow] here would replace {found}))"]


def test_get_callback_without_tf_keras_names_the_extra():
    from hf_tpu_ext.callbacks import get_callback
    from hf_tpu_ext.errors import MissingExtraError

    with pytest.raises(MissingExtraError) as err:
        get_callback("throughput", framework="tensorflow", global_batch_size=8, seq_length=32)
    assert str(err.value) == (
        "Callback 'throughput' for tf_keras (TensorFlow) needs [tensorflow] in a venv of its own (missing here: "
        f"tf_keras; installing it here would replace transformers {version('transformers')}, huggingface_hub "
        f"{version('huggingface_hub')}, which [tensorflow] pins to transformers>=4.57,<5, huggingface_hub>=0.36,<1.0): "
        f"{TF_VENV_HINT}.")


def test_keras3_masked_lm_metrics_without_evaluate_names_the_extra_when_built(monkeypatch):
    """It used to fail with a raw ModuleNotFoundError at the end of epoch 1."""
    from hf_tpu_ext.callbacks import get_callback
    from hf_tpu_ext.errors import MissingExtraError

    monkeypatch.setitem(sys.modules, "evaluate", None)  # not importable: find_spec returns None
    with pytest.raises(MissingExtraError) as err:
        get_callback("masked_lm_metrics", framework="keras", eval_dataset=[])
    assert str(err.value) == ("Callback 'masked_lm_metrics' for Keras 3 needs: pip install 'hf-tpu-ext[keras]' "
                              "(missing: evaluate).")
    monkeypatch.delitem(sys.modules, "evaluate")
    assert get_callback("masked_lm_metrics", framework="keras", eval_dataset=[]).eval_steps is None
