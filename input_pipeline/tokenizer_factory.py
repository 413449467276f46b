"""`load_tokenizer`: the right BERT tokenizer for a vocabulary file or a directory holding one.

* ``*.model`` → `SentencePieceTokenizer` (with the ``vocab.txt`` beside it, when there is one, checked
  against the model);
* ``*.txt`` (``vocab.txt``) → `WordPieceTokenizer`;
* a directory → its ``spm.model`` (or its only ``*.model``) if it has one, else its ``vocab.txt``.
  build_vocab writes both files for SentencePiece vocabularies, so the model wins.
"""

from __future__ import annotations

import os
from pathlib import Path

from input_pipeline.sentencepiece_tokenizer import SentencePieceTokenizer
from input_pipeline.tokenizers import WordPieceTokenizer
from input_pipeline.vocab import VocabError

Tokenizer = WordPieceTokenizer | SentencePieceTokenizer
SPM_MODEL = "spm.model"
VOCAB_TXT = "vocab.txt"


def load_tokenizer(path_or_dir: str | os.PathLike) -> Tokenizer:
    """A `WordPieceTokenizer` for a vocab.txt, a `SentencePieceTokenizer` for a .model file (or a
    directory holding one of them); `VocabError` naming the path otherwise."""
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
        if (path / VOCAB_TXT).is_file():
            return WordPieceTokenizer(path / VOCAB_TXT)
        raise VocabError(f"{path}: no tokenizer here (expected {VOCAB_TXT} for WordPiece or a "
                         f"SentencePiece *.model)")
    if not path.is_file():
        raise VocabError(f"{path}: no such file or directory (expected a {VOCAB_TXT}, a SentencePiece "
                         f".model, or a directory holding one)")
    if path.suffix == ".model":
        return SentencePieceTokenizer(path)
    if path.suffix == ".txt":
        return WordPieceTokenizer(path)
    raise VocabError(f"{path}: unknown kind of vocabulary file (expected a WordPiece *.txt such as "
                     f"{VOCAB_TXT} or a SentencePiece *.model)")
