r"""Measures how well replaced-token detectors do on ELECTRA's ``runlocal`` data: the held-out ROC
AUC of each detector when the masked positions are filled with samples of the training split's
unigram distribution (a generator that has learnt token frequencies and nothing else).
docs/records.md, "The runlocal recipes", has the figures.

    python tests/measure_rtd_detectors.py
    python tests/measure_rtd_detectors.py --mlm /tmp/bert_tiny --discriminator /tmp/electra_tiny

The detectors: token identity alone (-log q(w), q: unigram); a bigram count table, scoring token w
between neighbours a and b by log q(w) - log p(w | a) - log p(b | w) + log q(b) (p: bigram, add-k
smoothed towards q), the likelihood ratio of "w was sampled from q" against "w is the text's";
``--mlm WORKDIR``: a masked LM's pre-training workdir (BERT's, RoBERTa's, ...) scoring each token with
that token masked, log q(w) - log p_MLM(w | the rest); ``--discriminator WORKDIR``: an ELECTRA
workdir's discriminator logits. Each scores the same held-out tokens. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).parents[1]


def originals(config, split: str, epochs: int):
    """(original ids [batch, length], real-token mask, masked-position mask) of each batch: the
    masked labels put back where the pipeline masked them."""
    from input_pipeline.pretraining.dataset import make_pretraining_dataset

    data = make_pretraining_dataset(config, split=split, batch_size=config.batch_size)
    while True:
        b = next(data)
        if data.state()["epoch"] >= epochs:
            return
        ids = np.array(b["input_ids"])  # [batch, length]
        weights = np.array(b["masked_lm_weights"]) > 0  # [batch, predictions]
        masked = np.zeros(ids.shape, bool)
        for r in range(ids.shape[0]):
            positions = np.array(b["masked_lm_positions"][r])[weights[r]]
            ids[r, positions] = np.array(b["masked_lm_ids"][r])[weights[r]]
            masked[r, positions] = True
        yield ids, np.array(b["input_mask"]) > 0, masked


def trained_model(workdir: str, kind: str):
    """(graphdef, params) of WORKDIR's newest checkpoint: its masked LM (``kind="mlm"``) or its
    ELECTRA discriminator (``kind="discriminator"``), built from the model config the checkpoint saved."""
    from flax import nnx

    from bert_jax.finetuning.warm_start import open_init_checkpoint
    from bert_jax.model.electra import ElectraDiscriminator
    from bert_jax.model.models import BertForPreTraining
    from bert_jax.model.weights import load_params
    from bert_jax.training.checkpoints import read_params

    cfg = open_init_checkpoint(workdir).config.deterministic()
    if kind == "mlm":
        objective = json.loads((Path(workdir) / "config.json").read_text())["objective"]
        model = BertForPreTraining(cfg, rngs=nnx.Rngs(0), objective=objective)
    else:
        model = ElectraDiscriminator(cfg, rngs=nnx.Rngs(0))
    stored, where = read_params(workdir)
    ours = tuple(f"{name}/" for name in nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    load_params(model, {k: v for k, v in stored.items() if k.startswith(ours)}, where=str(where))
    return nnx.split(model)


def mlm_scorer(workdir: str, mask_id: int):
    """row [length], real [length] -> log p_MLM(w_i | the row with w_i masked) for i in 1 .. n-2."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    graphdef, params = trained_model(workdir, "mlm")

    @jax.jit
    def log_p(ids, mask, positions, targets):  # [rows, length] x2, [rows] x2
        out = nnx.merge(graphdef, params)(ids, mask, jnp.zeros_like(ids), positions[:, None])
        logp = jax.nn.log_softmax(out.mlm_logits[:, 0].astype(jnp.float32), axis=-1)  # [rows, vocab]
        return jnp.take_along_axis(logp, targets[:, None], axis=-1)[:, 0]  # [rows]

    def score(row, real):
        n, length = int(real.sum()), len(row)
        positions = np.minimum(np.arange(1, length - 1), max(n - 2, 1))  # one shape for every row
        copies = np.repeat(row[None], len(positions), axis=0)  # [length - 2, length]
        copies[np.arange(len(positions)), positions] = mask_id
        mask = np.repeat(real[None].astype(np.int32), len(positions), axis=0)
        return np.asarray(log_p(copies, mask, positions, row[positions]))[: n - 2]

    return score


def discriminator_scorer(workdir: str):
    """ids [batch, length], real [batch, length] -> the discriminator's "replaced" logits."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    graphdef, params = trained_model(workdir, "discriminator")
    logits = jax.jit(lambda ids, mask: nnx.merge(graphdef, params)(ids, mask, jnp.zeros_like(ids)))
    return lambda ids, real: np.asarray(logits(ids, real.astype(np.int32)))


def measure(config, epochs: int, k: float, seed: int, mlm: str | None = None,
            discriminator: str | None = None) -> dict:
    from sklearn.metrics import roc_auc_score

    from input_pipeline.package_data import locate
    from input_pipeline.tokenizers.factory import load_tokenizer

    vocab = int(config.model.vocab_size)
    unigram = np.ones(vocab)  # add-one
    bigram, after = collections.Counter(), collections.Counter()
    for ids, real, _ in originals(config, "train", epochs):
        for row, keep in zip(ids, real, strict=True):
            t = row[keep]
            np.add.at(unigram, t, 1)
            bigram.update(zip(t[:-1].tolist(), t[1:].tolist(), strict=True))
            after.update(t[:-1].tolist())
    q = unigram / unigram.sum()

    def log_next(a: int, b: int) -> float:  # log p(b | a)
        return float(np.log((bigram.get((a, b), 0) + k * vocab * q[b]) / (after.get(a, 0) + k * vocab)))

    score_mlm = mlm and mlm_scorer(mlm, load_tokenizer(locate(config.data.vocab)).mask_id)
    score_disc = discriminator and discriminator_scorer(discriminator)
    rng = np.random.default_rng(seed)
    labels, scores = [], collections.defaultdict(list)
    for ids, real, masked in originals(config, "eval", 1):
        replaced_ids = np.where(masked, rng.choice(vocab, size=ids.shape, p=q), ids)
        replaced = masked & (replaced_ids != ids)  # a sample equal to the original counts as original
        disc_logits = score_disc(replaced_ids, real) if score_disc else None  # [batch, length]
        # Real tokens come first in a row (padding after): positions 1 .. n-2 are the same in row and t.
        for r, (row, keep, label) in enumerate(zip(replaced_ids, real, replaced, strict=True)):
            t, y, n = row[keep], label[keep], int(keep.sum())
            for i in range(1, n - 1):
                scores["bigram"].append(np.log(q[t[i]]) - log_next(t[i - 1], t[i]) - log_next(t[i], t[i + 1])
                                        + np.log(q[t[i + 1]]))
                scores["token_identity"].append(-np.log(q[t[i]]))
                labels.append(bool(y[i]))
            if score_mlm:
                scores["mlm"].extend(np.log(q[t[1:n - 1]]) - score_mlm(row, keep))
            if score_disc:
                scores["discriminator"].extend(disc_logits[r, 1:n - 1])
    return {"train_tokens": int(unigram.sum() - vocab), "epochs": epochs, "held_out_tokens": len(labels),
            "replaced_fraction": round(float(np.mean(labels)), 4),
            **{f"{name}_auc": round(float(roc_auc_score(labels, s)), 4) for name, s in scores.items()}}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/pretrain.py:model=electra,runlocal,scratch")  # 15% masked
    parser.add_argument("--epochs", type=int, default=1, help="passes over the training split counted")
    parser.add_argument("--k", type=float, default=0.1, help="add-k smoothing of the bigram towards unigram")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mlm", help="a masked LM's pre-training workdir to score as a detector")
    parser.add_argument("--discriminator", help="an ELECTRA pre-training workdir whose discriminator to score")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from bert_jax.config_args import load_config_file

    path, _, arg = args.config.partition(":")
    config = load_config_file(Path(path).stem, arg or None)
    print(json.dumps(measure(config, args.epochs, args.k, args.seed, args.mlm, args.discriminator)))


if __name__ == "__main__":
    main()
