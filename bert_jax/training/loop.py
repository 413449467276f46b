"""The training loop that pre-training and fine-tuning share.

`start_job` does what every job does first (multi-process initialisation, see
`bert_jax.training.distributed`; TensorFlow kept off the accelerators; ``config.json`` in the
workdir). `train_loop` runs a jitted step until the last step: it averages the step metrics over
each logging window, shows progress, writes TensorBoard events and ``metrics.jsonl``, stops on a
NaN/Inf loss without saving after it, saves a checkpoint every ``checkpoint_every`` steps and at
the end, and on SIGTERM (preemption) saves the step it is at and returns. Evaluation and other
per-job work happen in the ``after_step`` hook.
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
    stop: dict[str, int | None] = {"signal": None}
    previous = signal.signal(signal.SIGTERM, lambda signum, _: stop.update(signal=signum))
    step, pending, last = int(state.step), [], {}
    prefix = f"{name}: " if name else ""
    try:
        while step < total:
            state, metrics = step_fn(state, next(batches), rng)
            step += 1
            pending.append(metrics)
            progress.update(step)
            due_ckpt = step % checkpoint_every == 0 or step == total or stop["signal"] is not None
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
            if after_step is not None and stop["signal"] is None:
                after_step(state, step)
            if due_ckpt:
                ckpt.save(step, state, meta(step))
            if stop["signal"] is not None:
                ckpt.wait()  # committed on disk before we say so
                log.warning("%sSIGTERM received: saved a checkpoint at step %d; exiting", prefix, step)
                break
    finally:
        signal.signal(signal.SIGTERM, previous)
        progress.close()
    return LoopResult(state, step, stop["signal"] is not None, last)
