"""Logical axis names, defined once.

Every parameter carries a tuple of these names as its ``out_sharding`` metadata (with
``eager_sharding=False``, so modules can be built without a mesh). Which mesh axis each name is
split over is the training config's business (``config.sharding_rules``, turned into shardings by
`bert_jax.training.sharding`); the model only names its axes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from flax import nnx

# Parameter axes.
VOCAB = "vocab"  # word-piece vocabulary
EMBED = "embed"  # hidden size (model width)
HEADS = "heads"  # attention heads
KV = "kv"  # per-head width
MLP = "mlp"  # feed-forward intermediate width
LAYERS = "layers"  # the stacked-layer axis added by the encoder's vmap
# Input axes (the batches the host feeds).
BATCH = "batch"
LENGTH = "length"
# Activation axes (MaxText's names): their own rules, so that how an activation is split is chosen
# apart from how the weights are (`bert_jax.model.activation_sharding`). An unpadded block's
# [shards, tokens] axes count as batch and length.
ACT_BATCH = "activation_batch"
ACT_LENGTH = "activation_length"
ACT_EMBED = "activation_embed"  # the residual stream's width
ACT_HEADS = "activation_heads"
ACT_KV = "activation_kv"
ACT_MLP = "activation_mlp"  # the feed-forward intermediate's width
ACT_VOCAB = "activation_vocab"  # MLM logits

LOGICAL_AXES = (VOCAB, EMBED, HEADS, KV, MLP, LAYERS, BATCH, LENGTH,
                ACT_BATCH, ACT_LENGTH, ACT_EMBED, ACT_HEADS, ACT_KV, ACT_MLP, ACT_VOCAB)


def metadata(*names: str | None) -> dict[str, Any]:
    """Variable metadata giving a parameter its logical axis names (for ``*_metadata=`` args)."""
    return {"out_sharding": tuple(names), "eager_sharding": False}


def init(initializer: Callable[..., Any], *names: str | None) -> Callable[..., Any]:
    """An initializer whose parameters carry these logical axis names."""
    return nnx.with_partitioning(initializer, tuple(names), eager_sharding=False)


def stacked_axes(params: nnx.State) -> dict:
    """Which axis of each parameter is the ``layers`` axis: a pure dict like
    ``nnx.to_pure_dict(params)`` with an int (the position of `LAYERS` in the leaf's logical names)
    or None (not stacked) per leaf. ``params``: ``nnx.state(model, nnx.Param)``, abstract or real.
    Read from the names, never guessed from shapes; a parameter without names is an error."""
    from jax.sharding import PartitionSpec

    specs = nnx.to_pure_dict(nnx.get_partition_spec(params))

    def axis(path, spec):
        if not isinstance(spec, PartitionSpec):
            raise ValueError(f"parameter {'/'.join(str(getattr(k, 'key', k)) for k in path)} carries no "
                             "logical axis names (axes.init / axes.metadata)")
        names = tuple(spec)
        return names.index(LAYERS) if LAYERS in names else None

    return jax.tree_util.tree_map_with_path(axis, specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
