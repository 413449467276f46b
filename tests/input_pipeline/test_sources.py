"""input_pipeline.sources and .wikipedia: text files, Wikipedia dumps, TFDS → documents."""

from __future__ import annotations

import bz2
import json
import re

import pytest
import tensorflow as tf

from input_pipeline import sources, wikipedia
from input_pipeline.package_data import PackageDataError, wikipedia_excerpt
from input_pipeline.sentences import split_sentences
from input_pipeline.sources import (
    SourceError,
    SourceReport,
    documents_dataset,
    list_files,
    read_documents,
)

# --------------------------------------------------------------------------- sentence splitter


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Mr. Smith went to Washington. He arrived at 3.30 p.m. on Monday.",
         ["Mr. Smith went to Washington.", "He arrived at 3.30 p.m. on Monday."]),
        ("J. R. R. Tolkien wrote books. They sold well.",
         ["J. R. R. Tolkien wrote books.", "They sold well."]),
        ("Pi is approx. 3.14159. Really? Yes! See e.g. Euler. Dr. Who, i.e. The Doctor.",
         ["Pi is approx. 3.14159.", "Really?", "Yes!", "See e.g. Euler.",
          "Dr. Who, i.e. The Doctor."]),
        ('"Stop." She left. (It was late.) Then she slept... The end',
         ['"Stop."', "She left.", "(It was late.)", "Then she slept...", "The end"]),
        ("See No. 5 and pp. 12-14. He said no. Then left. Born in Jan. 1990 or so.",
         ["See No. 5 and pp. 12-14.", "He said no.", "Then left.", "Born in Jan. 1990 or so."]),
        ("The U.S. Army won in 1990. 25 saw it at www.example.com. Smith et al. (2005) agree.",
         ["The U.S. Army won in 1990.", "25 saw it at www.example.com.",
          "Smith et al. (2005) agree."]),
        ("lowercase after a period. is no boundary", ["lowercase after a period. is no boundary"]),
        ("Line one\nLine two. Line three.\n\n", ["Line one", "Line two.", "Line three."]),
        ("日本語の文です。二つ目の文！三つ目？", ["日本語の文です。", "二つ目の文！", "三つ目？"]),
        ("   ", []),
    ],
)
def test_split_sentences(text, expected):
    assert split_sentences(text) == expected


# --------------------------------------------------------------------------- text files


def _write(path, data: str | bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return str(path)


def test_bert_format(tmp_path):
    path = _write(tmp_path / "a.txt", "\ufeffFirst doc, line one.\r\nLine two.\r\n\r\n\n\n"
                                      "  Second doc.  \n\nThird doc. Not split here.")
    report = SourceReport()
    docs = list(read_documents(path, report=report))
    assert docs == [["First doc, line one.", "Line two."], ["Second doc."],
                    ["Third doc. Not split here."]]
    assert (report.files, report.documents, report.sentences) == (1, 3, 4)
    assert not report.skipped and report.first_error is None
    assert "3 documents" in report.summary()


def test_doc_per_line_and_empty_documents(tmp_path):
    path = _write(tmp_path / "d.txt", "Mr. Smith left. He came back!\n\nOne more document.\n")
    report = SourceReport()
    docs = list(read_documents(path, format="doc_per_line", report=report))
    assert docs == [["Mr. Smith left.", "He came back!"], ["One more document."]]
    assert report.skipped == {"empty_document": 1}
    assert report.first_error.startswith(f"{path}:2: empty document")
    with pytest.raises(SourceError, match=re.escape(f"{path}:2")):
        list(read_documents(path, format="doc_per_line", on_error="raise"))


def test_globs_dirs_and_comma_lists(tmp_path):
    a1 = _write(tmp_path / "a" / "1.txt", "One.\n")
    a2 = _write(tmp_path / "a" / "2.txt", "Two.\n")
    b3 = _write(tmp_path / "b" / "3.txt", "Three.\n\nFour.\n")
    _write(tmp_path / "a" / "skip.md", "Not matched.\n")
    assert list_files(f"{tmp_path}/a/*.txt") == [a1, a2]
    assert list_files(f" {b3} , {tmp_path}/a/*.txt,{a1}") == [a1, a2, b3]  # sorted, deduplicated
    assert len(list_files(str(tmp_path / "a"))) == 3  # a directory: its files
    report = SourceReport()
    docs = list(read_documents(f"{tmp_path}/*/[0-9].txt", report=report))
    assert docs == [["One."], ["Two."], ["Three."], ["Four."]]
    assert report.files == 3
    shard = list_files(f"{tmp_path}/*/[0-9].txt")[1::2]  # a list spec, as per-host sharding makes
    assert list(read_documents(shard)) == [["Two."]]


def test_missing_paths_raise_source_error(tmp_path):
    missing = str(tmp_path / "nope.txt")
    for spec in (missing, f"{tmp_path}/*.nothing", f"{_write(tmp_path / 'x.txt', 'X.')},{missing}",
                 " , "):
        with pytest.raises(SourceError):
            list_files(spec)
    with pytest.raises(SourceError, match=re.escape(missing)):
        read_documents(missing)  # raised at the call, before any iteration
    with pytest.raises(SourceError, match=re.escape(missing)):
        documents_dataset(missing)
    with pytest.raises(ValueError, match="format"):
        read_documents(str(tmp_path / "x.txt"), format="json")


def test_bad_utf8_skip_and_raise(tmp_path):
    path = _write(tmp_path / "bad.txt", b"Good one.\nGood two.\nBad \xff\xfe byte.\n\nNext doc.\n")
    report = SourceReport()
    docs = list(read_documents(path, report=report))
    assert docs == [["Good one.", "Good two."], ["Next doc."]]
    assert report.skipped == {"bad_utf8": 1}
    assert report.first_error.startswith(f"{path}:3: not valid UTF-8")
    assert f"first: {path}:3" in report.summary()
    with pytest.raises(SourceError, match=re.escape(f"{path}:3: not valid UTF-8")):
        list(read_documents(path, on_error="raise"))


def test_overlong_lines(tmp_path, monkeypatch):
    long_line = "x" * 60
    huge_tail = "y" * 500  # over 4 * max_line_chars bytes: never held whole
    text = f"Short.\n{long_line}\nAlso short.\n\nDoc two.\n{huge_tail}"
    path = _write(tmp_path / "long.txt", text)
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


def test_unreadable_file(tmp_path, monkeypatch):
    path = _write(tmp_path / "locked.txt", "Text.\n")

    def refuse(name, mode="r"):
        raise tf.errors.PermissionDeniedError(None, None, f"{name}; Permission denied")

    monkeypatch.setattr(tf.io.gfile, "GFile", refuse)
    report = SourceReport()
    assert list(read_documents(path, report=report)) == []
    assert report.skipped == {"unreadable": 1} and "Permission denied" in report.first_error
    with pytest.raises(SourceError, match=re.escape(path) + ".*Permission denied"):
        list(read_documents(path, on_error="raise"))


def test_documents_dataset(tmp_path):
    path = _write(tmp_path / "a.txt", "One.\nTwo.\n\nThree.\n")
    ds = documents_dataset(path)
    assert ds.element_spec == tf.TensorSpec([None], tf.string)
    assert [d.tolist() for d in ds.as_numpy_iterator()] == [[b"One.", b"Two."], [b"Three."]]
    bad = _write(tmp_path / "bad.txt", b"Fine.\n\xff\n")
    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(f"{bad}:2")):
        list(documents_dataset(bad, on_error="raise"))


# --------------------------------------------------------------------------- Wikipedia dumps

_HEAVY = """{{Infobox country|name=Freedonia|capital=[[Fredville]]}}
'''Freedonia''' ({{IPA|fri:'do:ni@}}; born {{circa}}) is a [[fictional country|fictional nation]] \
in the [[Marx Brothers]] film.<ref name="a">{{cite web|url=http://x|title=Ref}}</ref> \
Its leader is Rufus T. Firefly.<ref>Plain ref.</ref>
[[File:Flag.png|thumb|The flag, with a [[banner]] caption.]]
<!-- a comment -->
== History ==
The country went to war with [[Sylvania]] in 1933. See [http://example.com the site] for more.
{| class="wikitable"
|-
| cell one || cell two
|}
* a list item
* another list item
=== Economy ===
Its economy is based on &quot;peanuts&quot; &amp; lemonade, e.g. from the capital.
__NOTOC__
== See also ==
The text of this section is not prose about the country.
== References ==
{{reflist}}
[[Category:Fictional countries]]
[[fr:Freedonia]]
"""
_EXPECTED_HEAVY = [
    "Freedonia (born) is a fictional nation in the Marx Brothers film.",
    "Its leader is Rufus T. Firefly.",
    "The country went to war with Sylvania in 1933.",
    "See the site for more.",
    'Its economy is based on "peanuts" & lemonade, e.g. from the capital.',
]


def _page(title, ns, text, redirect=None):
    redirect_tag = f'<redirect title="{redirect}" />' if redirect else ""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return (f"<page><title>{title}</title><ns>{ns}</ns><id>1</id>{redirect_tag}<revision><id>2</id>"
            f'<text xml:space="preserve">{text}</text></revision></page>')


def _dump(*pages):
    return ('<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" version="0.10">'
            "<siteinfo><sitename>Wikipedia</sitename></siteinfo>\n" + "\n".join(pages)
            + "\n</mediawiki>\n")


_LONG = "This plain article has enough words to count. " * 3 + "Its second sentence ends it."
_HANDMADE = _dump(
    _page("Freedonia", 0, _HEAVY),
    _page("Fredonia", 0, "#REDIRECT [[Freedonia]]", redirect="Freedonia"),
    _page("Old name", 0, "#redirect [[Freedonia]]"),
    _page("Talk:Freedonia", 1, _LONG),
    _page("Stub", 0, "'''Stub''' is short.{{stub}}"),
    _page("Plain", 0, _LONG),
)


@pytest.mark.parametrize("name", ["pages.xml", "enwiki-pages-articles1.xml-p1p30.bz2"])
def test_handmade_dump(tmp_path, name):
    data = _HANDMADE.encode()
    path = _write(tmp_path / name, bz2.compress(data) if name.endswith(".bz2") else data)
    report = SourceReport()
    docs = list(read_documents(path, report=report))
    assert docs == [_EXPECTED_HEAVY, split_sentences(_LONG)]
    assert report.filtered == {"redirect": 2, "non_article": 1, "short_article": 1}
    assert not report.skipped and report.documents == 2
    assert json.loads(json.dumps(report.as_dict())) == {
        "files": 1, "documents": 2, "sentences": 9, "skipped": {}, "first_error": None,
        "filtered": {"redirect": 2, "non_article": 1, "short_article": 1}}


def test_broken_dumps(tmp_path):
    truncated = _write(tmp_path / "t.xml.bz2", bz2.compress(_HANDMADE.encode())[:-40])
    report = SourceReport()
    list(read_documents(truncated, report=report))
    assert report.skipped == {"bad_xml": 1}
    with pytest.raises(SourceError, match=re.escape(truncated)):
        list(read_documents(truncated, on_error="raise"))
    malformed = _write(tmp_path / "m.xml", _HANDMADE.replace("</title>", "", 3))
    with pytest.raises(SourceError, match=re.escape(malformed) + r":\d+: malformed XML"):
        list(read_documents(malformed, on_error="raise"))


def test_dump_names():
    assert wikipedia.is_dump_name("gs://b/enwiki-20230601-pages-articles.xml.bz2")
    assert wikipedia.is_dump_name("enwiki-latest-pages-articles1.xml-p10p30302-shortened.bz2")
    assert wikipedia.is_dump_name("/a/pages.XML")
    assert not wikipedia.is_dump_name("corpus.txt") and not wikipedia.is_dump_name("x.bz2")


def test_wikipedia_excerpt():
    try:
        path = str(wikipedia_excerpt())
    except PackageDataError as e:
        pytest.skip(f"gensim's Wikipedia excerpt is not available: {e}")
    report = SourceReport()
    docs = list(read_documents(path, report=report))
    assert 90 <= len(docs) <= 106 and report.sentences > 10_000
    assert report.filtered["redirect"] == 99 and report.filtered["non_article"] == 1
    assert not report.skipped
    sentences = [s for doc in docs for s in doc]
    for markup in ("{{", "}}", "[[", "]]", "<ref", "Category:", "thumb|", "&quot;", "__"):
        assert not [s for s in sentences if markup in s], markup
    assert not [s for s in sentences if s[0] in "|!{*#=:"]
    assert sum("|" in s for s in sentences) <= 3  # a few legitimate pipes in prose
    assert docs[0][0].startswith("Anarchism is a political philosophy")
    assert sum(len(s.split()) for s in sentences) / len(sentences) > 12  # prose, not fragments


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
