"""SQuAD features (input_pipeline/tasks/squad_features.py): windows with stride and max-context flags as
run_squad.py makes them, answer positions that decode to the answer."""

from __future__ import annotations

import numpy as np
import pytest

from input_pipeline.tasks.base import FEATURE_KEYS, MODEL_KEYS
from input_pipeline.tasks.squad_features import doc_spans


def _decode(tokenizer, ids) -> str:
    return " ".join(tokenizer.id_to_token(ids)).replace(" ##", "")


def test_windows_stride_and_max_context(squad, minilm_tokenizer, squad_window):
    L, STRIDE, QLEN = squad_window
    task, data = squad
    examples, f = data["train"]
    assert set(f) >= {*MODEL_KEYS, *FEATURE_KEYS["span"], "example_index", "token_to_orig", "token_is_max_context"}
    assert all(a.shape[0] == len(f["example_index"]) and a.dtype == np.int32 for a in f.values())
    truncated = False
    for e, ex in enumerate(examples):
        rows = np.flatnonzero(f["example_index"] == e)
        query = minilm_tokenizer.tokenize([ex.question_text]).to_list()[0]
        truncated = truncated or len(query) > QLEN
        query = query[:QLEN]
        doc = minilm_tokenizer.tokenize([" ".join(ex.doc_tokens)]).to_list()[0]
        tok_to_orig = np.repeat(np.arange(len(ex.doc_tokens)), minilm_tokenizer.tokenize(ex.doc_tokens).row_lengths())
        spans = doc_spans(len(doc), L - len(query) - 3, STRIDE)
        assert len(rows) == len(spans) and (len(spans) > 3) == (ex.doc_tokens[0] == "Item")
        for r, (start, length) in zip(rows, spans, strict=True):
            ids, t2o = f["input_ids"][r], f["token_to_orig"][r]
            n = len(query) + length + 3
            assert ids[:n].tolist() == [minilm_tokenizer.cls_id, *query, minilm_tokenizer.sep_id,
                                        *doc[start:start + length], minilm_tokenizer.sep_id]
            assert f["input_mask"][r].tolist() == [1] * n + [0] * (L - n)
            assert f["segment_ids"][r].tolist() == [0] * (len(query) + 2) + [1] * (length + 1) + [0] * (L - n)
            assert (t2o[:len(query) + 2] == -1).all() and (t2o[len(query) + 2 + length:] == -1).all()
            assert t2o[len(query) + 2:len(query) + 2 + length].tolist() == tok_to_orig[start:start + length].tolist()
            # run_squad's _check_is_max_context, literally
            for i in range(length):
                pos, best, best_score = start + i, None, None
                for s, (s_start, s_len) in enumerate(spans):
                    if s_start <= pos <= s_start + s_len - 1:
                        score = min(pos - s_start, s_start + s_len - 1 - pos) + 0.01 * s_len
                        if best_score is None or score > best_score:
                            best, best_score = s, score
                assert f["token_is_max_context"][r, len(query) + 2 + i] == (spans[best] == (start, length))
        assert all(b - a == STRIDE for (a, _), (b, _) in zip(spans[:-1], spans[1:], strict=True))
        assert f["token_is_max_context"][rows].sum() == len(doc)  # each token: max context in one window
    assert truncated  # some question is longer than max_query_length


@pytest.mark.parametrize("split", ["train", "dev"])
def test_positions_decode_to_answer(squad, minilm_tokenizer, split):
    _, data = squad
    examples, f = data[split]
    hits = 0
    for r, e in enumerate(f["example_index"]):
        ex, s, t = examples[e], f["start_positions"][r], f["end_positions"][r]
        if ex.is_impossible or ex.start_position < 0:
            assert s == t == 0
            continue
        words = set(f["token_to_orig"][r][f["token_to_orig"][r] >= 0].tolist())
        inside = ex.start_position in words and ex.end_position in words
        assert (s > 0) == inside, (ex.qas_id, r)
        if inside:
            hits += 1
            answer = _decode(minilm_tokenizer, minilm_tokenizer.tokenize([ex.orig_answer_text]).to_list()[0])
            assert _decode(minilm_tokenizer, f["input_ids"][r, s:t + 1]) == answer
    assert hits >= 4
