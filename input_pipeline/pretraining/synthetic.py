"""Synthetic pre-training batches of the real shapes (benchmarks, smoke tests, trainer tests).

Batch ``k`` is a pure function of (seed, k), so the position is just the batch index and a resumed
run sees exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import numpy as np


class SyntheticBatches:
    """An iterator of pre-training batches (`input_pipeline.pretraining.batch` layout): random
    tokens, 15% masked positions."""

    def __init__(self, *, batch_size: int, seq_len: int, max_predictions: int, vocab_size: int,
                 seed: int = 0, first_id: int = 5, short_seq_prob: float | None = None):
        """Example lengths: uniform in [seq_len/2, seq_len]; with ``short_seq_prob`` p instead as
        create_pretraining_data targets them: with probability p uniform in [2, seq_len], else full."""
        self.batch_size, self.seq_len, self.max_predictions = batch_size, seq_len, max_predictions
        self.vocab_size, self.seed, self.first_id = vocab_size, seed, first_id
        self.short_seq_prob = short_seq_prob
        self.index = 0

    def state(self) -> dict:
        return {"kind": "synthetic", "index": self.index}

    def restore(self, state: dict) -> None:
        self.index = int(state["index"])

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([self.seed, self.index])
        self.index += 1
        b, length, p = self.batch_size, self.seq_len, self.max_predictions
        ids = rng.integers(self.first_id, self.vocab_size, (b, length), dtype=np.int32)
        lengths = rng.integers(length // 2, length + 1, b)  # [batch]
        if self.short_seq_prob is not None:
            short = rng.random(b) < self.short_seq_prob
            lengths = np.where(short, rng.integers(2, length + 1, b), length)
        mask = (np.arange(length)[None] < lengths[:, None]).astype(np.int32)
        positions = np.sort(rng.random((b, length)).argsort(1)[:, :p], axis=1).astype(np.int32)
        weights = (positions < lengths[:, None]).astype(np.float32)
        positions = positions * (weights > 0)
        return {
            "input_ids": ids * mask,
            "input_mask": mask,
            "segment_ids": ((np.arange(length)[None] >= lengths[:, None] // 2) * mask).astype(np.int32),
            "masked_lm_positions": positions,
            "masked_lm_ids": np.take_along_axis(ids, positions, 1) * (weights > 0),
            "masked_lm_weights": weights,
            "next_sentence_labels": rng.integers(0, 2, (b,), dtype=np.int32),
        }
