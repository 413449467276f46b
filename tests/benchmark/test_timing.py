"""Steps timed as the trainer runs them (`bert_jax.benchmark.timing`), on a simulated host and device
with their own clock: a launch costs the host ``dispatch`` seconds, a step the device ``work`` seconds
after the previous one and after its launch."""

from __future__ import annotations

import pytest

from bert_jax.benchmark import timing


class Simulated:
    """A runner on a simulated clock: steps run one after another on the device, each once it is
    launched and the one before it has finished."""

    def __init__(self, dispatch: float, work: float):
        self.dispatch, self.work = dispatch, work
        self.now, self.device_free, self.launched, self.done = 0.0, 0.0, 0, []

    def clock(self) -> float:
        return self.now

    def launch(self) -> int:
        self.now += self.dispatch
        self.device_free = max(self.device_free, self.now) + self.work
        self.done.append(self.device_free)
        self.launched += 1
        return self.launched - 1

    def wait(self, step: int) -> int:
        self.now = max(self.now, self.done[step])
        return step

    finish = wait


@pytest.fixture
def simulated(monkeypatch):
    def make(dispatch: float, work: float) -> Simulated:
        runner = Simulated(dispatch, work)
        monkeypatch.setattr(timing.time, "perf_counter", runner.clock)
        return runner

    return make


def test_queued_steps_hide_the_dispatch_that_waited_steps_pay(simulated):
    runner = simulated(dispatch=0.004, work=0.030)
    times, results = timing.queued_times(runner, 5)
    assert times == pytest.approx([0.030] * 5) and results == [1, 2, 3, 4, 5]
    assert runner.launched == 7 and runner.now == runner.done[-1]  # one step before, one after; device idle
    times, results = timing.waited_times(runner, 3)
    assert times == pytest.approx([0.034] * 3) and results == [7, 8, 9]


def test_a_host_slower_than_the_device_sets_the_queued_pace(simulated):
    times, _ = timing.queued_times(simulated(dispatch=0.050, work=0.030), 4)
    assert times == pytest.approx([0.050] * 4)


def test_queued_wall_is_the_steps_back_to_back(simulated):
    runner = simulated(dispatch=0.004, work=0.030)
    wall, last = timing.queued_wall(runner, 3)
    assert wall == pytest.approx(0.004 + 3 * 0.030) and last == 2 and runner.launched == 3
