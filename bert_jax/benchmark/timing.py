"""Steps timed as the trainer runs them (bert_jax/training/trainer.py): the next step is queued before
the host waits for the running one, so the host's dispatch of a step overlaps the device's work on
the one before. Waiting for each step before dispatching the next (``waited_times``) adds the
dispatch to every step; on a GPU that is the host's work on every argument (BERT-base unrolled:
621 arrays of state) and the launch of the step's first kernels.

A runner has ``launch()`` (queues one step, returns a handle: its metrics or loss, not waited for),
``wait(handle)`` (waits for that step's result and returns it) and ``finish(handle)`` (waits for
everything the step writes, its new state too: the device is idle after it).
"""

from __future__ import annotations

import time
from typing import Any, Protocol


class Runner(Protocol):
    def launch(self) -> Any: ...

    def wait(self, handle) -> Any: ...

    def finish(self, handle) -> Any: ...


def queued_times(runner: Runner, steps: int) -> tuple[list[float], list]:
    """``steps`` timed steps, each queued before the host waits for the one running: the seconds from
    the end of one step to the end of the next, and each step's result. One untimed step goes before
    them (the first timed one is already queued behind it when its time starts) and one after (queued
    behind the last; waited for, so the device is idle when this returns)."""
    times, results = [], []
    running = runner.launch()
    queued = runner.launch()
    runner.wait(running)
    for _ in range(steps):
        t = time.perf_counter()
        following = runner.launch()
        results.append(runner.wait(queued))
        times.append(time.perf_counter() - t)
        queued = following
    runner.finish(queued)
    return times, results


def waited_times(runner: Runner, steps: int) -> tuple[list[float], list]:
    """``steps`` steps, each launched after the previous one finished: the seconds from launch to the
    end of each (dispatch and device), and each step's result."""
    times, results = [], []
    for _ in range(steps):
        t = time.perf_counter()
        results.append(runner.finish(runner.launch()))
        times.append(time.perf_counter() - t)
    return times, results


def queued_wall(runner: Runner, steps: int) -> tuple[float, Any]:
    """Seconds for ``steps`` steps run back to back as the trainer runs them (from the first launch to
    the end of the last), and the last step's result."""
    t = time.perf_counter()
    running = runner.launch()
    for _ in range(steps - 1):
        following = runner.launch()
        runner.wait(running)
        running = following
    result = runner.finish(running)
    return time.perf_counter() - t, result
