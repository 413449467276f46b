"""Learning a WordPiece vocabulary from sentences (what ``build_vocab --model_type wordpiece`` runs).

Words are split exactly as `WordPieceTokenizer` splits them (its own normalisation; lower-cased
and accent-stripped with ``lower_case``), counted, and given to tensorflow-text's WordPiece learner
(``tensorflow_text.tools.wordpiece_vocab``, the algorithm behind ``bert_vocab_from_dataset``). That
wrapper is not called as is: it would split words with tf.text's ``BasicTokenizer``, whose
normalisation (ICU case folding, control characters, ...) differs from the tokenizer's, and its
frequency-threshold search is a plain bisection that costs ~15 learner passes (over 2 minutes for
the 0.4M-word Wikipedia excerpt at 8k tokens). Here a log-log secant search over the same
``learn_with_thresh`` reaches the size in a few passes. The alphabet is capped at a quarter of the
vocabulary (at most 1000 characters, the learner's default); rarer characters become [UNK].
"""

from __future__ import annotations

import collections
import math
import tempfile
from collections.abc import Iterable
from pathlib import Path

from tqdm import tqdm

from input_pipeline.tokenizers.vocab import SPECIAL_TOKENS


def count_words(sentences: Iterable[str], lower_case: bool) -> dict[str, int]:
    """Word → count over ``sentences`` (iterated once), split as `WordPieceTokenizer` splits."""
    import tensorflow as tf

    from input_pipeline.tokenizers.wordpiece import WordPieceTokenizer

    # The tokenizer's own word splitter; its vocabulary (the specials) plays no part in it.
    with tempfile.TemporaryDirectory() as tmp:
        specials = Path(tmp) / "vocab.txt"
        specials.write_text("".join(t + "\n" for t in SPECIAL_TOKENS))
        splitter = WordPieceTokenizer(specials, lower_case=lower_case)
    words = (tf.data.Dataset.from_generator(lambda: iter(sentences), output_signature=tf.TensorSpec([], tf.string))
             .batch(1024).map(splitter.words).prefetch(2))
    word_counts = collections.Counter()
    for batch in words:
        word_counts.update(batch.flat_values.numpy())
    return {w.decode("utf-8"): c for w, c in word_counts.items()}


def learn(word_counts: dict[str, int], vocab_size: int) -> list[str]:
    """The learner's ``learn`` with a faster threshold search: the vocabulary (specials first) of
    the smallest count threshold that fits in ``vocab_size`` (stopping early within the learner's
    5% slack)."""
    from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib as learner

    reserved = list(SPECIAL_TOKENS)
    max_chars = max(1, min(1000, (vocab_size - len(reserved)) // 4))
    params = learner.Params(upper_thresh=None, lower_thresh=None, num_iterations=4,
                            max_input_tokens=int(5e6), max_token_length=50,
                            max_unique_chars=max_chars, vocab_size=vocab_size, slack_ratio=0.05,
                            include_joiner_token=True, joiner="##", reserved_tokens=reserved)
    words = learner.get_input_words(word_counts.items(), reserved, params.max_token_length)
    words = learner.filter_input_words(words, learner.get_allowed_chars(words, max_chars),
                                       params.max_input_tokens)
    if not words:
        raise ValueError(f"no words to learn from: every word is longer than "
                         f"{params.max_token_length} characters or holds a character outside the "
                         f"{max_chars} most frequent (the alphabet vocab_size {vocab_size} allows)")
    counts = sorted((c for _, c in words), reverse=True)
    max_count = counts[0]
    # First guess: between the counts of the words ranked vocab_size/2 and vocab_size.
    guess = math.sqrt(counts[min(vocab_size // 2, len(counts) - 1)] *
                      counts[min(vocab_size, len(counts) - 1)])
    tried: dict[int, list[str]] = {}
    lo, hi = 0, None  # thresholds known to give more than / at most vocab_size tokens
    target = vocab_size * (1 - params.slack_ratio / 2)
    bar = tqdm(desc="learning wordpieces", unit=" pass", mininterval=0)
    while True:
        t = max(lo + 1, round(guess))
        if hi is not None:
            t = min(t, hi - 1)
        tried[t] = learner.learn_with_thresh(words, t, params)
        size = len(tried[t])
        bar.set_postfix(threshold=t, tokens=size)
        bar.update()
        if size <= vocab_size:
            hi = t
            if size >= vocab_size * (1 - params.slack_ratio):
                break
        else:
            lo = t
            if t > max_count:
                raise ValueError(f"vocab_size {vocab_size} is too small: the alphabet alone takes "
                                 f"{size} tokens")
        if hi is not None and hi - lo <= 1:
            break
        guess = _next_threshold(tried, lo, hi, target)
    bar.close()
    return tried[hi]


def _next_threshold(tried: dict[int, list[str]], lo: int, hi: int | None, target: float) -> float:
    """Secant step on log(size) against log(threshold) through the bracket's ends (or, before
    there is a bracket, the last two tries), kept strictly inside the bracket."""
    ends = [t for t in (lo, hi) if t in tried] if hi is not None and lo in tried else list(tried)[-2:]
    if len(ends) == 2 and ends[0] != ends[1]:
        (t1, t2), (s1, s2) = ends, (len(tried[ends[0]]), len(tried[ends[1]]))
        slope = (math.log(s2) - math.log(s1)) / (math.log(t2) - math.log(t1))
    else:
        t2, s2, slope = ends[-1], len(tried[ends[-1]]), -0.7  # typical for word-count power laws
    slope = min(slope, -0.1)
    guess = t2 * (target / s2) ** (1 / slope)
    if hi is not None and not lo + 1 < guess < hi - 1:  # outside: bisect (geometrically)
        guess = math.sqrt(max(lo, 1) * hi)
    return guess
