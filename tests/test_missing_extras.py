"""Each ``hf-tpu`` command in a core-only install (``pip install .``): the missing extra named, no traceback.

A core-only install is simulated in a subprocess: ``sys.modules[name] = None`` makes ``import name`` raise
``ModuleNotFoundError`` and ``importlib.util.find_spec(name)`` return ``None``, as when the package is absent.
"""

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# what `pip install .` does not bring (the extras' packages)
NOT_IN_CORE = ["tensorflow", "tf_keras", "datasets", "torch", "torch_xla", "gradio", "keras", "evaluate",
               "accelerate", "tensorboard", "matplotlib"]
RUNNER = (
    "import sys\n"
    "for name in sys.argv[1].split(','):\n"
    "    sys.modules[name] = None\n"
    "from hf_tpu_ext.cli import main\n"
    "sys.exit(main(sys.argv[2:]))\n"
)


def _run_core_only(args, tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO_ROOT),
           "HF_ENDPOINT": "http://127.0.0.1:9", "HF_TOKEN": "hf_unused", "HF_HUB_OFFLINE": "0"}
    return subprocess.run([sys.executable, "-c", RUNNER, ",".join(NOT_IN_CORE), *args], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path, env=env)


@pytest.fixture
def model_dir(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / "model.safetensors").write_bytes(b"")
    (tmp_path / "probes.txt").write_text("Paris is the <mask> of France. => capital\n")
    (tmp_path / "corpus.txt").write_text("some text\n" * 50)
    return out


@pytest.mark.parametrize("args, message", [
    (["prepare-data", "--train_file", "corpus.txt", "--output_path", "shards"],
     "hf-tpu prepare-data: error: hf-tpu prepare-data needs: pip install 'hf-tpu-ext[tensorflow]' "
     "(missing: tensorflow, datasets)."),
    # this is the TensorFlow venv (transformers 4.57, huggingface_hub 0.36): [jax] would replace both, so it is
    # named for a venv of its own (tests/test_messages.py: the same with fake versions)
    (["train", "--backend", "keras", "--output_dir", "run", "--max_steps", "2", "--report_to", "none"],
     "hf-tpu train: error: --backend keras needs [jax] in a venv of its own (missing here: keras, jax, "
     f"datasets; installing it here would replace transformers {version('transformers')}, huggingface_hub "
     f"{version('huggingface_hub')}, which [jax] pins to transformers>=5, huggingface_hub>=1.0): "
     "python -m venv .venv-jax && .venv-jax/bin/pip install 'hf-tpu-ext[jax]'."),
    (["probe", "out", "probes.txt"],
     "hf-tpu probe: error: hf-tpu probe runs the model with PyTorch or TensorFlow, and neither is installed: "
     "pip install 'hf-tpu-ext[torch]' (or '[tensorflow]')."),
    (["probe", "--backend", "torch", "out", "probes.txt"],
     "hf-tpu probe: error: hf-tpu probe --backend torch needs: pip install 'hf-tpu-ext[torch]' (missing: torch)."),
    (["probe", "--backend", "tensorflow", "out", "probes.txt"],
     "hf-tpu probe: error: hf-tpu probe --backend tensorflow needs: pip install 'hf-tpu-ext[tensorflow]' "
     "(missing: tensorflow)."),
])
def test_command_names_the_missing_extra(model_dir, tmp_path, args, message):
    out = _run_core_only(args, tmp_path)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == message
    assert not (tmp_path / "shards").exists()


@pytest.mark.parametrize("args", [["push", "out", "--hub_model_id", "user/model"],
                                  ["deploy-space", "--model_id", "user/model", "--space_id", "user/space"]])
def test_core_commands_run_without_any_extra(model_dir, tmp_path, args):
    # push and deploy-space need no framework: they get as far as the (unreachable) Hub
    out = _run_core_only(args, tmp_path)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith(
        f"hf-tpu {args[0]}: error: Could not reach the Hub at http://127.0.0.1:9/")


def test_callbacks_lists_each_missing_extra(tmp_path):
    out = _run_core_only(["callbacks"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-3:] == [
        "(tf_keras is not installed here: pip install 'hf-tpu-ext[tensorflow]')",
        "(keras is not installed here: pip install 'hf-tpu-ext[keras]')",
        "(torch is not installed here: pip install 'hf-tpu-ext[torch]')",
    ]
