"""Shared fixtures. Expensive ones are session-scoped: TF import and one tiny training run per session."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from hub_fixtures import loopback_hub, loopback_hub_server  # noqa: E402,F401  (the loopback Hub fixtures)

import logging
import subprocess
import sys
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"

# A 2-layer, hidden-64 RoBERTa on 32-token blocks: seconds per run on 2 CPU cores.
TINY_MODEL_ARGS = [
    "--hidden_size", "64", "--num_hidden_layers", "2", "--num_attention_heads", "2",
    "--intermediate_size", "128", "--vocab_size", "500", "--max_seq_length", "32",
]


def tiny_train_args(output_dir, *extra):
    """Arguments of a tiny `hf-tpu train` run on the embedded corpus (dropout off: deterministic)."""
    return [
        "--output_dir", str(output_dir), *TINY_MODEL_ARGS,
        "--hidden_dropout_prob", "0", "--attention_probs_dropout_prob", "0",
        "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "8",
        "--max_train_samples", "512", "--max_eval_samples", "64", "--logging_steps", "5",
        "--learning_rate", "1e-3", "--disable_tqdm", "true", *extra,
    ]


def run_train_script(args, env=None, timeout=600, check=True):
    """`python tests/scripts/run_train.py ARGS` in a fresh process (own TF devices, can be killed)."""
    full_env = dict(os.environ, **(env or {}))
    full_env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), full_env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, str(TESTS_DIR / "scripts" / "run_train.py"), *map(str, args)],
                          env=full_env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"run_train.py exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return proc


@pytest.fixture(autouse=True)
def _signals_forgotten_after_each_test():
    """A test that ends with a signal recorded (a run stopped by SIGINT) must not leave it to the next: a push
    session admits saves past its budget after a signal (a run resets this at its start; a bare session does not)."""
    yield
    from hf_tpu_ext import interrupts

    interrupts.reset()


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory):
    """One tiny `hf-tpu train` run per session (in this process): (output_dir, results dict)."""
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run import train

    out = tmp_path_factory.mktemp("trained") / "model"
    args = parse_args(tiny_train_args(out, "--max_steps", "30", "--jit_compile", "true", "--save_strategy", "steps", "--save_steps", "10",
                                      "--eval_strategy", "steps", "--eval_steps", "15",
                                      "--callbacks", "throughput,xla_recompile_guard"))
    results = train(*args)
    return out, results


@pytest.fixture(scope="session")
def trained_model_dir(trained_run):
    """The output folder of the session's tiny training run (config, tokenizer, PT-format safetensors)."""
    return trained_run[0]


@pytest.fixture
def hf_log(caplog):
    """caplog that also sees the ``hf_tpu_ext`` logger (it does not propagate to the root logger)."""
    logger = logging.getLogger("hf_tpu_ext")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="hf_tpu_ext")
    yield caplog
    logger.removeHandler(caplog.handler)
