"""`load_tokenizer`: the right tokenizer for a vocabulary file or a directory holding one.

* ``*.model`` → `SentencePieceTokenizer` (with the ``vocab.txt`` beside it, when there is one, checked
  against the model);
* ``vocab.json`` or ``merges.txt`` → `RobertaBPETokenizer` (RoBERTa's byte-level BPE: the
  ``vocab.json`` and ``merges.txt`` side by side);
* ``*.txt`` (``vocab.txt``) → `WordPieceTokenizer`;
* ``tokenizer.json`` → `TokenizerJson` (a Hugging Face byte-level BPE such as ModernBERT's);
* a directory → its ``spm.model`` (or its only ``*.model``) if it has one, else its ``vocab.json`` +
  ``merges.txt`` or its ``vocab.txt`` (both kinds in one directory is an error: name the file), else
  its ``tokenizer.json`` (Hugging Face directories of the older families carry one beside their
  vocabulary files, which win). build_vocab writes both a model and a vocab.txt for SentencePiece
  vocabularies, so the model wins.
"""

from __future__ import annotations

import os
from pathlib import Path

from input_pipeline.files import is_url
from input_pipeline.tokenizers.bpe import MERGES_TXT, VOCAB_JSON, RobertaBPETokenizer
from input_pipeline.tokenizers.sentencepiece_model import SentencePieceTokenizer
from input_pipeline.tokenizers.tokenizer_json import TOKENIZER_JSON, TokenizerJson
from input_pipeline.tokenizers.vocab import VocabError
from input_pipeline.tokenizers.wordpiece import WordPieceTokenizer

Tokenizer = WordPieceTokenizer | SentencePieceTokenizer | RobertaBPETokenizer  # TokenizerJson is a RobertaBPETokenizer
SPM_MODEL = "spm.model"
VOCAB_TXT = "vocab.txt"


def load_tokenizer(path_or_dir: str | os.PathLike) -> Tokenizer:
    """A `WordPieceTokenizer` for a vocab.txt, a `SentencePieceTokenizer` for a .model file, a
    `RobertaBPETokenizer` for a vocab.json (merges.txt beside it), a `TokenizerJson` for a
    tokenizer.json, or for a directory holding one of them; `VocabError` naming the path otherwise.
    A URL (``gs://``) must name a WordPiece ``*.txt``; a package's data by name
    (``pkg:minilm/vocab.txt``, `input_pipeline.package_data.locate`) is located."""
    if os.fspath(path_or_dir).startswith("pkg:"):
        from input_pipeline.package_data import locate

        path_or_dir = locate(os.fspath(path_or_dir))
    if is_url(path_or_dir):
        url = os.fspath(path_or_dir)
        if not url.endswith(".txt"):
            raise VocabError(f"{url}: a vocabulary in a bucket must be a WordPiece {VOCAB_TXT} (*.txt); copy "
                             f"SentencePiece models, byte-level BPE files and vocabulary directories to a local path")
        return WordPieceTokenizer(url)
    path = Path(path_or_dir)
    if path.is_dir():
        models = sorted(path.glob("*.model"))
        if (path / SPM_MODEL).is_file():
            models = [path / SPM_MODEL]
        if len(models) > 1:
            raise VocabError(f"{path}: several SentencePiece models ({', '.join(m.name for m in models)});"
                             f" name the one to use")
        if models:
            vocab = models[0].with_name(VOCAB_TXT)
            return SentencePieceTokenizer(models[0], vocab_file=vocab if vocab.is_file() else None)
        bpe, wordpiece = (path / VOCAB_JSON).is_file(), (path / VOCAB_TXT).is_file()
        if bpe and wordpiece:
            raise VocabError(f"{path}: both {VOCAB_JSON} (byte-level BPE) and {VOCAB_TXT} (WordPiece); "
                             f"name the file to use")
        if bpe:
            return RobertaBPETokenizer(path / VOCAB_JSON)
        if wordpiece:
            return WordPieceTokenizer(path / VOCAB_TXT)
        if (path / TOKENIZER_JSON).is_file():
            return TokenizerJson(path / TOKENIZER_JSON)
        hint = f" ({MERGES_TXT} without a {VOCAB_JSON})" if (path / MERGES_TXT).is_file() else ""
        raise VocabError(f"{path}: no tokenizer here{hint} (expected {VOCAB_TXT} for WordPiece, "
                         f"{VOCAB_JSON} + {MERGES_TXT} for byte-level BPE, a SentencePiece *.model or a "
                         f"{TOKENIZER_JSON})")
    if not path.is_file():
        raise VocabError(f"{path}: no such file or directory (expected a {VOCAB_TXT}, a {VOCAB_JSON}, a "
                         f"SentencePiece .model, or a directory holding one)")
    if path.suffix == ".model":
        return SentencePieceTokenizer(path)
    if path.name == VOCAB_JSON:
        return RobertaBPETokenizer(path)
    if path.name == MERGES_TXT:
        return RobertaBPETokenizer(path.with_name(VOCAB_JSON), path)
    if path.name == TOKENIZER_JSON:
        return TokenizerJson(path)
    if path.suffix == ".txt":
        return WordPieceTokenizer(path)
    raise VocabError(f"{path}: unknown kind of vocabulary file (expected a WordPiece *.txt such as "
                     f"{VOCAB_TXT}, a byte-level BPE {VOCAB_JSON}, a SentencePiece *.model or a {TOKENIZER_JSON})")


def open_tokenizer(source: str | os.PathLike, lower_case: bool | None = None) -> Tokenizer:
    """`load_tokenizer(source)`, with ``lower_case`` (None: as the vocabulary says) applied to a
    WordPiece vocabulary; the others fix their own case, and a ``lower_case`` that differs from it is
    a `VocabError` naming the file (create_pretraining_data's ``--lower_case``)."""
    tokenizer = load_tokenizer(source)
    if lower_case is None or lower_case == tokenizer.lower_case:
        return tokenizer
    if isinstance(tokenizer, WordPieceTokenizer):
        return WordPieceTokenizer(tokenizer.vocab_file, lower_case=lower_case)
    raise VocabError(f"{source_file(tokenizer)}: lower_case={lower_case} applies to WordPiece vocabularies; "
                     f"this {type(tokenizer).__name__} fixes its own case (lower_case={tokenizer.lower_case}): "
                     "leave it auto")


def source_file(tokenizer: Tokenizer) -> str:
    """The file `open_tokenizer` opens ``tokenizer`` from again (a worker process's copy): the
    SentencePiece model, the vocab.txt, the vocab.json (merges.txt beside it) or the tokenizer.json."""
    return getattr(tokenizer, "model_file", None) or tokenizer.vocab_file
