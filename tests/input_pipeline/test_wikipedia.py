"""Wikipedia XML dumps (input_pipeline/corpora/wikipedia.py, read through sources.read_documents): wikitext →
prose, redirects and non-articles filtered, broken dumps, dump names, the real excerpt in the gensim wheel."""

from __future__ import annotations

import bz2
import json
import re

import pytest

from input_pipeline.corpora import wikipedia
from input_pipeline.corpora.sentences import split_sentences
from input_pipeline.corpora.sources import SourceError, SourceReport, read_documents

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
def test_handmade_dump(tmp_path, name, write_file):
    data = _HANDMADE.encode()
    path = write_file(tmp_path / name, bz2.compress(data) if name.endswith(".bz2") else data)
    report = SourceReport()
    docs = list(read_documents(path, report=report))
    assert docs == [_EXPECTED_HEAVY, split_sentences(_LONG)]
    assert report.filtered == {"redirect": 2, "non_article": 1, "short_article": 1}
    assert not report.skipped and report.documents == 2
    assert json.loads(json.dumps(report.as_dict())) == {
        "files": 1, "documents": 2, "sentences": 9, "skipped": {}, "first_error": None,
        "filtered": {"redirect": 2, "non_article": 1, "short_article": 1}}


def test_broken_dumps(tmp_path, write_file):
    truncated = write_file(tmp_path / "t.xml.bz2", bz2.compress(_HANDMADE.encode())[:-40])
    report = SourceReport()
    list(read_documents(truncated, report=report))
    assert report.skipped == {"bad_xml": 1}
    with pytest.raises(SourceError, match=re.escape(truncated)):
        list(read_documents(truncated, on_error="raise"))
    malformed = write_file(tmp_path / "m.xml", _HANDMADE.replace("</title>", "", 3))
    with pytest.raises(SourceError, match=re.escape(malformed) + r":\d+: malformed XML"):
        list(read_documents(malformed, on_error="raise"))


def test_dump_names():
    assert wikipedia.is_dump_name("gs://b/enwiki-20230601-pages-articles.xml.bz2")
    assert wikipedia.is_dump_name("enwiki-latest-pages-articles1.xml-p10p30302-shortened.bz2")
    assert wikipedia.is_dump_name("/a/pages.XML")
    assert not wikipedia.is_dump_name("corpus.txt") and not wikipedia.is_dump_name("x.bz2")


def test_wikipedia_excerpt(wikipedia_dump):
    path = str(wikipedia_dump)
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
