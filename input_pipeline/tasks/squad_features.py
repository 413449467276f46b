"""SQuAD examples → fixed-length features: run_squad.py's convert_examples_to_features, batched.

Each whitespace word of a context is WordPiece-tokenized on its own (as run_squad does), but every
distinct word of the whole split goes through the in-graph tokenizer in a few big batches, and a
paragraph's tokens are built once for all its questions. The question is cut to
``max_query_length`` tokens; the document is cut into windows of ``max_seq_length - len(query) - 3``
tokens starting every ``doc_stride`` tokens, each ``[CLS] query [SEP] window [SEP]`` (segment 1 from
the window on). A window token is "max context" in the window where it has the most context on
its shorter side (+0.01 × window length; ties: the first window). The answer's token span is
refined to the tokenized answer text (_improve_answer_span); start/end positions are 0 ([CLS]) when
the window does not hold the whole answer or the question is impossible or has no located answer.
Deviation: a context that tokenizes to nothing still gets one window (an empty document), so that
every example has a feature; run_squad would make none.

Feature arrays (N rows, one per window): ``input_ids``, ``input_mask``, ``segment_ids`` [N, L],
``example_index``, ``start_positions``, ``end_positions`` [N], and for post-processing
``token_to_orig`` [N, L] (index of the context word a window token came from; -1 for [CLS], query,
[SEP] and padding) and ``token_is_max_context`` [N, L] (1 where the window is that token's best).
All int32.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

_BATCH = 20_000  # strings per tokenizer call


def _tokenize_many(tokenizer, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(flat int32 ids, row_splits) for ``texts``: row i is ``flat[splits[i]:splits[i+1]]``."""
    flats, lengths = [], []
    for i in range(0, len(texts), _BATCH):
        ragged = tokenizer.tokenize(tf.constant(texts[i:i + _BATCH]))
        flats.append(ragged.flat_values.numpy().astype(np.int32))
        lengths.append(ragged.row_lengths().numpy())
    splits = np.zeros(len(texts) + 1, np.int64)
    if texts:
        np.cumsum(np.concatenate(lengths), out=splits[1:])
    return (np.concatenate(flats) if flats else np.zeros(0, np.int32)), splits


def _rows(flat: np.ndarray, splits: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The concatenation of the given rows and, for each of its elements, its position in ``rows``."""
    lengths = splits[rows + 1] - splits[rows]
    owner = np.repeat(np.arange(len(rows)), lengths)
    starts = np.repeat(splits[rows] - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return flat[starts + np.arange(lengths.sum())], owner


def _improve_answer_span(doc_ids: np.ndarray, start: int, end: int, answer_ids: np.ndarray) -> tuple[int, int]:
    """The tightest sub-span of [start, end] whose tokens equal the tokenized answer text."""
    target = answer_ids.tolist()
    for new_start in range(start, end + 1):
        for new_end in range(end, new_start - 1, -1):
            if new_end - new_start + 1 == len(target) and doc_ids[new_start:new_end + 1].tolist() == target:
                return new_start, new_end
    return start, end


def doc_spans(num_tokens: int, max_tokens: int, doc_stride: int) -> list[tuple[int, int]]:
    """run_squad's sliding windows as (start, length)."""
    spans, start = [], 0
    while start < num_tokens:
        length = min(num_tokens - start, max_tokens)
        spans.append((start, length))
        if start + length == num_tokens:
            break
        start += min(length, doc_stride)
    return spans or [(0, 0)]  # an empty document still gets one window (run_squad would make none)


def max_context(spans: list[tuple[int, int]], num_tokens: int) -> np.ndarray:
    """[num_tokens]: the index of the window where each document token has its maximum context."""
    pos = np.arange(num_tokens)
    scores = np.full((len(spans), num_tokens), -np.inf)
    for i, (start, length) in enumerate(spans):
        inside = (pos >= start) & (pos <= start + length - 1)
        score = np.minimum(pos - start, start + length - 1 - pos) + 0.01 * length
        scores[i] = np.where(inside, score, -np.inf)
    return scores.argmax(axis=0)  # first maximum, as run_squad's strict ">"


def convert_examples_to_features(examples: list, tokenizer, max_seq_length: int, *, doc_stride: int,
                                 max_query_length: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(feature arrays, what post-processing needs of the tokenizer: vocab, lower_case, pieces).

    The tokenizer's layout: ``cls q sep×pair_separators context sep``, the context in segment
    ``segment_b`` (BERT: [CLS] q [SEP] c [SEP], segment 1; RoBERTa: <s> q </s></s> c </s>, segment 0).
    Context words (and answers) are tokenized one at a time, after the tokenizer's ``word_prefix``
    (RoBERTa's byte-level BPE: a space, so a word's pieces are those it has in running text)."""
    if max_seq_length < max_query_length + 4:
        raise ValueError(f"max_seq_length {max_seq_length} leaves no room for the document after a "
                         f"{max_query_length}-token question ([CLS] and two [SEP] take 3 more)")
    prefix, separators = getattr(tokenizer, "word_prefix", ""), tokenizer.pair_separators
    word_index: dict[str, int] = {}
    paragraphs: dict[int, list[str]] = {}
    for ex in examples:
        if id(ex.doc_tokens) not in paragraphs:
            paragraphs[id(ex.doc_tokens)] = ex.doc_tokens
            for w in ex.doc_tokens:
                word_index.setdefault(w, len(word_index))
    word_flat, word_splits = _tokenize_many(tokenizer, [prefix + w for w in word_index])
    q_flat, q_splits = _tokenize_many(tokenizer, [ex.question_text for ex in examples])
    answered = [i for i, ex in enumerate(examples) if ex.start_position >= 0 and not ex.is_impossible]
    a_flat, a_splits = _tokenize_many(tokenizer, [prefix + examples[i].orig_answer_text for i in answered])
    answer_row = {ex_i: row for row, ex_i in enumerate(answered)}

    docs: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # ids, tok→orig, orig→tok
    for key, words in paragraphs.items():
        ids, tok_to_orig = _rows(word_flat, word_splits, np.array([word_index[w] for w in words], np.int64))
        orig_to_tok = np.searchsorted(tok_to_orig, np.arange(len(words) + 1))
        docs[key] = ids, tok_to_orig.astype(np.int32), orig_to_tok

    plans = []  # (example index, query ids, doc key, spans, token start, token end)
    for i, ex in enumerate(examples):
        query = q_flat[q_splits[i]:q_splits[i + 1]][:max_query_length]
        ids, _, orig_to_tok = docs[id(ex.doc_tokens)]
        tok_start = tok_end = -1
        if i in answer_row:
            tok_start = int(orig_to_tok[ex.start_position])
            tok_end = int(orig_to_tok[ex.end_position + 1]) - 1
            r = answer_row[i]
            tok_start, tok_end = _improve_answer_span(ids, tok_start, tok_end, a_flat[a_splits[r]:a_splits[r + 1]])
        spans = doc_spans(len(ids), max_seq_length - len(query) - 2 - separators, doc_stride)
        plans.append((i, query, id(ex.doc_tokens), spans, tok_start, tok_end))

    n = sum(len(p[3]) for p in plans)
    shape = (n, max_seq_length)
    out = {"input_ids": np.full(shape, tokenizer.pad_id, np.int32), "input_mask": np.zeros(shape, np.int32),
           "segment_ids": np.zeros(shape, np.int32), "token_to_orig": np.full(shape, -1, np.int32),
           "token_is_max_context": np.zeros(shape, np.int32), "example_index": np.zeros(n, np.int32),
           "start_positions": np.zeros(n, np.int32), "end_positions": np.zeros(n, np.int32)}
    row = 0
    for i, query, key, spans, tok_start, tok_end in plans:
        ids, tok_to_orig, _ = docs[key]
        best = max_context(spans, len(ids))
        offset = len(query) + 1 + separators
        for s, (start, length) in enumerate(spans):
            total = offset + length + 1
            out["input_ids"][row, :total] = np.concatenate(
                [[tokenizer.cls_id], query, [tokenizer.sep_id] * separators, ids[start:start + length],
                 [tokenizer.sep_id]])
            out["input_mask"][row, :total] = 1
            out["segment_ids"][row, offset:total] = tokenizer.segment_b
            out["token_to_orig"][row, offset:offset + length] = tok_to_orig[start:start + length]
            out["token_is_max_context"][row, offset:offset + length] = best[start:start + length] == s
            out["example_index"][row] = i
            if tok_start >= 0 and start <= tok_start and tok_end <= start + length - 1:
                out["start_positions"][row] = tok_start - start + offset
                out["end_positions"][row] = tok_end - start + offset
            row += 1
    from input_pipeline.tokenizers.bpe import RobertaBPETokenizer
    from input_pipeline.tokenizers.sentencepiece_model import SentencePieceTokenizer

    pieces = ("sentencepiece" if isinstance(tokenizer, SentencePieceTokenizer) else
              "byte_level" if isinstance(tokenizer, RobertaBPETokenizer) else "wordpiece")
    info = {"vocab": list(tokenizer.vocab), "lower_case": bool(tokenizer.lower_case), "pieces": pieces}
    return out, info
