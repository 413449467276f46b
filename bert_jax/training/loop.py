"""The training loop that pre-training and fine-tuning share.

`start_job` does what every job does first (multi-process initialisation, see
`bert_jax.training.distributed`; TensorFlow kept off the accelerators; ``config.json`` in the
workdir). `train_loop` runs a jitted step until the last step: it averages the step metrics over
each logging window, shows progress, writes TensorBoard events and ``metrics.jsonl``, stops on a
NaN/Inf loss without saving after it, saves a checkpoint every ``checkpoint_every`` steps and at
the end, and on SIGTERM (preemption) saves the step it is at (several processes: a step they
agree on, see `Preemption`) and returns. Evaluation and other per-job work happen in the
``after_step`` hook.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np

from bert_jax.training.checkpoints import Checkpointer, as_path
from bert_jax.training.metric_writer import MetricWriter
from bert_jax.training.progress import Progress

log = logging.getLogger(__name__)


class TrainingDivergedError(RuntimeError):
    """The loss became NaN or Inf; the workdir keeps the last good checkpoint."""


def start_job(config, workdir: str | Path):
    """Shared start of every job: multi-host initialisation, TensorFlow kept off accelerators,
    ``config.json`` written by process 0. Returns (workdir as a path, is process 0)."""
    from bert_jax.training.distributed import initialize
    from input_pipeline import hide_accelerators_from_tf

    initialize(config)
    hide_accelerators_from_tf()
    workdir = as_path(workdir)
    is_main = jax.process_index() == 0
    if is_main:
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "config.json").write_text(config.to_json_best_effort(indent=2) + "\n")
    return workdir, is_main


def mean_metrics(rows: list[dict]) -> dict[str, float]:
    """Per-step metric dicts (host values) → their means."""
    return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}


class Preemption:
    """SIGTERM, the preemption notice. One process: a Python handler, the loop stops after the step
    it arrived in. Several processes: JAX's preemption service (started by
    ``jax.distributed.initialize``) takes the signal on any host and every process reaches the same
    stop step (`multihost_utils.reached_preemption_sync_point`), so that all of them save it (a
    handler per process would stop only the hosts that got the signal, the others waiting for them
    inside the next step)."""

    def __init__(self):
        self.shared = jax.process_count() > 1 and jax.config.jax_enable_preemption_service
        self.signum = None
        if not self.shared:
            self.previous = signal.signal(signal.SIGTERM, lambda signum, _: setattr(self, "signum", signum))

    def due(self, step: int) -> bool:
        """Whether to save ``step`` and stop (called once after every step)."""
        if self.shared:
            from jax.experimental import multihost_utils

            return multihost_utils.reached_preemption_sync_point(step)
        return self.signum is not None

    def close(self) -> None:
        if not self.shared:
            signal.signal(signal.SIGTERM, self.previous)


@dataclasses.dataclass
class LoopResult:
    state: Any
    step: int
    interrupted: bool  # stopped by SIGTERM (a checkpoint of ``step`` was saved)
    train: dict[str, float]  # the last logged training metrics ({} if none)


def train_loop(state, step_fn: Callable, batches: Iterator[dict], rng: jax.Array, *, total: int,
               ckpt: Checkpointer, writer: MetricWriter, progress: Progress, log_every: int,
               checkpoint_every: int, meta: Callable[[int], dict],
               after_step: Callable[[Any, int], None] | None = None, name: str = "") -> LoopResult:
    """Runs ``state, metrics = step_fn(state, next(batches), rng)`` from ``state.step`` to ``total``.

    ``meta(step)`` is the JSON saved beside each checkpoint (input position, model config, seed).
    ``after_step(state, step)`` runs after each step's logging (evaluation), not once a stop is due.
    """
    preemption = Preemption()
    step, pending, last, stop = int(state.step), [], {}, False
    prefix = f"{name}: " if name else ""
    try:
        while step < total:
            state, metrics = step_fn(state, next(batches), rng)
            step += 1
            pending.append(metrics)
            progress.update(step)
            stop = preemption.due(step)
            due_ckpt = step % checkpoint_every == 0 or step == total or stop
            if step % log_every == 0 or due_ckpt:
                summary = mean_metrics(jax.device_get(pending))
                pending = []
                if not np.isfinite(summary["loss"]):
                    good = ckpt.latest_step()
                    raise TrainingDivergedError(
                        f"{prefix}loss is {summary['loss']} at step {step}; stopping. The last good checkpoint "
                        f"is {'step ' + str(good) if good is not None else 'none'} in {ckpt.directory}")
                summary.update(progress.report(step, summary))
                writer.write(step, summary, "train")
                last = summary
            if after_step is not None and not stop:
                after_step(state, step)
            if due_ckpt:
                ckpt.save(step, state, meta(step))
            if stop:
                ckpt.wait()  # committed on disk before we say so
                log.warning("%sSIGTERM received: saved a checkpoint at step %d; exiting", prefix, step)
                break
    finally:
        preemption.close()
        progress.close()
    return LoopResult(state, step, stop, last)
