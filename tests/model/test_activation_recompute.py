"""With ``recompute_activation`` (resolved on for CPUs and GPUs, off for TPUs: tests/test_resolve.py)
the dense feed-forward block recomputes its activation in the backward from its input
(bert_jax/model/layers.py, `FeedForward`): the same outputs and gradients as differentiating it
through, and no erf/tanh intermediate kept from the forward to the backward; GeGLU is differentiated
through its own backward (`layers.gated`), where the recompute measured no gain (docs/records.md,
"GELU recomputed in the backward"). GeGLU's exact GELU is computed through erf (`layers.erf_gelu`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bert_jax.model.config import BertConfig
from bert_jax.model.layers import FeedForward, erf_gelu, gated

KINDS = {  # BERT's exact GELU, ALBERT's tanh form, ModernBERT's GeGLU; each asked to recompute
    "gelu": dict(hidden_act="gelu"), "gelu_new": dict(hidden_act="gelu_new"),
    "geglu": dict(hidden_act="gelu", ffn="geglu"),
}
ON = dict(recompute_activation=True)


def through(ffn: FeedForward, x):
    """The block without the recompute: its layers called in order, differentiated through."""
    y = ffn.intermediate(x)  # [*tokens, mlp] or [*tokens, 2, mlp]
    y = ffn.act(y[..., 0, :]) * y[..., 1, :] if ffn.geglu else ffn.act(y)
    return ffn.output(y)  # [*tokens, embed]


@pytest.mark.parametrize("kind", KINDS)
def test_the_recompute_gives_the_same_values_and_gradients(kind):
    cfg = BertConfig.from_size("tiny", **KINDS[kind], **ON)
    graphdef, params = nnx.split(FeedForward(cfg, rngs=nnx.Rngs(0)))
    x = jax.random.normal(jax.random.key(0), (2, 8, cfg.hidden_size)) * 3  # [batch, length, embed]
    g = jax.random.normal(jax.random.key(1), x.shape)  # a cotangent

    def block(params, x, fn):
        return fn(nnx.merge(graphdef, params), x)

    y, back = jax.vjp(lambda p, x: block(p, x, lambda m, x: m(x)), params, x)
    y_ref, back_ref = jax.vjp(lambda p, x: block(p, x, through), params, x)
    np.testing.assert_allclose(np.asarray(y), np.asarray(y_ref), rtol=1e-6, atol=1e-6)
    for a, b in zip(jax.tree.leaves(back(g)), jax.tree.leaves(back_ref(g)), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("recompute", [True, False])
def test_the_backward_recomputes_the_activation(kind, recompute):
    """The differentiated dense block holds a ``checkpoint`` (remat) around its activation when asked;
    GeGLU's and the block differentiated through hold none."""
    cfg = BertConfig.from_size("tiny", dtype="bfloat16", recompute_activation=recompute, **KINDS[kind])
    graphdef, params = nnx.split(FeedForward(cfg, rngs=nnx.Rngs(0)))
    x = jnp.ones((2, 8, cfg.hidden_size), jnp.bfloat16)  # [batch, length, embed]

    def jaxpr(fn):
        return str(jax.make_jaxpr(jax.grad(lambda p: fn(nnx.merge(graphdef, p), x).astype(jnp.float32).sum()))(params))

    assert ("remat" in jaxpr(lambda m, x: m(x))) == (recompute and kind != "geglu")
    assert "remat" not in jaxpr(through)


@pytest.mark.parametrize("kind", ["gelu", "gelu_new"])
def test_the_recompute_keeps_the_product_without_the_bias(kind):
    """The recomputed activation adds the intermediate bias itself: what the backward keeps is the
    matmul's product as written (the checkpoint's input comes from dot_general), not a second
    [tokens, mlp] array holding product + bias (docs/records.md, "GELU recomputed in the backward")."""
    cfg = BertConfig.from_size("tiny", dtype="bfloat16", recompute_activation=True, **KINDS[kind])
    ffn = FeedForward(cfg, rngs=nnx.Rngs(0))
    jaxpr = jax.make_jaxpr(ffn)(jnp.ones((2, 8, cfg.hidden_size), jnp.bfloat16)).jaxpr
    made_by = {}
    for eqn in jaxpr.eqns:
        made_by.update({v: eqn.primitive.name for v in eqn.outvars})
        if eqn.primitive.name.startswith("remat"):
            assert made_by.get(eqn.invars[0]) == "dot_general"
            assert eqn.invars[1].aval.shape == (cfg.intermediate_size,)  # the bias, added inside
            return
    raise AssertionError("no checkpoint around the activation")


def test_erf_gelu_is_the_exact_form():
    """`erf_gelu` (through erf, in float32) gives ``jax.nn.gelu``'s exact form (through erfc) within
    float32's rounding, and in bfloat16 the float32 value rounded."""
    x = jnp.linspace(-8.0, 8.0, 2001)  # [2001] float32
    want = np.asarray(jax.nn.gelu(x, approximate=False))
    np.testing.assert_allclose(np.asarray(erf_gelu(x)), want, rtol=1e-6, atol=1e-6)
    xb = x.astype(jnp.bfloat16)  # [2001]: the float32 inputs as bfloat16 holds them
    got = np.asarray(erf_gelu(xb), np.float32)
    want = np.asarray(jax.nn.gelu(xb.astype(jnp.float32), approximate=False))
    np.testing.assert_allclose(got, want, rtol=2 ** -8, atol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_geglus_backward_is_autodiffs(dtype):
    """`gated`'s own backward (one pass writing [du, dg]) gives autodiff's gradient of act(u) · g:
    float32 within 1e-6, bfloat16 within one step of its float32 value."""
    p = (3 * jax.random.normal(jax.random.key(0), (4, 16, 2, 64))).astype(dtype)  # [batch, length, 2, mlp]
    dy = jax.random.normal(jax.random.key(1), (4, 16, 64)).astype(dtype)  # [batch, length, mlp]
    got = jax.vjp(lambda p: gated(erf_gelu, p), p)[1](dy)[0]
    p32, dy32 = p.astype(jnp.float32), dy.astype(jnp.float32)
    want = jax.vjp(lambda p: erf_gelu(p[..., 0, :]) * p[..., 1, :], p32)[1](dy32)[0]
    assert got.dtype == dtype and got.shape == p.shape
    tol = 1e-6 if dtype == jnp.float32 else 2 ** -8
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want), rtol=tol, atol=tol)


@pytest.mark.parametrize("recompute", [True, False])
def test_gelu_through_erf_gives_the_same_block(recompute):
    """``gelu_impl="erf"`` (the GPU's choice: tests/test_resolve.py) runs the dense block's and the
    heads' exact GELU through erf, not erfc, with the same float32 outputs and gradients."""
    from bert_jax.model.heads import MaskedLMHead

    x = jax.random.normal(jax.random.key(0), (2, 8, 128)) * 3  # [batch, length, embed]
    results, jaxprs = {}, {}
    for impl in ("erfc", "erf"):
        cfg = BertConfig.from_size("tiny", recompute_activation=recompute, gelu_impl=impl)
        graphdef, params = nnx.split(FeedForward(cfg, rngs=nnx.Rngs(0)))

        def f(p, x, graphdef=graphdef):
            return nnx.merge(graphdef, p)(x)

        y, back = jax.vjp(f, params, x)
        results[impl] = [y, *jax.tree.leaves(back(jnp.ones_like(y)))]
        jaxprs[impl] = str(jax.make_jaxpr(jax.grad(lambda p, f=f: f(p, x).sum()))(params))
        jaxprs[impl, "head"] = str(jax.make_jaxpr(MaskedLMHead(cfg, rngs=nnx.Rngs(0)).act)(x))
    for a, b in zip(results["erf"], results["erfc"], strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
    assert " erfc " in jaxprs["erfc"] and " erfc " not in jaxprs["erf"] and " erf " in jaxprs["erf"]
    assert " erfc " in jaxprs["erfc", "head"] and " erf " in jaxprs["erf", "head"]
