"""ALBERT's n-gram masking (MaskingConfig.ngram; input_pipeline/pretraining/mask_selection.py `select_ngrams`): the
length distribution p(n) ∝ 1/n, spans of whole words within the budget, the original loop replayed in
Python on the same random draws, 80/10/10, seeds, and tf.data against eager."""

import numpy as np
import pytest
import tensorflow as tf

from input_pipeline.pretraining.mask_selection import ngram_lengths, select_ngrams, select_whole_words
from input_pipeline.pretraining.masking import MaskingConfig, example_seed, mask_dataset, mask_example
from tests.input_pipeline.test_masking import MASK, SPECIALS, L, cfg_, make_batch, py_num_to_predict, py_words, run

# chi-square critical values at p = 0.001 for 1 and 2 degrees of freedom
CHI2_999 = {1: 10.83, 2: 13.82}


def one_over_n(k):
    p = 1 / np.arange(1, k + 1)
    return p / p.sum()


@pytest.mark.parametrize("max_ngram", [1, 3, 5])
def test_ngram_lengths_are_the_inverse_cdf_of_one_over_n(max_ngram):
    m = 60_000  # u on an even grid: each n's count is its probability times m, up to rounding
    u = (np.arange(m) + 0.5) / m
    for avail in range(1, max_ngram + 3):
        got = ngram_lengths(tf.constant(u, tf.float32), tf.fill([m], avail), max_ngram).numpy()
        k = min(avail, max_ngram)
        counts = np.bincount(got, minlength=k + 1)
        assert counts[0] == 0 and len(counts) == k + 1  # n in 1..min(avail, N)
        np.testing.assert_allclose(counts[1:], one_over_n(k) * m, atol=1)


def visit_first_then_elsewhere(rows, avail, budget, seed=0):
    """Rows where word 0 (a run of `avail` one-token words at positions 1..avail) is visited first and
    a far run of 7 words next, which takes what budget word 0's span leaves, so the masked tokens
    among positions 1..avail are exactly the span word 0 chose. → (cand, cont, score, u, n, run)."""
    length = 16
    cand = np.zeros([rows, length], bool)
    cand[:, 1 : 1 + avail] = True
    cand[:, 8:15] = True
    score = np.zeros([rows, length], np.int32)
    score[:, 1] = 1000  # word 0 first, then the far run, then the rest of word 0's run
    score[:, 8:15] = np.arange(900, 907)
    u = np.random.default_rng(seed).random([rows, length], np.float32)
    n = np.full([rows], budget, np.int32)
    return cand, np.zeros_like(cand), score, u, n, slice(1, 1 + avail)


@pytest.mark.parametrize("avail, budget, expected", [
    (3, 3, one_over_n(3)),  # p(n) ∝ 1/n
    (2, 3, one_over_n(2)),  # only two words before the next non-candidate: renormalised over 1..2
    (3, 2, [6 / 11, 5 / 11]),  # a drawn 3 does not fit the budget of 2 and becomes 2
])
def test_span_lengths_follow_one_over_n(avail, budget, expected):
    cand, cont, score, u, n, run = visit_first_then_elsewhere(4000, avail, budget)
    got = select_ngrams(*map(tf.constant, (cand, cont, score, u, n)), max_ngram=3).numpy()
    assert (got.sum(1) == budget).all()  # the far run always spends the rest
    lengths = got[:, run].sum(1)
    counts = np.bincount(lengths, minlength=len(expected) + 1)
    assert counts[0] == 0 and len(counts) == len(expected) + 1
    # the span is a prefix of the run: it starts at word 0 and is contiguous
    np.testing.assert_array_equal(got[:, run], np.arange(avail)[None, :] < lengths[:, None])
    exp = np.asarray(expected) * len(lengths)
    chi2 = ((counts[1:] - exp) ** 2 / exp).sum()
    assert chi2 < CHI2_999[len(expected) - 1], (counts, exp)


def test_ngram_of_one_is_whole_word_masking():
    rng = np.random.default_rng(1)
    cand, cont = rng.random((200, 64)) < 0.9, rng.random((200, 64)) < 0.4
    score = rng.integers(0, 2**31 - 1, (200, 64), dtype=np.int32)
    n = rng.integers(0, 15, 200, dtype=np.int32)
    args = [tf.constant(x) for x in (cand, cont, score)]
    got = select_ngrams(*args, tf.constant(rng.random((200, 64), np.float32)), tf.constant(n), max_ngram=1)
    np.testing.assert_array_equal(got, select_whole_words(*args, tf.constant(n)))
    # ... and through mask_example, bit for bit.
    ids, mask, cont = make_batch(100, cont_rate=0.4)
    a, b = run(ids, mask, cfg_(ngram=1), cont=cont), run(ids, mask, cfg_(whole_word=True), cont=cont)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def reference_ngram(ids, mask, cont, seed, cfg):
    """ALBERT's loop (create_masked_lm_predictions, favor_shorter_ngram) in Python with the module's
    documented choices (words and spans stop at special tokens; n drawn among the lengths that fit),
    fed with the module's random draws. → (chosen positions, spans as lists of words) per row."""
    bits = tf.random.stateless_uniform([len(ids), 4, ids.shape[1]], seed=seed, dtype=tf.int32,
                                       minval=None, maxval=None).numpy()
    score = bits[:, 0] & 0x7FFFFFFF
    u = (bits[:, 3] & 0xFFFFFF).astype(np.float32) * np.float32(1 / (1 << 24))
    big_n = cfg.ngram
    harmonic = np.cumsum(1.0 / np.arange(1, big_n + 1))
    result = []
    for b in range(len(ids)):
        words = py_words(ids[b], mask[b], cont[b])
        avail = []
        for j in range(len(words)):
            a = 1
            while a < big_n and j + a < len(words) and words[j + a][0] == words[j + a - 1][-1] + 1:
                a += 1
            avail.append(a)
        budget = py_num_to_predict(int(mask[b].sum()), cfg.masked_lm_prob, cfg.max_predictions_per_seq)
        chosen, spans = [], []
        for j in sorted(range(len(words)), key=lambda j: (-score[b, words[j][0]], j)):
            if len(chosen) >= budget:
                break
            x = float(u[b, words[j][0]]) * harmonic[avail[j] - 1]
            n = min(avail[j], 1 + sum(x >= h for h in harmonic[:-1]))
            tokens = lambda n: [i for w in words[j : j + n] for i in w]  # noqa: B023
            while len(chosen) + len(tokens(n)) > budget and n > 1:  # shorter n-grams until one fits
                n -= 1
            if len(chosen) + len(tokens(n)) > budget or set(tokens(n)) & set(chosen):
                continue
            chosen += tokens(n)
            spans.append(words[j : j + n])
        result.append((sorted(chosen), spans))
    return result


@pytest.mark.parametrize("max_pred, max_ngram", [(20, 3), (5, 3), (20, 4)])
def test_ngram_spans_match_the_original_loop(max_pred, max_ngram):
    ids, mask, cont = make_batch(300, min_len=3, cont_rate=0.4, seed=2)
    cont[:, 1] = True  # a continuation right after [CLS] starts its own word (documented)
    cont &= mask.astype(bool) & ~np.isin(ids, SPECIALS)
    cfg = cfg_(ngram=max_ngram, P=max_pred)
    out = run(ids, mask, cfg, cont=cont)
    ref = reference_ngram(ids, mask, cont, tf.constant([3, 4], tf.int64), cfg)
    longest = 0
    for b, (chosen, spans) in enumerate(ref):
        k = int(out["masked_lm_weights"][b].sum())
        assert list(out["masked_lm_positions"][b, :k]) == chosen
        assert k <= py_num_to_predict(int(mask[b].sum()), 0.15, max_pred) <= max_pred
        sel = np.zeros(L, bool)
        sel[chosen] = True
        inner = cont[b, 1:] & ~np.isin(ids[b, :-1], SPECIALS)  # whole words: a piece goes with its word
        assert (sel[1:][inner] == sel[:-1][inner]).all()
        for span in spans:  # 1..N whole words, one contiguous stretch of tokens
            flat = [i for w in span for i in w]
            assert 1 <= len(span) <= max_ngram and flat == list(range(flat[0], flat[-1] + 1))
            longest = max(longest, len(span))
    assert longest == max_ngram
    # The budget is nearly always spent: shorter n-grams are tried before a word is skipped.
    want = [min(py_num_to_predict(int(m.sum()), 0.15, max_pred), int((m > 0).sum()) - 3) for m in mask]
    assert out["masked_lm_weights"].sum() >= 0.97 * sum(want)


def test_ngram_80_10_10_and_rate():
    ids, mask, cont = make_batch(2000, min_len=32, cont_rate=0.3)
    out = run(ids, mask, cfg_(ngram=3), cont=cont)
    w = out["masked_lm_weights"] > 0
    assert abs(w.sum() / mask.sum() - 0.15) < 0.005
    new = np.take_along_axis(out["input_ids"], out["masked_lm_positions"], 1)[w]
    orig = out["masked_lm_ids"][w]
    frac_mask, frac_same = np.mean(new == MASK), np.mean(new == orig)
    assert abs(frac_mask - 0.8) < 0.015 and abs(frac_same - 0.1) < 0.015
    assert abs(1 - frac_mask - frac_same - 0.1) < 0.015
    assert not np.isin(new[(new != MASK) & (new != orig)], SPECIALS).any()


def test_ngram_deterministic_per_seed_and_same_in_tf_data():
    ids, mask, _ = make_batch(24, cont_rate=0.0)
    table = np.zeros(1000, bool)
    table[600:] = True  # ids >= 600 continue a word
    cfg = cfg_(ngram=3)
    cont = table[ids]
    a, again = run(ids, mask, cfg, seed=(5, 6), cont=cont), run(ids, mask, cfg, seed=(5, 6), cont=cont)
    other = run(ids, mask, cfg, seed=(5, 7), cont=cont)
    for key in a:
        np.testing.assert_array_equal(a[key], again[key], err_msg=key)
    assert (a["masked_lm_positions"] != other["masked_lm_positions"]).any(1).mean() > 0.9
    feats = {"input_ids": ids, "input_mask": mask}
    ds = tf.data.Dataset.from_tensor_slices(feats)
    micro = list(mask_dataset(ds, cfg, seed=7, epoch=1, continuation_table=table, micro_batch=8))
    single = list(mask_dataset(ds, cfg, seed=7, epoch=1, micro_batch=1,
                               continuation_table=lambda x: tf.gather(table, x)))
    for i in range(len(ids)):
        eager = mask_example({"input_ids": ids[i], "input_mask": mask[i]}, example_seed(7, 1, i), cfg, cont[i])
        for k, v in eager.items():
            np.testing.assert_array_equal(v, micro[i][k], err_msg=k)
            np.testing.assert_array_equal(v, single[i][k], err_msg=k)


def test_ngram_errors():
    ids, mask, _ = make_batch(4)
    for bad in (-1, 2.5, True, "3"):
        with pytest.raises(ValueError, match="ngram must be an int >= 0"):
            cfg_(ngram=bad)
    assert not cfg_().word_level and cfg_(ngram=2).word_level
    with pytest.raises(ValueError, match="is_continuation"):
        run(ids, mask, cfg_(ngram=3))
    with pytest.raises(ValueError, match="continuation_table"):
        mask_dataset(tf.data.Dataset.from_tensor_slices({"input_ids": ids, "input_mask": mask}), cfg_(ngram=3),
                     seed=0)
    assert MaskingConfig(10, 3, (0,), ngram=np.int64(2)).ngram == 2
