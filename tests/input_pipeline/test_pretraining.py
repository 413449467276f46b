"""Pre-training examples and their TFRecords (input_pipeline/pretraining/featurize.py): tokenizing documents in
batches, static masks equal to masking.mask_dataset's, serialize/parse round trips (Google's records too)."""

import os

import numpy as np
import pytest
import tensorflow as tf

from input_pipeline.corpora import sources
from input_pipeline.pretraining import featurize, masking


def test_tokenize_documents_batches_and_keeps_order(tiny_tok):
    docs = [["d1 s0 w1.", "d1 s1 w2 w3"], ["\x00"], ["d3 s0"]] * 300  # 900 docs, 1500 sentences
    out = list(featurize.tokenize_documents(iter(docs), tiny_tok, batch_size=64))
    assert len(out) == 900 and out[1] == []
    assert [tiny_tok.id_to_token(s) for s in out[0]] == [["d1", "s0", "w1", "."],
                                                         ["d1", "s1", "w2", "w3"]]
    assert tiny_tok.id_to_token(out[-1][0]) == ["d3", "s0"]

    def bad():
        yield ["d1"]
        raise sources.SourceError("x.txt:3: boom")

    with pytest.raises(sources.SourceError, match="boom"):
        list(featurize.tokenize_documents(bad(), tiny_tok))


def test_serialize_and_parse_round_trip(tiny_tok, tmp_path, make_docs):
    docs, _ = make_docs(10, sents=(2, 10))
    docs = [[[5 + t % 120 for t in s] for s in d] for d in docs]  # ids inside the tiny vocab
    feats = featurize.build_examples(docs, tiny_tok, max_seq_length=32, dupe_factor=2, seed=1)
    cfg = featurize.masking_config(tiny_tok, max_predictions_per_seq=5)
    masked = featurize.mask_features(feats, tiny_tok, cfg, seed=3, stream=2)
    # The same masks as masking.mask_dataset (epoch = stream) gives.
    ref = list(masking.mask_dataset(tf.data.Dataset.from_tensor_slices(feats), cfg, seed=3, epoch=2)
               .batch(10_000).as_numpy_iterator())[0]
    for k, v in ref.items():
        np.testing.assert_array_equal(masked[k], v)
    path = str(tmp_path / "x.tfrecord")
    n = featurize.write_records(path, featurize.serialize_features(masked))
    assert n == len(feats["input_ids"]) and os.listdir(tmp_path) == ["x.tfrecord"]
    raw = list(tf.data.TFRecordDataset(path).as_numpy_iterator())
    parsed = featurize.parse_examples(raw, 32, 5)
    assert set(parsed) == set(masked)
    for k, v in parsed.items():
        assert v.dtype == (tf.float32 if k == "masked_lm_weights" else tf.int32)
        np.testing.assert_array_equal(v.numpy(), masked[k])
    assert raw[0] == featurize.serialize_example({k: v[0] for k, v in masked.items()})
    one = featurize.parse_examples(raw[0], 32)  # unmasked spec reads a masked record too
    assert one["next_sentence_labels"].shape == [] and one["input_ids"].shape == [32]
    # Google's writer: OrderedDict of features, label as int64 [1] (field order must not matter).
    ex = tf.train.Example()
    for k in ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids"):
        ex.features.feature[k].int64_list.value.extend(masked[k][0].tolist())
    ex.features.feature["masked_lm_weights"].float_list.value.extend(masked["masked_lm_weights"][0])
    ex.features.feature["next_sentence_labels"].int64_list.value.append(int(masked["next_sentence_labels"][0]))
    google = featurize.parse_examples([ex.SerializeToString()], 32, 5)
    for k, v in google.items():
        np.testing.assert_array_equal(v.numpy()[0], masked[k][0])
