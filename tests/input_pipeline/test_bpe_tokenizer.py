"""RoBERTa's byte-level BPE tokenizer (input_pipeline/tokenizers/bpe.py) against Hugging Face's ids.

The golden ids come from transformers' ``RobertaTokenizer.from_pretrained(tests/golden/roberta_bpe)``
(tests/golden/roberta_tokenizer_golden.npz, `make golden`): every sentence of the vaderSentiment
movie-review file, 500 pairs of them and edge cases. Also: load_tokenizer, bad files, and the
consumers (GLUE/sentiment features, pre-training masking, extract_features) given this tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from input_pipeline.tokenizers.bpe import RobertaBPETokenizer
from input_pipeline.tokenizers.factory import load_tokenizer
from input_pipeline.tokenizers.vocab import VocabError
from input_pipeline.tokenizers.wordpiece import WordPieceTokenizer


@pytest.fixture(scope="module")
def golden(golden_file) -> dict:
    return dict(np.load(golden_file("roberta_tokenizer_golden.npz"), allow_pickle=False))


@pytest.fixture(scope="module")
def bpe_dir(golden_file, golden) -> Path:
    """tests/golden/roberta_bpe/, checked to be the vocabulary the golden ids were made with."""
    d = golden_file("roberta_bpe/vocab.json").parent
    for name, key in (("vocab.json", "vocab_sha256"), ("merges.txt", "merges_sha256")):
        assert hashlib.sha256((d / name).read_bytes()).hexdigest() == str(golden[key]), (
            f"{d / name} is not the file roberta_tokenizer_golden.npz was made with: run `make golden`")
    return d


@pytest.fixture(scope="module")
def tok(bpe_dir) -> RobertaBPETokenizer:
    return RobertaBPETokenizer(bpe_dir / "vocab.json")


@pytest.fixture(scope="module")
def review_lines(golden, movie_review_file, missing_real_data) -> list[str]:
    lines = [ln.rstrip("\r") for ln in movie_review_file.read_bytes().decode("utf-8").split("\n")]
    sentences = [ln.split("\t")[2] for ln in lines if ln]
    if hashlib.sha256("\n".join(sentences).encode("utf-8")).hexdigest() != str(golden["source_sha256"]):
        missing_real_data(f"{movie_review_file} is not the file roberta_tokenizer_golden.npz was made from")
    return sentences


def golden_rows(golden) -> list[list[int]]:
    ids, offsets = golden["ids"], golden["offsets"]
    return [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]


def assert_rows_equal(tok, got, want, texts):
    bad = [i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w]
    if bad:
        i = bad[0]
        pytest.fail(f"{len(bad)} of {len(want)} rows differ from HF; first, row {i} {texts[i]!r}:\n"
                    f"  HF:   {tok.id_to_token(want[i])}\n  ours: {tok.id_to_token(got[i])}")


def test_vocabulary_and_special_ids(tok, bpe_dir):
    assert tok.vocab_size == 2000 == len(json.loads((bpe_dir / "vocab.json").read_text()))
    assert (tok.cls_id, tok.pad_id, tok.sep_id, tok.unk_id, tok.mask_id) == (0, 1, 2, 3, 4)
    assert tok.special_ids == frozenset(range(5)) and not tok.lower_case
    assert (tok.pair_separators, tok.segment_b) == (2, 0)
    assert tok.id_to_token([0, 1, 2, 3, 4]) == ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


def test_all_review_lines_match_hf_eagerly(tok, golden, review_lines):
    n = int(golden["num_source_lines"])
    assert len(review_lines) == n == 10605
    got = [[tok.cls_id, *r, tok.sep_id] for r in tok.tokenize(tf.constant(review_lines)).to_list()]
    assert_rows_equal(tok, got, golden_rows(golden)[:n], review_lines)


def test_all_review_lines_match_hf_in_tf_data(tok, golden, review_lines):
    cls, sep = tf.constant([tok.cls_id]), tf.constant([tok.sep_id])
    ds = (tf.data.Dataset.from_tensor_slices(review_lines).batch(1000)
          .map(tok.tokenize, num_parallel_calls=2, deterministic=True).unbatch()
          .map(lambda ids: tf.concat([cls, ids, sep], 0)))
    got = [r.tolist() for r in ds.as_numpy_iterator()]
    assert_rows_equal(tok, got, golden_rows(golden)[:len(review_lines)], review_lines)


def test_pairs_and_edge_cases_match_hf(tok, golden, review_lines):
    n, pairs = int(golden["num_source_lines"]), golden["pairs"]
    texts = [(review_lines[i], review_lines[j]) for i, j in pairs]
    texts += list(zip(golden["extra_texts_a"].tolist(), golden["extra_texts_b"].tolist(), strict=True))
    encoded = [tok.encode(a, b or None) for a, b in texts]
    assert all(set(seg) == {0} for _, seg in encoded)  # RoBERTa: one segment
    assert_rows_equal(tok, [ids for ids, _ in encoded], golden_rows(golden)[n:], texts)
    assert len(golden["reference_mismatch_rows"]) == 0  # HF agreed with the plain-Python GPT-2 BPE


def test_graph_and_eager_agree_and_bytes(tok):
    texts = ["Hello world, it's a movie.", "", "  two  spaces\n", "café 東京 😀", "A <mask> and </s>"]
    eager = tok.tokenize(tf.constant(texts))
    graph = tf.function(tok.tokenize, input_signature=[tf.TensorSpec([None], tf.string)])(tf.constant(texts))
    assert eager.to_list() == graph.to_list() == tok.encode_python(texts)
    assert eager.dtype == tf.int32 and eager.to_list()[1] == []
    assert tok.tokenize(tf.constant(["A <mask> and </s>"])).to_list()[0][2] == tok.mask_id  # as HF
    bad = tok.tokenize(tf.constant([b"ab\xffcd"])).to_list()  # invalid UTF-8 -> U+FFFD, as HF on that str
    assert bad == tok.tokenize(tf.constant(["ab\ufffdcd"])).to_list()
    assert tok.tokenize(tf.constant([], tf.string)).shape.as_list() == [0, None]
    with pytest.raises(ValueError, match="expects a \\[batch\\] string tensor"):
        tok.tokenize(tf.constant([["a"]]))


def test_is_continuation_and_id_to_token(tok):
    ids = tok.tokenize(tf.constant(["Unbelievably good, the film!"]))
    pieces = tok.id_to_token(ids)
    want = [not p.startswith("\u0120") for p in pieces]
    assert tok.is_continuation(ids).to_list() == [want]
    assert want[0] and not all(want)  # the first word has no Ġ (no prefix space), later words do
    dense = tf.constant([[tok.cls_id, *ids[0].numpy().tolist(), tok.sep_id, tok.pad_id]])
    graph = tf.function(tok.is_continuation)(dense).numpy()[0].tolist()
    assert graph == [False, *want, False, False]  # special tokens never continue a word
    with pytest.raises(ValueError, match="id 2000 outside the vocabulary"):
        tok.id_to_token([5, 2000])


# --------------------------------------------------------------------------- loading and errors


def test_load_tokenizer_picks_bpe(bpe_dir, tmp_path):
    for path in (bpe_dir, bpe_dir / "vocab.json", bpe_dir / "merges.txt"):
        assert isinstance(load_tokenizer(path), RobertaBPETokenizer), path
    d = tmp_path / "both"
    shutil.copytree(bpe_dir, d)
    (d / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n")
    with pytest.raises(VocabError, match="both vocab.json .* and vocab.txt"):
        load_tokenizer(d)
    assert isinstance(load_tokenizer(d / "vocab.txt"), WordPieceTokenizer)
    (d / "vocab.txt").unlink()
    (d / "vocab.json").unlink()
    with pytest.raises(VocabError, match="no tokenizer here \\(merges.txt without a vocab.json\\)"):
        load_tokenizer(d)
    with pytest.raises(VocabError, match="vocab.json: BPE vocabulary file not found"):
        load_tokenizer(d / "merges.txt")


def _copy(bpe_dir: Path, tmp_path: Path, *, vocab: str | None = None, merges: str | None = None) -> Path:
    d = tmp_path / "bpe"
    shutil.copytree(bpe_dir, d, dirs_exist_ok=True)
    if vocab is not None:
        (d / "vocab.json").write_text(vocab, encoding="utf-8")
    if merges is not None:
        (d / "merges.txt").write_text(merges, encoding="utf-8")
    return d


def test_bad_files_name_the_file(bpe_dir, tmp_path):
    table = json.loads((bpe_dir / "vocab.json").read_text(encoding="utf-8"))
    merges = (bpe_dir / "merges.txt").read_text(encoding="utf-8").split("\n")
    d = _copy(bpe_dir, tmp_path)
    (d / "merges.txt").unlink()
    with pytest.raises(VocabError, match=f"{d / 'merges.txt'}: BPE merges file not found"):
        load_tokenizer(d)
    cases = [
        (dict(vocab='{"<s>": 0,\n "a": }'), r"vocab\.json:2: not valid JSON"),
        (dict(vocab="[1, 2]"), r"vocab\.json: expected a non-empty JSON object"),
        (dict(vocab=json.dumps({**table, "<s>": 2000})), r"vocab\.json: token '<s>' has id 2000"),
        (dict(vocab=json.dumps({**table, "<s>": 1})), r"vocab\.json: id 1 is given to both"),
        (dict(vocab='{"<s>": 0, "<s>": 1}'), r"vocab\.json: token '<s>' is listed twice"),
        (dict(vocab=json.dumps({t: i for i, t in enumerate(t for t in table if t != "<mask>")})),
         r"vocab\.json: no <mask> token"),
        (dict(merges="\n".join([*merges[:3], "x y z", *merges[3:]])), r"merges\.txt:4: expected two tokens"),
        (dict(merges="\n".join([*merges[:2], "\u0120 nope"])), r"merges\.txt:3: merge .* uses 'nope'"),
    ]
    for files, message in cases:
        with pytest.raises(VocabError, match=message):
            load_tokenizer(_copy(bpe_dir, tmp_path, **files))
    (d / "vocab.json").write_bytes(b'{"\xff": 0}')
    with pytest.raises(VocabError, match=r"vocab\.json: not valid UTF-8"):
        load_tokenizer(d)


# --------------------------------------------------------------------------- consumers


def test_glue_features_have_robertas_layout(tok):
    from input_pipeline.tasks.glue import GlueExample, GlueTask

    t = GlueTask("mrpc", "tfds")
    examples = [GlueExample("0", "The film was good.", "It was fine!", 1),
                GlueExample("1", "A long sentence about a very long film indeed.", "Short one.", 0),
                GlueExample("2", "Alone here.", None, 1)]
    length = 20
    f = t.featurize(examples, tok, length)
    full = tok.encode(examples[0].text_a, examples[0].text_b)[0]
    assert len(full) <= length and f["input_ids"][0].tolist() == full + [tok.pad_id] * (length - len(full))
    assert f["input_mask"][0].tolist() == [1] * len(full) + [0] * (length - len(full))
    assert f["segment_ids"].sum() == 0
    a, b = tok.encode_python([examples[1].text_a, examples[1].text_b])
    assert len(a) + len(b) > length - 4 > len(b) * 2  # a, the longer, loses tokens until the pair fits
    ta = length - 4 - len(b)
    assert f["input_ids"][1].tolist() == [0, *a[:ta], 2, 2, *b, 2] and f["input_mask"][1].all()
    assert f["input_ids"][2].tolist()[:f["input_mask"][2].sum()] == tok.encode("Alone here.")[0]
    with pytest.raises(ValueError, match="at least 4"):
        t.featurize(examples, tok, 3)


def test_sentiment_features_accept_it(tok, tmp_path):
    from input_pipeline.tasks.sentiment import SentimentExample, SentimentTask

    (tmp_path / "train.tsv").write_text("1\tgood\n0\tbad\n")
    task = SentimentTask(str(tmp_path))
    examples = [SentimentExample("0", "A delight from start to finish.", 1), SentimentExample("1", "Awful.", 0)]
    f = task.featurize(examples, tok, 32)
    for row, ex in zip(f["input_ids"].tolist(), examples, strict=True):
        ids = tok.encode(ex.text)[0]
        assert row == ids + [tok.pad_id] * (32 - len(ids))


def test_ner_words_start_with_a_space(tok):
    """NER tokenizes each word alone: with RoBERTa's BPE as " word" (Hugging Face's
    add_prefix_space for pre-split words), so the pieces are those of the words in running text."""
    from types import SimpleNamespace

    from input_pipeline.tasks.ner_features import featurize_words

    words = ["Paris", "is", "in", "France", "."]
    ex = SimpleNamespace(words=words, tags=["B-LOC", "O", "O", "B-LOC", "O"])
    f = featurize_words([ex], tok, 32, ("O", "B-LOC"))
    real = f["input_ids"][0][f["input_mask"][0] > 0].tolist()
    running = tok.encode_python([" " + " ".join(words[:4]) + " ."])[0]  # every word after a space
    assert real == [tok.cls_id, *running, tok.sep_id]
    assert all(tok.vocab[i].startswith("\u0120") for i in f["input_ids"][0][f["label_mask"][0] > 0])
    assert f["label_ids"][0][f["label_mask"][0] > 0].tolist() == [1, 0, 0, 1, 0]


def test_squad_layout_and_answers_with_byte_level_pieces(tok):
    """SQuAD with RoBERTa's BPE: <s> q </s></s> context </s>, all segment 0; the gold span's logits
    give back the answer text, accents and case kept (byte-level pieces decoded)."""
    from input_pipeline.tasks.squad import SquadExample, SquadTask
    from input_pipeline.tasks.squad_features import convert_examples_to_features

    words = "The Café opened in Zürich in 1911, said Müller.".split()
    examples = [SquadExample("q1", "Where did it open?", words, "Zürich", 4, 4, answers=("Zürich",)),
                SquadExample("q2", "When did the Café open?", words, "1911", 6, 6, answers=("1911",))]
    f, info = convert_examples_to_features(examples, tok, 40, doc_stride=16, max_query_length=12)
    assert info["pieces"] == "byte_level" and f["segment_ids"].sum() == 0
    q = tok.encode_python(["Where did it open?"])[0]
    row = f["input_ids"][0].tolist()
    assert row[:len(q) + 3] == [tok.cls_id, *q, tok.sep_id, tok.sep_id]
    context = tok.encode_python([" " + " ".join(words)])[0]
    assert row[len(q) + 3:len(q) + 3 + len(context) + 1] == [*context, tok.sep_id]
    task = SquadTask("1.1", data_dir=".", doc_stride=16, max_query_length=12)
    task._tokens = info
    logits = {k: np.zeros(f["input_ids"].shape, np.float32) for k in ("start_logits", "end_logits")}
    for r in range(2):
        logits["start_logits"][r, f["start_positions"][r]] = 20.0
        logits["end_logits"][r, f["end_positions"][r]] = 20.0
    preds, _, _ = task.predict(examples, f, logits)
    assert preds == {"q1": "Zürich", "q2": "1911"}  # within the word "1911,": the answer's pieces only


def test_pretraining_tokenize_and_whole_word_masking(tok):
    from input_pipeline.pretraining import featurize

    docs = [["The film was good.", "Unbelievably, it was long."], ["Another document here.", "And more."]]
    tokenized = list(featurize.tokenize_documents(docs, tok, batch_size=3))
    assert tokenized == [tok.encode_python(d) for d in docs]
    feats = featurize.build_examples(tokenized, tok, max_seq_length=32)
    cfg = featurize.masking_config(tok, masked_lm_prob=0.5, max_predictions_per_seq=8, whole_word=True)
    out = featurize.mask_features(feats, tok, cfg, seed=1)
    picked = out["masked_lm_ids"][out["masked_lm_weights"] > 0]
    assert picked.size and not np.isin(picked, list(tok.special_ids)).any()


def test_extract_features_encodes_single_texts(tok):
    from bert_jax.interop.extract_features import encode_inputs

    inputs = [("The film was good.", None), ("Awful.", None)]
    ids, mask, segments, tokens = encode_inputs(tok, inputs, None, 512)
    want = [tok.encode(a)[0] for a, _ in inputs]
    assert ids[0].tolist() == want[0] and ids[1].tolist()[:len(want[1])] == want[1]
    assert tokens[1] == tok.id_to_token(want[1]) and segments.sum() == 0


def test_extract_features_encodes_pairs_as_roberta(tok):
    from bert_jax.interop.extract_features import encode_inputs

    ids, _, segments, _ = encode_inputs(tok, [("Who won?", "The home team.")], None, 512)
    assert ids[0].tolist() == tok.encode("Who won?", "The home team.")[0] and segments.sum() == 0
