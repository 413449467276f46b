"""The batch layout in input_pipeline.pretraining.batch is what the producers actually make."""

import numpy as np

from input_pipeline.pretraining import batch as layout
from input_pipeline.pretraining.featurize import parse_examples, serialize_example
from input_pipeline.pretraining.synthetic import SyntheticBatches


def check(batch: dict, n: int, length: int, predictions: int):
    expected = layout.shapes(n, length, predictions)
    assert set(batch) == set(expected)
    for key, (shape, dtype) in expected.items():
        assert tuple(np.shape(batch[key])) == shape, key
        assert np.asarray(batch[key]).dtype == dtype, key


def test_parsed_records_have_the_layout():
    rows = [{"input_ids": [2, 7, 3, 0], "input_mask": [1, 1, 1, 0], "segment_ids": [0, 0, 0, 0],
             "masked_lm_positions": [1, 0], "masked_lm_ids": [9, 0], "masked_lm_weights": [1.0, 0.0],
             "next_sentence_labels": [1]}] * 3
    parsed = parse_examples([serialize_example(r) for r in rows], 4, 2)
    check({k: v.numpy() for k, v in parsed.items()}, 3, 4, 2)


def test_synthetic_batches_have_the_layout():
    check(next(SyntheticBatches(batch_size=2, seq_len=16, max_predictions=3, vocab_size=50)), 2, 16, 3)


def test_keys_are_defined_once():
    names = [k.name for k in (*layout.REQUIRED, *layout.OPTIONAL)]
    assert len(names) == len(set(names))
    assert set(layout.MASKED_KEYS) | set(layout.UNMASKED_KEYS) == set(layout.REQUIRED_KEYS)
    assert set(layout.MODEL_INPUT_KEYS) <= set(names)
    assert layout.FLOAT_KEYS == {"masked_lm_weights", "nsp_weights"}
