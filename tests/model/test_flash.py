"""The GPU's flash attention with dropout (bert_jax/model/flash.py), checked on the CPU in Pallas'
interpreter: the kernel against its computation in XLA (`reference_attention`, the same dropout mask
drawn outside the kernel), forward and gradients; the mask's statistics and its independence from how
rows and heads are split; the encoder under ``attention_impl="flash"`` against XLA's attention. The
kernel compiled by Triton for a real GPU: tests/gpu (and `tests/benchmark/test_aot.py`, compiled for an
H100 without one)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bert_jax.model import flash
from bert_jax.model.config import BertConfig
from bert_jax.model.encoder import BertEncoder, packed_mask
from tests.fixtures.dropout_on_mesh import encoder_outputs


def qkv(batch=2, length=128, heads=2, head_dim=32, dtype=jnp.float32, seed=0):
    keys = jax.random.split(jax.random.key(seed), 3)
    shape = (batch, length, heads, head_dim)  # [batch, length, heads, kv]
    return tuple(jax.random.normal(k, shape, dtype) for k in keys)


def segment_ids(packed: bool, length: int = 128) -> jax.Array:
    """Row 1 padded after 3/4 of ``length``; ``packed``: row 0 holds two examples (ids 1 and 2), split
    off the blocks' boundaries."""
    ids = np.ones((2, length), np.int32)
    ids[1, length * 3 // 4 + 3:] = 0
    if packed:
        ids[0, length // 2 - 5:] = 2
    return jnp.asarray(ids)


SLOW = pytest.mark.slow


@pytest.mark.parametrize("rate,window,packed", [pytest.param(0.0, 0, False, marks=SLOW), (0.1, 0, False),
                                                pytest.param(0.1, 0, True, marks=SLOW), (0.3, 32, False),
                                                pytest.param(0.0, 48, True, marks=SLOW)])
def test_the_kernel_matches_its_reference_forward_and_gradients(rate, window, packed):
    """The interpreted kernel gives `reference_attention`'s output and q, k, v and bias gradients
    (float32, 1e-5 of the largest) at real queries: padding, two examples in a row, a local window,
    dropout; the projections' biases added inside the kernel."""
    q, k, v = qkv()
    bias = 0.5 * jax.random.normal(jax.random.key(6), (3, *q.shape[2:]))  # [3, heads, kv]
    ids = segment_ids(packed)
    real = (ids > 0)[:, :, None, None]  # [batch, length, 1, 1]
    cot = jax.random.normal(jax.random.key(5), q.shape) * real  # padded queries carry no cotangent
    key = jax.random.key(7)

    def run(fn):
        def loss(q, k, v, bias):
            out = fn(q, k, v, ids, bias=bias, key=key, rate=rate, window=window)
            return jnp.sum(out * cot), out

        (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True))(q, k, v, bias)
        return np.where(real, out, 0), grads

    got, got_grads = run(lambda *a, **kw: flash.flash_attention(*a, **kw, interpret=True))
    want, want_grads = run(flash.reference_attention)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    for name, g, h in zip(["q", "k", "v", "bias"], got_grads, want_grads, strict=True):
        assert np.abs(g - h).max() <= 1e-5 * np.abs(h).max(), name
    # the kernel returns the key bias's gradient as 0 without summing dk: XLA's is 0 but for rounding
    assert np.abs(want_grads[3][1]).max() <= 1e-5 * np.abs(want_grads[3]).max()


def test_the_mask_packs_into_words_and_back():
    """The forward keeps its dropout mask as bits (key c of a block in bit c % 32 of word c // 32)."""
    keep = jax.random.bernoulli(jax.random.key(0), 0.9, (64, 128))
    words = flash.pack(keep)
    assert words.shape == (64, 4) and words.dtype == jnp.uint32
    assert int(words[3, 1]) == sum(int(keep[3, 32 + c]) << c for c in range(32))
    assert np.array_equal(flash.unpack(words), keep)


@pytest.mark.parametrize("block,warps", [(48, 4), (16, 4), (64, 3)])
def test_a_tiling_the_kernel_cannot_take_is_a_clear_error(block, warps):
    with pytest.raises(ValueError, match=f"Tiling\\(block={block}, warps={warps}\\).*power of two"):
        flash.Tiling(block=block, warps=warps)


def test_another_tiling_computes_the_same():
    """Blocks of 128 tokens and 8 warps (what the GPU script times beside the default): the same
    output and gradients as the default's 64 at a window that straddles blocks."""
    q, k, v = qkv(length=256)
    ids = jnp.ones((2, 256), jnp.int32).at[1, 200:].set(0)
    key = jax.random.key(2)

    def grads(tiling):
        def loss(q, k, v):
            out = flash.flash_attention(q, k, v, ids, key=key, rate=0.1, window=96, tiling=tiling, interpret=True)
            return jnp.sum(out * (ids > 0)[:, :, None, None] * v)

        return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

    for a, b in zip(grads(flash.Tiling()), grads(flash.Tiling(block=128, warps=8)), strict=True):
        assert np.abs(a - b).max() <= 1e-5 * np.abs(a).max()
    assert flash.Tiling(block=128).name("flash_forward", 96) == "flash_forward_window96_block128"


def test_dropout_changes_the_output_and_the_key_changes_the_mask():
    q, k, v = qkv()
    ids = segment_ids(False)
    out = {name: flash.flash_attention(q, k, v, ids, key=key, rate=rate, interpret=True)
           for name, key, rate in (("none", None, 0.0), ("a", jax.random.key(1), 0.1), ("b", jax.random.key(2), 0.1))}
    again = flash.flash_attention(q, k, v, ids, key=jax.random.key(1), rate=0.1, interpret=True)
    assert np.array_equal(out["a"], again)  # same key, same numbers
    assert not np.allclose(out["a"], out["none"], atol=1e-3) and not np.allclose(out["a"], out["b"], atol=1e-3)


def test_the_mask_keeps_one_minus_the_rate_and_differs_per_row_and_head():
    """16 random bits per probability: the kept share within 4 standard deviations of the 16-bit keep
    probability (1 - round(rate · 2^16) / 2^16); rows and heads draw their own masks."""
    shape = (4, 3, 128, 128)  # [batch, heads, T, S]
    for rate in (0.1, 0.5):
        keep = np.asarray(flash.dropout_keep(jax.random.key(0), rate, shape))
        p = 1 - flash.threshold(rate) / 2**16
        assert abs(keep.mean() - p) <= 4 * np.sqrt(p * (1 - p) / keep.size), (rate, keep.mean())
        assert not np.array_equal(keep[0, 0], keep[1, 0]) and not np.array_equal(keep[0, 0], keep[0, 1])
        neighbours = (keep[..., 1:] == keep[..., :-1]).mean()  # keys sharing a Threefry call are not alike
        assert abs(neighbours - (p * p + (1 - p) * (1 - p))) < 0.01
    assert flash.threshold(0.1) == 6554


def test_a_shard_of_rows_and_heads_draws_its_part_of_the_whole_mask():
    """Given its global row and head numbers, a slice of the batch and heads (what one device holds)
    computes exactly its part of the whole call: the mask does not depend on the split."""
    q, k, v = qkv(batch=4, heads=4)
    ids = jnp.ones((4, 128), jnp.int32)
    key = jax.random.key(3)
    whole = flash.flash_attention(q, k, v, ids, key=key, rate=0.2, interpret=True)
    part = (slice(2, 4), slice(None), slice(1, 3))
    shard = flash.flash_attention(q[part], k[part], v[part], ids[2:], key=key, rate=0.2, interpret=True,
                                  rows=jnp.arange(2, 4, dtype=jnp.int32), heads=jnp.arange(1, 3, dtype=jnp.int32))
    assert np.array_equal(shard, whole[part])


@pytest.mark.parametrize("length,window", [(128, 0), (256, 32), (1024, 128), (512, 200)])
def test_block_pairs_are_the_key_blocks_each_query_block_loops_over(length, window):
    """`block_pairs` (what the roofline counts) is the sum of the kernel's loop bounds (`key_blocks`)."""
    loops = [flash.key_blocks(i * flash.BLOCK, flash.BLOCK, flash.BLOCK, length, window)
             for i in range(length // flash.BLOCK)]
    assert flash.block_pairs(length, window) == sum(int(last) - int(first) for first, last in loops)


@pytest.mark.parametrize("length,head_dim,dtype,applies", [(128, 64, "bfloat16", True), (96, 64, "bfloat16", False),
                                                           (128, 48, "bfloat16", False), (1024, 128, "float16", True),
                                                           (128, 64, "int8", False)])
def test_flash_applies(length, head_dim, dtype, applies):
    assert flash.flash_applies(length, head_dim, dtype) == applies


def test_bad_calls_are_clear_errors():
    q, k, v = qkv(length=96)
    with pytest.raises(ValueError, match=r"multiple of 64.*\(2, 96, 2, 32\)"):
        flash.flash_attention(q, k, v, jnp.ones((2, 96), jnp.int32), interpret=True)
    q, k, v = qkv()
    with pytest.raises(ValueError, match="dropout rate 0.1.*a key"):
        flash.flash_attention(q, k, v, jnp.ones((2, 128), jnp.int32), rate=0.1, interpret=True)


def encoder(cfg: BertConfig):
    model = BertEncoder(cfg, rngs=nnx.Rngs(0))
    return nnx.split(model)


@pytest.mark.parametrize("family,scan,packed", [("bert", False, False), pytest.param("bert", True, True, marks=SLOW),
                                                pytest.param("modernbert", False, False, marks=SLOW),
                                                pytest.param("modernbert", True, False, marks=SLOW)])
def test_the_encoder_with_flash_matches_xla_without_dropout(family, scan, packed):
    """attention_impl "flash" (interpreted) gives XLA's encoder output (1e-5 of the largest) and
    parameter gradients (1e-4) at real tokens: padded and packed rows, ModernBERT's local window
    (scanned: the layer's kernel chosen by ``lax.cond``)."""
    size = "modernbert-tiny" if family == "modernbert" else "tiny"
    extra = dict(local_window=32, global_every=2) if family == "modernbert" else {}
    cfg = BertConfig.from_size(size, vocab_size=97, num_layers=2, scan_layers=scan, hidden_dropout_prob=0.0,
                               attention_dropout_prob=0.0, **extra)
    length = 64  # one block of the kernel: its blocks' loops are the kernel tests' (lengths 128, 256)
    ids = jnp.asarray(np.random.default_rng(0).integers(5, 97, (2, length)), jnp.int32)  # [batch, length]
    mask = segment_ids(False, length) > 0  # [batch, length]
    attention_mask = packed_mask(segment_ids(True, length) * mask) if packed else None
    cot = jax.random.normal(jax.random.key(3), (2, length, cfg.hidden_size)) * mask[..., None]
    results = []
    for impl in ("xla", "flash_interpret"):
        graphdef, params = encoder(dataclasses.replace(cfg, attention_impl=impl))

        def f(p, graphdef=graphdef):
            out = nnx.merge(graphdef, p)(ids, mask, jnp.zeros_like(ids), attention_mask=attention_mask).sequence_output
            return jnp.sum(out * cot), out

        (_, out), grads = jax.jit(jax.value_and_grad(f, has_aux=True))(params)
        flat = np.concatenate([np.ravel(x) for x in jax.tree.leaves(grads)])
        results.append((np.asarray(out)[np.asarray(mask)], flat))
    (a, g), (b, h) = results
    assert np.abs(a - b).max() <= 1e-5 * np.abs(a).max()
    assert np.abs(g - h).max() <= 1e-4 * np.abs(g).max()


@pytest.mark.parametrize("scan", [False, pytest.param(True, marks=SLOW)], ids=["unrolled", "scanned"])
def test_the_encoder_draws_attention_dropout_inside_the_kernel_on_a_mesh(scan):
    """In training mode the encoder under "flash" keeps its attention dropout (the output moves off the
    deterministic one), repeats with the same keys, and on a mesh of 8 devices (data 4 x tensor 2, the
    kernel per shard) gives the one device's numbers: the mask does not depend on the split."""
    cfg = BertConfig.from_size("tiny", vocab_size=97, num_layers=2, hidden_dropout_prob=0.0,
                               attention_dropout_prob=0.1, attention_impl="flash_interpret", scan_layers=scan)
    ids = jnp.asarray(np.random.default_rng(1).integers(5, 97, (4, 128)), jnp.int32)  # [batch, length]
    mask = jnp.ones((4, 128), jnp.int32).at[2, 70:].set(0)  # [batch, length]
    out = encoder_outputs(cfg, ids, mask)
    real = np.asarray(mask, bool)
    assert out["shard_map"]  # the kernel ran per shard
    assert np.array_equal(out["one"], out["twice"])
    assert np.abs(out["one"] - out["sharded"])[real].max() <= 1e-5 * np.abs(out["one"]).max()
    assert not np.allclose(out["one"][real], out["deterministic"][real], atol=1e-3)
