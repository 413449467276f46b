"""Wikipedia XML dumps (as Wikimedia publishes them) → plain-prose articles.

`iter_pages` streams ``<page>`` elements with `xml.etree.ElementTree.iterparse` (over a bz2 stream
when the name ends in ``.bz2``; multistream dumps work too) and clears each page, and the root's
list of finished pages, as it goes, so memory stays flat however large the dump is.
Redirects and pages outside the article namespace (``<ns>`` != 0) are skipped.

`wikitext_to_paragraphs` turns wikitext into prose with `mwparserfromhell`, after the rules of
TFDS's ``wikipedia`` builder, made stricter as the BERT paper did ("only the text passages; ignore
lists, tables, and headers"): templates (infoboxes, citations, navboxes), ``<ref>``, tables, lists,
math/code/galleries, preformatted lines, comments, File:/Image:/Media:/Category: and interlanguage
links and bare URLs are dropped; links keep their text; headings are dropped, and so are sections
that hold no prose (References, External links, See also, ...). `read_dump` puts the two together
for `sources.read_documents`.
"""

from __future__ import annotations

import bz2
import collections
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import mwparserfromhell
import tensorflow as tf
from mwparserfromhell import nodes

MIN_ARTICLE_WORDS = 20  # articles with fewer words (stubs, pages that were all lists) are dropped

# File/Image/Media/Category links, and interlanguage links ([[fr:Paris]]: lowercase code, no text).
_DROP_LINK = re.compile(r"^\s*:?\s*(?:(?i:file|image|media|category)|[a-z]{2,3}(?:-[a-z]+)*)\s*:")
_DROP_TAGS = frozenset(
    "ref references table math chem ce code syntaxhighlight source pre gallery imagemap timeline"
    " score graph templatedata inputbox categorytree hiero mapframe maplink noinclude".split()
)
_DROP_SECTIONS = frozenset(
    "references|external links|see also|further reading|notes|footnotes|sources|bibliography"
    "|citations|notes and references|references and notes|works cited|gallery|publications"
    "|selected bibliography|discography|filmography|works|external sources".split("|")
)
_COMMENTS_AND_REFS = re.compile(
    r"<!--.*?(?:-->|\Z)|<ref\b[^>]*?/\s*>|<ref\b[^>]*>.*?</ref\s*>", re.DOTALL | re.IGNORECASE
)
# (span opener, tokens that nest inside a span: group "close" closes one level, any other opens one)
_TEMPLATES = (re.compile(r"\{\{"), re.compile(r"(?P<open>\{\{)|(?P<close>\}\})"))
_FILES = (
    re.compile(r"\[\[\s*:?\s*(?:file|image|media)\s*:", re.IGNORECASE),
    re.compile(r"(?P<open>\[\[)|(?P<close>\]\])"),
)
_TABLES = (
    re.compile(r"^[ \t]*\{\|", re.MULTILINE),
    re.compile(r"(?P<open>^[ \t]*\{\|)|(?P<close>^[ \t]*\|\})", re.MULTILINE),
)
_PREFORMATTED = re.compile(r"^ .*$", re.MULTILINE)  # a line starting with a space: code, verse
_BOLD_ITALIC = re.compile(r"'{5}|'{3}|'{2}")
_SIMPLE_LINK = re.compile(r"\[\[([^\[\]|\n]*)(?:\|([^\[\]]*))?\]\]")
_MAGIC = re.compile(r"__[A-Z]+__")
_EMPTY_PARENS = re.compile(r"\(\s*(?:[,;:.]\s*)*\)")
_LEADING_PUNCT_IN_PARENS = re.compile(r"\(\s*(?:[,;:]\s*)+")
_SPACES = re.compile(r"[ \t\u00a0\u2009\u200b]+")
_SPACE_BEFORE_PUNCT = re.compile(r" +([,.;:!?)])")
_LIST_ITEM = "\x00"  # marks a line that a list item started (lists are not prose: dropped)
_LIST_TAGS = frozenset(("li", "dt", "dd"))
_MARKUP_LINE = re.compile(r"^(?:\x00|=|\{\||\|\}|\||!|\{\{|\}\}|<)")


class WikiFormatError(ValueError):
    """The XML could not be parsed; ``line`` is the 1-based line in the (decompressed) XML."""

    def __init__(self, message: str, line: int | None):
        super().__init__(message)
        self.line = line


@dataclass(frozen=True)
class Page:
    """One ``<page>`` of a dump: ``ns`` namespace (0 = article), ``text`` its raw wikitext."""

    title: str
    ns: int
    redirect: bool
    text: str


def is_dump_name(path: str) -> bool:
    """Whether a name looks like a Wikimedia dump: ``*.xml``, ``*.xml.bz2``, ``*.xml-p1p2.bz2``."""
    name = path.rstrip("/").rsplit("/", 1)[-1].lower()
    return name.endswith(".xml") or (".xml" in name and name.endswith(".bz2"))


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def iter_pages(fileobj, *, compressed: bool) -> Iterator[Page]:
    """Streams the pages of one dump from a binary file object; raises `WikiFormatError`.

    Redirects and non-article pages are yielded too (with ``redirect``/``ns`` set) so callers can
    count them. Truncated bz2 streams and malformed XML raise `WikiFormatError`.
    """
    stream = bz2.BZ2File(fileobj) if compressed else fileobj
    root = None
    try:
        for event, elem in ET.iterparse(stream, events=("start", "end")):
            if root is None:
                root = elem
            if event != "end" or _local(elem.tag) != "page":
                continue
            yield _page_from_element(elem)
            elem.clear()
            root.clear()  # drops the finished pages (and siteinfo) the root still holds
    except ET.ParseError as e:
        raise WikiFormatError(f"malformed XML: {e}", e.position[0]) from e
    except (OSError, EOFError) as e:  # bz2: "Invalid data stream", truncated file
        raise WikiFormatError(f"cannot decompress: {e}", None) from e


def _page_from_element(page: ET.Element) -> Page:
    title, ns, redirect, text = "", 0, False, ""
    for child in page:
        name = _local(child.tag)
        if name == "title":
            title = child.text or ""
        elif name == "ns":
            ns = int((child.text or "0").strip() or 0)
        elif name == "redirect":
            redirect = True
        elif name == "revision":  # article dumps hold one (the latest) revision
            for sub in child:
                if _local(sub.tag) == "text":
                    text = sub.text or ""
    redirect = redirect or text.lstrip()[:9].lower() == "#redirect"
    return Page(title=title, ns=ns, redirect=redirect, text=text)


def _emit(node_list, out: list[str]) -> None:
    """Appends the prose of a list of wikitext nodes to ``out`` (one linear walk, no removals)."""
    for node in node_list:
        if isinstance(node, nodes.Text):
            out.append(node.value)
        elif isinstance(node, nodes.Wikilink):
            title = str(node.title)
            if _DROP_LINK.match(title):
                continue
            if node.text is not None:
                _emit(node.text.nodes, out)
            else:
                out.append(title.strip().lstrip(":"))
        elif isinstance(node, nodes.Tag):
            tag = str(node.tag).strip().lower()
            if tag == "br":
                out.append("\n")
            elif tag in _LIST_TAGS:
                out.append("\n" + _LIST_ITEM)
                if node.contents is not None:
                    _emit(node.contents.nodes, out)
            elif tag not in _DROP_TAGS and node.contents is not None:
                _emit(node.contents.nodes, out)
        elif isinstance(node, nodes.HTMLEntity):
            out.append(node.normalize())
        elif isinstance(node, nodes.ExternalLink):
            if node.brackets and node.title is not None:
                _emit(node.title.nodes, out)
        elif isinstance(node, nodes.Heading):
            out.append("\n")
        # Template, Comment, Argument and anything else: dropped.


def _drop_nested(text: str, opener: re.Pattern, tokens: re.Pattern) -> str:
    """Cuts out each span that ``opener`` starts, up to its matching ``close`` token (linear scan).

    An unbalanced span (broken markup) is left as it is, for the parser to deal with.
    """
    out, pos, search_from = [], 0, 0
    while (start := opener.search(text, search_from)) is not None:
        depth, search_from = 1, start.end()
        for m in tokens.finditer(text, start.end()):
            depth += -1 if m.lastgroup == "close" else 1
            if depth == 0:
                out.append(text[pos : start.start()])
                pos = search_from = m.end()
                break
    out.append(text[pos:])
    return "".join(out)


def _pre_clean(wikitext: str) -> str:
    """Removes comments, refs, templates, File:/Image: links and tables with a linear scan.

    They are most of an article's markup; cutting them before parsing makes `mwparserfromhell`
    several times faster and also catches refs and captions it leaves as text when markup breaks.
    """
    text = _COMMENTS_AND_REFS.sub("", wikitext)
    for opener, tokens in (_TEMPLATES, _FILES, _TABLES):
        text = _drop_nested(text, opener, tokens)
    text = _BOLD_ITALIC.sub("", _PREFORMATTED.sub("", text))
    return _SIMPLE_LINK.sub(_link_text, text)


def _link_text(m: re.Match) -> str:
    """``[[target|text]]`` → text, ``[[target]]`` → target; "" for File:, Category:, [[fr:x]]."""
    target, text = m.group(1), m.group(2)
    if _DROP_LINK.match(target):
        return ""
    return text or target.strip().lstrip(":")


def wikitext_to_paragraphs(wikitext: str) -> list[str]:
    """The plain-prose paragraphs of one article's wikitext, one string each (see module doc)."""
    code = mwparserfromhell.parse(_pre_clean(wikitext))
    out: list[str] = []
    skip_level = None  # while set, we are inside a dropped section of this heading level
    for node in code.nodes:
        if isinstance(node, nodes.Heading):
            if skip_level is not None and node.level > skip_level:
                continue
            title = node.title.strip_code().strip().lower()
            skip_level = node.level if title in _DROP_SECTIONS else None
            out.append("\n")
        elif skip_level is None:
            _emit((node,), out)
    text = _MAGIC.sub("", "".join(out))
    text = _LEADING_PUNCT_IN_PARENS.sub("(", _EMPTY_PARENS.sub("", text))
    text = _SPACE_BEFORE_PUNCT.sub(r"\1", _SPACES.sub(" ", text))
    paragraphs = []
    for line in text.split("\n"):
        line = line.strip()
        if line and not _MARKUP_LINE.match(line) and any(c.isalpha() for c in line):
            paragraphs.append(line)
    return paragraphs


def read_dump(
    path: str,
    *,
    bad: Callable[[str, str, str], None],
    filtered: collections.Counter,
    split: Callable[[str], list[str]],
    max_line_chars: int,
) -> Iterator[list[str]]:
    """Articles of one dump (local or ``gs://``) as lists of sentences (``split`` per paragraph).

    Redirects, non-article pages and articles under `MIN_ARTICLE_WORDS` words are counted in
    ``filtered``. Bad input is handed to ``bad(reason, location, message)``, which may raise: broken
    XML or bz2 (``bad_xml``, ends the file), an I/O error (``unreadable``), wikitext the parser
    rejects (``bad_wikitext``, skips the page), a paragraph over ``max_line_chars``
    (``line_too_long``, drops the paragraph).
    """
    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            for page in iter_pages(f, compressed=path.endswith(".bz2")):
                if page.ns != 0 or page.redirect:
                    filtered["non_article" if page.ns != 0 else "redirect"] += 1
                    continue
                where = f"{path}: page {page.title!r}"
                try:
                    paragraphs = wikitext_to_paragraphs(page.text)
                except Exception as e:  # mwparserfromhell.parser.ParserError and the like
                    bad("bad_wikitext", where, f"cannot parse wikitext: {e}")
                    continue
                if any(len(p) > max_line_chars for p in paragraphs):
                    bad("line_too_long", where, f"paragraph over max_line_chars={max_line_chars}")
                    paragraphs = [p for p in paragraphs if len(p) <= max_line_chars]
                sentences = [s for p in paragraphs for s in split(p)]
                if sum(len(s.split()) for s in sentences) < MIN_ARTICLE_WORDS:
                    filtered["short_article"] += 1
                    continue
                yield sentences
    except WikiFormatError as e:
        bad("bad_xml", f"{path}:{e.line}" if e.line else path, str(e))
    except (OSError, tf.errors.OpError) as e:
        bad("unreadable", path, f"cannot read: {getattr(e, 'message', None) or e}")
