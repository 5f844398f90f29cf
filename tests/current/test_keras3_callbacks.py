"""Our four Keras 3 callbacks in a stock keras-hub ``fit`` (tests/scripts/keras_hub_mlm.py), JAX and TensorFlow.

Each backend runs in its own process (``KERAS_BACKEND`` is fixed at import): the script's ``main()`` trains a
tiny ``RobertaMaskedLM`` (2 layers, hidden 64, tokenizer from a vocabulary made in the script) with
``hub_strategy="checkpoint"`` against the loopback Hub, then the harness below loads the pushed preset with
``RobertaMaskedLM.from_preset("hf://...")``, restores ``last-checkpoint/`` into a fresh model, and forces a
recompilation (a short last batch). What the compiler reported is recorded independently of the guard:
a ``jax.monitoring`` listener on JAX, XLA's own dump folder (the test's ``XLA_FLAGS``) on TensorFlow.

Environment: the current-releases venv (scripts/test_env_current.sh) with keras>=3.15, keras-hub (which
pulls tensorflow-text and tensorflow: the TensorFlow backend), jax[cpu], evaluate and datasets (the
``masked_lm`` metric module).
"""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("keras")
pytest.importorskip("keras_hub")

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
SCRIPT = SCRIPTS / "keras_hub_mlm.py"
REPO = "alice/tiny-keras-hub"

HARNESS = textwrap.dedent("""
    import json, os, sys
    backend = os.environ["KERAS_BACKEND"]
    compiled = []  # what the compiler reports, recorded beside the guard
    if backend == "jax":
        import jax.monitoring
        jax.monitoring.register_event_duration_secs_listener(
            lambda event, seconds, **kw: compiled.append(kw.get("fun_name"))
            if event == "/jax/core/compile/backend_compile_duration" else None)
    sys.path.insert(0, sys.argv[1])
    import keras, keras_hub, numpy as np, tensorflow as tf
    import keras_hub_mlm
    from hf_tpu_ext.errors import RecompilationError

    out = {}
    model, history, callbacks = keras_hub_mlm.main(sys.argv[3:])
    push, throughput, guard, metrics = callbacks[1:]
    out["classes"] = [type(c).__module__ + ":" + type(c).__name__ for c in callbacks[1:]]
    out["transformers_imported"], out["keras_backend"] = "transformers" in sys.modules, backend
    out["history"] = history.history
    out["pushed_steps"], out["final_pushed"] = push.pushed_steps, push.report.final_pushed
    out["throughput"], out["metrics"] = throughput.summary, metrics.history
    from hf_tpu_ext.callbacks.keras.throughput import analytic_flops_per_token
    out["analytic_flops"] = analytic_flops_per_token(model, 32)
    out["guard_after_fit"] = [e["fun_name"] for e in guard.compiled]
    out["compiled_after_fit"] = list(compiled)

    # the final preset, from the Hub through HF_ENDPOINT, computes what the trained model computes
    x = keras.tree.map_structure(np.asarray, next(iter(metrics.eval_dataset))[0])
    loaded = keras_hub.models.RobertaMaskedLM.from_preset("hf://" + push.repo_id)
    mine = keras.Model.predict_on_batch(model, x)
    theirs = keras.Model.predict_on_batch(loaded, x)
    out["logits_shape"] = list(mine.shape)
    out["max_abs_diff"] = float(np.max(np.abs(np.asarray(mine) - np.asarray(theirs))))

    # resume: last-checkpoint/ into a freshly built, compiled model (weights and optimizer state)
    fresh = keras_hub.models.RobertaMaskedLM(backbone=keras_hub.models.RobertaBackbone.from_config(
        model.backbone.get_config()), preprocessor=model.preprocessor)
    fresh.compile(optimizer=keras.optimizers.AdamW(1e-3))
    state = type(push).restore_from_hub(fresh, push.repo_id)
    out["resume_state"] = state
    out["resume_iterations"] = int(keras.ops.convert_to_numpy(fresh.optimizer.iterations))
    out["resume_weights_equal"] = all(np.array_equal(a, b) for a, b in zip(fresh.get_weights(), model.get_weights()))

    # a forced recompilation: 20 samples in batches of 8, the last one short
    before = len(compiled)
    short = tf.data.Dataset.from_tensor_slices(keras_hub_mlm.sentences(20, 7)).batch(8)
    try:
        model.fit(short, epochs=1, callbacks=[guard], verbose=0)
        out["raised"] = None
    except RecompilationError as e:
        out["raised"] = str(e)
    out["guard_final"] = [e["fun_name"] for e in guard.compiled]
    out["compiled_in_short_fit"] = compiled[before:]
    out["guard_module_ids"] = [e.get("module_id") for e in guard.compiled]
    print("RESULT " + json.dumps(out, default=str))
""")


def _marked_block(source: str):
    begin, end = source.index("    # >>> hf-tpu-ext\n"), source.index("    # <<< hf-tpu-ext\n")
    return source[begin:end + len("    # <<< hf-tpu-ext\n")]


def test_script_diff_is_the_import_and_the_callbacks_list():
    source = SCRIPT.read_text()
    block = _marked_block(source)
    stock = source.replace(block, "")
    compile(stock, str(SCRIPT), "exec")  # the script without our lines is a complete program
    assert "hf_tpu_ext" not in stock and "get_callback" not in stock
    lines = [line.strip() for line in block.splitlines()[1:-1]]
    assert lines[0] == "from hf_tpu_ext.callbacks import get_callback"
    assert lines[1] == "callbacks += [" and lines[-1] == "]"
    calls = [re.match(r'get_callback\("(\w+)", framework="keras"', line) for line in lines[2:-1]]
    assert [m.group(1) for m in calls if m] == ["push_to_hub", "throughput", "xla_recompile_guard",
                                               "masked_lm_metrics"]
    assert "callbacks=callbacks" in stock  # the stock fit already takes a callbacks list


def _run(backend, tmp_path, loopback_hub, extra_env=None):
    env = dict(os.environ, KERAS_BACKEND=backend, HF_ENDPOINT=loopback_hub.endpoint, HF_TOKEN=loopback_hub.token,
               HF_HUB_DISABLE_XET="1", HF_HOME=str(tmp_path / "hf_home"), TF_CPP_MIN_LOG_LEVEL="2",
               JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join(filter(None, [str(SCRIPTS.parent.parent),
                                                                              os.environ.get("PYTHONPATH")])))
    env.update(extra_env or {})
    args = ["--output_dir", str(tmp_path / "out"), "--hub_model_id", REPO, "--epochs", "2"]
    proc = subprocess.run([sys.executable, "-c", HARNESS, str(SCRIPTS), "--", *args], capture_output=True,
                          text=True, env=env, timeout=900)
    assert proc.returncode == 0 and "RESULT " in proc.stdout, proc.stderr[-5000:]
    return json.loads(proc.stdout.split("RESULT ", 1)[1])


def _check_common(out, loopback_hub, tmp_path, train_step_name):
    from huggingface_hub import ModelCard

    from hf_tpu_ext.hub.model_card import check_card_metadata

    assert out["classes"] == [
        "hf_tpu_ext.callbacks.keras.push_to_hub:PushToHubCallback",
        "hf_tpu_ext.callbacks.keras.throughput:ThroughputCallback",
        "hf_tpu_ext.callbacks.keras.xla_recompile_guard:XLARecompileGuard",
        "hf_tpu_ext.callbacks.keras.masked_lm_metrics:MaskedLMMetrics",
    ]
    # 64 samples / batch 8 = 8 steps per epoch: a push at the first epoch's end; the second epoch's save is the last
    # step's, so it goes out with the final push (PushSession.admit coalesces it)
    assert out["pushed_steps"] == [8, 16] and out["final_pushed"] is True
    files = loopback_hub.server.files(REPO)
    # the save at the last step (16) went out with the final push: one commit for it, not two
    messages = [c["message"] for c in loopback_hub.server.commits(REPO)]
    assert messages.count("End of training") == 1 and "Training in progress, step 16" not in messages, messages
    preset = {"config.json", "task.json", "metadata.json", "model.weights.h5", "tokenizer.json",
              "preprocessor.json", "README.md"}
    assert preset <= set(files), sorted(files)
    assert {"last-checkpoint/checkpoint.weights.h5", "last-checkpoint/trainer_state.json", "loss_curve.png"} <= set(files)
    state = json.loads(files["last-checkpoint/trainer_state.json"])  # outputs.TrainerState's names, what the fit knew
    assert (state["global_step"], state["epoch"], state["max_steps"]) == (16, 2.0, 16)
    assert set(state) == {"global_step", "epoch", "max_steps", "num_train_epochs", "logging_steps", "eval_steps",
                          "save_steps", "train_batch_size", "num_input_tokens_seen", "total_flos", "train_runtime",
                          "log_history"}
    assert not any(name.startswith("checkpoints/") for name in files)
    card = ModelCard(files["README.md"].decode())
    assert card.data.library_name == "keras-hub" and card.data.pipeline_tag == "fill-mask"
    assert {"keras-hub", "keras", "roberta"} <= set(card.data.tags)
    assert check_card_metadata(card.data.to_dict()) == []
    assert 'keras_hub.models.RobertaMaskedLM.from_preset("hf://alice/tiny-keras-hub")' in card.text
    assert "(end of training: step 16, epoch 2)" in card.text
    # the card's evaluation (model-index and a table) and the checkpoint's trainer state say what ran
    h = out["history"]
    results = {r.metric_type: r.metric_value for r in card.data.eval_results}
    assert results == {"loss": round(h["eval_loss"][-1], 6), "perplexity": round(h["perplexity"][-1], 6),
                       "accuracy": round(h["eval_accuracy"][-1], 6)}
    assert f"| Perplexity | {round(h['perplexity'][-1], 6):.6g} |" in card.text
    epochs = [e for e in state["log_history"] if "eval_loss" in e]  # one per epoch, the batch-loss samples beside
    assert [(e["step"], e["epoch"]) for e in epochs] == [(8, 1.0), (16, 2.0)]
    assert [e["perplexity"] for e in epochs] == [round(p, 6) for p in h["perplexity"]]
    assert [e["loss"] for e in epochs] == [round(v, 6) for v in h["loss"]]
    assert [e["step"] for e in state["log_history"] if set(e) == {"loss", "step", "epoch"}] == list(range(1, 17))
    # 8 steps per epoch: a loss sample every step, an evaluation and a save per epoch; the meter's batch 8 x 32 tokens
    assert ([state[k] for k in ("logging_steps", "eval_steps", "save_steps", "num_train_epochs", "train_batch_size",
                                "num_input_tokens_seen")] == [1, 8, 8, 2, 8, 16 * 8 * 32])
    assert state["total_flos"] == pytest.approx(16 * 8 * 32 * out["throughput"]["flops_per_token"])
    assert state["train_runtime"] > 0
    _check_versions_and_resume(out, card)
    _check_fit_figures(out, card, train_step_name)


def _check_versions_and_resume(out, card):
    """The card's loss curve and framework versions; the preset loaded back; the resume from last-checkpoint/."""
    # the loss curve and the framework versions of the Keras backend that ran
    from importlib.metadata import version

    assert "\n### Loss curve\n\n![Training and evaluation loss](loss_curve.png)\n" in card.text
    dist = {"jax": "jax", "tensorflow": "tensorflow"}[out["keras_backend"]]
    names = ["keras", "keras-hub", *(["jax", "jaxlib"] if dist == "jax" else ["tensorflow"])] + (
        ["transformers"] if out["transformers_imported"] else []) + ["huggingface_hub", "hf-tpu-ext"]
    assert card.text.endswith("\n## Framework versions\n\n" + "".join(
        f"- {n} {version(n)}{' (the Keras backend)' if n == dist else ''}\n" for n in names)), card.text[-600:]
    # the final preset loads back through HF_ENDPOINT and computes the same logits
    assert out["logits_shape"][0] == 8 and out["logits_shape"][1] == 6
    assert out["max_abs_diff"] <= 1e-5
    # resume from the repo's last-checkpoint/: weights and optimizer state
    assert (out["resume_state"]["global_step"], out["resume_state"]["epoch"]) == (16, 2.0)
    assert out["resume_iterations"] == 16 and out["resume_weights_equal"] is True


def _check_fit_figures(out, card, train_step_name):
    """The guard's, metrics' and meter's figures, and the throughput rows of the card."""
    h = out["history"]
    assert h["xla_compilations"] == [1, 1]
    assert len(h["eval_loss"]) == 2 and all(t == h["eval_tokens"][0] > 0 for t in h["eval_tokens"])
    assert h["perplexity"][-1] == pytest.approx(__import__("math").exp(h["eval_loss"][-1]))
    assert 0.0 <= h["eval_accuracy"][-1] <= 1.0
    assert [m["step"] for m in out["metrics"]] == [8, 16]
    t = out["throughput"]
    assert (t["global_batch_size"], t["seq_length"], t["steps_measured"]) == (8, 32, 14)
    assert t["tokens_per_second"] == pytest.approx(t["samples_per_second"] * 32) and t["samples_per_second"] > 0
    assert t["flops_per_token"] > 0
    # the card's throughput rows are the meter's figures (the rows of hf-tpu train's card)
    from hf_tpu_ext.hub.card_render import throughput_rows

    steady = throughput_rows({"steady_tokens_per_second": t["tokens_per_second"]})[2]
    assert "| Tokens seen | 4,096 |" in card.text and f"| {steady[0]} | {steady[1]} |" in card.text
    assert ("| MFU (steady rate x FLOPs per token / peak FLOP/s) | " in card.text) == ("mfu" in t), card.text

    # the forced recompilation (batch 4 after 8) raised, with the compiler's count
    assert out["raised"].startswith(f"The train step ({train_step_name}) was XLA-compiled again at batch 2 of the "
                                    "epoch (compilation 2, 1 expected)")


def test_keras_hub_fit_on_jax(tmp_path, loopback_hub):
    out = _run("jax", tmp_path, loopback_hub, {"XLA_FLAGS": "--xla_backend_optimization_level=0"})
    _check_common(out, loopback_hub, tmp_path, "jit(train_step)")
    # exactly what JAX reported: one train-step compilation during fit (the metric's jit(stats), the
    # model's initialisers and predict compile outside train steps), one more for the short batch
    assert out["guard_after_fit"] == ["jit(train_step)"]
    assert [f for f in out["compiled_after_fit"] if "train_step" in f] == ["jit(train_step)"]
    assert "jit(stats)" in out["compiled_after_fit"]
    assert out["guard_final"] == ["jit(train_step)", "jit(train_step)"]
    assert [f for f in out["compiled_in_short_fit"] if "train_step" in f] == ["jit(train_step)"]
    assert out["throughput"]["flops_source"] == "xla"
    # XLA's count of the real graph is close to Kaplan/PaLM's formula (biases, softmax, LayerNorm on top)
    assert 0.9 <= out["throughput"]["flops_per_token"] / out["analytic_flops"] <= 1.5


def test_keras_hub_fit_on_tensorflow(tmp_path, loopback_hub):
    dump = tmp_path / "xla_dump"
    out = _run("tensorflow", tmp_path, loopback_hub,
               {"XLA_FLAGS": f"--xla_dump_to={dump} --xla_backend_optimization_level=0"})
    # exactly what XLA reported: its dump has one module id per compilation; the train step's module is
    # the tf.function one_step_on_data (a_inference_one_step_on_data_<n>__): compiled for batch 8, then 4
    modules = {int(m.group(1)): m.group(2) for m in (re.match(r"module_(\d+)\.([^.]+)", f) for f in os.listdir(dump)) if m}
    ids = out["guard_module_ids"]
    assert modules[ids[0]].startswith("a_inference_one_step_on_data_")
    # the same train function compiled twice; predict's one_step_on_data (another tf.function) is not counted
    assert ids == [i for i, name in sorted(modules.items()) if name == modules[ids[0]]] and len(ids) == 2
    assert len([name for name in modules.values() if name.startswith("a_inference_one_step_on_data_")]) == 3
    assert out["guard_after_fit"] == ["one_step_on_data"] and out["guard_final"] == ["one_step_on_data"] * 2
    _check_common(out, loopback_hub, tmp_path, "one_step_on_data")
    assert out["throughput"]["flops_source"] == "analytic"
    assert out["throughput"]["flops_per_token"] == out["analytic_flops"]


# ---------------------------------------------------------------------------------------------- fast checks
def _tiny_keras_model():
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.SGD(0.1), "mse")
    return model


def test_throughput_one_line_per_logging_step(caplog):
    import logging
    from types import SimpleNamespace

    import numpy as np

    from hf_tpu_ext.callbacks.keras.throughput import ThroughputCallback

    # hf-tpu train's loop logs the throughput itself: the callback's from_run adds no second line
    run = SimpleNamespace(global_batch_size=4, seq_length=3, num_replicas=1, flops_per_token=10.0,
                          training_args=SimpleNamespace(logging_steps=2))
    assert ThroughputCallback.from_run(run).log_every == 0
    assert ThroughputCallback.from_run(SimpleNamespace(**vars(run), logs_throughput=False)).log_every == 2
    # a plain fit: the callback's line is the one line, once per logging step, in step order
    model = _tiny_keras_model()
    cb = ThroughputCallback(global_batch_size=4, seq_length=3, warmup_steps=1, log_every=2, peak_flops=1e12)
    with caplog.at_level(logging.INFO, logger="hf_tpu_ext"):
        model.fit(np.ones((24, 3), "float32"), np.zeros((24, 2), "float32"), batch_size=4, epochs=1, verbose=0,
                  callbacks=[cb])
    lines = [r.getMessage() for r in caplog.records if "tokens/s" in r.getMessage()]
    assert [line.split(":")[0] for line in lines] == ["step 2", "step 4", "step 6"], lines


def test_push_to_hub_is_chief_only(monkeypatch, tmp_path):
    import hf_tpu_ext.callbacks.keras.push_to_hub as module

    monkeypatch.setattr(module, "process_index", lambda: 1)
    push = module.PushToHubCallback(output_dir=str(tmp_path / "out"), hub_model_id="alice/x", hub_token="hf_bad")
    push.set_model(_tiny_keras_model())
    # no preflight (the bad token is never sent), no save, no push on a non-chief process
    push.on_train_begin()
    push.on_epoch_end(0, {"loss": 1.0})
    push.on_train_end()
    assert push.session.staging_root is None and push.pushed_steps == [] and push.report is None
    assert not (tmp_path / "out").exists()


def test_push_to_hub_preflight_fails_before_training(loopback_hub, tmp_path):
    from hf_tpu_ext.callbacks import get_callback
    from hf_tpu_ext.errors import ArgumentError, HubAuthError

    push = get_callback("push_to_hub", framework="keras", output_dir=str(tmp_path / "out"), hub_model_id="alice/x",
                        hub_token="hf_not_a_valid_token_000000000000")
    push.set_model(_tiny_keras_model())
    with pytest.raises(HubAuthError) as err:
        push.on_train_begin()
    assert "hf_not_a_valid_token" not in str(err.value)
    assert ("model", "alice/x") not in loopback_hub.server.repos  # nothing created with a bad token
    with pytest.raises(ArgumentError, match="save_strategy='steps' needs save_steps >= 1"):
        get_callback("push_to_hub", framework="keras", output_dir=str(tmp_path), save_strategy="steps")


def test_push_a_plain_keras_model_and_resume_errors(loopback_hub, tmp_path):
    """A non-keras-hub Keras 3 model is pushed as model.keras with a Keras card; no checkpoint -> clear error."""
    import keras
    import numpy as np
    from huggingface_hub import ModelCard, hf_hub_download

    from hf_tpu_ext.callbacks import get_callback
    from hf_tpu_ext.errors import CheckpointError

    model = _tiny_keras_model()
    push = get_callback("push_to_hub", model=model, output_dir=str(tmp_path / "out"), hub_model_id="alice/plain",
                        hub_token=loopback_hub.token, save_strategy="no", backoff_seconds=0.01)
    assert type(push).__module__ == "hf_tpu_ext.callbacks.keras.push_to_hub"
    x = np.ones((8, 3), "float32")
    model.fit(x, np.zeros((8, 2), "float32"), batch_size=4, epochs=1, verbose=0, callbacks=[push])
    assert push.pushed_steps == [2] and push.report.final_pushed
    files = loopback_hub.server.files("alice/plain")
    assert {"model.keras", "README.md"} <= set(files) and not any(f.startswith("last-checkpoint/") for f in files)
    card = ModelCard(files["README.md"].decode())
    assert card.data.library_name == "keras" and "keras.saving.load_model" in card.text
    loaded = keras.saving.load_model(hf_hub_download("alice/plain", "model.keras", token=loopback_hub.token))
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6)
    with pytest.raises(CheckpointError, match="alice/plain has no last-checkpoint/ folder with a Keras 3 checkpoint"):
        type(push).restore_from_hub(_tiny_keras_model(), "alice/plain", token=loopback_hub.token)


def test_guard_and_metrics_arguments():
    from hf_tpu_ext.callbacks import get_callback
    from hf_tpu_ext.errors import ArgumentError

    with pytest.raises(ArgumentError, match="action must be 'warn' or 'raise'"):
        get_callback("xla_recompile_guard", framework="keras", action="ignore")
    with pytest.raises(ArgumentError, match="MaskedLMMetrics needs an eval_dataset"):
        get_callback("masked_lm_metrics", framework="keras", eval_dataset=None)
    metrics = get_callback("masked_lm_metrics", framework="keras", eval_dataset=[("only x",)])
    metrics.set_model(_tiny_keras_model())
    with pytest.raises(ArgumentError, match=r"each eval batch must be \(x, y, sample_weight\)"):
        metrics.evaluate()


def test_throughput_lines_carry_mfu_whenever_flops_are_known(caplog, monkeypatch):
    import logging

    import keras
    import numpy as np

    import hf_tpu_ext.callbacks.keras.throughput as module
    from hf_tpu_ext.flops import device_peak

    model = _tiny_keras_model()
    cb = module.ThroughputCallback(global_batch_size=4, seq_length=3, warmup_steps=1, log_every=2, flops_per_token=1e6,
                                   peak_flops=1e12)
    with caplog.at_level(logging.INFO, logger="hf_tpu_ext"):
        model.fit(np.ones((16, 3), "float32"), np.zeros((16, 2), "float32"), batch_size=4, epochs=1, verbose=0,
                  callbacks=[cb])
    lines = [r.getMessage() for r in caplog.records if "tokens/s" in r.getMessage()]
    assert len(lines) == 2 and all(re.search(r", MFU \d+\.\d%$", line) for line in lines), lines
    # Keras 3 on torch: the peak of the device torch trains on (the first CUDA device, else the CPU formula)
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(module, "backend_name", lambda: "torch")
    kind = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    assert module.device_peak() == device_peak(kind, keras.config.dtype_policy().compute_dtype)
