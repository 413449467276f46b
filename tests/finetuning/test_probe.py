"""Frozen-feature probes (bert_jax/finetuning/probe.py) and the classifier's pooling switch."""

import dataclasses
import json

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bert_jax.finetuning import probe as fp
from bert_jax.model.config import BertConfig
from bert_jax.model.models import BertClassifier, create


def test_fit_and_score_separates_what_is_separable_and_not_noise():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 600)
    x = rng.normal(size=(600, 16)) + 1.5 * y[:, None] * np.eye(16)[0]  # class in feature 0 only
    acc, c = fp.fit_and_score(x[:500], y[:500], x[500:], y[500:])
    assert acc > 0.7 and c in fp.C_GRID
    noise, _ = fp.fit_and_score(rng.normal(size=(500, 16)), y[:500], rng.normal(size=(100, 16)), y[500:])
    assert abs(noise - 0.5) < 0.15


def test_variance_spectrum_tells_a_line_from_an_isotropic_cloud():
    rng = np.random.default_rng(0)
    cloud = rng.normal(size=(4000, 8))  # [N, D]: every direction alike
    line = np.outer(rng.normal(size=4000), rng.normal(size=8)) + 1e-3 * cloud  # one direction
    iso, flat = fp.variance_spectrum(cloud), fp.variance_spectrum(line)
    assert 7.5 < iso["effective_rank"] <= 8.0 and iso["top_share"] < 0.2
    assert flat["effective_rank"] < 1.01 and flat["top_share"] > 0.999
    half = cloud.copy()
    half[:, 0] *= np.sqrt(7.0)  # the first direction holds half the variance
    assert abs(fp.variance_spectrum(half)["top_share"] - 0.5) < 0.03


def test_sentence_vectors_pool_real_tokens_only():
    ids = np.array([[2, 5, 6, 3, 0, 0], [2, 7, 3, 0, 0, 0]], np.int32)
    mask = (ids > 0).astype(np.int32)

    def encoder(i, m, s):  # hidden state = the token id, 3 features; padding gets a huge value
        h = np.repeat(i[..., None].astype(np.float32), 3, -1)
        return np.where(m[..., None] > 0, h, 1e6)

    out = fp.sentence_vectors(encoder, {"input_ids": ids, "input_mask": mask, "segment_ids": 0 * ids}, batch_size=1)
    np.testing.assert_allclose(out["cls"], [[2, 2, 2], [2, 2, 2]])
    np.testing.assert_allclose(out["mean"], [[4, 4, 4], [4, 4, 4]])
    np.testing.assert_allclose(out["last4_mean"], out["mean"])  # one layer: the same vector


def test_sentence_vectors_concatenate_the_layers_last_one_last():
    ids = np.array([[2, 5, 6, 3, 0, 0], [2, 7, 3, 0, 0, 0]], np.int32)
    mask = (ids > 0).astype(np.int32)

    def encoder(i, m, s):  # [batch, length, K=3, H=2]: layer k holds (k + 1) * token id
        h = np.stack([(k + 1) * np.repeat(i[..., None].astype(np.float32), 2, -1) for k in range(3)], axis=2)
        return np.where(m[..., None, None] > 0, h, 1e6)

    out = fp.sentence_vectors(encoder, {"input_ids": ids, "input_mask": mask, "segment_ids": 0 * ids}, batch_size=2)
    np.testing.assert_allclose(out["last4_mean"], [[4, 4, 8, 8, 12, 12], [4, 4, 8, 8, 12, 12]])
    np.testing.assert_allclose(out["mean"], [[12, 12], [12, 12]])  # the last layer's
    np.testing.assert_allclose(out["cls"], [[6, 6], [6, 6]])


def test_hidden_layers_fn_takes_the_last_four_or_every_layer_of_a_shallow_encoder():
    ids = jnp.array([[2, 11, 12, 3, 0, 0]], jnp.int32)
    mask = (ids > 0).astype(jnp.int32)
    for layers, expected_k in ((2, 3), (5, 4)):  # 2 blocks + embeddings = 3; 5 blocks: the last 4
        model = create(fp.EncoderOnly, _tiny(num_layers=layers), seed=0)
        got = np.asarray(fp.hidden_layers_fn(model)(ids, mask, 0 * ids))  # [1, 6, K, H]
        hidden = model.bert(ids, mask, 0 * ids, deterministic=True, output_hidden_states=True).hidden_states
        assert got.shape == (1, 6, expected_k, 32)
        np.testing.assert_allclose(got[:, :, -1], np.asarray(hidden[-1]), atol=1e-6)
        np.testing.assert_allclose(got[:, :, 0], np.asarray(hidden[-expected_k]), atol=1e-6)


def test_sentence_vectors_batch_by_length_and_keep_the_order():
    rng = np.random.default_rng(0)
    lengths = np.array([70, 3, 40, 5, 100, 4, 33, 6])  # [N], unsorted
    ids = np.zeros((8, 128), np.int32)
    for row, n in enumerate(lengths):
        ids[row, :n] = rng.integers(4, 1000, n)
    mask = (ids > 0).astype(np.int32)
    widths = []

    def encoder(i, m, s):  # hidden state = the token id
        widths.append(i.shape[1])
        return np.repeat(i[..., None].astype(np.float32), 2, -1)

    out = fp.sentence_vectors(encoder, {"input_ids": ids, "input_mask": mask, "segment_ids": 0 * ids}, batch_size=2)
    expected = np.array([ids[r, :n].mean() for r, n in enumerate(lengths)])
    np.testing.assert_allclose(out["mean"][:, 0], expected, rtol=1e-6)
    np.testing.assert_allclose(out["cls"][:, 0], ids[:, 0])
    assert widths == [32, 32, 64, 128]  # rows alike in length share a batch: little padding


def _tiny(**kw):
    return BertConfig.from_size("tiny", vocab_size=50, hidden_size=32, num_heads=2, intermediate_size=64,
                                hidden_dropout_prob=0.0, attention_dropout_prob=0.0, **kw)


def test_mean_pooling_classifier_ignores_padding_and_needs_no_pooler():
    cfg = _tiny(classifier_pooling="mean", use_pooler=False)
    model = create(BertClassifier, cfg, 2, seed=0)
    ids = jnp.array([[2, 11, 12, 3, 0, 0]], jnp.int32)
    mask = (ids > 0).astype(jnp.int32)
    other_padding = ids.at[0, 4:].set(17)  # what sits under the mask must not matter
    a = model(ids, mask, 0 * ids)
    b = model(other_padding, mask, 0 * ids)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
    enc = model.bert(ids, mask, 0 * ids)
    pooled = enc.sequence_output[0, :4].mean(0)  # the mean over the 4 real tokens
    expected = pooled @ model.classifier.dense.kernel[...] + model.classifier.dense.bias[...]
    np.testing.assert_allclose(np.asarray(a[0]), np.asarray(expected), atol=1e-5)
    with pytest.raises(ValueError, match="classifier_pooling='cls' classifies the pooled output"):
        BertClassifier(_tiny(use_pooler=False), 2, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="classifier_pooling"):
        _tiny(classifier_pooling="max")
    assert BertConfig.from_dict(dataclasses.asdict(cfg)) == cfg


def test_probe_random_init_end_to_end(tmp_path, minilm_dir, capsys):
    """Word-separable sentences: even random features of mean-pooled tokens carry the label; the
    command line prints one JSON line."""
    rng = np.random.default_rng(1)
    good, bad = ["great", "wonderful", "superb", "lovely"], ["awful", "boring", "dreadful", "dull"]
    lines = []
    for i in range(240):
        label = i % 2
        words = rng.choice(good if label else bad, 3).tolist() + ["the", "film", "was"]
        rng.shuffle(words)
        lines.append(f"{label}\t{' '.join(words)}")
    task = tmp_path / "reviews.tsv"
    task.write_text("\n".join(lines) + "\n")
    vocab = str(minilm_dir / "vocab.txt")
    result = fp.probe("", task_source=str(task), vocab=vocab, size="tiny", seed=0)
    assert result.train_examples == 216 and result.dev_examples == 24
    assert result.accuracy["mean"] >= 0.9, result
    assert fp.main(["--random_init", "--vocab", vocab, "--task_file", str(task)]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["accuracy"] == result.accuracy and printed["init"] == "random init (seed 0)"
    assert set(printed["spectrum"]) == set(fp.POOLINGS) and 0 < printed["spectrum"]["mean"]["top_share"] < 1
    with pytest.raises(SystemExit):
        fp.main(["--vocab", vocab])  # neither a checkpoint nor --random_init
