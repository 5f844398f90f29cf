"""MirroredStrategy over logical CPUs gives the same masked-LM numbers as one device (own process)."""

import json
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "eval_multireplica.py")


@pytest.fixture(scope="module")
def results():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run([sys.executable, SCRIPT, "2"], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-4000:]
    line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def _same(a, b, tol=1e-5):
    assert a["eval_tokens"] == b["eval_tokens"]
    assert a["eval_loss"] == pytest.approx(b["eval_loss"], rel=tol)
    assert a["perplexity"] == pytest.approx(b["perplexity"], rel=tol)
    assert a["eval_accuracy"] == pytest.approx(b["eval_accuracy"], abs=tol)


def test_two_replicas(results):
    assert results["num_replicas"] == 2


def test_mirrored_equals_single_device(results):
    single = results["single_ours"]
    assert single["eval_tokens"] == 42  # 10 sequences x 5 predictions, 4 sequences with 2 padded
    _same(results["mirrored_ours"], single)
    _same(results["mirrored_ours_distributed_input"], single)
    _same(results["mirrored_stock"], results["single_stock"])
    _same(results["single_ours_jit"], single)


def test_both_batch_formats_agree(results):
    # the head at masked positions only and the full-logits -100 path see the same tokens
    _same(results["single_stock"], results["single_ours"])


def test_steps_limit(results):
    assert results["single_ours_2_steps"]["eval_tokens"] == 34  # batches of 4+4 sequences, 3 with padding


def test_fit_under_mirrored_strategy_with_callbacks(results):
    h = results["fit_history"]
    assert h["xla_compilations"] == [1.0, 1.0]
    assert all(t > 0 for t in h["tokens_per_second"])
    assert h["tokens_per_second_per_replica"] == pytest.approx([t / 2 for t in h["tokens_per_second"]])
    assert results["throughput_summary"]["steps_measured"] == 5  # 6 steps, warm-up 1
    # the callback's evaluation after the last epoch equals a single-device evaluation of the trained weights
    after = results["single_after_fit"]
    assert h["val_loss"][-1] == pytest.approx(after["eval_loss"], rel=1e-5)
    assert h["val_perplexity"][-1] == pytest.approx(after["perplexity"], rel=1e-5)
    assert h["val_accuracy"][-1] == pytest.approx(after["eval_accuracy"], abs=1e-5)
    assert h["val_tokens"] == [42.0, 42.0]
