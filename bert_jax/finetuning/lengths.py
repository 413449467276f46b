"""Fine-tuning on real lengths: which rows share a batch, and blocks on the real tokens only.

Every batch is already cut to its longest row (rounded up to ``length_multiple``). Three switches
of the fine-tuning configs (configs/finetune.py) cut the padding that is left; the
measurements are in docs/records.md ("Fine-tuning on real lengths"):

* ``eval_by_length`` (True): evaluation takes the rows longest first (a stable sort), so each batch
  holds rows of about one length; the outputs come back in the features' order. Same predictions.
* ``unpad_multiple`` M > 0: training and evaluation batches carry ``token_index``
  (input_pipeline/unpadding.py), so the encoder's projections and feed-forward run on the real tokens
  only (attention keeps its [batch, length] form); the count is rounded up to M per data shard and
  each new (length, count) pair compiles the step once more. Same outputs, to float tolerance.
* ``length_groups`` G > 0: each training epoch's permutation is cut into groups of G batches, each
  group sorted by length and cut into batches, and the batches shuffled: batches of similar lengths,
  every example still once per epoch. Unlike the two above it changes which examples share a batch,
  so a run's numbers are not those of G = 0 (Hugging Face's ``group_by_length`` does the same).

Training batches stay a pure function of (seed, step): resuming continues exactly.
"""

from __future__ import annotations

import numpy as np

from input_pipeline.unpadding import with_token_index


def real_lengths(features: dict) -> np.ndarray:
    """[rows] int: each row's real tokens (its ``input_mask`` count)."""
    return np.asarray(features["input_mask"]).sum(1)


def epoch_order(lengths: np.ndarray, seed: int, epoch: int, batch_size: int, groups: int = 0) -> np.ndarray:
    """The order the rows are drawn in during ``epoch``: a permutation seeded by (seed, epoch); with
    ``groups`` > 0 its full batches are regrouped by length (see the module docstring)."""
    n = len(lengths)
    order = np.random.default_rng([seed, epoch]).permutation(n)
    full = n // batch_size
    if groups <= 0 or full == 0:
        return order
    used, rest = order[: full * batch_size], order[full * batch_size:]
    chunk = groups * batch_size
    parts = [c[np.argsort(-lengths[c], kind="stable")] for c in np.split(used, range(chunk, len(used), chunk))]
    batches = np.concatenate(parts).reshape(full, batch_size)  # [batches, rows]: similar lengths within
    batches = batches[np.random.default_rng([seed, epoch, 1]).permutation(full)]
    return np.concatenate([batches.reshape(-1), rest])


def train_rows(lengths: np.ndarray, step: int, batch_size: int, seed: int, groups: int = 0) -> np.ndarray:
    """The rows of training step ``step``: batches drawn without replacement, epoch after epoch."""
    per_epoch = len(lengths) // batch_size
    epoch, i = divmod(step, per_epoch)
    return epoch_order(lengths, seed, epoch, batch_size, groups)[i * batch_size:(i + 1) * batch_size]


def eval_order(features: dict, by_length: bool) -> np.ndarray:
    """The order evaluation visits the rows in: longest first (stable) when ``by_length``, else as given."""
    if not by_length:
        return np.arange(len(features["input_mask"]))
    return np.argsort(-real_lengths(features), kind="stable")


def restore_order(outputs: dict[str, np.ndarray], order: np.ndarray) -> dict[str, np.ndarray]:
    """Outputs computed in ``order`` (row ``order[j]`` at ``j``) → the features' own order."""
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    return {k: v[inverse] for k, v in outputs.items()}


def unpadded(batch: dict[str, np.ndarray], multiple: int, shards: int) -> dict[str, np.ndarray]:
    """The batch with ``token_index`` when ``multiple`` > 0 (and there is padding to skip), else as it is."""
    return with_token_index(batch, shards, multiple) if multiple > 0 else batch
