"""The held-out batches of pre-training's evaluation (`bert_jax.pretraining.evaluation.HeldOutBatches`):
the same batches at every evaluation, read once when they fit in memory."""

from __future__ import annotations

import numpy as np

from bert_jax.pretraining.evaluation import HeldOutBatches


class Reader:
    """A held-out reader as the trainer opens one: ``state`` / ``restore`` and numbered batches of
    ``rows`` x 4 int32 (64 bytes a batch at 4 rows); counts the batches it reads."""

    def __init__(self, rows: int = 4):
        self.position, self.rows, self.reads, self.restores = 0, rows, 0, 0

    def state(self) -> dict:
        return {"batch": self.position}

    def restore(self, state: dict) -> None:
        self.position, self.restores = state["batch"], self.restores + 1

    def __next__(self) -> dict:
        self.position, self.reads = self.position + 1, self.reads + 1
        return {"input_ids": np.full((self.rows, 4), self.position, np.int32)}


def ids(batches) -> list[int]:
    return [int(b["input_ids"][0, 0]) for b in batches]


def test_the_first_pass_is_kept_and_replayed_and_the_reader_let_go():
    reader = Reader()
    held_out = HeldOutBatches(reader, 3)
    assert ids(held_out) == [1, 2, 3]
    assert held_out.data is None  # the reader (and a real one's tf.data iterator) is let go
    assert ids(held_out) == ids(held_out) == [1, 2, 3]
    assert reader.reads == 3 and reader.restores == 0


def test_an_interrupted_pass_is_not_kept_and_the_next_starts_over():
    """A signal stops an evaluation after its first batch: the next evaluation restores the reader to
    the start and reads all three, then keeps them."""
    reader = Reader()
    held_out = HeldOutBatches(reader, 3)
    assert ids([next(iter(held_out))]) == [1]  # the rest of that pass is never read
    assert held_out.kept is None and held_out.data is reader
    assert ids(held_out) == [1, 2, 3] and reader.restores == 1
    assert ids(held_out) == [1, 2, 3] and reader.reads == 4


def test_batches_beyond_the_memory_bound_are_read_again_each_time():
    reader = Reader()
    held_out = HeldOutBatches(reader, 3, max_bytes=2 * 64)  # two of the three 64-byte batches fit
    assert ids(held_out) == ids(held_out) == [1, 2, 3]
    assert held_out.kept is None and reader.reads == 6 and reader.restores == 1
    exact = HeldOutBatches(Reader(), 3, max_bytes=3 * 64)  # exactly the bound: kept
    assert ids(exact) == [1, 2, 3] and exact.kept is not None


def test_a_reader_moved_before_the_first_evaluation_is_restored_to_where_it_was_opened():
    reader = Reader()
    held_out = HeldOutBatches(reader, 2)
    next(reader)  # e.g. something read it after the trainer opened it
    assert ids(held_out) == [1, 2] and reader.restores == 1
