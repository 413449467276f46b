"""NER examples → model features, as the BERT paper tags CoNLL-2003.

Each word is tokenized alone (so pieces never cross words), ``[CLS] pieces [SEP]``; a word that
tokenizes to nothing (a control character) becomes ``[UNK]`` so every word is predicted. The label
sits on the first sub-token of each word (``label_mask`` 1 there; 0 on continuation pieces,
[CLS]/[SEP] and padding), and ``word_index`` [N, L] int32 holds the word's index in its sentence
there (-1 elsewhere). A sentence of more than ``max_seq_length - 2`` pieces is split at word
boundaries into several rows with the same ``example_index`` (each row is then predicted without the
other rows' context; a single word longer than the budget keeps its first pieces).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

_TOKENIZE_BATCH = 16384  # words per tokenizer call


def featurize_words(examples, tokenizer, max_seq_length: int, label_names) -> dict[str, np.ndarray]:
    """[N, max_seq_length] ``input_ids``, ``input_mask``, ``segment_ids``, ``label_ids``, ``label_mask``,
    ``word_index`` and [N] ``example_index`` (int32), N >= len(examples) rows. ``examples``: objects
    with ``words`` and ``tags`` (`ner.NerExample`); a tag's label id is its index in ``label_names``."""
    budget = max_seq_length - 2
    if budget < 1:
        raise ValueError(f"max_seq_length must be >= 3 for [CLS] word [SEP], got {max_seq_length}")
    prefix = getattr(tokenizer, "word_prefix", "")  # byte-level BPE: " word", as after a space in text
    pieces = _word_pieces([prefix + w for ex in examples for w in ex.words], tokenizer)
    rows, w = [], 0  # rows: (example index, [(word index, piece ids), ...])
    for e, ex in enumerate(examples):
        chunk, used = [], 0
        for j in range(len(ex.words)):
            ids = pieces[w + j][:budget]
            if chunk and used + len(ids) > budget:
                rows.append((e, chunk))
                chunk, used = [], 0
            chunk.append((j, ids))
            used += len(ids)
        w += len(ex.words)
        if chunk:
            rows.append((e, chunk))
    n, length = len(rows), max_seq_length
    label_of = {t: i for i, t in enumerate(label_names)}
    input_ids = np.full((n, length), tokenizer.pad_id, np.int32)
    input_mask = np.zeros((n, length), np.int32)
    label_ids = np.zeros((n, length), np.int32)
    word_index = np.full((n, length), -1, np.int32)
    for r, (e, chunk) in enumerate(rows):
        input_ids[r, 0] = tokenizer.cls_id
        pos, tags = 1, examples[e].tags
        for j, ids in chunk:
            input_ids[r, pos:pos + len(ids)] = ids
            word_index[r, pos] = j
            label_ids[r, pos] = label_of[tags[j]]
            pos += len(ids)
        input_ids[r, pos] = tokenizer.sep_id
        input_mask[r, :pos + 1] = 1
    return {
        "input_ids": input_ids, "input_mask": input_mask,
        "segment_ids": np.zeros((n, length), np.int32),
        "example_index": np.array([e for e, _ in rows], np.int32).reshape(n),
        "label_ids": label_ids, "label_mask": (word_index >= 0).astype(np.int32),
        "word_index": word_index,
    }


def _word_pieces(words: list[str], tokenizer) -> list[np.ndarray]:
    """WordPiece ids of each word, tokenized in big batches; [UNK] for a word that gives none."""
    out: list[np.ndarray] = []
    unk = np.array([tokenizer.unk_id], np.int32)
    for start in range(0, len(words), _TOKENIZE_BATCH):
        ragged = tokenizer.tokenize(tf.constant(words[start:start + _TOKENIZE_BATCH], tf.string))
        flat = ragged.flat_values.numpy().astype(np.int32)
        splits = ragged.row_splits.numpy()
        out.extend(flat[a:b] if b > a else unk for a, b in zip(splits[:-1], splits[1:], strict=True))
    return out
