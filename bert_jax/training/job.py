"""What every training job holds from its start to its end: the preemption handler and the
workdir's lock.

``with job(config, workdir) as j:`` initialises the processes (`bert_jax.training.distributed`),
resolves the config for the platform it runs on (`bert_jax.resolve`: every "auto" made concrete,
once; ``j.config``), keeps TensorFlow off the accelerators, takes ``<workdir>/LOCK`` (process 0,
`bert_jax.training.workdir_lock`), writes the resolved config to ``config.json``, and catches
SIGTERM and SIGINT until the job ends, so a signal during start-up or restore, a step, an
evaluation, an asynchronous save or after the last step is recorded and acted on
(`bert_jax.training.loop.train_loop`) instead of killing the process half-way through a write.
The lock is released and the handlers restored on the way out, exceptions included.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import signal
import threading
from collections.abc import Iterator

import jax

from bert_jax.training.checkpoints import as_path
from bert_jax.training.workdir_lock import WorkdirLock

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


@dataclasses.dataclass(frozen=True)
class Job:
    config: object  # the job's config, resolved for this platform (no "auto" left)
    workdir: object  # epath.Path
    is_main: bool  # process 0 (writes config.json, metrics, results; holds the lock)
    preemption: Preemption


def resolved(config, mesh=None):
    """``config`` resolved for the platform JAX runs on (`bert_jax.resolve.resolve`), its
    ``per_device_batch`` for the batch shards of ``mesh`` (default: the config's own mesh)."""
    from bert_jax.resolve import resolve

    shards = None
    if config.get("per_device_batch") == "auto":
        from bert_jax.training import sharding as sh

        mesh = sh.make_mesh(tuple(config.mesh_shape)) if mesh is None else mesh
        shards = sh.batch_shards(mesh, tuple(tuple(r) for r in config.sharding_rules))
    return resolve(config, jax.default_backend(), batch_shards=shards)


@contextlib.contextmanager
def job(config, workdir, preemption: Preemption | None = None, check=None) -> Iterator[Job]:
    """The job's start (see the module docstring) and, on the way out, its end. ``preemption``:
    the caller's (``train.py`` installs it before anything else), else one for this job.
    ``check(config, workdir)``: the trainer's look at the workdir with the resolved config, before
    anything is written there (e.g. `bert_jax.training.resume.check_workdir_model`)."""
    from bert_jax.training.distributed import initialize
    from input_pipeline import hide_accelerators_from_tf

    own = preemption is None
    preemption = preemption or Preemption(sigterm=not config.multihost)
    try:
        initialize(config)  # before anything starts JAX's backend
        preemption.start()
        workdir = as_path(workdir)
        is_main = jax.process_index() == 0
        config = resolved(config)
        if check is not None:
            check(config, workdir)
        with WorkdirLock(workdir) if is_main else contextlib.nullcontext():  # before TF's import (seconds)
            hide_accelerators_from_tf()
            if is_main:
                (workdir / "config.json").write_text(config.to_json_best_effort(indent=2) + "\n")
            yield Job(config, workdir, is_main, preemption)
    finally:
        if own:
            preemption.close()
