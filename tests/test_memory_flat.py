"""Flat memory over a long run (issue 31 item 9): the per-step structures stay bounded, and the soak
benchmark's figure (``benchmarks/soak_push.py``, RSS slope in MB/min after the first minute) is computed right.

The soak itself (8 minutes) is a benchmark, not a test: ``python -m benchmarks.soak_push``.
"""

import math

import pytest

from benchmarks import soak_push
from hf_tpu_ext.callbacks.tf_keras.throughput import ThroughputCallback
from hf_tpu_ext.callbacks.throughput_meter import MEDIAN_WINDOW


def test_soak_slope_is_least_squares_mb_per_minute_after_the_first_minute():
    # the first minute (start-up: 200 MB) is left out; after it RSS grows 0.05 MB/s = 3 MB/min exactly
    points = [(float(t), 200.0 * (t < 60) + 1000.0 + 0.05 * t) for t in range(0, 481, 5)]
    assert soak_push.slope_per_minute(points, 60.0) == pytest.approx(3.0, abs=1e-9)
    flat = [(float(t), 1350.0 + (0.4 if t % 10 else -0.4)) for t in range(60, 481, 5)]
    assert abs(soak_push.slope_per_minute(flat, 60.0)) < 0.01
    assert math.isnan(soak_push.slope_per_minute(points[:12], 60.0))  # only one point after the first minute


def test_soak_records_load_and_cpu_flags():
    facts = soak_push.machine_facts()
    assert set(facts) == {"load_average_1_5_15", "cpu_count", "cpu_flags"}
    assert len(facts["load_average_1_5_15"]) == 3 and facts["cpu_count"] >= 1
    assert isinstance(facts["cpu_flags"], str)


def test_throughput_meter_keeps_a_bounded_window_of_calls():
    # one entry per device call would grow ~90 B per step for the whole run; the window is MEDIAN_WINDOW calls
    meter = ThroughputCallback(global_batch_size=8, seq_length=32, warmup_steps=0, log_every=0)
    meter.model = None  # no optimizer: steps counted from the batch indices
    meter._reset_epoch()
    for batch in range(MEDIAN_WINDOW + 500):
        meter.on_train_batch_begin(batch)
        meter.on_train_batch_end(batch)
    assert len(meter._calls) == MEDIAN_WINDOW and len(meter._epoch_calls) == MEDIAN_WINDOW
    assert meter._measured_steps == MEDIAN_WINDOW + 500  # the totals still cover every step



def test_inprocess_soak_reads_rss_after_each_checkpoint_write(tmp_path):
    """``--mode inprocess`` samples after every write of the TensorFlow checkpointer (its saves, not its steps),
    and the hook comes off again."""
    tf_keras = pytest.importorskip("tf_keras")
    from types import SimpleNamespace

    from hf_tpu_ext.backends.tensorflow.checkpoint import TrainingCheckpointer

    model = tf_keras.Sequential([tf_keras.layers.Dense(2, input_shape=(3,))])
    model.config = SimpleNamespace(hidden_size=3, num_hidden_layers=1, num_attention_heads=1, intermediate_size=2,
                                   vocab_size=2, max_position_embeddings=3)
    seen = []
    undo = soak_push.hook_saves("tensorflow", seen.append)
    try:
        ckpt = TrainingCheckpointer(model, None, str(tmp_path / "c"), max_to_keep=1)
        ckpt.save(20)
        ckpt.save(40)
    finally:
        undo()
    ckpt.save(60)
    assert seen == [20, 40]
    assert soak_push.slope_per_1000([(11000, 100.0), (12000, 100.5), (13000, 101.0)]) == pytest.approx(0.5)


@pytest.mark.skipif(not hasattr(__import__("ctypes").CDLL(None), "mallinfo2"), reason="glibc's mallinfo2")
def test_tensorflow_learning_rate_of_each_step_keeps_no_tensor_per_step():
    """TensorFlow keeps the eager tensor of every distinct Python number it converts (its scalar cache): the
    learning rate evaluated at a Python int step kept one per step (~1 KB each, the TensorFlow backend's
    growth per step); the trainer evaluates it at a NumPy int64 step: the same values, nothing kept."""
    pytest.importorskip("tensorflow")
    from types import SimpleNamespace

    from hf_tpu_ext.backends.tensorflow.optimization import TransformersSchedule
    from hf_tpu_ext.backends.tensorflow.trainer import TFTrainer
    from hf_tpu_ext.host_memory import heap_usage

    schedule = TransformersSchedule("linear", 5e-4, 100, 1_000_000)
    trainer = SimpleNamespace(lr_schedule=schedule)
    for step in (0, 50, 100, 12_345):  # unchanged values: the schedule's float32 figure at that step
        assert TFTrainer.learning_rate(trainer, step) == float(schedule(step))
    assert TFTrainer.learning_rate(trainer, 50) == pytest.approx(2.5e-4, rel=1e-6)

    def grown(call, first):
        for step in range(first, first + 200):  # warm up: one-off allocations of the ops
            call(step)
        before = heap_usage()["in_use_bytes"]
        for step in range(first + 200, first + 3_200):
            call(step)
        return (heap_usage()["in_use_bytes"] - before) / 3_000

    python_int = grown(lambda step: float(schedule(step)), 200_000)
    trainer_step = grown(lambda step: TFTrainer.learning_rate(trainer, step), 400_000)
    assert python_int > 200  # bytes per step kept by the scalar cache (the cause)
    assert trainer_step < 20  # the trainer's: nothing per step
