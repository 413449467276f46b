"""What the heads attend to: a text (or pair) through the encoder, keeping the attention probabilities.

`load` opens a checkpoint (any spec fine-tuning's ``init_checkpoint`` takes: ``hf:DIR``, ``tf:PREFIX``,
``orbax:DIR``, a pre-training or fine-tuning workdir; ``pkg:`` names resolved) with its tokenizer;
`attention_of` runs one input and returns an `Attention`: the tokens and, for every layer and head,
the [query, key] probabilities over the real tokens. Inputs are padded to a few bucket lengths so a
long-running caller (the server) compiles a handful of programs, not one per text length.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
from flax import nnx

BUCKETS = (16, 32, 64, 128, 256, 512)  # padded lengths: one compiled program per bucket used
DEFAULT_MAX_LENGTH = 128  # tokens kept by default (fewer when the checkpoint's position table is shorter)


@dataclasses.dataclass
class Attention:
    tokens: list[str]  # the input as the model saw it, [CLS] ... [SEP] (after any truncation)
    segment_ids: list[int]  # [length]
    probs: np.ndarray  # float32 [layers, heads, length, length]: query row -> key column, rows sum to 1
    truncated: bool  # the input was longer than max_seq_length and lost tokens from its end(s)
    total_tokens: int  # tokens the input had before truncation (specials included)

    @property
    def num_layers(self) -> int:
        return self.probs.shape[0]

    @property
    def num_heads(self) -> int:
        return self.probs.shape[1]


def load(init: str, vocab: str | None = None):
    """→ (encoder with the checkpoint's weights, dropout off; its tokenizer). One-line errors name
    the checkpoint or vocabulary that is missing or does not fit."""
    from bert_jax.finetuning.warm_start import open_init_checkpoint
    from bert_jax.model.encoder import BertEncoder
    from bert_jax.model.models import create
    from input_pipeline.package_data import locate
    from input_pipeline.tokenizers.factory import load_tokenizer

    warm = open_init_checkpoint(init)
    vocab = vocab or warm.vocab_file or _finetuning_vocab(init)
    if vocab is None:
        raise ValueError(f"{init}: no vocabulary beside the checkpoint (vocab.txt, vocab.json + merges.txt or "
                         f"spiece.model) and none in its workdir config; pass --vocab")
    tokenizer = load_tokenizer(locate(str(vocab)))
    if tokenizer.vocab_size != warm.config.vocab_size:
        raise ValueError(f"{vocab} has {tokenizer.vocab_size} tokens but the checkpoint {init} has "
                         f"vocab_size {warm.config.vocab_size}")
    model = create(BertEncoder, warm.config.deterministic())
    warm.load_encoder(model)
    return model, tokenizer


def _finetuning_vocab(init: str) -> str | None:
    """A fine-tuning workdir's vocabulary: its config.json's ``vocab``, else its ``init_checkpoint``'s."""
    import json
    from pathlib import Path

    from bert_jax.finetuning.warm_start import open_init_checkpoint
    from input_pipeline.package_data import locate

    path = Path(locate(init.removeprefix("orbax:")))
    for directory in (path, path.parent, path.parent.parent):  # the workdir, checkpoints/, a step
        if (directory / "config.json").is_file() and (directory / "checkpoints").is_dir():
            config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
            if "vocab" in config and config["vocab"]:  # a fine-tuning workdir's (pre-training has data.vocab)
                return config["vocab"]
            if config["init_checkpoint"]:  # both kinds of workdir have it
                return open_init_checkpoint(config["init_checkpoint"]).vocab_file
    return None


def model_max_length(model) -> int:
    """The longest row (specials included) the encoder's position table takes."""
    cfg = encoder_of(model).cfg
    return cfg.max_position_embeddings - cfg.position_offset


def encoder_of(model):
    """The `BertEncoder` of an encoder or of a model with task heads (its ``.bert``)."""
    return getattr(model, "bert", model)


def _bucket(length: int, limit: int) -> int:
    """The padded length for ``length`` real tokens: the next bucket, at most ``limit`` (>= length)."""
    return min(next((b for b in BUCKETS if b >= length), length), limit)


@nnx.jit
def _forward(encoder, ids, mask, seg):
    """ids, mask, seg int32 [1, padded] → float32 [layers, 1, heads, padded, padded]."""
    return encoder(ids, mask, seg, output_attentions=True).attentions.astype(jnp.float32)


def attention_of(model, tokenizer, text: str, text_b: str | None = None, *,
                 max_seq_length: int | None = None) -> Attention:
    """Runs ``text`` (and ``text_b``, as a pair) through the encoder. Inputs longer than
    ``max_seq_length`` tokens (default: `DEFAULT_MAX_LENGTH`, or the checkpoint's limit if shorter)
    are truncated as BERT's extract_features.py does (the longer segment loses tokens from its end)
    and the result says so."""
    import tensorflow as tf

    from bert_jax.interop.extract_features import encode_inputs

    if not isinstance(text, str) or not text.strip():
        raise ValueError("--text: expected a non-empty text")
    if text_b is not None and not text_b.strip():
        raise ValueError("--text_b: expected a non-empty text when given")
    model_max = model_max_length(model)
    max_seq_length = min(DEFAULT_MAX_LENGTH, model_max) if max_seq_length is None else max_seq_length
    if not 3 <= max_seq_length <= model_max:
        raise ValueError(f"--max_seq_length {max_seq_length}: expected 3..{model_max} for this checkpoint")
    pieces = tokenizer.tokenize(tf.constant([text] + ([text_b] if text_b is not None else []))).to_list()
    total = 2 + len(pieces[0]) + (tokenizer.pair_separators + len(pieces[1]) if text_b is not None else 0)
    input_ids, _, segment_ids, tokens = encode_inputs(tokenizer, [(text, text_b)], max_seq_length, model_max)
    n = len(tokens[0])  # real tokens; encode_inputs padded to max_seq_length
    padded = _bucket(n, max_seq_length)
    ids = np.full((1, padded), tokenizer.pad_id, np.int32)
    mask, seg = np.zeros((1, padded), np.int32), np.zeros((1, padded), np.int32)
    ids[0, :n], mask[0, :n], seg[0, :n] = input_ids[0, :n], 1, segment_ids[0, :n]
    probs = np.asarray(_forward(encoder_of(model), ids, mask, seg))[:, 0, :, :n, :n]  # [layers, heads, n, n]
    return Attention(tokens[0], segment_ids[0, :n].tolist(), probs, total > n, total)
