"""FitHistory: the log history a drop-in push callback builds from a plain Keras fit (no framework needed)."""

from hf_tpu_ext.callbacks.fit_history import FitHistory


def test_entries_sample_losses_and_read_epoch_logs_late():
    history = FitHistory(points_per_epoch=2)
    epoch_logs = {"loss": 2.0}
    for step in range(1, 5):
        history.on_batch({"loss": 3.0 - step / 10}, step, steps_per_epoch=4)
    history.on_epoch(epoch_logs, 4, 1.0)
    epoch_logs["val_loss"] = 1.5  # a callback after the push callback evaluates: read when the entries are made
    assert history.entries() == [
        {"loss": 2.8, "epoch": 0.5, "step": 2}, {"loss": 2.6, "epoch": 1.0, "step": 4},
        {"eval_loss": 1.5, "perplexity": round(2.718281828459045 ** 1.5, 6), "epoch": 1.0, "step": 4}]


def test_samples_stay_bounded():
    history = FitHistory(points_per_epoch=1, max_points=4)
    for step in range(1, 101):
        history.on_batch({"loss": 1.0}, step, steps_per_epoch=None)
    steps = [e["step"] for e in history.entries()]
    assert len(steps) <= 5 and steps == sorted(steps) and steps[-1] >= 64
