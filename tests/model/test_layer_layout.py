"""The encoder's two parameter layouts (bert_jax/model/layer_layout.py): stacked for a scan, per layer
unrolled. Same initial values, outputs and gradients; stored weights of either layout load into
either model; exports and checkpoints hold the stacked layout whichever model wrote them."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx, traverse_util

from bert_jax.interop import convert
from bert_jax.model import layer_layout
from bert_jax.model.config import BertConfig
from bert_jax.model.models import BertForPreTraining
from bert_jax.model.weights import CheckpointMismatchError, load_params
from bert_jax.resolve import resolve_scan
from bert_jax.training.checkpoints import Checkpointer, from_stored, has_per_layer, read_params, to_stored

CFG = BertConfig.from_size("tiny", vocab_size=120, num_layers=3, max_position_embeddings=64)


def flat(model) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in
            traverse_util.flatten_dict(nnx.to_pure_dict(nnx.state(model, nnx.Param)), sep="/").items()}


def build(scan, seed=0, **kw):
    return BertForPreTraining(dataclasses.replace(CFG, scan_layers=scan, **kw), rngs=nnx.Rngs(seed))


def batch():
    r = np.random.RandomState(0)
    ids = jnp.asarray(r.randint(5, 120, (2, 24)))
    mask = jnp.asarray(np.arange(24)[None, :] < np.array([[24], [17]]), jnp.int32)
    return ids, mask, jnp.zeros_like(ids)


def test_config_resolves_scan_per_platform():
    assert resolve_scan("auto", "cpu") is False
    assert [resolve_scan("auto", p) for p in ("gpu", "cuda", "rocm", "tpu")] == [False, False, True, True]
    assert resolve_scan(True, "cpu") is True and resolve_scan(False, "tpu") is False
    assert resolve_scan("auto", "cpu", shared=True) is True  # ALBERT: one block, nothing per layer
    assert BertConfig(scan_layers="False").scan_layers is False  # ml_collections hands strings over
    assert BertConfig(scan_layers="true").scan_layers is True
    with pytest.raises(ValueError, match=r"\['scan_layers'\] = \['auto'\].*bert_jax.resolve"):
        BertConfig(scan_layers="auto")  # the model never resolves it itself
    with pytest.raises(ValueError, match="scan_layers"):
        BertConfig(scan_layers="sometimes")


def test_unrolled_blocks_over_the_stack_compute_the_per_layer_numbers():
    """``stacked_params``: unrolled blocks that slice their parameters from the scan's stacked arrays
    hold the stored (stacked) layout, the scanned model's arrays (16 for 3 blocks' 48), with the
    per-layer model's values, and compute its loss and gradients."""
    over_stack, per_layer = build(False, stacked_params=True), build(False)
    a, b = flat(over_stack), layer_layout.stack(flat(per_layer))
    assert a.keys() == b.keys() and a["bert/layers/attention/query/kernel"].shape[0] == 3
    count = lambda model: len(jax.tree.leaves(nnx.state(model, nnx.Param)))  # noqa: E731
    assert count(over_stack) == count(per_layer) - 32
    # the scanned model's state, so checkpoints save and restore it as theirs (test_checkpoints_hold_one_layout)
    assert jax.tree.structure(nnx.state(over_stack, nnx.Param)) == jax.tree.structure(nnx.state(build(True), nnx.Param))
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    same_loss_and_gradients(over_stack, per_layer)


def same_loss_and_gradients(stacked, per_layer):
    """Asserts a training-mode loss (dropout on, the same keys per layer in both layouts) and its
    gradients agree between a model of the stacked layout and one of the per-layer layout."""
    ids, mask, seg = batch()

    def loss(model):
        out = model.bert(ids, mask, seg, deterministic=False, rngs=nnx.Rngs(dropout=jax.random.key(4)))
        return (out.sequence_output ** 2).mean()

    la, ga = nnx.jit(nnx.value_and_grad(loss))(stacked)
    lb, gb = nnx.jit(nnx.value_and_grad(loss))(per_layer)
    assert float(la) == pytest.approx(float(lb), rel=1e-6)
    ga = traverse_util.flatten_dict(nnx.to_pure_dict(ga), sep="/")
    gb = layer_layout.stack(traverse_util.flatten_dict(nnx.to_pure_dict(gb), sep="/"))
    for k in ga:
        np.testing.assert_allclose(gb[k], ga[k], rtol=1e-5, atol=1e-7, err_msg=k)


def test_same_initial_values_outputs_and_gradients():
    stacked, per_layer = build(True), build(False)
    a, b = flat(stacked), flat(per_layer)
    assert "bert/layers/attention/query/kernel" in a and a["bert/layers/attention/query/kernel"].shape[0] == 3
    assert "bert/layers/2/attention/query/kernel" in b and "bert/layers/attention/query/kernel" not in b
    assert set(layer_layout.stack(b)) == set(a)
    for k, v in layer_layout.stack(b).items():
        np.testing.assert_array_equal(v, a[k], err_msg=k)
    same_loss_and_gradients(stacked, per_layer)

    ids, mask, seg = batch()
    outputs = nnx.jit(lambda m: m.bert(ids, mask, seg, output_hidden_states=True, output_attentions=True))
    out_a, out_b = outputs(stacked), outputs(per_layer)
    assert out_b.hidden_states.shape == (4, 2, 24, 128) and out_b.attentions.shape == (3, 2, 2, 24, 24)
    np.testing.assert_allclose(out_b.hidden_states, out_a.hidden_states, atol=1e-6)
    np.testing.assert_allclose(out_b.attentions, out_a.attentions, atol=1e-6)


@pytest.mark.parametrize("source,target", [(True, False), (False, True)])
def test_weights_of_either_layout_load_into_either(source, target):
    stored = flat(build(source, seed=1))
    model = build(target, seed=2)
    assert load_params(model, stored, where="ckpt") == []
    got = layer_layout.stack(flat(model))
    for k, v in layer_layout.stack(stored).items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)


def test_a_checkpoint_with_other_depth_names_the_stacks():
    stored = flat(build(True))
    with pytest.raises(CheckpointMismatchError, match=r"bert/layers/attention/query/kernel: checkpoint "
                       r"\(3, 128, 2, 64\) vs model \(2, 128, 2, 64\)"):
        load_params(build(False, num_layers=2), stored, where="ckpt")
    per_layer = flat(build(False))
    del per_layer["bert/layers/1/ffn/output/bias"]
    with pytest.raises(ValueError, match=r"layers \[0, 2\] stored per layer"):
        layer_layout.stack(per_layer)


def test_exports_do_not_depend_on_layout(tmp_path):
    from safetensors.numpy import load_file

    a = load_file(convert.export_hf(build(True), CFG, tmp_path / "a") / "model.safetensors")
    b = load_file(convert.export_hf(build(False), CFG, tmp_path / "b") / "model.safetensors")
    assert set(a) == set(b) and "bert.encoder.layer.2.attention.self.query.weight" in a
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_checkpoints_hold_one_layout(tmp_path):
    """Saved per layer or stacked, a checkpoint holds the stacked arrays; either model restores
    either, bit for bit, with no flag."""
    def state(scan):
        return {"step": jnp.int32(1), "params": nnx.to_pure_dict(nnx.state(build(scan), nnx.Param))}

    def abstract(tree):
        host = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=host), tree)

    per_layer, stacked = state(False), state(True)
    assert has_per_layer(per_layer) and not has_per_layer(stacked)
    for name, saved in (("per_layer", per_layer), ("stacked", stacked)):
        ckpt = Checkpointer(tmp_path / name, async_save=False)
        try:
            ckpt.save(1, saved, {"step": 1})
            stored = flat_tree(read_params(tmp_path / name)[0])
            assert not any("layers/0/" in k for k in stored) and "bert/layers/attention/query/kernel" in stored
            for like in (per_layer, stacked):
                got, _ = ckpt.restore(abstract(like), 1)
                assert jax.tree.structure(got) == jax.tree.structure(like)
                want = like if like is saved else (from_stored(to_stored(saved), like))
                for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
                    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        finally:
            ckpt.close()
        for like in (per_layer, stacked):  # params alone (init_mode=params), by a fresh reader as resume does
            source = Checkpointer(tmp_path / name, async_save=False)
            try:
                params = source.restore_params(abstract(like["params"]), 1)
            finally:
                source.close()
            assert jax.tree.structure(params) == jax.tree.structure(like["params"])
            np.testing.assert_array_equal(*(flat_tree(layer_layout.stack(flat_tree(p)))["bert/layers/ffn/output/kernel"]
                                            for p in (params, saved["params"])))


def flat_tree(tree):
    return tree if all(isinstance(k, str) and "/" in k for k in tree) else traverse_util.flatten_dict(tree, sep="/")
