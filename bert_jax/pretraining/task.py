"""Pre-training as a task of the trainer (`bert_jax.training.trainer`): ``PreTraining``, one run in
the workdir. It checks the job's model against its data (`checked_model_config`), opens the input
(`bert_jax.pretraining.inputs`), builds the steps of its objective (`bert_jax.pretraining.objective`),
starts from ``init_checkpoint`` or fresh (`bert_jax.pretraining.start`), records the input's position
in every checkpoint, evaluates on held-out data at step 0 and every ``eval_every`` steps
(`bert_jax.pretraining.evaluation`) and warns of a collapse (`bert_jax.pretraining.health`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable

import jax

from bert_jax.model.config import BertConfig
from bert_jax.pretraining import health
from bert_jax.pretraining.evaluation import HeldOutBatches, eval_source, held_out_metrics, step0_reference
from bert_jax.pretraining.inputs import gather_data_states, make_input, placing, vocab_size_of
from bert_jax.pretraining.objective import jit_pretraining_steps
from bert_jax.pretraining.start import check_start, start_state
from bert_jax.resolve import described_model
from bert_jax.training import sharding as sh
from bert_jax.training.sharding_rules import config_rules
from bert_jax.training.steps import Steps, TrainState

log = logging.getLogger(__name__)


def checked_model_config(config) -> BertConfig:
    """The model ``config.model`` describes with the vocabulary's size, the start and the length
    checked against it (what the job and its dry run check first)."""
    check_start(config)
    model_config = described_model(config.model, vocab_size=vocab_size_of(config))
    if config.data.max_seq_length > model_config.max_length:
        raise ValueError(f"--config.data.max_seq_length={config.data.max_seq_length}: expected at most "
                         f"{model_config.max_length} (the model's max_position_embeddings)")
    return model_config


class PreTraining:
    """Pre-training's part of `bert_jax.training.trainer.run`: one run, in the workdir itself."""

    name = ""  # log lines carry no task name
    show_progress = True

    def __init__(self, config, is_main: bool):
        self.config, self.is_main = config, is_main
        self.model_config = checked_model_config(config)
        self.num_train_steps = config.num_train_steps
        self.mesh, self.rules = sh.config_mesh(config), config_rules(config)
        self.block = sh.process_block(self.mesh, self.rules, config.batch_size)
        self.data = make_input(config, "train", self.block)  # opens the input: a missing file fails here
        # Every evaluation reads the same held-out batches (the same dynamic masks too): a step's
        # numbers then depend on its parameters alone, not on how many evaluations came before it (the
        # cadence, a resume), and the collapse warning compares like with like against step 0.
        self.eval_data = None if eval_source(config) is None else \
            HeldOutBatches(make_input(config, "eval", self.block), config.eval_steps)
        if is_main and self.eval_data is not None and config.data.kind == "pretraining":  # shards (tf.data)
            from input_pipeline.pretraining.dataset import eval_repeats

            if warning := eval_repeats(config, jax.process_count()):  # what the dry run warns of too
                log.warning("%s", warning)
        self.monitor = health.HealthMonitor(warmup_steps=config.optimizer.warmup_steps, enabled=is_main,
                                            advice=health.advice(config.optimizer),
                                            total_steps=config.num_train_steps)
        self.batches = None
        self.last_eval: dict = {}
        # The masked labels of the training batches this process has read since it started: the
        # fitted unigram model the generator's warning compares against (`health.unigram_sign`).
        self.label_counts = health.LabelCounts(self.model_config.vocab_size)

    def runs(self, workdir) -> list[tuple[int, object]]:
        """One run, in the workdir itself."""
        return [(self.config.seed, workdir)]

    def build_steps(self, seed: int) -> Steps:
        """The jitted steps (`bert_jax.pretraining.objective.jit_pretraining_steps`)."""
        return jit_pretraining_steps(self.config, self.model_config, self.mesh)

    def initial_state(self, layout, seed: int) -> TrainState:
        """``init_checkpoint`` per ``init_mode``, else fresh (`bert_jax.pretraining.start.start_state`)."""
        return start_state(self.config, layout)

    def inputs(self, steps: Steps, seed: int, start: int, meta: dict | None, workdir):
        """The placed training batches from the restored position (``meta``: the checkpoint's).
        The collapse warning's reference: the step-0 evaluation (recorded like any other, so a
        resumed run reads it back)."""
        if meta is not None:
            per_process = meta.get("data_per_process") or [meta["data"]]
            if len(per_process) != self.block[1]:
                raise ValueError(f"{workdir}/checkpoints: saved by {len(per_process)} processes, resumed by "
                                 f"{self.block[1]}; the input position cannot be carried over")
            self.data.restore(per_process[self.block[0]])
        if self.is_main and start > 0:
            self.monitor.reference = step0_reference(workdir)
        placed = placing(self.config, self.mesh, self.rules, steps.accumulation_steps)

        def place(batch):
            return placed(self.label_counts.add(batch))

        if not self.config.prefetch_batches:
            return self.counted(map(place, self.data))
        from bert_jax.pretraining.prefetch import DevicePrefetch  # read, pack and place ahead while the step runs

        self.batches = DevicePrefetch(self.data, place, self.config.prefetch_batches)
        return self.counted(self.batches)

    def counted(self, batches):
        """``batches`` as they are, each one's labels counted as the step takes it (`health.LabelCounts`)."""
        for batch in batches:
            self.label_counts.commit()
            yield batch

    def meta(self, step: int) -> dict:
        """Every process's input position and the model, beside the state in each checkpoint."""
        states = gather_data_states((self.batches or self.data).state(), self.block[0])
        return {"data": states[0], "data_per_process": states, "step": step,
                "model": dataclasses.asdict(self.model_config)}

    def evaluation_due(self, step: int, total: int) -> bool:
        """At step 0, every ``eval_every`` steps and at the end, when there is held-out data."""
        return self.eval_data is not None and (step % self.config.eval_every == 0 or step == total)

    def evaluate(self, steps: Steps, state, step: int, writer, interrupted: Callable[[], bool]) -> bool:
        """The held-out metrics at ``step``, written and shown; False if a signal interrupted it."""
        result = held_out_metrics(steps.eval_fn, state, self.eval_data, self.mesh, self.rules, interrupted,
                                  self.label_counts.counts)
        if result is None:
            return False
        self.last_eval = result
        writer.write(step, result, "eval")
        if self.is_main:
            print(f"eval at step {step}: " + json.dumps({k: round(v, 4) for k, v in result.items()}), flush=True)
        if step == 0:
            self.monitor.reference = result
        self.monitor.check(step, result, "eval")
        return True

    def logged(self, step: int, summary: dict, first: dict | None) -> None:
        """After each logged window: the collapse warning. Without a step-0 evaluation its reference
        is the first step's metrics (the initial parameters on a training batch)."""
        if self.monitor.enabled and self.monitor.reference is None and first is not None:
            self.monitor.reference = {k: float(v) for k, v in jax.device_get(first).items()}
        self.monitor.check(step, summary, "train")

    def finish(self, steps: Steps, state, step: int, train: dict, writer, workdir) -> dict:
        """The last logged training and held-out metrics."""
        return {k: v for k, v in (("train", train), ("eval", self.last_eval)) if v}

    def summarize_runs(self, results: list[dict], workdir) -> dict:
        """The one run's results."""
        return results[0]

    def close(self) -> None:
        """Stops the prefetching thread."""
        if self.batches is not None:
            self.batches.close()
