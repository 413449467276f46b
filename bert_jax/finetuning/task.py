"""Fine-tuning as a task of the trainer (`bert_jax.training.trainer`): ``FineTuning``, for GLUE,
SQuAD, NER and the demo's reviews (configs/glue.py, squad.py, ner.py, sentiment.py).

For each of ``config.seeds`` restarts (seeds ``seed, seed+1, ...``; run k in ``workdir/seed_<seed>``
when there are several) the trainer builds the task model, restores the encoder from
``init_checkpoint`` (`bert_jax.finetuning.warm_start`; heads start fresh; empty = from scratch),
trains ``num_train_epochs`` over the task's features, evaluates the task's eval splits with its
official metric and writes prediction files for the eval and ``predict_splits``; ``results.json``
in the workdir holds every seed's scores and their median/mean/min/max.

The steps for the four task kinds (see ``input_pipeline/tasks/base.py``):

| kind | model | output | loss |
|---|---|---|---|
| classification | `BertClassifier` (pooled [CLS]) | logits [B, C] | cross-entropy on ``label`` |
| regression | `BertClassifier` with 1 label | predictions [B] | mean squared error on ``label`` |
| tagging | `BertTagger` | logits [B, L, C] | cross-entropy on ``label_ids`` where ``label_mask`` |
| span | `BertForQuestionAnswering` | start/end logits [B, L] | mean of start and end cross-entropy |

Every batch carries ``weight`` [B] (1 real row, 0 padding) so a padded last eval batch counts only
its real rows, and may carry ``token_index`` [shards, tokens] (``config.unpad_multiple``,
`bert_jax.finetuning.lengths`): then the encoder's blocks run on the real tokens only, with the same
outputs. Batches are drawn without replacement, epoch e a permutation seeded by (seed, e), so the
batch at step s is a pure function of (seed, s): a resumed run continues exactly. Each batch is cut
to the longest row's length rounded up to ``length_multiple``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh

from bert_jax.finetuning import evaluation as fe
from bert_jax.finetuning import lengths
from bert_jax.model.config import BertConfig
from bert_jax.model.models import BertClassifier, BertForQuestionAnswering, BertTagger
from bert_jax.resolve import described_model
from bert_jax.training import compiler_options
from bert_jax.training import sharding as sh
from bert_jax.training import steps as steps_lib
from bert_jax.training.sharding_rules import config_rules
from bert_jax.training.steps import Steps, TrainState, accumulation_steps, jit_steps
from input_pipeline.tasks.base import KINDS

log = logging.getLogger(__name__)


def make_model(cfg: BertConfig, kind: str, num_labels: int, seed: int) -> nnx.Module:
    """The task model (eager construction; call under `jax.jit`/`nnx.jit` or `jax.eval_shape`)."""
    rngs = nnx.Rngs(seed)
    if kind == "classification":
        return BertClassifier(cfg, num_labels, rngs=rngs)
    if kind == "regression":
        return BertClassifier(cfg, 1, rngs=rngs)
    if kind == "tagging":
        return BertTagger(cfg, num_labels, rngs=rngs)
    if kind == "span":
        return BertForQuestionAnswering(cfg, rngs=rngs)
    raise ValueError(f"unknown task kind {kind!r}; expected one of {KINDS}")


def forward(params, graphdef, batch, rng, kind: str, deterministic: bool) -> dict[str, jax.Array]:
    model = nnx.merge(graphdef, params)
    rngs = None if deterministic else nnx.Rngs(dropout=rng)
    args = (batch["input_ids"], batch["input_mask"], batch["segment_ids"])
    kw = dict(deterministic=deterministic, rngs=rngs, token_index=batch.get("token_index"))  # unpadded blocks
    if kind == "span":
        start, end = model(*args, **kw)
        return {"start_logits": start, "end_logits": end}  # [batch, length] each
    out = model(*args, **kw)
    if kind == "regression":
        return {"predictions": out[:, 0]}  # [batch]
    return {"logits": out}  # [batch, labels] or [batch, length, labels]


def losses(out: dict, batch: dict, kind: str) -> dict[str, jax.Array]:
    """Sums over the batch (``loss_sum`` / ``count``, and ``correct`` where it means something)."""
    w = batch["weight"].astype(jnp.float32)  # [batch]
    if kind == "classification":
        logits, labels = out["logits"], batch["label"]  # [batch, labels], [batch]
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)  # [batch]
        correct = (jnp.argmax(logits, -1) == labels) * w
        return {"loss_sum": (ce * w).sum(), "count": w.sum(), "correct": correct.sum()}
    if kind == "regression":
        err = (out["predictions"] - batch["label"].astype(jnp.float32)) ** 2  # [batch]
        return {"loss_sum": (err * w).sum(), "count": w.sum()}
    if kind == "tagging":
        logits, labels = out["logits"], batch["label_ids"]  # [batch, length, labels], [batch, length]
        tw = batch["label_mask"].astype(jnp.float32) * w[:, None]  # [batch, length]
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)  # [batch, length]
        correct = (jnp.argmax(logits, -1) == labels) * tw
        return {"loss_sum": (ce * tw).sum(), "count": tw.sum(), "correct": correct.sum()}
    ce = sum(optax.softmax_cross_entropy_with_integer_labels(out[f"{s}_logits"], batch[f"{s}_positions"])
             for s in ("start", "end")) / 2  # [batch]
    return {"loss_sum": (ce * w).sum(), "count": w.sum()}


def metrics_from_sums(sums: dict) -> dict:
    """Sums (over micro-batches) → the mean loss and accuracy."""
    out = {"loss": sums["loss_sum"] / jnp.maximum(sums["count"], 1e-9)}
    if "correct" in sums:
        out["accuracy"] = sums["correct"] / jnp.maximum(sums["count"], 1e-9)
    return out


def denominators(batch: dict, kind: str) -> dict[str, jax.Array]:
    """What the loss divides by, over the whole batch: its real rows (tagging: its labelled tokens)."""
    w = batch["weight"].astype(jnp.float32)  # [batch]
    if kind == "tagging":
        return {"count": (batch["label_mask"].astype(jnp.float32) * w[:, None]).sum()}
    return {"count": w.sum()}


def _loss(params, graphdef, batch, rng, whole: dict | None, kind: str):
    sums = losses(forward(params, graphdef, batch, rng, kind, False), batch, kind)
    d = sums if whole is None else whole  # this batch's count, or the whole batch's (micro-batches)
    return sums["loss_sum"] / jnp.maximum(d["count"], 1e-9), sums


def train_step(state: TrainState, batch: dict, rng: jax.Array, *, graphdef, tx, schedule, kind: str,
               accumulation_steps: int = 1, norm: Callable = optax.tree.norm) -> tuple[TrainState, dict]:
    """One optimizer step on the mean loss of the batch's real rows (`bert_jax.training.steps.train_step`:
    the same micro-batches as pre-training); dropout key = rng ⊕ step."""
    return steps_lib.train_step(state, batch, rng, graphdef=graphdef, tx=tx, schedule=schedule,
                                loss=functools.partial(_loss, kind=kind),
                                denominators=functools.partial(denominators, kind=kind), summarize=metrics_from_sums,
                                accumulation_steps=accumulation_steps, norm=norm)


def eval_step(params: dict, batch: dict, *, graphdef, kind: str) -> tuple[dict, dict]:
    """Deterministic outputs for a batch (the task post-processes them) and the loss sums (test
    splits have all-zero labels: their sums mean nothing and are ignored)."""
    out = forward(params, graphdef, batch, None, kind, True)
    return out, losses(out, batch, kind)


def model_config(config, warm, vocab_size: int, kind: str) -> BertConfig:
    """The checkpoint's shapes (or ``config.model.size`` from scratch) with the execution fields of
    ``config.model`` (dropout, dtype, scan, remat) replaced."""
    if warm is None:
        cfg = described_model(config.model, vocab_size=vocab_size)
    else:
        overrides = {k: v for k, v in config.model.items() if k != "size" and v is not None}
        shape_fields = {"vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                        "max_position_embeddings", "type_vocab_size"}
        cfg = dataclasses.replace(warm.config, **{k: v for k, v in overrides.items() if k not in shape_fields})
        if cfg.vocab_size != vocab_size and not (cfg.rotary and vocab_size < cfg.vocab_size):  # ModernBERT pads
            raise ValueError(f"init_checkpoint {warm.spec!r} has vocab_size={cfg.vocab_size} but the vocabulary "
                             f"{config.vocab or warm.vocab_file!r} has {vocab_size} tokens")
    if kind in ("classification", "regression") and cfg.classifier_pooling == "cls" and not cfg.use_pooler:
        cfg = dataclasses.replace(cfg, use_pooler=True)  # the classifier reads the pooled [CLS]
    return cfg


def train_batch(features: dict, step: int, batch_size: int, seed: int, length_multiple: int,
                length_groups: int = 0) -> dict:
    idx = lengths.train_rows(lengths.real_lengths(features), step, batch_size, seed, length_groups)
    keep = ("input_ids", "input_mask", "segment_ids", *(k for k in features if k in fe.LABEL_KEYS))
    batch = fe.cut_rows({k: features[k] for k in keep}, idx, length_multiple, features["input_ids"].shape[1])
    batch["weight"] = np.ones([batch_size], np.float32)
    return batch


def jit_finetuning_steps(config, cfg: BertConfig, kind: str, num_labels: int, total: int, mesh: Mesh) -> Steps:
    """The task model and the paper's optimizer for ``total`` steps (warmup a fraction of them)
    through the shared builder (`bert_jax.training.steps.jit_steps`): what the trainer runs, and
    what ahead-of-time compilation compiles."""
    opt = config.optimizer.to_dict()
    warmup = int(round(opt.pop("warmup_fraction") * total))
    rules = config_rules(config)
    accumulation = accumulation_steps(config, mesh, rules)
    if accumulation > 1 and config.unpad_multiple:
        raise ValueError("config.unpad_multiple does not go with micro-batches: set per_device_batch=0 or "
                         "unpad_multiple=0")
    return jit_steps(functools.partial(make_model, cfg, kind, num_labels),
                     {**opt, "warmup_steps": warmup, "num_train_steps": total}, mesh, rules,
                     functools.partial(train_step, kind=kind, accumulation_steps=accumulation),
                     functools.partial(eval_step, kind=kind), accumulation, config.get("global_norm", "per_leaf"),
                     compiler_options.of_config(config))


def load_data(config, task, tokenizer) -> dict:
    """{split: {"examples", "features"}} for train, the eval splits and the predict splits (a
    predict split whose file is missing is skipped with a warning)."""
    data = {}
    for split in ("train", *task.eval_splits, *config.predict_splits):
        if split in data:
            continue
        try:
            examples = task.load(split)
        except FileNotFoundError as e:
            if split in config.predict_splits and split not in task.eval_splits and split != "train":
                log.warning("no predictions for %s: %s", split, e)
                continue
            raise
        if split == "train" and config.max_train_examples:
            examples = examples[: config.max_train_examples]
        if config.max_eval_examples and split != "train":
            examples = examples[: config.max_eval_examples]
        features = task.featurize(examples, tokenizer, config.max_seq_length)
        log.info("%s %s: %d examples → %d features", task.name, split, len(examples), len(features["input_ids"]))
        data[split] = {"examples": examples, "features": features}
    return data


class FineTuning:
    """Fine-tuning's part of `bert_jax.training.trainer.run`: one run a seed."""

    def __init__(self, config, is_main: bool):
        from bert_jax.finetuning.warm_start import open_init_checkpoint
        from input_pipeline.package_data import locate
        from input_pipeline.tasks import make_task
        from input_pipeline.tokenizers.factory import load_tokenizer

        self.config, self.is_main = config, is_main
        self.spec = make_task(config.task)  # the task's files, features, labels and metric (input_pipeline.tasks)
        self.name = self.spec.name
        self.warm = open_init_checkpoint(config.init_checkpoint) if config.init_checkpoint else None
        vocab = config.vocab or (self.warm.vocab_file if self.warm is not None else None)
        if not vocab:
            raise ValueError("no vocabulary: set --config.vocab=PATH (or an init_checkpoint that has one)")
        tokenizer = load_tokenizer(locate(vocab))
        self.model_config = model_config(config, self.warm, tokenizer.vocab_size, self.spec.kind)
        if config.max_seq_length > self.model_config.max_length:
            raise ValueError(f"--config.max_seq_length={config.max_seq_length}: expected at most "
                             f"{self.model_config.max_length} (max_position_embeddings of "
                             f"{config.init_checkpoint or 'the model'})")
        self.data = load_data(config, self.spec, tokenizer)
        self.train = self.data["train"]["features"]
        n = len(self.train["input_ids"])
        if n < config.batch_size:
            raise ValueError(f"{self.name}: {n} training features, fewer than one batch of {config.batch_size}")
        self.num_train_steps = config.num_train_steps or math.ceil(config.num_train_epochs * n / config.batch_size)
        self.mesh, self.rules = sh.config_mesh(config), config_rules(config)
        self.seed = config.seed
        self.show_progress = config.progress

    def runs(self, workdir) -> list[tuple[int, object]]:
        """One run a seed, each in ``workdir/seed_<seed>`` when there are several."""
        seeds = [self.config.seed + i for i in range(self.config.seeds)]
        return [(seed, workdir / f"seed_{seed}" if len(seeds) > 1 else workdir) for seed in seeds]

    def build_steps(self, seed: int) -> Steps:
        """The task model's jitted steps (`jit_finetuning_steps`)."""
        if self.config.seeds > 1 and self.is_main:
            i = seed - self.config.seed
            print(f"--- {self.name}: seed {seed} ({i + 1}/{self.config.seeds}) ---", flush=True)
        self.seed = seed
        return jit_finetuning_steps(self.config, self.model_config, self.spec.kind, self.spec.num_labels,
                                    self.num_train_steps, self.mesh)

    def initial_state(self, layout, seed: int) -> TrainState:
        """A new state whose encoder comes from the warm start (heads fresh), else from scratch."""
        if self.warm is None:
            return layout.create(seed)
        model = nnx.jit(lambda: layout.make_model(seed))()
        self.warm.load_encoder(model)
        return layout.from_params(nnx.to_pure_dict(nnx.state(model, nnx.Param)))

    def inputs(self, steps: Steps, seed: int, start: int, meta: dict | None, workdir):
        """Batch s is a pure function of (seed, s): nothing to restore but the step."""
        c = self.config
        shards = sh.batch_shards(self.mesh, self.rules)
        for step in range(start, self.num_train_steps):
            batch = train_batch(self.train, step, c.batch_size, seed, c.length_multiple, c.length_groups)
            yield sh.global_batch_from_host(lengths.unpadded(batch, c.unpad_multiple, shards), self.mesh, self.rules)

    def meta(self, step: int) -> dict:
        """The seed and the model, beside the state in each checkpoint."""
        return {"step": step, "seed": self.seed, "model": dataclasses.asdict(self.model_config)}

    def evaluation_due(self, step: int, total: int) -> bool:
        """Every ``eval_every`` steps (0: never) before the end (`finish` evaluates at the end)."""
        return bool(self.config.eval_every) and step % self.config.eval_every == 0 and step < total

    def evaluate(self, steps: Steps, state, step: int, writer, interrupted) -> bool:
        """The eval splits' metrics at ``step``, written (no prediction files)."""
        fe.evaluate_splits(self.spec, state.params, self.data, steps.eval_fn, self.config, self.mesh, self.rules,
                           writer, step, None)
        return True

    def logged(self, step: int, summary: dict, first: dict | None) -> None:
        """Nothing to watch after a logging window."""

    def finish(self, steps: Steps, state, step: int, train: dict, writer, workdir) -> dict:
        """The eval splits' metrics at the end, prediction files written."""
        return fe.evaluate_splits(self.spec, state.params, self.data, steps.eval_fn, self.config, self.mesh,
                                  self.rules, writer, step, workdir / "predictions" if self.is_main else None)

    def summarize_runs(self, results: list[dict], workdir) -> dict:
        """``results.json``: every seed's scores and their median/mean/min/max."""
        from input_pipeline.tasks.glue_metrics import summarize_seeds

        summary = {}
        if results and results[0]:
            for split in results[0]:
                keys = [k for k in results[0][split] if all(k in r.get(split, {}) for r in results)]
                summary[split] = {k: summarize_seeds([r[split][k] for r in results]) for k in keys}
        seeds = [s for s, _ in self.runs(workdir)]
        report = {"task": self.name, "init_checkpoint": self.config.init_checkpoint or "scratch", "seeds": seeds,
                  "per_seed": results, "summary": summary}
        if self.is_main:
            (workdir / "results.json").write_text(json.dumps(report, indent=2) + "\n")
            if len(seeds) > 1:
                for split, metrics in summary.items():
                    for k, s in metrics.items():
                        print(f"{self.name} {split} {k}: median {s['median']:.4f} mean {s['mean']:.4f} "
                              f"min {s['min']:.4f} max {s['max']:.4f} (n={s['n']})", flush=True)
        return report

    def close(self) -> None:
        """Nothing held open: the features are in memory."""
