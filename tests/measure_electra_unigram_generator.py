r"""Measures ELECTRA's ``runlocal`` discriminator against a generator that samples the unigram
distribution from step 0: the generator's MLM output bias starts at the log frequencies of the
training split's masked labels (one pass), so its samples skip the early phase of near-uniform
tokens that token identity alone detects. docs/records.md, "The runlocal recipes", has the figures.

    python tests/measure_electra_unigram_generator.py --workdir /tmp/electra_unigram --lr 5e-4 --steps 1000
    python tests/measure_electra_unigram_generator.py --workdir /tmp/eu --lr 1e-3 --generator_lr_scale 0.5 \
        --rtd_prior 0.15
    python tests/measure_electra_unigram_generator.py --workdir /tmp/eu0 --lr 1e-3 --steps 600 \
        --set model.hidden_dropout_prob=0 --set model.attention_dropout_prob=0
    python tests/measure_electra_unigram_generator.py --workdir /tmp/pre --start fresh --lr 1e-3 --steps 600 \
        --set model.hidden_dropout_prob=0 --set model.attention_dropout_prob=0 --set model.norm_position=pre

Runs the trainer as ``train.py --config configs/pretrain.py:model=electra,runlocal,scratch`` does
(the one-stage recipe these figures were measured on), with the generator's own tables
(``electra.tie_embeddings=False``), 10% warmup, and the held-out metrics in WORKDIR/metrics.jsonl.
``--start fresh`` keeps the generator's usual start (the comparison runs). ``--set KEY=VALUE``
(repeatable) sets any other config key, or a `BertConfig` field in ``model.``. ``--encoder_from
WORKDIR`` starts the discriminator's encoder from a masked LM's workdir (joint ELECTRA training
warm-started from a masked-LM encoder), e.g. ModernBERT's ``runlocal`` with ``--set
model.size=modernbert-tiny --set model.embedding_size=None``: the measurement behind
``model=electra,runlocal``, which the trainer now runs itself (``init_mode=encoder``).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).parents[1]


def log_frequencies(config) -> np.ndarray:
    """Centred log frequencies (add-one) of the masked labels in one pass over the training split."""
    from input_pipeline.pretraining.dataset import make_pretraining_dataset

    counts = np.ones(config.model.vocab_size)
    data = make_pretraining_dataset(config, split="train", batch_size=config.batch_size)
    while True:
        batch = next(data)
        if data.state()["epoch"] >= 1:
            break
        weights = np.asarray(batch["masked_lm_weights"]) > 0
        np.add.at(counts, np.asarray(batch["masked_lm_ids"])[weights], 1)
    log_q = np.log(counts / counts.sum()).astype(np.float32)
    return log_q - log_q.mean()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--generator_lr_scale", type=float, default=1.0)
    parser.add_argument("--rtd_prior", type=float, default=0.0)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--start", choices=("unigram", "fresh"), default="unigram",
                        help="the generator's output bias: the log frequencies, or as the trainer starts it")
    parser.add_argument("--encoder_from", metavar="WORKDIR",
                        help="start the discriminator's encoder from a masked LM's pre-training workdir")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="another config key, e.g. model.hidden_dropout_prob=0")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import jax
    from flax import traverse_util

    from bert_jax import launch
    from bert_jax.config_args import load_config_file
    from bert_jax.pretraining import task as pretraining_task
    from bert_jax.pretraining.start import start_state

    config = load_config_file("pretrain", "model=electra,runlocal,scratch")
    config.electra.tie_embeddings = False
    config.electra.rtd_prior = args.rtd_prior
    config.optimizer.learning_rate = args.lr
    config.optimizer.generator_lr_scale = args.generator_lr_scale
    config.num_train_steps = config.optimizer.num_train_steps = args.steps
    config.optimizer.warmup_steps = args.steps // 10
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set {item!r}: expected KEY=VALUE")
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):  # a bare word: a string
            pass
        *path, last = key.split(".")
        node = config
        for part in path:
            node = node[part]
        node[last] = value  # a new key where the section has none (model.norm_position)
    if args.encoder_from:  # the trainer's own warm start (init_mode=encoder)
        config.init_checkpoint, config.init_mode = args.encoder_from, "encoder"
    if args.start == "fresh":
        launch.run(config, args.workdir)
        return
    log_q = log_frequencies(config)
    fresh = start_state

    def start(cfg, layout):
        state = fresh(cfg, layout)
        flat = traverse_util.flatten_dict(state.params, sep="/")
        bias = flat["mlm/output_bias"]  # the generator's MLM head (GENERATOR_PARAMS)
        flat["mlm/output_bias"] = jax.device_put(np.asarray(log_q[: bias.shape[0]], bias.dtype), bias.sharding)
        return dataclasses.replace(state, params=traverse_util.unflatten_dict(flat, sep="/"))

    pretraining_task.start_state = start  # this measurement only: the trainer's own start otherwise
    launch.run(config, args.workdir)


if __name__ == "__main__":
    main()
