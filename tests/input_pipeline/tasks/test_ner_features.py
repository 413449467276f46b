"""NER features (input_pipeline/tasks/ner_features.py): labels on first sub-tokens, [UNK] for a word
without pieces, long sentences split at word boundaries, per-word tokenization with the real vocabulary."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from input_pipeline.tasks.ner import NerExample, NerTask
from input_pipeline.tokenizers.wordpiece import WordPieceTokenizer


def test_featurize_first_subtoken_labels(ner_tok, ner_ids):
    task = NerTask("tfds")
    ex = [NerExample(("Peter", "Blackburn", "\u200b", "said"), ("B-PER", "I-PER", "O", "O")),
          NerExample(("EU",), ("B-ORG",))]
    f = task.featurize(ex, ner_tok, 10)
    assert sorted(f) == ["example_index", "input_ids", "input_mask", "label_ids", "label_mask",
                         "segment_ids", "word_index"]
    assert all(v.dtype == np.int32 and len(v) == 2 for v in f.values())
    # "Blackburn" → black ##burn; the zero-width space tokenizes to nothing → [UNK].
    ids = [ner_ids[t] for t in ["[CLS]", "peter", "black", "##burn", "[UNK]", "said", "[SEP]", "[PAD]"]]
    assert f["input_ids"][0].tolist() == ids + [0, 0]
    assert f["input_mask"][0].tolist() == [1] * 7 + [0] * 3
    assert f["word_index"][0].tolist() == [-1, 0, 1, -1, 2, 3, -1, -1, -1, -1]
    assert f["label_mask"][0].tolist() == [0, 1, 1, 0, 1, 1, 0, 0, 0, 0]
    assert f["label_ids"][0].tolist() == [0, 1, 2, 0, 0, 0, 0, 0, 0, 0]  # B-PER=1, I-PER=2
    assert f["input_ids"][1, :3].tolist() == [ner_ids["[CLS]"], ner_ids["eu"], ner_ids["[SEP]"]]
    assert f["label_ids"][1, 1] == 3 and f["example_index"].tolist() == [0, 1]
    assert not f["segment_ids"].any()
    with pytest.raises(ValueError, match="max_seq_length must be >= 3"):
        task.featurize(ex, ner_tok, 2)


def test_featurize_splits_long_sentences(ner_tok, ner_ids, one_hot_logits):
    task = NerTask("tfds")
    ex = [NerExample(("EU", "Peter", "Blackburn", "said", "unbelievably", "lamb"),
                     ("B-ORG", "B-PER", "I-PER", "O", "O", "O"))]
    f = task.featurize(ex, ner_tok, 6)  # 4 pieces a row: [EU peter black ##burn] [said un ##believ] [lamb]
    assert f["example_index"].tolist() == [0, 0, 0]
    assert f["word_index"].tolist() == [[-1, 0, 1, 2, -1, -1], [-1, 3, 4, -1, -1, -1],
                                        [-1, 5, -1, -1, -1, -1]]
    assert f["input_ids"][1].tolist() == [ner_ids[t] for t in ["[CLS]", "said", "un", "##believ", "##ably",
                                                          "[SEP]"]]
    f = task.featurize(ex, ner_tok, 4)  # 2 pieces a row; "unbelievably" keeps un ##believ
    assert f["word_index"][:, 1].tolist() == [0, 2, 3, 4, 5] and f["word_index"][0, 2] == 1
    assert f["input_ids"][3].tolist() == [ner_ids[t] for t in ["[CLS]", "un", "##believ", "[SEP]"]]
    # Every word still gets exactly one prediction.
    assert task.evaluate(ex, f, {"logits": one_hot_logits(task, f)})["f1"] == 1.0


def test_featurize_matches_per_word_tokenization_minilm(conll_dir, minilm_dir):
    real = WordPieceTokenizer(minilm_dir / "vocab.txt")
    task = NerTask(data_dir=conll_dir)
    ex = task.load("dev")
    f = task.featurize(ex, real, 8)
    for row in range(len(f["input_ids"])):
        e, starts = f["example_index"][row], np.flatnonzero(f["word_index"][row] >= 0)
        ends = [*starts[1:], f["input_mask"][row].sum() - 1]
        for s, t in zip(starts, ends, strict=True):
            j = f["word_index"][row, s]
            want = real.tokenize(tf.constant([ex[e].words[j]]))[0].numpy().tolist()
            assert f["input_ids"][row, s:t].tolist() == want[:6]
            assert task.label_names[f["label_ids"][row, s]] == ex[e].tags[j]
    covered = {(e, j) for e, wi in zip(f["example_index"], f["word_index"], strict=True) for j in wi if j >= 0}
    assert covered == {(e, j) for e, x in enumerate(ex) for j in range(len(x.words))}
