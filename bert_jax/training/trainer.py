"""The trainer: ``run(config, workdir, Task)`` pre-trains or fine-tunes, read top to bottom.

The job starts: the processes are initialised (`bert_jax.training.distributed`), the config is
resolved for the platform it runs on, once (`bert_jax.resolve`: no "auto" left), and the task reads
its inputs (vocabulary, data, ``init_checkpoint``) before anything is written, so bad input leaves
the workdir as it was. Then the workdir is locked (process 0, `bert_jax.training.workdir_lock`), the
resolved config goes to ``config.json`` and each of the task's runs (pre-training: one, in the
workdir; fine-tuning: one a seed) is trained the same way:

1. the jitted steps on the config's mesh (`bert_jax.training.steps.jit_steps`, through the task);
2. the state: the run's own checkpoint that ``config.restore`` names (exact resume: parameters,
   optimizer state, step and the input position; a checkpoint of another model is refused in one
   line naming the changed fields), else the task's start (fresh, ``init_checkpoint``, warm start);
3. the loop: a step, its metrics averaged over each logging window (progress, TensorBoard events,
   ``metrics.jsonl``), a NaN/Inf loss stops it without a save after it, the task's evaluation when
   due, a checkpoint every ``checkpoint_every`` steps and at the end. The host queues at most one
   step behind the one the devices run, so SIGTERM (preemption) or SIGINT saves the step after the
   one in progress at most and returns once that checkpoint is committed (several processes: a step
   they agree on, `bert_jax.training.preemption`); an evaluation due at that step runs when the run
   resumes there.

A task supplies what differs (`bert_jax.training.task.Task`, the hooks it declares):
`bert_jax.pretraining.task.PreTraining`, `bert_jax.finetuning.task.FineTuning`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import shutil
from pathlib import Path

import jax
import numpy as np

from bert_jax.config_args import is_finetuning
from bert_jax.model.config import BertConfig
from bert_jax.resolve import resolve
from bert_jax.training import compiler_options
from bert_jax.training import sharding as sh
from bert_jax.training.checkpoints import Checkpointer, CheckpointRestoreError, as_path
from bert_jax.training.distributed import initialize
from bert_jax.training.metric_writer import MetricWriter
from bert_jax.training.preemption import Preemption
from bert_jax.training.progress import Progress
from bert_jax.training.sharding_rules import config_rules
from bert_jax.training.task import Task
from bert_jax.training.workdir_lock import WorkdirLock
from input_pipeline import hide_accelerators_from_tf
from input_pipeline.command_line import is_user_error

log = logging.getLogger(__name__)

CONFIG_JSON = "config.json"


# The counts every job needs to be at least (`check_counts`).
COUNTS = {"batch_size": 1, "seeds": 1, "max_seq_length": 3, "log_every": 1, "checkpoint_every": 1,
          "keep_checkpoints": 1, "eval_batch_size": 1, "num_train_epochs": 0, "eval_every": 0, "eval_steps": 0,
          "data.max_seq_length": 5, "data.max_predictions_per_seq": 1}


class TrainingDivergedError(RuntimeError):
    """The loss became NaN or Inf; the workdir keeps the last good checkpoint."""


def run(config, workdir: str | Path, task_type: type[Task], preemption: Preemption | None = None) -> dict:
    """Runs ``task_type(config, is_main)`` in ``workdir``; returns its results (pre-training: the
    last logged train/eval metrics; fine-tuning: ``results.json``). ``preemption``: the caller's
    (``train.py`` installs it before anything else), else one for this job."""
    check_counts(config)
    if "://" not in str(workdir) and Path(workdir).exists() and not Path(workdir).is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "is a file, expected a directory (the workdir)", str(workdir))
    own = preemption is None
    preemption = preemption or Preemption(sigterm=not config.multihost)
    created = _first_missing(workdir)  # the directory this job creates, if any
    try:
        initialize(config)  # before anything starts JAX's backend
        preemption.start()
        workdir = as_path(workdir)
        is_main = jax.process_index() == 0
        config = resolved(config)
        compiler_options.check(compiler_options.of_config(config))  # a refused XLA option: one line, nothing written
        hide_accelerators_from_tf()  # before the task's input imports TensorFlow
        task = task_type(config, is_main)  # reads the inputs: bad input stops here, nothing written
        try:
            for _, run_dir in task.runs(workdir):
                refuse_another_model(run_dir, config.restore, task.model_config)
            with WorkdirLock(workdir) if is_main else contextlib.nullcontext():
                if is_main:
                    (workdir / CONFIG_JSON).write_text(config.to_json_best_effort(indent=2) + "\n")
                results = []
                for seed, run_dir in task.runs(workdir):
                    results.append(train(config, task, run_dir, seed, preemption, is_main))
                    if preemption.arrived():
                        return results[-1]
                return task.summarize_runs(results, workdir)
        finally:
            task.close()
    except Exception as e:
        if created is not None and is_user_error(e) and not _has_checkpoints(created):
            shutil.rmtree(created, ignore_errors=True)  # bad input found late: no empty workdir left behind
        raise
    finally:
        if own:
            preemption.close()


def train(config, task: Task, workdir, seed: int, preemption: Preemption, is_main: bool) -> dict:
    """One run of ``task`` in ``workdir`` (see the module docstring); returns the task's results."""
    steps, total = task.build_steps(seed), task.num_train_steps
    ckpt = Checkpointer(workdir, keep=config.keep_checkpoints)
    writer = MetricWriter(workdir, enabled=is_main)
    progress = None
    try:
        restored = restore(ckpt, steps.layout, config.restore, task.model_config)
        state, meta = restored if restored is not None else (task.initial_state(steps.layout, seed), None)
        step = start = int(state.step)
        batches = task.inputs(steps, seed, start, meta, workdir)
        progress = Progress(start, total, config.batch_size, enabled=is_main and task.show_progress)
        prefix = f"{task.name}: " if task.name else ""
        # Step 0's evaluation, or one a signal left undone at the step the run resumes from.
        if task.evaluation_due(start, total) and (start == 0 or not evaluated(workdir, start, is_main)):
            task.evaluate(steps, state, start, writer, preemption.arrived)
        if preemption.arrived() and not preemption.shared:
            newest = ckpt.latest_step()
            log.warning("%s%s received before the first step: nothing new to save (newest checkpoint: %s); "
                        "exiting", prefix, preemption.signal_name, "none" if newest is None else f"step {newest}")
            return {"interrupted_at_step": step}
        rng = jax.random.key(seed, impl=config.rng_impl)
        pending, first, last, stop = [], None, {}, False

        def log_window() -> dict:
            """The window's mean metrics, written and shown; a NaN/Inf loss stops the run."""
            summary = {k: float(np.mean([m[k] for m in jax.device_get(pending)])) for k in pending[0]}
            pending.clear()
            if not np.isfinite(summary["loss"]):
                good = ckpt.latest_step()
                raise TrainingDivergedError(
                    f"{prefix}loss is {summary['loss']} at step {step}; stopping. The last good checkpoint "
                    f"is {'step ' + str(good) if good is not None else 'none'} in {ckpt.directory}")
            summary.update(progress.report(step, summary))
            writer.write(step, summary, "train")
            task.logged(step, summary, first)
            return summary

        ckpt.warm_up(state)
        running = None  # the previous step's metrics: the host waits for them after queueing the next step
        while step < total:
            state, metrics = steps.train_fn(state, next(batches), rng)
            if running is not None:  # at most one step queued behind the one running: a signal stops within a step
                jax.block_until_ready(running)
            running = metrics
            step += 1
            first = metrics if step == 1 else first  # a fresh run's first step (the collapse warning's)
            pending.append(metrics)
            progress.update(step)
            stop = preemption.due(step)
            if step % config.log_every == 0 or step % config.checkpoint_every == 0 or step == total or stop:
                last = log_window()
            if not stop and task.evaluation_due(step, total):
                task.evaluate(steps, state, step, writer, preemption.arrived)
                if preemption.arrived() and not preemption.shared:  # during the evaluation: save this step
                    stop = True
                    last = log_window() if pending else last
            if step % config.checkpoint_every == 0 or step == total or stop:
                ckpt.save(step, state, task.meta(step))
            if stop:
                break
        if preemption.arrived():  # during the run, or after its last step: a re-run goes on from here
            ckpt.wait()
            ckpt.check_committed(step)  # on disk (or in the bucket) before we say so
            log.warning("%s%s received: saved a checkpoint at step %d; exiting", prefix, preemption.signal_name, step)
            return {"interrupted_at_step": step}
        return task.finish(steps, state, step, last, writer, workdir)
    finally:
        if progress is not None:
            progress.close()
        try:
            ckpt.close()  # raises if a save still in flight failed
        finally:
            writer.close()


def evaluated(workdir, step: int, is_main: bool) -> bool:
    """Whether ``workdir``'s metrics.jsonl records an evaluation at ``step`` (a run resumed at a step
    whose evaluation a signal left undone has none). Process 0 reads it; every process gets its answer."""
    from bert_jax.training.metric_writer import read_metrics

    found = False
    if is_main:
        try:
            found = any(r["step"] == step and r["split"] != "train" for r in read_metrics(workdir))
        except (FileNotFoundError, ValueError, KeyError):
            found = False
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        found = bool(multihost_utils.broadcast_one_to_all(np.int32(found)))
    return found


def resolved(config, mesh=None):
    """``config`` resolved for the platform JAX runs on (`bert_jax.resolve.resolve`), an "auto"
    ``per_device_batch`` for the batch shards of ``mesh`` (default: the config's own mesh)."""
    shards = None
    if "per_device_batch" in config and config.per_device_batch == "auto":
        shards = sh.batch_shards(sh.config_mesh(config) if mesh is None else mesh, config_rules(config))
    return resolve(config, jax.default_backend(), batch_shards=shards)


# BertConfig fields a resumed run may change: how the model runs, and the training-time dropout and init.
NOT_THE_MODEL = ("dtype", "scan_layers", "stacked_params", "attention_impl", "dropout_impl", "norm_impl",
                 "recompute_activation", "gelu_impl", "remat_policy", "hidden_dropout_prob", "attention_dropout_prob",
                 "initializer_range")


def model_changes(saved: dict | None, model: BertConfig) -> list[str]:
    """``model.<field> old → new`` for each field of ``model`` that differs from ``saved``, a
    checkpoint's record of its model (meta's ``model``; none in older checkpoints: no changes),
    the fields of `NOT_THE_MODEL` left out."""
    new = dataclasses.asdict(model)
    return [f"model.{k} {saved[k]} → {new[k]}" for k in new
            if saved and k in saved and k not in NOT_THE_MODEL and saved[k] != new[k]]


def _another_model(ckpt: Checkpointer, step: int, model: BertConfig) -> CheckpointRestoreError | None:
    """The error for checkpoint ``step`` when it records another model than ``model``, else None."""
    try:
        saved = ckpt.read_meta(step).get("model")
    except Exception:  # noqa: BLE001  (meta that cannot be read: the restore says why)
        return None
    changes = model_changes(saved, model)
    if not changes:
        return None
    return CheckpointRestoreError(f"{ckpt.directory.parent} holds a checkpoint of another model: {', '.join(changes)}; "
                                  f"use another --workdir to start fresh (or restore the old values)")


def refuse_another_model(workdir, restore: str, model: BertConfig) -> None:
    """Before a job writes anything: the workdir's checkpoint that ``restore`` names, if another
    model saved it, is a `CheckpointRestoreError` naming the changed fields."""
    if not (as_path(workdir) / "checkpoints").is_dir():  # a new workdir (Orbax would create the directory)
        return
    ckpt = Checkpointer(workdir)
    try:
        step = ckpt.restore_step(restore)
        error = _another_model(ckpt, step, model) if step is not None else None
    finally:
        ckpt.close()
    if error is not None:
        raise error


def restore(ckpt: Checkpointer, layout, choice: str = "latest", model: BertConfig | None = None) -> tuple | None:
    """(state, meta) of the run's own checkpoint that ``choice`` names ("latest", "previous" or a
    step; docs/robustness.md), the checkpoints after it set aside, or None when there is none.
    ``model``: a checkpoint of another model is refused before the state is read."""
    step = ckpt.restore_step(choice)
    if step is None:
        return None
    error = _another_model(ckpt, step, model) if model is not None else None
    if error is not None:
        raise error
    state, meta = ckpt.restore(layout.target(), step)
    ckpt.set_aside_after(step)
    log.info("resumed from %s at step %d", ckpt.directory, int(state.step))
    return state, meta


def _first_missing(workdir) -> Path | None:
    """The top directory that creating local ``workdir`` makes (None: it exists, or is remote)."""
    if "://" in str(workdir) or Path(workdir).exists():
        return None
    path = Path(workdir)
    while not path.parent.exists():
        path = path.parent
    return path


def _has_checkpoints(path: Path) -> bool:
    return any(p.name.isdigit() for p in path.glob("**/checkpoints/*"))


def check_counts(config) -> None:
    """The counts every job needs to be positive (`COUNTS`), as a one-line ``ValueError`` naming the key."""
    counts = {**COUNTS, "num_train_steps": 0 if is_finetuning(config) else 1}
    for key, low in counts.items():
        section, _, name = key.rpartition(".")
        holder = config[section] if section in config else config if not section else {}
        value = holder[name] if name in holder else low
        if isinstance(value, bool) or not isinstance(value, int | float) or value < low:
            raise ValueError(f"--config.{key}={value!r}: expected a number >= {low}")
    if is_finetuning(config) and not (config.num_train_steps or config.num_train_epochs):
        raise ValueError("--config.num_train_steps=0 and --config.num_train_epochs=0: expected one of them > 0")
