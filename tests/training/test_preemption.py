"""The job's signal handler: SIGTERM and SIGINT are recorded (the loop stops after a committed
checkpoint), a second SIGINT stops at once, and closing restores the previous handlers."""

import os
import signal

import pytest

from bert_jax.training.preemption import Preemption


def test_signals_are_recorded_and_handlers_restored():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with Preemption() as p:
        assert not p.arrived() and not p.due(1)
        os.kill(os.getpid(), signal.SIGTERM)
        assert p.arrived() and p.due(2) and p.signal_name == "SIGTERM"
        os.kill(os.getpid(), signal.SIGTERM)  # a second SIGTERM changes nothing
        assert p.signal_name == "SIGTERM"
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_second_ctrl_c_stops_at_once():
    with Preemption(sigterm=False) as p:
        assert signal.SIGTERM not in p.previous
        os.kill(os.getpid(), signal.SIGINT)
        assert p.signal_name == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            signal.sigtimedwait([], 0)  # a bytecode boundary for the handler to run
