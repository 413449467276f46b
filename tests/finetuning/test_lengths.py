"""Fine-tuning on real lengths (bert_jax/finetuning/lengths.py): the same outputs and training steps
padded, unpadded (``unpad_multiple``) and evaluated longest first (``eval_by_length``); training
batches grouped by length (``length_groups``) still draw every row once per epoch."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from bert_jax.finetuning import evaluation as fe
from bert_jax.finetuning import lengths
from bert_jax.finetuning.task import jit_finetuning_steps, train_batch
from bert_jax.model.config import BertConfig
from bert_jax.resolve import resolve
from bert_jax.training import sharding as sh
from input_pipeline.tasks.base import feature_shapes

LABELS = {"classification": 3, "tagging": 4, "span": 2}


def features(kind: str, n: int = 13, length: int = 32, seed: int = 0) -> dict:
    """``n`` rows of random ids and labels with real lengths between 3 and ``length``."""
    rng = np.random.default_rng(seed)
    real = rng.integers(3, length + 1, n)
    mask = (np.arange(length)[None] < real[:, None]).astype(np.int32)  # [rows, length]
    out = {}
    for k, (shape, dtype) in feature_shapes(kind, n, length).items():
        high = {"input_ids": 101, "label": LABELS[kind], "label_ids": LABELS[kind], "segment_ids": 2}.get(k, 2)
        out[k] = rng.integers(0, high, shape).astype(dtype)
    out["input_ids"] *= mask
    out["segment_ids"] *= mask
    out["input_mask"] = mask
    if kind == "tagging":
        out["label_mask"] = out["label_mask"] * mask
    if kind == "span":
        out["start_positions"] = rng.integers(0, real)
        out["end_positions"] = np.minimum(out["start_positions"] + 1, real - 1)
    return out


def make_steps(kind: str, load_config):
    config = resolve(load_config("glue", "task=sst2,runlocal"), "cpu", batch_shards=2)
    cfg = BertConfig.from_size("tiny", vocab_size=101, max_position_embeddings=32).deterministic()
    mesh = sh.make_mesh((2, 1, 1), jax.devices()[:2])  # 2 shards
    return jit_finetuning_steps(config, cfg, kind, LABELS[kind], 10, mesh)


@pytest.mark.parametrize("kind", ["tagging", pytest.param("classification", marks=pytest.mark.slow),
                                  pytest.param("span", marks=pytest.mark.slow)])  # span: test_squad_end_to_end
def test_eval_outputs_are_the_same_unpadded_and_by_length(kind, load_config, monkeypatch):
    steps = make_steps(kind, load_config)
    params = steps.layout.create(0).params
    feats = features(kind)
    unpadded_batches = []
    add_index = lengths.unpadded

    def spy(batch, multiple, shards):
        batch = add_index(batch, multiple, shards)
        unpadded_batches.append("token_index" in batch)
        return batch

    monkeypatch.setattr(lengths, "unpadded", spy)

    def run(by_length, unpad):
        return fe.predict(steps.eval_fn, params, feats, kind, 8, 8, steps.mesh, steps.rules,
                          by_length=by_length, unpad_multiple=unpad)

    modes = ((False, 0), (True, 4)) if kind == "span" else ((False, 0), (True, 0), (False, 4), (True, 4))
    (ref, ref_sums), *others = [run(b, u) for b, u in modes]
    real = feats["input_mask"] > 0  # [rows, length]
    for out, sums in others:
        assert set(out) == set(ref)
        for k in ref:  # feature order restored; per-token outputs compared at the real tokens
            a, b = (np.asarray(x if kind == "classification" else x[real]) for x in (out[k], ref[k]))
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=k)
        if kind == "span":  # padding never wins a span, either way
            assert np.all(out["start_logits"][~real] == -1e9)
        np.testing.assert_allclose(sums["loss_sum"], ref_sums["loss_sum"], rtol=1e-5)
        np.testing.assert_allclose(sums["count"], ref_sums["count"])
    assert any(unpadded_batches)  # the blocks did run on the real tokens only


@pytest.mark.slow  # ~10 s (two step compilations); the fast eval test covers the unpadded forward pass
def test_unpadded_training_steps_match_padded(load_config):
    """Two optimizer steps on the trainer's batches, with and without ``token_index`` (no dropout:
    with it the masks fall on other positions)."""
    steps = make_steps("classification", load_config)
    feats = features("classification", n=16)
    shards = sh.batch_shards(steps.mesh, steps.rules)
    results = []
    for unpad in (0, 4):
        state, losses = steps.layout.create(0), []
        for step in range(2):
            batch = lengths.unpadded(train_batch(feats, step, 8, 0, 8), unpad, shards)
            assert ("token_index" in batch) == bool(unpad)
            state, metrics = steps.train_fn(state, sh.global_batch_from_host(batch, steps.mesh, steps.rules),
                                            jax.random.key(0))
            losses.append(float(metrics["loss"]))
        results.append((losses, np.asarray(state.params["classifier"]["dense"]["kernel"])))
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-5)
    np.testing.assert_allclose(results[1][1], results[0][1], rtol=1e-4, atol=1e-6)


def test_length_groups_keep_epochs_permutations_with_similar_lengths():
    rng = np.random.default_rng(1)
    real = rng.integers(5, 120, 203)
    plain = lengths.epoch_order(real, 7, 2, 8)
    assert np.array_equal(plain, np.random.default_rng([7, 2]).permutation(203))  # the old order, unchanged
    grouped = lengths.epoch_order(real, 7, 2, 8, groups=5)
    assert sorted(grouped) == list(range(203))  # every row once per epoch
    assert np.array_equal(grouped, lengths.epoch_order(real, 7, 2, 8, groups=5))  # a function of (seed, epoch)
    spread = lambda order: np.mean([np.ptp(real[b]) for b in order[:200].reshape(25, 8)])  # noqa: E731
    assert spread(grouped) < spread(plain) / 3
    steps = np.concatenate([lengths.train_rows(real, s, 8, 7, 5) for s in range(50, 75)])  # epoch 2
    assert np.array_equal(steps, grouped[:200])


def test_eval_order_round_trip():
    feats = {"input_mask": (np.arange(10)[None] < np.array([3, 9, 3, 1, 7])[:, None]).astype(np.int32)}
    order = lengths.eval_order(feats, True)
    assert list(order) == [1, 4, 0, 2, 3]  # longest first, ties in their order
    assert list(lengths.eval_order(feats, False)) == [0, 1, 2, 3, 4]
    computed = {"x": np.array([10.0, 20.0, 30.0, 40.0, 50.0])[order]}
    np.testing.assert_array_equal(lengths.restore_order(computed, order)["x"], [10, 20, 30, 40, 50])
