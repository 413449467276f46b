"""BERT's WordPiece tokenizer as TensorFlow ops: runs eagerly and inside tf.data / tf.function.

It gives exactly the ids of Hugging Face's Python BERT tokenizer (``BasicTokenizer`` +
``WordpieceTokenizer``; in transformers 5 that is ``BertTokenizerLegacy``), checked in
tests/input_pipeline/test_tokenizers.py against ids from transformers for 10.6k sentences of real prose and
Unicode edge cases (tests/golden/tokenizer_golden.npz). The steps, in HF's order:

1. clean: delete U+0000, U+FFFD and every ``\\p{C}`` character except tab/newline/CR (invalid
   UTF-8 is first replaced by U+FFFD, so it is deleted too); whitespace (``\\t\\n\\r``, ``\\p{Z}``)
   becomes a space;
2. put spaces around CJK ideographs (HF's code-point ranges);
3. NFC;
4. uncased vocabularies only: lower-case as Python's ``str.lower`` does, NFD, delete ``\\p{Mn}``;
5. split on spaces and around punctuation (ASCII 33-47, 58-64, 91-96, 123-126 and ``\\p{P}``);
6. a word longer than 100 characters becomes [UNK]; the rest go through greedy longest-match-first
   WordPiece with ``##`` continuations; a word that cannot be matched becomes [UNK].

tensorflow_text's own ``BasicTokenizer`` differs from HF in several details (control characters
become spaces, ICU case folding, a byte-length limit), so the steps are composed here from regex and
normalisation ops. The character classes are built from this Python's ``unicodedata`` (the tables HF
uses), not RE2's, whose Unicode version differs. ``tf.strings.lower`` (ICU) does Python's context-
dependent final sigma and ``İ``; the few letters whose case mapping TF's ICU is too old to know are
patched to Python's mapping. Literal special tokens in the text ("[SEP]") are not treated specially
(as in Google's original BERT); HF's ``PreTrainedTokenizer`` would map them to their ids.
"""

from __future__ import annotations

import functools
import itertools
import os
import unicodedata

import tensorflow as tf
import tensorflow_text as tf_text

from input_pipeline.tokenizers.vocab import (
    BertPairEncoding,
    VocabError,
    flags_of,
    infer_lower_case,
    special_token_ids,
    tokens_of,
)
from input_pipeline.tokenizers.vocab import load_vocab as load_vocab

__all__ = ["VocabError", "WordPieceTokenizer", "load_vocab"]

MAX_CHARS_PER_WORD = 100  # HF's WordpieceTokenizer.max_input_chars_per_word
SUFFIX = "##"
# HF BasicTokenizer._is_chinese_char.
CJK_RANGES = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)
ASCII_PUNCT = ((33, 47), (58, 64), (91, 96), (123, 126))  # HF treats these as punctuation too


def _re2_class(ranges) -> str:
    """An RE2 character class matching the code-point ranges [(first, last), ...]."""
    parts = (f"\\x{{{a:X}}}" if a == b else f"\\x{{{a:X}}}-\\x{{{b:X}}}" for a, b in ranges)
    return "[" + "".join(parts) + "]"


@functools.cache
def _unicode_classes() -> dict[str, str]:
    """RE2 classes from Python's unicodedata: what HF's _is_control/_is_whitespace/... test.

    Keys: ``drop`` (U+0000, U+FFFD, category C except \\t\\n\\r), ``space`` (\\t\\n\\r and Z*, which
    str.split() treats as whitespace), ``punct`` and ``mn``. Surrogates are left out (never in UTF-8).
    """
    cats = map(unicodedata.category, map(chr, range(0x110000)))
    runs: dict[str, list[tuple[int, int]]] = {"drop": [], "space": [], "punct": [], "mn": []}
    start = 0
    for cat, group in itertools.groupby(cats):
        end = start + sum(1 for _ in group)
        lo, hi = start, end - 1
        start = end
        if cat == "Cs":
            continue
        key = {"C": "drop", "Z": "space", "P": "punct"}.get(cat[0])
        if key:
            runs[key].append((lo, hi))
        if cat == "Mn":
            runs["mn"].append((lo, hi))
    drop = runs["drop"] + [(0xFFFD, 0xFFFD)]
    # The space itself is left out of `space`: replacing it by itself would only cost time.
    space = [p for lo, hi in runs["space"] for p in _minus(lo, hi, {32})] + [(9, 10), (13, 13)]
    # \t \n \r are category Cc but count as whitespace: take them out of `drop`.
    drop = [piece for lo, hi in drop for piece in _minus(lo, hi, {9, 10, 13})]
    punct = runs["punct"] + list(ASCII_PUNCT)
    return {k: _re2_class(sorted(v)) for k, v in
            {"drop": drop, "space": space, "punct": punct, "mn": runs["mn"]}.items()}


def _minus(lo: int, hi: int, holes: set[int]):
    """The range [lo, hi] without the code points in ``holes``, as ranges."""
    cur = lo
    for h in sorted(x for x in holes if lo <= x <= hi):
        if cur <= h - 1:
            yield (cur, h - 1)
        cur = h + 1
    if cur <= hi:
        yield (cur, hi)


@functools.cache
def _lowercase_patch() -> dict[int, int]:
    """Code points that ``tf.strings.lower`` (TF's ICU) lower-cases differently from ``str.lower``.

    With Python 3.11 these are the ~40 letters whose case pairs came in Unicode 14 (TF's ICU is
    older). Every such ``str.lower`` mapping is one code point to one (only U+0130 maps to two, and
    ICU agrees on it).
    """
    candidates = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF and chr(c).lower() != chr(c)]
    with tf.init_scope():
        lowered = tf.strings.lower([chr(c).encode() for c in candidates], encoding="utf-8").numpy()
    return {c: ord(chr(c).lower()) for c, got in zip(candidates, lowered, strict=True)
            if got.decode("utf-8") != chr(c).lower() and len(chr(c).lower()) == 1}


class WordPieceTokenizer(BertPairEncoding):
    """BERT WordPiece tokenizer over a vocab.txt; ``tokenize`` is pure TF (graph-safe)."""

    pair_separators = 1  # a pair is [CLS] a [SEP] b [SEP]: one [SEP] between a and b
    segment_b = 1  # segment id of b and its [SEP]

    def __init__(self, vocab_file: str | os.PathLike, *, lower_case: bool | None = None):
        self.vocab_file = os.fspath(vocab_file)
        self.vocab: list[str] = load_vocab(vocab_file)
        self.vocab_size = len(self.vocab)
        ids = special_token_ids(self.vocab, self.vocab_file)
        self.pad_id, self.unk_id = ids["[PAD]"], ids["[UNK]"]
        self.cls_id, self.sep_id, self.mask_id = ids["[CLS]"], ids["[SEP]"], ids["[MASK]"]
        self.special_ids = frozenset(ids.values())
        self.lower_case = infer_lower_case(self.vocab) if lower_case is None else bool(lower_case)
        self._classes = _unicode_classes()
        self._cjk = f"({_re2_class(CJK_RANGES)})"
        self._punct = f"({self._classes['punct']})"
        self._wordpiece = tf_text.FastWordpieceTokenizer(
            vocab=self.vocab, suffix_indicator=SUFFIX, unknown_token="[UNK]",
            max_bytes_per_word=4 * MAX_CHARS_PER_WORD + 1, token_out_type=tf.int32,
            no_pretokenization=True,
        )
        # A partial, not the bound method: tf.function counts traces per function's code, so every
        # tokenizer's one trace would add up to TensorFlow's "retracing" warning; a partial counts alone.
        self._tokenize_graph = tf.function(
            functools.partial(WordPieceTokenizer._tokenize, self), input_signature=[tf.TensorSpec([None], tf.string)],
            autograph=False)
        self._continuation = tf.constant([t.startswith(SUFFIX) for t in self.vocab], tf.bool)
        self._lower_table = self._lower_fix = None
        patch = _lowercase_patch() if self.lower_case else {}
        if patch:
            keys = tf.constant(list(patch), tf.int32)
            values = tf.constant(list(patch.values()), tf.int32)
            self._lower_table = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(keys, values), default_value=-1)
            self._lower_fix = f"(?s).*{_re2_class((c, c) for c in sorted(patch))}.*"

    def __repr__(self) -> str:
        return (f"WordPieceTokenizer({self.vocab_file!r}, vocab_size={self.vocab_size}, "
                f"lower_case={self.lower_case})")

    def _lower(self, text: tf.Tensor) -> tf.Tensor:
        """``str.lower``: ICU's lower-casing, then Python's mapping for the letters ICU lacks."""
        text = tf.strings.lower(text, encoding="utf-8")
        if self._lower_table is None:
            return text

        @tf.autograph.experimental.do_not_convert  # plain ops; tf.data's autograph need not convert it
        def patch():
            cps = tf.strings.unicode_decode(text, "UTF-8")
            fixed = self._lower_table.lookup(cps.flat_values)
            flat = tf.where(fixed >= 0, fixed, cps.flat_values)
            return tf.strings.unicode_encode(cps.with_flat_values(flat), "UTF-8")

        # Those letters are rare: decode/re-encode only a batch that holds one.
        needed = tf.reduce_any(tf.strings.regex_full_match(text, self._lower_fix))
        return tf.cond(needed, patch, lambda: text)

    def normalize(self, texts: tf.Tensor) -> tf.Tensor:
        """Steps 1-4: HF BasicTokenizer's text clean-up, CJK spacing, NFC, lower-casing/accents."""
        t = tf.strings.unicode_transcode(texts, "UTF-8", "UTF-8", errors="replace",
                                         replacement_char=0xFFFD)
        t = tf.strings.regex_replace(t, self._classes["drop"], "")
        t = tf.strings.regex_replace(t, self._classes["space"], " ")
        t = tf.strings.regex_replace(t, self._cjk, r" \1 ")
        t = tf_text.normalize_utf8(t, "NFC")
        if self.lower_case:
            t = tf_text.normalize_utf8(self._lower(t), "NFD")
            t = tf.strings.regex_replace(t, self._classes["mn"], "")
        return t

    def words(self, texts: tf.Tensor) -> tf.RaggedTensor:
        """[batch] strings -> [batch, (words)]: HF BasicTokenizer's output (step 5)."""
        # Spaces around punctuation, then split on spaces (the only whitespace left). Static regex
        # ops compile once; tf_text.regex_split would compile its pattern on every call.
        spaced = tf.strings.regex_replace(self.normalize(texts), self._punct, r" \1 ")
        return tf.strings.split(spaced)

    def tokenize(self, texts: tf.Tensor) -> tf.RaggedTensor:
        """[batch] tf.string -> int32 [batch, (tokens)] WordPiece ids, without [CLS]/[SEP].

        Eagerly, and inside tf.data / tf.function; one traced graph serves every batch size.
        """
        texts = tf.convert_to_tensor(texts, tf.string)
        if texts.shape.rank not in (1, None):
            raise ValueError(f"tokenize expects a [batch] string tensor, got shape {texts.shape}")
        return self._tokenize_graph(texts)

    def _tokenize(self, texts: tf.Tensor) -> tf.RaggedTensor:
        words = self.words(texts)
        too_long = tf.strings.length(words.flat_values, unit="UTF8_CHAR") > MAX_CHARS_PER_WORD
        flat = tf.where(too_long, tf.constant("[UNK]"), words.flat_values)
        pieces = self._wordpiece.tokenize(flat)  # [words, (pieces)]
        return words.with_flat_values(pieces).merge_dims(1, 2)

    def is_continuation(self, ids: tf.Tensor) -> tf.Tensor:
        """True where the id is a ``##`` piece (continues the previous word); same shape as ids."""
        return flags_of(self._continuation, ids)

    def id_to_token(self, ids) -> list[str]:
        """Tokens for ids (int, list, numpy array, tf tensor or ragged tensor), flattened."""
        return tokens_of(ids, self.vocab, self.vocab_file)
