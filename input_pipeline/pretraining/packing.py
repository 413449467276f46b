"""Sequence packing: several pre-training examples in one row, so no FLOPs go to padding.

`pack_examples` takes a batch of padded examples (`input_pipeline.pretraining.batch` keys, each row one example with its
own [CLS] ... [SEP]) and places them, first fit in order, into ``num_rows`` rows of the same
length. The packed batch adds what the model needs to keep the examples apart
(`bert_jax.model.models.BertForPreTraining` with ``example_ids`` and ``cls_positions``: attention only
within an example, positions restarting at each example, NSP/SOP from each example's [CLS]):

* ``example_ids`` [rows, length]: 1, 2, ... for the tokens of the row's 1st, 2nd, ... example, 0 = padding;
* ``cls_positions`` [rows, K]: where each example starts; ``next_sentence_labels`` [rows, K];
  ``nsp_weights`` [rows, K]: 1 for a real example, 0 for an empty slot;
* ``masked_lm_positions`` / ``ids`` / ``weights`` [rows, P]: the examples' real predictions, moved
  by their offsets and concatenated.

An example goes into the first row with room for its tokens, its predictions and one more example;
packing stops at the first example that fits in no row, so the examples used are a prefix.

`PackedPretrainingData` packs the training input (``config.data.pack_examples = K``): the stream
of masked examples, in order, into batches of packed rows; its position is the first example not
yet packed, so ``restore(state())`` replays exactly. Mask first, pack second: every example keeps
the mask it has unpacked (dynamic masks are a function of (seed, epoch, index)).
"""

from __future__ import annotations

import numpy as np


def pack_examples(batch: dict[str, np.ndarray], num_rows: int, *, max_examples: int = 4,
                  max_predictions: int | None = None) -> tuple[dict[str, np.ndarray], int]:
    """(packed batch of ``num_rows`` rows, number of examples of ``batch`` used: its first n)."""
    ids = np.asarray(batch["input_ids"])  # [examples, length]
    n, length = ids.shape
    mask = np.asarray(batch["input_mask"])  # [examples, length]
    lengths = mask.sum(1).astype(int)  # [examples]
    weights = np.asarray(batch["masked_lm_weights"])  # [examples, P]
    p = weights.shape[1] if max_predictions is None else max_predictions
    if np.any(np.diff(mask, axis=1) > 0):
        raise ValueError("pack_examples expects right-padded examples (input_mask 1...1 0...0)")
    out = {
        "input_ids": np.zeros((num_rows, length), ids.dtype),
        "input_mask": np.zeros((num_rows, length), np.int32),
        "segment_ids": np.zeros((num_rows, length), np.int32),
        "example_ids": np.zeros((num_rows, length), np.int32),
        "masked_lm_positions": np.zeros((num_rows, p), np.int32),
        "masked_lm_ids": np.zeros((num_rows, p), np.int32),
        "masked_lm_weights": np.zeros((num_rows, p), np.float32),
        "next_sentence_labels": np.zeros((num_rows, max_examples), np.int32),
        "cls_positions": np.zeros((num_rows, max_examples), np.int32),
        "nsp_weights": np.zeros((num_rows, max_examples), np.float32),
    }
    labels = np.asarray(batch["next_sentence_labels"]).reshape(n, -1)[:, 0]  # [examples]
    real = weights > 0  # [examples, P]: predictions come first, padding after
    num_real = real.sum(1)  # [examples]
    # First fit, in order: each example's row, first token, slot k and first prediction slot.
    used_tokens = np.zeros(num_rows, int)  # [rows]
    used_preds = np.zeros(num_rows, int)  # [rows]
    count = np.zeros(num_rows, int)  # [rows] examples in each row
    place = np.zeros((n, 4), int)  # [examples, (row, start, k, q)]
    used = n
    for i in range(n):
        fits = (used_tokens + lengths[i] <= length) & (used_preds + num_real[i] <= p) & (count < max_examples)
        if lengths[i] == 0 or not fits.any():
            used = i
            break
        r = int(fits.argmax())  # the first row with room
        place[i] = r, used_tokens[r], count[r], used_preds[r]
        used_tokens[r] += lengths[i]
        used_preds[r] += num_real[i]
        count[r] += 1
    row, start, k, q = place[:used].T  # [used] each
    # Token j of example e goes to (row[e], start[e] + j).
    e, j = np.nonzero(mask[:used] > 0)  # [tokens] each
    for key in ("input_ids", "input_mask", "segment_ids"):
        out[key][row[e], start[e] + j] = np.asarray(batch[key])[e, j]
    out["example_ids"][row[e], start[e] + j] = k[e] + 1
    # The m-th real prediction of example e goes to slot q[e] + m of row[e], moved by start[e].
    e, m = np.nonzero(real[:used])  # [predictions] each
    slot = q[e] + (np.cumsum(real[:used], axis=1) - 1)[e, m]
    out["masked_lm_positions"][row[e], slot] = np.asarray(batch["masked_lm_positions"])[e, m] + start[e]
    out["masked_lm_ids"][row[e], slot] = np.asarray(batch["masked_lm_ids"])[e, m]
    out["masked_lm_weights"][row[e], slot] = weights[e, m]
    out["next_sentence_labels"][row, k] = labels[:used]
    out["cls_positions"][row, k] = start
    out["nsp_weights"][row, k] = 1.0
    return out, used


class PackedBatches:
    """Packed batches of ``rows`` rows from an iterator of padded example batches (e.g.
    `input_pipeline.pretraining.synthetic.SyntheticBatches` of ``rows * max_examples`` examples): each packed
    batch is made from one example batch, whatever does not fit is dropped. For benchmarks and
    tests; it has no ``state()``/``restore()`` for exact resumption."""

    def __init__(self, examples, rows: int, *, max_examples: int, max_predictions: int | None = None):
        self.examples, self.rows = examples, rows
        self.max_examples, self.max_predictions = max_examples, max_predictions

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        packed, _ = pack_examples(next(self.examples), self.rows, max_examples=self.max_examples,
                                  max_predictions=self.max_predictions)
        return packed


class PackedPretrainingData:
    """Batches of ``rows`` packed rows (up to ``max_examples`` examples each) from the example
    stream of an `input_pipeline.pretraining.dataset.PretrainingData` (its `chunks`), with ``state()`` /
    ``restore(state)``: the position is (epoch, index of the first example not yet in a batch).
    Each batch packs a prefix of the examples not yet used, so none is skipped or seen twice."""

    def __init__(self, source, rows: int, *, max_examples: int, max_predictions: int | None = None):
        if max_examples < 1:
            raise ValueError(f"pack_examples={max_examples}: expected >= 1 examples per row")
        self.source, self.rows = source, rows
        self.max_examples, self.max_predictions = max_examples, max_predictions
        self.epoch, self.example = 0, 0
        self._chunks, self._buffer = None, None  # buffer: (epochs [n], indices [n], features)

    def state(self) -> dict:
        return {"kind": "packed", "epoch": self.epoch, "example": self.example}

    def restore(self, state: dict) -> None:
        if state.get("kind") != "packed":
            raise ValueError(f"input state {state} was saved without packing (config.data.pack_examples=0); "
                             "packed input cannot resume from it")
        self.epoch, self.example = int(state["epoch"]), int(state["example"])
        self._chunks, self._buffer = None, None

    def __iter__(self):
        return self

    def _fill(self, n: int) -> None:
        """Reads chunks until the buffer holds at least ``n`` examples."""
        if self._chunks is None:
            self._chunks = self.source.chunks(self.epoch, self.example)
        while self._buffer is None or len(self._buffer[0]) < n:
            epoch, index, features = next(self._chunks)
            chunk = (np.full(len(index), epoch), index, features)
            if self._buffer is None:
                self._buffer = chunk
            else:
                old = self._buffer
                self._buffer = (np.concatenate([old[0], chunk[0]]), np.concatenate([old[1], chunk[1]]),
                                {k: np.concatenate([old[2][k], features[k]]) for k in features})

    def __next__(self) -> dict[str, np.ndarray]:
        self._fill(self.rows * self.max_examples)
        epochs, indices, features = self._buffer
        packed, used = pack_examples(features, self.rows, max_examples=self.max_examples,
                                     max_predictions=self.max_predictions)
        if used == 0:
            raise ValueError(f"example {int(indices[0])} of epoch {int(epochs[0])} fits in no packed row "
                             f"(length {int(features['input_mask'][0].sum())}, "
                             f"{int((features['masked_lm_weights'][0] > 0).sum())} predictions)")
        # The next position: the first example left, or just past the last one used.
        left = len(epochs) - used
        self.epoch, self.example = ((int(epochs[used]), int(indices[used])) if left
                                    else (int(epochs[-1]), int(indices[-1]) + 1))
        self._buffer = (epochs[used:], indices[used:], {k: v[used:] for k, v in features.items()})
        return packed
