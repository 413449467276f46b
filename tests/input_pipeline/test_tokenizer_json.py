"""A Hugging Face tokenizer.json byte-level BPE (ModernBERT's kind; input_pipeline/tokenizers/tokenizer_json.py)
against transformers' ``AutoTokenizer`` ids.

The golden (tests/golden/modernbert_l3/: tokenizer.json + tokenizer_ids.npz, `make golden`) is a
ModernBERT-style tokenizer over roberta_bpe/'s 2,000 BPE ids (NFC, ByteLevel, ``[CLS] $A [SEP]``
template, ``[UNK] [CLS] [SEP] [PAD] [MASK]`` at 2000-2004, ``[MASK]`` stripping the space before it)
and HF's ids for 1,000 review sentences, 200 pairs and edge cases.
"""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest
import tensorflow as tf

from input_pipeline.tokenizers.factory import load_tokenizer
from input_pipeline.tokenizers.tokenizer_json import TokenizerJson
from input_pipeline.tokenizers.vocab import VocabError
from input_pipeline.tokenizers.wordpiece import WordPieceTokenizer


@pytest.fixture(scope="module")
def golden(golden_file) -> dict:
    g = dict(np.load(golden_file("modernbert_l3/tokenizer_ids.npz"), allow_pickle=False))
    path = golden_file("modernbert_l3/tokenizer.json")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == str(g["tokenizer_sha256"]), "run `make golden`"
    return g


@pytest.fixture(scope="module")
def tok(golden_file) -> TokenizerJson:
    return TokenizerJson(golden_file("modernbert_l3/tokenizer.json"))


@pytest.fixture(scope="module")
def texts(golden, movie_review_file, missing_real_data) -> list[tuple[str, str]]:
    """The golden's rows as (a, b) texts, b "" for single texts."""
    lines = [ln.rstrip("\r") for ln in movie_review_file.read_bytes().decode("utf-8").split("\n")]
    sentences = [ln.split("\t")[2] for ln in lines if ln]
    if hashlib.sha256("\n".join(sentences).encode("utf-8")).hexdigest() != str(golden["source_sha256"]):
        missing_real_data(f"{movie_review_file} is not the file tokenizer_ids.npz was made from")
    sentences = sentences[:int(golden["num_source_lines"])]
    return ([(s, "") for s in sentences] + [(sentences[i], sentences[j]) for i, j in golden["pairs"]]
            + [(str(a), str(b)) for a, b in zip(golden["extra_texts_a"], golden["extra_texts_b"], strict=True)])


def rows(golden, key="ids") -> list[list[int]]:
    o = golden["offsets"]
    return [golden[key][o[i]:o[i + 1]].tolist() for i in range(len(o) - 1)]


def test_specials_and_layout(tok):
    assert tok.vocab_size == 2005 and tok.id_to_token([2000, 2001, 2002, 2003, 2004]) == [
        "[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
    assert (tok.unk_id, tok.cls_id, tok.sep_id, tok.pad_id, tok.mask_id) == (2000, 2001, 2002, 2003, 2004)
    assert (tok.pair_separators, tok.segment_b) == (1, 1)  # [CLS] a [SEP] b [SEP], b in segment 1
    assert tok.special_ids == frozenset(range(2000, 2005)) and not tok.lower_case
    ids = tok.encode_python(["a film [MASK] here"])[0]
    assert ids == tok.encode_python(["a film[MASK] here"])[0]  # [MASK] takes the space before it (lstrip)
    assert tok.id_to_token(ids)[:3] == ["a", "Ġfilm", "[MASK]"]
    cont = tok.is_continuation(tf.constant(ids)).numpy().tolist()
    assert cont == [not t.startswith("Ġ") and i not in tok.special_ids for t, i in zip(tok.id_to_token(ids), ids,
                                                                                      strict=True)]


def test_every_row_matches_transformers(tok, golden, texts):
    """Single texts and pairs, ids and segment ids, through `encode` (the tasks' layout)."""
    want_ids, want_types = rows(golden), rows(golden, "token_type_ids")
    got = [tok.encode(a, b or None) for a, b in texts]
    bad = [i for i, (ids, seg) in enumerate(got) if ids != want_ids[i] or seg != want_types[i]]
    assert not bad, f"{len(bad)} rows differ, first {texts[bad[0]]!r}: {got[bad[0]]} vs {want_ids[bad[0]]}"


def test_tokenize_inside_tf_data(tok, golden, texts):
    n = 50
    ds = tf.data.Dataset.from_tensor_slices([a for a, _ in texts[:n]]).batch(16).map(tok.tokenize)
    got = [r for batch in ds for r in batch.to_list()]
    assert [[tok.cls_id, *r, tok.sep_id] for r in got] == rows(golden)[:n]


def test_load_tokenizer_finds_it(golden_file, tmp_path):
    d = golden_file("modernbert_l3/tokenizer.json").parent
    assert isinstance(load_tokenizer(d), TokenizerJson)
    assert isinstance(load_tokenizer(d / "tokenizer.json"), TokenizerJson)
    both = tmp_path / "both"  # a BERT directory with a tokenizer.json too: its vocab.txt wins
    both.mkdir()
    shutil.copy(d / "tokenizer.json", both)
    (both / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"]) + "\n")
    assert isinstance(load_tokenizer(both), WordPieceTokenizer)


def test_bad_files_are_named(golden_file, tmp_path):
    spec = json.loads(golden_file("modernbert_l3/tokenizer.json").read_text())
    cases = {
        "wordpiece": (spec | {"model": {"type": "WordPiece", "vocab": {"[UNK]": 0, "a": 1}, "unk_token": "[UNK]",
                                        "continuing_subword_prefix": "##", "max_input_chars_per_word": 100},
                              "pre_tokenizer": {"type": "BertPreTokenizer"}, "post_processor": None,
                              "added_tokens": []}, "not a byte-level BPE"),
        "no_mask": (spec | {"added_tokens": [t for t in spec["added_tokens"] if t["content"] != "[MASK]"],
                            "model": spec["model"] | {"vocab": {t: i for t, i in spec["model"]["vocab"].items()
                                                                if t != "<mask>"}}},  # roberta_bpe's own
                    r"no mask token \(expected one of \[MASK\], <mask>\)"),
        "no_template": (spec | {"post_processor": None}, "expected cls sep"),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / name / "tokenizer.json"
        path.parent.mkdir()
        path.write_text(json.dumps(content))
        with pytest.raises(VocabError, match=message):
            TokenizerJson(path)
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(VocabError, match="broken.json: not valid UTF-8 JSON"):
        TokenizerJson(tmp_path / "broken.json")
