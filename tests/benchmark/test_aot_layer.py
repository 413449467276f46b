"""The layer cost tool (bert_jax/benchmark/aot_layer.py): each part computes its forward and the
backward from a given cotangent, as the encoder does (the block's are the model's own block), and
(with libtpu, `pip install -e '.[tpu]'`; skipped without) every part compiles for a TPU, the
matmuls' FLOPs are their three products and the block's rest is what the parts leave. Its argument
errors are in tests/fixtures/bad_inputs.py."""

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bert_jax.benchmark import aot_layer
from bert_jax.model.config import BertConfig
from bert_jax.model.layers import TransformerBlock

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="needs libtpu: pip install -e '.[tpu]'")


def test_matmul_part_is_the_product_and_its_gradients():
    rng = np.random.default_rng(0)
    x, w, g = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in ((6, 4), (4, 3), (6, 3)))
    y, dx, dw = aot_layer.matmul_with_grads(x, w, g)
    np.testing.assert_allclose(y, x @ w, rtol=1e-6)
    np.testing.assert_allclose(dx, g @ w.T, rtol=1e-6)
    np.testing.assert_allclose(dw, x.T @ g, rtol=1e-6)


def test_block_part_is_the_encoder_block_in_training_mode():
    cfg = BertConfig.from_size("tiny", num_layers=1)
    graphdef, params = nnx.split(TransformerBlock(cfg, rngs=nnx.Rngs(0)))
    rng = np.random.default_rng(1)
    x, g = (jnp.asarray(rng.normal(size=(2, 8, cfg.hidden_size)), jnp.float32) for _ in range(2))
    mask = jnp.asarray(np.arange(8)[None, None, None, :] < np.array([8, 5])[:, None, None, None])
    key = jax.random.key(3)
    out, dparams, dx = aot_layer.block_with_grads(cfg, graphdef, params, x, mask, key, g)

    def loss(params, x):  # the same block, dropout from the same key: <out, g>
        block = nnx.merge(graphdef, params)
        return jnp.sum(block(x, mask, deterministic=False, rngs=nnx.Rngs(dropout=key))[0] * g)

    want_params, want_x = jax.grad(loss, argnums=(0, 1))(params, x)
    np.testing.assert_allclose(dx, want_x, rtol=1e-5, atol=1e-6)
    for got, want in zip(jax.tree.leaves(dparams), jax.tree.leaves(want_params), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    plain = nnx.merge(graphdef, params)(x, mask, deterministic=True)[0]
    assert not np.allclose(out, plain)  # dropout is on, as in pre-training


@needs_libtpu
def test_each_part_compiles_for_a_tpu(tmp_path):
    rows = aot_layer.main(["--topology", "v5e-1", "--size", "tiny", "--rows", "8", "--seq_len", "128",
                           "--output", str(tmp_path / "l.jsonl")])
    by = {r["part"]: r for r in rows}
    assert list(by) == list(aot_layer.PARTS) and all(r["compiler_ms"] > 0 for r in rows)
    d, tokens = 128, 8 * 128  # tiny: hidden 128, intermediate 512
    assert by["projection"]["flops"] == pytest.approx(3 * 2 * tokens * d * d, rel=0.05)
    assert by["ffn"]["flops"] == pytest.approx(3 * 2 * tokens * d * 4 * d, rel=0.05)
    parts = sum(by[p]["compiler_ms"] * n for p, n in aot_layer.PER_LAYER.items())
    assert by["block"]["rest_ms"] == pytest.approx(by["block"]["compiler_ms"] - parts, abs=1e-3)
    assert len((tmp_path / "l.jsonl").read_text().splitlines()) == len(aot_layer.PARTS)
