"""Which per-step host operation of the TensorFlow backend grows memory? RSS and heap bytes per call, one op at a time.

Each ``--op`` is one thing ``hf-tpu train --backend tensorflow`` does at every device call (issue 31 item 9:
~1 KB of native growth per step), run ``--calls`` times in this process after the same allocator settings as
the backend (:func:`hf_tpu_ext.backends.tensorflow.strategy.configure_host_memory`; ``--no_tune``: glibc's and
TensorFlow's defaults):

* ``train``: a ``tf.function`` of one optimizer step in a ``tf.while_loop`` over a distributed dataset's
  iterator (a tiny ``tf_keras`` model, legacy Adam with the backend's :class:`TransformersSchedule`), called
  with ``tf.constant(1)`` as the trainer does, its loss read as a float;
* ``data``: one batch of the backend's own input pipeline (:func:`hf_tpu_ext.data.pipeline.make_train_dataset`
  over 512 blocks of 32 tokens, 64 steps an epoch, masked as in training), taken in a ``tf.function``;
* ``lr``: the schedule evaluated eagerly at a Python int step (the loop's learning rate of each call);
* ``lr_numpy``: the same at the step as a NumPy ``int64`` (TensorFlow caches the eager tensor of every distinct
  Python number it converts, for the life of the process; NumPy scalars other than ``float64`` are not cached);
* ``read_step``: ``optimizer.iterations`` read as an int (the throughput callback's step count);
* ``ident``: a ``tf.function`` returning its input (TensorFlow issue 57982's case);
* ``all``: ``train`` + ``lr`` + ``read_step`` (one call of the loop before the fix); ``all_numpy``: with
  ``lr_numpy`` instead (after it).

Figures: least-squares slope over the calls after the first third, of RSS (KB per call) and of glibc's heap
bytes in use (``mallinfo2``, KB per call: a leak grows it; memory freed but kept only grows RSS). A benchmark,
not a test: it prints JSON and asserts nothing.

Usage (from the repository root, the TensorFlow venv):
    python -m benchmarks.step_ops_rss --op all [--calls 30000] [--no_tune]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

OPS = ("train", "data", "lr", "lr_numpy", "read_step", "ident", "all", "all_numpy")


def _slope(points):
    """Least-squares slope of (x, y) points (nan with < 2)."""
    n = len(points)
    if n < 2:
        return float("nan")
    mx, my = sum(p[0] for p in points) / n, sum(p[1] for p in points) / n
    var = sum((p[0] - mx) ** 2 for p in points)
    return sum((p[0] - mx) * (p[1] - my) for p in points) / var if var else float("nan")


def _pipeline():
    """The backend's training dataset over 512 random blocks of 32 tokens (vocabulary 500), batches of 8."""
    import functools

    import numpy as np

    from hf_tpu_ext.data.masking import mask_tokens
    from hf_tpu_ext.data.pipeline import make_train_dataset

    blocks = np.random.default_rng(0).integers(5, 500, size=(512, 32), dtype=np.int32)
    mask_fn = functools.partial(mask_tokens, mask_token_id=4, vocab_size=500, special_token_ids=[0, 1, 2, 3, 4],
                                max_predictions=5, mlm_probability=0.15, pad_token_id=1)
    return make_train_dataset(blocks, global_batch_size=8, seed=42, mask_fn=mask_fn)


def _build():
    """The tiny model, optimizer, schedule, distributed iterator and the ops' callables."""
    import numpy as np
    import tensorflow as tf
    import tf_keras

    from hf_tpu_ext.backends.tensorflow.optimization import TransformersSchedule

    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    schedule = TransformersSchedule("linear", 5e-4, 0, 10_000_000)
    with strategy.scope():
        model = tf_keras.Sequential([tf_keras.layers.Dense(64, input_shape=(64,)), tf_keras.layers.Dense(64)])
        optimizer = tf_keras.optimizers.legacy.Adam(learning_rate=schedule)
        optimizer._create_all_weights(model.trainable_variables)
    data = tf.data.Dataset.from_tensor_slices(tf.random.uniform([512, 64])).batch(8, drop_remainder=True)
    iterator = iter(strategy.experimental_distribute_dataset(data.repeat().prefetch(2)))

    def replica_step(batch):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(batch, training=True) - batch))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    @tf.function(autograph=False)
    def train_function(it, num_steps):
        def body(i, total):
            loss = strategy.run(replica_step, args=(next(it),))
            return i + 1, total + strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None)

        return tf.while_loop(lambda i, _: i < num_steps, body, (tf.constant(0), tf.constant(0.0)))[1]

    x = tf.zeros([8, 64])
    batches = iter(strategy.experimental_distribute_dataset(_pipeline()))
    take = tf.function(lambda it: tf.reduce_sum(next(it)["input_ids"]), autograph=False)
    ident = tf.function(lambda t: t)
    calls = {
        "train": lambda i: float(train_function(iterator, tf.constant(1, tf.int32))),
        "data": lambda i: int(take(batches)),
        "lr": lambda i: float(schedule(i)),
        "lr_numpy": lambda i: float(schedule(np.int64(i))),
        "read_step": lambda i: int(optimizer.iterations.numpy()),
        "ident": lambda i: ident(x),
    }
    calls["all"] = lambda i: (calls["train"](i), calls["lr"](i), calls["read_step"](i))
    calls["all_numpy"] = lambda i: (calls["train"](i), calls["lr_numpy"](i), calls["read_step"](i))
    return calls


def measure(op: str, n_calls: int, tune: bool = True, sample_every: int = 500) -> dict:
    """Run ``op`` ``n_calls`` times; RSS and heap-in-use slopes (KB per call) after the first third."""
    if tune:
        from hf_tpu_ext.backends.tensorflow.strategy import configure_host_memory

        configure_host_memory()  # before TensorFlow allocates: the backend's settings
    import psutil

    from hf_tpu_ext.host_memory import heap_usage

    call = _build()[op]
    process, points = psutil.Process(), []
    t0 = time.perf_counter()
    for i in range(n_calls):
        call(i)
        if i % sample_every == 0:
            heap = heap_usage() or {"in_use_bytes": float("nan")}
            points.append((i, process.memory_info().rss / 1024, heap["in_use_bytes"] / 1024))
    kept = [p for p in points if p[0] >= n_calls // 3]
    return {"op": op, "tuned_allocator": tune, "calls": n_calls, "seconds": round(time.perf_counter() - t0, 1),
            "rss_mb_first": round(points[0][1] / 1024, 1), "rss_mb_last": round(points[-1][1] / 1024, 1),
            "rss_kb_per_call": round(_slope([(i, r) for i, r, _ in kept]), 4),
            "heap_in_use_kb_per_call": round(_slope([(i, h) for i, _, h in kept]), 4)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", choices=OPS, default="all", help="The operation measured (default all).")
    parser.add_argument("--calls", type=int, default=30_000, help="Calls of the op (default 30,000).")
    parser.add_argument("--no_tune", action="store_true", help="glibc's and TensorFlow's default allocators.")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.op, args.calls, tune=not args.no_tune)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
