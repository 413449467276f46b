"""BERT masked-LM masking as TF ops (eager, inside `tf.data.Dataset.map`, or while writing shards).

Follows `create_masked_lm_predictions` in Google's `create_pretraining_data.py`:

* candidates are real (``input_mask``) tokens that are not special ids;
* ``num_to_predict = min(P, max(1, round(num_real_tokens * masked_lm_prob)))`` where, as in the
  original, ``num_real_tokens`` counts *all* real tokens including [CLS]/[SEP] (it is 0 when there
  is no candidate at all); ``round`` is Python 3's round-half-to-even on the float64 product;
* candidates (tokens, or whole words) are visited in a random order; a whole word that no longer
  fits into the remaining ``num_to_predict`` (<= P) budget is skipped and the next one is tried,
  so whole-word masking may choose fewer than ``num_to_predict`` tokens, as in the original;
* ``ngram`` N > 0 is ALBERT's n-gram masking (its `create_masked_lm_predictions`): each visited
  word starts a span of n whole words, n drawn with p(n) ∝ 1/n (ALBERT's default,
  favor_shorter_ngram), shortened while it overflows the budget; a span that overlaps one already
  chosen is skipped. N = 1 is whole-word masking (same choice, same numbers);
* every chosen *token* independently becomes [MASK] with ``mask_token_prob`` (0.8), a random id with
  ``random_token_prob`` (0.1), else stays unchanged -- also inside a whole word, where the original
  likewise decides per token index, not per word (one uniform draw against the two thresholds
  instead of the original's two draws: same distribution).

Deliberate deviations from the original (documented so nobody "fixes" them back):

* random replacement ids are drawn uniformly from the vocabulary *excluding* the special ids and
  ``mask_id`` (the original draws from the whole vocab, [CLS]/[PAD]/[MASK] included), or from
  ``MaskingConfig.random_token_ids`` when given;
* whole-word masking never joins a continuation piece to a word across a special token: a
  continuation right after [CLS]/[SEP] (or at position 0) starts its own word (the original appends
  such a piece to the last word of the previous segment);
* an n-gram never crosses a special token either: n is drawn from 1..min(N, words left before
  the next one) (ALBERT draws n in 1..N and cuts the span at the end of the sequence; its spans
  join the last words of segment A with the first of B);
* the shuffle is "random 31-bit score per candidate (or word), sort descending", ties broken by
  position: a uniform random order like `rng.shuffle`, not the same random stream.

All randomness comes from one `tf.random.stateless_uniform` draw per explicit seed of shape [2], so
eager and graph results are identical. No per-token Python, no `tf.py_function`. Which candidates
are chosen (token by token, whole words or n-grams) is `input_pipeline.pretraining.mask_selection`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf

from input_pipeline.pretraining.mask_selection import select_ngrams, select_tokens, select_whole_words

_AUTOTUNE = tf.data.AUTOTUNE
_UNROLL = 64  # per-row random draws unrolled in a graph at most this many at a time
# A bool [vocab_size] continuation flag per id, or a function ids -> bool tensor like ids.
ContinuationTable = Callable[[tf.Tensor], tf.Tensor] | Sequence[bool] | np.ndarray | tf.Tensor


@dataclasses.dataclass(frozen=True)
class MaskingConfig:
    """Masked-LM settings. `special_ids` are never chosen nor used as random replacements."""

    vocab_size: int
    mask_id: int
    special_ids: tuple[int, ...]
    masked_lm_prob: float = 0.15
    max_predictions_per_seq: int = 20
    whole_word: bool = False
    mask_token_prob: float = 0.8
    random_token_prob: float = 0.1
    # Ids a "random" replacement is drawn from (a tuple or a range). None: every id in
    # [0, vocab_size) except `special_ids` and `mask_id`.
    random_token_ids: tuple[int, ...] | range | None = None
    # N > 0: ALBERT's n-gram masking, spans of n <= N whole words with p(n) ∝ 1/n (ALBERT: 3);
    # it masks whole words whatever `whole_word` says. 0: off.
    ngram: int = 0

    def __post_init__(self):
        object.__setattr__(self, "special_ids", tuple(int(i) for i in self.special_ids))
        p_mask, p_rand = self.mask_token_prob, self.random_token_prob
        checks = [
            (self.vocab_size > 0, "vocab_size must be > 0"),
            (0 <= self.mask_id < self.vocab_size, "mask_id must be in [0, vocab_size)"),
            (0.0 <= self.masked_lm_prob <= 1.0, "masked_lm_prob must be in [0, 1]"),
            (self.max_predictions_per_seq > 0, "max_predictions_per_seq must be > 0"),
            (isinstance(self.ngram, int | np.integer) and not isinstance(self.ngram, bool)
             and self.ngram >= 0, "ngram must be an int >= 0 (0: off)"),
            (min(p_mask, p_rand) >= 0 and p_mask + p_rand <= 1.0 + 1e-9,
             "mask_token_prob and random_token_prob must be >= 0 and sum to <= 1"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"MaskingConfig: {msg}; got {self}")
        ids = self.allowed_random_ids()
        if ids.size == 0 or ids.min() < 0 or ids.max() >= self.vocab_size:
            raise ValueError("MaskingConfig.random_token_ids must be non-empty, in [0, vocab_size)")
        if np.isin(ids, self.special_ids).any():
            raise ValueError("MaskingConfig.random_token_ids must not contain special ids")

    @property
    def word_level(self) -> bool:
        """Whether whole words are chosen (whole-word or n-gram masking): needs continuation flags."""
        return self.whole_word or self.ngram > 0

    def allowed_random_ids(self) -> np.ndarray:
        """int32 array of the ids a random replacement is drawn from (uniformly)."""
        if self.random_token_ids is not None:
            return np.asarray(list(self.random_token_ids), dtype=np.int32)
        excluded = np.asarray([*self.special_ids, self.mask_id], dtype=np.int64)
        return np.setdiff1d(np.arange(self.vocab_size), excluded).astype(np.int32)


def num_to_predict(num_real_tokens: tf.Tensor, num_candidates: tf.Tensor,
                   cfg: MaskingConfig) -> tf.Tensor:
    """Google's `min(P, max(1, int(round(len(tokens) * prob))))`, 0 without candidates. int32."""
    product = tf.cast(num_real_tokens, tf.float64) * tf.constant(cfg.masked_lm_prob, tf.float64)
    n = tf.cast(tf.round(product), tf.int32)  # tf.round rounds half to even, like Python 3
    n = tf.minimum(cfg.max_predictions_per_seq, tf.maximum(1, n))
    return tf.where(num_candidates > 0, n, 0)


def example_seed(seed: int | tf.Tensor, epoch: int | tf.Tensor, index) -> tf.Tensor:
    """Per-example seed(s) from (base seed, epoch, example index): what `mask_dataset` uses.

    `index` may be a scalar (-> [2] int64) or a vector (-> [N, 2]). The seed is
    `[key(seed, epoch), index]` with `key` a stateless random int64 of `fold_in([seed, c], epoch)`,
    the same construction as `tf.random.fold_in`, written out so that it vectorises over indices.
    """
    return _example_seeds(_epoch_key(seed, epoch), index)


def _epoch_key(seed, epoch) -> tf.Tensor:
    base = tf.stack([tf.cast(seed, tf.int64), tf.constant(0x6D61736B, tf.int64)])  # "mask"
    epoch_seed = tf.random.experimental.stateless_fold_in(base, tf.cast(epoch, tf.int64))
    return tf.random.stateless_uniform([], epoch_seed, dtype=tf.int64, minval=None, maxval=None)


def _example_seeds(key, index) -> tf.Tensor:
    index = tf.cast(index, tf.int64)
    return tf.stack([tf.broadcast_to(key, tf.shape(index)), index], axis=-1)


def mask_example(features: dict, seed: tf.Tensor, cfg: MaskingConfig,
                 is_continuation: tf.Tensor | None = None) -> dict:
    """Masks one example ([L] tensors, `seed` [2]) or a batch ([B, L] tensors).

    For a batch, `seed` is either [2] (one draw for the whole batch) or [B, 2] (one seed per row:
    row b then equals `mask_example(row b, seed[b])` exactly, whatever B is).
    `features` needs `input_ids` (int, padded) and `input_mask` (bool or int, 1 = real token); every
    other key passes through unchanged. `is_continuation` (bool, same shape as `input_ids`) is
    required when `cfg.word_level` (whole words or n-grams): True for pieces that continue the
    previous token's word (WordPiece `##x`; SentencePiece pieces without a leading `▁`). Returns the features with
    `input_ids` masked (int32) plus `masked_lm_positions` int32 [P] (ascending, unique, 0-padded),
    `masked_lm_ids` int32 [P] (original ids, 0 on padding), `masked_lm_weights` float32 [P]
    (each with a leading [B] for a batch).
    """
    return _mask_features(features, seed, cfg, is_continuation)


def _mask_features(features, seed, cfg, is_continuation, max_rows: int | None = None) -> dict:
    if "input_ids" not in features or "input_mask" not in features:
        raise KeyError(f"mask_example needs 'input_ids' and 'input_mask'; got {sorted(features)}")
    ids = tf.convert_to_tensor(features["input_ids"])
    seed = tf.convert_to_tensor(seed)
    rank = ids.shape.rank
    if rank not in (1, 2):
        raise ValueError(f"input_ids must have shape [L] or [B, L], got {ids.shape}")
    if seed.shape.rank not in (1, rank):
        raise ValueError(f"seed must have shape [2]{' or [B, 2]' if rank == 2 else ''}, "
                         f"got {seed.shape}")
    if cfg.word_level and is_continuation is None:
        raise ValueError("MaskingConfig.whole_word=True or ngram > 0 needs is_continuation")
    squeeze = (lambda t: t[0]) if rank == 1 else (lambda t: t)
    expand = lambda t, dtype: tf.cast(tf.convert_to_tensor(t)[None] if rank == 1 else t, dtype)
    ids, real = expand(ids, tf.int32), expand(features["input_mask"], tf.bool)
    cont = expand(is_continuation, tf.bool) if cfg.word_level else None
    batch, length = tf.shape(ids)[0], tf.shape(ids)[1]
    # One draw per seed: row 0 shuffle scores, row 1 80/10/10 decision, row 2 random-id index,
    # row 3 (n-grams with N > 1 only) each word's n.
    r = 4 if cfg.ngram > 1 else 3
    if seed.shape.rank == 1:
        bits = _draw(tf.stack([batch, r, length]), seed)
    elif (seed.shape[0] or max_rows or _UNROLL + 1) <= _UNROLL:  # unrolled: much cheaper than a loop
        rows = seed.shape[0] or max_rows
        padded = tf.pad(seed, [[0, rows - tf.shape(seed)[0]], [0, 0]])
        bits = tf.stack([_draw([r, length], s) for s in tf.unstack(padded, rows)])[:batch]
    else:  # many or unknown rows: a loop over unrolled chunks (as fast, and the graph stays small)
        bits = _chunked_draws(seed, r, length, ids.shape[1])
    out = _mask_batch(ids, real, cont, bits, cfg)
    result = dict(features)
    result.update({k: squeeze(v) for k, v in out.items()})
    return result


def _chunked_draws(seed, r, length, static_length) -> tf.Tensor:
    """[n, r, length], row i = ``_draw([r, length], seed[i])``: a loop over unrolled chunks (faster to
    trace than one fully unrolled graph, faster to run than a per-row loop: docs/records.md)."""
    n = tf.shape(seed)[0]
    chunks = (n + _UNROLL - 1) // _UNROLL
    padded = tf.reshape(tf.pad(seed, [[0, chunks * _UNROLL - n], [0, 0]]), [chunks, _UNROLL, 2])
    draw = lambda s: tf.stack([_draw([r, length], x) for x in tf.unstack(s, _UNROLL)])
    bits = tf.map_fn(draw, padded, fn_output_signature=tf.TensorSpec([_UNROLL, r, static_length], tf.int32))
    return tf.reshape(bits, [-1, r, length])[:n]


def _draw(shape, seed) -> tf.Tensor:
    return tf.random.stateless_uniform(shape, seed=seed, dtype=tf.int32, minval=None, maxval=None)


def _mask_batch(ids, real, cont, bits, cfg: MaskingConfig) -> dict:
    """ids/real/cont: [B, L]; bits: [B, 3 or 4, L] int32 random bits."""
    length = tf.shape(ids)[1]
    num_slots = cfg.max_predictions_per_seq
    specials = tf.constant(sorted(set(cfg.special_ids)) or [-1], tf.int32)
    is_special = tf.reduce_any(ids[:, :, None] == specials, axis=-1)
    cand = real & ~is_special
    n = num_to_predict(tf.reduce_sum(tf.cast(real, tf.int32), -1),
                       tf.reduce_sum(tf.cast(cand, tf.int32), -1), cfg)  # [B]
    score = tf.bitwise.bitwise_and(bits[:, 0], 0x7FFFFFFF)  # >= 0 (non-candidates get -1 below)
    if cfg.ngram > 0:
        u_n = _uniform(bits[:, 3]) if cfg.ngram > 1 else tf.zeros(tf.shape(score))
        selected = select_ngrams(cand, cont, score, u_n, n, cfg.ngram)
    elif cfg.whole_word:
        selected = select_whole_words(cand, cont, score, n)
    else:
        selected = select_tokens(cand, score, n, num_slots)

    # 80/10/10 per chosen token.
    u = _uniform(bits[:, 1])
    allowed = cfg.allowed_random_ids()
    rand_idx = tf.math.floormod(tf.bitwise.bitwise_and(bits[:, 2], 0x7FFFFFFF), allowed.size)
    random_ids = tf.gather(tf.constant(allowed), rand_idx)
    replaced = tf.where(u < cfg.mask_token_prob, cfg.mask_id,
                        tf.where(u < cfg.mask_token_prob + cfg.random_token_prob, random_ids, ids))
    masked_ids = tf.where(selected, replaced, ids)

    # Sorted positions: top_k of (L - position) over selected tokens is ascending in position.
    pos = tf.range(length)[None, :]
    k = tf.minimum(num_slots, length)
    vals, _ = tf.math.top_k(tf.where(selected, length - pos, 0), k=k)
    valid = vals > 0
    positions = tf.where(valid, length - vals, 0)
    lm_ids = tf.where(valid, tf.gather(ids, positions, batch_dims=1), 0)
    pad = [[0, 0], [0, num_slots - k]]
    batch = tf.shape(ids)[0]
    return {
        "input_ids": masked_ids,
        "masked_lm_positions": tf.reshape(tf.pad(positions, pad), [batch, num_slots]),
        "masked_lm_ids": tf.reshape(tf.pad(lm_ids, pad), [batch, num_slots]),
        "masked_lm_weights": tf.reshape(tf.pad(tf.cast(valid, tf.float32), pad),
                                        [batch, num_slots]),
    }


def _uniform(bits) -> tf.Tensor:
    """Float32 in [0, 1) from the low 24 of int32 random bits, same shape."""
    return tf.cast(tf.bitwise.bitwise_and(bits, 0xFFFFFF), tf.float32) * (1.0 / (1 << 24))


def mask_dataset(ds: tf.data.Dataset, cfg: MaskingConfig, *, seed: int,
                 epoch: int | tf.Tensor = 0,
                 continuation_table: ContinuationTable | None = None,
                 num_parallel_calls: int | None = _AUTOTUNE,
                 micro_batch: int = 64) -> tf.data.Dataset:
    """Masks every element of `ds` (dicts with `input_ids`/`input_mask`), deterministically.

    Element i gets `example_seed(seed, epoch, i)`, so each epoch gets a fresh mask while the same
    (seed, epoch) always reproduces the same one, whatever `num_parallel_calls` or `micro_batch`:
    element i equals `mask_example(element_i, example_seed(seed, epoch, i), cfg)`.
    Single examples ([L]) with fully static shapes are masked `micro_batch` at a time (batch, mask
    with per-row seeds, unbatch; faster than a per-example map, docs/records.md); other single examples
    are mapped one by one. Already-batched elements ([B, L]) get one seed per batch (i = batch
    index), i.e. `mask_example(batch_i, example_seed(seed, epoch, i), cfg)`.

    `continuation_table` (needed when `cfg.word_level`): either a bool array/tensor [vocab_size]
    giving each vocab id's continuation flag (looked up with `tf.gather`), or a callable
    `ids -> bool tensor` of the same shape as `ids` (it must accept [L] and [B, L] ids).
    """
    if cfg.word_level and continuation_table is None:
        raise ValueError("mask_dataset: MaskingConfig.whole_word=True or ngram > 0 needs continuation_table")
    if cfg.word_level and not callable(continuation_table):
        table = tf.constant(np.asarray(continuation_table, dtype=bool))
        if table.shape != (cfg.vocab_size,):
            raise ValueError(f"continuation_table must have shape [{cfg.vocab_size}], "
                             f"got {table.shape}")
        continuation_fn = lambda ids: tf.gather(table, ids)
    else:
        continuation_fn = continuation_table
    spec = ds.element_spec
    if not isinstance(spec, dict) or "input_ids" not in spec or "input_mask" not in spec:
        raise ValueError(f"mask_dataset needs dict elements with 'input_ids' and 'input_mask', "
                         f"got {spec}")
    key = _epoch_key(seed, epoch)

    def fn(index, features):
        seeds = _example_seeds(key, index)  # [2], or [b, 2] for a micro-batch
        cont = continuation_fn(features["input_ids"]) if cfg.word_level else None
        return _mask_features(features, seeds, cfg, cont, max_rows=micro_batch)

    static = all(isinstance(s, tf.TensorSpec) and s.shape.is_fully_defined()
                 for s in spec.values())
    ds = ds.enumerate()
    if micro_batch > 1 and spec["input_ids"].shape.rank == 1 and static:
        ds = ds.batch(micro_batch).map(fn, num_parallel_calls=num_parallel_calls,
                                       deterministic=True)
        return ds.unbatch()
    return ds.map(fn, num_parallel_calls=num_parallel_calls, deterministic=True)
