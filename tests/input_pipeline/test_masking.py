"""Tests for input_pipeline/pretraining/masking.py on synthetic token data (fake vocab of 1000 ids)."""

import numpy as np
import pytest
import tensorflow as tf

from input_pipeline.pretraining import masking
from input_pipeline.pretraining.masking import MaskingConfig, example_seed, mask_dataset, mask_example

PAD, CLS, SEP, MASK = 0, 101, 102, 103
SPECIALS = (PAD, CLS, SEP, MASK)
VOCAB = 1000
L, P = 128, 20


def make_batch(n, length=L, min_len=8, seed=0, cont_rate=0.0):
    """[CLS] a.. [SEP] b.. [SEP] [PAD]..; returns ids, mask, is_continuation (numpy)."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(min_len, length + 1, n)
    ids = rng.integers(104, VOCAB, (n, length)).astype(np.int32)
    mask = (np.arange(length)[None] < lens[:, None]).astype(np.int32)
    ids[:, 0] = CLS
    ids[np.arange(n), lens - 1] = SEP
    mid = rng.integers(1, lens - 1)
    ids[np.arange(n), mid] = SEP
    ids[mask == 0] = PAD
    cont = (rng.random((n, length)) < cont_rate) & (mask == 1) & ~np.isin(ids, SPECIALS)
    return ids, mask, cont


def cfg_(**kw):
    return MaskingConfig(vocab_size=VOCAB, mask_id=MASK, special_ids=SPECIALS,
                         max_predictions_per_seq=kw.pop("P", P), **kw)


def run(ids, mask, cfg, seed=(3, 4), cont=None):
    out = mask_example({"input_ids": ids, "input_mask": mask, "keep": tf.ones([len(ids)])},
                       tf.constant(seed, tf.int64), cfg, cont)
    return {k: np.asarray(v) for k, v in out.items()}


def py_num_to_predict(num_tokens, prob, max_pred):  # Google's create_pretraining_data.py
    return min(max_pred, max(1, int(round(num_tokens * prob))))


def test_statistics_rate_and_80_10_10():
    ids, mask, _ = make_batch(2500, min_len=32)
    assert mask.sum() >= 200_000
    out = run(ids, mask, cfg_())
    w = out["masked_lm_weights"] > 0
    assert abs(w.sum() / mask.sum() - 0.15) < 0.003
    pos = out["masked_lm_positions"]
    new = np.take_along_axis(out["input_ids"], pos, 1)[w]
    orig = out["masked_lm_ids"][w]
    frac_mask, frac_same = np.mean(new == MASK), np.mean(new == orig)
    frac_rand = 1 - frac_mask - frac_same
    assert abs(frac_mask - 0.8) < 0.015 and abs(frac_same - 0.1) < 0.015
    assert abs(frac_rand - 0.1) < 0.015
    # Random ids: never special, spread over the allowed vocab.
    rand = new[(new != MASK) & (new != orig)]
    assert not np.isin(rand, SPECIALS).any() and len(np.unique(rand)) > 600
    # Every candidate position is about equally likely (full-length rows).
    ids, mask, _ = make_batch(2000, min_len=L, seed=1)
    out = run(ids, mask, cfg_(), seed=(9, 9))
    sel = np.zeros_like(ids, bool)
    np.put_along_axis(sel, out["masked_lm_positions"], out["masked_lm_weights"] > 0, 1)
    rate = sel.sum(0)[1:-1] / (~np.isin(ids, SPECIALS)).sum(0)[1:-1]
    assert rate.min() > 0.75 * rate.mean() and rate.max() < 1.25 * rate.mean()


@pytest.mark.parametrize("max_pred", [P, 5])
def test_exact_invariants(max_pred):
    ids, mask, _ = make_batch(300, min_len=3)
    ids[0, 1:] = PAD
    ids[0, :3] = [CLS, SEP, SEP]  # no candidate at all
    mask[0] = 0
    mask[0, :3] = 1
    out = run(ids, mask, cfg_(P=max_pred))
    pos, lm_ids, w = out["masked_lm_positions"], out["masked_lm_ids"], out["masked_lm_weights"]
    assert pos.shape == lm_ids.shape == w.shape == (len(ids), max_pred)
    assert pos.dtype == lm_ids.dtype == out["input_ids"].dtype == np.int32
    assert w.dtype == np.float32 and set(np.unique(w)) <= {0.0, 1.0}
    np.testing.assert_array_equal(out["keep"], np.ones(len(ids)))
    for b in range(len(ids)):
        k = int(w[b].sum())
        n_cand = int((mask[b].astype(bool) & ~np.isin(ids[b], SPECIALS)).sum())
        expected = py_num_to_predict(int(mask[b].sum()), 0.15, max_pred) if n_cand else 0
        assert k == min(expected, n_cand) <= max_pred
        assert (w[b, :k] == 1).all() and (w[b, k:] == 0).all()
        assert (pos[b, k:] == 0).all() and (lm_ids[b, k:] == 0).all()
        p = pos[b, :k]
        assert (np.diff(p) > 0).all()
        assert mask[b, p].all() and not np.isin(ids[b, p], SPECIALS).any()
        np.testing.assert_array_equal(lm_ids[b, :k], ids[b, p])
        changed = np.flatnonzero(out["input_ids"][b] != ids[b])
        assert np.isin(changed, p).all()
    assert w[0].sum() == 0 and (out["input_ids"][0] == ids[0]).all()


def test_num_to_predict_formula():
    n = np.arange(0, 700)
    for prob in (0.15, 0.1, 0.2, 1 / 3, 0.5):
        cfg = MaskingConfig(VOCAB, MASK, SPECIALS, masked_lm_prob=prob, max_predictions_per_seq=80)
        got = masking.num_to_predict(tf.constant(n), tf.ones_like(n), cfg).numpy()
        np.testing.assert_array_equal(got, [py_num_to_predict(int(x), prob, 80) for x in n])
    assert masking.num_to_predict(tf.constant([5]), tf.constant([0]), cfg_()).numpy()[0] == 0


def test_random_replacements_never_special():
    ids, mask, _ = make_batch(400)
    out = run(ids, mask, cfg_(mask_token_prob=0.0, random_token_prob=1.0))
    w = out["masked_lm_weights"] > 0
    new = np.take_along_axis(out["input_ids"], out["masked_lm_positions"], 1)[w]
    assert not np.isin(new, SPECIALS).any()
    cfg = cfg_(mask_token_prob=0.0, random_token_prob=1.0, random_token_ids=range(200, 300))
    out = run(ids, mask, cfg)
    new = np.take_along_axis(out["input_ids"], out["masked_lm_positions"], 1)[w]
    assert ((new >= 200) & (new < 300)).all()
    with pytest.raises(ValueError):
        cfg_(random_token_ids=(5, CLS))


def py_words(ids, mask, cont) -> list[list[int]]:
    """One row's candidate words as lists of positions: a real, non-special token starts a word
    unless it continues (``cont``) the token just before it."""
    words = []
    for i in np.flatnonzero(mask.astype(bool) & ~np.isin(ids, SPECIALS)):
        if cont[i] and words and words[-1][-1] == i - 1:
            words[-1].append(i)
        else:
            words.append([i])
    return words


def reference_whole_word(ids, mask, cont, seed, cfg):
    """Google's greedy loop in Python, fed with the module's random order (same draw)."""
    bits = tf.random.stateless_uniform([len(ids), 3, ids.shape[1]], seed=seed, dtype=tf.int32,
                                       minval=None, maxval=None).numpy()[:, 0] & 0x7FFFFFFF
    result = []
    for b in range(len(ids)):
        words = py_words(ids[b], mask[b], cont[b])
        words.sort(key=lambda wd: (-bits[b, wd[0]], wd[0]))
        n = py_num_to_predict(int(mask[b].sum()), cfg.masked_lm_prob, cfg.max_predictions_per_seq)
        chosen = []
        for wd in words:
            if len(chosen) >= n:
                break
            if len(chosen) + len(wd) > n:
                continue
            chosen += wd
        result.append(sorted(chosen))
    return result


def test_whole_word_masks_complete_words_only():
    ids, mask, cont = make_batch(400, cont_rate=0.5)
    cont[:, 1] = True  # continuation right after [CLS]: starts its own word (documented)
    cont &= mask.astype(bool) & ~np.isin(ids, SPECIALS)
    cfg = cfg_(whole_word=True)
    out = run(ids, mask, cfg, cont=cont)
    ref = reference_whole_word(ids, mask, cont, tf.constant([3, 4], tf.int64), cfg)
    for b in range(len(ids)):
        k = int(out["masked_lm_weights"][b].sum())
        p = out["masked_lm_positions"][b, :k]
        assert list(p) == ref[b]
        sel = np.zeros(L, bool)
        sel[p] = True
        # A selected continuation's predecessor is selected unless it is a special token.
        inner = cont[b, 1:] & ~np.isin(ids[b, :-1], SPECIALS)
        assert (sel[1:][inner] == sel[:-1][inner]).all()
    # No continuation at all: identical to token-level masking with the same seed.
    a = run(ids, mask, cfg, cont=np.zeros_like(cont))
    c = run(ids, mask, cfg_())
    for key in a:
        np.testing.assert_array_equal(a[key], c[key])


def _dataset(ids, mask, cont=None):
    feats = {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(ids)}
    return tf.data.Dataset.from_tensor_slices(feats)


def _collect(ds):
    out = {}
    for x in ds.as_numpy_iterator():
        for k, v in x.items():
            out.setdefault(k, []).append(v)
    return {k: np.concatenate(v) if np.ndim(v[0]) > 1 else np.stack(v) for k, v in out.items()}


@pytest.mark.parametrize("whole_word", [False, True])
def test_eager_equals_dataset_graph(whole_word):
    ids, mask, _ = make_batch(150, cont_rate=0.3)
    table = np.zeros(VOCAB, bool)
    table[600:] = True
    cfg = cfg_(whole_word=whole_word)
    ds = _dataset(ids, mask)
    micro_batch = 16 if whole_word else 64  # the default; smaller traces faster
    micro = _collect(mask_dataset(ds, cfg, seed=7, epoch=2, continuation_table=table,
                                  micro_batch=micro_batch))
    single = _collect(mask_dataset(ds, cfg, seed=7, epoch=2, micro_batch=1,
                                   continuation_table=lambda x: tf.gather(table, x)))
    fn = tf.function(lambda f, s: mask_example(f, s, cfg, tf.gather(table, f["input_ids"])))
    for i in range(0, len(ids), 13):
        feats = {"input_ids": ids[i], "input_mask": mask[i], "segment_ids": np.zeros(L, np.int32)}
        s = example_seed(7, 2, i)
        eager = mask_example(feats, s, cfg, table[ids[i]])
        graph = fn(feats, s)
        for k, v in eager.items():
            np.testing.assert_array_equal(v, micro[k][i], err_msg=k)
            np.testing.assert_array_equal(v, single[k][i], err_msg=k)
            np.testing.assert_array_equal(v, graph[k], err_msg=k)
    # Per-row seeds on a batch == row by row.
    seeds = tf.stack([example_seed(7, 2, i) for i in range(5)])
    batch = mask_example({"input_ids": ids[:5], "input_mask": mask[:5]}, seeds, cfg, table[ids[:5]])
    np.testing.assert_array_equal(batch["masked_lm_positions"], micro["masked_lm_positions"][:5])


def test_prebatched_dataset_gets_one_seed_per_batch():
    ids, mask, _ = make_batch(64)
    cfg = cfg_()
    got = list(mask_dataset(_dataset(ids, mask).batch(32), cfg, seed=1, epoch=0))
    want = mask_example({"input_ids": ids[32:], "input_mask": mask[32:]}, example_seed(1, 0, 1),
                        cfg)
    np.testing.assert_array_equal(got[1]["input_ids"], want["input_ids"])
    np.testing.assert_array_equal(got[1]["masked_lm_positions"], want["masked_lm_positions"])


@pytest.mark.slow  # ~30 s
def test_epochs_give_new_masks_and_same_epoch_repeats():
    ids, mask, _ = make_batch(200)
    ds = _dataset(ids, mask)
    cfg = cfg_()
    e0 = _collect(mask_dataset(ds, cfg, seed=5, epoch=0))
    # micro_batch changes nothing but speed; small ones keep this test quick to trace.
    e0_again = _collect(mask_dataset(ds, cfg, seed=5, epoch=tf.constant(0), micro_batch=8))
    e1 = _collect(mask_dataset(ds, cfg, seed=5, epoch=1, micro_batch=8))
    other_seed = _collect(mask_dataset(ds, cfg, seed=6, epoch=0, micro_batch=8))
    for k in e0:
        np.testing.assert_array_equal(e0[k], e0_again[k])
    for other in (e1, other_seed):
        differ = (other["masked_lm_positions"] != e0["masked_lm_positions"]).any(1)
        assert differ.mean() > 0.9
    np.testing.assert_array_equal(e1["segment_ids"], np.zeros_like(ids))


def test_errors():
    ids, mask, _ = make_batch(4)
    with pytest.raises(ValueError, match="is_continuation"):
        run(ids, mask, cfg_(whole_word=True))
    with pytest.raises(ValueError, match="continuation_table"):
        mask_dataset(_dataset(ids, mask), cfg_(whole_word=True), seed=0)
    with pytest.raises(KeyError, match="input_mask"):
        mask_example({"input_ids": ids[0]}, tf.constant([1, 2]), cfg_())
    with pytest.raises(ValueError, match="mask_id"):
        MaskingConfig(vocab_size=10, mask_id=10, special_ids=(0,))
