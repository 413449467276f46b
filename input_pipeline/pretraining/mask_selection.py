"""Which tokens masked-LM masking chooses: ``n`` random candidates per row, one by one, as whole
words (Google's greedy loop, vectorised) or as n-grams of whole words (ALBERT's loop, one word per
step). `input_pipeline.pretraining.masking` draws the random numbers and decides what each chosen token becomes."""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def select_tokens(cand, score, n, num_slots) -> tf.Tensor:
    """The ``n[b]`` (<= ``num_slots``) highest-scoring candidates of each row (a uniform random subset)
    as a [B, L] bool mask. cand: [B, L] bool; score: [B, L] int32 >= 0; n: [B] int32."""
    length = tf.shape(cand)[1]
    _, idx = tf.math.top_k(tf.where(cand, score, -1), k=tf.minimum(num_slots, length))
    rank = tf.range(tf.shape(idx)[1])[None, :]
    keep = (rank < n[:, None]) & tf.gather(cand, idx, batch_dims=1)
    return _scatter_rows(idx, keep, length)


def _scatter_rows(idx, flags, length) -> tf.Tensor:
    """out[b, idx[b, j]] = flags[b, j] for unique idx per row; False elsewhere. [B, length]."""
    rows = tf.broadcast_to(tf.range(tf.shape(idx)[0])[:, None], tf.shape(idx))
    shape = tf.stack([tf.shape(idx)[0], length])
    return tf.scatter_nd(tf.stack([rows, idx], -1), tf.cast(flags, tf.int32), shape) > 0


def _words(cand, cont):
    """Words of each row. Returns start [B, L] bool (a word's first token), word [B, L] int32 (word
    index of each token, -1 before the first candidate), word_len [B, L] int32 (tokens of word w at
    [b, w]; 0 past the row's last word) and seg [B, L], each candidate's word as a segment id of
    ``unsorted_segment_*`` over B * L + 1 segments (non-candidates -> the last, dropped one)."""
    batch, length = tf.shape(cand)[0], tf.shape(cand)[1]
    prev_cand = tf.pad(cand[:, :-1], [[0, 0], [1, 0]])
    start = cand & ~(cont & prev_cand)
    word = tf.cumsum(tf.cast(start, tf.int32), axis=1) - 1
    offset = tf.range(batch)[:, None] * length
    seg = tf.where(cand, word + offset, batch * length)
    word_len = tf.math.unsorted_segment_sum(tf.cast(cand, tf.int32), seg, batch * length + 1)[:-1]
    return start, word, tf.reshape(word_len, [batch, length]), seg


def _word_order(start, word_len, seg, score):
    """Word indices [B, L] in descending score (a word's score is its first token's; ties: lower index
    first; empty word slots last)."""
    batch, length = tf.shape(word_len)[0], tf.shape(word_len)[1]
    first_score = tf.math.unsorted_segment_max(tf.where(start, score, -1), seg, batch * length + 1)[:-1]
    key = tf.where(word_len > 0, tf.reshape(first_score, [batch, length]), -1)
    return tf.math.top_k(key, k=length)[1]


def select_whole_words(cand, cont, score, n) -> tf.Tensor:
    """Greedy whole-word choice in random word order, skipping words that overflow the budget of
    ``n[b]`` tokens; a [B, L] bool mask. cont: [B, L] bool, True where a piece continues the previous
    token's word (a word never continues across a non-candidate); a word's score is its first token's.

    Vectorised replay of the original loop: in each round, all not-yet-visited words that fit the
    remaining budget are accepted along a cumulative sum until the first one that overflows; that
    word is skipped and the next round restarts after it with the smaller budget. A word skipped
    in round t is longer than any budget after it, so there are at most max-word-length rounds.
    """
    length = tf.shape(cand)[1]
    start, word, word_len, seg = _words(cand, cont)
    order = _word_order(start, word_len, seg, score)  # random word order (empty words last)
    sorted_len = tf.gather(word_len, order, batch_dims=1)
    idx = tf.range(length)[None, :]

    def body(accepted, ptr, budget, _):
        elig = (idx >= ptr[:, None]) & (sorted_len > 0) & (sorted_len <= budget[:, None])
        csum = tf.cumsum(tf.where(elig, sorted_len, 0), axis=1)
        acc = elig & (csum <= budget[:, None])
        over = elig & (csum > budget[:, None])
        has_over = tf.reduce_any(over, axis=1)
        first_over = tf.argmax(tf.cast(over, tf.int32), axis=1, output_type=tf.int32)
        budget = budget - tf.reduce_sum(tf.where(acc, sorted_len, 0), axis=1)
        ptr = tf.where(has_over, first_over + 1, length)
        return accepted | acc, ptr, budget, tf.reduce_any(has_over & (budget > 0))

    init = (tf.zeros_like(cand), tf.zeros_like(n), n, tf.constant(True))
    accepted, _, _, _ = tf.while_loop(lambda *s: s[3], body, init)
    # Back from sorted-word order to word index, then to tokens.
    accepted_word = _scatter_rows(order, accepted, length)
    return cand & tf.gather(accepted_word, tf.maximum(word, 0), batch_dims=1)


def ngram_lengths(u, avail, max_ngram: int) -> tf.Tensor:
    """An n in ``1..min(max_ngram, avail)`` with p(n) ∝ 1/n, by inverse CDF: u [...] float in [0, 1),
    avail [...] int32 >= 1 (words available from there). int32 like ``avail``."""
    avail = tf.clip_by_value(avail, 1, max_ngram)
    if max_ngram == 1:
        return avail
    harmonic = np.cumsum(1.0 / np.arange(1, max_ngram + 1))  # H_k = 1 + 1/2 + ... + 1/k, [N]
    x = tf.cast(u, tf.float64) * tf.gather(tf.constant(harmonic), avail - 1)  # u * H_avail
    # n = 1 + #{k < N: H_k <= x}, i.e. the n with H_(n-1) <= x < H_n.
    below = tf.searchsorted(tf.constant(harmonic[None, :-1]), tf.reshape(x, [1, -1]), side="right",
                            out_type=tf.int32)  # [1, size]
    return tf.minimum(1 + tf.reshape(below, tf.shape(avail)), avail)


def select_ngrams(cand, cont, score, u, n, max_ngram: int) -> tf.Tensor:
    """ALBERT's n-gram choice; a [B, L] bool mask. Words (as in `select_whole_words`) are visited in
    descending score of their first token; the visited word w draws a length ``k`` with p(k) ∝ 1/k
    among ``1..min(max_ngram, words in its run)`` (`ngram_lengths` of u at its first token; a run is
    words with no non-candidate between them); ``k`` shrinks until the k words from w fit the
    remaining budget (none fits: skipped); a span overlapping an accepted one is skipped; else its
    tokens are accepted. Stops when every row's budget ``n[b]`` is spent or its words are visited.
    cand/cont: [B, L] bool; score: [B, L] int32 >= 0; u: [B, L] float in [0, 1); n: [B] int32.

    One word per row per step (whether a span overlaps depends on the spans taken before it), so
    the loop runs up to max-words-per-row steps, each O(B * L).
    """
    batch, length = tf.shape(cand)[0], tf.shape(cand)[1]
    start, word, word_len, seg = _words(cand, cont)
    order = _word_order(start, word_len, seg, score)  # [B, L] words in visiting order
    is_word = word_len > 0
    num_words = tf.reduce_sum(tf.cast(is_word, tf.int32), axis=1)  # [B]
    pos = tf.broadcast_to(tf.range(length)[None, :], [batch, length])
    first = tf.reshape(tf.math.unsorted_segment_min(pos, seg, batch * length + 1)[:-1], [batch, length])
    first = tf.where(is_word, first, 0)  # [B, W] first token of each word
    # Runs: word w + 1 joins word w's run when it starts right after w's last token.
    joined = is_word[:, 1:] & (first[:, 1:] == first[:, :-1] + word_len[:, :-1])  # [B, W - 1]
    run_start = is_word & ~tf.pad(joined, [[0, 0], [1, 0]])
    run = tf.cumsum(tf.cast(run_start, tf.int32), axis=1) - 1 + tf.range(batch)[:, None] * length
    run_seg = tf.where(is_word, run, batch * length)
    run_last = tf.math.unsorted_segment_max(pos, run_seg, batch * length + 1)[:-1]  # last word of each run
    avail = tf.where(is_word, tf.gather(run_last, tf.maximum(run, 0)) - pos + 1, 1)  # [B, W]
    drawn = ngram_lengths(tf.gather(u, first, batch_dims=1), avail, max_ngram)  # [B, W]
    tokens_before = tf.pad(tf.cumsum(word_len, axis=1), [[0, 0], [1, 0]])  # [B, W + 1]
    ks = tf.range(1, max_ngram + 1)[None, :]  # [1, N]
    widx = pos

    def body(t, covered, budget):
        w = order[:, t]  # [B] the word each row visits now
        end = tf.minimum(w[:, None] + ks, length)  # [B, N] (k words from w: words w .. end - 1)
        lens = (tf.gather(tokens_before, end, batch_dims=1)
                - tf.gather(tokens_before, w[:, None], batch_dims=1))  # [B, N] tokens of k words
        fits = (ks <= tf.gather(drawn, w, batch_dims=1)[:, None]) & (lens <= budget[:, None])
        k = tf.reduce_sum(tf.cast(fits, tf.int32), axis=1)  # [B] the longest that fits (lens grow)
        in_span = (widx >= w[:, None]) & (widx < (w + k)[:, None])  # [B, W]
        take = (t < num_words) & (k > 0) & ~tf.reduce_any(covered & in_span, axis=1)
        covered = covered | (in_span & take[:, None])
        spent = tf.gather(lens, tf.maximum(k - 1, 0), batch_dims=1)
        return t + 1, covered, budget - tf.where(take, spent, 0)

    def cond(t, _, budget):
        return tf.reduce_any((t < num_words) & (budget > 0))

    init = (tf.constant(0), tf.zeros_like(cand), n)
    _, covered, _ = tf.while_loop(cond, body, init)
    return cand & tf.gather(covered, tf.maximum(word, 0), batch_dims=1)
