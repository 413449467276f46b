"""Splash attention (bert_jax/model/splash.py) in Pallas interpret mode on the CPU against plain XLA
attention with the boolean mask built from the same segment ids and window: forward and gradients
w.r.t. q, k, v, for padded rows, packed examples, ModernBERT's local window and global attention."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.model.encoder import packed_mask, padding_mask
from bert_jax.model.splash import (
    band_blocks,
    block_size,
    local_block_size,
    segment_ids_from_mask,
    splash_applies,
    splash_attention,
)

BATCH, HEADS = 2, 2
FORWARD_RTOL, GRAD_RTOL = 1e-5, 1e-4  # max |difference| / max |reference|, float32


def reference_mask(segment_ids, window):
    """bool [batch, T, S]: same segment, real key, and (with a window) |i - j| <= window // 2, as
    Hugging Face's ModernBERT builds its sliding-window mask (``distance <= local_attention // 2``)."""
    mask = (segment_ids[:, :, None] == segment_ids[:, None, :]) & (segment_ids[:, None, :] > 0)  # [batch, T, S]
    if window is not None:
        pos = jnp.arange(segment_ids.shape[-1])  # [length]
        mask &= (jnp.abs(pos[:, None] - pos[None, :]) <= window // 2)[None]  # [batch, T, S]
    return mask


def reference_attention(q, k, v, segment_ids, window):
    """q, k, v: [batch, length, heads, kv] → context [batch, length, heads, kv]; padding query rows
    (fully masked here: their values are meaningless) zeroed, as splash_attention returns them."""
    mask = reference_mask(segment_ids, window)  # [batch, T, S]
    logits = jnp.einsum("BTNH,BSNH->BNTS", q, k) / math.sqrt(q.shape[-1])  # [batch, heads, T, S]
    logits = jnp.where(mask[:, None], logits, jnp.finfo(jnp.float32).min)  # [batch, heads, T, S]
    probs = jax.nn.softmax(logits, axis=-1)  # [batch, heads, T, S]
    ctx = jnp.einsum("BNTS,BSNH->BTNH", probs, v)  # [batch, length, heads, kv]
    return jnp.where((segment_ids > 0)[:, :, None, None], ctx, 0.0)


def rows(*segments: list[tuple[int, int]], length: int) -> jnp.ndarray:
    """[batch, length] int32 segment ids, each row given as (id, count) runs, padded with 0 at the end."""
    out = np.zeros((len(segments), length), np.int32)
    for r, runs in enumerate(segments):
        ids = np.concatenate([np.full(count, sid, np.int32) for sid, count in runs])
        out[r, :len(ids)] = ids
    return jnp.asarray(out)


def rel(a, b) -> float:
    return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))


CASES = {
    # name: (length, head_dim, segment ids [batch, length], window)
    "padding": (128, 64, rows([(1, 100)], [(1, 128)], length=128), None),
    "packed": (128, 64, rows([(1, 50), (2, 40), (3, 30)], [(1, 70), (2, 58)], length=128), None),
    "window": (128, 64, rows([(1, 115)], [(1, 128)], length=128), 32),
    "window_packed": (256, 128, rows([(1, 90), (2, 100), (3, 40)], [(1, 256)], length=256), 32),
    "modernbert_window": (256, 64, rows([(1, 250)], [(1, 60), (2, 196)], length=256), 128),
    # 3 x 3 blocks of 128: the window's off-diagonal blocks are partial, the corners skipped
    "window_blocks": (384, 64, rows([(1, 200), (2, 150)], [(1, 384)], length=384), 64),
    "global": (256, 128, rows([(1, 200)], [(1, 256)], length=256), None),
    # a local layer at 512 tokens runs blocks of 128 (a global one 512): 10 of the 16 block pairs
    "window_local_blocks": (512, 64, rows([(1, 500)], [(1, 300), (2, 212)], length=512), 128),
}


@pytest.mark.parametrize("name", list(CASES))
def test_splash_matches_xla_forward_and_gradients(name):
    length, head_dim, segment_ids, window = CASES[name]
    kq, kk, kv, kc = jax.random.split(jax.random.key(list(CASES).index(name)), 4)
    shape = (BATCH, length, HEADS, head_dim)
    q, k, v = (jax.random.normal(key, shape, jnp.float32) for key in (kq, kk, kv))  # [batch, length, heads, kv]
    real = (segment_ids > 0)[:, :, None, None]  # [batch, length, 1, 1]: real query rows
    cotangent = jnp.where(real, jax.random.normal(kc, shape, jnp.float32), 0.0)  # [batch, length, heads, kv]

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v) * cotangent)

    def splash(q, k, v):
        return splash_attention(q, k, v, segment_ids, window=window, interpret=True)

    def xla(q, k, v):
        return reference_attention(q, k, v, segment_ids, window)

    got, want = jax.jit(splash)(q, k, v), jax.jit(xla)(q, k, v)
    assert got.shape == shape and got.dtype == jnp.float32
    assert bool(jnp.all(jnp.where(real, True, got == 0.0))), "padding query rows are zeros"
    forward = rel(got, want)
    grads = jax.jit(jax.grad(loss(splash), argnums=(0, 1, 2)))(q, k, v)
    ref_grads = jax.jit(jax.grad(loss(xla), argnums=(0, 1, 2)))(q, k, v)
    grad = {n: rel(g, r) for n, g, r in zip("qkv", grads, ref_grads, strict=True)}
    print(f"{name}: forward {forward:.2e}, grads " + ", ".join(f"d{n} {d:.2e}" for n, d in grad.items()))
    assert forward < FORWARD_RTOL
    assert all(d < GRAD_RTOL for d in grad.values()), grad


def test_window_changes_the_result():
    """At length 128 a window of 32 (±16) masks most keys: splash with it differs from global."""
    length, head_dim, segment_ids, _ = CASES["window"]
    keys = jax.random.split(jax.random.key(1), 3)
    q, k, v = (jax.random.normal(key, (BATCH, length, HEADS, head_dim)) for key in keys)  # [batch, length, heads, kv]
    local = splash_attention(q, k, v, segment_ids, window=32, interpret=True)
    full = splash_attention(q, k, v, segment_ids, interpret=True)
    assert float(jnp.max(jnp.abs(local - full))) > 0.1


def test_bfloat16_forward():
    """bfloat16 in, bfloat16 out, close to the float32 reference (bfloat16's ~3 significant digits)."""
    length, head_dim, segment_ids, window = CASES["packed"]
    keys = jax.random.split(jax.random.key(2), 3)
    q, k, v = (jax.random.normal(key, (BATCH, length, HEADS, head_dim)) for key in keys)  # [batch, length, heads, kv]
    got = splash_attention(*(x.astype(jnp.bfloat16) for x in (q, k, v)), segment_ids, window=window, interpret=True)
    assert got.dtype == jnp.bfloat16
    assert rel(got.astype(jnp.float32), reference_attention(q, k, v, segment_ids, window)) < 2e-2


@pytest.mark.parametrize("length", [100, 200, 640 + 64])
def test_a_length_the_kernel_cannot_block_is_a_clear_error(length):
    q = jnp.zeros((1, length, HEADS, 64))
    with pytest.raises(ValueError, match=rf"sequence length {length} is not a multiple of 128.*pads lengths"):
        splash_attention(q, q, q, jnp.ones((1, length), jnp.int32), interpret=True)


@pytest.mark.parametrize("length,block", [(128, 128), (256, 256), (384, 128), (512, 512), (768, 256), (8192, 512)])
def test_block_size_is_the_largest_dividing_the_length(length, block):
    assert block_size(length) == block


@pytest.mark.parametrize("length,window,block,pairs", [
    (1024, 128, 128, 22), (8192, 128, 128, 190), (512, 128, 128, 10), (256, 128, 256, 1)])
def test_a_local_layer_takes_the_blocks_its_band_skips_most_with(length, window, block, pairs):
    """ModernBERT-base phase 1 (1,024 tokens, window 128): blocks of 128 compute 22 of 64 block pairs
    (0.34 of the positions); blocks of 512 would compute all 4 of theirs. A tie keeps the larger block."""
    assert local_block_size(length, window) == block and band_blocks(length, block, window) == pairs
    assert band_blocks(1024, 512, 128) == 4 == band_blocks(1024, 512, None)  # 512-blocks skip nothing
    # the pairs counted are those the band reaches: every pair that holds a query-key position within it
    half, reached = window // 2, np.zeros((length // block, length // block), bool)
    for i in range(length):  # query i reaches keys i - half .. i + half: their blocks
        reached[i // block, max(i - half, 0) // block:min(i + half, length - 1) // block + 1] = True
    assert reached.sum() == pairs


@pytest.mark.parametrize("length,head_dim,dtype,applies", [
    (512, 64, jnp.bfloat16, True), (128, 128, jnp.float32, True), (1024, 256, "bfloat16", True),
    (500, 64, jnp.bfloat16, False), (0, 64, jnp.bfloat16, False), (512, 32, jnp.bfloat16, False),
    (512, 64, jnp.float16, False)])
def test_splash_applies(length, head_dim, dtype, applies):
    assert splash_applies(length, head_dim, dtype) is applies


def test_segment_ids_from_the_models_masks():
    """The ids recovered from the model's masks give those masks back (encoder.padding_mask,
    encoder.packed_mask)."""
    example_ids = rows([(1, 3), (2, 4), (3, 2)], [(1, 5), (2, 5)], [(1, 4)], length=10)  # [batch, length]
    ids = segment_ids_from_mask(packed_mask(example_ids))  # [batch, length]
    np.testing.assert_array_equal(packed_mask(ids), packed_mask(example_ids))
    np.testing.assert_array_equal(ids > 0, example_ids > 0)
    input_mask = (example_ids > 0).astype(jnp.int32)  # [batch, length]
    np.testing.assert_array_equal(segment_ids_from_mask(padding_mask(input_mask)), input_mask)


# ------------------------------------------------------------------------------------------------
# The kernel in the model: attention_impl="splash" (here "splash_interpret", what "splash" resolves to
# on the CPU) against the XLA path, through the whole encoder.
# ------------------------------------------------------------------------------------------------


def _encoder_outputs(cfg, ids, mask, attention_mask=None):
    """Last layer [batch, length, embed] and the gradient of a fixed projection of it w.r.t. the
    parameters, with ``cfg``'s attention_impl."""
    from flax import nnx

    from bert_jax.model.encoder import BertEncoder

    model = BertEncoder(cfg, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model, nnx.Param)
    cot = jax.random.normal(jax.random.key(3), (*ids.shape, cfg.hidden_size))  # [batch, length, embed]
    real = mask[..., None].astype(jnp.float32)  # [batch, length, 1]: padding rows carry no cotangent

    def f(p):
        out = nnx.merge(graphdef, p)(ids, mask, jnp.zeros_like(ids), attention_mask=attention_mask).sequence_output
        return (out * cot * real).sum(), out

    (_, out), grads = jax.value_and_grad(f, has_aux=True)(params)
    return out, grads


@pytest.mark.parametrize("family,scan,packed", [
    ("modernbert", True, False), pytest.param("modernbert", False, True, marks=pytest.mark.slow), ("bert", True, True)])
def test_the_model_with_splash_matches_xla(family, scan, packed):
    """The encoder under attention_impl "splash" (interpreted on the CPU) gives the XLA path's last layer
    (1e-5 relative) and parameter gradients (1e-4) at real positions: padded rows, packed rows, a
    ModernBERT local window (every other layer: window 32 of 128 tokens), scanned and unrolled."""
    import dataclasses

    from bert_jax.model.config import BertConfig
    from bert_jax.model.encoder import packed_mask

    size = "modernbert-tiny" if family == "modernbert" else "tiny"
    extra = dict(local_window=32, global_every=2) if family == "modernbert" else {}
    cfg = BertConfig.from_size(size, vocab_size=97, num_layers=2, scan_layers=scan, hidden_dropout_prob=0.0,
                               attention_dropout_prob=0.0, **extra)
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(5, 97, (2, 128)), jnp.int32)
    mask = np.ones((2, 128), np.int32)
    mask[1, 90:] = 0
    attention_mask = None
    if packed:
        example = np.where(np.arange(128) < 50, 1, 2)[None].repeat(2, 0) * mask  # two examples a row
        attention_mask = packed_mask(jnp.asarray(example))
    mask = jnp.asarray(mask)
    xla = _encoder_outputs(cfg, ids, mask, attention_mask)
    splash = _encoder_outputs(dataclasses.replace(cfg, attention_impl="splash_interpret"), ids, mask, attention_mask)
    real = np.asarray(mask, bool)
    a, b = np.asarray(xla[0])[real], np.asarray(splash[0])[real]
    assert np.abs(a - b).max() <= 1e-5 * np.abs(a).max()
    # Relative to the largest gradient: some are zero in exact arithmetic (the keys' bias under softmax).
    g = np.concatenate([np.ravel(x) for x in jax.tree.leaves(xla[1])])
    h = np.concatenate([np.ravel(x) for x in jax.tree.leaves(splash[1])])
    assert np.abs(g - h).max() <= 1e-4 * np.abs(g).max()


def test_splash_runs_per_shard_on_a_mesh():
    """On a mesh of 8 devices (data 4 x tensor 2) under the activation rules the kernel runs per shard
    (`activation_sharding.per_shard`: rows over data, heads over tensor) and gives the XLA path's output."""
    import dataclasses

    from flax import nnx

    from bert_jax.model.activation_sharding import rules_in_effect
    from bert_jax.model.config import BertConfig
    from bert_jax.model.encoder import BertEncoder
    from bert_jax.training.sharding import make_mesh
    from bert_jax.training.sharding_rules import DEFAULT_RULES

    mesh = make_mesh((4, 1, 2))
    cfg = BertConfig.from_size("modernbert-tiny", vocab_size=97, num_layers=2, local_window=32, global_every=2)
    ids = jnp.asarray(np.random.default_rng(1).integers(5, 97, (4, 128)), jnp.int32)  # [batch, length]
    mask = jnp.ones((4, 128), jnp.int32).at[2, 70:].set(0)  # [batch, length]
    out = {}
    for impl in ("xla", "splash_interpret"):
        model = BertEncoder(dataclasses.replace(cfg, attention_impl=impl), rngs=nnx.Rngs(0))
        graphdef, params = nnx.split(model)

        def f(p, graphdef=graphdef):
            with rules_in_effect(mesh, DEFAULT_RULES):
                return nnx.merge(graphdef, p)(ids, mask, jnp.zeros_like(ids)).sequence_output

        out[impl] = np.asarray(jax.jit(f)(params))
        if impl == "splash_interpret":
            assert "shard_map" in str(jax.make_jaxpr(f)(params))  # the kernel ran per shard
    real = np.asarray(mask, bool)
    a, b = out["xla"][real], out["splash_interpret"][real]
    assert np.abs(a - b).max() <= 1e-5 * np.abs(a).max()
