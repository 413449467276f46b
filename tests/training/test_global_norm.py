"""The global norm in grouped reductions (bert_jax/training/global_norm.py, ``config.global_norm``):
the same number as ``optax.tree.norm`` in a few reductions, through the clip, the optimizer and the
logged norms. Which platform takes which: tests/test_resolve.py."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax.training import global_norm as gn
from bert_jax.training.optim import make_optimizer
from bert_jax.training.steps import TrainState, apply_gradients, new_state
from tests.fixtures.optimizer import optimizer_config


def tree(n: int = 150, scale: float = 1.0, seed: int = 0) -> dict:
    """``n`` leaves of BERT-like shapes (matrices, vectors, a table), more than two groups' worth."""
    shapes = [(48, 64), (64,), (3, 8, 16), (1,), (200, 16)]
    keys = jax.random.split(jax.random.key(seed), n)
    return {f"p{i:03d}": scale * jax.random.normal(k, shapes[i % len(shapes)]) for i, k in enumerate(keys)}


def test_grouped_norm_is_the_tree_norm():
    """Over more leaves than two groups, in float32 and with a bfloat16 leaf among them."""
    t = tree()
    assert len(t) > 2 * gn.GROUP
    want = float(optax.tree.norm(t))
    assert float(jax.jit(gn.grouped_norm)(t)) == pytest.approx(want, rel=1e-6)
    exact = math.sqrt(sum(float(np.sum(np.asarray(x, np.float64) ** 2)) for x in t.values()))
    assert want == pytest.approx(exact, rel=1e-6)
    mixed = dict(t, p000=t["p000"].astype(jnp.bfloat16))
    assert float(gn.grouped_norm(mixed)) == pytest.approx(float(optax.tree.norm(mixed)), rel=1e-5)
    assert float(gn.grouped_norm({})) == 0.0


def test_grouped_norm_reduces_each_group_once():
    """The compiled program reads the leaves in one reduction a group (plus the groups' sum), not
    one a leaf: what makes it cheaper on a GPU, where each small reduction is a kernel launch."""
    t = tree()

    def reductions(fn) -> int:
        return jax.jit(fn).lower(t).as_text().count("stablehlo.reduce")

    assert reductions(optax.tree.norm) >= len(t)
    assert reductions(gn.grouped_norm) == math.ceil(len(t) / gn.GROUP)


def test_norm_fn_names_the_choices():
    assert gn.norm_fn("per_leaf") is optax.tree.norm and gn.norm_fn("grouped") is gn.grouped_norm
    with pytest.raises(ValueError, match=r"global_norm 'fast': expected one of \('per_leaf', 'grouped'\)"):
        gn.norm_fn("fast")


@pytest.mark.parametrize("scale", [10.0, 1e-3], ids=["clipped", "not-clipped"])
def test_the_optimizer_steps_alike_with_either_norm(scale):
    """``make_optimizer(global_norm="grouped")`` (its clip through `grouped_norm`) takes the steps
    ``optax.clip_by_global_norm`` does, whether the clip scales the gradients or not; the step's
    logged gradient and parameter norms agree too."""
    cfg = optimizer_config(learning_rate=0.1, warmup_steps=0, num_train_steps=10, clip_norm=1.0)
    params, grads = tree(seed=1), tree(scale=scale, seed=2)
    assert (float(optax.tree.norm(grads)) > cfg.clip_norm) == (scale > 1)
    out = {}
    for kind in gn.GLOBAL_NORMS:
        tx, schedule = make_optimizer(cfg, global_norm=kind)
        state: TrainState = new_state(params, tx)
        step = jax.jit(lambda s, g, tx=tx, schedule=schedule, kind=kind: apply_gradients(
            s, g, tx, schedule, {}, gn.norm_fn(kind)))
        for _ in range(2):
            state, metrics = step(state, grads)
        out[kind] = (state.params, metrics)
    (p_leaf, m_leaf), (p_grouped, m_grouped) = out["per_leaf"], out["grouped"]
    for name in params:
        np.testing.assert_allclose(p_grouped[name], p_leaf[name], rtol=1e-6, atol=1e-6)  # steps of 0.1
        assert not np.allclose(p_leaf[name], params[name])  # it stepped
    for key in ("grad_norm", "param_norm"):
        assert float(m_grouped[key]) == pytest.approx(float(m_leaf[key]), rel=1e-6)


def test_the_optimizer_state_is_the_same_tree_either_way():
    """A checkpoint a GPU wrote (grouped) restores where the norm is per leaf (a CPU): the clip keeps no
    state either way."""
    cfg, params = optimizer_config(), tree(n=3)
    states = [make_optimizer(cfg, global_norm=kind)[0].init(params) for kind in gn.GLOBAL_NORMS]
    assert jax.tree.structure(states[0]) == jax.tree.structure(states[1])
