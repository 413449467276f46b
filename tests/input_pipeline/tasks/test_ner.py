"""NER (input_pipeline/tasks/ner.py, CoNLL-2003): file parsing, IOB1 → BIO, the TFDS source, evaluation
and the conlleval predictions file; the sample files hold tests/fixtures/task_files.py's CONLL_VALID."""

from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from input_pipeline.tasks.base import TaskDataError
from input_pipeline.tasks.ner import CONLL2003_LABELS, NerTask, iob1_to_bio
from input_pipeline.tasks.ner_metrics import entities, ner_scores

BAD = """\
-DOCSTART- -X- -X- O

Japan NNP B-NP I-LOC
began VBD B-VP O
the DT B-NP O

Clinton NNP B-NP I-PER
said VBD B-VP
. . O O

Nadim NNP B-NP B-PERSON
Ladki NNP I-NP I-PER

AL-AIN NNP B-NP I-LOC
, , O O
United NNP B-NP I-LOC
Arab NNP I-NP I-LOC
Emirates NNPS I-NP I-LOC
"""  # line 8: 3 columns; line 11: unknown tag B-PERSON


def set_word(task, features, logits, example, word, tag):
    (row, col), = zip(*np.nonzero((features["example_index"][:, None] == example)
                                   & (features["word_index"] == word)), strict=True)
    logits[row, col] = 0.0
    logits[row, col, task.label_names.index(tag)] = 10.0


def test_iob1_to_bio_keeps_entities():
    assert iob1_to_bio(["I-ORG", "O", "I-MISC", "I-MISC", "B-MISC", "I-PER", "I-LOC"]) == [
        "B-ORG", "O", "B-MISC", "I-MISC", "B-MISC", "B-PER", "B-LOC"]
    rng = random.Random(0)
    for _ in range(300):
        tags = [rng.choice(CONLL2003_LABELS) for _ in range(rng.randrange(12))]
        bio = iob1_to_bio(tags)
        assert entities(bio) == entities(tags)
        assert iob1_to_bio(bio) == bio  # BIO input is left as it is
        assert all(not t.startswith("I-") or p[2:] == t[2:] for p, t in zip(["O", *bio], bio, strict=False))


# ---- loading ----

def test_load_conll_files(conll_dir):
    task = NerTask(data_dir=conll_dir)
    assert (task.name, task.kind, task.num_labels, task.eval_splits) == ("conll2003", "tagging", 9,
                                                                         ("dev", "test"))
    ex = task.load("dev")
    assert [len(e.words) for e in ex] == [9, 2, 2, 6]
    assert [e.doc_start for e in ex] == [True, False, True, False]
    assert ex[0].location == f"{conll_dir / 'valid.txt'}:3"
    assert ex[0].tags == ("B-ORG", "O", "B-MISC", "O", "O", "O", "B-MISC", "O", "O")
    assert ex[1].words == ("Peter", "Blackburn") and ex[1].tags == ("B-PER", "I-PER")
    assert ex[3].tags == ("O", "O", "B-ORG", "I-ORG", "B-ORG", "I-ORG")
    assert task.report["dev"] == {"sentences": 4, "skipped": 0, "first_error": None}


def test_two_column_dev_txt(tmp_path):
    # Windows line ends; \x85 (NEL) is a word here, not a line break as str.splitlines() has it.
    text = "Peter\tB-PER\r\nBlackburn I-PER\r\n\r\nin O\r\n\x85 O\r\nBonn B-LOC\r\n\r\n\r\n"
    (tmp_path / "dev.txt").write_bytes(text.encode("utf-8"))
    ex = NerTask(str(tmp_path)).load("dev")  # the directory as source
    assert [(e.words, e.tags) for e in ex] == [(("Peter", "Blackburn"), ("B-PER", "I-PER")),
                                                (("in", "\x85", "Bonn"), ("O", "O", "B-LOC"))]
    with pytest.raises(TaskDataError, match=r"no train\.txt in "):
        NerTask(data_dir=tmp_path).load("train")


def test_malformed_lines_skip_and_raise(tmp_path):
    path = tmp_path / "valid.txt"
    path.write_text(BAD, encoding="utf-8")
    task = NerTask(data_dir=tmp_path)
    ex = task.load("dev")
    assert [e.words[0] for e in ex] == ["Japan", "AL-AIN"]
    assert task.report["dev"]["skipped"] == 2
    assert task.report["dev"]["first_error"] == (
        f"{path}:8: expected 4 columns (WORD ... TAG) like line 3, got 3: 'said VBD B-VP'")
    assert ex[1].tags == ("B-LOC", "O", "B-LOC", "I-LOC", "I-LOC")

    strict = NerTask(data_dir=tmp_path, on_error="raise")
    with pytest.raises(TaskDataError, match=re.escape(f"{path}:8: expected 4 columns")):
        strict.load("dev")
    path.write_text(BAD.replace("said VBD B-VP\n", "said VBD B-VP O\n"), encoding="utf-8")
    with pytest.raises(TaskDataError, match=re.escape(f"{path}:11: unknown tag 'B-PERSON'")):
        strict.load("dev")


def test_dropped_sentence_hands_on_docstart_and_bad_utf8(tmp_path):
    (tmp_path / "test.txt").write_text("-DOCSTART- O\n\nPeter I-PER\nx\n\nBonn I-LOC\n")
    ex = NerTask(data_dir=tmp_path).load("test")
    assert [(e.words, e.tags, e.doc_start) for e in ex] == [(("Bonn",), ("B-LOC",), True)]
    (tmp_path / "test.txt").write_bytes(b"a O\n\nb O\nM\xfcnchen I-LOC\n")
    with pytest.raises(TaskDataError, match=r"test\.txt:4: not valid UTF-8"):
        NerTask(data_dir=tmp_path).load("test")
    with pytest.raises(ValueError, match="data_dir"):
        NerTask()
    with pytest.raises(ValueError, match="directory given twice"):
        NerTask(str(tmp_path), data_dir=tmp_path / "other")
    with pytest.raises(ValueError, match="on_error"):
        NerTask(data_dir=tmp_path, on_error="ignore")


def test_iob1_start_needs_b_label(tmp_path):
    (tmp_path / "train.txt").write_text("Bonn I-LOC\n")
    with pytest.raises(TaskDataError, match=r"train\.txt:1: IOB1 tag 'I-LOC' starts an entity but 'B-LOC'"):
        NerTask(data_dir=tmp_path, label_names=["O", "I-LOC"], on_error="raise").load("train")


def test_tfds_source_mocked():
    tfds = pytest.importorskip("tensorflow_datasets")
    data = [(["EU", "rejects", "German", "call"], [4, 0, 8, 0]),  # I-ORG O I-MISC O (ids of NER_TAGS)
            (["Peter", "Blackburn"], [2, 2]), ([], [])]
    spec = {k: tf.TensorSpec([None], tf.string if k == "tokens" else tf.int64)
            for k in ("tokens", "pos", "chunks", "ner")}

    def as_dataset(self, *args, **kwargs):
        del self, args, kwargs
        return tf.data.Dataset.from_generator(lambda: ({
            "tokens": w, "pos": [0] * len(w), "chunks": [0] * len(w), "ner": t} for w, t in data),
            output_signature=spec)

    with tfds.testing.mock_data(as_dataset_fn=as_dataset):
        ex = NerTask("tfds:conll2003").load("dev")
    assert [(e.words, e.tags) for e in ex] == [
        (("EU", "rejects", "German", "call"), ("B-ORG", "O", "B-MISC", "O")),
        (("Peter", "Blackburn"), ("B-PER", "I-PER"))]
    assert ex[1].location == "tfds:conll2003:dev#1 word 0"


# ---- evaluation and predictions ----

def read_conlleval(path: Path) -> tuple[list[list[str]], list[list[str]]]:
    gold, pred, g, p = [], [], [], []
    for line in [*path.read_text(encoding="utf-8").splitlines(), ""]:
        cols = line.split()
        if not cols or cols[0] == "-DOCSTART-":
            if g:
                gold.append(g)
                pred.append(p)
            g, p = [], []
        else:
            assert len(cols) == 3
            g.append(cols[1])
            p.append(cols[2])
    return gold, pred


def test_round_trip_logits_to_file_to_metric(conll_dir, ner_tok, tmp_path, one_hot_logits):
    task = NerTask(data_dir=conll_dir)
    ex = task.load("dev")
    f = task.featurize(ex, ner_tok, 16)
    logits = one_hot_logits(task, f)
    s = task.evaluate(ex, f, {"logits": logits})
    assert (s["precision"], s["recall"], s["f1"], s["accuracy"]) == (1.0, 1.0, 1.0, 1.0)

    set_word(task, f, logits, 1, 1, "O")  # Blackburn → O: PER(0,1) becomes PER(0,0), wrong
    set_word(task, f, logits, 3, 0, "B-LOC")  # Results → B-LOC: one spurious entity
    s = task.evaluate(ex, f, {"logits": logits})
    # 7 gold entities, 8 predicted, 6 right: P = 3/4, R = 6/7, F1 = 2PR/(P+R) = 0.8.
    assert (s["precision"], s["recall"], s["f1"]) == pytest.approx((0.75, 6 / 7, 0.8))
    assert s["accuracy"] == pytest.approx(17 / 19)
    assert (s["f1_PER"], s["precision_LOC"], s["f1_ORG"], s["f1_MISC"]) == pytest.approx((0, 0.5, 1, 1))

    (path,) = task.write_predictions(ex, f, {"logits": logits}, tmp_path / "out", "dev")
    assert path == tmp_path / "out" / "predictions_dev.txt"
    text = path.read_text(encoding="utf-8")
    assert text.startswith("-DOCSTART- O O\n\nEU B-ORG B-ORG\nrejects O O\n")
    assert "Peter B-PER B-PER\nBlackburn I-PER O\n\n-DOCSTART- O O\n\nBRUSSELS B-LOC B-LOC\n" in text
    assert text.endswith("PSV B-ORG B-ORG\nEindhoven I-ORG I-ORG\n\n")
    gold, pred = read_conlleval(path)
    assert gold == [list(e.tags) for e in ex]
    assert ner_scores(gold, pred) == s
    assert sorted(p.name for p in path.parent.iterdir()) == ["predictions_dev.txt"]


def test_evaluate_rejects_mismatched_outputs(conll_dir, ner_tok, one_hot_logits):
    task = NerTask(data_dir=conll_dir)
    ex = task.load("dev")
    f = task.featurize(ex, ner_tok, 16)
    with pytest.raises(ValueError, match=r"logits must be \[N, L, 9\]"):
        task.evaluate(ex, f, {"logits": np.zeros((*f["input_ids"].shape, 5))})
    logits = one_hot_logits(task, f)
    with pytest.raises(ValueError, match=r"word 0 of example 3 \(.*valid\.txt:21\) has no prediction"):
        task.evaluate(ex, {k: v[:3] for k, v in f.items()}, {"logits": logits[:3]})
    with pytest.raises(ValueError, match="out of range"):
        task.evaluate(ex[:2], f, {"logits": logits})
