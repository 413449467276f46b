"""input_pipeline.corpora.sources: text files (bert and doc_per_line formats, globs, bad input) and TFDS →
documents. Wikipedia dumps: test_wikipedia.py."""

from __future__ import annotations

import re

import pytest
import tensorflow as tf

from input_pipeline.corpora import sources
from input_pipeline.corpora.sources import (
    SourceError,
    SourceReport,
    documents_dataset,
    list_files,
    read_documents,
)

# --------------------------------------------------------------------------- text files


def test_bert_format(tmp_path, write_file):
    path = write_file(tmp_path / "a.txt", "\ufeffFirst doc, line one.\r\nLine two.\r\n\r\n\n\n"
                                      "  Second doc.  \n\nThird doc. Not split here.")
    report = SourceReport()
    docs = list(read_documents(path, report=report))
    assert docs == [["First doc, line one.", "Line two."], ["Second doc."],
                    ["Third doc. Not split here."]]
    assert (report.files, report.documents, report.sentences) == (1, 3, 4)
    assert not report.skipped and report.first_error is None
    assert "3 documents" in report.summary()


def test_doc_per_line_and_empty_documents(tmp_path, write_file):
    path = write_file(tmp_path / "d.txt", "Mr. Smith left. He came back!\n\nOne more document.\n")
    report = SourceReport()
    docs = list(read_documents(path, format="doc_per_line", report=report))
    assert docs == [["Mr. Smith left.", "He came back!"], ["One more document."]]
    assert report.skipped == {"empty_document": 1}
    assert report.first_error.startswith(f"{path}:2: empty document")
    with pytest.raises(SourceError, match=re.escape(f"{path}:2")):
        list(read_documents(path, format="doc_per_line", on_error="raise"))


def test_globs_dirs_and_comma_lists(tmp_path, write_file):
    a1 = write_file(tmp_path / "a" / "1.txt", "One.\n")
    a2 = write_file(tmp_path / "a" / "2.txt", "Two.\n")
    b3 = write_file(tmp_path / "b" / "3.txt", "Three.\n\nFour.\n")
    write_file(tmp_path / "a" / "skip.md", "Not matched.\n")
    assert list_files(f"{tmp_path}/a/*.txt") == [a1, a2]
    assert list_files(f" {b3} , {tmp_path}/a/*.txt,{a1}") == [b3, a1, a2]  # the parts' order, a glob sorted, once
    assert len(list_files(str(tmp_path / "a"))) == 3  # a directory: its files
    report = SourceReport()
    docs = list(read_documents(f"{tmp_path}/*/[0-9].txt", report=report))
    assert docs == [["One."], ["Two."], ["Three."], ["Four."]]
    assert report.files == 3
    shard = list_files(f"{tmp_path}/*/[0-9].txt")[1::2]  # a list spec, as per-host sharding makes
    assert list(read_documents(shard)) == [["Two."]]


def test_the_order_is_the_specs_not_where_the_files_lie(tmp_path, write_file):
    """The same two files, the second under a directory that sorts before the first's or after it
    (a demo's workdir against the package cache): the same documents in the same order, so the
    same held-out split (every n-th document)."""
    task = write_file(tmp_path / "m" / "task.txt", "Task one.\n\nTask two.\n")
    before, after = (write_file(tmp_path / d / "wiki.txt", "Wiki one.\n\nWiki two.\n") for d in ("a", "z"))
    docs = [list(read_documents(f"{task},{wiki}")) for wiki in (before, after)]
    assert docs[0] == docs[1] == [["Task one."], ["Task two."], ["Wiki one."], ["Wiki two."]]
    assert [f.rsplit("/", 2)[-2] for f in list_files(f"{before},{task}")] == ["a", "m"]


def test_missing_paths_raise_source_error(tmp_path, write_file):
    missing = str(tmp_path / "nope.txt")
    for spec in (missing, f"{tmp_path}/*.nothing", f"{write_file(tmp_path / 'x.txt', 'X.')},{missing}",
                 " , "):
        with pytest.raises(SourceError):
            list_files(spec)
    with pytest.raises(SourceError, match=re.escape(missing)):
        read_documents(missing)  # raised at the call, before any iteration
    with pytest.raises(SourceError, match=re.escape(missing)):
        documents_dataset(missing)
    with pytest.raises(ValueError, match="format"):
        read_documents(str(tmp_path / "x.txt"), format="json")


def test_bad_utf8_skip_and_raise(tmp_path, write_file):
    path = write_file(tmp_path / "bad.txt", b"Good one.\nGood two.\nBad \xff\xfe byte.\n\nNext doc.\n")
    report = SourceReport()
    docs = list(read_documents(path, report=report))
    assert docs == [["Good one.", "Good two."], ["Next doc."]]
    assert report.skipped == {"bad_utf8": 1}
    assert report.first_error.startswith(f"{path}:3: not valid UTF-8")
    assert f"first: {path}:3" in report.summary()
    with pytest.raises(SourceError, match=re.escape(f"{path}:3: not valid UTF-8")):
        list(read_documents(path, on_error="raise"))


def test_overlong_lines(tmp_path, monkeypatch, write_file):
    long_line = "x" * 60
    huge_tail = "y" * 500  # over 4 * max_line_chars bytes: never held whole
    text = f"Short.\n{long_line}\nAlso short.\n\nDoc two.\n{huge_tail}"
    path = write_file(tmp_path / "long.txt", text)
    monkeypatch.setattr(sources, "_CHUNK", 7)  # lines straddle many read() chunks
    report = SourceReport()
    docs = list(read_documents(path, max_line_chars=50, report=report))
    assert docs == [["Short.", "Also short."], ["Doc two."]]
    assert report.skipped == {"line_too_long": 2}
    assert report.first_error.startswith(f"{path}:2: line over max_line_chars=50")
    with pytest.raises(SourceError, match=re.escape(f"{path}:2")):
        list(read_documents(path, max_line_chars=50, on_error="raise"))
    assert list(read_documents(path)) == [["Short.", long_line, "Also short."],
                                          ["Doc two.", huge_tail]]


def test_unreadable_file(tmp_path, monkeypatch, write_file):
    path = write_file(tmp_path / "locked.txt", "Text.\n")

    def refuse(name, mode="r"):
        raise tf.errors.PermissionDeniedError(None, None, f"{name}; Permission denied")

    monkeypatch.setattr(tf.io.gfile, "GFile", refuse)
    report = SourceReport()
    assert list(read_documents(path, report=report)) == []
    assert report.skipped == {"unreadable": 1} and "Permission denied" in report.first_error
    with pytest.raises(SourceError, match=re.escape(path) + ".*Permission denied"):
        list(read_documents(path, on_error="raise"))


def test_documents_dataset(tmp_path, write_file):
    path = write_file(tmp_path / "a.txt", "One.\nTwo.\n\nThree.\n")
    ds = documents_dataset(path)
    assert ds.element_spec == tf.TensorSpec([None], tf.string)
    assert [d.tolist() for d in ds.as_numpy_iterator()] == [[b"One.", b"Two."], [b"Three."]]
    bad = write_file(tmp_path / "bad.txt", b"Fine.\n\xff\n")
    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(f"{bad}:2")):
        list(documents_dataset(bad, on_error="raise"))


# --------------------------------------------------------------------------- TFDS


def test_tfds_by_name_with_mock_data():
    tfds = pytest.importorskip("tensorflow_datasets")
    seen = {}

    def as_dataset(self, split, *args, **kwargs):
        seen["name"], seen["split"] = self.name, str(split)
        return tf.data.Dataset.from_tensor_slices({
            "title": ["A", "B", "C", "D"],
            "text": ["Mr. Smith came. He left!\n\nNew paragraph.", "", b"Bad \xff", "Fine."],
        })

    with tfds.testing.mock_data(as_dataset_fn=as_dataset):
        report = SourceReport()
        docs = list(read_documents("tfds:wikipedia/20230601.en:validation", report=report))
        assert docs == [["Mr. Smith came.", "He left!", "New paragraph."], ["Fine."]]
        assert seen == {"name": "wikipedia", "split": "validation"}
        assert report.skipped == {"empty_document": 1, "bad_utf8": 1}
        assert report.first_error.startswith("tfds:wikipedia/20230601.en:validation#1")
        with pytest.raises(SourceError, match="no text field 'body'"):
            read_documents("tfds:wikipedia/20230601.en", text_field="body")
        ds = documents_dataset("tfds:wikipedia/20230601.en", text_field="title")
        assert [d.tolist() for d in ds.as_numpy_iterator()] == [[b"A"], [b"B"], [b"C"], [b"D"]]
    with tfds.testing.mock_data(num_examples=3):  # random text, default split "train"
        assert len(list(read_documents("tfds:wikipedia/20230601.en"))) == 3
    with pytest.raises(SourceError, match="no TFDS dataset named 'no_such_dataset'"):
        read_documents("tfds:no_such_dataset")
    with pytest.raises(SourceError, match="TFDS dataset, not files"):
        list_files("tfds:c4/en")
