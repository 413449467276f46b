"""Reading WordPiece vocabulary files (BERT's vocab.txt: one token per line, id = line number - 1),
and what every tokenizer does alike with ids (`tokens_of`, `flags_of`, `BertPairEncoding`).

Strict where Hugging Face's reader is silent: a missing, non-UTF-8, empty file, a blank line or a
duplicate token is a one-line `VocabError` naming the file (and line). The only leniencies are a
leading UTF-8 byte-order mark and CRLF line endings, which are dropped (HF would keep them inside
the first/every token and then match nothing).
"""

from __future__ import annotations

import os

from input_pipeline.files import path_or_url

# Tokens every BERT vocabulary must hold; looked up by name, never assumed to sit at fixed ids.
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


class VocabError(ValueError):
    """A vocabulary file that cannot be used; the message names the file (and line)."""


def load_vocab(path: str | os.PathLike) -> list[str]:
    """The tokens of ``path`` (a local path or a ``gs://`` URL) in id order."""
    path = path_or_url(path)
    if not path.is_file():
        raise VocabError(f"{path}: vocabulary file not found")
    data = path.read_bytes()
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the final newline ends the last line; it does not start a new one
    if not lines:
        raise VocabError(f"{path}: empty vocabulary file")
    tokens: list[str] = []
    first_line: dict[str, int] = {}
    for n, raw in enumerate(lines, 1):
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        try:
            token = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise VocabError(f"{path}:{n}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
        if not token:
            raise VocabError(f"{path}:{n}: blank line (every line must hold one token)")
        if token in first_line:
            raise VocabError(f"{path}:{n}: duplicate token {token!r} (first on line {first_line[token]})")
        first_line[token] = n
        tokens.append(token)
    return tokens


def special_token_ids(vocab: list[str], path: str | os.PathLike) -> dict[str, int]:
    """Ids of `SPECIAL_TOKENS` in ``vocab``; a missing one is a `VocabError` naming it."""
    index = {tok: i for i, tok in enumerate(vocab)}
    missing = [t for t in SPECIAL_TOKENS if t not in index]
    if missing:
        raise VocabError(
            f"{path}: no {', '.join(missing)} token (a BERT vocabulary needs {', '.join(SPECIAL_TOKENS)})"
        )
    return {t: index[t] for t in SPECIAL_TOKENS}


def infer_lower_case(vocab: list[str]) -> bool:
    """True (uncased) if no ordinary token (not ``[...]``) holds an upper-case letter.

    Only letters that lower-casing changes count: the uncased bert-base vocabulary has ``ℝ``
    (DOUBLE-STRUCK CAPITAL R, category Lu) but no lower-case form of it.
    """
    return all(tok.lower() == tok for tok in vocab if not (tok.startswith("[") and tok.endswith("]")))


def tokens_of(ids, vocab: list[str], source: str | os.PathLike) -> list[str]:
    """The strings of ``ids`` (int, list, numpy array, tf tensor or ragged tensor), flattened; an id
    outside ``vocab`` (read from ``source``) is a ValueError naming both. Every tokenizer's
    ``id_to_token``."""
    import numpy as np

    if hasattr(ids, "flat_values"):  # tf.RaggedTensor
        ids = ids.flat_values
    flat = np.asarray(ids.numpy() if hasattr(ids, "numpy") else ids).reshape(-1)
    bad = flat[(flat < 0) | (flat >= len(vocab))]
    if bad.size:
        raise ValueError(f"id {int(bad[0])} outside the vocabulary of {source} ({len(vocab)} tokens)")
    return [vocab[i] for i in flat.tolist()]


def flags_of(table, ids):
    """``table`` (a bool tf tensor [vocab]) at ``ids`` (a tensor or a ragged tensor; the same shape
    back): every tokenizer's ``is_continuation``."""
    import tensorflow as tf

    if isinstance(ids, tf.RaggedTensor):
        return tf.ragged.map_flat_values(lambda flat: tf.gather(table, flat), ids)
    return tf.gather(table, tf.convert_to_tensor(ids))


class BertPairEncoding:
    """``encode`` for the BERT-style tokenizers (WordPiece, SentencePiece): an in-graph ``tokenize``
    and the ``cls_id`` / ``sep_id`` of their vocabulary."""

    def encode(self, text: str, text_b: str | None = None) -> tuple[list[int], list[int]]:
        """Eager: ``[CLS] a [SEP]`` (``b [SEP]``) ids and segment ids (0 for a, 1 for b); no truncation."""
        import tensorflow as tf

        rows = self.tokenize(tf.constant([text] if text_b is None else [text, text_b])).to_list()
        ids = [self.cls_id, *rows[0], self.sep_id]
        segments = [0] * len(ids)
        if text_b is not None:
            ids += [*rows[1], self.sep_id]
            segments += [1] * (len(rows[1]) + 1)
        return ids, segments
