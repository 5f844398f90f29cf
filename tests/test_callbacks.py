"""Callback registry, FLOP counting, throughput, recompile guard and the masked-LM metric module."""

import json
import math
import subprocess
import sys
import textwrap
import warnings
from types import SimpleNamespace

import pytest

import hf_tpu_ext.callbacks as registry
from hf_tpu_ext.errors import ArgumentError, RecompilationError, UnknownCallbackError

BUILTIN = ["masked_lm_metrics", "push_to_hub", "throughput", "xla_recompile_guard"]


@pytest.fixture
def clean_registry():
    """Undo registrations a test makes."""
    saved = (dict(registry._REGISTRY), dict(registry._DESCRIPTIONS))
    yield registry
    registry._REGISTRY.clear()
    registry._REGISTRY.update(saved[0])
    registry._DESCRIPTIONS.clear()
    registry._DESCRIPTIONS.update(saved[1])


# ---------------------------------------------------------------------------------------------- registry
def test_cli_lists_callbacks_without_importing_tensorflow():
    code = (
        "import sys\n"
        "from hf_tpu_ext.cli import main\n"
        "rc = main(['callbacks'])\n"
        "print('RC', rc, 'TF', 'tensorflow' in sys.modules, 'KERAS', 'tf_keras' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[-1] == "RC 0 TF False KERAS False"
    listed = [line.split()[0] for line in lines[:-1]]
    assert listed == BUILTIN
    assert lines[2].split()[:2] == ["throughput", "tf_keras,keras,torch"]
    assert "Log samples/s, tokens/s (per replica), median step time and MFU." in lines[2]


def test_unknown_callback_lists_known_names():
    with pytest.raises(UnknownCallbackError) as err:
        registry.resolve_callbacks(["throughput", "foo"])
    msg = str(err.value)
    assert msg.startswith("Unknown callback 'foo' for the tf_keras framework. Known callbacks: ")
    listed = msg.split("Known callbacks: ", 1)[1].split(".")[0].split(", ")
    # the registry is process-wide: other modules (benchmarks) may have added names
    assert listed == sorted(listed)
    assert {"masked_lm_metrics", "push_to_hub", "throughput", "xla_recompile_guard"} <= set(listed)
    assert isinstance(err.value, KeyError)
    with pytest.raises(UnknownCallbackError, match="Unknown callback 'bar'"):
        registry.get_callback("bar", framework="tf_keras")


def test_builtin_classes_resolve_lazily_and_are_keras_callbacks():
    import tf_keras

    classes = registry.resolve_callbacks(["throughput", "xla_recompile_guard", "masked_lm_metrics"])
    assert [c.__name__ for c in classes] == ["ThroughputCallback", "XLARecompileGuard", "MaskedLMMetrics"]
    assert all(issubclass(c, tf_keras.callbacks.Callback) for c in classes)
    assert registry._REGISTRY["throughput"] is classes[0]  # the string entry was replaced by the class
    cb = registry.get_callback("throughput", framework="tf_keras", global_batch_size=8, seq_length=16)
    assert (cb.global_batch_size, cb.seq_length, cb.num_replicas) == (8, 16, 1)


def test_register_callback_and_build_callbacks(clean_registry):
    import tf_keras

    @registry.register_callback("my_plain")
    class MyPlain(tf_keras.callbacks.Callback):
        """Does nothing, politely.

        More text.
        """

    @registry.register_callback("my_from_run", description="Built from the run.")
    class MyFromRun(tf_keras.callbacks.Callback):
        def __init__(self, size=0):
            super().__init__()
            self.size = size

        @classmethod
        def from_run(cls, run):
            return cls(size=run.global_batch_size)

    names = registry.available_callbacks()
    assert names["my_plain"] == "Does nothing, politely."
    assert names["my_from_run"] == "Built from the run."
    run = SimpleNamespace(global_batch_size=24)
    built = registry.build_callbacks(["my_plain", "my_from_run"], run)
    assert isinstance(built[0], MyPlain) and isinstance(built[1], MyFromRun)
    assert built[1].size == 24

    with pytest.raises(ArgumentError, match="already registered"):
        @registry.register_callback("my_plain")
        class Other(tf_keras.callbacks.Callback):
            pass

    with pytest.raises(ArgumentError, match="tf_keras.callbacks.Callback subclass"):
        registry.register_callback("not_a_callback")(dict)
    with pytest.raises(ArgumentError, match="invalid"):
        registry.register_callback("a,b")


def test_entry_point_callbacks(tmp_path, monkeypatch, clean_registry):
    (tmp_path / "hftpu_plugin_mod.py").write_text(textwrap.dedent('''
        import tf_keras

        class PluginCallback(tf_keras.callbacks.Callback):
            """A plug-in."""

        NotACallback = object
    '''))
    dist = tmp_path / "hftpu_test_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: hftpu-test-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[hf_tpu_ext.callbacks]\n"
        "plugin_cb = hftpu_plugin_mod:PluginCallback\n"
        "broken_cb = hftpu_plugin_mod:NotACallback\n"
        "throughput = hftpu_plugin_mod:PluginCallback\n"  # a built-in name: ignored
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    names = registry.available_callbacks()
    assert names["plugin_cb"] == "Third-party callback (hftpu_plugin_mod:PluginCallback)."
    assert names["throughput"].startswith("Log samples/s")
    (cls,) = registry.resolve_callbacks(["plugin_cb"])
    assert cls.__name__ == "PluginCallback" and cls.__module__ == "hftpu_plugin_mod"
    assert registry.resolve_callbacks(["throughput"])[0].__name__ == "ThroughputCallback"
    with pytest.raises(ArgumentError, match="not a tf_keras.callbacks.Callback subclass"):
        registry.get_callback("broken_cb", framework="tf_keras")
    with pytest.raises(UnknownCallbackError, match="broken_cb, masked_lm_metrics, plugin_cb, push_to_hub"):
        registry.resolve_callbacks(["nope"])


def test_import_failure_breaks_only_that_callback(clean_registry):
    registry._REGISTRY["ghost"] = "hf_tpu_ext.callbacks.no_such_module:Ghost"
    registry._DESCRIPTIONS["ghost"] = "Missing on purpose."
    with pytest.raises(registry.CallbackImportError, match="Callback 'ghost' .* could not be imported"):
        registry.get_callback_class("ghost", framework="tf_keras")
    assert registry.get_callback_class("xla_recompile_guard", framework="tf_keras").__name__ == "XLARecompileGuard"


# ---------------------------------------------------------------------------------------------- FLOPs
def test_flops_per_token_formula():
    from hf_tpu_ext.flops import flops_per_token

    cfg = SimpleNamespace(hidden_size=64, num_hidden_layers=2, intermediate_size=128, vocab_size=300)
    # 6 * 2*(4*64^2 + 2*64*128) + 12*2*64*32 + 6*(64^2 + 64*300)
    assert flops_per_token(cfg, 32) == 393216 + 49152 + 139776
    assert flops_per_token(cfg, 32, masked_fraction=0.15) == pytest.approx(393216 + 49152 + 139776 * 0.15)
    assert flops_per_token(cfg, 32, masked_fraction=0.0) == 393216 + 49152
    with pytest.raises(ArgumentError, match="masked_fraction"):
        flops_per_token(cfg, 32, masked_fraction=1.5)
    with pytest.raises(ArgumentError, match="seq_length"):
        flops_per_token(cfg, 0)


def test_known_peak_flops():
    from hf_tpu_ext.flops import known_peak_flops

    assert known_peak_flops("TPU v4") == 275e12
    assert known_peak_flops("TPU v5 lite") == 197e12
    assert known_peak_flops("TPU v5p") == 459e12
    assert known_peak_flops("NVIDIA H100 80GB HBM3") == 989.5e12  # datasheet 1,979 with sparsity
    assert known_peak_flops("NVIDIA H100 80GB HBM3", dtype="float32") == 494.5e12  # TF32
    assert known_peak_flops("NVIDIA H100 PCIe") == 756.5e12
    assert known_peak_flops("NVIDIA A100-SXM4-40GB") == 312e12
    assert known_peak_flops("NVIDIA A100-SXM4-40GB", "float32") == 156e12
    assert known_peak_flops("CPU") is None
    assert known_peak_flops(None) is None


def test_measure_peak_flops_small_probe():
    import time

    from hf_tpu_ext.flops import measure_peak_flops

    start = time.perf_counter()
    flops = measure_peak_flops(size=256, iterations=8)
    assert time.perf_counter() - start < 30
    assert 1e8 < flops < 1e14  # a CPU core does 1e9..1e11 FLOP/s


# ---------------------------------------------------------------------------------------------- keras helpers
def _tiny_model(steps_per_execution=1):
    import tf_keras as keras

    inp = keras.Input((None,), dtype="int32", name="input_ids")
    x = keras.layers.Embedding(50, 8)(inp)
    x = keras.layers.GlobalAveragePooling1D()(x)
    out = keras.layers.Dense(2)(x)
    model = keras.Model({"input_ids": inp}, out)
    model.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=steps_per_execution)
    return model


def _dataset(seq_len, batches=4, batch=4):
    import numpy as np
    import tensorflow as tf

    n = batches * batch
    x = {"input_ids": np.arange(n * seq_len, dtype="int32").reshape(n, seq_len) % 50}
    return tf.data.Dataset.from_tensor_slices((x, np.arange(n, dtype="int32") % 2)).batch(batch, drop_remainder=True)


# ---------------------------------------------------------------------------------------------- throughput
def test_weighted_median():
    from hf_tpu_ext.step_window import weighted_median

    assert weighted_median([]) is None
    assert weighted_median([(3.0, 1), (1.0, 1), (2.0, 1)]) == 2.0
    assert weighted_median([(1.0, 1), (2.0, 1)]) == 1.5
    assert weighted_median([(1.0, 1), (5.0, 3)]) == 5.0  # one call of 3 steps outweighs one step


def test_throughput_counts_steps_per_execution(monkeypatch):
    from hf_tpu_ext.callbacks.tf_keras import throughput as module
    from hf_tpu_ext.callbacks import throughput_meter

    clock = iter(0.5 * i for i in range(10_000))  # every clock read advances 0.5 s
    monkeypatch.setattr(throughput_meter.time, "perf_counter", lambda: next(clock))
    cb = module.ThroughputCallback(global_batch_size=4, seq_length=8, num_replicas=2, flops_per_token=1000.0,
                                   peak_flops=1e6, warmup_steps=2, log_every=2)
    model = _tiny_model(steps_per_execution=2)
    history = model.fit(_dataset(8, batches=8), epochs=2, callbacks=[cb], verbose=0)
    h = history.history
    # each call: 2 steps of 4 sequences in 0.5 s
    assert h["samples_per_second"] == [16.0, 16.0]
    assert h["tokens_per_second"] == [128.0, 128.0]
    assert h["tokens_per_second_per_replica"] == [64.0, 64.0]
    assert h["step_time_ms_median"] == [250.0, 250.0]
    assert h["mfu"] == [pytest.approx(64.0 * 1000.0 / 1e6)] * 2
    s = cb.summary
    assert s["steps_measured"] == 14  # 16 steps, the first call (2 steps) is warm-up
    assert s["seconds_measured"] == pytest.approx(3.5)
    assert s["step_time_ms_median"] == 250.0 and s["step_time_ms_mean"] == 250.0
    assert s["tokens_per_second"] == 128.0 and s["mfu"] == pytest.approx(0.064)


def test_throughput_from_run_and_validation():
    from hf_tpu_ext.callbacks.tf_keras.throughput import ThroughputCallback
    from hf_tpu_ext.flops import flops_per_token

    cfg = SimpleNamespace(hidden_size=64, num_hidden_layers=2, intermediate_size=128, vocab_size=300)
    from hf_tpu_ext.run_context import RunContext

    run = RunContext(global_batch_size=32, seq_length=64, num_replicas=4, model_config=cfg,
                     data_args=SimpleNamespace(max_predictions_per_seq=10),
                     training_args=SimpleNamespace(bf16=True, logging_steps=7),  # no plan: an explicit --bf16 true
                     strategy_info=SimpleNamespace(device_kind="TPU v4"))
    cb = ThroughputCallback.from_run(run)
    assert (cb.global_batch_size, cb.seq_length, cb.num_replicas, cb.log_every) == (32, 64, 4, 0)  # hf-tpu train logs the one figure itself
    assert cb.flops_per_token == flops_per_token(cfg, 64, masked_fraction=10 / 64)
    assert cb.peak_flops == 275e12
    with pytest.raises(ArgumentError, match="global_batch_size must be >= 1"):
        ThroughputCallback(global_batch_size=0, seq_length=8)


# ---------------------------------------------------------------------------------------------- recompile guard
def test_guard_same_shapes_no_warning():
    from hf_tpu_ext.callbacks.tf_keras.xla_recompile_guard import XLARecompileGuard

    guard = XLARecompileGuard(action="raise")
    model = _tiny_model()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        model.fit(_dataset(8), epochs=2, callbacks=[guard], verbose=0)
        history = model.fit(_dataset(8, batches=3), epochs=1, callbacks=[guard], verbose=0)
    assert history.history["xla_compilations"] == [1]
    # tf.function traces twice for one signature when it creates variables: still one compilation
    assert model.train_function.experimental_get_tracing_count() >= 1
    assert guard.compilations == 1 and guard.events == []


def test_guard_warns_on_new_sequence_length():
    from hf_tpu_ext.callbacks.tf_keras.xla_recompile_guard import XLARecompileGuard

    guard = XLARecompileGuard(action="warn")
    model = _tiny_model()
    model.fit(_dataset(8), epochs=1, callbacks=[guard], verbose=0)
    with pytest.warns(RuntimeWarning) as record:
        history = model.fit(_dataset(6), epochs=1, callbacks=[guard], verbose=0)
    # other warnings (e.g. a ResourceWarning from garbage collection) may be recorded too
    guard_warnings = [str(r.message) for r in record if issubclass(r.category, RuntimeWarning)]
    assert len(guard_warnings) == 1, guard_warnings
    message = guard_warnings[0]
    assert "model.train_function was compiled again at global step 5 (compilation 2, 1 expected)" in message
    assert "['input_ids'] changed shape (4, 8) int32 -> shape (4, None) int32" in message
    assert history.history["xla_compilations"] == [2]
    assert guard.events == [message]


def test_guard_raises_and_tracks_new_train_functions():
    import tf_keras as keras

    from hf_tpu_ext.callbacks.tf_keras.xla_recompile_guard import XLARecompileGuard

    guard = XLARecompileGuard(action="raise")
    model = _tiny_model()
    model.fit(_dataset(8), epochs=1, callbacks=[guard], verbose=0)
    with pytest.raises(RecompilationError, match=r"input args\[0\]\[0\]\['input_ids'\] changed shape \(4, 8\)"):
        model.fit(_dataset(5), epochs=1, callbacks=[guard], verbose=0)
    # compile() makes fit build a new train function: its first trace is its own warm-up
    model.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(_dataset(5), epochs=1, callbacks=[guard], verbose=0)
    assert history.history["xla_compilations"] == [1]
    with pytest.raises(ArgumentError, match="action must be 'warn' or 'raise'"):
        XLARecompileGuard(action="ignore")


_SHORT_LAST_BATCH_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    import tf_keras as keras
    from hf_tpu_ext.callbacks.tf_keras.xla_recompile_guard import XLARecompileGuard
    from hf_tpu_ext.errors import RecompilationError

    guard = XLARecompileGuard(action=sys.argv[1])  # before the process's first XLA compilation
    model = keras.Sequential([keras.layers.Dense(4, input_shape=(3,))])
    model.compile(keras.optimizers.SGD(0.01), "mse", jit_compile=True)
    x, y = np.ones((20, 3), "float32"), np.ones((20, 4), "float32")
    result = {"raised": None, "history": None}
    try:
        history = model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[guard],
                            validation_data=(x[:5], y[:5]))
        result["history"] = history.history["xla_compilations"]
    except RecompilationError as e:
        result["raised"] = str(e)
    result.update(compilations=guard.compilations, events=guard.events,
                  traces=model.train_function.experimental_get_tracing_count(),
                  xla_modules=guard._current.xla_modules)
    print("RESULT " + json.dumps(result))
""")


@pytest.mark.parametrize("action", ["warn", "raise"])
def test_guard_counts_xla_compilation_of_short_last_batch(tmp_path, action):
    """fit(jit_compile=True), 20 samples, batch 8: one trace (batch dim None), but XLA compiles for 8 and 4."""
    import os
    import re

    dump = tmp_path / "xla_dump"
    env = dict(os.environ, XLA_FLAGS=f"--xla_dump_to={dump}", TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run([sys.executable, "-c", _SHORT_LAST_BATCH_SCRIPT, action], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.split("RESULT ", 1)[1])
    # what XLA itself reports: its dump has one module id per compilation (train steps and validation steps)
    compiled = sorted({int(m.group(1)) for m in (re.match(r"module_(\d+)\.", f) for f in os.listdir(dump)) if m})
    assert result["traces"] == 1  # a trace count alone sees one compilation
    message = ("model.train_function was compiled again at global step 3 (compilation 2, 1 expected): XLA compiled "
               "the step for a new concrete input shape under the same trace")
    if action == "raise":
        assert result["raised"].startswith(message) and result["history"] is None
        assert len(compiled) == 2 and result["xla_modules"] == compiled  # batch 8, then 4
    else:
        assert result["raised"] is None and result["history"] == [2, 2]
        # train steps at 8 and 4; validation (5 samples) compiled once more and is not counted
        assert len(compiled) == 3 and result["xla_modules"] == compiled[:2]
        assert len(result["events"]) == 1 and result["events"][0].startswith(message)
    assert result["compilations"] == 2


# ---------------------------------------------------------------------------------------------- metric module
def test_masked_lm_metric_module():
    from hf_tpu_ext.metrics.masked_lm import load_masked_lm_metric

    metric = load_masked_lm_metric()
    assert set(metric.features) == {"loss_sum", "num_correct", "num_tokens"}
    assert str(metric.features["loss_sum"].dtype) == "float64"
    out = metric.compute(loss_sum=[2.0, 4.0, 0.5], num_correct=[1, 2, 0], num_tokens=[2, 4, 2])
    assert out == {"eval_loss": 6.5 / 8, "perplexity": math.exp(6.5 / 8), "eval_accuracy": 3 / 8, "eval_tokens": 8}
    assert load_masked_lm_metric() is metric  # cached per process
    with pytest.raises(ValueError, match="No masked tokens"):
        metric.compute(loss_sum=[0.0], num_correct=[0], num_tokens=[0])
    assert metric.compute(loss_sum=[800.0], num_correct=[0], num_tokens=[1])["perplexity"] == float("inf")


def test_masked_lm_metrics_arguments():
    from hf_tpu_ext.callbacks.tf_keras.masked_lm_metrics import MaskedLMMetrics, metric_keys

    assert metric_keys() == {"eval_loss": "eval_loss", "perplexity": "perplexity",
                             "eval_accuracy": "eval_accuracy", "eval_tokens": "eval_tokens"}
    assert metric_keys("val_")["perplexity"] == "val_perplexity"
    with pytest.raises(ArgumentError, match="needs an eval_dataset"):
        MaskedLMMetrics(None)
    with pytest.raises(ArgumentError, match="every_n_steps must be >= 1"):
        MaskedLMMetrics([1], every_n_steps=0)
    run = SimpleNamespace(eval_dataset=[1], eval_steps=3, strategy=None,
                          training_args=SimpleNamespace(eval_strategy="steps", eval_steps=50, jit_compile=True))
    cb = MaskedLMMetrics.from_run(run)
    assert (cb.eval_steps, cb.every_n_steps, cb.jit_compile) == (3, 50, True)


def test_mfu_above_the_peak_is_left_out_with_one_warning(monkeypatch):
    from types import SimpleNamespace

    from transformers import RobertaConfig

    from hf_tpu_ext import flops
    from hf_tpu_ext.backends.tensorflow import trainer as trainer_module
    from hf_tpu_ext.backends.tensorflow.trainer import TFTrainer

    config = RobertaConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=128)
    fake = SimpleNamespace(model=SimpleNamespace(config=config), seq_length=32, args=SimpleNamespace(), bf16=False,
                           info=SimpleNamespace(accelerator="CPU", is_chief=True, num_workers=1),
                           strategy=SimpleNamespace(num_replicas_in_sync=1))
    monkeypatch.setattr(flops, "device_peak", lambda kind, dtype, **_: flops.Peak(1e9, "a test peak"))
    warnings = []
    monkeypatch.setattr(trainer_module.logger, "warning", lambda msg, *a: warnings.append(msg % a))
    mfu = TFTrainer._mfu_function(fake, None)
    fpt = flops.flops_per_token(config, 32, masked_fraction=None)
    assert mfu(0.5e9 / fpt) == pytest.approx(0.5)
    # above the peak: left out from then on (also below it again), said once
    assert mfu(2e9 / fpt) is None and mfu(3e9 / fpt) is None and mfu(0.5e9 / fpt) is None
    assert warnings == ["MFU left out: the model FLOP rate 2e+09 FLOP/s is above the peak 1e+09 FLOP/s "
                        "(a test peak); the peak is too low for this machine."]
    assert mfu.summary(0.5e9 / fpt) == {"mfu_note": warnings[0][:-1]}
