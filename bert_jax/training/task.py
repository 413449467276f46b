"""What a task supplies to the one trainer (`bert_jax.training.trainer.run`): the ``Task`` protocol.

Pre-training (`bert_jax.pretraining.task.PreTraining`) and fine-tuning
(`bert_jax.finetuning.task.FineTuning`) implement it; the trainer uses nothing else of them
(tests/test_architecture.py checks both, and the trainer's uses). The trainer calls them in this
order: the task is built from the resolved config (``Task(config, is_main)``: its inputs are read
there, so bad input fails before anything is written); then for each of `runs`: `build_steps`, the
workdir's own checkpoint or `initial_state`, `inputs`, and the loop (`evaluation_due` / `evaluate`,
`logged` after each logging window, `meta` with each checkpoint), `finish`; then `summarize_runs`
and `close`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol, runtime_checkable

from bert_jax.model.config import BertConfig
from bert_jax.training.steps import StateLayout, Steps, TrainState


@runtime_checkable
class Task(Protocol):
    name: str  # a prefix for log lines ("" for none)
    show_progress: bool  # whether the trainer shows a progress bar
    model_config: BertConfig  # the model the runs train (a checkpoint of another model is refused)
    num_train_steps: int  # optimizer steps each run trains to

    def runs(self, workdir: Path) -> list[tuple[int, Path]]:
        """(seed, run directory) of each run the job trains, in order."""

    def build_steps(self, seed: int) -> Steps:
        """The run's jitted train and eval steps (`bert_jax.training.steps.jit_steps`)."""

    def initial_state(self, layout: StateLayout, seed: int) -> TrainState:
        """The state a run starts from when its workdir holds no checkpoint (fresh or warm-started)."""

    def inputs(self, steps: Steps, seed: int, start: int, meta: dict | None, workdir: Path) -> Iterator[dict]:
        """The placed training batches from step ``start`` on (``meta``: the restored checkpoint's)."""

    def meta(self, step: int) -> dict:
        """What a checkpoint at ``step`` records beside the state (the input's position, the model)."""

    def evaluation_due(self, step: int, total: int) -> bool:
        """Whether the task evaluates at ``step`` (of ``total``)."""

    def evaluate(self, steps: Steps, state: TrainState, step: int, writer, interrupted: Callable[[], bool]) -> bool:
        """Evaluates and writes the metrics at ``step``; False when ``interrupted()`` stopped it."""

    def logged(self, step: int, summary: dict, first: dict | None) -> None:
        """After each logging window: ``summary``, its mean metrics; ``first``, step 1's."""

    def finish(self, steps: Steps, state: TrainState, step: int, train: dict, writer, workdir: Path) -> dict:
        """A finished run's results (``train``: the last logged training metrics)."""

    def summarize_runs(self, results: list[dict], workdir: Path) -> dict:
        """The job's results from every run's."""

    def close(self) -> None:
        """Releases what the task holds open (threads, files)."""
