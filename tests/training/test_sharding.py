"""Sharded training on 8 fake CPU devices: every mesh computes the same step; parameters and
optimizer state are sharded as the rules say."""

import functools

import jax
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from bert_jax.model.config import BertConfig
from bert_jax.pretraining import objective as ts
from bert_jax.training import sharding as sh
from bert_jax.training import steps as steps_lib
from bert_jax.training.steps import state_layout

RULES = (("batch", ("data", "fsdp")), ("vocab", "tensor"), ("embed", "fsdp"), ("heads", "tensor"),
         ("mlp", "tensor"), ("kv", None), ("layers", None), ("length", None))
CFG = BertConfig.from_size("tiny", vocab_size=96, max_position_embeddings=16, hidden_dropout_prob=0.0,
                           attention_dropout_prob=0.0)


def make_batch(b=8, length=16, p=4, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, CFG.vocab_size, (b, length)).astype(np.int32)
    return {
        "input_ids": ids, "input_mask": np.ones((b, length), np.int32),
        "segment_ids": (np.arange(length)[None] >= length // 2).repeat(b, 0).astype(np.int32),
        "masked_lm_positions": np.sort(rng.choice(length, (b, p)), axis=1).astype(np.int32),
        "masked_lm_ids": rng.integers(5, CFG.vocab_size, (b, p)).astype(np.int32),
        "masked_lm_weights": np.ones((b, p), np.float32),
        "next_sentence_labels": rng.integers(0, 2, (b,)).astype(np.int32),
    }


def one_step(mesh_shape, accumulation_steps=1, batch=None):
    devices = jax.devices()[: int(np.prod(mesh_shape))]
    mesh = sh.make_mesh(mesh_shape, devices)
    # SGD + momentum: updates are linear in the gradients (Adam's first step is ~lr * sign(grad),
    # which turns reduction-order noise on near-zero gradients into whole-step differences).
    tx = optax.sgd(0.1, momentum=0.9)
    layout = state_layout(ts.pretraining_model(CFG, "nsp"), tx, mesh, RULES)
    state, shardings, graphdef = layout.create(0), layout.shardings, layout.graphdef
    step = jax.jit(
        functools.partial(ts.train_step, graphdef=graphdef, tx=tx, schedule=lambda s: 1e-3,
                          accumulation_steps=accumulation_steps),
        in_shardings=(shardings, sh.batch_sharding(mesh, RULES), None), out_shardings=(shardings, None),
        donate_argnums=0)
    new_state, metrics = step(state, sh.global_batch(batch or make_batch(), mesh, RULES), jax.random.key(0))
    return mesh, new_state, jax.device_get(metrics)


@pytest.fixture(scope="module")
def reference():
    return one_step((1, 1, 1))


@pytest.mark.parametrize("mesh_shape", [pytest.param((8, 1, 1), marks=pytest.mark.slow),  # (2, 2, 2) uses every axis
                                        pytest.param((2, 4, 1), marks=pytest.mark.slow), (2, 2, 2)])
def test_every_mesh_computes_the_same_step(reference, mesh_shape):
    assert len(jax.devices()) == 8, "conftest must set --xla_force_host_platform_device_count=8"
    _, ref_state, ref_metrics = reference
    mesh, state, metrics = one_step(mesh_shape)
    np.testing.assert_allclose(metrics["loss"], ref_metrics["loss"], rtol=1e-5)
    np.testing.assert_allclose(metrics["grad_norm"], ref_metrics["grad_norm"], rtol=1e-4)
    for a, b in zip(jax.tree.leaves(ref_state.params), jax.tree.leaves(state.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    # Parameters and optimizer state (the momentum trace) are really sharded as the rules say.
    word = state.params["bert"]["embeddings"]["word_embeddings"]["embedding"]
    want = P("tensor" if mesh.shape["tensor"] > 1 else None, "fsdp" if mesh.shape["fsdp"] > 1 else None)
    assert word.sharding.spec == want, word.sharding
    mu = state.opt_state[0].trace["bert"]["embeddings"]["word_embeddings"]["embedding"]
    assert mu.sharding.spec == want
    kernel = state.params["bert"]["layers"]["ffn"]["intermediate"]["kernel"]  # [layers, embed, mlp]
    assert kernel.sharding.spec == P(None, "fsdp" if mesh.shape["fsdp"] > 1 else None,
                                     "tensor" if mesh.shape["tensor"] > 1 else None)
    if mesh.shape["fsdp"] * mesh.shape["tensor"] > 1:
        assert kernel.addressable_shards[0].data.size < kernel.size  # no device holds it whole


def test_accumulation_matches_one_big_batch(reference):
    """Two micro-batches of 4 give the same update as one batch of 8 (equal weights, no dropout)."""
    _, ref_state, ref_metrics = reference
    _, state, metrics = one_step((1, 1, 1), accumulation_steps=2)
    np.testing.assert_allclose(metrics["loss"], ref_metrics["loss"], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(ref_state.params), jax.tree.leaves(state.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_accumulation_matches_one_big_batch_with_uneven_predictions():
    """Micro-batches divide by the whole batch's prediction count: with 1 prediction in each row of
    one micro-batch and 4 in the other, two micro-batches still give the one batch's loss and update
    (the mean of per-micro-batch means would weigh the sparse rows 4x)."""
    batch = make_batch()
    batch["masked_lm_weights"][0::2, 1:] = 0.0  # micro-batch 0 takes rows 0, 2, 4, 6
    _, ref_state, ref_metrics = one_step((1, 1, 1), batch=batch)
    _, state, metrics = one_step((1, 1, 1), accumulation_steps=2, batch=batch)
    np.testing.assert_allclose(metrics["loss"], ref_metrics["loss"], rtol=1e-5)
    np.testing.assert_allclose(metrics["grad_norm"], ref_metrics["grad_norm"], rtol=1e-4)
    for a, b in zip(jax.tree.leaves(ref_state.params), jax.tree.leaves(state.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_auto_micro_batches_of_eight_on_the_cpu(load_config):
    """The default ("auto", resolved when the job starts: bert_jax.resolve): 8 rows per device and
    micro-batch on the CPU when the batch is a larger multiple of 8; unpadded batches keep the whole
    batch; a number is the rows per micro-batch; an unresolved "auto" is refused."""
    from bert_jax.resolve import resolve

    c = load_config("pretrain", "size=tiny,synthetic")
    assert c.per_device_batch == "auto"
    rules = tuple(tuple(r) for r in c.sharding_rules)
    one = sh.make_mesh((1, 1, 1), jax.devices()[:1])

    def micro_batches(mesh):
        resolved = resolve(c, "cpu", batch_shards=sh.batch_shards(mesh, rules))
        return steps_lib.accumulation_steps(resolved, mesh, rules)

    for batch, micro in ((32, 4), (16, 2), (8, 1), (12, 1), (256, 32)):
        c.batch_size = batch
        assert micro_batches(one) == micro, batch
    c.batch_size = 64
    assert micro_batches(sh.make_mesh((8, 1, 1))) == 1  # 8 rows per device already
    assert micro_batches(sh.make_mesh((2, 4, 1))) == 1
    c.batch_size = 256
    assert micro_batches(sh.make_mesh((8, 1, 1))) == 4  # 32 rows per device
    assert steps_lib.accumulation_steps(resolve(c, "tpu"), sh.make_mesh((8, 1, 1)), rules) == 1  # whole batch
    c.unpad_multiple = 8
    assert micro_batches(one) == 1
    c.unpad_multiple, c.per_device_batch = 0, 128
    assert micro_batches(one) == 2
    assert resolve(c, "cpu", batch_shards=1).per_device_batch == 128  # a number stays itself
    c.per_device_batch = "auto"
    with pytest.raises(ValueError, match="per_device_batch='auto' is not resolved"):
        steps_lib.accumulation_steps(c, one, rules)


def test_mesh_shapes():
    assert sh.make_mesh((-1, 2, 1)).shape == {"data": 4, "fsdp": 2, "tensor": 1}
    assert sh.make_mesh((1, 1, 1), jax.devices()[:1]).shape == {"data": 1, "fsdp": 1, "tensor": 1}
    with pytest.raises(ValueError, match="does not divide 8 devices"):
        sh.make_mesh((3, -1, 1))
    with pytest.raises(ValueError, match="needs 4 devices, found 8"):
        sh.make_mesh((2, 2, 1))


def test_uneven_dimensions_stay_replicated():
    mesh = sh.make_mesh((1, 2, 4))
    spec = sh.logical_to_mesh(("vocab", "embed"), (30522, 768), mesh, RULES)
    assert spec == P(None, "fsdp")  # 30522 is not divisible by 4 tensor shards
    assert sh.logical_to_mesh(("embed", "embed"), (768, 768), mesh, RULES) == P("fsdp", None)  # axis used once


@pytest.mark.slow
def test_accumulation_keeps_each_devices_rows():
    """Micro-batches take strided rows, so on a data-parallel mesh each device works on its own rows
    of every micro-batch: the step moves no batch rows between devices (splitting contiguous blocks
    instead all-gathered the batch and did each micro-batch's work k times over)."""
    mesh = sh.make_mesh((8, 1, 1))
    tx = optax.sgd(0.1)
    layout = state_layout(ts.pretraining_model(CFG, "nsp"), tx, mesh, RULES)
    step = jax.jit(functools.partial(ts.train_step, graphdef=layout.graphdef, tx=tx, schedule=lambda s: 1e-3,
                                     accumulation_steps=4),
                   in_shardings=(layout.shardings, sh.batch_sharding(mesh, RULES), None))
    batch = {k: jax.ShapeDtypeStruct((32,) + v.shape[1:], v.dtype) for k, v in make_batch(32).items()}
    text = step.lower(layout.target(), batch, jax.random.key(0)).compile().as_text()
    assert "all-gather" not in text and "all-to-all" not in text
