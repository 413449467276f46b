"""``run(config, workdir)``: the one entry point of jobs (tests and the demo call it); ``main``, what
``python train.py`` runs around it: the process's start and end in one place.

A config with a ``task`` section (configs/glue.py, squad.py, ner.py, sentiment.py) fine-tunes
(`bert_jax.finetuning.trainer`); any other config pre-trains (`bert_jax.training.trainer`).

Bad input (a user error in the sense of `input_pipeline.command_line.is_user_error`: a missing file, a
malformed row, a config value out of range, a checkpoint that does not fit) that stops a
single-process job before it commits a checkpoint leaves a local workdir as it was: a workdir the
job created is removed, and in an existing one the top-level entries the job created are removed
and ``config.json`` gets its old content and modification time back. Once the job has committed a
checkpoint nothing is removed, nor when the workdir is another trainer's (its lock,
`bert_jax.training.workdir_lock`).
"""

from __future__ import annotations

import errno
import gc
import logging
import os
import shutil
from pathlib import Path

from input_pipeline import command_line as cli

CONFIG_JSON = "config.json"


def run(config, workdir: str | Path, preemption=None) -> dict:
    """Runs the job ``config`` describes in ``workdir``; returns its last metrics (pre-training) or
    its results (fine-tuning). ``preemption``: a `bert_jax.training.job.Preemption` installed by
    the caller (``train.py``: from its start), else the job installs its own."""
    check_config(config)
    if "://" not in str(workdir) and Path(workdir).exists() and not Path(workdir).is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "is a file, expected a directory (the workdir)", str(workdir))
    from bert_jax.training.checkpoints import require_storage_access

    require_storage_access(workdir)  # gs:// without network or credentials: one line, not a traceback
    before = _Snapshot(None if config.multihost else workdir)  # one process: no other writer
    try:
        if "task" in config:
            from bert_jax.finetuning import trainer as finetuning
            return finetuning.run(config, workdir, preemption)
        from bert_jax.training import trainer as pretraining
        return pretraining.run(config, workdir, preemption)
    except Exception as e:
        from bert_jax.training.workdir_lock import WorkdirBusyError

        if cli.is_user_error(e) and not isinstance(e, WorkdirBusyError):  # the workdir is another job's
            before.restore()
        raise


def dry_run(config, workdir: str | Path) -> str:
    """``python train.py ... --dry_run``: the job's plan, its inputs checked, nothing run or written
    (`bert_jax.plan`)."""
    from bert_jax.plan import dry_run as plan

    check_config(config)
    return plan(config, workdir)


def main(config, workdir: str | Path) -> None:
    """``python train.py``: SIGTERM/SIGINT stop the job after a committed checkpoint from here to the
    end (docs/robustness.md), absl's log at INFO without Orbax's per-save chatter, a diverged run
    as one ``error:`` line with status 1, and the exit."""
    from absl import logging as absl_logging

    from bert_jax.training.job import Preemption
    from bert_jax.training.loop import TrainingDivergedError

    preemption = Preemption(sigterm=not config.multihost)
    absl_logging.set_verbosity(absl_logging.INFO)
    absl_logging.get_absl_handler().addFilter(lambda r: r.levelno >= logging.WARNING or "orbax" not in r.pathname)
    try:
        run(config, workdir, preemption)
    except TrainingDivergedError as e:
        cli.fail(e, status=1)
    finally:
        preemption.close()
    # Everything is saved and closed. Python's last garbage collection at exit walks the job's
    # objects (the in-memory corpus, TensorFlow's): 40 s on the tiny runlocal job, a preemption's
    # grace period. Frozen objects are left to the OS (docs/robustness.md).
    gc.freeze()


def check_config(config) -> None:
    """The counts every job needs to be positive, as a one-line ``ValueError`` naming the key."""
    fields = [("batch_size", 1), ("num_train_steps", 0 if "task" in config else 1), ("seeds", 1),
              ("max_seq_length", 3), ("log_every", 1), ("checkpoint_every", 1), ("keep_checkpoints", 1),
              ("eval_batch_size", 1), ("num_train_epochs", 0), ("eval_every", 0), ("eval_steps", 0)]
    data = config.get("data") or {}
    for key, low in fields + [(f"data.{k}", low) for k, low in (("max_seq_length", 5),
                                                                   ("max_predictions_per_seq", 1))]:
        section, _, name = key.rpartition(".")
        holder = data if section else config
        if name not in holder:
            continue
        value = holder[name]
        if isinstance(value, bool) or not isinstance(value, int | float) or value < low:
            raise ValueError(f"--config.{key}={value!r}: expected a number >= {low}")
    if "task" in config and not (config.num_train_steps or config.num_train_epochs):
        raise ValueError("--config.num_train_steps=0 and --config.num_train_epochs=0: expected one of them > 0")


class _Snapshot:
    """What a local workdir held before the job: to put it back if bad input stops the job before
    its first checkpoint (remote workdirs, gs://, are left alone)."""

    def __init__(self, workdir: str | Path | None):
        self.path = Path(workdir) if workdir is not None and "://" not in str(workdir) else None
        self.existed = self.path is not None and self.path.exists()
        self.created = self.path  # the top directory the job will create (mkdir -p), if it does not exist
        while self.created is not None and not self.created.parent.exists():
            self.created = self.created.parent
        self.entries = set(p.name for p in self.path.iterdir()) if self.existed and self.path.is_dir() else set()
        config = self.path / CONFIG_JSON if self.existed else None
        self.config = None  # (its bytes, its access and modification times)
        if config is not None and config.is_file():
            self.config = config.read_bytes(), (config.stat().st_atime_ns, config.stat().st_mtime_ns)
        self.checkpoints = self._checkpoints() if self.existed else set()
        self.times = (self.path.stat().st_atime_ns, self.path.stat().st_mtime_ns) if self.existed else None

    def restore(self) -> None:
        if self.path is None or not self.path.is_dir() or self._checkpoints() != self.checkpoints:
            return
        if not self.existed:
            shutil.rmtree(self.created, ignore_errors=True)
            return
        for p in self.path.iterdir():
            if p.name not in self.entries:
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        if self.config is not None:
            config = self.path / CONFIG_JSON
            config.write_bytes(self.config[0])
            os.utime(config, ns=self.config[1])
        os.utime(self.path, ns=self.times)  # entries (config.json, the lock) came and went

    def _checkpoints(self) -> set[str]:
        """The committed checkpoints: step directories under checkpoints/ (seed_<n>/checkpoints/
        when fine-tuning several seeds)."""
        return {str(p.relative_to(self.path)) for pattern in ("checkpoints/*", "seed_*/checkpoints/*")
                for p in self.path.glob(pattern) if p.name.isdigit()}
