"""GLUE examples → model features: ``[CLS] a [SEP] (b [SEP])`` token ids (RoBERTa: ``<s> a </s>
(</s> b </s>)``), input mask, segment ids, the label and the example's index, with sentence pairs
truncated as Google BERT's run_classifier.py does (`truncate_seq_pair`, vectorised over all examples)."""

from __future__ import annotations

import numpy as np

from input_pipeline.tasks.base import tokenize_texts


def truncate_seq_pair(len_a: np.ndarray, len_b: np.ndarray, max_length) -> tuple[np.ndarray, np.ndarray]:
    """Google BERT's `_truncate_seq_pair` on lengths, vectorised: while the pair is longer than
    ``max_length``, drop the last token of the longer sequence (of b on a tie)."""
    len_a, len_b = np.asarray(len_a, np.int64), np.asarray(len_b, np.int64)
    max_length = np.broadcast_to(np.asarray(max_length, np.int64), len_a.shape)
    excess = np.maximum(len_a + len_b - max_length, 0)
    long_only = excess <= np.abs(len_a - len_b)  # cutting the longer one alone is enough
    a = np.where(long_only, np.where(len_a > len_b, len_a - excess, len_a), (max_length + 1) // 2)
    b = np.where(long_only, np.where(len_a > len_b, len_b, len_b - excess), max_length // 2)
    return a, b


def featurize_pairs(examples, tokenizer, max_seq_length: int, *, regression: bool) -> dict[str, np.ndarray]:
    """[N, max_seq_length] ``input_ids`` (padded with ``pad_id``), ``input_mask``, ``segment_ids``
    (int32), [N] ``example_index`` (int32) and ``label`` (float32 scores if ``regression``, else int32
    class indices; 0 where an example has no label). ``examples``: objects with ``text_a``,
    ``text_b`` (None for a single sentence) and ``label`` (`glue.GlueExample`).

    The tokenizer's layout: ``cls a sep`` and, for a pair, ``pair_separators`` sep ids between a and b
    (BERT ``[CLS] a [SEP] b [SEP]``; RoBERTa ``<s> a </s></s> b </s>``); b and what follows a's first
    sep get segment ``segment_b`` (BERT 1, RoBERTa 0)."""
    mid, seg_b = tokenizer.pair_separators, tokenizer.segment_b
    if max_seq_length < 2 + mid:
        raise ValueError(f"max_seq_length must be at least {2 + mid}, got {max_seq_length}")
    n, length = len(examples), max_seq_length
    has_b = np.array([e.text_b is not None for e in examples], bool)
    a_flat, a_len = tokenize_texts(tokenizer, [e.text_a for e in examples])
    b_flat, b_len = tokenize_texts(tokenizer, [e.text_b or "" for e in examples])
    b_len = np.where(has_b, b_len, 0)
    ta, tb = truncate_seq_pair(a_len, b_len, length - 2 - mid * has_b)
    ids = np.full((n, length), tokenizer.pad_id, np.int32)
    segments = np.zeros((n, length), np.int32)
    rows = np.arange(n)
    ids[:, 0] = tokenizer.cls_id
    r, j = _positions(ta)
    ids[r, 1 + j] = a_flat[(np.cumsum(a_len) - a_len)[r] + j]
    ids[rows, 1 + ta] = tokenizer.sep_id
    for k in range(1, mid):  # RoBERTa's second </s> before b
        ids[rows[has_b], (1 + ta + k)[has_b]] = tokenizer.sep_id
    r, j = _positions(tb)
    ids[r, 1 + mid + ta[r] + j] = b_flat[(np.cumsum(b_len) - b_len)[r] + j]
    ids[rows[has_b], (1 + mid + ta + tb)[has_b]] = tokenizer.sep_id
    used = 2 + ta + np.where(has_b, tb + mid, 0)
    positions = np.arange(length)[None, :]
    segments[(positions >= (2 + ta)[:, None]) & (positions < used[:, None])] = seg_b
    labels = [0 if e.label is None else e.label for e in examples]
    return {"input_ids": ids, "input_mask": (positions < used[:, None]).astype(np.int32),
            "segment_ids": segments, "example_index": rows.astype(np.int32),
            "label": np.asarray(labels, np.float32 if regression else np.int32).reshape(n)}


def _positions(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For rows with ``counts[i]`` items: (row of each item, its position within the row)."""
    rows = np.repeat(np.arange(len(counts)), counts)
    return rows, np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)
