"""WordPiece tokenizer (input_pipeline/tokenizers/wordpiece.py) against Hugging Face's ids and on small vocabs.

The golden ids come from transformers' Python BERT tokenizer (tests/golden/tokenizer_golden.npz,
`make golden`): every sentence of the vaderSentiment movie-review file, hand-picked inputs and, per
block of 4096 code points, a digest of HF BasicTokenizer's words for every Unicode code point.
"""

from __future__ import annotations

import hashlib
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from input_pipeline.tokenizers.wordpiece import VocabError, WordPieceTokenizer, load_vocab

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def write_vocab(tmp_path: Path, tokens: list[str], name: str = "vocab.txt") -> Path:
    path = tmp_path / name
    path.write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    return path


def tokens_of(tok: WordPieceTokenizer, text: str) -> list[str]:
    return tok.id_to_token(tok.tokenize(tf.constant([text]))[0])


@pytest.fixture(scope="module")
def golden(golden_file) -> dict:
    return dict(np.load(golden_file("tokenizer_golden.npz"), allow_pickle=False))


@pytest.fixture(scope="module")
def review_lines(golden, movie_review_file, missing_real_data) -> list[str]:
    """Third column of movieReviewSnippets_GroundTruth.txt, as make_golden.py reads it."""
    path = movie_review_file
    lines = [ln.rstrip("\r") for ln in path.read_bytes().decode("utf-8").split("\n")]
    sentences = [ln.split("\t")[2] for ln in lines if ln]
    digest = hashlib.sha256("\n".join(sentences).encode("utf-8")).hexdigest()
    if digest != str(golden["source_sha256"]):
        missing_real_data(f"{path} is not the file tokenizer_golden.npz was made from (sha256 differs)")
    return sentences


def golden_rows(golden) -> list[list[int]]:
    ids, offsets = golden["ids"], golden["offsets"]
    return [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]


def assert_rows_equal(tok, got: list[list[int]], want: list[list[int]], texts: list[str]):
    bad = [i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w]
    if bad:
        i = bad[0]
        pytest.fail(f"{len(bad)} of {len(want)} rows differ from HF; first, row {i} {texts[i]!r}:\n"
                    f"  HF:   {tok.id_to_token(want[i])}\n  ours: {tok.id_to_token(got[i])}")


def test_minilm_vocab_properties(minilm_tokenizer):
    tok = minilm_tokenizer
    assert tok.vocab_size == 30522 and tok.lower_case
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 100, 101, 102, 103)
    assert tok.special_ids == frozenset({0, 100, 101, 102, 103})


def test_all_review_lines_match_hf_eagerly(minilm_tokenizer, golden, review_lines):
    tok = minilm_tokenizer
    rows = tok.tokenize(tf.constant(review_lines)).to_list()
    got = [[tok.cls_id, *r, tok.sep_id] for r in rows]
    n = int(golden["num_source_lines"])
    assert len(review_lines) == n == 10605
    assert_rows_equal(tok, got, golden_rows(golden)[:n], review_lines)


def test_all_review_lines_match_hf_in_tf_data(minilm_tokenizer, golden, review_lines):
    tok = minilm_tokenizer
    cls, sep = tf.constant([tok.cls_id]), tf.constant([tok.sep_id])

    def encode(texts):
        pieces = tok.tokenize(texts)
        n = pieces.nrows()
        return tf.concat([tf.RaggedTensor.from_tensor(tf.fill([n, 1], cls[0])), pieces,
                          tf.RaggedTensor.from_tensor(tf.fill([n, 1], sep[0]))], axis=1)

    ds = tf.data.Dataset.from_tensor_slices(review_lines).batch(2048).map(encode)
    got = [row for batch in ds for row in batch.to_list()]
    # Unbatched elements (one string each) go through the same graph code.
    single = tf.data.Dataset.from_tensor_slices(review_lines[:64]).map(
        lambda t: tok.tokenize(tf.expand_dims(t, 0))[0])
    got_single = [[tok.cls_id, *r.numpy().tolist(), tok.sep_id] for r in single]
    want = golden_rows(golden)
    assert_rows_equal(tok, got, want[:len(review_lines)], review_lines)
    assert_rows_equal(tok, got_single, want[:64], review_lines[:64])


def test_golden_inputs_and_edge_cases_match_hf(minilm_tokenizer, golden):
    tok = minilm_tokenizer
    n = int(golden["num_source_lines"])
    pairs = zip(golden["extra_texts_a"], golden["extra_texts_b"], strict=True)
    texts = [(str(a), str(b) or None) for a, b in pairs]
    assert len(texts) >= 20 and any(b for _, b in texts)
    got = [tok.encode(a, b)[0] for a, b in texts]
    assert_rows_equal(tok, got, golden_rows(golden)[n:], [a for a, _ in texts])
    ids, segments = tok.encode("Who won?", "The home team, 3-1.")
    assert ids.index(tok.sep_id) == 4 and ids[-1] == tok.sep_id
    assert segments == [0] * 5 + [1] * (len(ids) - 5)


@pytest.mark.parametrize("lower_case", [True, False], ids=["uncased", "cased"])
def test_every_code_point_normalises_as_hf(minilm_tokenizer, golden, lower_case):
    """HF BasicTokenizer's words for 'x'+chr(c)+'y', all 1.1M code points, compared per 4096-block.

    Both tokenizers take their character classes from Python's ``unicodedata``, so the digests hold for
    the Unicode version the golden was made with (Python 3.11: 14.0.0); Python 3.13's 15.1.0 classes the
    code points added since, in both tokenizers alike (checked: docs/records.md, "`make test` on Python
    3.13 with the newest packages")."""
    made_with = str(golden["unicodedata_version"])
    if unicodedata.unidata_version != made_with:
        pytest.skip(f"tokenizer_golden.npz holds HF's words under Unicode {made_with}; this Python's "
                    f"unicodedata is {unicodedata.unidata_version} (tests/golden/README.md)")
    tok = WordPieceTokenizer(minilm_tokenizer.vocab_file, lower_case=lower_case)
    texts = [" ".join(f"x{chr(c)}y" for c in range(lo, lo + 4096) if not 0xD800 <= c <= 0xDFFF)
             for lo in range(0, 0x110000, 4096)]
    joined = tf.strings.reduce_join(tok.words(tf.constant(texts)), axis=1, separator="\n").numpy()
    got = np.stack([np.frombuffer(hashlib.sha256(j).digest(), np.uint8) for j in joined])
    want = golden["codepoint_sha256_uncased" if lower_case else "codepoint_sha256_cased"]
    bad = [f"U+{4096 * b:04X}..U+{4096 * b + 4095:04X}" for b in np.nonzero((got != want).any(1))[0]]
    assert not bad, f"words differ from HF BasicTokenizer in code-point blocks {bad}"


@pytest.fixture
def small(tmp_path) -> WordPieceTokenizer:
    """Specials in unusual positions; uncased."""
    vocab = ["hello", "[MASK]", "world", "[SEP]", "##s", "[UNK]", "un", "##aff", "##able", "[CLS]",
             "cafe", "naive", "ecole", "中", "文", "abc", ",", "!", "'", "[", "]", "sep", "a", "##a",
             "e", "##e", "x", "##x", "[PAD]", "ⱟ", "σ", "ς", "##ς", "##σ", "i"]
    return WordPieceTokenizer(write_vocab(tmp_path, vocab))


def test_special_ids_come_from_the_vocab(small):
    assert (small.mask_id, small.sep_id, small.unk_id, small.cls_id, small.pad_id) == (1, 3, 5, 9, 28)
    assert small.special_ids == frozenset({1, 3, 5, 9, 28})
    ids, segments = small.encode("hello", "worlds")
    assert ids == [9, 0, 3, 2, 4, 3] and segments == [0, 0, 0, 1, 1, 1]
    assert small.id_to_token(ids) == ["[CLS]", "hello", "[SEP]", "world", "##s", "[SEP]"]


def test_wordpiece_greedy_longest_match_and_unknowns(small):
    assert tokens_of(small, "unaffable hellos") == ["un", "##aff", "##able", "hello", "##s"]
    # A word with any unmatchable character is one [UNK], not a partial match.
    assert tokens_of(small, "helloq qqq hello") == ["[UNK]", "[UNK]", "hello"]
    assert tokens_of(small, "[SEP] sep") == ["[", "sep", "]", "sep"]  # literal specials are text


def test_words_over_100_characters_become_unk(small):
    assert tokens_of(small, "a" * 100) == ["a"] + ["##a"] * 99
    assert tokens_of(small, "a" * 101 + " hello") == ["[UNK]", "hello"]
    # Characters, not bytes: 100 two-byte letters are fine; after accent stripping "é" is "e".
    assert tokens_of(small, "é" * 100) == ["e"] + ["##e"] * 99
    assert tokens_of(small, "é" * 101) == ["[UNK]"]
    # The limit applies after punctuation splitting.
    assert tokens_of(small, "x" * 100 + "!" + "x" * 100) == ["x"] + ["##x"] * 99 + ["!", "x"] + ["##x"] * 99


def test_accents_cjk_punctuation_and_cleanup(small):
    assert tokens_of(small, "Café NAÏVE École") == ["cafe", "naive", "ecole"]
    assert tokens_of(small, "Cafe\u0301") == ["cafe"]  # decomposed accent
    assert tokens_of(small, "abc中文abc") == ["abc", "中", "文", "abc"]
    assert tokens_of(small, "hello,world!") == ["hello", ",", "world", "!"]
    # Controls and format characters vanish (joining the word); other whitespace splits.
    assert tokens_of(small, "hel\x00lo wor\u200bld a\u00adbc") == ["hello", "world", "abc"]
    assert tokens_of(small, "hello\u00a0world\u2028abc\tcafe\r\nnaive\u3000a") == [
        "hello", "world", "abc", "cafe", "naive", "a"]
    assert tokens_of(small, "") == [] and tokens_of(small, " \t\n ") == []


def test_invalid_utf8_is_dropped_like_u_fffd(small):
    assert small.id_to_token(small.tokenize(tf.constant([b"hel\xfflo"]))[0]) == ["hello"]


def test_python_lowercasing_including_final_sigma_and_newer_letters(small):
    assert tokens_of(small, "ΣΣ Σ") == ["σ", "##ς", "σ"]  # final sigma depends on context
    assert tokens_of(small, "İ") == ["i"]  # 'i' + U+0307, the dot stripped as an accent
    # U+2C2F (Unicode 14) lower-cases to U+2C5F in Python; older ICU leaves it alone.
    assert tokens_of(small, "\u2c2f") == ["ⱟ"]
    ds = tf.data.Dataset.from_tensor_slices(["\u2c2f", "hello"]).batch(2).map(small.tokenize)
    assert [small.id_to_token(r) for r in next(iter(ds)).to_list()] == [["ⱟ"], ["hello"]]


def test_tokenize_in_tf_function_and_is_continuation(small):
    fn = tf.function(small.tokenize, input_signature=[tf.TensorSpec([None], tf.string)])
    ragged = fn(tf.constant(["hellos unaffable", "world"]))
    assert ragged.dtype == tf.int32
    assert small.id_to_token(ragged[0]) == ["hello", "##s", "un", "##aff", "##able"]
    cont = small.is_continuation(ragged)
    assert cont.to_list() == [[False, True, False, True, True], [False]]
    dense = small.is_continuation(tf.constant([[9, 0, 4, 3, 28]], tf.int64))
    assert dense.numpy().tolist() == [[False, False, True, False, False]]


def test_id_to_token_accepts_ints_arrays_and_rejects_out_of_range(small):
    assert small.id_to_token(0) == ["hello"]
    assert small.id_to_token(np.array([[0, 2]])) == ["hello", "world"]
    assert small.id_to_token(tf.ragged.constant([[0], [2, 4]])) == ["hello", "world", "##s"]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        small.id_to_token([small.vocab_size])


def test_lower_case_inferred_from_vocab(tmp_path):
    uncased = write_vocab(tmp_path, SPECIALS + ["hello", "ℝ", "##ℝ", "[unused0]"], "uncased.txt")
    cased = write_vocab(tmp_path, SPECIALS + ["hello", "Hello", "é"], "cased.txt")
    assert WordPieceTokenizer(uncased).lower_case is True  # ℝ has no lower-case form
    tok = WordPieceTokenizer(cased)
    assert tok.lower_case is False
    assert tokens_of(tok, "Hello hello HELLO é") == ["Hello", "hello", "[UNK]", "é"]
    forced = WordPieceTokenizer(cased, lower_case=True)
    assert forced.lower_case and tokens_of(forced, "Hello é") == ["hello", "[UNK]"]
    assert WordPieceTokenizer(uncased, lower_case=False).lower_case is False


def test_vocab_file_errors_name_file_and_line(tmp_path):
    with pytest.raises(VocabError, match=r"nope\.txt: vocabulary file not found"):
        WordPieceTokenizer(tmp_path / "nope.txt")
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(VocabError, match=r"empty\.txt: empty vocabulary"):
        load_vocab(empty)
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("[PAD]\n[UNK]\ncaf\xe9\n".encode("latin-1"))
    with pytest.raises(VocabError, match=r"latin1\.txt:3: not valid UTF-8"):
        load_vocab(bad)
    dup = write_vocab(tmp_path, SPECIALS + ["a", "b", "a"], "dup.txt")
    with pytest.raises(VocabError, match=r"dup\.txt:8: duplicate token 'a' \(first on line 6\)"):
        load_vocab(dup)
    blank = write_vocab(tmp_path, SPECIALS + ["", "a"], "blank.txt")
    with pytest.raises(VocabError, match=r"blank\.txt:6: blank line"):
        load_vocab(blank)
    no_mask = write_vocab(tmp_path, ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a"], "nomask.txt")
    with pytest.raises(VocabError, match=r"nomask\.txt: no \[MASK\] token"):
        WordPieceTokenizer(no_mask)


def test_vocab_reader_drops_bom_and_crlf(tmp_path):
    path = tmp_path / "crlf.txt"
    path.write_bytes(b"\xef\xbb\xbf" + b"\r\n".join(t.encode() for t in SPECIALS + ["a"]) + b"\r\n")
    assert load_vocab(path) == SPECIALS + ["a"]


def test_many_tokenizers_trace_without_tensorflows_retracing_warning(tmp_path, caplog):
    """Each fine-tuning run opens the vocabulary again: seven tokenizers, each traced twice, log no
    "triggered tf.function retracing" warning (TensorFlow counts traces per function's code)."""
    import logging

    vocab = write_vocab(tmp_path, SPECIALS + ["hello", "world", "##s"])
    with caplog.at_level(logging.WARNING, logger="tensorflow"):
        for _ in range(7):
            tok = WordPieceTokenizer(vocab)
            assert tok.tokenize(tf.constant(["hello worlds"])).to_list() == [[5, 6, 7]]
            tok.tokenize(tf.constant(["hello", "world"]))
    assert not [r for r in caplog.records if "retracing" in r.getMessage()]
