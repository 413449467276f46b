"""Where the real tokens are: the host side of unpadded training steps (``config.unpad_multiple``).

A padded batch spends the transformer blocks' projections and feed-forward on padding. With
``token_index`` the encoder (`bert_jax.model.token_layout.Unpadded`) runs them on the real tokens only:

    batch = with_token_index(batch, shards=2, multiple=64)
    batch["token_index"]  # [shards, tokens] int32

Each of the ``shards`` equal groups of rows (the rows one data-parallel device holds) lists the
flat positions (row · length + column, within the group) of its real tokens (``input_mask`` 1), in
order, then filler (= rows · length, out of range). ``tokens`` is the largest group's count rounded
up to a multiple of ``multiple``, so a run compiles one step per size it meets, not one per batch;
``min_tokens`` raises it (the benchmark gives all its batches one shape). A batch whose count
rounds up to every slot keeps its padded form.
"""

from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger(__name__)


def token_index(input_mask: np.ndarray, shards: int = 1, multiple: int = 64, min_tokens: int = 0) -> np.ndarray:
    """[batch, length] input mask (1 = real token) → [shards, tokens] int32 flat positions."""
    if input_mask.ndim != 2:
        raise ValueError(f"input_mask must be [batch, length], got shape {input_mask.shape}")
    if shards < 1 or input_mask.shape[0] % shards:
        raise ValueError(f"batch of {input_mask.shape[0]} rows cannot be split into {shards} equal shards")
    if multiple < 1:
        raise ValueError(f"multiple must be >= 1, got {multiple}")
    groups = np.asarray(input_mask).reshape(shards, -1) > 0  # [shards, rows·length]
    size = groups.shape[1]
    most = max(int(groups.sum(1).max()), 1)
    tokens = max(min(-(-most // multiple) * multiple, size), min_tokens)
    out = np.full((shards, tokens), size, np.int32)  # filler: out of range
    for s, group in enumerate(groups):
        real = np.flatnonzero(group)  # [count]
        out[s, : len(real)] = real
    return out


def with_token_index(batch: dict[str, np.ndarray], shards: int = 1, multiple: int = 64,
                     min_tokens: int = 0) -> dict[str, np.ndarray]:
    """The batch plus ``token_index`` [shards, tokens] from its ``input_mask``; the batch as it is
    when the count rounds up to every slot (nothing to skip: the padded step is the cheaper one)."""
    index = token_index(batch["input_mask"], shards, multiple, min_tokens)
    return batch if index.size >= batch["input_mask"].size else {**batch, "token_index": index}


def adding_token_index(place, shards: int, multiple: int):
    """``place`` (a function of a numpy batch) called on ``with_token_index(batch, ...)``; logs each
    new token count, since each compiles the step once more."""
    seen = set()

    def place_unpadded(batch: dict[str, np.ndarray]):
        batch = with_token_index(batch, shards, multiple)
        slots = batch["input_mask"].size // shards
        tokens = batch["token_index"].shape[1] if "token_index" in batch else slots
        if tokens not in seen:
            seen.add(tokens)
            log.info("unpadded batches of %d tokens per shard (of %d): a step of that size compiles", tokens, slots)
        return place(batch)

    return place_unpadded
