"""`--backend keras` does what the TensorFlow backend's flags do: `--probe_file` and `--optim adafactor`.

* Adafactor: the Keras optimizer's updates equal transformers' PyTorch ``Adafactor`` as the Trainer builds it for
  ``--optim adafactor`` (no parameter scaling, no relative step; weight decay off LayerNorm/biases; a linear
  schedule), 1e-6 after 6 steps, through ``optimizer.stateless_apply`` in ``jax.jit`` as in the training step.
* One tiny run (module fixture) with ``--optim adafactor --probe_file``: each evaluation logs ``probe_top1``,
  ``probe_top5``, ``probe_mrr``, ``probe_n``; the final one equals what the probe scorer gives on the logits of
  transformers 5's PyTorch ``RobertaForMaskedLM`` loaded from the exported folder (TF transformers classes do not
  exist in transformers 5). A run of 4 steps resumed to 8 ends with its weights and Adafactor state (1e-5).
* ``--report_to trackio``: each log entry of the Keras loop reaches trackio (a stand-in module), once finished.

Runs in the current-releases venv: ``KERAS_BACKEND=jax JAX_PLATFORMS=cpu python -m pytest tests/current``.
"""

import json
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("keras_hub")
pytest.importorskip("jax")
if os.environ.get("KERAS_BACKEND", "jax") != "jax":
    pytest.skip("--backend keras runs on KERAS_BACKEND=jax", allow_module_level=True)

PROBES = ("# answers ranked against their distractors (several tokens: scored left to right), one against the "
          "vocabulary\n"
          "The <mask> is returned . => value | function\n"
          "A <mask> is called . => function | class | module\n"
          "The name of <mask> class . => the | a\n"
          "This is <mask> same . => the\n")
PROBE_KEYS = ("probe_top1", "probe_top5", "probe_mrr", "probe_n")


def parity_args(output_dir, steps, probe_file=None):
    """A tiny Adafactor run; with ``probe_file`` also evaluated (and probed) every 4 steps, else never."""
    evaluation = (["--eval_steps", "4", "--probe_file", str(probe_file)] if probe_file
                  else ["--eval_strategy", "no"])
    return ["--backend", "keras", "--output_dir", str(output_dir),
            "--hidden_size", "32", "--num_hidden_layers", "2", "--num_attention_heads", "2",
            "--intermediate_size", "64", "--vocab_size", "300", "--max_seq_length", "32",
            "--hidden_dropout_prob", "0", "--attention_probs_dropout_prob", "0",
            "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "8",
            "--max_train_samples", "128", "--max_eval_samples", "16", "--logging_steps", "4",
            "--optim", "adafactor", "--learning_rate", "1e-2", "--lr_scheduler_type", "constant",
            "--weight_decay", "0.01", "--max_steps", str(steps), "--save_steps", "4", *evaluation,
            "--seed", "5", "--disable_tqdm", "true"]


def _train_here(args):
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run import train

    return train(*parse_args(list(map(str, args))))


def _tensors(path):
    from safetensors.numpy import load_file

    return load_file(str(path))


@pytest.fixture(scope="module")
def parity_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("parity")
    probe_file = folder / "probes.txt"
    probe_file.write_text(PROBES, encoding="utf-8")
    out = folder / "model"
    _train_here(parity_args(out, 8, probe_file))
    return out, probe_file


def test_adafactor_is_transformers_adafactor_as_the_trainer_builds_it():
    import jax
    import keras
    import torch
    from transformers import get_linear_schedule_with_warmup
    from transformers.optimization import Adafactor

    from hf_tpu_ext.backends.keras.optimization import make_optimizer, optimizer_description

    rng = np.random.default_rng(0)
    shapes = {"kernel": (6, 5), "embeddings": (3, 4, 5), "bias": (5,), "gamma": (5,)}
    init = {k: rng.normal(size=s).astype("float32") for k, s in shapes.items()}
    weights = [keras.Variable(v, name=k) for k, v in init.items()]
    args = SimpleNamespace(optim="adafactor", lr_scheduler_type="linear", learning_rate=0.05, weight_decay=0.1,
                           max_grad_norm=0.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8,
                           num_warmup_steps=lambda total: 2)
    optimizer, _ = make_optimizer(args, 10)
    optimizer.build(weights)
    # factored weights keep a row and a column mean, not a full-size second moment (Adafactor's memory saving)
    assert [tuple(v.shape) for v in optimizer.variables] == [(), (6,), (5,), (3, 4), (3, 5), (5,), (5,)]
    assert optimizer_description(args) == ("Adafactor (no parameter scaling, no relative step, decay_rate=-0.8, "
                                           "clip_threshold=1.0), linear learning-rate schedule")
    grads = [[rng.normal(size=s).astype("float32") * (i + 1) for s in shapes.values()] for i in range(6)]
    apply = jax.jit(optimizer.stateless_apply)
    ours, opt_vars = [w.value for w in weights], [v.value for v in optimizer.variables]
    for g in grads:
        ours, opt_vars = apply(opt_vars, g, ours)

    params = {k: torch.nn.Parameter(torch.tensor(v)) for k, v in init.items()}
    groups = [{"params": [params["kernel"], params["embeddings"]], "weight_decay": 0.1},  # the Trainer's groups
              {"params": [params["bias"], params["gamma"]], "weight_decay": 0.0}]
    theirs = Adafactor(groups, lr=0.05, scale_parameter=False, relative_step=False, warmup_init=False)
    schedule = get_linear_schedule_with_warmup(theirs, 2, 10)
    for g in grads:
        for p, gg in zip(params.values(), g):
            p.grad = torch.tensor(gg)
        theirs.step()
        schedule.step()
    for name, a in zip(init, ours):
        moved = np.abs(np.asarray(a) - init[name]).max()
        assert moved > 0.05, name  # it trained
        np.testing.assert_allclose(np.asarray(a), params[name].detach().numpy(), atol=1e-6, rtol=0, err_msg=name)


def test_probe_scores_at_each_evaluation_equal_the_torch_model_of_the_export(parity_run):
    from hf_tpu_ext.fill_mask import FillMaskPredictor
    from hf_tpu_ext.probes import parse_probes

    out, probe_file = parity_run
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    evals = [e for e in history if "probe_mrr" in e]
    assert [e["step"] for e in evals] == [4, 8]
    assert all("eval_loss" in e and e["probe_n"] == 4 for e in evals)
    torch_model = FillMaskPredictor(out, backend="torch")
    want = torch_model.score_probes(parse_probes(probe_file.read_text(encoding="utf-8")), strict=True).log_entry()
    assert {k: evals[-1][k] for k in PROBE_KEYS} == pytest.approx(want, abs=1e-9)
    results = json.loads((out / "all_results.json").read_text())
    assert {k: results[k] for k in PROBE_KEYS} == pytest.approx(want, abs=1e-9)


def test_adafactor_resume_equals_the_uninterrupted_run(parity_run, tmp_path):
    reference = parity_run[0]
    out = tmp_path / "model"
    _train_here(parity_args(out, 4))  # without evaluations (they do not change the weights): a shorter test
    _train_here([*parity_args(out, 8), "--resume_from_checkpoint", "true"])
    for name in ("model.safetensors", "checkpoint-8/optimizer_state.safetensors"):
        ours, ref = _tensors(out / name), _tensors(reference / name)
        assert sorted(ours) == sorted(ref) and len(ref) > 10
        for key in ref:
            np.testing.assert_allclose(ours[key], ref[key], atol=1e-5, rtol=0, err_msg=f"{name}: {key}")


def test_report_to_trackio_logs_each_entry_of_the_keras_loop(tmp_path, monkeypatch):
    import importlib.machinery
    import sys
    import types

    calls = []
    fake = types.ModuleType("trackio")
    fake.__spec__ = importlib.machinery.ModuleSpec("trackio", None)  # find_spec sees it as installed
    fake.init = lambda project, config: calls.append(("init", project, config))
    fake.log = lambda values, step: calls.append(("log", step, values))
    fake.finish = lambda: calls.append(("finish",))
    monkeypatch.setitem(sys.modules, "trackio", fake)

    results = _train_here(parity_args(tmp_path / "tracked", 8) + ["--report_to", "trackio"])
    assert calls[0][:2] == ("init", "tracked")
    assert (calls[0][2]["backend"], calls[0][2]["optim"], calls[0][2]["learning_rate"]) == ("keras", "adafactor", 1e-2)
    logged = [c for c in calls if c[0] == "log"]
    history = json.loads((tmp_path / "tracked" / "trainer_state.json").read_text())["log_history"]
    train_entries = [e for e in history if "loss" in e]
    assert [c[1] for c in logged][:len(train_entries)] == [e["step"] for e in train_entries] == [4, 8]
    for (_, step, values), entry in zip(logged, train_entries):
        assert values["loss"] == entry["loss"] and "step" not in values
    assert calls[-1] == ("finish",) and calls.count(("finish",)) == 1
    assert results["global_step"] == 8
    assert not (tmp_path / "tracked" / "runs").exists()  # trackio only: no TensorBoard events


