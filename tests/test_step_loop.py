"""The one step loop (hf_tpu_ext/backends/loop.py) driven by a pure-Python backend: no framework, milliseconds.

- A cadence that ``--steps_per_execution`` does not divide fires at the first call boundary past each multiple
  (logging, evaluation, checkpoints), calls are cut at epoch ends, and every logged loss is the mean of the
  per-step losses since the previous entry (a restored window included).
- Best model: step 0 is never the best; only a strictly better evaluation keeps weights.
- A signal is a save: the step reached is checkpointed once, then ``KeyboardInterrupt``; a restored step is never
  saved again. The final checkpoint of a finished run; a non-finite loss names its step.
"""

import signal
from types import SimpleNamespace

import pytest

from hf_tpu_ext import interrupts
from hf_tpu_ext.backends.base import RunPlan
from hf_tpu_ext.backends.loop import StepLoop, Unbuffered
from hf_tpu_ext.best_metric import BestMetric, BestTracker
from hf_tpu_ext.cadence import crossed, executions


class Callbacks:
    def __init__(self):
        self.events = []

    def __getattr__(self, name):
        if not name.startswith("on_"):
            raise AttributeError(name)
        return lambda *a: self.events.append((name,) + tuple(x for x in a if not isinstance(x, dict)))


class FakeSteps:
    """Step ``s`` (1-based) has loss ``s``; evaluations give ``eval_losses`` in turn; a signal after ``signal_at``."""

    def __init__(self, eval_losses=(), signal_at=None, nan_at=None):
        self.model = SimpleNamespace(stop_training=False)
        self.calls, self.saves, self.kept, self.scalars, self.fields = [], [], [], [], []
        self.eval_losses, self.signal_at, self.nan_at = list(eval_losses), signal_at, nan_at
        self.step = 0

    def open_batches(self, calls):
        return Unbuffered(lambda start, k: ("batch", start, k))

    def run_steps(self, batch, start, k):
        assert batch == ("batch", start, k)
        self.calls.append((start, k))
        self.step = start + k
        return [float("nan") if s == self.nan_at else float(s) for s in range(start + 1, start + k + 1)]

    def learning_rate(self, step):
        return 1e-3 / (step + 1)

    def evaluate(self):
        return {"eval_loss": self.eval_losses.pop(0)} if self.eval_losses else {}

    def save(self, step, fields):
        self.saves.append(step)
        self.fields.append(fields)

    def keep_best(self, step, key, value):
        self.kept.append((step, key, value))

    def signalled(self):
        if self.signal_at is not None and self.step >= self.signal_at and interrupts.received() is None:
            interrupts.record(signal.SIGTERM)
        return interrupts.received() is not None

    def write_scalars(self, entry):
        self.scalars.append(entry["step"])


def _args(**kw):
    base = dict(steps_per_execution=4, logging_steps=10, eval_strategy="steps", eval_steps=6, save_strategy="steps",
                save_steps=5, eval_on_start=False, load_best_model_at_end=True, disable_tqdm=True)
    return SimpleNamespace(**{**base, **kw})


def _loop(steps, args, start=0, window=(0.0, 0), saved=None, history=None):
    plan = RunPlan(global_batch_size=2, eval_batch_size=2, seq_length=5, steps_per_epoch=11, total_steps=22,
                   num_train_blocks=22, has_eval=True)
    best = BestTracker(BestMetric("eval_loss", False))
    return StepLoop(steps, args, plan, Callbacks(), history if history is not None else [], start, window,
                    best=best, saved_step=saved)


@pytest.fixture(autouse=True)
def _no_signal():
    interrupts.reset()
    yield
    interrupts.reset()


def test_a_cadence_the_call_length_does_not_divide_fires_at_the_first_boundary_past_it():
    steps, history = FakeSteps(eval_losses=[3.0, 2.0, 2.5]), []
    loop = _loop(steps, _args(), history=history)
    step = loop.run()
    loop.finish(step)
    assert step == 22
    assert steps.calls == [(0, 4), (4, 4), (8, 3), (11, 4), (15, 4), (19, 3)] == list(executions(0, 22, 11, 4))
    train = [(e["step"], e["loss"]) for e in history if "loss" in e]
    assert train == [(11, 6.0), (22, 17.0)]  # mean of steps 1..11, then of 12..22
    assert [e["step"] for e in history if "eval_loss" in e] == [8, 15, 19]
    assert steps.saves == [8, 11, 15, 22]  # the step-5 cadence; 22 is saved once (no second final save)
    assert steps.kept == [(8, "eval_loss", 3.0), (15, "eval_loss", 2.0)]  # 2.5 at step 19 is no better
    assert steps.scalars == [8, 11, 15, 19, 22]
    events = loop.callbacks.events
    assert events[:3] == [("on_train_begin",), ("on_epoch_begin", 0), ("on_train_batch_begin", 0)]
    assert [e for e in events if e[0] == "on_epoch_end"] == [("on_epoch_end", 0), ("on_epoch_end", 1)]
    assert [e[1] for e in events if e[0] == "on_train_batch_end"] == [3, 7, 10, 3, 7, 10]
    results = loop.results(step)
    assert results["train_loss"] == 11.5 and results["global_step"] == 22 and results["tokens_seen"] == 220
    assert results["mfu_note"] == "MFU left out: no FLOP count for this run"
    assert crossed(19, 22, 10) and not crossed(11, 15, 10)


def test_a_restored_window_is_averaged_in_and_the_final_step_is_checkpointed():
    steps, history = FakeSteps(), []
    # resumed at step 13 with steps 11..13 in the window (losses 12 and 13 of two steps, sum 25)
    loop = _loop(steps, _args(save_strategy="no", eval_strategy="no", steps_per_execution=3), start=13,
                 window=(25.0, 2), saved=13, history=history)
    step = loop.run()
    loop.finish(step)
    assert steps.calls == [(13, 3), (16, 3), (19, 3)]
    assert [(e["step"], e["loss"]) for e in history] == [(22, (25.0 + sum(range(14, 23))) / 11)]
    assert steps.saves == [22]  # the final checkpoint


def test_the_loop_hands_its_window_and_figures_down_with_each_save():
    """The loop owns the checkpoint unit: the backend gets the logging window and the fit figures with the save
    (it never reads the loop back)."""
    steps = FakeSteps()
    loop = _loop(steps, _args(save_steps=4, eval_strategy="no", logging_steps=10), history=[])
    loop.finish(loop.run())
    assert steps.saves == [4, 8, 15, 19, 22]
    first, last = steps.fields[0], steps.fields[-1]
    assert first["loss_window"] == {"loss_sum": float(sum(range(1, 5))), "steps": 4}  # nothing logged yet
    assert first["fit_metrics"]["global_step"] == 4 and first["fit_metrics"]["train_loss"] == 2.5
    assert first["fit_metrics"]["first_step_seconds"] >= 0.0
    assert last["loss_window"] == {"loss_sum": 0.0, "steps": 0}  # step 22 was just logged
    assert last["fit_metrics"]["tokens_seen"] == 220 and last["fit_metrics"]["train_loss"] == 11.5
    assert all(not isinstance(v, (dict, list, bool)) for v in last["fit_metrics"].values())


def test_a_signal_saves_the_step_reached_once_then_raises(caplog):
    steps = FakeSteps(signal_at=8)
    loop = _loop(steps, _args(save_steps=4, eval_strategy="no"))
    step = loop.run()
    assert step == 8 and steps.calls == [(0, 4), (4, 4)]
    with pytest.raises(KeyboardInterrupt):
        loop.finish(step)
    assert steps.saves == [4, 8]  # step 8 was saved on its cadence: no second save
    steps = FakeSteps(signal_at=11)
    loop = _loop(steps, _args(save_steps=100, eval_strategy="no"))
    interrupts.reset()
    with caplog.at_level("INFO", logger="hf_tpu_ext"):
        step = loop.run()
        with pytest.raises(KeyboardInterrupt):
            loop.finish(step)
    assert (step, steps.saves) == (11, [11])
    assert "signal received: saving step 11 before stopping" in caplog.text


def test_a_restored_step_is_not_saved_again_and_a_nan_names_its_step():
    interrupts.record(signal.SIGINT)
    steps = FakeSteps()
    loop = _loop(steps, _args(), start=11, saved=11)
    with pytest.raises(KeyboardInterrupt):
        loop.finish(loop.run())
    assert steps.calls == [] and steps.saves == []
    interrupts.reset()
    loop = _loop(FakeSteps(nan_at=6), _args())
    with pytest.raises(FloatingPointError, match="Training loss became nan at global step 6; lower --learning_rate"):
        loop.run()


def test_a_signal_during_the_last_call_saves_the_last_step_and_does_not_raise():
    """A signal seen after the run's last step is no stop: finish() writes the final checkpoint and returns, so
    the run goes on to its export and card within the grace budget (issue 31 item 6)."""
    steps = FakeSteps(signal_at=22)
    loop = _loop(steps, _args(save_steps=100, eval_strategy="no"))
    step = loop.run()
    loop.finish(step)  # no KeyboardInterrupt
    assert step == 22 and steps.saves == [22] and interrupts.received() == signal.SIGTERM


class SignalledSave(FakeSteps):
    """A save during which SIGINT arrives ``signals`` times (a double or triple Ctrl+C lands inside it)."""

    def __init__(self, signals, **kw):
        super().__init__(**kw)
        self.signals, self.finished = signals, []

    def save(self, step, fields):
        import os

        for _ in range(self.signals):
            os.kill(os.getpid(), signal.SIGINT)  # handled before kill() returns (main thread)
        self.finished.append(step)  # reached only if the signals did not cut the save short
        super().save(step, fields)


def test_a_second_signal_inside_a_save_waits_for_the_save_and_a_third_cuts_it():
    """Double Ctrl+C: the first signal stops the loop at step 8, the second lands inside that step's save: the
    checkpoint is finished, then KeyboardInterrupt (second signal). A third signal there raises at once."""
    steps = SignalledSave(1, signal_at=8)
    loop = _loop(steps, _args(save_steps=100, eval_strategy="no"))
    with interrupts.handling(), interrupts.deferring(True):
        step = loop.run()
        with pytest.raises(KeyboardInterrupt, match=r"SIGINT \(second signal\)"):
            loop.finish(step)
    assert (step, steps.finished, steps.saves, loop.saved_step) == (8, [8], [8], 8)
    assert interrupts.count() == 2
    steps = SignalledSave(2, signal_at=8)
    loop = _loop(steps, _args(save_steps=100, eval_strategy="no"))
    with interrupts.handling(), interrupts.deferring(True):
        step = loop.run()
        with pytest.raises(KeyboardInterrupt, match=r"SIGINT \(second signal\)"):
            loop.finish(step)
    assert steps.finished == [] and steps.saves == [] and interrupts.count() == 3


def test_a_step_backend_that_owns_its_steps_per_call_is_followed_not_the_arguments():
    """The Keras trainer reads --steps_per_execution once and stacks its batches to it: the loop's calls follow it."""
    steps = FakeSteps(eval_losses=[3.0, 2.0, 2.5, 2.0, 1.0])
    steps.steps_per_execution = 2
    loop = _loop(steps, _args(steps_per_execution=4))
    loop.finish(loop.run())
    assert steps.calls == list(executions(0, 22, 11, 2)) and {k for _, k in steps.calls} == {1, 2}
