"""SIGTERM (a preemption notice) and SIGINT (Ctrl-C) as a request to stop after the step in
progress, once its checkpoint is committed (docs/robustness.md).

``train.py`` installs `Preemption` first thing (`bert_jax.launch.main`), so a signal during
start-up or restore, a step, an evaluation, an asynchronous save or after the last step is recorded
and acted on by the trainer's loop instead of killing the process half-way through a write.
"""

from __future__ import annotations

import logging
import signal
import threading

import jax

log = logging.getLogger(__name__)


class Preemption:
    """SIGTERM (the preemption notice) and SIGINT (Ctrl-C) as a request to stop after the step in
    progress, once its checkpoint is committed. A second SIGINT stops at once (KeyboardInterrupt).
    ``train.py`` creates it first thing, so a signal during start-up is caught too; `job` makes its
    own otherwise.

    One process: Python handlers. Several processes (``sigterm=False`` until `start` knows):
    JAX's preemption service (started by ``jax.distributed.initialize``) takes SIGTERM on any host
    and every process reaches the same stop step (`multihost_utils.reached_preemption_sync_point`),
    so that all of them save it (a handler per process would stop only the hosts that got the
    signal, the others waiting for them inside the next step); there only SIGINT gets a Python
    handler."""

    def __init__(self, sigterm: bool = True):
        self.shared = False
        self.signal_name: str | None = None
        self.previous = {}
        self._install(signal.SIGINT)
        if sigterm:
            self._install(signal.SIGTERM)

    def _install(self, sig: signal.Signals) -> None:
        # Handlers can only be set from the main thread (elsewhere the job is not a CLI run).
        if sig not in self.previous and threading.current_thread() is threading.main_thread():
            self.previous[sig] = signal.signal(sig, self._handle)

    def start(self) -> None:
        """After ``jax.distributed.initialize``: several processes with JAX's preemption service
        share SIGTERM through it; otherwise SIGTERM is handled here."""
        self.shared = jax.process_count() > 1 and jax.config.jax_enable_preemption_service
        if not self.shared:
            self._install(signal.SIGTERM)

    def _handle(self, signum, _frame) -> None:
        if self.signal_name is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if self.signal_name is None:
            self.signal_name = signal.Signals(signum).name
            log.warning("%s received: stopping once the step in progress is saved", self.signal_name)

    def arrived(self) -> bool:
        """Whether this process got a signal (a stop is due at the next point the job checks)."""
        return self.signal_name is not None

    def due(self, step: int) -> bool:
        """Whether to save ``step`` and stop (called once after every step, by every process)."""
        if self.shared:
            from jax.experimental import multihost_utils

            if multihost_utils.reached_preemption_sync_point(step):
                self.signal_name = self.signal_name or "SIGTERM"
                return True
        return self.arrived()

    def close(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous = {}

    def __enter__(self) -> Preemption:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
