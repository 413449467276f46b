"""Entity-level NER scores with conlleval's chunk rules (seqeval's default, non-strict mode).

`entities` reads chunks the way ``conlleval.pl`` (and ``seqeval.metrics.sequence_labeling.get_entities``)
does, for BIO (IOB2), IOB1 and IOBES tags alike: a chunk ends before ``B-``/``S-``/``O``, after
``E-``/``S-``, or where the type changes; a chunk starts at ``B-``/``S-``, at an ``I-``/``E-`` that
follows ``O``/``E-``/``S-``, or wherever the type changes. So ``O I-PER`` starts a PER chunk,
``B-PER I-LOC`` is two chunks, and a chunk still open at the end of a sentence is closed there.
``O`` is outside. Extension: a tag with no ``X-`` prefix (IO scheme, ``PER``) is read as ``I-PER``
(conlleval and seqeval give such tags no meaningful chunks).

`ner_scores` scores sentence lists (chunks never cross sentences): micro-averaged precision, recall
and F1 over all chunks (exact type, start and end must match), the same per entity type, and token
accuracy (fraction of tokens whose tag equals the gold tag, as seqeval's ``accuracy_score``).
Scores are fractions in [0, 1]; a ratio with a zero denominator is 0 (seqeval's
``zero_division`` default, without its warning). The seqeval package itself is not used.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence


def _split(tag: str) -> tuple[str, str]:
    """"B-PER" → ("B", "PER"); "O" → ("O", ""); a tag without a prefix is its own type."""
    if tag == "O":
        return "O", ""
    if len(tag) > 1 and tag[1] == "-" and tag[0] in "BIES":
        return tag[0], tag[2:]
    return "I", tag  # IO scheme: "PER" continues a PER chunk, a type change starts a new one


def _ends(prev: str, prev_type: str, cur: str, cur_type: str) -> bool:
    """conlleval's endOfChunk: does the chunk open at the previous token end before this one?"""
    if prev in "ES":
        return True
    if prev in "BI" and cur in "BSO":
        return True
    return prev != "O" and prev_type != cur_type


def _starts(prev: str, prev_type: str, cur: str, cur_type: str) -> bool:
    """conlleval's startOfChunk: does a chunk start at this token?"""
    if cur in "BS":
        return True
    if prev in "ESO" and cur in "EI":
        return True
    return cur != "O" and prev_type != cur_type


def entities(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """The chunks of one tag sequence as (type, start, end) with ``end`` inclusive (seqeval's form)."""
    chunks: list[tuple[str, int, int]] = []
    prev, prev_type, begin = "O", "", 0
    for i, tag in enumerate([*tags, "O"]):  # the sentinel closes a chunk open at the end
        cur, cur_type = _split(tag)
        if _ends(prev, prev_type, cur, cur_type):
            chunks.append((prev_type, begin, i - 1))
        if _starts(prev, prev_type, cur, cur_type):
            begin = i
        prev, prev_type = cur, cur_type
    return chunks


def _prf(correct: int, predicted: int, gold: int) -> tuple[float, float, float]:
    precision = correct / predicted if predicted else 0.0
    recall = correct / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def ner_scores(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> dict[str, float]:
    """Scores of predicted tag sequences against gold ones (one sequence per sentence).

    Returns ``precision``, ``recall``, ``f1`` (micro over every chunk), ``accuracy`` (tokens), and
    ``precision_T``, ``recall_T``, ``f1_T`` for each type ``T`` found in either gold or predictions.
    """
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold sentences but {len(pred)} predicted ones")
    counts = {k: collections.Counter() for k in ("correct", "gold", "pred")}
    tokens = same = 0
    for i, (g, p) in enumerate(zip(gold, pred, strict=True)):
        if len(g) != len(p):
            raise ValueError(f"sentence {i}: {len(g)} gold tags but {len(p)} predicted ones")
        tokens += len(g)
        same += sum(a == b for a, b in zip(g, p, strict=True))
        g_chunks, p_chunks = set(entities(g)), set(entities(p))
        counts["gold"].update(t for t, _, _ in g_chunks)
        counts["pred"].update(t for t, _, _ in p_chunks)
        counts["correct"].update(t for t, _, _ in g_chunks & p_chunks)
    total = {k: sum(c.values()) for k, c in counts.items()}
    p_all, r_all, f_all = _prf(total["correct"], total["pred"], total["gold"])
    scores = {"precision": p_all, "recall": r_all, "f1": f_all,
              "accuracy": same / tokens if tokens else 0.0}
    for t in sorted(set(counts["gold"]) | set(counts["pred"])):
        p_t, r_t, f_t = _prf(counts["correct"][t], counts["pred"][t], counts["gold"][t])
        scores |= {f"precision_{t}": p_t, f"recall_{t}": r_t, f"f1_{t}": f_t}
    return scores
