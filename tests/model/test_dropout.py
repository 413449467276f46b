"""bert_jax/model/dropout.py: Threefry-2x32 unrolled into the dropout, against JAX's own Threefry and
nnx.Dropout, and the choice per platform."""

from __future__ import annotations

import jax
import jax.extend.random as jex_random
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bert_jax.model.dropout import Dropout, fused_dropout, threefry2x32
from bert_jax.resolve import resolve_dropout


def test_threefry_is_jax_threefry():
    key = jnp.array([0x13198A2E, 0x03707344], jnp.uint32)
    x0 = jnp.arange(1000, dtype=jnp.uint32) * np.uint32(7919)
    x1 = jnp.arange(1000, dtype=jnp.uint32) ^ np.uint32(0xDEADBEEF)
    want = np.asarray(jex_random.threefry_2x32(key, jnp.concatenate([x0, x1])))
    got0, got1 = threefry2x32(key[0], key[1], x0, x1)
    np.testing.assert_array_equal(np.concatenate([got0, got1]), want)


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_fused_keep_rate_and_scale(rate):
    x = jnp.ones((8, 12, 64, 64), jnp.float32)  # 393,216 elements
    y = np.asarray(jax.jit(fused_dropout, static_argnums=2)(jax.random.key(3), x, rate))
    kept = y != 0
    n = kept.size
    assert abs(kept.mean() - (1 - rate)) < 5 * np.sqrt(rate * (1 - rate) / n)  # 5 sigma
    np.testing.assert_array_equal(y[kept], np.float32(1 / (1 - rate)))
    # no structure along any axis: the keep rate of every row of every axis is the same
    for axis in range(4):
        per = kept.mean(axis=tuple(a for a in range(4) if a != axis))
        assert np.abs(per - (1 - rate)).max() < 0.02, (axis, per.min(), per.max())


def test_fused_masks_depend_on_key_not_on_call():
    x = jnp.ones((4, 32, 48))
    f = jax.jit(fused_dropout, static_argnums=2)
    a, b = f(jax.random.key(0), x, 0.1), f(jax.random.key(0), x, 0.1)
    c = f(jax.random.key(1), x, 0.1)
    np.testing.assert_array_equal(a, b)
    assert (np.asarray(a) != np.asarray(c)).mean() > 0.1
    rbg = f(jax.random.key(0, impl="rbg"), x, 0.1)  # a 4-word key works too
    assert 0.85 < float((rbg != 0).mean()) < 0.95


def test_fused_gradient_is_the_mask():
    x = jax.random.normal(jax.random.key(0), (16, 40))
    key = jax.random.key(7)
    g = jax.grad(lambda x: (fused_dropout(key, x, 0.2) * 3.0).sum())(x)
    y = fused_dropout(key, x, 0.2)
    np.testing.assert_allclose(np.asarray(g), np.where(np.asarray(y) != 0, 3.0 / 0.8, 0.0), rtol=1e-6)


def test_jax_impl_is_nnx_dropout_bit_for_bit():
    x = jax.random.normal(jax.random.key(0), (4, 16, 32))
    ours = Dropout(0.1, "jax")(x, deterministic=False, rngs=nnx.Rngs(dropout=jax.random.key(5)))
    theirs = nnx.Dropout(0.1)(x, deterministic=False, rngs=nnx.Rngs(dropout=jax.random.key(5)))
    np.testing.assert_array_equal(ours, theirs)
    fused = Dropout(0.1, "fused")(x, deterministic=False, rngs=nnx.Rngs(dropout=jax.random.key(5)))
    assert not np.array_equal(fused, theirs)  # another mask, same statistics
    np.testing.assert_array_equal(Dropout(0.1, "fused")(x, deterministic=True), x)


def test_resolve_dropout_per_platform():
    assert resolve_dropout("auto", "cpu") == "fused"
    assert [resolve_dropout("auto", p) for p in ("gpu", "cuda", "rocm", "tpu")] == ["jax"] * 4
    assert resolve_dropout("jax", "cpu") == "jax" and resolve_dropout("fused", "tpu") == "fused"
    with pytest.raises(ValueError, match="dropout_impl 'bernoulli'"):
        resolve_dropout("bernoulli", "cpu")
    with pytest.raises(ValueError, match="dropout_impl"):
        Dropout(0.1, "nope")
