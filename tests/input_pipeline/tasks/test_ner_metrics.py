"""NER metrics (input_pipeline/tasks/ner_metrics.py): conlleval's chunks and entity-level scores.

Metric expectations are computed by hand from conlleval's chunk rules (comments show the chunks).
"""

from __future__ import annotations

import pytest

from input_pipeline.tasks.ner_metrics import entities, ner_scores


@pytest.mark.parametrize("tags, chunks", [
    (["B-PER", "I-PER", "O", "B-LOC"], [("PER", 0, 1), ("LOC", 3, 3)]),
    (["O", "I-PER", "I-PER", "O"], [("PER", 1, 2)]),  # I- without B- starts a chunk
    (["I-ORG", "O"], [("ORG", 0, 0)]),  # ... also at the start
    (["B-PER", "I-LOC", "I-LOC"], [("PER", 0, 0), ("LOC", 1, 2)]),  # type change inside
    (["I-PER", "B-PER", "I-PER"], [("PER", 0, 0), ("PER", 1, 2)]),  # IOB1 adjacent entities
    (["B-MISC", "B-MISC"], [("MISC", 0, 0), ("MISC", 1, 1)]),
    (["O", "B-MISC", "I-MISC"], [("MISC", 1, 2)]),  # entity at the end of the sentence
    (["S-PER", "B-LOC", "E-LOC", "E-LOC"], [("PER", 0, 0), ("LOC", 1, 2), ("LOC", 3, 3)]),  # IOBES
    (["PER", "PER", "O", "LOC"], [("PER", 0, 1), ("LOC", 3, 3)]),  # IO (no prefix)
    (["O", "O"], []),
    ([], []),
])
def test_entities(tags, chunks):
    assert entities(tags) == chunks


def test_ner_scores_hand_computed():
    gold = [["B-PER", "I-PER", "O", "B-LOC"],  # PER(0,1) LOC(3,3)
            ["B-ORG", "I-ORG", "O", "O", "B-MISC"]]  # ORG(0,1) MISC(4,4)
    pred = [["B-PER", "I-PER", "O", "B-ORG"],  # PER(0,1) ok, ORG(3,3) wrong type
            ["B-ORG", "O", "O", "O", "B-MISC"]]  # ORG(0,0) wrong end, MISC(4,4) ok
    s = ner_scores(gold, pred)
    assert s["precision"] == s["recall"] == s["f1"] == pytest.approx(0.5)  # 2 of 4, 2 of 4
    assert s["accuracy"] == pytest.approx(7 / 9)
    assert (s["f1_PER"], s["f1_MISC"], s["f1_LOC"], s["f1_ORG"]) == (1.0, 1.0, 0.0, 0.0)
    assert (s["precision_ORG"], s["recall_ORG"], s["recall_LOC"]) == (0.0, 0.0, 0.0)

    s = ner_scores([["B-PER", "I-PER", "O", "B-LOC", "O", "B-ORG"]],
                   [["B-PER", "I-PER", "O", "O", "O", "O"]])
    assert (s["precision"], s["recall"], s["f1"]) == pytest.approx((1.0, 1 / 3, 0.5))
    # Chunks never cross sentences: each I-PER is its own entity, so these match exactly.
    assert ner_scores([["I-PER"], ["I-PER"]], [["B-PER"], ["B-PER"]])["f1"] == 1.0
    assert ner_scores([["B-PER", "I-PER"]], [["B-PER", "B-PER"]])["f1"] == 0.0
    assert ner_scores([["O"]], [["O"]])["f1"] == 0.0  # no entities: 0/0 counts as 0
    with pytest.raises(ValueError, match="sentence 0: 2 gold tags but 1"):
        ner_scores([["O", "O"]], [["O"]])
