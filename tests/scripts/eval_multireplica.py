"""Evaluate one tiny masked LM on one device and on N logical CPU replicas; print the numbers as JSON.

Run in its own process (logical devices must be configured before TensorFlow runs any op):
``python eval_multireplica.py [num_replicas]``. ``tests/test_callbacks_multireplica.py`` compares the
printed numbers.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

NUM_REPLICAS = int(sys.argv[1]) if len(sys.argv) > 1 else 2

import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * NUM_REPLICAS)

import numpy as np  # noqa: E402
import tf_keras  # noqa: E402
from transformers import RobertaConfig, TFRobertaForMaskedLM  # noqa: E402

from hf_tpu_ext.metrics.masked_lm_tf import evaluate_masked_lm  # noqa: E402
from hf_tpu_ext.callbacks import get_callback  # noqa: E402

VOCAB, L, P, N = 300, 32, 5, 10  # 10 sequences in batches of 4: the last batch (2) is split unevenly


def make_model():
    config = RobertaConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=128, max_position_embeddings=L + 2, type_vocab_size=1,
                           hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = TFRobertaForMaskedLM(config)
    model(model.dummy_inputs, training=False)
    return model


def data():
    rng = np.random.default_rng(0)
    input_ids = rng.integers(5, VOCAB, size=(N, L)).astype("int32")
    positions = np.stack([np.sort(rng.choice(np.arange(1, L), P, replace=False)) for _ in range(N)]).astype("int32")
    ids = np.take_along_axis(input_ids, positions, axis=1).astype("int32")
    weights = np.ones((N, P), "float32")
    weights[::3, -2:] = 0.0  # padded predictions
    positions[::3, -2:] = 0
    masked = input_ids.copy()
    np.put_along_axis(masked, positions, 4, axis=1)  # 4 stands for <mask>
    ours = {"input_ids": masked, "attention_mask": np.ones_like(masked), "masked_lm_positions": positions,
            "masked_lm_ids": ids, "masked_lm_weights": weights}
    labels = np.full((N, L), -100, "int32")
    for i in range(N):
        for p, t, w in zip(positions[i], ids[i], weights[i]):
            if w > 0:
                labels[i, p] = t
    stock = {"input_ids": masked, "attention_mask": np.ones_like(masked), "labels": labels}
    return ours, stock


def ds(arrays, batch=4):
    return tf.data.Dataset.from_tensor_slices(arrays).batch(batch)


def main():
    t0 = time.perf_counter()
    timings = {}
    ours, stock = data()
    out = {"num_replicas": len(tf.config.list_logical_devices("CPU"))}
    single = make_model()
    out["single_ours"] = evaluate_masked_lm(single, ds(ours))
    out["single_stock"] = evaluate_masked_lm(single, ds(stock))
    out["single_ours_2_steps"] = evaluate_masked_lm(single, ds(ours), steps=2)
    out["single_ours_jit"] = evaluate_masked_lm(single, ds(ours), jit_compile=True)
    timings["single"] = time.perf_counter() - t0

    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(NUM_REPLICAS)])
    with strategy.scope():
        mirrored = make_model()
    mirrored.set_weights(single.get_weights())
    out["mirrored_ours"] = evaluate_masked_lm(mirrored, ds(ours), strategy=strategy)
    out["mirrored_stock"] = evaluate_masked_lm(mirrored, ds(stock))  # strategy from the model
    out["mirrored_ours_distributed_input"] = evaluate_masked_lm(
        mirrored, strategy.experimental_distribute_dataset(ds(ours)), strategy=strategy)
    timings["mirrored"] = time.perf_counter() - t0

    # model.fit under the strategy with the callbacks; then the callback's last numbers must equal a
    # single-device evaluation of the trained weights
    train = tf.data.Dataset.from_tensor_slices(stock).repeat().batch(4, drop_remainder=True)
    with strategy.scope():
        mirrored.compile(optimizer=tf_keras.optimizers.SGD(0.1))
    callbacks = [
        get_callback("throughput", framework="tf_keras", global_batch_size=4, seq_length=L, num_replicas=NUM_REPLICAS, warmup_steps=1),
        get_callback("xla_recompile_guard", framework="tf_keras", action="raise"),
        get_callback("masked_lm_metrics", framework="tf_keras", eval_dataset=ds(stock), prefix="val_"),
    ]
    history = mirrored.fit(train, epochs=2, steps_per_epoch=3, callbacks=callbacks, verbose=0)
    out["fit_history"] = {k: [float(x) for x in v] for k, v in history.history.items()}
    single.set_weights(mirrored.get_weights())
    out["single_after_fit"] = evaluate_masked_lm(single, ds(stock))
    out["throughput_summary"] = callbacks[0].summary
    timings["fit"] = time.perf_counter() - t0
    out["timings"] = timings
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
