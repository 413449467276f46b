"""SQuAD post-processing: start/end logits → answer texts, as run_squad.py's write_predictions.

Per feature (window) the ``n_best_size`` highest start and end logits (over all positions, ties to
the lower position) are paired; a pair is kept if both ends are document tokens of the window, the
start token has its maximum context there, end >= start and the span has at most
``max_answer_length`` tokens. All kept pairs of an example's windows are ranked by start + end logit,
and the best ``n_best_size`` distinct final texts form the n-best list (probabilities: softmax of
the scores over it). A final text is the span's WordPiece text ("##" joined; SentencePiece and
byte-level BPE pieces decoded their own way) mapped back onto the
original context words by `get_final_text` (BERT's basic tokenization of the original words,
character alignment with spaces removed; the whole words when that alignment fails). v2.0: the null
score is the lowest [CLS] start + end logit over the windows; it competes as the "" entry, and the
prediction is "" when null score - best non-null score > ``null_score_diff_threshold`` (that
difference is the question's null odds). With no valid span the v1.1 prediction is "empty" (as
run_squad); for v2.0 it is "" with null odds `NO_SPAN_NULL_ODDS` (run_squad would crash).

`basic_tokenize` is Google BERT's BasicTokenizer (with HF's NFC step, as our tokenizer does).
SentencePiece vocabularies work too ("▁" marks a word start); their pieces rarely match the basic
tokenization, so their answers mostly snap to whole context words.

Files (`write_prediction_files`): ``predictions.json`` (id → text), ``nbest_predictions.json``
(id → [{text, probability, start_logit, end_logit}]) and, for v2.0, ``null_odds.json``
(id → null score diff, the ``--na-prob-file`` of evaluate-v2.0.py). The dev split's files carry no
prefix (the names run_squad writes and the official scripts' docs use); any other split's names
start with ``{split}_`` (e.g. ``train_predictions.json``). Each file is written to a temporary name
and renamed, so a failed run leaves no half-written file.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from pathlib import Path

import numpy as np

from input_pipeline.files import path_or_url, write_atomically

_NON_SPACE = re.compile("[^ ]+")
NO_SPAN_NULL_ODDS = 1e9  # v2.0 null odds of a question whose windows hold no valid answer span


def _is_punct(c: str) -> bool:
    cp = ord(c)
    return 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126 or \
        unicodedata.category(c).startswith("P")


def _is_cjk(cp: int) -> bool:
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
            or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF
            or 0x2F800 <= cp <= 0x2FA1F)


def basic_tokenize(text: str, lower_case: bool) -> list[str]:
    """BERT's BasicTokenizer: clean, space CJK, (lower-case + strip accents), split on punctuation."""
    chars = []
    for c in text:
        cat = unicodedata.category(c)
        if c in "\t\n\r" or cat.startswith("Z"):
            chars.append(" ")
        elif c == "\ufffd" or cat.startswith("C"):
            continue
        elif _is_cjk(ord(c)):
            chars.append(f" {c} ")
        else:
            chars.append(c)
    out: list[str] = []
    for word in unicodedata.normalize("NFC", "".join(chars)).split():
        if lower_case:
            word = "".join(c for c in unicodedata.normalize("NFD", word.lower()) if unicodedata.category(c) != "Mn")
        piece = ""
        for c in word:
            if _is_punct(c):
                out.extend([piece, c] if piece else [c])
                piece = ""
            else:
                piece += c
        if piece:
            out.append(piece)
    return out


def _nth_non_space(text: str, n: int) -> int:
    """Index in ``text`` of its ``n``-th (0-based) character that is not a space."""
    for m in _NON_SPACE.finditer(text):
        if n < m.end() - m.start():
            return m.start() + n
        n -= m.end() - m.start()
    raise IndexError(n)


def get_final_text(pred_text: str, orig_text: str, lower_case: bool, cache: dict | None = None) -> str:
    """The part of ``orig_text`` (original context words) that ``pred_text`` (normalised tokens) covers.

    run_squad's algorithm: find ``pred_text`` in the basic tokenization of ``orig_text``, then align
    the two with spaces removed (they must have equal lengths); ``orig_text`` itself when that fails.
    ``cache`` (a dict) memoises the per-word basic tokenization across calls.
    """
    cache = {} if cache is None else cache
    pieces = []
    for word in orig_text.split(" "):  # basic tokenization is local to whitespace-separated words
        key = (word, lower_case)
        if key not in cache:
            cache[key] = " ".join(basic_tokenize(word, lower_case))
        if cache[key]:
            pieces.append(cache[key])
    tok_text = " ".join(pieces)
    start = tok_text.find(pred_text) if pred_text else -1
    end = start + len(pred_text) - 1
    if start == -1 or " " in (tok_text[start], tok_text[end]):
        return orig_text
    if len(orig_text) - orig_text.count(" ") != len(tok_text) - tok_text.count(" "):
        return orig_text
    ns_start, ns_end = start - tok_text.count(" ", 0, start), end - tok_text.count(" ", 0, end)
    return orig_text[_nth_non_space(orig_text, ns_start):_nth_non_space(orig_text, ns_end) + 1]


def _span_text(tokens: list[str], pieces: str) -> str:
    """Normalised text of WordPiece tokens, as run_squad joins them ("##" continues a word), of
    SentencePiece pieces ("▁" starts one) or of byte-level BPE pieces (decoded to their bytes' text)."""
    if pieces == "sentencepiece":
        text = "".join(tokens).replace("\u2581", " ")
    elif pieces == "byte_level":
        from tokenizers import decoders

        text = decoders.ByteLevel().decode(tokens)
    else:
        text = " ".join(tokens).replace(" ##", "").replace("##", "")
    return " ".join(text.split())


def _softmax(scores: list[float]) -> list[float]:
    if not scores:
        return []
    top = max(scores)
    exps = [math.exp(s - top) for s in scores]
    return [x / sum(exps) for x in exps]


def compute_predictions(examples, features, start_logits, end_logits, *, vocab: list[str], lower_case: bool,
                        pieces: str, n_best_size: int, max_answer_length: int,
                        version_2_with_negative: bool, null_score_diff_threshold: float):
    """(predictions id → text, n-best id → [dict], null odds id → float or None for v1.1)."""
    start_logits = np.asarray(start_logits, np.float64)
    end_logits = np.asarray(end_logits, np.float64)
    ids, t2o = features["input_ids"], features["token_to_orig"]
    ex_index = np.asarray(features["example_index"])
    if start_logits.shape != ids.shape or end_logits.shape != ids.shape:
        raise ValueError(f"start/end logits {start_logits.shape}/{end_logits.shape} do not match the features' "
                         f"input_ids {ids.shape}")
    if len(ex_index) and (ex_index.min() < 0 or ex_index.max() >= len(examples)):
        raise ValueError(f"features refer to example {int(ex_index.max())}, but there are {len(examples)} examples")
    k = min(n_best_size, ids.shape[1])
    top_start = np.argsort(-start_logits, axis=1, kind="stable")[:, :k]
    top_end = np.argsort(-end_logits, axis=1, kind="stable")[:, :k]
    si, ei = top_start[:, :, None], top_end[:, None, :]  # [N, k, 1], [N, 1, k]
    start_ok = (np.take_along_axis(t2o, top_start, 1) >= 0) & (
        np.take_along_axis(features["token_is_max_context"], top_start, 1) == 1)  # in the document, max context
    end_ok = np.take_along_axis(t2o, top_end, 1) >= 0
    valid = start_ok[:, :, None] & end_ok[:, None, :] & (ei >= si) & (ei - si + 1 <= max_answer_length)  # [N, k, k]
    order = np.argsort(ex_index, kind="stable")
    bounds = np.searchsorted(ex_index[order], np.arange(len(examples) + 1))
    preds, nbest_out, null_odds = {}, {}, {} if version_2_with_negative else None
    word_cache: dict = {}
    for e, ex in enumerate(examples):
        feats = order[bounds[e]:bounds[e + 1]]
        f_idx, a, b = np.nonzero(valid[feats])  # row-major: run_squad's loop order
        f_idx = feats[f_idx]
        starts, ends = top_start[f_idx, a], top_end[f_idx, b]
        cands = list(zip(f_idx.tolist(), starts.tolist(), ends.tolist(),
                         start_logits[f_idx, starts].tolist(), end_logits[f_idx, ends].tolist(), strict=True))
        if version_2_with_negative and len(feats):
            null_scores = start_logits[feats, 0] + end_logits[feats, 0]
            f = int(feats[int(np.argmin(null_scores))])
            score_null = float(null_scores.min())
            null_entry = ("", float(start_logits[f, 0]), float(end_logits[f, 0]))
            cands.append((f, 0, 0, *null_entry[1:]))
        cands.sort(key=lambda c: c[3] + c[4], reverse=True)  # stable, as run_squad's sorted()
        nbest, seen = [], set()
        for f, s, t, s_logit, e_logit in cands:
            if len(nbest) >= n_best_size:
                break
            if s > 0:
                tok_text = _span_text([vocab[i] for i in ids[f, s:t + 1].tolist()], pieces)
                orig_text = " ".join(ex.doc_tokens[t2o[f, s]:t2o[f, t] + 1])
                text = get_final_text(tok_text, orig_text, lower_case, word_cache)
            else:
                text = ""
            if text in seen:
                continue
            seen.add(text)
            nbest.append((text, s_logit, e_logit))
        if version_2_with_negative and "" not in seen and len(feats):
            nbest.append(null_entry)
        if not nbest:
            nbest.append(("empty", 0.0, 0.0))
        probs = _softmax([s + t for _, s, t in nbest])
        nbest_out[ex.qas_id] = [{"text": text, "probability": p, "start_logit": s, "end_logit": t}
                                for (text, s, t), p in zip(nbest, probs, strict=True)]
        if not version_2_with_negative:
            preds[ex.qas_id] = nbest[0][0]
            continue
        best = next((entry for entry in nbest if entry[0]), None)
        if best is None or not len(feats):
            null_odds[ex.qas_id], preds[ex.qas_id] = NO_SPAN_NULL_ODDS, ""
            continue
        diff = score_null - best[1] - best[2]
        null_odds[ex.qas_id] = diff
        preds[ex.qas_id] = "" if diff > null_score_diff_threshold else best[0]
    return preds, nbest_out, null_odds


def write_prediction_files(out_dir: Path, split: str, predictions: dict, nbest: dict,
                           null_odds: dict | None) -> list[Path]:
    """predictions.json, nbest_predictions.json (+ null_odds.json) in ``out_dir`` (a local directory or
    a ``gs://`` URL); ``{split}_`` prefix unless the split is "dev". Returns the paths."""
    out_dir = path_or_url(out_dir)
    prefix = "" if split == "dev" else f"{split}_"
    contents = {"predictions.json": predictions, "nbest_predictions.json": nbest}
    if null_odds is not None:
        contents["null_odds.json"] = null_odds
    return [write_atomically(out_dir / f"{prefix}{name}", (json.dumps(obj, indent=4) + "\n").encode("utf-8"))
            for name, obj in contents.items()]
