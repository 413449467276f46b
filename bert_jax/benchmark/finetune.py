"""``python -m bert_jax.benchmark.finetune``: fine-tuning examples/s on real lengths, the trainer's
padded batches against unpadded and length-grouped ones, taking turns in one run.

    python -m bert_jax.benchmark.finetune --lengths reviews --size base --batch_size 32
    python -m bert_jax.benchmark.finetune --lengths squad --size base --batch_size 32 --max_seq_length 384

Lengths (``--lengths``):

* ``reviews``: the demo's movie-review sentences (vaderSentiment, input_pipeline/tasks/sentiment.py),
  featurized as the trainer does with ``--vocab`` (default: a WordPiece vocabulary of 8000 tokens
  learned from the training sentences, cached); classification, GLUE-style single sentences.
* ``squad``: SYNTHETIC SQuAD-style span features (no SQuAD text is read): question and paragraph
  lengths in WordPiece tokens drawn from log-normals around SQuAD v1.1's averages (a question of ~13
  tokens, a paragraph of ~150), paragraphs longer than the window split with a stride of 128 tokens.

Modes (``--modes``; each is the trainer with one config switch, bert_jax/finetuning/lengths.py):
``padded`` (batches cut to their longest row: what fine-tuning did before), ``unpadded``
(``unpad_multiple``), ``grouped`` (``length_groups`` for training, ``eval_by_length`` for evaluation)
and ``grouped_unpadded`` (both). Every mode trains on the same pool of ``--train_steps`` batches of
training rows (drawn at random, once): one epoch of the pool, in random batches or, grouped, sorted
by length into batches (groups of ``--train_steps`` batches, fewer than the config's usual 50, so
it understates grouping; ``epoch_real_fraction`` reports each mode's real tokens per slot over a
whole epoch of the training split with ``--length_groups``). Each mode also evaluates ``--eval_rows``
rows. A first round compiles every shape the modes meet (untimed; its seconds are reported), then
``--rounds`` rounds take the modes in turn; the result is each mode's median examples/s and its
ratio to ``padded``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

import jax
import numpy as np

from bert_jax.config_args import load_config_file
from bert_jax.finetuning import evaluation as fe
from bert_jax.finetuning import lengths
from bert_jax.finetuning.trainer import build_steps, train_batch
from bert_jax.model.config import BertConfig
from bert_jax.training import sharding as sh
from input_pipeline import command_line as cli
from input_pipeline.tasks.base import feature_shapes

log = logging.getLogger(__name__)
MODES = ("padded", "unpadded", "grouped", "grouped_unpadded")


def parse_args(argv=None) -> argparse.Namespace:
    p = cli.ArgumentParser(prog="python -m bert_jax.benchmark.finetune", description=__doc__.split("\n\n")[1],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", default="reviews", choices=("reviews", "squad"))
    p.add_argument("--size", default="base", help="tiny | mini | small | medium | base | large")
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--eval_batch_size", type=int, default=64)
    p.add_argument("--max_seq_length", type=int, default=None, help="default: 128 (reviews), 384 (squad)")
    p.add_argument("--length_multiple", type=int, default=None, help="default: 16 (reviews), 32 (squad): the configs'")
    p.add_argument("--unpad_multiple", type=int, default=64, help="the unpadded modes' config.unpad_multiple")
    p.add_argument("--length_groups", type=int, default=50,
                   help="the config's length_groups for epoch_real_fraction (the timed pool is one group)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma list of {', '.join(MODES)}")
    p.add_argument("--train_steps", type=int, default=8, help="timed training steps per mode and round")
    p.add_argument("--eval_rows", type=int, default=512, help="rows of the timed evaluation pass")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--vocab", default="", help="reviews: the vocabulary (default: learned from the sentences)")
    p.add_argument("--vocab_size", type=int, default=30522, help="the model's (the ids are the data's)")
    p.add_argument("--mesh", default="-1,1,1", help="(data, fsdp, tensor); -1 = the remaining devices")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the JSON result instead of a table")
    p.add_argument("--output", default="", metavar="PATH", help="append the result to PATH as a JSON line")
    a = p.parse_args(argv)
    modes = [m for m in a.modes.split(",") if m]
    if not modes or set(modes) - set(MODES):
        p.error(f"--modes {a.modes}: expected a comma list of {', '.join(MODES)}")
    a.modes = modes
    a.max_seq_length = a.max_seq_length or (128 if a.lengths == "reviews" else 384)
    a.length_multiple = a.length_multiple or (16 if a.lengths == "reviews" else 32)
    for name in ("batch_size", "eval_batch_size", "train_steps", "eval_rows", "rounds", "max_seq_length"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(a, name)}")
    return a


def review_vocab(train_texts: list[str]) -> str:
    """An 8000-token WordPiece vocabulary learned from the training sentences (cached)."""
    from input_pipeline.build_vocab import train_vocab
    from input_pipeline.package_data import cache_dir

    out = cache_dir() / "benchmark" / "review_vocab_8000"
    if not (out / "vocab.txt").exists():
        out.mkdir(parents=True, exist_ok=True)
        corpus = out / "sentences.txt"
        corpus.write_text("\n\n".join(train_texts) + "\n")
        train_vocab(str(corpus), out, model_type="wordpiece", vocab_size=8000)
    return str(out / "vocab.txt")


def review_features(args) -> tuple[dict, dict, str]:
    """(train, dev features) of the demo's review sentences, and where their lengths come from."""
    from input_pipeline.tasks import make_task
    from input_pipeline.tokenizers.factory import load_tokenizer

    task = make_task(load_config_file("sentiment", "").task)
    train, dev = task.load("train"), task.load("dev")
    vocab = args.vocab or review_vocab([e.text for e in train])
    tok = load_tokenizer(vocab)
    source = f"vaderSentiment movie-review sentences ({len(train)} train, {len(dev)} dev), vocabulary {vocab}"
    return task.featurize(train, tok, args.max_seq_length), task.featurize(dev, tok, args.max_seq_length), source


def squad_lengths(n: int, max_len: int, rng: np.random.Generator, stride: int = 128) -> np.ndarray:
    """SYNTHETIC: the real lengths of the span features of ``n`` question-paragraph pairs (see the
    module docstring), each paragraph split into windows of the room left after the question."""
    out = []
    while len(out) < n:
        q = int(np.clip(round(rng.lognormal(np.log(13), 0.35)), 4, 64))
        ctx = int(np.clip(round(rng.lognormal(np.log(150), 0.5)), 20, 2000))
        room = max_len - q - 3
        start = 0
        while True:
            take = min(room, ctx - start)
            out.append(q + take + 3)
            if start + take >= ctx:
                break
            start += min(stride, room)
    return np.asarray(out[:n])


def synthetic_features(kind: str, real: np.ndarray, max_len: int, vocab_size: int, seed: int) -> dict:
    """Features of ``kind`` with these real lengths: random ids, labels inside the real tokens."""
    rng = np.random.default_rng(seed)
    n = len(real)
    mask = (np.arange(max_len)[None] < real[:, None]).astype(np.int32)  # [rows, length]
    f = {k: np.zeros(s, d) for k, (s, d) in feature_shapes(kind, n, max_len).items()}
    f["input_ids"] = rng.integers(5, vocab_size, (n, max_len)).astype(np.int32) * mask
    f["input_mask"] = mask
    if kind == "span":
        f["start_positions"] = rng.integers(1, real).astype(np.int32)
        f["end_positions"] = np.minimum(f["start_positions"] + 2, real - 1).astype(np.int32)
    else:
        f["label"] = rng.integers(0, 2, n).astype(np.int32)
    return f


def timed(fn) -> float:
    t = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - t


class Runner:
    """The trainer's jitted steps for the task and the passes each mode times."""

    def __init__(self, args, kind: str, train: dict, dev: dict):
        self.args, self.kind, self.train, self.dev = args, kind, train, dev
        config = load_config_file("sentiment" if kind == "classification" else "squad", "")
        cfg = BertConfig.from_size(args.size, vocab_size=args.vocab_size, dropout_impl="auto",
                                   max_position_embeddings=max(512, args.max_seq_length))
        cfg = cfg.for_platform(jax.default_backend())
        shape = tuple(int(x) for x in args.mesh.split(","))
        self.mesh = sh.make_mesh(shape, jax.devices() if -1 in shape else jax.devices()[: int(np.prod(shape))])
        self.steps = build_steps(config, cfg, kind, 2, 1000, self.mesh)
        self.shards = sh.batch_shards(self.mesh, self.steps.rules)
        self.state = self.steps.layout.create(args.seed)
        self.rng = jax.random.key(args.seed)

    def batches(self, mode: str, features: dict, steps: int, groups: int) -> list[dict]:
        """One epoch (``steps`` batches) of ``features`` as the trainer draws it in ``mode``."""
        a = self.args
        groups = groups if mode.startswith("grouped") else 0
        unpad = a.unpad_multiple if mode.endswith("unpadded") else 0
        return [lengths.unpadded(train_batch(features, s, a.batch_size, a.seed, a.length_multiple, groups),
                                 unpad, self.shards) for s in range(steps)]

    def train_pass(self, batches: list[dict]) -> float:
        def run():
            for b in batches:
                self.state, metrics = self.steps.train_fn(
                    self.state, sh.global_batch_from_host(b, self.mesh, self.steps.rules), self.rng)
            return metrics

        return timed(run)

    def eval_pass(self, mode: str) -> float:
        a = self.args
        return timed(lambda: fe.predict(
            self.steps.eval_fn, self.state.params, self.dev, self.kind, a.eval_batch_size, a.length_multiple,
            self.mesh, self.steps.rules, by_length=mode.startswith("grouped"),
            unpad_multiple=a.unpad_multiple if mode.endswith("unpadded") else 0)[0])


def slots(batches: list[dict]) -> float:
    """Real tokens / positions the blocks run on (token_index slots when unpadded)."""
    real = sum(int(b["input_mask"].sum()) for b in batches)
    run = sum(b["token_index"].size if "token_index" in b else b["input_mask"].size for b in batches)
    return real / run


def main(argv=None) -> dict:
    a = parse_args(argv)
    if a.lengths == "reviews":
        kind, (train, dev, source) = "classification", review_features(a)
    else:
        kind, rng = "span", np.random.default_rng(a.seed)
        train = synthetic_features("span", squad_lengths(50 * a.batch_size * a.train_steps, a.max_seq_length, rng),
                                   a.max_seq_length, a.vocab_size, a.seed)
        dev = synthetic_features("span", squad_lengths(a.eval_rows, a.max_seq_length, rng), a.max_seq_length,
                                 a.vocab_size, a.seed + 1)
        source = "SYNTHETIC SQuAD-style lengths (log-normal question ~13 and paragraph ~150 tokens, stride 128)"
    dev = {k: v[: a.eval_rows] for k, v in dev.items()}
    runner = Runner(a, kind, train, dev)
    pool_size = a.batch_size * a.train_steps
    if len(train["input_ids"]) < pool_size:
        raise ValueError(f"{len(train['input_ids'])} training rows, fewer than --train_steps x --batch_size")
    pick = np.sort(np.random.default_rng(a.seed).choice(len(train["input_ids"]), pool_size, replace=False))
    pool = {k: v[pick] for k, v in train.items()}
    batches = {m: runner.batches(m, pool, a.train_steps, a.train_steps) for m in a.modes}
    epoch = len(train["input_ids"]) // a.batch_size
    epoch_batches = {m: runner.batches(m, train, epoch, a.length_groups) for m in a.modes}
    epoch_fraction = {m: slots(b) for m, b in epoch_batches.items()}
    # How many step programs an epoch compiles: one per distinct set of shapes.
    epoch_shapes = {m: len({tuple(sorted((k, v.shape) for k, v in x.items())) for x in b})
                    for m, b in epoch_batches.items()}
    compile_s = {}
    for m in a.modes:  # the untimed first round: every shape compiles
        compile_s[m] = round(runner.train_pass(batches[m]) + runner.eval_pass(m), 2)
        print(f"first round (compiles) {m}: {compile_s[m]:.1f} s", file=sys.stderr, flush=True)
    times: dict[str, dict[str, list[float]]] = {m: {"train": [], "eval": []} for m in a.modes}
    for r in range(a.rounds):
        for m in a.modes[r % len(a.modes):] + a.modes[: r % len(a.modes)]:  # a different mode starts each round
            times[m]["train"].append(runner.train_pass(batches[m]))
            times[m]["eval"].append(runner.eval_pass(m))
            t = times[m]
            print(f"round {r + 1}/{a.rounds} {m}: train {t['train'][-1]:.2f} s, eval {t['eval'][-1]:.2f} s",
                  file=sys.stderr, flush=True)
    rows = len(dev["input_ids"])
    result = {"lengths": a.lengths, "source": source, "size": a.size, "kind": kind, "batch_size": a.batch_size,
              "eval_batch_size": a.eval_batch_size, "max_seq_length": a.max_seq_length,
              "length_multiple": a.length_multiple, "unpad_multiple": a.unpad_multiple,
              "length_groups": a.length_groups, "train_steps": a.train_steps, "eval_rows": rows, "rounds": a.rounds,
              "mean_real_tokens": round(float(lengths.real_lengths(train).mean()), 1),
              "device": f"{len(jax.devices())} x {jax.devices()[0].device_kind}",
              "load_average": [round(x, 2) for x in os.getloadavg()], "modes": {}}
    speed = {m: (a.batch_size * a.train_steps / float(np.median(times[m]["train"])),
                 rows / float(np.median(times[m]["eval"]))) for m in a.modes}  # examples/s, unrounded
    for m in a.modes:
        train_eps, eval_eps = speed[m]
        result["modes"][m] = {"train_examples_per_s": float(f"{train_eps:.4g}"),
                              "eval_examples_per_s": float(f"{eval_eps:.4g}"),
                              "train_real_fraction": round(slots(batches[m]), 3),
                              "epoch_real_fraction": round(epoch_fraction[m], 3), "epoch_shapes": epoch_shapes[m],
                              "first_round_s": compile_s[m],
                              "train_s": [round(t, 3) for t in times[m]["train"]],
                              "eval_s": [round(t, 3) for t in times[m]["eval"]]}
    if "padded" in speed:
        for m, r in result["modes"].items():
            r["train_ratio"] = round(speed[m][0] / speed["padded"][0], 3)
            r["eval_ratio"] = round(speed[m][1] / speed["padded"][1], 3)
    if a.output:
        with Path(a.output).open("a") as f:
            f.write(json.dumps(result) + "\n")
    print(json.dumps(result) if a.json else table(result), flush=True)
    return result


def table(r: dict) -> str:
    lines = [f"{r['size']} {r['kind']} on {r['device']} (load {r['load_average'][0]}): {r['source']}",
             f"  batch {r['batch_size']} (eval {r['eval_batch_size']}), max_seq_length {r['max_seq_length']}, "
             f"length_multiple {r['length_multiple']}, mean {r['mean_real_tokens']} real tokens; "
             f"{r['train_steps']} steps and {r['eval_rows']} eval rows per turn, {r['rounds']} rounds",
             f"  {'mode':<18}{'train ex/s':>12}{'ratio':>8}{'eval ex/s':>12}{'ratio':>8}{'real/slots':>12}"
             f"{'epoch real/slots':>18}{'epoch shapes':>14}"]
    for m, x in r["modes"].items():
        lines.append(f"  {m:<18}{x['train_examples_per_s']:>12.4g}{x.get('train_ratio', 1):>8.2f}"
                     f"{x['eval_examples_per_s']:>12.4g}{x.get('eval_ratio', 1):>8.2f}"
                     f"{x['train_real_fraction']:>12.2f}{x['epoch_real_fraction']:>18.2f}{x['epoch_shapes']:>14}")
    return "\n".join(lines)


if __name__ == "__main__":
    cli.run(main)
