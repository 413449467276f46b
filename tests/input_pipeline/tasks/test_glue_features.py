"""GLUE features (input_pipeline/tasks/glue_features.py): Google BERT's pair truncation, exact ids,
segments, masks and labels of pairs and single sentences, padding."""

import random

import numpy as np
import pytest

from input_pipeline.tasks.glue import GlueExample, GlueTask
from input_pipeline.tasks.glue_features import truncate_seq_pair


def google_truncate(a, b, max_length):
    """run_classifier.py's _truncate_seq_pair, verbatim in spirit."""
    a, b = list(a), list(b)
    while len(a) + len(b) > max_length:
        (a if len(a) > len(b) else b).pop()
    return len(a), len(b)


def test_truncate_seq_pair_matches_google():
    rng = random.Random(0)
    cases = [(rng.randrange(40), rng.randrange(40), rng.randrange(0, 50)) for _ in range(2000)]
    la, lb, m = (np.array(x) for x in zip(*cases, strict=True))
    ta, tb = truncate_seq_pair(la, lb, m)
    assert list(zip(ta.tolist(), tb.tolist(), strict=True)) == [
        google_truncate(range(x), range(y), z) for x, y, z in cases]


def test_featurize_pairs_exact_ids_truncation_padding(glue_tok):
    t = GlueTask("stsb", "tfds")
    long_a, long_b = " ".join(f"w{i}" for i in range(10)), " ".join(f"v{i}" for i in range(4))
    examples = [GlueExample("0", "A plane is taking off.", "An air plane is taking off.", 4.5),
                GlueExample("1", long_a, long_b, 1.0), GlueExample("2", "w1", "v1 v2", None)]
    f = t.featurize(examples, glue_tok, 12)
    assert set(f) == {"input_ids", "input_mask", "segment_ids", "example_index", "label"}
    assert all(v.dtype == np.int32 for k, v in f.items() if k != "label") and f["label"].dtype == np.float32
    np.testing.assert_array_equal(f["label"], [4.5, 1.0, 0.0])
    np.testing.assert_array_equal(f["example_index"], [0, 1, 2])
    ids, segs = glue_tok.encode(examples[0].text_a, examples[0].text_b)  # untruncated: 6 + 7 tokens + 3
    a_len = segs.count(0) - 2
    assert (a_len, len(ids) - a_len - 3) == (6, 7)
    ta, tb = google_truncate(range(6), range(7), 12 - 3)
    assert (ta, tb) == (5, 4)
    want = ids[:1 + ta] + [glue_tok.sep_id] + ids[a_len + 2:a_len + 2 + tb] + [glue_tok.sep_id]
    assert f["input_ids"][0].tolist() == want and len(want) == 12
    assert f["segment_ids"][0].tolist() == [0] * (ta + 2) + [1] * (tb + 1)
    assert glue_tok.id_to_token(f["input_ids"][1]) == (
        ["[CLS]"] + [f"w{i}" for i in range(5)] + ["[SEP]"] + [f"v{i}" for i in range(4)] + ["[SEP]"])
    assert f["input_mask"][1].tolist() == [1] * 12
    assert glue_tok.id_to_token(f["input_ids"][2]) == ["[CLS]", "w1", "[SEP]", "v1", "v2", "[SEP]"] + ["[PAD]"] * 6
    assert f["input_mask"][2].tolist() == [1] * 6 + [0] * 6
    assert f["segment_ids"][2].tolist() == [0, 0, 0, 1, 1, 1] + [0] * 6


def test_featurize_single_sentences(glue_tok):
    t = GlueTask("cola", "tfds")
    examples = [GlueExample("0", "the plane .", None, 1), GlueExample("1", " ".join(f"w{i}" for i in range(9)),
                                                                      None, 0)]
    f = t.featurize(examples, glue_tok, 6)
    assert f["input_ids"][0].tolist() == glue_tok.encode("the plane .")[0] + [0]
    assert glue_tok.id_to_token(f["input_ids"][1]) == ["[CLS]", "w0", "w1", "w2", "w3", "[SEP]"]
    assert f["segment_ids"].sum() == 0 and f["input_mask"][0].tolist() == [1] * 5 + [0]
    assert f["label"].dtype == np.int32 and f["label"].tolist() == [1, 0]
    empty = t.featurize([], glue_tok, 6)
    assert empty["input_ids"].shape == (0, 6) and empty["label"].shape == (0,)
    with pytest.raises(ValueError, match="at least 3"):
        t.featurize(examples, glue_tok, 2)


def test_featurize_loaded_task(glue_dir, glue_tok, glue_files):
    N = glue_files.N
    t = GlueTask("mnli", str(glue_dir))
    examples = t.load("test_mismatched")
    f = t.featurize(examples, glue_tok, 32)
    assert f["input_ids"].shape == (N, 32) and not f["label"].any()
    ids, segs = glue_tok.encode(examples[2].text_a, examples[2].text_b)
    assert f["input_ids"][2, :len(ids)].tolist() == ids and f["segment_ids"][2, :len(ids)].tolist() == segs
