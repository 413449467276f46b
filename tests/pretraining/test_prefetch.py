"""Host-to-device prefetch: batches in order, the position of the batches returned (not of those
read ahead), input errors raised in the loop, a clean stop; the trainer trains the same with and
without it."""

import threading
import time

import jax
import numpy as np
import pytest

from bert_jax import launch
from bert_jax.pretraining.prefetch import DevicePrefetch
from bert_jax.training.checkpoints import read_params


class Counting:
    """Batches {"x": [i]}; state = batches read; raises after ``fail_after`` batches if set."""

    def __init__(self, fail_after=None):
        self.read, self.fail_after = 0, fail_after

    def state(self):
        return {"read": self.read}

    def __next__(self):
        if self.fail_after is not None and self.read >= self.fail_after:
            raise ValueError(f"bad record after {self.read}")
        self.read += 1
        return {"x": np.array([self.read])}


def test_batches_in_order_and_the_position_of_what_was_returned():
    data = Counting()
    batches = DevicePrefetch(data, jax.device_put, size=3)
    assert batches.state() == {"read": 0}
    got = [int(next(batches)["x"][0]) for _ in range(4)]
    assert got == [1, 2, 3, 4]
    deadline = time.time() + 10
    while data.read < 8 and time.time() < deadline:  # 3 queued and 1 waiting for room
        time.sleep(0.01)
    time.sleep(0.2)
    assert data.read == 8 and batches.state() == {"read": 4}
    assert isinstance(next(batches)["x"], jax.Array)
    batches.close()
    assert not any(t.name == "device-prefetch" for t in threading.enumerate())
    with pytest.raises(RuntimeError, match="closed"):
        next(batches)


def test_input_errors_reach_the_training_loop():
    batches = DevicePrefetch(Counting(fail_after=2), jax.device_put, size=4)
    assert [int(next(batches)["x"][0]) for _ in range(2)] == [1, 2]
    with pytest.raises(ValueError, match="bad record after 2"):
        next(batches)
    assert batches.state() == {"read": 2}
    with pytest.raises(ValueError, match="expected >= 1"):
        DevicePrefetch(Counting(), jax.device_put, size=0)


@pytest.mark.slow  # ~11 s: two trainer runs; the queue's order and errors: the tests above
def test_trainer_same_with_and_without_prefetch(tmp_path, tiny_config):
    """Prefetching changes no number. (Resuming with it, which needs the position of the batches
    consumed rather than read ahead, is tests/test_trainer.py's test_resume_is_exact: its config
    prefetches 2.)"""
    assert tiny_config().prefetch_batches == 2
    for name, prefetch in (("ahead", 3), ("in_loop", 0)):
        launch.run(tiny_config(steps=4, prefetch_batches=prefetch), tmp_path / name)
    a, _ = read_params(tmp_path / "ahead")
    b, _ = read_params(tmp_path / "in_loop")
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
