"""Fixtures shared by the input_pipeline tests: synthetic token documents (for the example builders),
pseudo-prose text (for vocabulary training) and the real MiniLM WordPiece tokenizer."""

from __future__ import annotations

import random

import pytest


def _make_docs(num_docs=40, seed=0, sent_len=(3, 12), sents=(1, 30)):
    """Documents of sentences of token ids; token = 1000 + doc * 10**6 + its position in the document.
    Returns (docs, where) with where[token] = (doc, sentence, position)."""
    rng = random.Random(seed)
    docs, where = [], {}
    for d in range(num_docs):
        doc, pos = [], 0
        for i in range(rng.randint(*sents)):
            sentence = []
            for _ in range(rng.randint(*sent_len)):
                token = 1000 + d * 10**6 + pos
                where[token] = (d, i, pos)
                sentence.append(token)
                pos += 1
            doc.append(sentence)
        docs.append(doc)
    return docs, where


@pytest.fixture(scope="session")
def make_docs():
    """``make_docs(num_docs=40, seed=0, sent_len=(3, 12), sents=(1, 30))`` → (docs, where)."""
    return _make_docs


def _write_prose_corpus(path, n_sentences: int = 3000, seed: int = 0) -> str:
    """Pseudo-prose in BERT format (a sentence a line, blank line between documents): a Zipfian
    lexicon of syllable words, capitals, accents, digits and punctuation."""
    rng = random.Random(seed)
    syllables = "ka lo mi ne su ra to vi pe da shi qua ber ton ex ing al um or".split()
    lexicon = sorted({"".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(1500)})
    rng.shuffle(lexicon)
    lexicon[5:5] = ["café", "naïve", "Zürich", "São", "the", "of"]
    weights = [1 / (i + 1) for i in range(len(lexicon))]
    lines = []
    for i in range(n_sentences):
        words = rng.choices(lexicon, weights, k=rng.randint(4, 14))
        words[0] = words[0].capitalize()
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), rng.choice([str(rng.randint(0, 2024)), "(x)", ","]))
        lines.append(" ".join(words) + rng.choice(".?!"))
        if i % 10 == 9:
            lines.append("")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="session")
def write_prose_corpus():
    """``write_prose_corpus(path, n_sentences=3000, seed=0)`` writes pseudo-prose there; → str(path)."""
    return _write_prose_corpus


@pytest.fixture(scope="session")
def minilm_tokenizer(minilm_dir):
    """WordPiece over the real MiniLM (bert-base uncased) vocabulary."""
    from input_pipeline.tokenizers.wordpiece import WordPieceTokenizer

    return WordPieceTokenizer(minilm_dir / "vocab.txt")


def _write_file(path, data: str | bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return str(path)


@pytest.fixture(scope="session")
def write_file():
    """``write_file(path, text_or_bytes)``: writes it (making its directory); → str(path)."""
    return _write_file
