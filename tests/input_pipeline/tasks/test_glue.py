"""GLUE (input_pipeline/tasks/glue.py): parsing the official TSV formats, evaluation from model outputs,
prediction files, the TFDS source. The files are `GlueFiles`' (tests/fixtures/task_files.py)."""

import logging

import numpy as np
import pytest
import tensorflow as tf

from input_pipeline.tasks.base import TaskDataError
from input_pipeline.tasks.glue import GLUE_TASKS, GlueExample, GlueTask
from input_pipeline.tasks.glue_metrics import glue_metrics

# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize("task", GLUE_TASKS)
def test_every_split_of_every_task_parses(glue_dir, task, caplog, glue_files):
    PAIRS, N, LABELS, BAD, FOLDERS = (glue_files.PAIRS, glue_files.N, glue_files.LABELS, glue_files.BAD,
                                      glue_files.FOLDERS)
    t = GlueTask(task, str(glue_dir))
    for split in t.splits:
        if task == "mnli" and split == "ax":  # the diagnostic set, through the MNLI task
            ax = t.load("ax")
            assert [(e.index, e.label) for e in ax] == [(str(100 + i), None) for i in range(N)]
            assert t.prediction_file("ax") == "AX.tsv"
            continue
        with caplog.at_level(logging.WARNING):
            examples = t.load(split)
        assert len(examples) == N, (task, split)
        bad = [b for b in BAD if b[:2] == (task, split)]
        assert t.skipped[split] == len(bad)
        for k, (_, _, _, what) in enumerate(bad):
            assert f"{FOLDERS[task]}/{split}.tsv:{N + 1 + (task != 'cola') + k}: {what}" in caplog.text
        labelled = not split.startswith("test")
        for i, ex in enumerate(examples):
            a, b = PAIRS[i]
            assert (ex.text_a, ex.text_b) == ((a, None) if task in ("cola", "sst2") else (a, b))
            has_index = task not in ("cola", "sst2", "mrpc") or not labelled
            assert ex.index == (str(100 + i) if has_index else str(i))
            if not labelled:
                assert ex.label is None
            elif task == "stsb":
                assert ex.label == float(LABELS[task][i % 4]) and isinstance(ex.label, float)
            else:
                assert t.label_names[ex.label] == LABELS[task][i % len(LABELS[task])]


def test_task_attributes():
    mnli = GlueTask("MNLI", "tfds")
    assert mnli.splits == ("train", "dev_matched", "dev_mismatched", "test_matched", "test_mismatched", "ax")
    assert mnli.eval_splits == ("dev_matched", "dev_mismatched") and mnli.kind == "classification"
    assert mnli.label_names == ("contradiction", "entailment", "neutral") and mnli.num_labels == 3
    stsb = GlueTask("STS-B", "tfds")
    assert (stsb.name, stsb.kind, stsb.num_labels, stsb.label_names) == ("stsb", "regression", 1, ())
    ax = GlueTask("ax", "tfds")
    assert (ax.splits, ax.eval_splits, ax.label_names) == (("test",), (), mnli.label_names)
    assert GlueTask("rte", "").label_names == ("entailment", "not_entailment")
    assert GlueTask("sst2", "tfds").splits == ("train", "dev", "test")
    with pytest.raises(ValueError, match="unknown GLUE task 'sst5'"):
        GlueTask("sst5", "tfds")
    with pytest.raises(ValueError, match="no split 'dev'"):
        mnli.load("dev")


def test_quote_none_invalid_utf8_blank_lines_and_raise(tmp_path, caplog):
    (tmp_path / "dev.tsv").write_bytes(
        b"index\tsentence1\tsentence2\tlabel\n"
        b'0\t"Quoted\tstart" here\tentailment\n'  # quotes are text, as in the originals
        b"1\tbad \xff byte\tb\tentailment\n\n"
        b'2\t" a\t"b\tnot_entailment\n')
    t = GlueTask("rte", str(tmp_path))  # a directory holding the files directly
    with caplog.at_level(logging.WARNING):
        ex = t.load("dev")
    assert ex == [GlueExample("0", '"Quoted', 'start" here', 0), GlueExample("2", '" a', '"b', 1)]
    assert t.skipped["dev"] == 1 and "dev.tsv:3: not valid UTF-8" in caplog.text
    assert "skipped 1 malformed row(s) of 3" in caplog.text
    with pytest.raises(TaskDataError, match=r"dev\.tsv:3: not valid UTF-8"):
        GlueTask("rte", str(tmp_path), on_error="raise").load("dev")


def test_malformed_rows_raise_with_file_and_line(glue_dir, glue_files):
    N = glue_files.N
    with pytest.raises(TaskDataError, match=r"STS-B/dev\.tsv:14: score 'n/a' is not a finite number"):
        GlueTask("stsb", str(glue_dir), on_error="raise").load("dev")
    with pytest.raises(TaskDataError, match=r"CoLA/dev\.tsv:13: unknown label '2' in column 'label'"):
        GlueTask("cola", str(glue_dir), on_error="raise").load("dev")
    assert len(GlueTask("cola", str(glue_dir), on_error="raise").load("train")) == N


def test_missing_files_and_bad_headers(glue_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"WNLI/dev\.tsv.*download_glue_data\.py"):
        GlueTask("wnli", str(tmp_path)).load("dev")
    with pytest.raises(FileNotFoundError, match="not a directory"):
        GlueTask("wnli", str(tmp_path / "nope"))
    (tmp_path / "SST-2").mkdir()
    (tmp_path / "SST-2" / "dev.tsv").write_text("index\tsentence\n0\tgood\n")  # a test file as dev
    with pytest.raises(TaskDataError, match=r"SST-2/dev\.tsv:1: header .* lacks column\(s\) \['label'\]"):
        GlueTask("sst2", str(tmp_path)).load("dev")
    (tmp_path / "SST-2" / "train.tsv").write_text("")
    with pytest.raises(TaskDataError, match="empty file"):
        GlueTask("sst2", str(tmp_path)).load("train")


# --------------------------------------------------------------------------- evaluation


def test_evaluate_from_logits(glue_dir, glue_tok, glue_files):
    N = glue_files.N
    t = GlueTask("mrpc", str(glue_dir))
    examples = t.load("dev")
    f = t.featurize(examples, glue_tok, 16)
    preds = np.array([1, 0] * 6)
    logits = np.eye(2, dtype=np.float32)[preds] * 3 - 1
    labels = [e.label for e in examples]
    assert t.evaluate(examples, f, {"logits": logits}) == glue_metrics("mrpc", labels, preds)
    with pytest.raises(ValueError, match=r"do not match logits \[12, 2\]"):
        t.evaluate(examples, f, {"logits": logits[:, :1]})
    test = t.load("test")
    with pytest.raises(ValueError, match="labelled split"):
        t.evaluate(test, t.featurize(test, glue_tok, 16), {"logits": logits})
    s = GlueTask("stsb", str(glue_dir))
    ex = s.load("dev")
    got = s.evaluate(ex, s.featurize(ex, glue_tok, 16), {"predictions": np.arange(N, dtype=np.float32)[:, None]})
    assert got == glue_metrics("stsb", [e.label for e in ex], np.arange(N, dtype=np.float64))


# --------------------------------------------------------------------------- prediction files


def test_write_predictions_in_server_format(glue_dir, glue_tok, tmp_path, glue_files):
    N = glue_files.N
    names = {}
    for task in GLUE_TASKS:
        t = GlueTask(task, str(glue_dir))
        for split in t.splits:
            names[task, split] = t.prediction_file(split)
    assert {names[k, "test"] for k in GLUE_TASKS if k != "mnli"} == {
        "CoLA.tsv", "SST-2.tsv", "MRPC.tsv", "STS-B.tsv", "QQP.tsv", "QNLI.tsv", "RTE.tsv", "WNLI.tsv", "AX.tsv"}
    assert (names["mnli", "test_matched"], names["mnli", "test_mismatched"]) == ("MNLI-m.tsv", "MNLI-mm.tsv")
    assert (names["mnli", "dev_mismatched"], names["rte", "dev"], names["cola", "train"]) == (
        "dev_MNLI-mm.tsv", "dev_RTE.tsv", "train_CoLA.tsv")

    rte = GlueTask("rte", str(glue_dir))
    ex = rte.load("test")
    logits = np.zeros((N, 2), np.float32)
    logits[::3, 1] = 1.0
    paths = rte.write_predictions(ex, rte.featurize(ex, glue_tok, 8), {"logits": logits}, tmp_path / "out", "test")
    assert paths == [tmp_path / "out" / "RTE.tsv"]
    lines = paths[0].read_text().splitlines()
    assert lines[:4] == ["index\tprediction", "100\tnot_entailment", "101\tentailment", "102\tentailment"]
    assert len(lines) == N + 1 and sorted(p.name for p in (tmp_path / "out").iterdir()) == ["RTE.tsv"]

    cola = GlueTask("cola", str(glue_dir))
    ex = cola.load("test")
    p = cola.write_predictions(ex, cola.featurize(ex, glue_tok, 8), {"logits": logits}, tmp_path, "test")[0]
    assert p.read_text().splitlines()[1:3] == ["100\t1", "101\t0"]

    stsb = GlueTask("stsb", str(glue_dir))
    ex = stsb.load("test")[:3]
    p = stsb.write_predictions(ex, stsb.featurize(ex, glue_tok, 8), {"predictions": np.array([-0.2, 2.34567, 5.7])},
                               tmp_path, "test")[0]
    assert p.read_text() == "index\tprediction\n100\t0.000\n101\t2.346\n102\t5.000\n"

    mnli = GlueTask("mnli", str(glue_dir))
    ex = mnli.load("dev_mismatched")[:3]
    p = mnli.write_predictions(ex, mnli.featurize(ex, glue_tok, 8), {"logits": np.eye(3)}, tmp_path,
                               "dev_mismatched")[0]
    assert p.name == "dev_MNLI-mm.tsv"
    assert p.read_text() == "index\tprediction\n100\tcontradiction\n101\tentailment\n102\tneutral\n"


# --------------------------------------------------------------------------- TFDS


def test_tfds_source_with_mock_data():
    tfds = pytest.importorskip("tensorflow_datasets")
    seen = []

    def as_dataset(self, split, *args, **kwargs):
        seen.append((self.name, self.builder_config.name, str(split)))
        if self.builder_config.name == "stsb":
            return tf.data.Dataset.from_tensor_slices({
                "sentence1": ["A plane is taking off.", "b"], "sentence2": ["An air plane is taking off.", "c"],
                "label": np.array([5.0, -1.0], np.float32), "idx": np.array([0, 1], np.int32)})
        labels = [-1, -1, -1, -1] if "test" in str(split) else [0, 2, 1, 7]  # TFDS order: ent, neu, contra
        return tf.data.Dataset.from_tensor_slices({
            "premise": ["p3", "p0", "p2", "p1"], "hypothesis": ["h3", "h0", "h2", "h1"],
            "label": np.array(labels, np.int64), "idx": np.array([3, 0, 2, 1], np.int32)})

    with tfds.testing.mock_data(as_dataset_fn=as_dataset):
        t = GlueTask("mnli", "tfds")
        ex = t.load("dev_mismatched")
        assert seen[-1] == ("glue", "mnli", "validation_mismatched")
        # Sorted by idx; TFDS label 0 entailment, 1 neutral, 2 contradiction; the 7 is skipped.
        assert [(e.index, e.text_a, e.text_b) for e in ex] == [("0", "p0", "h0"), ("2", "p2", "h2"),
                                                                ("3", "p3", "h3")]
        assert [t.label_names[e.label] for e in ex] == ["contradiction", "neutral", "entailment"]
        assert t.skipped["dev_mismatched"] == 1
        with pytest.raises(TaskDataError, match="tfds:glue/mnli:train#1: unknown label '7'"):
            GlueTask("mnli", "tfds", on_error="raise").load("train")
        assert all(e.label is None for e in GlueTask("ax", "tfds:glue/ax").load("test"))
        assert seen[-1] == ("glue", "ax", "test")
        ex = GlueTask("stsb", "tfds:glue/stsb").load("dev")
        assert ex == [GlueExample("0", "A plane is taking off.", "An air plane is taking off.", 5.0),
                      GlueExample("1", "b", "c", -1.0)]
        assert [e.label for e in GlueTask("stsb", "").load("test")] == [None, None]
    with pytest.raises(FileNotFoundError, match="tfds build glue/cola"), tfds.testing.mock_data(
            as_dataset_fn=lambda *a, **k: (_ for _ in ()).throw(RuntimeError("not prepared"))):
        GlueTask("cola", "tfds", data_dir="/nonexistent").load("train")
