"""GLUE: parsing the official TSV formats, features, metrics, prediction files, TFDS source."""

import logging
import math
import random

import numpy as np
import pytest
import tensorflow as tf

from input_pipeline.tasks.base import TaskDataError
from input_pipeline.tasks.glue import GLUE_TASKS, GlueExample, GlueTask
from input_pipeline.tasks.glue_features import truncate_seq_pair
from input_pipeline.tasks.metrics import glue_metrics, summarize_seeds
from input_pipeline.tokenizers import WordPieceTokenizer

PAIRS = [  # (sentence a, sentence b) from the real GLUE files; quotes and spaces kept as there
    ('Amrozi accused his brother , whom he called " the witness " , of deliberately distorting his evidence .',
     'Referring to him as only " the witness " , Amrozi accused his brother of deliberately distorting his evidence .'),
    ('" Yucaipa owned Dominick \'s before selling the chain to Safeway in 1998 for $ 2.5 billion .',
     "Yucaipa bought Dominick 's in 1995 for $ 693 million and sold it to Safeway for $ 1.8 billion in 1998 ."),
    ("A plane is taking off.", "An air plane is taking off."),
    ("How do I read and find my YouTube comments?", "How can I see all my Youtube comments?"),
    ("Conceptually cream skimming has two basic dimensions - product and geography.",
     "Product and geography are what make cream skimming work. "),
    ("When did the third Digimon series begin?",
     "Unlike the two seasons before it and most of the seasons that followed, Digimon Tamers takes a darker "
     "and more realistic approach to its story."),
    ("No Weapons of Mass Destruction Found in Iraq Yet.", "Weapons of Mass Destruction Found in Iraq."),
    ("I stuck a pin through a carrot. When I pulled the pin out, it had a hole.", "The carrot had a hole."),
    ("The sailors rode the breeze clear of the rocks.", "The weights made the rope stretch over the pulley."),
    ("hide new secretions from the parental units ", "contains no wit , only labored gags "),
    ("Our friends won't buy this analysis, let alone the next one we propose.", "They drank the pub."),
    ("Why am I mentally very lonely? How can I solve it?",
     "Find the remainder when [math]23^{24}[/math] is divided by 24,23?"),
]
N = len(PAIRS)
LABELS = {"cola": "01", "sst2": "01", "mrpc": "01", "qqp": "01", "wnli": "01",
          "mnli": ("neutral", "contradiction", "entailment"), "qnli": ("entailment", "not_entailment"),
          "rte": ("not_entailment", "entailment"), "stsb": ("5.000", "3.800", "0.250", "1.5")}
HEADERS = {  # the official header lines (CoLA train/dev have none)
    "cola": (None, "index\tsentence"), "sst2": ("sentence\tlabel", "index\tsentence"),
    "mrpc": ("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String", "index\t#1 ID\t#2 ID\t#1 String\t#2 String"),
    "stsb": ("index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore",
             "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"),
    "qqp": ("id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate", "id\tquestion1\tquestion2"),
    "qnli": ("index\tquestion\tsentence\tlabel", "index\tquestion\tsentence"),
    **{t: ("index\tsentence1\tsentence2\tlabel", "index\tsentence1\tsentence2") for t in ("rte", "wnli", "ax")},
}
MNLI_COLS = "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t" \
            "sentence1_parse\tsentence2_parse\tsentence1\tsentence2"
FOLDERS = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B", "qqp": "QQP", "mnli": "MNLI",
           "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI", "ax": "diagnostic"}
# Malformed rows appended to one labelled file per task: (task, file, row, what the report says).
BAD = [("cola", "dev", "gj04\t2\t\tThe label is two.", "unknown label '2'"),
       ("cola", "dev", "gj04\t1\tOnly three columns.", "3 columns, expected 4"),
       ("mrpc", "dev", "1\t1\t2\tonly one sentence", "4 columns, expected 5"),
       ("stsb", "dev", "\t".join(["99", "g", "f", "y", "o", "s", "s", "a", "b", "n/a"]), "score 'n/a' is not"),
       ("qqp", "train", "99\t1\t2\tquestion without its pair?\t0", "5 columns, expected 6"),
       ("mnli", "dev_matched", "\t".join(["99"] + ["x"] * 14 + ["-"]), "unknown label '-'"),
       ("rte", "dev", "99\ta\tb\tentails", "unknown label 'entails'")]


def official_row(task, split, i):
    """Row i in the official column order, built by position (not by header name)."""
    a, b = PAIRS[i]
    lab = LABELS.get(task, "-")[i % len(LABELS.get(task, "-"))]
    idx, labelled = str(100 + i), not split.startswith("test")
    if task == "cola":
        return ["gj04", lab, "" if lab == "1" else "*", a] if labelled else [idx, a]
    if task == "sst2":
        return [a, lab] if labelled else [idx, a]
    if task == "mrpc":
        return [lab if labelled else idx, str(702876 + i), str(702977 + i), a, b]
    if task == "stsb":
        return [idx, "main-captions", "MSRvid", "2012test", f"{i:04d}", "none", "none", a, b] + [lab] * labelled
    if task == "qqp":
        return [idx, str(2 * i + 1), str(2 * i + 2), a, b, lab] if labelled else [idx, a, b]
    if task == "mnli":
        parses = ["( ( Conceptually ( cream skimming ) ) ( ... ) )", "( Product ( and geography ) )",
                  "(ROOT (S (NP (JJ Conceptually)) ...))", "(ROOT (S (NP (NN Product)) ...))"]
        labels = [] if not labelled else [lab, lab] if split == "train" else [lab] * 6
        return [idx, str(31193 + i), f"{31193 + i}n", "government", *parses, a, b, *labels]
    return [idx, a, b] + [lab] * labelled  # qnli, rte, wnli, ax


def write_glue(root):
    for task, folder in FOLDERS.items():
        for split in GlueTask(task, "tfds").splits:
            if task == "mnli" and split == "ax":  # MNLI predicts AX from diagnostic/diagnostic.tsv
                continue
            labelled = not split.startswith("test")
            header = HEADERS[task][not labelled] if task != "mnli" else MNLI_COLS if not labelled else \
                MNLI_COLS + ("\tlabel1" if split == "train" else "\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5") + \
                "\tgold_label"
            lines = ([header] if header else []) + ["\t".join(official_row(task, split, i)) for i in range(N)]
            lines += [row for t, f, row, _ in BAD if (t, f) == (task, split)]
            name = "diagnostic.tsv" if task == "ax" else f"{split}.tsv"
            (root / folder).mkdir(exist_ok=True)
            (root / folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("glue")
    write_glue(root)
    return root


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "?", "the", "a", "plane", "is", "taking",
             "off", "air", "an", "##s"] + [f"w{i}" for i in range(40)] + [f"v{i}" for i in range(40)]
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(words) + "\n")
    return WordPieceTokenizer(path)


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize("task", GLUE_TASKS)
def test_every_split_of_every_task_parses(glue_dir, task, caplog):
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


def test_malformed_rows_raise_with_file_and_line(glue_dir):
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


# --------------------------------------------------------------------------- features


def google_truncate(a, b, max_length):
    """run_classifier.py's _truncate_seq_pair, verbatim in spirit."""
    a, b = list(a), list(b)
    while len(a) + len(b) > max_length:
        (a if len(a) > len(b) else b).pop()
    return len(a), len(b)


def test_truncate_seq_pair_matches_google():
    rng = random.Random(0)
    cases = [(rng.randrange(40), rng.randrange(40), rng.randrange(0, 50)) for _ in range(2000)]
    la, lb, m = (np.array(x) for x in zip(*cases, strict=True))
    ta, tb = truncate_seq_pair(la, lb, m)
    assert list(zip(ta.tolist(), tb.tolist(), strict=True)) == [
        google_truncate(range(x), range(y), z) for x, y, z in cases]


def test_featurize_pairs_exact_ids_truncation_padding(tok):
    t = GlueTask("stsb", "tfds")
    long_a, long_b = " ".join(f"w{i}" for i in range(10)), " ".join(f"v{i}" for i in range(4))
    examples = [GlueExample("0", "A plane is taking off.", "An air plane is taking off.", 4.5),
                GlueExample("1", long_a, long_b, 1.0), GlueExample("2", "w1", "v1 v2", None)]
    f = t.featurize(examples, tok, 12)
    assert set(f) == {"input_ids", "input_mask", "segment_ids", "example_index", "label"}
    assert all(v.dtype == np.int32 for k, v in f.items() if k != "label") and f["label"].dtype == np.float32
    np.testing.assert_array_equal(f["label"], [4.5, 1.0, 0.0])
    np.testing.assert_array_equal(f["example_index"], [0, 1, 2])
    ids, segs = tok.encode(examples[0].text_a, examples[0].text_b)  # untruncated: 6 + 7 tokens + 3
    a_len = segs.count(0) - 2
    assert (a_len, len(ids) - a_len - 3) == (6, 7)
    ta, tb = google_truncate(range(6), range(7), 12 - 3)
    assert (ta, tb) == (5, 4)
    want = ids[:1 + ta] + [tok.sep_id] + ids[a_len + 2:a_len + 2 + tb] + [tok.sep_id]
    assert f["input_ids"][0].tolist() == want and len(want) == 12
    assert f["segment_ids"][0].tolist() == [0] * (ta + 2) + [1] * (tb + 1)
    assert tok.id_to_token(f["input_ids"][1]) == (
        ["[CLS]"] + [f"w{i}" for i in range(5)] + ["[SEP]"] + [f"v{i}" for i in range(4)] + ["[SEP]"])
    assert f["input_mask"][1].tolist() == [1] * 12
    assert tok.id_to_token(f["input_ids"][2]) == ["[CLS]", "w1", "[SEP]", "v1", "v2", "[SEP]"] + ["[PAD]"] * 6
    assert f["input_mask"][2].tolist() == [1] * 6 + [0] * 6
    assert f["segment_ids"][2].tolist() == [0, 0, 0, 1, 1, 1] + [0] * 6


def test_featurize_single_sentences(tok):
    t = GlueTask("cola", "tfds")
    examples = [GlueExample("0", "the plane .", None, 1), GlueExample("1", " ".join(f"w{i}" for i in range(9)),
                                                                      None, 0)]
    f = t.featurize(examples, tok, 6)
    assert f["input_ids"][0].tolist() == tok.encode("the plane .")[0] + [0]
    assert tok.id_to_token(f["input_ids"][1]) == ["[CLS]", "w0", "w1", "w2", "w3", "[SEP]"]
    assert f["segment_ids"].sum() == 0 and f["input_mask"][0].tolist() == [1] * 5 + [0]
    assert f["label"].dtype == np.int32 and f["label"].tolist() == [1, 0]
    empty = t.featurize([], tok, 6)
    assert empty["input_ids"].shape == (0, 6) and empty["label"].shape == (0,)
    with pytest.raises(ValueError, match="at least 3"):
        t.featurize(examples, tok, 2)


def test_featurize_loaded_task(glue_dir, tok):
    t = GlueTask("mnli", str(glue_dir))
    examples = t.load("test_mismatched")
    f = t.featurize(examples, tok, 32)
    assert f["input_ids"].shape == (N, 32) and not f["label"].any()
    ids, segs = tok.encode(examples[2].text_a, examples[2].text_b)
    assert f["input_ids"][2, :len(ids)].tolist() == ids and f["segment_ids"][2, :len(ids)].tolist() == segs


# --------------------------------------------------------------------------- metrics


def test_glue_metrics_by_hand():
    labels, preds = [1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 1]  # TP 3, FN 1, TN 1, FP 1
    assert glue_metrics("cola", labels, preds) == {"matthews_corr": pytest.approx(0.25), "score": pytest.approx(0.25)}
    m = glue_metrics("mrpc", labels, preds)  # precision = recall = 3/4
    assert m == pytest.approx({"f1": 0.75, "accuracy": 4 / 6, "score": (0.75 + 4 / 6) / 2})
    assert glue_metrics("qqp", labels, preds) == m
    assert glue_metrics("rte", labels, preds) == pytest.approx({"accuracy": 4 / 6, "score": 4 / 6})
    assert glue_metrics("mnli", [0, 1, 2, 2], [0, 1, 1, 2]) == {"accuracy": 0.75, "score": 0.75}
    r = 9 / math.sqrt(84)  # labels 1,2,3 vs 1,2,4: cov 3, variances 2 and 42/9
    assert glue_metrics("stsb", [1.0, 2.0, 3.0], [1.0, 2.0, 4.0]) == pytest.approx(
        {"pearson": r, "spearman": 1.0, "score": (r + 1) / 2})
    assert glue_metrics("cola", [0, 1, 1], [1, 1, 1])["matthews_corr"] == 0.0  # constant prediction
    assert glue_metrics("mrpc", [1, 1], [0, 0])["f1"] == 0.0
    assert math.isnan(glue_metrics("stsb", [1.0, 2.0], [3.0, 3.0])["pearson"])
    with pytest.raises(ValueError, match="unknown GLUE task"):
        glue_metrics("squad", [1], [1])
    with pytest.raises(ValueError, match="equal-length"):
        glue_metrics("rte", [1, 0], [1])
    with pytest.raises(ValueError, match="class indices"):
        glue_metrics("rte", [1.0, 0.0], [0.5, 0.2])


def test_summarize_seeds():
    assert summarize_seeds([0.5, 0.9, 0.7, float("nan")]) == pytest.approx(
        {"median": 0.7, "mean": 0.7, "min": 0.5, "max": 0.9, "n": 3, "n_nan": 1})
    assert summarize_seeds([1, 2, 3, 4])["median"] == 2.5
    with pytest.raises(ValueError, match="no values"):
        summarize_seeds([])


def test_evaluate_from_logits(glue_dir, tok):
    t = GlueTask("mrpc", str(glue_dir))
    examples = t.load("dev")
    f = t.featurize(examples, tok, 16)
    preds = np.array([1, 0] * 6)
    logits = np.eye(2, dtype=np.float32)[preds] * 3 - 1
    labels = [e.label for e in examples]
    assert t.evaluate(examples, f, {"logits": logits}) == glue_metrics("mrpc", labels, preds)
    with pytest.raises(ValueError, match=r"do not match logits \[12, 2\]"):
        t.evaluate(examples, f, {"logits": logits[:, :1]})
    test = t.load("test")
    with pytest.raises(ValueError, match="labelled split"):
        t.evaluate(test, t.featurize(test, tok, 16), {"logits": logits})
    s = GlueTask("stsb", str(glue_dir))
    ex = s.load("dev")
    got = s.evaluate(ex, s.featurize(ex, tok, 16), {"predictions": np.arange(N, dtype=np.float32)[:, None]})
    assert got == glue_metrics("stsb", [e.label for e in ex], np.arange(N, dtype=np.float64))


# --------------------------------------------------------------------------- prediction files


def test_write_predictions_in_server_format(glue_dir, tok, tmp_path):
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
    paths = rte.write_predictions(ex, rte.featurize(ex, tok, 8), {"logits": logits}, tmp_path / "out", "test")
    assert paths == [tmp_path / "out" / "RTE.tsv"]
    lines = paths[0].read_text().splitlines()
    assert lines[:4] == ["index\tprediction", "100\tnot_entailment", "101\tentailment", "102\tentailment"]
    assert len(lines) == N + 1 and sorted(p.name for p in (tmp_path / "out").iterdir()) == ["RTE.tsv"]

    cola = GlueTask("cola", str(glue_dir))
    ex = cola.load("test")
    p = cola.write_predictions(ex, cola.featurize(ex, tok, 8), {"logits": logits}, tmp_path, "test")[0]
    assert p.read_text().splitlines()[1:3] == ["100\t1", "101\t0"]

    stsb = GlueTask("stsb", str(glue_dir))
    ex = stsb.load("test")[:3]
    p = stsb.write_predictions(ex, stsb.featurize(ex, tok, 8), {"predictions": np.array([-0.2, 2.34567, 5.7])},
                               tmp_path, "test")[0]
    assert p.read_text() == "index\tprediction\n100\t0.000\n101\t2.346\n102\t5.000\n"

    mnli = GlueTask("mnli", str(glue_dir))
    ex = mnli.load("dev_mismatched")[:3]
    p = mnli.write_predictions(ex, mnli.featurize(ex, tok, 8), {"logits": np.eye(3)}, tmp_path, "dev_mismatched")[0]
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
