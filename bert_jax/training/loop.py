"""The training loop that pre-training and fine-tuning share.

`train_loop` runs a jitted step until the last step: it averages the step metrics over each
logging window, shows progress, writes TensorBoard events and ``metrics.jsonl``, stops on a NaN/Inf
loss without saving after it, saves a checkpoint every ``checkpoint_every`` steps and at the end,
and on SIGTERM (preemption) or SIGINT saves the step it is at (several processes: a step they agree
on, see `bert_jax.training.job.Preemption`) and returns once that checkpoint is committed.
Evaluation and other per-job work happen in the ``after_step`` hook; ``on_log`` sees each logged
window (the collapse warning, `bert_jax.training.health`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from bert_jax.training.checkpoints import Checkpointer
from bert_jax.training.job import Preemption
from bert_jax.training.metric_writer import MetricWriter
from bert_jax.training.progress import Progress

log = logging.getLogger(__name__)


class TrainingDivergedError(RuntimeError):
    """The loss became NaN or Inf; the workdir keeps the last good checkpoint."""


def mean_metrics(rows: list[dict]) -> dict[str, float]:
    """Per-step metric dicts (host values) → their means."""
    return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}


@dataclasses.dataclass
class LoopResult:
    state: Any
    step: int
    interrupted: bool  # stopped by SIGTERM (a checkpoint of ``step`` was saved)
    train: dict[str, float]  # the last logged training metrics ({} if none)


def train_loop(state, step_fn: Callable, batches: Iterator[dict], rng: jax.Array, *, total: int,
               ckpt: Checkpointer, writer: MetricWriter, progress: Progress, log_every: int,
               checkpoint_every: int, meta: Callable[[int], dict], preemption: Preemption,
               after_step: Callable[[Any, int], None] | None = None, name: str = "",
               on_log: Callable[[int, dict], None] | None = None) -> LoopResult:
    """Runs ``state, metrics = step_fn(state, next(batches), rng)`` from ``state.step`` to ``total``.

    ``meta(step)`` is the JSON saved beside each checkpoint (input position, model config, seed).
    ``after_step(state, step)`` runs after each step's logging (evaluation), not once a stop is due;
    ``on_log(step, summary)`` after each window's metrics are written.
    A signal (``preemption``) stops the loop after the step in progress, or after the evaluation in
    progress (the step before it is complete); that step is saved and the loop returns once the
    checkpoint is committed on disk. A signal before the first step returns at once (the state is
    the restored checkpoint's, or a fresh one: nothing to save).
    """
    step, pending, last, stop = int(state.step), [], {}, False
    prefix = f"{name}: " if name else ""

    def log_window() -> dict:
        summary = mean_metrics(jax.device_get(pending))
        pending.clear()
        if not np.isfinite(summary["loss"]):
            good = ckpt.latest_step()
            raise TrainingDivergedError(
                f"{prefix}loss is {summary['loss']} at step {step}; stopping. The last good checkpoint "
                f"is {'step ' + str(good) if good is not None else 'none'} in {ckpt.directory}")
        summary.update(progress.report(step, summary))
        writer.write(step, summary, "train")
        if on_log is not None:
            on_log(step, summary)
        return summary

    try:
        if preemption.arrived() and not preemption.shared:
            newest = ckpt.latest_step()
            log.warning("%s%s received before the first step: nothing new to save (newest checkpoint: %s); "
                        "exiting", prefix, preemption.signal_name, "none" if newest is None else f"step {newest}")
            return LoopResult(state, step, True, last)
        ckpt.warm_up(state)
        while step < total:
            state, metrics = step_fn(state, next(batches), rng)
            step += 1
            pending.append(metrics)
            progress.update(step)
            stop = preemption.due(step)
            if step % log_every == 0 or step % checkpoint_every == 0 or step == total or stop:
                last = log_window()
            if after_step is not None and not stop:
                after_step(state, step)
                if preemption.arrived() and not preemption.shared:  # during the evaluation: save this step
                    stop = True
                    last = log_window() if pending else last
            if step % checkpoint_every == 0 or step == total or stop:
                ckpt.save(step, state, meta(step))
            if stop:
                ckpt.wait()
                ckpt.check_committed(step)  # on disk (or in the bucket) before we say so
                log.warning("%s%s received: saved a checkpoint at step %d; exiting", prefix,
                            preemption.signal_name, step)
                break
    finally:
        progress.close()
    return LoopResult(state, step, stop, last)
