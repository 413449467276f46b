"""The global norm of a pytree of arrays: what gradient clipping divides by, and the gradient and
parameter norms every training step logs. Two ways to compute the same number (``config.global_norm``,
resolved by `bert_jax.resolve.resolve_global_norm`):

* ``"per_leaf"``: ``optax.tree.norm``, one reduction a leaf: BERT-base's ~200 leaves make ~280 small
  kernels on a GPU (each launch costs more than its reads), one program on any sharding.
* ``"grouped"``: the leaves, flattened, concatenated in groups of `GROUP` and each group reduced at once:
  ~10 kernels, each reading its leaves once (XLA fuses the concatenation into the reduction). Sharded
  leaves would be gathered for it: the choice for parameters whole on every device.

Both sum the same squares in float32 (in other orders: within rounding of each other).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from bert_jax.resolve import GLOBAL_NORMS

# Leaves a reduction takes: XLA's GPU fusions take at most ~90 operands; past that it copies the
# concatenation out first (an extra pass over every parameter).
GROUP = 64


def grouped_norm(tree) -> jax.Array:
    """‖tree‖₂ over every leaf: one reduction for each `GROUP` leaves (in the tree's order)."""
    leaves = jax.tree.leaves(tree)
    sums = [jnp.sum(jnp.square(jnp.concatenate([jnp.ravel(x) for x in leaves[i:i + GROUP]])))
            for i in range(0, len(leaves), GROUP)]
    return jnp.sqrt(sum(sums, start=jnp.zeros((), jnp.float32)))


def norm_fn(kind: str) -> Callable:
    """The norm of ``kind`` (one of `GLOBAL_NORMS`)."""
    if kind == "auto":
        raise ValueError("global_norm='auto' is not resolved: resolve the config first (bert_jax.resolve)")
    if kind not in GLOBAL_NORMS:
        raise ValueError(f"global_norm {kind!r}: expected one of {GLOBAL_NORMS}")
    return optax.tree.norm if kind == "per_leaf" else grouped_norm


def clip_by_global_norm(max_norm: float, norm: Callable = optax.tree.norm) -> optax.GradientTransformation:
    """``optax.clip_by_global_norm`` (updates scaled by ``max_norm / ‖updates‖`` where that is below 1)
    with the global norm computed by ``norm``."""

    def update_fn(updates, state, params=None):
        del params
        g_norm = norm(updates)
        trigger = jnp.squeeze(g_norm < max_norm)
        updates = jax.tree.map(lambda t: jax.lax.select(trigger, t, (t / g_norm.astype(t.dtype)) * max_norm), updates)
        return updates, state

    return optax.GradientTransformation(optax.init_empty_state, update_fn)
