"""Softmax cross-entropy over a vocabulary with integer labels, with a backward of its own.

`softmax_cross_entropy(logits, labels)` gives what `optax.softmax_cross_entropy_with_integer_labels`
gives (logsumexp(logits) − logits[label], in float32). Autodiff of optax's form differentiates the
label's pick, a gather, into a scatter into a float32 [batch, P, vocab] array of zeros, added to the
softmax's gradient by kernels of their own. Here the backward is one elementwise pass,
g · (softmax(logits) − one_hot(label)), the one-hot a comparison with the vocabulary's index: it reads
the logits and the forward's logsumexp and writes the gradient. The masked-LM loss of pre-training
(`bert_jax.pretraining.objective`); docs/records.md, "The masked-LM loss's backward in one pass".
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


@jax.custom_vjp
def softmax_cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """logits [..., vocab] (float), labels [...] int: the cross-entropy [...] float32."""
    return _forward(logits, labels)[0]


def _forward(logits, labels):
    x = logits.astype(jnp.float32)  # [..., vocab]
    lse = jax.nn.logsumexp(x, axis=-1)  # [...]
    picked = jnp.take_along_axis(x, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]  # [...]
    return lse - picked, lse


def _fwd(logits, labels):
    ce, lse = _forward(logits, labels)
    return ce, (logits, labels, lse)


def _bwd(res, g):
    logits, labels, lse = res  # [..., vocab], [...], [...]
    vocab = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)  # [..., vocab]
    soft = jnp.exp(logits.astype(jnp.float32) - lse[..., None])  # [..., vocab]
    grad = g[..., None] * (soft - (vocab == labels[..., None]).astype(jnp.float32))  # [..., vocab]
    return grad.astype(logits.dtype), None


softmax_cross_entropy.defvjp(_fwd, _bwd)
