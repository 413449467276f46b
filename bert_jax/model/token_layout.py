"""Where the transformer blocks' tokens sit: padded rows (the default) or the real tokens only.

A layout object travels with the activations through the blocks. `Padded` (the default) does
nothing: activations are ``[batch, length, ...]``. `Unpadded` (``config.unpad_multiple``) packs each
batch shard's real tokens into ``[shards, tokens, ...]`` so the projections, feed-forward, LayerNorms
and dropout skip the padding; attention alone puts queries, keys and values back in their
``[batch, length]`` places (`to_rows`) and packs its output again (`to_tokens`). Block code is written
once for both: its shape comments say ``[*tokens, ...]``, which is ``[batch, length]`` padded and
``[shards, tokens]`` unpadded.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Padded(NamedTuple):
    """Every position of every row: nothing to move."""

    def to_tokens(self, x: jax.Array) -> jax.Array:
        return x  # [batch, length, ...]

    def to_rows(self, x: jax.Array) -> jax.Array:
        return x  # [batch, length, ...]


class Unpadded(NamedTuple):
    """The real tokens only.

    ``index`` [shards, tokens] int32: for each batch shard (the rows one data-parallel device holds),
    the flat positions (row · length + column within the shard's rows) of its real tokens, in order,
    then any value >= rows · length as filler (input_pipeline/unpadding.py builds it on the host).
    Every real token's output is what the padded computation gives it; padding comes out as zeros.
    """

    index: jax.Array  # [shards, tokens] int32
    batch: int
    length: int

    def to_tokens(self, x: jax.Array) -> jax.Array:
        """[batch, length, ...] → [shards, tokens, ...] (zeros at the filler entries)."""
        shards = self.index.shape[0]
        flat = x.reshape(shards, -1, *x.shape[2:])  # [shards, rows·length, ...]
        index = self.index.reshape(*self.index.shape, *(1,) * (x.ndim - 2))  # [shards, tokens, 1...]
        return jnp.take_along_axis(flat, index, axis=1, mode="fill", fill_value=0)

    def to_rows(self, x: jax.Array) -> jax.Array:
        """[shards, tokens, ...] → [batch, length, ...] with zeros at the padding positions."""
        shards, tail = self.index.shape[0], x.shape[2:]
        out = jnp.zeros((shards, self.batch * self.length // shards, *tail), x.dtype)  # [shards, rows·length, ...]
        rows = jnp.arange(shards)[:, None]  # [shards, 1]
        out = out.at[rows, self.index].set(x, mode="drop", unique_indices=True)
        return out.reshape(self.batch, self.length, *tail)


TokenLayout = Padded | Unpadded
PADDED = Padded()
