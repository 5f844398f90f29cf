"""The TensorFlow checkpoint's write through one traced ``tf.function`` (issue 31 item 9: an eager
``Checkpoint.write`` kept ~16-20 KB of native memory per save): the same files and keys as an eager write, the
values of the moment of the write (not of the trace), a retrace when the optimizer's slots appear, and the resume's
restore reads it."""

import os
from types import SimpleNamespace

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tf_keras = pytest.importorskip("tf_keras")

CONFIG = SimpleNamespace(hidden_size=4, num_hidden_layers=1, num_attention_heads=1, intermediate_size=8,
                         vocab_size=6, max_position_embeddings=10)


def _model_and_optimizer():
    model = tf_keras.Sequential([tf_keras.layers.Dense(3, input_shape=(4,)), tf_keras.layers.Dense(2)])
    model.config = CONFIG
    return model, tf_keras.optimizers.Adam(1e-2)


def _step(model, optimizer):
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(tf.ones((2, 4))) ** 2)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))


def _keys(prefix):
    return sorted(name for name, _ in tf.train.list_variables(prefix))


def test_traced_write_files_keys_values_and_retrace(tmp_path):
    from hf_tpu_ext.backends.tensorflow.checkpoint import TrainingCheckpointer

    model, optimizer = _model_and_optimizer()
    ckpt = TrainingCheckpointer(model, optimizer, str(tmp_path / "c"), max_to_keep=5)
    ckpt.save(1)  # before the first step: no optimizer slots yet
    _step(model, optimizer)  # Adam's m/v and iterations now exist: the next write traces again
    ckpt.save(2)
    model.layers[0].kernel.assign(tf.fill((4, 3), 0.25))  # after the trace: the write saves the value of now
    ckpt.save(3)
    assert ckpt._traced_write.experimental_get_tracing_count() == 1  # one trace for writes 2 and 3
    assert sorted(n for n in os.listdir(tmp_path / "c") if n.startswith("ckpt-3.")) == [
        "ckpt-3.data-00000-of-00001", "ckpt-3.index", "ckpt-3.json"]  # one data shard, as an eager write

    eager = tf.train.Checkpoint(model=model, optimizer=optimizer, global_step=ckpt.global_step, epoch=ckpt.epoch)
    eager.save_counter  # noqa: B018  (the same objects as TrainingCheckpointer's)
    eager.write(str(tmp_path / "eager" / "ckpt-3"))
    assert _keys(str(tmp_path / "c" / "ckpt-3")) == _keys(str(tmp_path / "eager" / "ckpt-3"))
    assert len(_keys(str(tmp_path / "c" / "ckpt-3"))) > len(_keys(str(tmp_path / "c" / "ckpt-1")))  # the slots

    fresh, fresh_opt = _model_and_optimizer()
    restorer = TrainingCheckpointer(fresh, fresh_opt, str(tmp_path / "c"))
    assert restorer.restore() == 3
    np.testing.assert_array_equal(fresh.layers[0].kernel.numpy(), np.full((4, 3), 0.25, np.float32))
    for a, b in zip(fresh.weights, model.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    _step(fresh, fresh_opt)  # the slots are created now and take the checkpoint's values (deferred restore)
    assert int(fresh_opt.iterations.numpy()) == 2
