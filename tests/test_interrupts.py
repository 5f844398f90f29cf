"""Signals (hf_tpu_ext.interrupts, their one owner): record first, raise at check(); callbacks; the grace budget;
the token never in the resume line."""

import os
import signal
import time

import pytest

from hf_tpu_ext import interrupts
from hf_tpu_ext.console import resume_hint
from hf_tpu_ext.run.state import merge_push_reports


def test_a_first_signal_in_a_checking_loop_is_recorded_and_raised_at_check():
    with interrupts.handling():
        with interrupts.deferring(True):
            os.kill(os.getpid(), signal.SIGTERM)  # delivered before kill() returns to the main thread
            assert interrupts.received() == signal.SIGTERM and interrupts.count() == 1
            with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
                interrupts.check()
            # a second signal (a loop stuck in one step) raises at once; the first one's number is kept
            with pytest.raises(KeyboardInterrupt, match=r"SIGINT \(second signal\)"):
                os.kill(os.getpid(), signal.SIGINT)
            assert interrupts.received() == signal.SIGTERM and interrupts.count() == 2
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_outside_a_checking_loop_the_first_signal_raises_at_once():
    with interrupts.handling():
        interrupts.check()  # nothing received yet: no-op
        with pytest.raises(KeyboardInterrupt, match="SIGINT"):
            os.kill(os.getpid(), signal.SIGINT)
        assert interrupts.received() == signal.SIGINT


def test_grace_budget_bounds_a_wait_after_the_signal_and_callbacks_hear_the_first_signal():
    heard = []

    class Session:  # held weakly: a bound method does not keep its object alive
        def on_signal(self, signum):
            heard.append((signum, interrupts.seconds_left()))

    session = Session()
    handle = interrupts.on_signal(session.on_signal)
    try:
        with interrupts.handling(grace_seconds=0.5):
            assert interrupts.grace() == 0.5 and interrupts.seconds_left() is None
            start = time.monotonic()
            assert interrupts.wait_until(lambda: False, timeout=0.2) is False  # no signal: the timeout
            assert 0.2 <= time.monotonic() - start < 0.5
            os.kill(os.getpid(), signal.SIGTERM)  # outside deferring: raises, after recording
    except KeyboardInterrupt as err:
        assert str(err) == "SIGTERM"
    finally:
        interrupts.set_grace(None)
    assert [s for s, _ in heard] == [signal.SIGTERM] and 0.4 < heard[0][1] <= 0.5
    with interrupts.handling(grace_seconds=0.3):
        with interrupts.deferring(True):
            os.kill(os.getpid(), signal.SIGINT)
        start = time.monotonic()
        # a first signal does not end the wait; the grace budget does (0.3 s, not the 30 s timeout), less what it
        # leaves for the exit (a tenth: 0.03 s)
        assert interrupts.wait_until(lambda: False, timeout=30) is False
        assert time.monotonic() - start < 1.0 and 0.0 <= interrupts.seconds_left() <= interrupts.exit_reserve() == 0.03
    interrupts.set_grace(None)
    assert len(heard) == 2
    handle.remove()
    del session
    with interrupts.handling():
        with interrupts.deferring(True):
            os.kill(os.getpid(), signal.SIGINT)
    assert len(heard) == 2  # removed: not called again


def test_outside_a_run_sigterm_calls_the_callbacks_then_unwinds_with_143():
    heard = []
    handle = interrupts.on_signal(heard.append)
    try:
        interrupts.reset()
        with pytest.raises(SystemExit) as stop:
            os.kill(os.getpid(), signal.SIGTERM)
        assert stop.value.code == 143 and heard == [signal.SIGTERM]
    finally:
        handle.remove()
        interrupts.reset()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


@pytest.mark.parametrize("spelling", [["--hub_token", "SECRET"], ["--hub-token", "SECRET"], ["--hub_token=SECRET"],
                                      ["--hub-token=SECRET"]])
def test_resume_line_drops_every_spelling_of_the_token_flag(spelling):
    argv = ["train", "--output_dir", "out", *spelling, "--max_steps", "5", "--overwrite-output-dir", "true"]
    assert resume_hint(argv) == "hf-tpu train --output_dir out --max_steps 5 --resume_from_checkpoint true"
    # the token's value anywhere else (a wrong flag, a config path) is redacted too
    assert resume_hint(["--hub_model_id", "SECRET"], secrets=("SECRET",)) == (
        "hf-tpu train --hub_model_id '<redacted>' --resume_from_checkpoint true")


def test_push_reports_of_every_process_are_merged():
    first = {"repo_id": "a/b", "final_pushed": False, "pushed": 2, "failed": 0, "pending": ["Training in progress, step 6"],
             "timed_out": True, "pushes": [{"step": 2}, {"step": 4}]}
    second = {"repo_id": "a/b", "final_pushed": True, "pushed": 3, "failed": 1, "pending": [], "timed_out": False,
              "pushes": [{"step": 8}]}
    merged = merge_push_reports([first, None, second])
    assert merged == {"repo_id": "a/b", "final_pushed": True, "pushed": 5, "failed": 1, "pending": [],
                      "timed_out": False, "pushes": [{"step": 2}, {"step": 4}, {"step": 8}], "processes": 2}
    assert merge_push_reports([]) is None


def test_the_trainer_callback_saves_the_step_reached_and_stops(tmp_path):
    """--backend torch_xla's signal save, on a plain transformers Trainer on the CPU: SIGTERM during step 7 of 50
    -> checkpoint-7/ written (on_save callbacks called for it), the loop left at step 7, then check() raises."""
    torch = pytest.importorskip("torch")
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from hf_tpu_ext.backends.torch_xla.trainer import save_on_signal_callback

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)

        def forward(self, x, labels):
            return {"loss": torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), labels)}

    class SignalAtStep7(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 7:
                os.kill(os.getpid(), signal.SIGTERM)

    saved = []

    class OnSave(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            saved.append(state.global_step)

    data = [{"x": torch.randn(4), "labels": torch.randn(())} for _ in range(16)]
    args = TrainingArguments(str(tmp_path), max_steps=50, per_device_train_batch_size=2, save_strategy="no",
                             logging_steps=100, report_to=[], use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=Tiny(), args=args, train_dataset=data,
                      callbacks=[SignalAtStep7(), save_on_signal_callback(), OnSave()])
    with interrupts.handling():
        with interrupts.deferring(True):
            trainer.train()
        assert trainer.state.global_step == 7 and saved == [7]
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("checkpoint-")) == ["checkpoint-7"]
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            interrupts.check()


def test_a_finished_run_notes_a_late_signal_and_gives_the_handlers_back():
    before = signal.getsignal(signal.SIGTERM)
    with interrupts.finished() as after:
        os.kill(os.getpid(), signal.SIGTERM)  # would end the process with 143 under the default handler
        os.kill(os.getpid(), signal.SIGINT)
    assert after.late == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_finished_run_with_then_hands_later_signals_to_it():
    """The console script's teardown: ``then`` takes the signals after the block (the old handlers do not come
    back: SIGTERM's default would end the complete run with 143)."""
    before = {sig: signal.getsignal(sig) for sig in interrupts.SIGNALS}
    heard = []
    try:
        with interrupts.finished(then=heard.append) as after:
            pass
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        assert after.late is None and heard == [signal.SIGTERM, signal.SIGINT]
    finally:
        for sig, old in before.items():
            signal.signal(sig, old)


def test_a_misspelt_fault_injection_point_raises_instead_of_never_firing(monkeypatch):
    """The points are one tuple (``interrupts.FAULT_POINTS``): a call site or a test variable naming another
    point fails at once; a real point that this process did not reach does nothing."""
    monkeypatch.delenv(interrupts.KILL_ENV, raising=False)
    monkeypatch.delenv(interrupts.SIGNAL_ENV, raising=False)
    with pytest.raises(ValueError, match=r"'chekpoint' is not a fault-injection point; one of data, train_step"):
        interrupts.kill_for_test("chekpoint")
    monkeypatch.setenv(interrupts.KILL_ENV, "exprt@3")
    with pytest.raises(ValueError, match=r"'exprt@3' names no fault-injection point"):
        interrupts.kill_for_test("export")
    monkeypatch.setenv(interrupts.KILL_ENV, "push")
    assert interrupts.kill_for_test("card") is None  # another point: the process lives on
    monkeypatch.setenv(interrupts.KILL_ENV, "checkpoint_weights@20")
    assert interrupts.kill_for_test("checkpoint_weights", 19) is None
    assert "is_deferring" not in dir(interrupts)
