"""Host-to-device prefetch: the next batches are read, packed and placed on the devices in a
background thread while the current step runs (``config.prefetch_batches``; 0 = in the loop).

`DevicePrefetch` wraps an input iterator with ``state()`` (`input_pipeline.pretraining.dataset`) and a
``place`` function (numpy batch → global `jax.Array`s, `bert_jax.training.sharding.global_batch`). Its own
``state()`` is the input's position after the last batch *returned*, not after the batches read
ahead, so a checkpoint saved mid-run resumes exactly where the training loop was. An error in the
input (bad record, exhausted iterator) is raised by ``next()`` in the training loop.
"""

from __future__ import annotations

import queue
import threading

_POLL_S = 0.1  # how often a blocked worker checks whether it should stop


class DevicePrefetch:
    """``next()`` returns placed batches; ``size`` more are placed ahead (and one more read,
    waiting for room)."""

    def __init__(self, data, place, size: int = 2):
        if size < 1:
            raise ValueError(f"prefetch size {size}: expected >= 1 (use the input directly for none)")
        self.data, self.place = data, place
        self._state = data.state()
        self._queue: queue.Queue = queue.Queue(maxsize=size)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._work, name="device-prefetch", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while not self._stop.is_set():
            try:
                batch = next(self.data)
                item = (self.place(batch), self.data.state(), None)
            except BaseException as e:  # handed to the training loop, which raises it
                item = (None, None, e)
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=_POLL_S)
                    break
                except queue.Full:
                    continue
            if item[2] is not None:
                return

    def state(self) -> dict:
        """The input position after the last batch ``next()`` returned."""
        return self._state

    def __iter__(self):
        return self

    def __next__(self):
        if self._stop.is_set():
            raise RuntimeError("DevicePrefetch is closed")
        batch, state, error = self._queue.get()
        if error is not None:
            self.close()
            raise error
        self._state = state
        return batch

    def close(self) -> None:
        """Stops the worker and drops the batches read ahead (idempotent)."""
        self._stop.set()
        while True:  # unblock a worker waiting on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout=60)
