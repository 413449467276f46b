"""Which tokens masked-LM masking chooses: ``n`` random candidates per row, one by one or as whole
words (Google's greedy loop, vectorised). `input_pipeline.masking` draws the random scores and
decides what each chosen token becomes."""

from __future__ import annotations

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


def select_whole_words(cand, cont, score, n) -> tf.Tensor:
    """Greedy whole-word choice in random word order, skipping words that overflow the budget of
    ``n[b]`` tokens; a [B, L] bool mask. cont: [B, L] bool, True where a piece continues the previous
    token's word (a word never continues across a non-candidate); a word's score is its first token's.

    Vectorised replay of the original loop: in each round, all not-yet-visited words that fit the
    remaining budget are accepted along a cumulative sum until the first one that overflows; that
    word is skipped and the next round restarts after it with the smaller budget. A word skipped
    in round t is longer than any budget after it, so there are at most max-word-length rounds.
    """
    batch, length = tf.shape(cand)[0], tf.shape(cand)[1]
    prev_cand = tf.pad(cand[:, :-1], [[0, 0], [1, 0]])
    start = cand & ~(cont & prev_cand)
    word = tf.cumsum(tf.cast(start, tf.int32), axis=1) - 1  # word index of each token
    offset = tf.range(batch)[:, None] * length
    seg = tf.where(cand, word + offset, batch * length)  # non-candidates -> dump segment
    num_seg = batch * length + 1
    word_len = tf.math.unsorted_segment_sum(tf.cast(cand, tf.int32), seg, num_seg)[:-1]
    word_score = tf.math.unsorted_segment_max(tf.where(start, score, -1), seg, num_seg)[:-1]
    word_len = tf.reshape(word_len, [batch, length])
    word_key = tf.where(word_len > 0, tf.reshape(word_score, [batch, length]), -1)
    _, order = tf.math.top_k(word_key, k=length)  # random word order (empty words last)
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

    init = (tf.zeros_like(cand), tf.zeros([batch], tf.int32), n, tf.constant(True))
    accepted, _, _, _ = tf.while_loop(lambda *s: s[3], body, init)
    # Back from sorted-word order to word index, then to tokens.
    accepted_word = _scatter_rows(order, accepted, length)
    return cand & tf.gather(accepted_word, tf.maximum(word, 0), batch_dims=1)
