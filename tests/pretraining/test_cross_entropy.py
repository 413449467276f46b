"""The masked-LM loss with its own backward (bert_jax/pretraining/cross_entropy.py) gives optax's numbers
and gradients, and its backward is elementwise: no scatter in the program."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax.pretraining.cross_entropy import softmax_cross_entropy


def _inputs(dtype, vocab=1000):
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    logits = (4.0 * jax.random.normal(k1, (3, 5, vocab))).astype(dtype)  # [batch, P, vocab]
    labels = jax.random.randint(k2, (3, 5), 0, vocab)  # [batch, P]
    weights = (jax.random.uniform(k3, (3, 5)) > 0.3).astype(jnp.float32)  # [batch, P]
    return logits, labels, weights


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_the_values_and_gradients_are_optax(dtype):
    logits, labels, weights = _inputs(dtype)
    ours = lambda x: (softmax_cross_entropy(x, labels) * weights).sum()
    theirs = lambda x: (optax.softmax_cross_entropy_with_integer_labels(x.astype(jnp.float32), labels) * weights).sum()
    np.testing.assert_allclose(softmax_cross_entropy(logits, labels),
                               optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels),
                               rtol=1e-6, atol=1e-6)
    g_ours, g_theirs = jax.grad(ours)(logits), jax.grad(theirs)(logits)
    assert g_ours.dtype == dtype  # the gradient in the logits' dtype
    tol = 1e-6 if dtype == jnp.float32 else 1e-2  # bfloat16: one rounding of each element
    np.testing.assert_allclose(np.asarray(g_ours, np.float32), np.asarray(g_theirs, np.float32), atol=tol)
    assert float(jnp.abs(g_ours.astype(jnp.float32)).sum()) > 1.0  # not a zero gradient


def test_a_label_of_zero_weight_has_no_gradient_and_the_gradient_rows_sum_to_zero():
    logits, labels, weights = _inputs(jnp.float32, vocab=50)
    g = jax.grad(lambda x: (softmax_cross_entropy(x, labels) * weights).sum())(logits)  # [batch, P, vocab]
    np.testing.assert_array_equal(np.asarray(g)[np.asarray(weights) == 0], 0.0)
    np.testing.assert_allclose(g.sum(-1), 0.0, atol=1e-6)  # softmax − one-hot sums to zero per position


def test_the_backward_has_no_scatter():
    logits, labels, weights = _inputs(jnp.float32)

    def program(loss) -> str:
        return jax.jit(jax.grad(lambda x: (loss(x, labels) * weights).sum())).lower(logits).as_text()

    assert "scatter" in program(optax.softmax_cross_entropy_with_integer_labels)  # the gather's transpose
    assert "scatter" not in program(softmax_cross_entropy)
