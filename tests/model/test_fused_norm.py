"""The GPU's residual-dropout-LayerNorm kernel (bert_jax/model/fused_norm.py), checked on the CPU in
Pallas' interpreter: the kernel against its computation in XLA (`reference_add_norm`, the same mask
drawn outside the kernel), forward and gradients; the mask's statistics and its independence from how
tokens are split; the encoder under ``norm_impl="fused_interpret"`` against XLA's norm. The kernel
compiled by Triton for a GPU: tests/gpu (and tests/benchmark/test_aot.py, for an H100 without one)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bert_jax.model import fused_norm
from bert_jax.model.config import BertConfig
from bert_jax.model.encoder import BertEncoder
from tests.fixtures.dropout_on_mesh import encoder_outputs

SLOW = pytest.mark.slow


def inputs(shape, dtype, bias=True, seed=0):
    keys = jax.random.split(jax.random.key(seed), 5)
    width = shape[-1]
    x, a, dy = (jax.random.normal(k, shape, dtype) for k in (keys[0], keys[1], keys[4]))
    scale = 1.0 + 0.1 * jax.random.normal(keys[2], (width,))  # [width] float32, the parameters' dtype
    return x, a, scale, (0.1 * jax.random.normal(keys[3], (width,)) if bias else None), dy


def forward_and_grads(f, x, a, scale, bias, dy, a_bias=None, **kw):
    y, vjp = jax.vjp(lambda x, a, s, b, ab: f(x, a, s, b, a_bias=ab, eps=1e-12, **kw), x, a, scale, bias, a_bias)
    return y, vjp(dy)


def interpreted():
    return lambda *args, **kw: fused_norm.add_dropout_norm(*args, **kw, interpret=True)


@pytest.mark.parametrize("shape,dtype,rate,bias,a_bias", [
    ((4, 32, 96), jnp.float32, 0.1, True, False),  # a width in three pieces of 32
    ((2, 24, 64), jnp.float32, 0.0, False, False),  # no dropout, no bias (ModernBERT's norms)
    ((2, 24, 64), jnp.float32, 0.0, True, True),  # the sublayer's bias, no dropout: its gradient is Σ dx
    pytest.param((3, 16, 768), jnp.bfloat16, 0.1, True, True, marks=SLOW),  # BERT-base's site, in bfloat16
    ((5, 7, 32), jnp.float32, 0.2, True, True),  # 35 tokens: blocks of one token
])
def test_the_kernel_matches_its_reference_forward_and_gradients(shape, dtype, rate, bias, a_bias):
    """y, dx, da, dscale, dbias and da_bias of the interpreted kernel against XLA's computation with
    the same mask: float32 within 1e-5 of the largest; bfloat16 within one of its steps."""
    x, a, scale, b, dy = inputs(shape, dtype, bias)
    ab = 0.3 * jax.random.normal(jax.random.key(5), (shape[-1],)) if a_bias else None  # [width] float32
    kw = dict(key=jax.random.key(7), rate=rate, a_bias=ab)
    got = forward_and_grads(interpreted(), x, a, scale, b, dy, **kw)
    want = forward_and_grads(fused_norm.reference_add_norm, x, a, scale, b, dy, **kw)
    tol = 1e-5 if dtype == jnp.float32 else 2 ** -6
    for u, v in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        u, v = np.asarray(u, np.float32), np.asarray(v, np.float32)
        assert u.shape == v.shape
        assert np.abs(u - v).max() <= tol * max(1.0, np.abs(v).max())


def test_a_tiling_changes_the_blocks_not_the_numbers(tiling=(4, 4, 1, 16)):
    """`NormTiling` (what the GPU script's kernels stage times): the same outputs and gradients as the
    default blocks, the dropout mask included, since it is keyed by token, not by block."""
    x, a, scale, b, dy = inputs((2, 16, 64), jnp.float32, True)
    kw = dict(key=jax.random.key(7), rate=0.1, a_bias=0.3 * jax.random.normal(jax.random.key(5), (64,)))
    want = forward_and_grads(interpreted(), x, a, scale, b, dy, **kw)
    got = forward_and_grads(interpreted(), x, a, scale, b, dy, **kw, tiling=fused_norm.NormTiling(*tiling))
    for u, v in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):  # sums over other programs
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=1e-6, atol=1e-6 * np.abs(v).max())

    def program(t, i):  # the forward's (i = 0) or the backward's (1) blocks only differ
        t = fused_norm.NormTiling(*t[:2]) if i == 0 else fused_norm.NormTiling(8, 8, *t[2:])
        f = lambda x: interpreted()(x, a, scale, b, eps=1e-12, key=kw["key"], rate=0.1, tiling=t).sum()  # noqa: E731
        return jax.jit(jax.grad(f)).lower(x).as_text()

    assert all(program((8, 8, 2, 1024), i) != program(tiling, i) for i in (0, 1))  # the tiling reached both
    with pytest.raises(ValueError, match=r"NormTiling\(rows=3, .*\): expected rows, step_rows and programs powers"):
        fused_norm.NormTiling(3)


def test_dropout_keeps_one_minus_the_rate_and_the_key_changes_the_mask():
    """The mask keeps ~90% at rate 0.1 (every token and feature its own bits), the same key gives the
    same output, another key another; a dropped element's gradient da is 0, a kept one's dx / 0.9."""
    keep = np.asarray(fused_norm.norm_keep(jax.random.key(1), 0.1, jnp.arange(512), 768))  # [512, 768]
    assert abs(keep.mean() - 0.9) < 0.003
    assert 0.85 < keep.mean(axis=1).min() and keep.mean(axis=1).max() < 0.95
    assert not np.array_equal(keep[0], keep[1])
    x, a, scale, b, dy = inputs((2, 16, 64), jnp.float32)
    run = interpreted()
    y1, (dx, da, *_) = forward_and_grads(run, x, a, scale, b, dy, key=jax.random.key(1), rate=0.1)
    y2, _ = forward_and_grads(run, x, a, scale, b, dy, key=jax.random.key(1), rate=0.1)
    y3, _ = forward_and_grads(run, x, a, scale, b, dy, key=jax.random.key(2), rate=0.1)
    assert np.array_equal(y1, y2) and not np.allclose(y1, y3)
    kept = np.asarray(fused_norm.norm_keep(jax.random.key(1), 0.1, jnp.arange(32), 64)).reshape(da.shape)
    np.testing.assert_allclose(np.asarray(da)[kept], np.asarray(dx)[kept] / 0.9, rtol=1e-6)
    assert not np.asarray(da)[~kept].any()


def test_a_shard_of_tokens_draws_its_part_of_the_whole_mask():
    """Tokens numbered by ``tokens`` draw the whole run's mask for those tokens: the second half of a
    batch run alone, numbered 32..63, gives the whole run's second half."""
    x, a, scale, b, _ = inputs((4, 16, 64), jnp.float32)
    run = interpreted()
    whole = run(x, a, scale, b, eps=1e-12, key=jax.random.key(3), rate=0.1)
    half = run(x[2:], a[2:], scale, b, eps=1e-12, key=jax.random.key(3), rate=0.1,
               tokens=jnp.arange(32, 64).reshape(2, 16))
    np.testing.assert_array_equal(np.asarray(half), np.asarray(whole)[2:])


@pytest.mark.parametrize("width,dtype,applies", [(768, jnp.bfloat16, True), (1024, jnp.float32, True),
                                                 (40, jnp.float32, False), (64, jnp.int32, False)])
def test_norm_applies(width, dtype, applies):
    assert fused_norm.norm_applies(width, dtype) is applies


def test_bad_calls_are_clear_errors():
    x, a, scale, b, _ = inputs((2, 8, 64), jnp.float32)
    with pytest.raises(ValueError, match="multiple of 32"):
        fused_norm.add_dropout_norm(x[..., :40], a[..., :40], scale[:40], eps=1e-12)
    with pytest.raises(ValueError, match="one shape and dtype"):
        fused_norm.add_dropout_norm(x, a.astype(jnp.bfloat16), scale, eps=1e-12)
    with pytest.raises(ValueError, match="a_bias of that width"):
        fused_norm.add_dropout_norm(x, a, scale, b, a_bias=b[:32], eps=1e-12)
    with pytest.raises(ValueError, match="a key when > 0"):
        fused_norm.add_dropout_norm(x, a, scale, eps=1e-12, rate=0.1)


def encoder(cfg: BertConfig):
    return nnx.split(BertEncoder(cfg, rngs=nnx.Rngs(0)))


@pytest.mark.parametrize("scan", [False, pytest.param(True, marks=SLOW)], ids=["unrolled", "scanned"])
def test_the_encoder_with_the_fused_norm_matches_xla_without_dropout(scan):
    """norm_impl "fused_interpret" gives XLA's encoder output (1e-5 of the largest) and parameter
    gradients (1e-4), the norms' scale and bias included, in evaluation mode."""
    cfg = BertConfig.from_size("tiny", vocab_size=97, num_layers=2, scan_layers=scan)
    ids = jnp.asarray(np.random.default_rng(0).integers(5, 97, (2, 32)), jnp.int32)  # [batch, length]
    mask = jnp.ones((2, 32), jnp.int32).at[1, 20:].set(0)  # [batch, length]
    cot = jax.random.normal(jax.random.key(3), (2, 32, cfg.hidden_size))
    results = []
    for impl in ("xla", "fused_interpret"):
        graphdef, params = encoder(dataclasses.replace(cfg, norm_impl=impl))

        def f(p, graphdef=graphdef):
            out = nnx.merge(graphdef, p)(ids, mask, jnp.zeros_like(ids)).sequence_output
            return jnp.sum(out * cot), out

        (_, out), grads = jax.jit(jax.value_and_grad(f, has_aux=True))(params)
        flat = np.concatenate([np.ravel(x) for x in jax.tree.leaves(grads)])
        results.append((np.asarray(out), flat))
    (a, g), (b, h) = results
    assert np.abs(a - b).max() <= 1e-5 * np.abs(a).max()
    assert np.abs(g - h).max() <= 1e-4 * np.abs(g).max()


def test_the_encoder_draws_hidden_dropout_inside_the_kernel_on_a_mesh():
    """In training mode the encoder under "fused_interpret" keeps its hidden dropout (the output moves
    off the deterministic one), repeats with the same keys, and on a mesh of 8 devices (data 4 x
    tensor 2, the kernel per shard) gives the one device's numbers: the mask does not depend on the
    split."""
    cfg = BertConfig.from_size("tiny", vocab_size=97, num_layers=2, hidden_dropout_prob=0.1,
                               attention_dropout_prob=0.0, norm_impl="fused_interpret")
    ids = jnp.asarray(np.random.default_rng(1).integers(5, 97, (4, 32)), jnp.int32)  # [batch, length]
    out = encoder_outputs(cfg, ids, jnp.ones((4, 32), jnp.int32))
    assert out["shard_map"]  # the kernel ran per shard
    assert np.array_equal(out["one"], out["twice"])
    assert np.abs(out["one"] - out["sharded"]).max() <= 1e-5 * np.abs(out["one"]).max()
    assert not np.allclose(out["one"], out["deterministic"], atol=1e-3)
