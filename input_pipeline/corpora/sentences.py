"""Prose → sentences with a few regex rules (no trained model, no nltk): `split_sentences`, which
`input_pipeline.corpora.sources` applies to one-document-per-line text, TFDS documents and the paragraphs
of Wikipedia articles."""

from __future__ import annotations

import re

# Never end a sentence: titles and Latin abbreviations ("Mr. Smith", "et al. (2005)", "approx. 3").
_ABBREVIATIONS = frozenset(
    "mr mrs ms mx messrs dr prof rev hon gen brig col lt maj sgt capt cmdr adm gov sen rep pres"
    " sr jr st mt ft vs viz cf ca approx al inc ltd co corp bros dept univ assn ave blvd".split()
)
# End a sentence unless a number follows ("No. 5", "pp. 12", "Jan. 1990" but "said no. Then").
_NUMBER_ABBREVIATIONS = frozenset(
    "no nos vol vols pp p ch chap sec art fig figs eq eqs op ed ref"
    " jan feb mar apr jun jul aug sep sept oct nov dec".split()
)
_CANDIDATE = re.compile(r"[.!?\u2026]+[\"'\u201d\u2019\u00bb)\]]*(?=\s)|[\u3002\uff01\uff1f]+")
_NEXT_CHAR = re.compile(r"\s+(\S)")
_DOTTED = re.compile(r"(?:[^\W\d_]{1,3}\.)+[^\W\d_]{1,3}")  # e.g, i.e, U.S, a.m, Ph.D


def split_sentences(text: str) -> list[str]:
    """Splits prose into sentences with a few regex rules (no trained model, no nltk).

    A sentence ends at ``.``, ``!``, ``?`` or ``…`` (plus closing quotes/brackets) followed by
    whitespace and a character that is not a lowercase letter, and at ``。！？``. Not at: titles
    and Latin abbreviations (``Mr.``, ``Dr.``, ``e.g.``, ``i.e.``, ``U.S.``, ``et al.``,
    ``approx.``); single capital initials (``J. R. R. Tolkien``); ``No.``/``pp.``/``Fig.``/month
    abbreviations before a number; decimals and URLs (no whitespace after the dot). Line breaks are
    hard boundaries: corpora here put paragraphs, list items and headings on their own lines.
    """
    sentences = []
    for line in text.splitlines():
        start = 0
        for m in _CANDIDATE.finditer(line):
            if _is_boundary(line, m):
                sentences.append(line[start : m.end()].strip())
                start = m.end()
        sentences.append(line[start:].strip())
    return [s for s in sentences if s]


def _is_boundary(line: str, m: re.Match) -> bool:
    if m.group()[0] in "\u3002\uff01\uff1f":
        return True
    nxt = _NEXT_CHAR.match(line, m.end())
    if nxt is None or nxt.group(1).islower():
        return False
    if "!" in m.group() or "?" in m.group() or m.group().startswith(".."):
        return True
    begin = m.start()
    while begin > 0 and not line[begin - 1].isspace():
        begin -= 1
    token = line[begin : m.start()].lstrip("([{\"'\u201c\u2018")
    lower = token.lower()
    if lower in _ABBREVIATIONS or _DOTTED.fullmatch(token):
        return False
    if lower in _NUMBER_ABBREVIATIONS and nxt.group(1).isdigit():
        return False
    return not (len(token) == 1 and token.isupper())  # an initial
