"""The step windows of the steady rate (issue 31 item 9): memory allocated once, medians as before."""

import statistics
import tracemalloc
from collections import deque

import pytest

from hf_tpu_ext.backends.loop import STEADY_WINDOW, LoopMeter
from hf_tpu_ext.callbacks.throughput_meter import MEDIAN_WINDOW, ThroughputMeter
from hf_tpu_ext.step_window import StepWindow, weighted_median


def _series(n):
    """A known, unsorted series of step times (seconds): a slow call every 7th, a spread of 1 ms."""
    return [0.010 + 0.001 * ((i * 37) % 11) / 10 + (0.5 if i % 7 == 0 else 0.0) for i in range(n)]


def test_window_keeps_the_last_pairs_oldest_first_like_a_bounded_deque():
    window, reference = StepWindow(4), deque(maxlen=4)
    assert len(window) == 0 and not window and window.median() is None
    for i in range(10):
        window.append((i / 10, i % 3 + 1))
        reference.append((i / 10, i % 3 + 1))
        assert window.pairs() == list(reference)
    assert window.pairs() == [(0.6, 1), (0.7, 2), (0.8, 3), (0.9, 1)]
    window.clear()
    assert len(window) == 0 and window.pairs() == []
    with pytest.raises(ValueError, match="size must be >= 1"):
        StepWindow(0)


def test_median_is_the_same_as_before_on_a_known_series():
    series = _series(MEDIAN_WINDOW + 2_345)  # the window overflows: only the last MEDIAN_WINDOW count
    window, reference = StepWindow(MEDIAN_WINDOW), deque(maxlen=MEDIAN_WINDOW)
    for i, seconds in enumerate(series):
        window.append((seconds, 1 + i % 4))
        reference.append((seconds, 1 + i % 4))
    assert window.median() == weighted_median(list(reference))  # exactly: the same pairs, the same arithmetic
    assert weighted_median([(3.0, 1), (1.0, 1), (2.0, 1)]) == 2.0
    assert weighted_median([(1.0, 1), (2.0, 1)]) == 1.5
    assert weighted_median([(1.0, 1), (5.0, 3)]) == 5.0
    ones = StepWindow(8)
    for seconds in [0.3, 0.1, 0.4, 0.1, 0.5, 0.9]:
        ones.append((seconds, 1))
    assert ones.median() == statistics.median([0.3, 0.1, 0.4, 0.1, 0.5, 0.9]) == pytest.approx(0.35)


def test_window_memory_is_allocated_once():
    series = _series(3 * MEDIAN_WINDOW)
    first = series[:MEDIAN_WINDOW]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        window = StepWindow(MEDIAN_WINDOW)
        allocated = tracemalloc.get_traced_memory()[0] - before
        for i, seconds in enumerate(series):
            window.append((seconds / 1, 1 + i % 2))  # a new float each call, as the meters' divisions give
        grown = tracemalloc.get_traced_memory()[0] - before - allocated
        kept = deque(maxlen=MEDIAN_WINDOW)
        start = tracemalloc.get_traced_memory()[0]
        for i, seconds in enumerate(first):
            kept.append((seconds / 1, 1 + i % 2))
        deque_bytes = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert 160_000 <= allocated < 161_000  # 2 arrays x 10,000 x 8 B, at construction
    assert grown < 1_000  # 30,000 appends later: nothing more
    assert deque_bytes > 4 * allocated  # what a deque of (float, int) tuples held: ~88 B a call


def test_loop_meter_steady_rate_is_the_median_of_the_last_steps():
    meter = LoopMeter(tokens_per_step=256)
    meter.add([1.0] * 3, 9.0)  # the compiling first call: left out
    series = _series(4_000)
    per_step = []
    for seconds in series:  # calls of 3 steps: the window holds the last STEADY_WINDOW steps
        meter.add([1.0] * 3, 3 * seconds)
        per_step += [3 * seconds / 3] * 3
    expected = 256 / statistics.median(per_step[-STEADY_WINDOW:])
    assert len(meter.steady) == STEADY_WINDOW
    assert meter.steady_rate() == expected


def test_throughput_meter_reuses_its_windows_across_epochs_and_fits():
    meter = ThroughputMeter(global_batch_size=8, seq_length=32, warmup_steps=0, log_every=0)
    meter.model = None  # no optimizer: steps counted from the batch indices
    calls, epoch_calls = meter._calls, meter._epoch_calls
    for epoch in range(3):
        meter.on_epoch_begin(epoch)
        for batch in range(50):
            meter.on_train_batch_begin(batch)
            meter.on_train_batch_end(batch)
        logs = {}
        meter.on_epoch_end(epoch, logs)
        assert len(meter._epoch_calls) == 50 and logs["step_time_ms_median"] > 0
    assert meter._calls is calls and meter._epoch_calls is epoch_calls and len(calls) == 150
    meter.on_train_begin()  # a new fit: the same arrays, emptied
    assert meter._calls is calls and len(calls) == 0 and meter._measured_steps == 0
