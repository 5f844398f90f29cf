"""Deferred signals (hf_tpu_ext.interrupts with the training run's handler): record first, raise at check()."""

import os
import signal

import pytest

from hf_tpu_ext import interrupts
from hf_tpu_ext.training_run import _Signals


def test_a_first_signal_in_a_checking_loop_is_recorded_and_raised_at_check():
    with _Signals():
        with interrupts.deferring(True):
            os.kill(os.getpid(), signal.SIGTERM)  # delivered before kill() returns to the main thread
            assert interrupts.received() == signal.SIGTERM
            with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
                interrupts.check()
            # a second signal (a loop stuck in one step) raises at once; the first one's number is kept
            with pytest.raises(KeyboardInterrupt, match="SIGINT"):
                os.kill(os.getpid(), signal.SIGINT)
            assert interrupts.received() == signal.SIGTERM
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_outside_a_checking_loop_the_first_signal_raises_at_once():
    with _Signals():
        interrupts.check()  # nothing received yet: no-op
        with pytest.raises(KeyboardInterrupt, match="SIGINT"):
            os.kill(os.getpid(), signal.SIGINT)
        assert interrupts.received() == signal.SIGINT
