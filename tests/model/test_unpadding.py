"""Unpadded steps: where the real tokens are (host side), and blocks run on them alone compute what
the padded blocks compute, in the model, the train step and the trainer."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax import launch
from bert_jax.model.config import BertConfig
from bert_jax.model.encoder import BertEncoder
from bert_jax.pretraining import objective as ts
from input_pipeline.pretraining.packing import pack_examples
from input_pipeline.pretraining.synthetic import SyntheticBatches
from input_pipeline.unpadding import token_index, with_token_index

# A large initialiser so that attention depends on which tokens it sees (as in test_packing).
CFG = BertConfig.from_size("tiny", vocab_size=97, max_position_embeddings=32, initializer_range=0.5)


def batch(n=8, seed=0):
    return next(SyntheticBatches(batch_size=n, seq_len=32, max_predictions=4, vocab_size=97, seed=seed))


def test_token_index_lists_each_shards_real_tokens_then_filler():
    mask = np.array([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0]])
    one = token_index(mask, shards=1, multiple=4)
    assert one.dtype == np.int32 and one.shape == (1, 12)  # 10 real tokens, rounded up to 12
    np.testing.assert_array_equal(one[0], [0, 1, 4, 8, 9, 10, 11, 12, 13, 14, 16, 16])
    two = token_index(mask, shards=2, multiple=2)  # rows 0-1 and 2-3, positions within the shard
    np.testing.assert_array_equal(two, [[0, 1, 4, 8, 8, 8, 8, 8], [0, 1, 2, 3, 4, 5, 6, 8]])
    assert token_index(mask, shards=2, multiple=100).shape == (2, 8)  # never more than the shard holds
    assert token_index(mask, shards=2, multiple=2, min_tokens=8).shape == (2, 8)
    assert token_index(np.zeros((2, 4)), multiple=4).shape == (1, 4)  # an empty batch still has a shape
    full = {"input_mask": np.ones((2, 4))}
    assert with_token_index(full, multiple=3) is full  # nothing to skip: the padded step
    assert "token_index" in with_token_index({"input_mask": mask}, multiple=3)


@pytest.mark.parametrize("mask, kw, match", [
    (np.ones((3, 4)), {"shards": 2}, "3 rows cannot be split into 2"),
    (np.ones(4), {}, r"\[batch, length\]"),
    (np.ones((2, 4)), {"multiple": 0}, "multiple must be >= 1"),
])
def test_token_index_errors(mask, kw, match):
    with pytest.raises(ValueError, match=match):
        token_index(mask, **kw)


def loss_and_grads(b, cfg=CFG, deterministic=True):
    state = ts.init_state(cfg, "nsp", optax.sgd(0.1), 0)
    grad = jax.grad(ts._loss, has_aux=True)
    fn = jax.jit(functools.partial(grad, graphdef=ts.model_graphdef(cfg, "nsp"), deterministic=deterministic))
    return fn(state.params, batch=b, rng=jax.random.key(1))


@pytest.mark.parametrize("shards", [pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow),
                                    8])
def test_unpadded_blocks_give_the_padded_losses_and_gradients(shards):
    b = batch()
    grads, sums = loss_and_grads(b)
    grads_u, sums_u = loss_and_grads(with_token_index(b, shards, multiple=8))
    assert b["input_mask"].mean() < 0.9  # there is padding to skip
    for k in sums:
        np.testing.assert_allclose(sums_u[k], sums[k], rtol=1e-5, err_msg=k)
    scale = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads))  # key biases' are ~0 (softmax shift)
    for path, g in jax.tree_util.tree_leaves_with_path(grads):
        np.testing.assert_allclose(_at(grads_u, path), g, rtol=1e-4, atol=1e-6 * scale,
                                   err_msg=jax.tree_util.keystr(path))


@pytest.mark.slow  # ~12 s; scanned float32 stays fast
def test_unpadded_blocks_unrolled_with_remat_and_bfloat16():
    """The forward pass (losses) in the other execution variants."""
    b = with_token_index(batch(), 2, multiple=8)
    for cfg in (dataclasses.replace(CFG, scan_layers=False, remat_policy="full"),
                dataclasses.replace(CFG, dtype="bfloat16")):
        params = ts.init_state(cfg, "nsp", optax.sgd(0.1), 0).params
        loss = jax.jit(functools.partial(ts._loss, graphdef=ts.model_graphdef(cfg, "nsp"), rng=None,
                                         deterministic=True))
        np.testing.assert_allclose(loss(params, batch=b)[1]["mlm_loss_sum"],
                                   loss(params, batch=batch())[1]["mlm_loss_sum"], rtol=1e-5)


def _at(tree, path):
    for key in path:
        tree = tree[key.key]
    return tree


@pytest.mark.slow  # ~20 s
def test_unpadded_packed_rows_and_dropout():
    short = next(SyntheticBatches(batch_size=16, seq_len=32, max_predictions=4, vocab_size=97, seed=5,
                                  short_seq_prob=0.5))
    rows, _ = pack_examples(short, num_rows=8, max_examples=3)
    assert rows["input_mask"].mean() < 0.9  # still some padding left
    _, sums = loss_and_grads(rows)
    _, sums_u = loss_and_grads(with_token_index(rows, 2, 8))
    np.testing.assert_allclose(sums_u["mlm_loss_sum"], sums["mlm_loss_sum"], rtol=1e-5)
    np.testing.assert_allclose(sums_u["nsp_loss_sum"], sums["nsp_loss_sum"], rtol=1e-5)
    cfg = BertConfig.from_size("tiny", vocab_size=97, max_position_embeddings=32)  # dropout 0.1: other masks
    grads, sums = loss_and_grads(with_token_index(batch(), 1, 8), cfg, deterministic=False)
    assert np.isfinite(float(sums["mlm_loss_sum"])) and all(np.isfinite(g).all() for g in jax.tree.leaves(grads))


def test_unpadding_refuses_what_it_cannot_do():
    b = with_token_index(batch(), 1, 8)
    enc = BertEncoder(CFG, rngs=__import__("flax").nnx.Rngs(0))
    with pytest.raises(ValueError, match="output_hidden_states"):
        enc(b["input_ids"], b["input_mask"], b["segment_ids"], token_index=b["token_index"], output_hidden_states=True)
    state = ts.init_state(CFG, "nsp", optax.sgd(0.1), 0)
    with pytest.raises(ValueError, match="micro-batches"):
        ts.train_step(state, b, jax.random.key(0), graphdef=ts.model_graphdef(CFG, "nsp"), tx=optax.sgd(0.1),
                      schedule=lambda s: 0.1, accumulation_steps=2)


def test_trainer_with_unpad_multiple(tmp_path, caplog, tiny_config):
    """Data parallel over the 8 fake devices: each shard's real tokens; the loss matches padded."""
    caplog.set_level("INFO")
    last = launch.run(tiny_config(steps=2, eval_every=0, unpad_multiple=4), tmp_path / "unpadded")
    assert "unpadded batches of" in caplog.text and "tokens per shard (of 16)" in caplog.text  # 8 rows / 8 devices
    assert 4 < last["train"]["loss"] < 6  # ln(101) + ln(2) = 5.3 at the start
    c = tiny_config(unpad_multiple=4, batch_size=16, per_device_batch=1)  # 2 micro-batches on 8 devices
    with pytest.raises(ValueError, match="does not go with micro-batches"):
        launch.run(c, tmp_path / "accumulating")
