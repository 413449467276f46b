"""Fixtures shared by the task tests: tokenizers over small GLUE and NER vocabularies, CoNLL files,
logits that predict the gold tags, and SQuAD tasks featurized from official-format files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from input_pipeline.tokenizers.wordpiece import WordPieceTokenizer

GLUE_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "?", "the", "a", "plane", "is", "taking",
              "off", "air", "an", "##s"] + [f"w{i}" for i in range(40)] + [f"v{i}" for i in range(40)]
NER_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "eu", "rejects", "german", "call", "to",
             "boycott", "british", "lamb", ".", "peter", "black", "##burn", "said", "brussels",
             "results", ":", "ajax", "amsterdam", "psv", "eindhoven", "un", "##believ", "##ably"]
SQUAD_WINDOW = 64, 16, 12  # max_seq_length, doc_stride, max_query_length of the `squad` features


def _tokenizer(directory: Path, words: list[str]) -> WordPieceTokenizer:
    path = directory / "vocab.txt"
    path.write_text("\n".join(words) + "\n", encoding="utf-8")
    return WordPieceTokenizer(path)


@pytest.fixture(scope="session")
def glue_tok(tmp_path_factory) -> WordPieceTokenizer:
    return _tokenizer(tmp_path_factory.mktemp("glue_vocab"), GLUE_VOCAB)


@pytest.fixture(scope="session")
def ner_tok(tmp_path_factory) -> WordPieceTokenizer:
    return _tokenizer(tmp_path_factory.mktemp("ner_vocab"), NER_VOCAB)


@pytest.fixture(scope="session")
def ner_ids() -> dict[str, int]:
    """Token → id in `ner_tok`'s vocabulary."""
    return {t: i for i, t in enumerate(NER_VOCAB)}


@pytest.fixture
def conll_dir(tmp_path, conll_text) -> Path:
    """train.txt, valid.txt and test.txt, each the CoNLL sample text."""
    for name in ("train.txt", "valid.txt", "test.txt"):
        (tmp_path / name).write_text(conll_text, encoding="utf-8")
    return tmp_path


def _one_hot_logits(task, features, seed=0):
    """Logits whose argmax is the gold label at first sub-tokens and noise elsewhere."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(*features["input_ids"].shape, task.num_labels)).astype(np.float32)
    rows, cols = np.nonzero(features["label_mask"])
    logits[rows, cols] = 0.0
    logits[rows, cols, features["label_ids"][rows, cols]] = 10.0
    return logits


@pytest.fixture(scope="session")
def one_hot_logits():
    """``one_hot_logits(task, features, seed=0)``: NER logits that predict the gold tags."""
    return _one_hot_logits


@pytest.fixture(scope="session")
def squad_window():
    """(max_seq_length, doc_stride, max_query_length) of the `squad` features."""
    return SQUAD_WINDOW


@pytest.fixture(scope="session", params=["1.1", "2.0"])
def squad(request, tmp_path_factory, minilm_tokenizer, squad_json):
    """(task, {split: (examples, features)}) for one version, from official-format files. Shared by
    the SQuAD test modules: tests read it and must not change it."""
    from input_pipeline.tasks.squad import SquadTask

    L, STRIDE, QLEN = SQUAD_WINDOW
    version = request.param
    d = tmp_path_factory.mktemp(f"squad{version}")
    for split in ("train", "dev"):
        (d / f"{split}-v{version}.json").write_text(json.dumps(squad_json(version)))
    task = SquadTask(version, data_dir=str(d), doc_stride=STRIDE, max_query_length=QLEN)
    data = {}
    for split in ("train", "dev"):
        examples = task.load(split)
        data[split] = examples, task.featurize(examples, minilm_tokenizer, L)
    return task, data
