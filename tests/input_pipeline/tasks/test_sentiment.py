"""The sentence sentiment task (``make demo``'s fine-tuning task): both file formats, the fixed
dev split, malformed lines reported as file:line, features, accuracy, prediction files, make_task."""

import logging
from pathlib import Path

import numpy as np
import pytest

from input_pipeline.tasks import make_task
from input_pipeline.tasks.base import TaskDataError
from input_pipeline.tasks.sentiment import SentimentTask

SNIPPETS = [  # id, score, text: the layout of movieReviewSnippets_GroundTruth.txt (CRLF there too)
    ("1", "2.26666666667", "The Rock is destined to be the 21st Century's new ''Conan''."),
    ("2", "3.53333333333", "The gorgeously elaborate continuation of ''The Lord of the Rings''."),
    ("3", "-0.6", "Effective but too tepid biopic"),
    ("4", "0.0", "A movie was shown."),  # score 0: no label, dropped
    ("5", "1.7", "Emerges as something rare."),
    ("6", "-2.4", "Dull, flat and long."),
    ("7", "-1", "A\tfilm with a tab."),  # the text keeps its tab
    ("8", "0.3", "Pleasant enough."),
    ("9", "-3.1", "Awful."),
    ("10", "2.0", "A delight from start to finish."),
    ("11", "-0.1", "Not quite."),
    ("12", "1.1", "Good fun."),
]


def write_snippets(path, rows=SNIPPETS, newline="\r\n", extra=()):
    lines = ["\t".join(r) for r in rows] + list(extra)
    path.write_bytes(newline.join(lines).encode("utf-8"))  # no final newline, like the real file
    return path


@pytest.fixture
def vocab(tmp_path):
    words = ["the", "movie", "a", "film", "good", "fun", "awful", "dull", "delight", "##s", "not"]
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", *words]) + "\n")
    from input_pipeline.tokenizers.factory import load_tokenizer

    return load_tokenizer(str(path))


def test_snippets_split_every_tenth_line_and_drop_zero_scores(tmp_path):
    task = SentimentTask(str(write_snippets(tmp_path / "reviews.txt")))
    train, dev = task.load("train"), task.load("dev")
    assert [e.id for e in dev] == ["10"]
    train = sorted(train, key=lambda e: int(e.id))  # load("train") shuffles (fixed order)
    assert [e.id for e in train] == ["1", "2", "3", "5", "6", "7", "8", "9", "11", "12"]  # 4: score 0
    assert [e.label for e in train] == [1, 1, 0, 1, 0, 0, 1, 0, 0, 1]
    assert train[5].text == "A\tfilm with a tab." and dev[0].label == 1
    assert task.skipped == {"train": 0, "dev": 0}
    task3 = SentimentTask(str(tmp_path / "reviews.txt"), dev_every=3)
    assert [e.id for e in task3.load("dev")] == ["3", "6", "9", "12"]


def test_labelled_format_header_and_label_spellings(tmp_path):
    lines = ["label\ttext"] + [f"{lab}\tsentence {i}" for i, lab in enumerate(
        ["1", "0", "pos", "neg", "Positive", "NEGATIVE", "1", "0", "1", "0", "1"])]
    path = tmp_path / "mine.tsv"
    path.write_text("\n".join(lines) + "\n\n")
    task = SentimentTask(str(path))
    train, dev = sorted(task.load("train"), key=lambda e: int(e.id)), task.load("dev")
    assert [e.label for e in train] == [1, 0, 1, 0, 1, 0, 1, 0, 1, 1]
    assert [(e.id, e.text, e.label) for e in dev] == [("11", "sentence 9", 0)]  # data line 10, file line 11


def test_directory_with_train_and_dev(tmp_path):
    (tmp_path / "train.tsv").write_text("1\tgood\n0\tbad\n")
    write_snippets(tmp_path / "dev.tsv", SNIPPETS[:3], newline="\n")
    task = SentimentTask(str(tmp_path))
    assert sorted(e.text for e in task.load("train")) == ["bad", "good"]
    assert [e.label for e in task.load("dev")] == [1, 1, 0]
    assert task.splits == ("train", "dev")
    with pytest.raises(ValueError, match="no split 'test'"):
        task.load("test")


@pytest.mark.parametrize("line, what", [
    ("13\tpositive\tA score that is a word.", "score 'positive' is not a finite number"),
    ("13\tinf\tAn infinite score.", "score 'inf' is not a finite number"),
    ("13\t1.5", "2 tab-separated field(s), expected 3"),
    ("13\t1.5\t   ", "empty text"),
])
def test_malformed_snippet_lines_name_file_and_line(tmp_path, caplog, line, what):
    rows = SNIPPETS[:9]  # the bad line becomes data line 10: dev
    path = write_snippets(tmp_path / "r.txt", rows, newline="\n", extra=[line])
    task = SentimentTask(str(path))
    with caplog.at_level(logging.WARNING):
        assert task.load("train") and task.skipped["train"] == 0
        with pytest.raises(TaskDataError, match="no usable examples"):
            task.load("dev")  # its only line is the bad one
    assert f"{path}:10: {what}" in caplog.text and task.skipped["dev"] == 1
    with pytest.raises(TaskDataError, match=f"{path}:10: "):
        SentimentTask(str(path), on_error="raise").load("dev")


def test_malformed_labelled_lines_and_bad_utf8(tmp_path, caplog):
    path = tmp_path / "mine.tsv"
    path.write_bytes(b"1\tfine\nmaybe\tunsure\n0\t\xff\xfe broken\n0\tok\n")
    task = SentimentTask(str(path))
    with caplog.at_level(logging.WARNING):
        assert sorted(e.text for e in task.load("train")) == ["fine", "ok"]
    assert f"{path}:2: unknown label 'maybe'" in caplog.text
    assert f"{path}:3: not valid UTF-8" in caplog.text and task.skipped["train"] == 2
    no_tab = tmp_path / "plain.txt"
    no_tab.write_text("just a sentence\n")
    with pytest.raises(TaskDataError, match=f"{no_tab}:1: no tab"):
        SentimentTask(str(no_tab)).load("train")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        SentimentTask(str(tmp_path / "missing.tsv")).load("train")
    (tmp_path / "d").mkdir()
    with pytest.raises(FileNotFoundError, match="train.tsv"):
        SentimentTask(str(tmp_path / "d")).load("train")


def test_features_metric_and_predictions(tmp_path, vocab):
    task = SentimentTask(str(write_snippets(tmp_path / "r.txt")))
    examples = sorted(task.load("train"), key=lambda e: int(e.id))[:3]
    f = task.featurize(examples, vocab, 8)
    assert f["input_ids"].shape == (3, 8) and f["label"].tolist() == [1, 1, 0]
    assert (f["input_ids"][:, 0] == vocab.cls_id).all() and f["segment_ids"].sum() == 0
    # "Effective but too tepid biopic" -> 5 [UNK]s: [CLS] 5 x [UNK] [SEP] [PAD]
    assert f["input_ids"][2].tolist() == [vocab.cls_id] + [vocab.unk_id] * 5 + [vocab.sep_id, vocab.pad_id]
    assert f["input_mask"][2].tolist() == [1] * 7 + [0]
    assert f["input_mask"][0].sum() == 8 and f["input_ids"][0, 7] == vocab.sep_id  # truncated
    logits = np.array([[0.0, 2.0], [1.0, 0.0], [3.0, 0.0]])
    assert task.evaluate(examples, f, {"logits": logits}) == pytest.approx({"accuracy": 2 / 3, "score": 2 / 3})
    (path,) = task.write_predictions(examples, f, {"logits": logits}, tmp_path / "pred", "dev")
    lines = path.read_text().splitlines()
    assert path.name == "dev_sentiment.tsv" and lines[0] == "id\tprediction\tp_positive\tlabel\ttext"
    assert lines[1].split("\t")[:4] == ["1", "positive", "0.8808", "positive"]
    assert lines[2].split("\t")[:4] == ["2", "negative", "0.2689", "positive"]
    with pytest.raises(ValueError, match="expected"):
        task.evaluate(examples, f, {"logits": logits[:2]})


def test_make_task_builds_the_sentiment_family(tmp_path):
    path = write_snippets(tmp_path / "r.txt")
    task = make_task({"family": "sentiment", "source": str(path), "data_dir": "", "dev_every": 10,
                      "on_error": "raise"})
    assert isinstance(task, SentimentTask) and task.on_error == "raise" and task.num_labels == 2
    assert task.kind == "classification" and task.eval_splits == ("dev",)
    with pytest.raises(ValueError, match="sentiment"):
        make_task({"family": "nope"})


def test_real_review_file_counts(movie_review_file):
    """The vaderSentiment file: 10,605 lines, 37 scored 0; every 10th line is dev."""
    task = SentimentTask("pkg:movie_reviews")  # the file movie_review_file fetched
    train, dev = task.load("train"), task.load("dev")
    assert (len(train), len(dev)) == (9514, 1054)
    assert sum(e.label for e in dev) == 533 and task.skipped == {"train": 0, "dev": 0}
    assert all(int(e.id) % 10 == 0 for e in dev)
    first = train[:1000]  # the file lists mostly positive sentences first; the shuffle mixes them
    assert 0.4 < sum(e.label for e in first) / 1000 < 0.6
    assert [e.id for e in train[:3]] == [e.id for e in SentimentTask("pkg:movie_reviews").load("train")[:3]]
    # the demo's validation split: every 10th training line, carved from the 9,514
    held = SentimentTask("pkg:movie_reviews", validation_every=10)
    train, validation = held.load("train"), held.load("validation")
    assert (len(train), len(validation), len(held.load("dev"))) == (8563, 951, 1054)
    assert [e.id for e in validation[:9]] == ["11", "22", "33", "44", "55", "66", "88", "99", "111"]  # 77: score 0


def test_validation_split_is_carved_from_the_training_lines(tmp_path):
    """Training lines j = 1, 2, ... (file lines 1-9, 11, 12 here; 10 is dev): j a multiple of
    validation_every goes to validation; dev is unchanged and nothing is in two splits."""
    path = write_snippets(tmp_path / "reviews.txt")
    task = SentimentTask(str(path), validation_every=3, eval_splits="validation,dev")
    assert task.splits == ("train", "validation", "dev") and task.eval_splits == ("validation", "dev")
    assert [e.id for e in task.load("validation")] == ["3", "6", "9"]
    assert sorted(int(e.id) for e in task.load("train")) == [1, 2, 5, 7, 8, 11, 12]  # 4: score 0
    assert [e.id for e in task.load("dev")] == ["10"]
    assert SentimentTask(str(path)).eval_splits == ("dev",)  # no validation split unless asked
    directory = tmp_path / "d"
    directory.mkdir()
    (directory / "train.tsv").write_text("".join(f"{i % 2}\tline {i}\n" for i in range(1, 7)))
    write_snippets(directory / "dev.tsv", SNIPPETS[:3], newline="\n")
    task = SentimentTask(str(directory), validation_every=2)
    assert [e.text for e in task.load("validation")] == ["line 2", "line 4", "line 6"]
    assert sorted(e.text for e in task.load("train")) == ["line 1", "line 3", "line 5"]
    with pytest.raises(ValueError, match="validation_every"):
        SentimentTask(str(path), validation_every=1)
    with pytest.raises(ValueError, match="validation needs validation_every"):
        SentimentTask(str(path), eval_splits="validation")
    with pytest.raises(ValueError, match="no split 'validation'"):
        SentimentTask(str(path)).load("validation")
    task = make_task({"family": "sentiment", "source": str(path), "data_dir": "", "dev_every": 10,
                      "validation_every": 3, "eval_splits": "validation", "on_error": "raise"})
    assert task.eval_splits == ("validation",) and len(task.load("validation")) == 3


OWN = Path(__file__).parents[2] / "fixtures" / "own_data"  # docs/finetuning.md's example files


def test_own_scored_file_zero_scores_dropped_and_logged(caplog):
    """tests/fixtures/own_data/scored.tsv (60 scored sentences, 5 scored 0): labels by the score's
    sign; the zero scores are dropped, counted per split and logged with their counts."""
    task = SentimentTask(str(OWN / "scored.tsv"))
    with caplog.at_level(logging.INFO, logger="input_pipeline.tasks.sentiment"):
        train, dev = task.load("train"), task.load("dev")
    assert (len(train), len(dev)) == (50, 5) and task.dropped == {"train": 4, "dev": 1}
    assert "sentiment train: 4 sentence(s) scored exactly 0 dropped" in caplog.text
    assert "sentiment dev: 1 sentence(s) scored exactly 0 dropped" in caplog.text
    rows = [line.split("\t") for line in (OWN / "scored.tsv").read_text().splitlines()]
    expected = {i: int(float(s) > 0) for i, s, _ in rows if float(s) != 0}
    assert {e.id: e.label for e in train + dev} == expected


def test_own_scored_file_as_a_regression(vocab, tmp_path):
    """target="score": a regression on the scores themselves (none dropped), scored with Pearson and
    Spearman; a labelled file cannot be one."""
    task = SentimentTask(str(OWN / "scored.tsv"), target="score")
    assert (task.kind, task.num_labels, task.label_names) == ("regression", 1, ())
    train, dev = task.load("train"), task.load("dev")
    assert (len(train), len(dev)) == (54, 6) and task.dropped == {"train": 0, "dev": 0}
    scores = {i: float(s) for i, s, _ in (line.split("\t") for line in (OWN / "scored.tsv").read_text().splitlines())}
    assert all(e.label == scores[e.id] for e in train + dev)
    f = task.featurize(dev, vocab, 16)
    assert f["label"].dtype == np.float32 and f["label"].tolist() == pytest.approx([scores[e.id] for e in dev])
    gold = np.array([scores[e.id] for e in dev])
    result = task.evaluate(dev, f, {"predictions": 2 * gold + 1})  # a linear function of the scores
    assert result["pearson"] == pytest.approx(1.0) and result["spearman"] == pytest.approx(1.0)
    assert result["score"] == pytest.approx(1.0) and result["mse"] == pytest.approx(np.mean((gold + 1) ** 2))
    (path,) = task.write_predictions(dev, f, {"predictions": gold}, tmp_path, "dev")
    lines = path.read_text().splitlines()
    assert lines[0] == "id\tprediction\tscore\ttext" and lines[1].split("\t")[0] == dev[0].id
    assert float(lines[1].split("\t")[1]) == pytest.approx(scores[dev[0].id], abs=1e-4)
    with pytest.raises(TaskDataError, match=r"labelled.tsv:1: target=score needs a scored file"):
        SentimentTask(str(OWN / "labelled.tsv"), target="score").load("train")
    with pytest.raises(ValueError, match="target='sign2'"):
        SentimentTask(str(OWN / "scored.tsv"), target="sign2")


def test_own_labelled_file():
    """tests/fixtures/own_data/labelled.tsv: a header, then pos/neg<TAB>text."""
    task = SentimentTask(str(OWN / "labelled.tsv"))
    train, dev = task.load("train"), task.load("dev")
    assert len(train) + len(dev) == 55 and {e.label for e in train} == {0, 1} and task.skipped["train"] == 0
