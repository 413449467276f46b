"""The fine-tuning loop: ``run(config, workdir)`` for GLUE, SQuAD and NER (``configs/glue.py`` etc.).

``train.py`` calls `bert_jax.launch.run`, which hands configs with a ``task`` section to this
module. For each of ``config.seeds`` restarts (seeds ``seed, seed+1, ...``; run k in
``workdir/seed_<seed>`` when there are several) it builds the task model, restores the encoder from
``init_checkpoint`` (`bert_jax.finetuning.warm_start`; heads start fresh; empty = from scratch), trains
``num_train_epochs`` over the task's features with the paper's optimizer (warmup fraction then
linear decay), evaluates the task's eval splits with its official metric, and writes prediction
files for the eval and ``predict_splits``. Metrics go to TensorBoard and ``metrics.jsonl``;
``results.json`` in the workdir holds every seed's scores and their median/mean/min/max.

Batches are drawn without replacement, epoch e a permutation seeded by (seed, e), so the batch at
step s is a pure function of (seed, s): a run resumed from its checkpoint (saved every
``checkpoint_every`` steps, at the end and on SIGTERM) continues exactly. Each batch is cut to the
longest row's length rounded up to ``length_multiple`` (fewer FLOPs on short sentences; one
compilation per length).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
from pathlib import Path

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from bert_jax.finetuning import evaluation as fe
from bert_jax.finetuning import lengths
from bert_jax.finetuning import steps as fs
from bert_jax.model.config import BertConfig
from bert_jax.resolve import described_model
from bert_jax.training import sharding as sh
from bert_jax.training.checkpoints import Checkpointer
from bert_jax.training.job import Preemption, job
from bert_jax.training.loop import train_loop
from bert_jax.training.metric_writer import MetricWriter
from bert_jax.training.progress import Progress
from bert_jax.training.resume import resume
from bert_jax.training.steps import Steps, jit_steps

log = logging.getLogger(__name__)


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
        if cfg.vocab_size != vocab_size:
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


def build_steps(config, cfg: BertConfig, kind: str, num_labels: int, total: int, mesh: Mesh) -> Steps:
    """The task model and the paper's optimizer for ``total`` steps (warmup a fraction of them)
    through the shared builder (`bert_jax.training.steps.jit_steps`): what `train_one` runs, and
    what ahead-of-time compilation compiles."""
    opt = config.optimizer.to_dict()
    warmup = int(round(opt.pop("warmup_fraction") * total))
    rules = tuple(tuple(r) for r in config.sharding_rules)
    return jit_steps(functools.partial(fs.make_model, cfg, kind, num_labels),
                     {**opt, "warmup_steps": warmup, "num_train_steps": total}, mesh, rules,
                     functools.partial(fs.train_step, kind=kind), functools.partial(fs.eval_step, kind=kind))


def _initial_state(layout, ckpt: Checkpointer, seed: int, warm, restore: str, model: BertConfig | None = None):
    """The run's checkpoint that ``restore`` names (default the newest; exact resume; refused if
    another model than ``model`` saved it), else a new state whose encoder comes from the warm start
    (heads fresh), else a new state from scratch."""
    resumed = resume(ckpt, layout, restore, model)
    if resumed is not None:
        return resumed[0]
    if warm is None:
        return layout.create(seed)
    model = nnx.jit(lambda: layout.make_model(seed))()
    warm.load_encoder(model)
    return layout.from_params(nnx.state(model, nnx.Param).to_pure_dict())


def train_one(config, workdir: Path, seed: int, task, cfg: BertConfig, warm, data: dict,
              preemption: Preemption) -> dict:
    """One fine-tuning run (one seed) in ``workdir``; returns {split: metrics}."""
    train = data["train"]["features"]
    bs, mult = config.batch_size, config.length_multiple
    n = len(train["input_ids"])
    if n < bs:
        raise ValueError(f"{task.name}: {n} training features, fewer than one batch of {bs}")
    total = config.num_train_steps or math.ceil(config.num_train_epochs * n / bs)
    steps = build_steps(config, cfg, task.kind, task.num_labels, total, sh.make_mesh(tuple(config.mesh_shape)))
    layout, train_fn, eval_fn, mesh, rules = steps.layout, steps.train_fn, steps.eval_fn, steps.mesh, steps.rules
    is_main = jax.process_index() == 0
    ckpt = Checkpointer(workdir, keep=config.keep_checkpoints)
    writer = MetricWriter(workdir, enabled=is_main)
    try:
        state = _initial_state(layout, ckpt, seed, warm, config.restore, model=cfg)
        start = int(state.step)
        unpad = functools.partial(lengths.unpadded, multiple=config.unpad_multiple,
                                  shards=sh.batch_shards(mesh, rules))  # blocks on the real tokens only
        batches = (sh.global_batch_from_host(unpad(train_batch(train, step, bs, seed, mult,
                                                               config.length_groups)), mesh, rules)
                   for step in range(start, total))

        def after_step(state, step: int) -> None:
            if config.eval_every and step % config.eval_every == 0 and step < total:
                fe.evaluate_splits(task, state.params, data, eval_fn, config, mesh, rules, writer, step, None)

        result = train_loop(
            state, train_fn, batches, jax.random.key(seed, impl=config.rng_impl),
            total=total, ckpt=ckpt, writer=writer,
            progress=Progress(start, total, bs, enabled=is_main and config.progress),
            log_every=config.log_every, checkpoint_every=config.checkpoint_every,
            meta=lambda step: {"step": step, "seed": seed, "model": dataclasses.asdict(cfg)},
            after_step=after_step, name=task.name, preemption=preemption)
        if not result.interrupted and preemption.arrived():  # after the last step: the re-run evaluates
            ckpt.wait()
            ckpt.check_committed(result.step)
            log.warning("%s: %s received: saved a checkpoint at step %d; exiting (a re-run evaluates it)",
                        task.name, preemption.signal_name, result.step)
        if preemption.arrived():
            return {"interrupted_at_step": result.step}
        return fe.evaluate_splits(task, result.state.params, data, eval_fn, config, mesh, rules, writer,
                                  result.step, workdir / "predictions" if is_main else None)
    finally:
        ckpt.close()
        writer.close()


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


def _summary(per_seed: list[dict]) -> dict:
    from input_pipeline.tasks.glue_metrics import summarize_seeds

    out = {}
    for split in per_seed[0]:
        keys = [k for k in per_seed[0][split] if all(k in r.get(split, {}) for r in per_seed)]
        out[split] = {k: summarize_seeds([r[split][k] for r in per_seed]) for k in keys}
    return out


def run(config, workdir: str | Path, preemption=None) -> dict:
    """Fine-tunes per ``config`` (one run per seed); returns and writes ``results.json``."""
    with job(config, workdir, preemption) as j:
        return _run(config, j)


def _run(config, j) -> dict:
    from bert_jax.finetuning.warm_start import open_init_checkpoint
    from input_pipeline.package_data import resolve
    from input_pipeline.tasks import make_task
    from input_pipeline.tokenizers.factory import load_tokenizer

    config, workdir, is_main = j.config, j.workdir, j.is_main
    task = make_task(config.task)
    warm = open_init_checkpoint(config.init_checkpoint) if config.init_checkpoint else None
    vocab = config.vocab or (warm.vocab_file if warm is not None else None)
    if not vocab:
        raise ValueError("no vocabulary: set --config.vocab=PATH (or an init_checkpoint that has one)")
    tokenizer = load_tokenizer(resolve(vocab))
    cfg = model_config(config, warm, tokenizer.vocab_size, task.kind)
    if config.max_seq_length > cfg.max_length:
        raise ValueError(f"--config.max_seq_length={config.max_seq_length}: expected at most {cfg.max_length} "
                         f"(max_position_embeddings of {config.init_checkpoint or 'the model'})")
    data = load_data(config, task, tokenizer)
    seeds = [config.seed + i for i in range(config.seeds)]
    per_seed = []
    for seed in seeds:
        run_dir = workdir / f"seed_{seed}" if len(seeds) > 1 else workdir
        if len(seeds) > 1 and is_main:
            print(f"--- {task.name}: seed {seed} ({len(per_seed) + 1}/{len(seeds)}) ---", flush=True)
        result = train_one(config, run_dir, seed, task, cfg, warm, data, j.preemption)
        if "interrupted_at_step" in result:
            return result
        per_seed.append(result)
    results = {"task": task.name, "init_checkpoint": config.init_checkpoint or "scratch", "seeds": seeds,
               "per_seed": per_seed, "summary": _summary(per_seed) if per_seed and per_seed[0] else {}}
    if is_main:
        (workdir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        if len(seeds) > 1:
            for split, metrics in results["summary"].items():
                for k, s in metrics.items():
                    print(f"{task.name} {split} {k}: median {s['median']:.4f} mean {s['mean']:.4f} "
                          f"min {s['min']:.4f} max {s['max']:.4f} (n={s['n']})", flush=True)
    return results
