"""Dynamic batching: requests from many connections share forward passes.

`Batcher.submit` queues a request's rows and returns a future; one worker thread takes the first
waiting request, then keeps collecting rows until it has ``max_batch`` of them or ``max_wait_s`` has
passed since it started the batch, runs them as one batch (`Engine.run`), and hands each request its
rows' outputs. A request with more rows than ``max_batch`` is split over several batches. `stop`
finishes everything queued before the thread exits (a graceful shutdown drains).
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np


class _Job:
    def __init__(self, rows: list):
        self.rows, self.future = rows, Future()
        self.outputs: list[dict | None] = [None] * len(rows)
        self.remaining = len(rows)

    def deliver(self, index: int, output: dict) -> None:
        self.outputs[index] = output
        self.remaining -= 1
        if self.remaining == 0 and not self.future.done():
            self.future.set_result({k: np.stack([o[k] for o in self.outputs]) for k in self.outputs[0]})


class Batcher:
    def __init__(self, run_batch: Callable[[list], dict[str, np.ndarray]], *, max_batch: int, max_wait_s: float,
                 on_batch: Callable[[int], None] | None = None):
        self.run_batch, self.max_batch, self.max_wait_s = run_batch, max_batch, max_wait_s
        self.on_batch = on_batch or (lambda n: None)
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._work, name="bert-serve-batcher", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Answers everything already submitted, then ends the worker thread."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout)
            self._thread = None

    def submit(self, rows: list) -> Future:
        """A future of {output: [len(rows), ...]} for ``rows`` (at least one)."""
        if self._thread is None:
            raise RuntimeError("the batcher is not running")
        job = _Job(rows)
        self._queue.put(job)
        return job.future

    def _work(self) -> None:
        pending: collections.deque[tuple[_Job, int]] = collections.deque()
        stopping = False
        while not (stopping and not pending):
            if not pending:
                job = self._queue.get()
                if job is None:
                    break
                pending.extend((job, i) for i in range(len(job.rows)))
            deadline = time.monotonic() + self.max_wait_s
            while len(pending) < self.max_batch and not stopping:
                left = deadline - time.monotonic()
                try:
                    job = self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    stopping = True
                else:
                    pending.extend((job, i) for i in range(len(job.rows)))
            batch = [pending.popleft() for _ in range(min(self.max_batch, len(pending)))]
            self._run(batch)

    def _run(self, batch: list[tuple[_Job, int]]) -> None:
        try:
            out = self.run_batch([job.rows[i] for job, i in batch])
        except Exception as e:  # every request in the batch gets the error
            for job, _ in batch:
                if not job.future.done():
                    job.future.set_exception(e)
            return
        self.on_batch(len(batch))
        for n, (job, i) in enumerate(batch):
            if not job.future.done():
                job.deliver(i, {k: v[n] for k, v in out.items()})
