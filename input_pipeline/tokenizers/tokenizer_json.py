"""A byte-level BPE read from a Hugging Face ``tokenizer.json`` (ModernBERT's: GPT-NeoX style).

The file is run as it is by the ``tokenizers`` package (``Tokenizer.from_file``: its normalizer,
pre-tokenizer, BPE model and added tokens), with `RobertaBPETokenizer`'s interface and byte-level
behaviour (``tokenize`` without specials, whole words by ``Ġ``, ``word_prefix``). The sequence layout
comes from the file's post-processor, read by encoding two empty texts: ``cls a sep`` for one text,
``cls a sep×k b sep`` for a pair, b in segment ``segment_b`` (ModernBERT's template
``[CLS] $A [SEP] $B:1 [SEP]:1``: k = 1, segment 1, as BERT). A post-processor that adds anything
else is refused. The specials are found by name: pad ``[PAD]``/``<pad>``/``<|padding|>``, mask
``[MASK]``/``<mask>``, unk ``[UNK]``/``<unk>``; ``special_ids`` are every added special token (so
ModernBERT's ``[unused*]`` are never masked in nor drawn as replacements).
tests/input_pipeline/test_tokenizer_json.py checks the ids against transformers'
``AutoTokenizer`` on real text (tests/golden/modernbert_l3/tokenizer_ids.npz).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import tensorflow as tf
from tokenizers import Tokenizer

from input_pipeline.tokenizers.bpe import WORD_START, RobertaBPETokenizer
from input_pipeline.tokenizers.vocab import VocabError

__all__ = ["TOKENIZER_JSON", "TokenizerJson"]

TOKENIZER_JSON = "tokenizer.json"
ROLES = {"pad": ("[PAD]", "<pad>", "<|padding|>"), "mask": ("[MASK]", "<mask>"), "unk": ("[UNK]", "<unk>")}


def _byte_level(pre_tokenizer: dict | None) -> bool:
    if not pre_tokenizer:
        return False
    if pre_tokenizer.get("type") == "Sequence":
        return any(_byte_level(p) for p in pre_tokenizer.get("pretokenizers", []))
    return pre_tokenizer.get("type") == "ByteLevel"


class TokenizerJson(RobertaBPETokenizer):
    """A ``tokenizer.json`` byte-level BPE (ModernBERT's) with `RobertaBPETokenizer`'s interface."""

    def __init__(self, path: str | os.PathLike):
        path = Path(path)
        self.vocab_file = self.merges_file = os.fspath(path)
        if not path.is_file():
            raise VocabError(f"{path}: tokenizer file not found")
        try:
            spec = json.loads(path.read_bytes().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise VocabError(f"{path}: not valid UTF-8 JSON ({e})") from None
        model, pre = (spec.get(k) or {} for k in ("model", "pre_tokenizer")) if isinstance(spec, dict) else ({}, {})
        if model.get("type") != "BPE" or not _byte_level(pre):
            raise VocabError(f"{path}: not a byte-level BPE (model {model.get('type')!r}, pre_tokenizer "
                             f"{pre.get('type')!r}); a WordPiece checkpoint's vocabulary is its vocab.txt")
        try:
            self._bpe = Tokenizer.from_file(str(path))
        except Exception as e:  # noqa: BLE001 - the tokenizers package raises a bare Exception
            raise VocabError(f"{path}: not a tokenizers tokenizer.json ({e})") from None
        self._bpe.no_truncation()  # the pipeline truncates and pads itself
        self._bpe.no_padding()
        index = self._bpe.get_vocab(with_added_tokens=True)  # {token: id}
        self.vocab_size = max(index.values()) + 1
        self.vocab = [""] * self.vocab_size  # ids no token holds stay "" (none in ModernBERT's)
        for token, i in index.items():
            self.vocab[i] = token
        ids = {}
        for role, names in ROLES.items():
            found = [index[n] for n in names if n in index]
            if not found:
                raise VocabError(f"{path}: no {role} token (expected one of {', '.join(names)})")
            ids[role] = found[0]
        self.pad_id, self.mask_id, self.unk_id = ids["pad"], ids["mask"], ids["unk"]
        single = self._bpe.encode("", add_special_tokens=True).ids
        pair = self._bpe.encode("", "", add_special_tokens=True)
        if len(single) != 2 or len(pair.ids) < 3 or pair.ids[0] != single[0] or set(pair.ids[1:]) != {single[1]}:
            raise VocabError(f"{path}: its post_processor makes {single} of one empty text and {pair.ids} of two; "
                             "expected cls sep and cls sep... sep (a BERT-style template)")
        self.cls_id, self.sep_id = single
        self.pair_separators = len(pair.ids) - 2
        self.segment_b = pair.type_ids[-1]
        if pair.type_ids != [0] * (len(pair.ids) - 1) + [self.segment_b]:
            raise VocabError(f"{path}: its pair template's type ids {pair.type_ids} are not 0... then b's")
        added = spec.get("added_tokens") or []
        self.special_ids = frozenset({t["id"] for t in added if t.get("special")} | {*ids.values(), *single})
        self._continuation = tf.constant(
            [not t.startswith(WORD_START) and i not in self.special_ids for i, t in enumerate(self.vocab)], tf.bool)

    def __repr__(self) -> str:
        return f"TokenizerJson({self.vocab_file!r}, vocab_size={self.vocab_size})"
