r"""Measures how well replaced-token detection can do on ELECTRA's ``runlocal`` data without a
network: the held-out ROC AUC of a count-based bigram detector when the masked positions are filled
with samples of the training split's unigram distribution (a generator that has learnt token
frequencies and nothing else). docs/records.md, "The runlocal recipes", has the figures.

    python tests/measure_bigram_rtd_auc.py
    python tests/measure_bigram_rtd_auc.py --config "configs/pretrain.py:model=electra,runlocal" --epochs 3

The detector scores token w between neighbours a and b by log q(w) - log p(w | a) - log p(b | w)
+ log q(b) (q: unigram, p: bigram, add-k smoothed towards q), the likelihood ratio of "w was sampled
from q" against "w is the text's"; token identity alone (-log q(w)) is printed beside it. Prints one
JSON line.
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


def measure(config, epochs: int, k: float, seed: int) -> dict:
    from sklearn.metrics import roc_auc_score

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

    rng = np.random.default_rng(seed)
    labels, bigram_scores, identity_scores = [], [], []
    for ids, real, masked in originals(config, "eval", 1):
        replaced_ids = np.where(masked, rng.choice(vocab, size=ids.shape, p=q), ids)
        replaced = masked & (replaced_ids != ids)  # a sample equal to the original counts as original
        for row, keep, label in zip(replaced_ids, real, replaced, strict=True):
            t, y = row[keep], label[keep]
            for i in range(1, len(t) - 1):
                bigram_scores.append(np.log(q[t[i]]) - log_next(t[i - 1], t[i]) - log_next(t[i], t[i + 1])
                                     + np.log(q[t[i + 1]]))
                identity_scores.append(-np.log(q[t[i]]))
                labels.append(bool(y[i]))
    return {"train_tokens": int(unigram.sum() - vocab), "epochs": epochs, "held_out_tokens": len(labels),
            "replaced_fraction": round(float(np.mean(labels)), 4),
            "bigram_auc": round(float(roc_auc_score(labels, bigram_scores)), 4),
            "token_identity_auc": round(float(roc_auc_score(labels, identity_scores)), 4)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/pretrain.py:model=electra,runlocal")
    parser.add_argument("--epochs", type=int, default=1, help="passes over the training split counted")
    parser.add_argument("--k", type=float, default=0.1, help="add-k smoothing of the bigram towards unigram")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from bert_jax.config_args import load_config_file

    path, _, arg = args.config.partition(":")
    config = load_config_file(Path(path).stem, arg or None)
    print(json.dumps(measure(config, args.epochs, args.k, args.seed)))


if __name__ == "__main__":
    main()
