"""``run(config, workdir)``: the one entry point of jobs (tests and the demo call it): a config with
a ``task`` section fine-tunes (`bert_jax.finetuning.task`), any other pre-trains
(`bert_jax.pretraining.task`), both in the one trainer (`bert_jax.training.trainer`); ``main``
is what ``python train.py`` runs around it, ``dry_run`` its ``--dry_run`` (`bert_jax.plan`)."""

from __future__ import annotations

from pathlib import Path

from bert_jax.config_args import is_finetuning
from input_pipeline import command_line as cli


def run(config, workdir: str | Path, preemption=None) -> dict:
    """The job ``config`` describes, in ``workdir``; its last metrics or results (fine-tuning)."""
    from bert_jax.training import trainer
    from bert_jax.training.checkpoints import require_storage_access

    require_storage_access(workdir)  # gs:// without network or credentials: one line, not a traceback
    if is_finetuning(config):
        from bert_jax.finetuning.task import FineTuning as Task
    else:
        from bert_jax.pretraining.task import PreTraining as Task  # type: ignore[assignment]
    return trainer.run(config, workdir, Task, preemption)


def dry_run(config, workdir: str | Path, hosts: int | None = None) -> str:
    """``python train.py ... --dry_run [--hosts N]``: the job's plan, its inputs checked, nothing run or
    written."""
    from bert_jax.plan import dry_run as plan

    return plan(config, workdir, hosts)


def main(config, workdir: str | Path) -> None:
    """``python train.py``: SIGTERM/SIGINT stop the job after a committed checkpoint from here to the
    end (docs/robustness.md); a diverged run is one ``error:`` line with status 1."""
    from absl import logging

    from bert_jax.training.preemption import Preemption
    from bert_jax.training.trainer import TrainingDivergedError

    logging.set_verbosity(logging.INFO)  # the job's progress; Orbax's chatter: bert_jax.training.checkpoints
    with Preemption(sigterm=not config.multihost) as preemption:
        try:
            run(config, workdir, preemption)
        except TrainingDivergedError as e:
            cli.fail(e, status=1)

