"""The training input (input_pipeline/pretraining/dataset.py) on tiny shards and text: static and dynamic
masking, eval split, exact resume across epochs, process sharding, errors; and the pipeline
benchmark's entry point (not timed)."""

import gc
import re
import shutil
import weakref
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from bert_jax.benchmark import pipeline as benchmark
from input_pipeline.pretraining import featurize
from input_pipeline.pretraining.dataset import make_pretraining_dataset

L, P, B = 32, 5, 4  # max_seq_length, max_predictions_per_seq (those of pretraining_data), batch size
KEYS = {"input_ids": (B, L), "input_mask": (B, L), "segment_ids": (B, L), "masked_lm_positions": (B, P),
        "masked_lm_ids": (B, P), "masked_lm_weights": (B, P), "next_sentence_labels": (B,)}


def epochs(ds, n):
    """The batches of the next n whole epochs (ds at an epoch start); consumes one batch more."""
    out, batch = [], next(ds)
    for _ in range(n):
        epoch, out = ds.epoch, [*out, []]
        while ds.epoch == epoch:
            out[-1].append(batch)
            batch = next(ds)
    return out


def rows(batches, key=lambda b: b["input_ids"]):
    return [r.tobytes() for b in batches for r in key(b)]


def unmasked(b):
    """[B, L] input ids with the original ids put back at the masked positions."""
    ids, pos, w = b["input_ids"].copy(), b["masked_lm_positions"], b["masked_lm_weights"] > 0
    r = np.arange(len(ids))[:, None]
    ids[r, pos] = np.where(w, b["masked_lm_ids"], ids[r, pos])
    return ids


def records(directory, files=slice(None), p=None):
    paths = sorted(str(f) for f in Path(directory).glob("*.tfrecord"))[files]
    raw = list(tf.data.TFRecordDataset(paths).as_numpy_iterator())
    return {k: v.numpy() for k, v in featurize.parse_examples(raw, L, p).items()}


def test_static_shards(pretraining_data, pretraining_config):
    ref = records(pretraining_data / "static", p=P)
    n = len(ref["input_ids"])
    c = pretraining_config(pretraining_data, pretraining_data / "static", "static")
    ds = make_pretraining_dataset(c, batch_size=B)
    e0, e1 = epochs(ds, 2)
    for k, shape in KEYS.items():
        assert e0[0][k].shape == shape and e0[0][k].dtype == (np.float32 if k == "masked_lm_weights" else np.int32)
    assert len(e0) == len(e1) == n // B
    whole = lambda b: np.concatenate([b["input_ids"], b["masked_lm_positions"], b["masked_lm_ids"]], 1)
    known = set(rows([ref], whole))
    seen0, seen1 = rows(e0, whole), rows(e1, whole)
    assert len(set(seen0)) == len(seen0) and set(seen0) <= known and set(seen1) <= known
    assert seen0 != seen1  # reshuffled each epoch, the (static) masks travel with their examples


def test_dynamic_masking(pretraining_data, pretraining_config, assert_batches_equal):
    c = pretraining_config(pretraining_data, pretraining_data / "unmasked")
    ds = make_pretraining_dataset(c, batch_size=B)
    e0, e1 = epochs(ds, 2)
    known = set(rows([records(pretraining_data / "unmasked")]))
    assert set(rows(e0, unmasked)) <= known and set(rows(e1, unmasked)) <= known
    masks = [dict(zip(rows(e, unmasked), rows(e, lambda b: b["masked_lm_positions"]), strict=True)) for e in (e0, e1)]
    common = masks[0].keys() & masks[1].keys()
    assert len(common) > 0.8 * len(masks[0])
    assert sum(masks[0][k] == masks[1][k] for k in common) < 0.2 * len(common)  # new masks each epoch
    weights = np.concatenate([b["masked_lm_weights"] for b in e0])
    assert 0.13 < weights.sum() / sum(b["input_mask"].sum() for b in e0) < 0.18
    picked = np.concatenate([np.take_along_axis(b["input_ids"], b["masked_lm_positions"], 1) for b in e0])
    assert 0.7 < (picked[weights > 0] == 4).mean() < 0.9  # 80% [MASK]
    again = epochs(make_pretraining_dataset(c, batch_size=B), 1)[0]
    assert_batches_equal(again, e0)  # same seed and epoch: the same masks
    c.data.seed = 1
    other = epochs(make_pretraining_dataset(c, batch_size=B), 1)[0]
    assert rows(other) != rows(e0)


def test_a_dropped_reader_takes_its_iterator_along(pretraining_data, pretraining_config):
    """The tf.data functions capture the reader's recipe, not the reader: a reader that has read, once
    dropped, goes at once with its iterator (buffers, threads), not at some later full garbage
    collection."""
    c = pretraining_config(pretraining_data, pretraining_data / "unmasked")  # dynamic masking: its map too
    ds = make_pretraining_dataset(c, batch_size=B)
    next(ds)
    refs = weakref.ref(ds), weakref.ref(ds._it)
    gc.disable()
    try:
        del ds
        assert [r() is None for r in refs] == [True, True]
    finally:
        gc.enable()


def test_dynamic_ngram_masking(pretraining_data, pretraining_config):
    c = pretraining_config(pretraining_data, pretraining_data / "unmasked", ngram_mask=3)
    ds = make_pretraining_dataset(c, batch_size=B)
    assert ds.mask_cfg.ngram == 3 and ds.mask_cfg.word_level and not ds.mask_cfg.whole_word
    batches = [next(ds) for _ in range(3)]
    known = set(rows([records(pretraining_data / "unmasked")]))
    assert set(rows(batches, unmasked)) <= known
    weights = np.concatenate([b["masked_lm_weights"] for b in batches])
    assert weights.shape == (3 * B, P) and weights.sum() > 0
    c.data.ngram_mask = -1
    with pytest.raises(ValueError, match=r"config.data.ngram_mask=-1: expected an int >= 0"):
        make_pretraining_dataset(c, batch_size=B)


def doc_numbers(batches, vocab):
    ids = np.concatenate([unmasked(b) for b in batches])
    return {int(vocab[i][1:]) for i in np.unique(ids) if vocab[i].startswith("d")}


def test_text_input_eval_split(pretraining_data, pretraining_config):
    text = pretraining_data / "corpus" / "part-0.txt"  # documents D0..D9; eval: every 4th (eval_fraction 0.25)
    c = pretraining_config(pretraining_data, text, eval_fraction=0.25)
    vocab = (pretraining_data / "vocab.txt").read_text().split("\n")
    train = epochs(make_pretraining_dataset(c, batch_size=B), 1)[0]
    evals = epochs(make_pretraining_dataset(c, split="eval", batch_size=B), 1)[0]
    assert train and evals and set(evals[0]) == set(KEYS)
    train_docs, eval_docs = doc_numbers(train, vocab), doc_numbers(evals, vocab)
    assert train_docs <= {1, 2, 3, 5, 6, 7, 9} and len(train_docs) >= 5
    assert eval_docs <= {0, 4, 8} and len(eval_docs) >= 2


@pytest.mark.parametrize("kind", ["unmasked", "static", "text"])
def test_exact_resume_across_epochs(pretraining_data, kind, pretraining_config, assert_batches_equal):
    source = pretraining_data / "corpus" / "part-1.txt" if kind == "text" else pretraining_data / kind
    c = pretraining_config(pretraining_data, source, "static" if kind == "static" else "dynamic")
    straight = make_pretraining_dataset(c, batch_size=B)
    straight.EPOCHS_PER_ITERATOR = 1  # a new tf.data iterator every epoch must not change the batches
    expected, states = [], []
    while straight.state()["epoch"] == 0 or straight.batch < 3:  # into epoch 1 by 3 batches
        expected.append(next(straight))
        states.append(straight.state())  # after len(expected) batches
    per_epoch = len(expected) - 3
    assert per_epoch >= 3 and states[per_epoch - 1] == {"kind": "pretraining", "epoch": 0, "batch": per_epoch}
    for k in (per_epoch - 1, per_epoch, per_epoch + 1) if kind == "unmasked" else (per_epoch - 1,):
        resumed = make_pretraining_dataset(c, batch_size=B)
        resumed.restore(states[k - 1])
        assert_batches_equal([next(resumed), next(resumed)], expected[k : k + 2])
        assert resumed.state() == states[k + 1]


@pytest.mark.parametrize("kind", ["unmasked", "text"])
def test_processes_read_disjoint_shares(pretraining_data, kind, pretraining_config):
    source = pretraining_data / "corpus" / "*.txt" if kind == "text" else pretraining_data / "unmasked"
    c = pretraining_config(pretraining_data, source)
    seen = [set(rows(epochs(make_pretraining_dataset(c, batch_size=B, process_index=i, process_count=2), 1)[0],
                     unmasked)) for i in (0, 1)]
    assert seen[0] and seen[1] and not seen[0] & seen[1]
    if kind == "unmasked":  # process i reads files i::2, all of their examples but the last partial batch
        for i in (0, 1):
            mine = rows([records(pretraining_data / "unmasked", slice(i, None, 2))])
            assert seen[i] <= set(mine) and len(seen[i]) == len(mine) // B * B


def test_text_processes_take_blocks_of_the_same_global_batches(pretraining_data, pretraining_config,
                                                               assert_batches_equal):
    """In-memory text: process i of 2 gets rows [iB, (i+1)B) of the one-process batches of 2B (dynamic
    masks included), across an epoch boundary, and resumes its own position."""
    c = pretraining_config(pretraining_data, pretraining_data / "corpus" / "*.txt")
    one = make_pretraining_dataset(c, batch_size=2 * B)
    parts = [make_pretraining_dataset(c, batch_size=B, process_index=i, process_count=2) for i in (0, 1)]
    seen, states = [], []
    while one.epoch == 0 or one.batch < 2:
        whole, halves = next(one), [next(p) for p in parts]
        seen.append(halves[1])
        states.append(parts[1].state())
        assert parts[0].state() == states[-1] == one.state()
        for k in whole:
            np.testing.assert_array_equal(np.concatenate([h[k] for h in halves]), whole[k], err_msg=k)
    assert len(seen) >= 4
    resumed = make_pretraining_dataset(c, batch_size=B, process_index=1, process_count=2)
    resumed.restore(states[-4])  # two batches before the epoch's end
    assert_batches_equal([next(resumed), next(resumed), next(resumed)], seen[-3:])


def test_clear_errors(pretraining_data, tmp_path, pretraining_config):
    data, config = pretraining_data, pretraining_config
    with pytest.raises(FileNotFoundError, match="matches no TFRecord files"):
        make_pretraining_dataset(config(data, tmp_path / "missing-*.tfrecord"), batch_size=B)
    with pytest.raises(ValueError, match=r"unmasked/config.json: the shards are unmasked \(\"masked\": false\)"):
        make_pretraining_dataset(config(data, data / "unmasked", "static"), batch_size=B)
    with pytest.raises(ValueError, match=r"static/config.json: the shards are already masked"):
        make_pretraining_dataset(config(data, data / "static", "dynamic"), batch_size=B)
    with pytest.raises(ValueError, match=r"unmasked/config.json: max_seq_length=32 but config.data.max_seq_length=64"):
        make_pretraining_dataset(config(data, data / "unmasked", max_seq_length=64), batch_size=B)
    # Without config.json (e.g. Google's files) the first record tells.
    shard = tmp_path / "pretrain-00000-of-00001.tfrecord"
    shutil.copy(data / "unmasked" / "pretrain-00000-of-00004.tfrecord", shard)
    with pytest.raises(ValueError, match=re.escape(f"{shard}: the shards are unmasked (first record lacks masked_lm")):
        make_pretraining_dataset(config(data, shard, "static"), batch_size=B)
    with pytest.raises(ValueError, match=re.escape(f"{shard}: first record has 32 input_ids, expected ")):
        make_pretraining_dataset(config(data, shard, max_seq_length=48), batch_size=B)
    with pytest.raises(ValueError, match="1 TFRecord files cannot feed 2 processes"):
        make_pretraining_dataset(config(data, shard), batch_size=B, process_index=1, process_count=2)
    with pytest.raises(ValueError, match=r"eval_fraction=0.1 cannot split TFRecord shards"):
        make_pretraining_dataset(config(data, shard, eval_fraction=0.1), split="eval", batch_size=B)
    with pytest.raises(ValueError, match="not enough examples for one batch of 10000"):
        next(make_pretraining_dataset(config(data, shard), batch_size=10_000))


@pytest.mark.slow  # ~19 s: the benchmark's command end to end; the dataset itself: the tests above
def test_benchmark_main(pretraining_data):
    data = pretraining_data
    result = benchmark.main(["--source", str(data / "corpus" / "*.txt"), "--vocab", str(data / "vocab.txt"),
                             "--max_seq_length", str(L), "--batch_size", str(B), "--batches", "2", "--json"])
    stage1, stage2 = result["shards"], result["pipeline"]
    assert stage1["documents"] == 40 and stage1["examples"] > 0
    for key in ("documents_per_second", "examples_per_second", "tokens_per_second"):
        assert stage1[key] > 0, key
    assert stage2["batches"] == 2 and stage2["examples"] == 2 * B and stage2["masking"] == "dynamic"
    assert stage2["examples_per_second"] > 0 and stage2["tokens_per_second"] > 0
    assert 0 < stage2["masked_fraction"] < 0.3
