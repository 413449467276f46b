"""input_pipeline.tokenizers.sentencepiece_model and .tokenizer_factory: SentencePiece models as BERT
tokenizers, in-graph ids equal to the sentencepiece package's."""

from __future__ import annotations

import io

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf

from input_pipeline.corpora.sentences import split_sentences
from input_pipeline.tokenizers.factory import load_tokenizer
from input_pipeline.tokenizers.sentencepiece_model import SentencePieceTokenizer
from input_pipeline.tokenizers.vocab import VocabError
from input_pipeline.tokenizers.wordpiece import WordPieceTokenizer

EDGE_CASES = [
    "", " ", "  leading and   inner   spaces\t", "Ünïcödé ß İstanbul ﬁ ①", "日本語のテキスト。",
    "emoji 😀 here", "[CLS] literal [SEP] [MASK]", "x" * 300, "CAPS lower MiXeD", "a\u00a0b\u200bc",
]
BERT_SPECIALS = dict(pad_id=0, pad_piece="[PAD]", unk_id=1, unk_piece="[UNK]", bos_id=-1, eos_id=-1)


def train_model(path, sentences, **options):
    """A SentencePiece model trained in memory and written to ``path``; returns ``path``."""
    model = io.BytesIO()
    options = dict(model_type="unigram", vocab_size=300, minloglevel=2, num_threads=2) | options
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=model, **options)
    path.write_bytes(model.getvalue())
    return path


@pytest.fixture(scope="module")
def sentences(tmp_path_factory, write_prose_corpus):
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    return [line for line in open(write_prose_corpus(path, 2000), encoding="utf-8").read().splitlines() if line]


@pytest.fixture(scope="module", params=["unigram", "bpe"])
def model_file(request, sentences, tmp_path_factory):
    """A BERT model as build_vocab trains it: [PAD] [UNK] special ids, control [CLS] [SEP] [MASK]."""
    return train_model(tmp_path_factory.mktemp(request.param) / "spm.model", sentences,
                       model_type=request.param, normalization_rule_name="nmt_nfkc_cf",
                       control_symbols=["[CLS]", "[SEP]", "[MASK]"], **BERT_SPECIALS)


@pytest.fixture(scope="module")
def tok(model_file):
    return SentencePieceTokenizer(model_file)


def test_attributes(tok, model_file):
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    assert tok.special_ids == frozenset(range(5)) and tok.vocab_size == 300 == len(tok.vocab)
    assert tok.vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert tok.lower_case
    assert str(model_file) in repr(tok)


def test_in_graph_ids_equal_python_sentencepiece(tok, model_file, sentences):
    texts = sentences + EDGE_CASES
    reference = spm.SentencePieceProcessor(model_file=str(model_file)).encode(texts)
    got = tok.tokenize(tf.constant(texts))
    assert got.dtype == tf.int32 and got.shape.rank == 2
    assert got.to_list() == reference
    # Specials in the text are plain text (control symbols), as for WordPiece.
    assert not set(got[len(sentences) + 6].numpy()) & {tok.cls_id, tok.sep_id, tok.mask_id}


def test_tokenize_in_tf_data_and_tf_function(tok, sentences):
    texts = sentences[:50]
    eager = tok.tokenize(tf.constant(texts)).to_list()
    ds = tf.data.Dataset.from_tensor_slices(texts).batch(16).map(tok.tokenize)
    assert [row for batch in ds for row in batch.to_list()] == eager
    ds = tf.data.Dataset.from_tensor_slices(texts).map(lambda t: tok.tokenize(t[None])[0])
    assert [x.numpy().tolist() for x in ds] == eager
    fn = tf.function(lambda t: tok.tokenize(t).to_tensor())
    assert fn(tf.constant(texts[:3])).shape[0] == 3 and fn(tf.constant(texts[:7])).shape[0] == 7
    with pytest.raises(ValueError, match=r"\[batch\] string tensor"):
        tok.tokenize(tf.constant([texts[:2]]))


def test_is_continuation(tok, sentences):
    expected = [not p.startswith("\u2581") and i >= 5 for i, p in enumerate(tok.vocab)]
    assert tok.is_continuation(tf.range(tok.vocab_size)).numpy().tolist() == expected
    assert not tok.is_continuation(tf.constant(sorted(tok.special_ids))).numpy().any()
    ids = tok.tokenize(tf.constant(sentences[:100]))
    cont = tok.is_continuation(ids)
    assert isinstance(cont, tf.RaggedTensor) and cont.dtype == tf.bool
    for text, row, flags in zip(sentences[:100], ids.to_list(), cont.to_list(), strict=True):
        if tok.unk_id not in row:  # every word starts exactly one non-continuation piece
            assert flags.count(False) == len(text.split()), text
    assert not tok.is_continuation(tf.constant(tok.encode("word")[0][:2])).numpy().any()


def test_encode_and_id_to_token(tok):
    ids, segments = tok.encode("Hello there.", "General Kenobi!")
    tokens = tok.id_to_token(ids)
    assert tokens[0] == "[CLS]" and tokens.count("[SEP]") == 2 and tokens[-1] == "[SEP]"
    first_sep = tokens.index("[SEP]")
    assert segments == [0] * (first_sep + 1) + [1] * (len(ids) - first_sep - 1)
    assert tok.encode("hello")[0][1:-1] == tok.tokenize(tf.constant(["hello"]))[0].numpy().tolist()
    assert tok.id_to_token(np.array([[2, 3]])) == ["[CLS]", "[SEP]"]
    assert tok.id_to_token(tf.ragged.constant([[0], [4]])) == ["[PAD]", "[MASK]"]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.id_to_token([tok.vocab_size])


def test_user_defined_specials_and_cased_model(sentences, tmp_path):
    path = train_model(tmp_path / "cased.model", sentences, normalization_rule_name="nmt_nfkc",
                       user_defined_symbols=["[CLS]", "[SEP]", "[MASK]"], **BERT_SPECIALS)
    tok = SentencePieceTokenizer(path)
    assert not tok.lower_case and tok.cls_id == 2
    upper, lower = tok.tokenize(tf.constant(["CAFE", "cafe"])).to_list()
    assert upper != lower
    texts = sentences[:100] + EDGE_CASES
    assert tok.tokenize(tf.constant(texts)).to_list() == spm.SentencePieceProcessor(
        model_file=str(path)).encode(texts)


def test_albert_spelling_of_the_specials(sentences, tmp_path):
    """ALBERT's spiece.model: <pad> = 0, <unk> = 1, [CLS] [SEP] [MASK] after them; a directory
    holding it (as a Hugging Face ALBERT directory does) gives this tokenizer."""
    from input_pipeline.tokenizers.factory import load_tokenizer

    path = train_model(tmp_path / "spiece.model", sentences, pad_id=0, pad_piece="<pad>", unk_id=1,
                       unk_piece="<unk>", bos_id=-1, eos_id=-1, control_symbols=["[CLS]", "[SEP]", "[MASK]"],
                       normalization_rule_name="nmt_nfkc_cf")
    tok = load_tokenizer(tmp_path)
    assert isinstance(tok, SentencePieceTokenizer) and tok.model_file == str(path)
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    assert tok.encode("hello there")[0][0] == 2 and tok.encode("hello there")[0][-1] == 3


# --------------------------------------------------------------------------- errors


def test_errors(sentences, tmp_path, model_file):
    with pytest.raises(VocabError, match=r"missing\.model: SentencePiece model file not found"):
        SentencePieceTokenizer(tmp_path / "missing.model")
    (tmp_path / "junk.model").write_bytes(b"\xff\x00 not a proto")
    with pytest.raises(VocabError, match=r"junk\.model: not a SentencePiece model"):
        SentencePieceTokenizer(tmp_path / "junk.model")
    plain = train_model(tmp_path / "plain.model", sentences[:300], vocab_size=100)  # <unk> <s> </s>
    with pytest.raises(VocabError, match=r"plain\.model: no \[PAD\], \[CLS\], \[SEP\], \[MASK\] piece"):
        SentencePieceTokenizer(plain)
    other_unk = train_model(tmp_path / "unk.model", sentences[:300], vocab_size=100,
                            user_defined_symbols=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    with pytest.raises(VocabError, match=r"unk\.model: the unknown piece is '<unk>'"):
        SentencePieceTokenizer(other_unk)
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nextra\n")
    with pytest.raises(VocabError, match=r"vocab\.txt: does not match .*first difference at id 5"):
        SentencePieceTokenizer(model_file, vocab_file=tmp_path / "vocab.txt")


# --------------------------------------------------------------------------- load_tokenizer


def test_load_tokenizer(model_file, tmp_path):
    sp_dir = tmp_path / "sp"
    sp_dir.mkdir()
    (sp_dir / "spm.model").write_bytes(model_file.read_bytes())
    sp = SentencePieceTokenizer(model_file)
    (sp_dir / "vocab.txt").write_text("".join(p + "\n" for p in sp.vocab), encoding="utf-8")
    assert isinstance(load_tokenizer(sp_dir), SentencePieceTokenizer)  # the model wins over vocab.txt
    assert isinstance(load_tokenizer(sp_dir / "spm.model"), SentencePieceTokenizer)
    wp_dir = tmp_path / "wp"
    wp_dir.mkdir()
    (wp_dir / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\n##b\n")
    assert isinstance(load_tokenizer(wp_dir), WordPieceTokenizer)
    assert isinstance(load_tokenizer(wp_dir / "vocab.txt"), WordPieceTokenizer)
    with pytest.raises(VocabError, match="no tokenizer here"):
        load_tokenizer(tmp_path)
    with pytest.raises(VocabError, match="no such file or directory"):
        load_tokenizer(tmp_path / "nothing")
    (tmp_path / "tokenizer.json").write_text("{}")  # read by the tokenizers package (ModernBERT's kind)
    with pytest.raises(VocabError, match="tokenizer.json: not a (tokenizers tokenizer.json|byte-level BPE)"):
        load_tokenizer(tmp_path / "tokenizer.json")
    (tmp_path / "weights.bin").write_text("{}")
    with pytest.raises(VocabError, match="unknown kind of vocabulary file"):
        load_tokenizer(tmp_path / "weights.bin")
    (sp_dir / "other.model").write_bytes(model_file.read_bytes())
    assert isinstance(load_tokenizer(sp_dir), SentencePieceTokenizer)  # spm.model is preferred
    (sp_dir / "spm.model").unlink()
    (sp_dir / "vocab.txt").unlink()
    (sp_dir / "third.model").write_bytes(model_file.read_bytes())
    with pytest.raises(VocabError, match="several SentencePiece models"):
        load_tokenizer(sp_dir)


# --------------------------------------------------------------------------- real Korean prose


def test_korean_constitution(korean_constitution_file, tmp_path):
    path = korean_constitution_file
    texts = split_sentences(path.read_text(encoding="utf-8"))
    assert len(texts) > 300
    model = train_model(tmp_path / "ko.model", texts, vocab_size=800, control_symbols=["[CLS]", "[SEP]", "[MASK]"],
                        **BERT_SPECIALS)
    tok = SentencePieceTokenizer(model)
    ids = tok.tokenize(tf.constant(texts))
    assert ids.to_list() == spm.SentencePieceProcessor(model_file=str(model)).encode(texts)
    flat = ids.flat_values.numpy()
    assert (flat == tok.unk_id).mean() < 0.005
    pieces = tok.id_to_token(tok.encode("대한민국은 민주공화국이다.")[0])
    assert pieces[1].startswith("\u2581") and "".join(pieces[1:-1]).replace("\u2581", " ").strip() == (
        "대한민국은 민주공화국이다.")
