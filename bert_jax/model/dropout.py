"""Dropout whose random bits are cheap on a CPU: Threefry-2x32 unrolled into the dropout's own fusion.

``jax.random.bernoulli`` draws its bits with Threefry-2x32 too, but on the CPU JAX lowers Threefry as
a rolled loop (5 iterations of 4 rounds, each a separate pass over arrays the size of the mask):
10% of a BERT-base training step's summed op time at B=8, though little of its wall time, the loop
running beside the matmuls on a second core (docs/records.md, "CPU defaults: unrolled
blocks, fused dropout, micro-batches of 8"). ``impl="fused"`` computes the same 20-round Threefry-2x32
(Salmon et al., 2011; checked against ``jax.extend.random.threefry_2x32`` in
tests/model/test_dropout.py) as plain element-wise integer ops, one counter per element (the
element's index), keyed by the dropout key's bits; XLA fuses it with the select, so the mask costs
one pass over the activations. An element is kept when its 32 random bits are at least
``round(rate * 2**32)``: a keep probability within 2**-32 of ``1 - rate``, and the kept values are
scaled by exactly ``1 / (1 - rate)``.

``impl="jax"`` is ``flax.nnx.Dropout``'s computation (``jax.random.bernoulli``; bit for bit the
numbers of before), the model's default. A job config's auto value is "fused" on the CPU and
"jax" elsewhere (`bert_jax.resolve.resolve_dropout`, once when a job starts): GPUs already
get the unrolled Threefry from JAX, and TPUs a hardware generator with ``rng_impl="rbg"``.
The two give different masks (both are reproducible: same key, same mask).

The Pallas kernels' masks (bert_jax/model/flash.py, fused_norm.py) come from here too: `bits16` (16
Threefry bits an element, one call for 4), `threshold`, and `pack` / `unpack`, the bits a kernel keeps
for its backward.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))  # Threefry-2x32's rotation constants, alternating per 4 rounds
KS_PARITY = np.uint32(0x1BD11BDA)


def threefry2x32(k0, k1, x0, x1):
    """Threefry-2x32 with 20 rounds on uint32 arrays (broadcasting): key (k0, k1), counter (x0, x1)
    → two uint32 words of random bits, as ``jax.extend.random.threefry_2x32`` computes them."""
    ks = (k0, k1, k0 ^ k1 ^ KS_PARITY)
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for i in range(5):
        for r in ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = (x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r))
            x1 = x0 ^ x1
        x0 = x0 + ks[(i + 1) % 3]
        x1 = x1 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x0, x1


def bits16(k0, k1, x0, x1) -> jax.Array:
    """16 random bits for each of 4 neighbours per counter: `threefry2x32` of key (k0, k1) at counters
    (x0 [..., Q], x1 broadcasting), its two words split in four, neighbour 4 q + 2 · half + word.
    Returns [..., 4 Q] uint32 below 2¹⁶ (the Pallas kernels' dropout: one call per 4 elements)."""
    w0, w1 = threefry2x32(k0, k1, x0, x1)  # [..., Q] each
    shape = w0.shape[:-1] + (2 * w0.shape[-1],)

    def halves(w):  # [..., 2 Q]: (low, high) 16 bits side by side
        return jnp.stack([w & np.uint32(0xFFFF), w >> np.uint32(16)], axis=-1).reshape(shape)

    return jnp.stack([halves(w0), halves(w1)], axis=-1).reshape(shape[:-1] + (2 * shape[-1],))


def threshold(rate: float) -> int:
    """An element is dropped when its 16 random bits (`bits16`) are below this."""
    return min(round(rate * 2**16), 2**16 - 1)


def pack(keep: jax.Array) -> jax.Array:
    """A dropout mask [R, C] (bool, C a multiple of 32) as bits: [R, C / 32] uint32, column c in bit c % 32
    (how the Pallas kernels keep their masks for the backward)."""
    rows, cols = keep.shape
    bits = keep.astype(jnp.uint32).reshape(rows, cols // 32, 32) << jnp.arange(32, dtype=jnp.uint32)
    return bits.sum(axis=-1, dtype=jnp.uint32)  # distinct bits: the sum is their OR


def unpack(words: jax.Array) -> jax.Array:
    """`pack`'s inverse: [R, W] uint32 → [R, 32 W] bool."""
    rows, width = words.shape
    return ((words[:, :, None] >> jnp.arange(32, dtype=jnp.uint32)) & np.uint32(1)).reshape(rows, 32 * width) == 1


def key_words(key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Two uint32 words of a typed PRNG key (threefry: its 2 words; rbg's 4 folded into 2)."""
    data = jax.random.key_data(key).reshape(-1)  # [words] uint32
    if data.shape[0] == 2:
        return data[0], data[1]
    half = data.shape[0] // 2
    return jnp.bitwise_xor.reduce(data[:half]), jnp.bitwise_xor.reduce(data[half:])


def counters(shape: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
    """Per-element Threefry counters: (index within the trailing axes, index along the leading axis),
    unique while the trailing axes hold fewer than 2**32 elements."""
    if len(shape) < 2:
        return jax.lax.iota(jnp.uint32, max(1, int(np.prod(shape)))).reshape(shape), jnp.zeros(shape, jnp.uint32)
    trailing = int(np.prod(shape[1:]))
    if trailing >= 2**32:
        raise ValueError(f"dropout over {shape}: the trailing axes hold {trailing} >= 2**32 elements")
    flat = jax.lax.broadcasted_iota(jnp.uint32, (shape[0], trailing), 1).reshape(shape)  # [lead, *rest]
    lead = jax.lax.broadcasted_iota(jnp.uint32, shape, 0)
    return flat, lead


def fused_dropout(key: jax.Array, x: jax.Array, rate: float) -> jax.Array:
    """x with each element kept (scaled by 1 / (1 - rate)) or zeroed, from Threefry bits of ``key``."""
    k0, k1 = key_words(key)
    x0, x1 = counters(x.shape)
    bits, _ = threefry2x32(k0, k1, x0, x1)  # [*x.shape] uint32
    threshold = np.uint32(min(round(rate * 2.0**32), 2**32 - 1))
    return jnp.where(bits >= threshold, x * jnp.asarray(1.0 / (1.0 - rate), x.dtype), jnp.zeros((), x.dtype))


class Dropout(nnx.Module):
    """``nnx.Dropout(rate)`` with a choice of how the mask's bits are drawn (``impl``: jax | fused)."""

    def __init__(self, rate: float, impl: str = "jax"):
        if impl not in ("jax", "fused"):
            raise ValueError(f"dropout_impl {impl!r}: expected 'jax' or 'fused' (a job config's 'auto' is "
                             "resolved for its platform by bert_jax.resolve before a model is built)")
        self.rate, self.impl = rate, impl

    def __call__(self, x, *, deterministic: bool, rngs: nnx.Rngs | None = None):
        if deterministic or self.rate == 0.0:
            return x
        if rngs is None:
            raise ValueError("dropout in training mode needs rngs=nnx.Rngs(dropout=key)")
        key = rngs.dropout()
        with jax.named_scope("dropout"):  # the profile's "dropout" row (bert_jax/benchmark/profile.py)
            if self.impl == "fused":
                return fused_dropout(key, x, self.rate)
            keep_prob = 1.0 - self.rate  # flax.nnx.Dropout's computation
            mask = jax.random.bernoulli(key, p=keep_prob, shape=x.shape)
            return jax.lax.select(mask, x / keep_prob, jnp.zeros_like(x))
