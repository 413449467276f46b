"""RoBERTa's byte-level BPE (``vocab.json`` + ``merges.txt``) with `WordPieceTokenizer`'s interface.

The BPE itself is the ``tokenizers`` package's ``ByteLevelBPETokenizer`` set up as Hugging Face's
``RobertaTokenizer`` sets it up (``add_prefix_space=False``, no normalizer, GPT-2's pre-tokenizer
regex; ``<s> <pad> </s> <unk> <mask>`` are added special tokens, so those strings in a text become
their ids, as in HF); tests/input_pipeline/test_bpe_tokenizer.py checks its ids against
``RobertaTokenizer`` on real text (tests/golden/roberta_tokenizer_golden.npz). ``tokenize`` runs the
Rust tokenizer directly when eager and through ``tf.py_function`` inside tf.data / tf.function (so
such a graph cannot be serialized). Bytes that are not valid UTF-8 become U+FFFD first.

Layout (``encode``, `pair_separators`, `segment_b`): ``<s> a </s>`` and ``<s> a </s></s> b </s>``,
segment ids all 0; ``<s>`` is the cls id and ``</s>`` the sep id. Whole-word masking: a piece that
does not start with ``Ġ`` (the byte-level mark of a preceding space) continues the previous word;
special tokens never do. Without a prefix space the first word of a text has no ``Ġ`` either, so in
pre-training data a sentence's first word joins the last word of the sentence before it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import tensorflow as tf
from tokenizers import AddedToken, ByteLevelBPETokenizer

from input_pipeline.tokenizers.vocab import VocabError, flags_of, tokens_of

__all__ = ["MERGES_TXT", "RobertaBPETokenizer", "SPECIAL_TOKENS", "VOCAB_JSON", "WORD_START"]

VOCAB_JSON, MERGES_TXT = "vocab.json", "merges.txt"
WORD_START = "\u0120"  # "Ġ": the byte-level form of a space, so a piece that begins a word
# RoBERTa's special tokens by role; looked up in vocab.json, never assumed to sit at fixed ids.
SPECIAL_TOKENS = {"cls": "<s>", "pad": "<pad>", "sep": "</s>", "unk": "<unk>", "mask": "<mask>"}


class _DuplicateToken(ValueError):
    pass


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    table = dict(pairs)
    if len(table) != len(pairs):
        seen = set()
        raise _DuplicateToken(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return table


def load_bpe_vocab(path: str | os.PathLike) -> list[str]:
    """The tokens of a ``vocab.json`` (``{token: id}``) in id order; ids must be 0..n-1, each once."""
    path = Path(path)
    if not path.is_file():
        raise VocabError(f"{path}: BPE vocabulary file not found")
    try:
        table = json.loads(path.read_bytes().decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except _DuplicateToken as e:
        raise VocabError(f"{path}: token {e.args[0]!r} is listed twice") from None
    except UnicodeDecodeError as e:
        raise VocabError(f"{path}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise VocabError(f"{path}:{e.lineno}: not valid JSON ({e.msg}, column {e.colno})") from None
    if not isinstance(table, dict) or not table:
        raise VocabError(f"{path}: expected a non-empty JSON object {{token: id}}, got {type(table).__name__}")
    tokens: list[str | None] = [None] * len(table)
    for token, i in table.items():
        if type(i) is not int or not 0 <= i < len(table):
            raise VocabError(f"{path}: token {token!r} has id {i!r}; expected ids 0..{len(table) - 1}")
        if tokens[i] is not None:
            raise VocabError(f"{path}: id {i} is given to both {tokens[i]!r} and {token!r}")
        tokens[i] = token
    return tokens  # every slot is filled: len(table) distinct ids in range


def load_merges(path: str | os.PathLike, vocab: set[str]) -> list[tuple[str, str]]:
    """The merges of a ``merges.txt`` in rank order: ``a b`` per line (a ``#version`` line is skipped).

    As the ``tokenizers`` reader: exactly two space-separated tokens a line; a, b and ab must all be
    in the vocabulary.
    """
    path = Path(path)
    if not path.is_file():
        raise VocabError(f"{path}: BPE merges file not found (byte-level BPE needs {MERGES_TXT} "
                         f"beside {VOCAB_JSON})")
    try:
        lines = path.read_bytes().decode("utf-8").split("\n")
    except UnicodeDecodeError as e:
        raise VocabError(f"{path}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
    if lines[-1] == "":
        lines.pop()  # the final newline ends the last line
    merges = []
    for n, line in enumerate(lines, 1):
        if line.startswith("#version"):
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not all(parts):
            raise VocabError(f"{path}:{n}: expected two tokens separated by one space, got {line!r}")
        a, b = parts
        missing = [t for t in (a, b, a + b) if t not in vocab]
        if missing:
            raise VocabError(f"{path}:{n}: merge {line!r} uses {missing[0]!r}, which is not in {VOCAB_JSON}")
        merges.append((a, b))
    return merges


class RobertaBPETokenizer:
    """RoBERTa's byte-level BPE over vocab.json + merges.txt (merges.txt beside vocab.json by default)."""

    lower_case = False
    pair_separators = 2  # </s></s> between a and b
    segment_b = 0  # RoBERTa has one segment type
    # Features that tokenize words one at a time (NER) put this before each word, as Hugging Face
    # does for pre-split words (add_prefix_space=True): every word then starts with "Ġ", as it
    # would after a space in running text.
    word_prefix = " "

    def __init__(self, vocab_file: str | os.PathLike, merges_file: str | os.PathLike | None = None):
        self.vocab_file = os.fspath(vocab_file)
        self.merges_file = os.fspath(merges_file or Path(vocab_file).with_name(MERGES_TXT))
        self.vocab: list[str] = load_bpe_vocab(self.vocab_file)
        self.vocab_size = len(self.vocab)
        index = {t: i for i, t in enumerate(self.vocab)}
        missing = [t for t in SPECIAL_TOKENS.values() if t not in index]
        if missing:
            raise VocabError(f"{self.vocab_file}: no {', '.join(missing)} token (RoBERTa's vocabulary needs "
                             f"{', '.join(SPECIAL_TOKENS.values())})")
        ids = {role: index[t] for role, t in SPECIAL_TOKENS.items()}
        self.cls_id, self.pad_id, self.sep_id = ids["cls"], ids["pad"], ids["sep"]
        self.unk_id, self.mask_id = ids["unk"], ids["mask"]
        self.special_ids = frozenset(ids.values())
        merges = load_merges(self.merges_file, set(index))
        self._bpe = ByteLevelBPETokenizer(index, merges, add_prefix_space=False, trim_offsets=True)
        self._bpe.add_special_tokens(
            [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS.values()])
        if self._bpe.get_vocab_size() != self.vocab_size:  # adding them must not have made new ids
            raise VocabError(f"{self.vocab_file}: the tokenizer has {self._bpe.get_vocab_size()} ids, "
                             f"the file {self.vocab_size}")
        self._continuation = tf.constant(
            [not t.startswith(WORD_START) and i not in self.special_ids for i, t in enumerate(self.vocab)],
            tf.bool)

    def __repr__(self) -> str:
        return f"RobertaBPETokenizer({self.vocab_file!r}, vocab_size={self.vocab_size})"

    def encode_python(self, texts: list[str]) -> list[list[int]]:
        """Ids of each text, without <s>/</s>: the ``tokenizers`` call that ``tokenize`` wraps."""
        return [e.ids for e in self._bpe.encode_batch(list(texts), add_special_tokens=False)]

    def _encode_bytes(self, texts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[batch] bytes -> (flat int32 ids, int64 [batch] lengths)."""
        rows = self.encode_python([t.decode("utf-8", "replace") for t in texts.tolist()])
        lengths = np.fromiter(map(len, rows), np.int64, count=len(rows))
        flat = np.fromiter((i for r in rows for i in r), np.int32, count=int(lengths.sum()))
        return flat, lengths

    def tokenize(self, texts: tf.Tensor) -> tf.RaggedTensor:
        """[batch] tf.string -> int32 [batch, (tokens)] BPE ids, without <s>/</s>.

        Eagerly, and inside tf.data / tf.function (through ``tf.py_function``).
        """
        texts = tf.convert_to_tensor(texts, tf.string)
        if texts.shape.rank not in (1, None):
            raise ValueError(f"tokenize expects a [batch] string tensor, got shape {texts.shape}")
        if tf.executing_eagerly():
            flat, lengths = self._encode_bytes(texts.numpy().reshape(-1))
        else:
            flat, lengths = tf.py_function(lambda t: self._encode_bytes(t.numpy().reshape(-1)),
                                           [texts], [tf.int32, tf.int64])
            flat.set_shape([None])
            lengths.set_shape([None])
        return tf.RaggedTensor.from_row_lengths(flat, lengths, validate=False)

    def is_continuation(self, ids: tf.Tensor) -> tf.Tensor:
        """True where the piece does not start with ``Ġ`` (continues a word); specials are False."""
        return flags_of(self._continuation, ids)

    def encode(self, text: str, text_b: str | None = None) -> tuple[list[int], list[int]]:
        """Eager: ``<s> a </s>`` (``</s> b </s>``) ids and segment ids (all 0); no truncation. In
        general ``cls a sep`` (``sep×(pair_separators - 1) b sep``, b and its sep in ``segment_b``)."""
        rows = self.encode_python([text] if text_b is None else [text, text_b])
        ids = [self.cls_id, *rows[0], self.sep_id, *[self.sep_id] * (self.pair_separators - 1)]
        segments = [0] * len(ids)
        if text_b is None:
            return ids[:len(rows[0]) + 2], segments[:len(rows[0]) + 2]
        return ids + [*rows[1], self.sep_id], segments + [self.segment_b] * (len(rows[1]) + 1)

    def id_to_token(self, ids) -> list[str]:
        """Byte-level pieces for ids (int, list, numpy array, tf tensor or ragged tensor), flattened."""
        return tokens_of(ids, self.vocab, self.vocab_file)
