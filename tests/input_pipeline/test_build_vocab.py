"""input_pipeline.build_vocab: WordPiece and SentencePiece vocabularies trained from a corpus."""

from __future__ import annotations

import subprocess
import sys

import pytest
import tensorflow as tf

from input_pipeline.build_vocab import build_vocab, train_vocab
from input_pipeline.corpora.sources import SourceError
from input_pipeline.tokenizers.factory import load_tokenizer
from input_pipeline.tokenizers.sentencepiece_model import SentencePieceTokenizer
from input_pipeline.tokenizers.vocab import SPECIAL_TOKENS, infer_lower_case, load_vocab
from input_pipeline.tokenizers.wordpiece import WordPieceTokenizer


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, write_prose_corpus):
    return write_prose_corpus(tmp_path_factory.mktemp("corpus") / "corpus.txt")


@pytest.fixture(scope="module")
def sentences(corpus):
    return [line for line in open(corpus, encoding="utf-8").read().splitlines() if line]


@pytest.fixture(scope="module")
def wordpiece(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("wp")
    return train_vocab(corpus, out, model_type="wordpiece", vocab_size=400)


def _unk_rate(tokenizer, texts) -> float:
    ids = tokenizer.tokenize(tf.constant(texts)).flat_values.numpy()
    return float((ids == tokenizer.unk_id).mean())


# --------------------------------------------------------------------------- WordPiece


def test_wordpiece_vocab_layout(wordpiece):
    vocab = load_vocab(wordpiece.path)
    assert wordpiece.path.name == "vocab.txt"
    assert vocab[:5] == list(SPECIAL_TOKENS)  # [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4
    assert 380 <= len(vocab) <= 400 and wordpiece.vocab_size == len(vocab)
    assert infer_lower_case(vocab)  # uncased: no upper-case token
    assert "##" + "a" in vocab and "a" in vocab and any(t.startswith("##") and len(t) > 3 for t in vocab)
    assert wordpiece.sentences == 3000
    assert sorted(p.name for p in wordpiece.path.parent.iterdir()) == ["vocab.txt"]  # no temp files


def test_wordpiece_loads_and_round_trips(wordpiece, sentences):
    tok = WordPieceTokenizer(wordpiece.path)
    assert tok.lower_case and tok.pad_id == 0 and tok.unk_id == 1 and tok.mask_id == 4
    assert _unk_rate(tok, sentences) < 0.001
    assert wordpiece.unk_rate < 0.001
    texts = sentences[:200]
    words = tok.words(tf.constant(texts)).to_list()
    for text, row, expected in zip(texts, tok.tokenize(tf.constant(texts)).to_list(), words, strict=True):
        joined = " ".join(tok.id_to_token(row)).replace(" ##", "")
        assert joined == " ".join(w.decode() for w in expected), text
    ids, _ = tok.encode("Zürich café")
    assert tok.id_to_token(ids)[0] == "[CLS]" and "".join(tok.id_to_token(ids)[1:-1]).startswith("zu")


def test_wordpiece_cased(corpus, tmp_path):
    path = build_vocab(corpus, tmp_path, model_type="wordpiece", vocab_size=400, lower_case=False,
                       max_sentences=1000)
    vocab = load_vocab(path)
    assert not infer_lower_case(vocab) and "Z" in vocab and "ü" in vocab
    tok = WordPieceTokenizer(path)
    assert not tok.lower_case
    assert tok.id_to_token(tok.tokenize(tf.constant(["Zürich"])))[0][0] == "Z"


def test_wordpiece_deterministic_and_max_sentences(corpus, tmp_path):
    a = train_vocab(corpus, tmp_path / "a", model_type="wordpiece", vocab_size=300, max_sentences=500)
    b = train_vocab(corpus, tmp_path / "b", model_type="wordpiece", vocab_size=300, max_sentences=500)
    assert a.sentences == b.sentences == 500
    assert a.path.read_bytes() == b.path.read_bytes()


# --------------------------------------------------------------------------- SentencePiece


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_sentencepiece_build(corpus, sentences, tmp_path, model_type):
    summary = train_vocab(corpus, tmp_path, model_type=model_type, vocab_size=300)
    assert summary.path == tmp_path / "spm.model" and summary.vocab_size == 300
    assert load_vocab(tmp_path / "vocab.txt")[:5] == list(SPECIAL_TOKENS)
    tok = load_tokenizer(tmp_path)
    assert isinstance(tok, SentencePieceTokenizer) and tok.lower_case
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    assert tok.vocab == load_vocab(tmp_path / "vocab.txt")
    # Rare characters (ï, ã) fall outside character_coverage=0.9995 and become [UNK].
    assert summary.unk_rate < 0.005 and _unk_rate(tok, sentences) == pytest.approx(summary.unk_rate)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spm.model", "vocab.txt"]


def test_sentencepiece_deterministic(corpus, tmp_path):
    a = build_vocab(corpus, tmp_path / "a", model_type="unigram", vocab_size=300, seed=3)
    b = build_vocab(corpus, tmp_path / "b", model_type="unigram", vocab_size=300, seed=3)
    assert a.read_bytes() == b.read_bytes()
    assert (a.parent / "vocab.txt").read_bytes() == (b.parent / "vocab.txt").read_bytes()


def test_wordpiece_replaces_earlier_sentencepiece(corpus, tmp_path):
    build_vocab(corpus, tmp_path, model_type="bpe", vocab_size=200, max_sentences=300)
    build_vocab(corpus, tmp_path, model_type="wordpiece", vocab_size=200, max_sentences=300)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vocab.txt"]
    assert isinstance(load_tokenizer(tmp_path), WordPieceTokenizer)


# --------------------------------------------------------------------------- errors


def test_errors(corpus, tmp_path):
    with pytest.raises(ValueError, match="model_type must be one of"):
        build_vocab(corpus, tmp_path, model_type="sentencepiece", vocab_size=100)
    with pytest.raises(SourceError, match="no such file"):
        build_vocab(str(tmp_path / "missing.txt"), tmp_path, model_type="wordpiece", vocab_size=100)
    with pytest.raises(ValueError, match="the alphabet vocab_size 8 allows"):
        build_vocab(corpus, tmp_path, model_type="wordpiece", vocab_size=8, max_sentences=50)
    with pytest.raises(ValueError, match="SentencePiece training failed"):
        build_vocab(corpus, tmp_path, model_type="unigram", vocab_size=50_000, max_sentences=50)
    assert not any(tmp_path.iterdir())  # nothing half-written


# --------------------------------------------------------------------------- CLI and real text


@pytest.mark.slow  # ~11 s: a new process; the tool's code: the tests above, its convention: tests/test_cli.py
def test_cli(corpus, tmp_path):
    out = tmp_path / "cli"
    result = subprocess.run(
        [sys.executable, "-m", "input_pipeline.build_vocab", f"--input={corpus}", f"--output_dir={out}",
         "--model_type=bpe", "--vocab_size=200", "--max_sentences=500", "--nolower_case"],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "bpe vocabulary of 200 tokens from 500 sentences" in result.stdout
    tok = load_tokenizer(out)
    assert not tok.lower_case and isinstance(tok, SentencePieceTokenizer)


def test_wikipedia_excerpt(wikipedia_dump, tmp_path):
    dump = wikipedia_dump
    summary = train_vocab(str(dump), tmp_path, model_type="wordpiece", vocab_size=600,
                          max_sentences=800)
    assert summary.sentences == 800 and 570 <= summary.vocab_size <= 600
    assert summary.unk_rate < 0.005
    tok = WordPieceTokenizer(summary.path)
    tokens = tok.id_to_token(tok.encode("The history of Anarchism")[0])
    assert tokens[:2] == ["[CLS]", "the"] and " ".join(tokens[2:-1]).replace(" ##", "") == "history of anarchism"
