"""A SentencePiece model (``.model``) as a BERT tokenizer with `WordPieceTokenizer`'s interface.

``tokenize`` runs ``tensorflow_text.SentencepieceTokenizer`` (eagerly and inside tf.data /
tf.function) and gives the ids of the ``sentencepiece`` Python package's ``encode`` (no sampling,
no BOS/EOS). Normalisation, lower-casing included, is the model's own: a model trained with a
case-folding rule (``nmt_nfkc_cf``, what ``build_vocab --lower_case`` uses) reports
``lower_case=True``.

The model must hold BERT's special tokens ``[PAD] [UNK] [CLS] [SEP] [MASK]`` as special pieces
(control or user-defined symbols; ``[UNK]`` must be the model's unknown piece), as
``python -m input_pipeline.build_vocab --model_type unigram|bpe`` trains them; ALBERT's released
``spiece.model`` spells the first two ``<pad> <unk>`` (`ALIASES`), which is taken too. Anything else
is a `VocabError` naming the file and the missing token.

Whole-word masking: a piece that does not start with ``▁`` (U+2581, SentencePiece's word-boundary
mark) continues the previous word; special pieces never do.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import tensorflow as tf
import tensorflow_text as tf_text
from sentencepiece import SentencePieceProcessor

from input_pipeline.tokenizers.sentencepiece_proto import PIECE_TYPES, model_proto_class
from input_pipeline.tokenizers.vocab import (
    SPECIAL_TOKENS,
    BertPairEncoding,
    VocabError,
    flags_of,
    load_vocab,
    tokens_of,
)

__all__ = ["SentencePieceTokenizer", "WORD_START"]

WORD_START = "\u2581"  # "▁": SentencePiece's mark for a piece that begins a word
_SPECIAL_TYPES = {PIECE_TYPES["CONTROL"]: "control", PIECE_TYPES["USER_DEFINED"]: "user-defined",
                  PIECE_TYPES["UNKNOWN"]: "unknown"}
_TYPE_NAMES = {number: name for name, number in PIECE_TYPES.items()}
# Other spellings of a special token, as ALBERT's spiece.model has them (<pad> = 0, <unk> = 1).
ALIASES = {"[PAD]": "<pad>", "[UNK]": "<unk>"}


def _load_model(path: Path) -> tuple[bytes, object]:
    """The serialized model and its parsed proto; a `VocabError` naming ``path`` if unusable."""
    if not path.is_file():
        raise VocabError(f"{path}: SentencePiece model file not found")
    data = path.read_bytes()
    proto = model_proto_class()()
    try:
        proto.ParseFromString(data)
    except Exception as e:  # google.protobuf.message.DecodeError
        raise VocabError(f"{path}: not a SentencePiece model ({e})") from None
    if not proto.pieces:
        raise VocabError(f"{path}: not a SentencePiece model (no pieces)")
    return data, proto


class SentencePieceTokenizer(BertPairEncoding):
    """BERT tokenizer over a SentencePiece model; ``tokenize`` is pure TF (graph-safe).

    ``vocab_file`` (optional): a BERT-style vocab.txt written beside the model (build_vocab does);
    it is checked to list exactly the model's pieces in id order.
    """

    pair_separators = 1  # a pair is [CLS] a [SEP] b [SEP]: one [SEP] between a and b
    segment_b = 1  # segment id of b and its [SEP]

    def __init__(self, model_file: str | os.PathLike, *, vocab_file: str | os.PathLike | None = None):
        self.model_file = os.fspath(model_file)
        data, proto = _load_model(Path(model_file))
        self._sp = SentencePieceProcessor(model_proto=data)
        self.vocab: list[str] = [p.piece for p in proto.pieces]
        self.vocab_size = len(self.vocab)
        if vocab_file is not None:
            listed = load_vocab(vocab_file)
            if listed != self.vocab:
                diff = next((i for i, (a, b) in enumerate(zip(listed, self.vocab, strict=False)) if a != b),
                            min(len(listed), len(self.vocab)))
                raise VocabError(f"{vocab_file}: does not match {self.model_file} (first difference "
                                 f"at id {diff}; {len(listed)} vs {self.vocab_size} pieces)")
        ids = self._special_ids(proto)
        self.pad_id, self.unk_id = ids["[PAD]"], ids["[UNK]"]
        self.cls_id, self.sep_id, self.mask_id = ids["[CLS]"], ids["[SEP]"], ids["[MASK]"]
        special = {i for i, p in enumerate(proto.pieces) if p.type in _SPECIAL_TYPES}
        self.special_ids = frozenset(ids.values())
        # The model lower-cases iff its normalisation rule folds case (nmt_nfkc_cf, nfkc_cf).
        self.lower_case = proto.normalizer_spec.name.endswith("_cf")
        self._tokenizer = tf_text.SentencepieceTokenizer(model=data, out_type=tf.int32)
        # A partial: one tokenizer's trace is not counted with every other's (wordpiece.py says why).
        self._tokenize_graph = tf.function(
            functools.partial(tf_text.SentencepieceTokenizer.tokenize, self._tokenizer),
            input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
        self._continuation = tf.constant(
            [not p.startswith(WORD_START) and i not in special for i, p in enumerate(self.vocab)],
            tf.bool)

    def _special_ids(self, proto) -> dict[str, int]:  # proto: sentencepiece_proto.model_proto_class()
        index = {p.piece: i for i, p in enumerate(proto.pieces)}
        for token, alias in ALIASES.items():
            if token not in index and alias in index:
                index[token] = index[alias]
        missing = [t for t in SPECIAL_TOKENS if t not in index]
        if missing:
            raise VocabError(
                f"{self.model_file}: no {', '.join(missing)} piece (a BERT SentencePiece model needs "
                f"{', '.join(SPECIAL_TOKENS)} as control/user-defined symbols, [PAD] [UNK] or ALBERT's "
                f"<pad> <unk>; train one with "
                f"`python -m input_pipeline.build_vocab --model_type unigram`)")
        for token in SPECIAL_TOKENS:
            kind = proto.pieces[index[token]].type
            if kind not in _SPECIAL_TYPES:
                raise VocabError(f"{self.model_file}: {token} is an ordinary piece (type "
                                 f"{_TYPE_NAMES.get(kind, kind)}), not a control/user-defined symbol")
        unk = self._sp.unk_id()
        if unk != index["[UNK]"]:
            raise VocabError(f"{self.model_file}: the unknown piece is {self.vocab[unk]!r} (id {unk}), "
                             f"not [UNK] or <unk> (train with unk_piece='[UNK]')")
        return {t: index[t] for t in SPECIAL_TOKENS}

    def __repr__(self) -> str:
        return (f"SentencePieceTokenizer({self.model_file!r}, vocab_size={self.vocab_size}, "
                f"lower_case={self.lower_case})")

    def tokenize(self, texts: tf.Tensor) -> tf.RaggedTensor:
        """[batch] tf.string -> int32 [batch, (tokens)] piece ids, without [CLS]/[SEP].

        Eagerly, and inside tf.data / tf.function; one traced graph serves every batch size.
        """
        texts = tf.convert_to_tensor(texts, tf.string)
        if texts.shape.rank not in (1, None):
            raise ValueError(f"tokenize expects a [batch] string tensor, got shape {texts.shape}")
        return self._tokenize_graph(texts)

    def encode_python(self, texts: list[str]) -> list[list[int]]:
        """The ``sentencepiece`` package's own ids (what ``tokenize`` reproduces in-graph)."""
        return self._sp.encode(list(texts))

    def is_continuation(self, ids: tf.Tensor) -> tf.Tensor:
        """True where the piece does not start with ``▁`` (continues a word); specials are False."""
        return flags_of(self._continuation, ids)

    def id_to_token(self, ids) -> list[str]:
        """Pieces for ids (int, list, numpy array, tf tensor or ragged tensor), flattened."""
        return tokens_of(ids, self.vocab, self.model_file)
