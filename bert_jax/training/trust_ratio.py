"""LAMB's layer-wise trust ratio (You et al., 2019) on stacked layers: one ratio per layer.

The encoder keeps its blocks' parameters stacked along a leading ``layers`` axis
(`bert_jax.model.encoder`), so one array holds every layer's query kernel, say. LAMB adapts the
step per layer and per matrix: ``u <- u * ||w|| / ||u||``, the norms of that layer's matrix alone.
``optax.scale_by_trust_ratio`` takes one norm per array, which on a stacked array is one ratio for
all the layers together (a layer with small weights then takes the step its larger neighbours set).
`scale_by_layerwise_trust_ratio` takes the norms over every axis but the layers axis of a stacked
leaf, giving a ratio of shape ``[layers, 1, ...]``, and one norm per array elsewhere (embeddings,
heads, ALBERT's shared block with its layers axis of length 1, which is one array anyway).

Which axis of a leaf is the layers axis comes from the model's logical axis names
(`bert_jax.model.axes.stacked_axes`), never from its shape. The sums run on sharded arrays as they
are laid out: under any sharding rules XLA adds the cross-device reductions, so the ratio is the
same on one device, under FSDP or under tensor parallelism (tests/training/test_lamb.py).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax


def path_names(path) -> tuple[str, ...]:
    """A ``jax.tree_util`` key path as names; the trailing ``.value`` of an ``nnx.Variable`` (an
    ``nnx.State`` leaf) is dropped, so a State and its ``to_pure_dict()`` give the same names."""
    names = []
    for k in path:
        if isinstance(k, jax.tree_util.DictKey):
            names.append(str(k.key))
        elif isinstance(k, jax.tree_util.GetAttrKey):
            names.append(k.name)
        elif isinstance(k, jax.tree_util.SequenceKey):
            names.append(str(k.idx))
        elif isinstance(k, jax.tree_util.FlattenedIndexKey):
            names.append(str(k.key))
        else:
            names.append(str(k))
    if path and isinstance(path[-1], jax.tree_util.GetAttrKey) and path[-1].name == "value":
        names.pop()
    return tuple(names)


def axes_by_path(stacked: Any) -> dict[tuple[str, ...], int | None]:
    """A pytree of ``Optional[int]`` (the layers axis of each leaf) → ``{path names: axis}``, so a
    params tree in another form (an ``nnx.State``, a masked tree) finds its leaves' entries."""
    flat, _ = jax.tree_util.tree_flatten_with_path(stacked, is_leaf=lambda x: x is None)
    return {path_names(path): axis for path, axis in flat}


def layer_norms(x: jax.Array, axis: int | None) -> jax.Array:
    """L2 norm over every axis but ``axis`` (kept as a length-1 axis elsewhere): ``[layers, 1, ...]``
    for a stacked leaf; a scalar ``[]`` for ``axis=None``."""
    x = x.astype(jnp.float32)
    if axis is None:
        return jnp.sqrt(jnp.sum(jnp.square(x)))
    reduce = tuple(a for a in range(x.ndim) if a != axis % x.ndim)
    return jnp.sqrt(jnp.sum(jnp.square(x), axis=reduce, keepdims=True))


def trust_ratio(p: jax.Array, u: jax.Array, axis: int | None) -> jax.Array:
    """``||p|| / ||u||`` per layer (1 where either norm is 0, as Google's and ALBERT's
    ``lamb_optimizer.py`` and ``optax.scale_by_trust_ratio``)."""
    p_norm, u_norm = layer_norms(p, axis), layer_norms(u, axis)
    ok = (p_norm > 0) & (u_norm > 0)
    return jnp.where(ok, p_norm / jnp.where(ok, u_norm, 1.0), 1.0)


def scale_by_layerwise_trust_ratio(stacked: Any) -> optax.GradientTransformation:
    """``u <- u * ||p|| / ||u||`` with the norms per layer of stacked leaves, per array otherwise.

    ``stacked``: a pytree of ``Optional[int]`` with the params' structure (a pure dict; `axes_by_path`
    matches an ``nnx.State`` or a tree that ``optax.masked`` has pruned by path): the layers axis of
    each leaf, None for a leaf that is one array. A leaf it does not name is an error, so the
    optimizer never falls back to one ratio for a stacked array by mistake."""
    table = axes_by_path(stacked)

    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError("the trust ratio needs the parameters: tx.update(grads, state, params)")

        def scale(path, u, p):
            names = path_names(path)
            if names not in table:
                raise KeyError(f"parameter {'/'.join(names)} has no entry in the stacked-axes tree")
            return (u * trust_ratio(p, u, table[names])).astype(u.dtype)

        return jax.tree_util.tree_map_with_path(scale, updates, params), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)
