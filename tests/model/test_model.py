"""The Flax modules: shapes, execution variants agree, heads, dropout, logical axis names."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx, traverse_util

from bert_jax.model import axes, layer_layout
from bert_jax.model.config import BertConfig
from bert_jax.model.encoder import BertEncoder
from bert_jax.model.models import (
    BertClassifier,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertTagger,
    create,
)

CFG = BertConfig.from_size("tiny", vocab_size=97, max_position_embeddings=32)


def batch(b=3, length=12, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, CFG.vocab_size, (b, length)).astype(np.int32)
    lengths = np.array([length, length - 4, 5])[:b]
    mask = (np.arange(length)[None] < lengths[:, None]).astype(np.int32)
    seg = ((np.arange(length)[None] >= 3) & (mask > 0)).astype(np.int32)
    return jnp.asarray(ids * mask), jnp.asarray(mask), jnp.asarray(seg)


def call(model, *args, rngs=None, **kw):
    """Jitted module call (eager NNX calls dispatch op by op and are slow on CPU)."""
    return nnx.jit(lambda m, r, *a: m(*a, rngs=r, **kw))(model, rngs, *args)


def test_encoder_shapes():
    enc = create(BertEncoder, CFG)
    out = call(enc, *batch(), output_hidden_states=True, output_attentions=True)
    assert out.sequence_output.shape == (3, 12, 128)
    assert out.pooled_output.shape == (3, 128)
    assert out.hidden_states.shape == (CFG.num_layers + 1, 3, 12, 128)
    assert out.attentions.shape == (CFG.num_layers, 3, 2, 12, 12)
    np.testing.assert_allclose(out.hidden_states[-1], out.sequence_output)
    # Attention probabilities are a distribution over real keys only.
    probs = np.asarray(out.attentions)
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
    assert np.all(probs[:, 2, :, :, 5:] == 0)


def _loss_and_grads(cfg):
    ids, mask, seg = batch()
    pos = jnp.array([[1, 2, 0], [3, 4, 0], [1, 0, 0]])

    def loss(model):
        out = model(ids, mask, seg, pos)
        return out.mlm_logits.sum() + out.nsp_logits.sum()

    loss_value, grads = nnx.jit(nnx.value_and_grad(loss))(create(BertForPreTraining, cfg))
    flat = traverse_util.flatten_dict(nnx.to_pure_dict(nnx.state(grads)), sep="/")
    return loss_value, jax.tree.leaves(layer_layout.stack(flat))  # unrolled blocks: compared as stacks


@pytest.mark.slow  # ~27 s; scan vs unrolled: tests/model/test_layer_layout.py
def test_execution_variants_agree():
    """Scan vs unrolled, remat policies and the fused vs explicit attention path give the same
    outputs and gradients."""
    l1, g1 = _loss_and_grads(CFG)  # scan, no remat, fused attention
    for variant in (dict(scan_layers=False, remat_policy="dots_saveable"),
                    dict(remat_policy="full", attention_impl="explicit")):
        l2, g2 = _loss_and_grads(dataclasses.replace(CFG, **variant))
        np.testing.assert_allclose(l1, l2, rtol=1e-5, err_msg=str(variant))
        for a, b in zip(g1, g2, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=str(variant))


def test_padding_does_not_change_real_tokens():
    enc = create(BertEncoder, CFG)
    ids, mask, seg = batch()
    short = call(enc, ids[2:, :5], mask[2:, :5], seg[2:, :5]).sequence_output
    padded = call(enc, ids[2:], mask[2:], seg[2:]).sequence_output[:, :5]
    np.testing.assert_allclose(short, padded, atol=1e-5)


def test_mlm_head_gathers_masked_positions():
    model = create(BertForPreTraining, CFG)
    ids, mask, seg = batch()
    pos = jnp.array([[0, 5, 7], [2, 3, 1], [4, 4, 0]])
    sparse = call(model, ids, mask, seg, pos).mlm_logits  # [batch, P, vocab]
    dense = call(model, ids, mask, seg).mlm_logits  # [batch, length, vocab]
    assert sparse.shape == (3, 3, CFG.vocab_size) and dense.shape == (3, 12, CFG.vocab_size)
    np.testing.assert_allclose(sparse, np.take_along_axis(np.asarray(dense), np.asarray(pos)[..., None], 1),
                               atol=1e-5)


def test_decoder_is_tied_to_word_embeddings():
    model = create(BertForPreTraining, CFG)
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    assert "decoder" not in str(params["mlm"].keys())
    ids, mask, seg = batch()
    grads = nnx.jit(nnx.grad(lambda m: m(ids, mask, seg).mlm_logits[..., 7].sum()))(model)
    # Only the tied decoder row 7 (and rows of ids present in the input) receive gradient.
    g = np.asarray(nnx.to_pure_dict(nnx.state(grads))["bert"]["embeddings"]["word_embeddings"]["embedding"])
    present = set(np.asarray(ids).ravel().tolist())
    assert np.abs(g[7]).sum() > 0
    untouched = [v for v in range(CFG.vocab_size) if v not in present and v != 7]
    assert np.abs(g[untouched]).sum() == 0


def test_dropout_needs_rngs_and_is_reproducible():
    enc = create(BertEncoder, CFG)
    ids, mask, seg = batch()
    with pytest.raises(ValueError, match="needs rngs"):
        enc(ids, mask, seg, deterministic=False)
    f = nnx.jit(lambda m, key: m(ids, mask, seg, deterministic=False,
                                 rngs=nnx.Rngs(dropout=key)).sequence_output)
    a, b, c = f(enc, jax.random.key(1)), f(enc, jax.random.key(1)), f(enc, jax.random.key(2))
    d = call(enc, ids, mask, seg).sequence_output
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c) and not np.allclose(a, d)


def shape_of(model_cls, *args, **kw):
    """Output shapes without compiling: abstract init and call."""
    ids, mask, seg = batch()
    return jax.tree.map(lambda x: x.shape, nnx.eval_shape(
        lambda: model_cls(CFG, *args, rngs=nnx.Rngs(0), **kw)(ids, mask, seg)))


def test_task_models():
    assert shape_of(BertClassifier, 3) == (3, 3)
    assert shape_of(BertClassifier, 1) == (3, 1)  # regression
    assert shape_of(BertTagger, 9) == (3, 12, 9)
    assert shape_of(BertForQuestionAnswering) == ((3, 12), (3, 12))
    assert shape_of(BertForPreTraining, objective="none").nsp_logits is None
    ids, mask, seg = batch()
    start, _ = call(create(BertForQuestionAnswering, CFG), ids, mask, seg)
    assert np.all(np.asarray(start)[2, 5:] < -1e8)  # padding never wins
    with pytest.raises(ValueError, match="unknown objective"):
        BertForPreTraining(CFG, rngs=nnx.Rngs(0), objective="mlm")
    with pytest.raises(ValueError, match="max_position_embeddings"):
        nnx.eval_shape(lambda: BertEncoder(CFG, rngs=nnx.Rngs(0))(*[jnp.zeros((1, 33), jnp.int32)] * 3))


def test_every_param_has_logical_axes():
    model = nnx.eval_shape(lambda: create(BertForPreTraining, CFG))
    specs = nnx.get_partition_spec(nnx.state(model, nnx.Param))
    flat = jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    params = jax.tree.leaves(nnx.state(model, nnx.Param))
    assert len(flat) == len(params)
    for spec, p in zip(flat, params, strict=True):
        assert len(spec) == p.ndim, (spec, p.shape)
        assert all(name is None or name in axes.LOGICAL_AXES for name in spec)
    layer_specs = jax.tree.leaves(
        nnx.get_partition_spec(nnx.state(model.bert.layers, nnx.Param)),
        is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    assert all(s[0] == axes.LAYERS for s in layer_specs)


def test_pure_jitted_forward_over_split_state_bf16():
    cfg = dataclasses.replace(CFG, dtype="bfloat16")
    graphdef, state = nnx.split(create(BertForPreTraining, cfg))

    @jax.jit
    def forward(state, ids, mask, seg, key):
        model = nnx.merge(graphdef, state)
        return model(ids, mask, seg, deterministic=False, rngs=nnx.Rngs(dropout=key)).mlm_logits

    out = forward(state, *batch(), jax.random.key(0))
    assert out.dtype == jnp.float32 and np.isfinite(np.asarray(out)).all()
    assert jax.tree.leaves(state)[0].dtype == jnp.float32  # params stay float32
