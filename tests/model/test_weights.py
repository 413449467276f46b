"""The one strict weight loader: scope, bare encoders, and every problem named at once."""

import numpy as np
import pytest
from flax import nnx, traverse_util

from bert_jax.model.config import BertConfig
from bert_jax.model.encoder import BertEncoder
from bert_jax.model.models import BertClassifier, BertForPreTraining, create
from bert_jax.model.weights import CheckpointMismatchError, load_params

TINY = BertConfig.from_size("tiny", vocab_size=64, max_position_embeddings=16, num_heads=4)


def flat(model) -> dict[str, np.ndarray]:
    pure = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    return {k: np.asarray(v) for k, v in traverse_util.flatten_dict(pure, sep="/").items()}


def test_full_copy_and_bare_encoder_both_ways():
    source = create(BertForPreTraining, TINY, seed=1)
    target = create(BertForPreTraining, TINY, seed=2)
    assert load_params(target, flat(source), where="mem") == []
    for k, v in flat(source).items():
        np.testing.assert_array_equal(flat(target)[k], v)
    # A bare encoder reads a full model's "bert/..." and a full model reads a bare encoder's paths.
    encoder = create(BertEncoder, TINY, seed=3)
    load_params(encoder, flat(source), where="mem", only="bert")
    np.testing.assert_array_equal(flat(encoder)["layers/ffn/output/kernel"],
                                  flat(source)["bert/layers/ffn/output/kernel"])
    other = create(BertForPreTraining, TINY, seed=4)
    untouched = load_params(other, flat(encoder), where="mem", only="bert")
    assert untouched and all(not p.startswith("bert/") for p in untouched)
    np.testing.assert_array_equal(flat(other)["bert/embeddings/word_embeddings/embedding"],
                                  flat(source)["bert/embeddings/word_embeddings/embedding"])


def test_only_and_allow_missing_keep_new_heads():
    source = flat(create(BertForPreTraining, TINY, seed=1))
    clf = create(BertClassifier, TINY, 3, seed=9)
    head = flat(clf)["classifier/dense/kernel"]
    with pytest.raises(CheckpointMismatchError, match="missing from ckpt: classifier/dense/bias, classifier/dense/k"):
        load_params(clf, source, where="ckpt")
    assert load_params(clf, source, where="ckpt", only="bert") == ["classifier/dense/bias", "classifier/dense/kernel"]
    encoder_only = {k: v for k, v in source.items() if k.startswith("bert/")}
    assert load_params(clf, encoder_only, where="ckpt", allow_missing=("classifier",)) == [
        "classifier/dense/bias", "classifier/dense/kernel"]
    np.testing.assert_array_equal(flat(clf)["classifier/dense/kernel"], head)


def test_every_problem_is_named_and_nothing_is_copied():
    target = create(BertForPreTraining, TINY, seed=2)
    before = flat(target)
    stored = flat(create(BertForPreTraining, TINY, seed=1))
    del stored["bert/pooler/bias"]
    stored["bert/embeddings/position_embeddings/embedding"] = np.zeros((8, 128), np.float32)
    stored["bert/unknown/kernel"] = np.zeros(3, np.float32)
    with pytest.raises(CheckpointMismatchError) as e:
        load_params(target, stored, where="/ckpt", names={"bert/unknown/kernel": "unknown.weight"})
    msg = str(e.value)
    assert "missing from /ckpt: bert/pooler/bias" in msg
    assert "in /ckpt but not in the model: unknown.weight" in msg
    assert "bert/embeddings/position_embeddings/embedding: checkpoint (8, 128) vs model (16, 128)" in msg
    for k, v in before.items():  # a refused load leaves the model as it was
        np.testing.assert_array_equal(flat(target)[k], v)
