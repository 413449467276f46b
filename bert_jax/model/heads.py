"""Task heads on top of the encoder. Parameter names follow Google's and Hugging Face's checkpoints.

Axis letters: B batch, L length, P masked positions, D embed, V vocabulary.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from bert_jax.model import axes
from bert_jax.model.activation_sharding import constrain
from bert_jax.model.config import BertConfig
from bert_jax.model.dropout import Dropout
from bert_jax.model.layers import activation, dense, layer_norm


def gather_positions(sequence: jax.Array, positions: jax.Array) -> jax.Array:
    """[batch, length, embed] at [batch, P] positions → [batch, P, embed]."""
    return jnp.take_along_axis(sequence, positions[..., None].astype(jnp.int32), axis=1)


class MaskedLMHead(nnx.Module):
    """transform (dense embed → E + act + LayerNorm) → decoder tied to the E-wide word embeddings +
    output bias (E = hidden for BERT; ALBERT and ELECTRA's generator decode through E < hidden).

    Given ``masked_lm_positions`` it gathers those P positions *before* the vocabulary projection,
    as the original does, so it costs P/L of a dense head.
    """

    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
        self.act = activation(cfg)
        self.transform = dense(cfg, cfg.hidden_size, cfg.embed_dim, (axes.EMBED, None), rngs=rngs, bias=cfg.use_bias)
        self.layer_norm = layer_norm(cfg, rngs=rngs, width=cfg.embed_dim)
        self.output_bias = nnx.Param(
            jnp.zeros((cfg.vocab_size,), cfg.param_dtype), **axes.metadata(axes.VOCAB)
        )

    def __call__(self, sequence_output, word_embeddings: nnx.Embed, positions=None):
        # sequence_output: [batch, length, embed]; positions: [batch, P] int32 or None (all)
        x = sequence_output if positions is None else gather_positions(sequence_output, positions)
        x = self.layer_norm(self.act(self.transform(x)))  # [batch, P, E]
        logits = constrain(word_embeddings.attend(x), axes.ACT_BATCH, None, axes.ACT_VOCAB)  # [batch, P, vocab]
        return logits.astype(jnp.float32) + self.output_bias[...]


class ClassificationHead(nnx.Module):
    """dropout → dense(embed → num_labels). NSP/SOP (2 labels on the pooled output), sequence
    classification and regression (num_labels = 1), or token classification (applied per token)."""

    def __init__(self, cfg: BertConfig, num_labels: int, *, rngs: nnx.Rngs, dropout: bool = True):
        if num_labels < 1:
            raise ValueError(f"num_labels must be >= 1, got {num_labels}")
        self.dense = dense(cfg, cfg.hidden_size, num_labels, (axes.EMBED, None), rngs=rngs)
        self.dropout = Dropout(cfg.hidden_dropout_prob if dropout else 0.0, cfg.dropout_impl)

    def __call__(self, x, *, deterministic=True, rngs=None):
        # x: [batch, embed] or [batch, length, embed]
        x = self.dropout(x, deterministic=deterministic, rngs=rngs)
        return self.dense(x).astype(jnp.float32)  # [batch, (length,) num_labels]


class ReplacedTokenHead(nnx.Module):
    """ELECTRA's discriminator head: dense(embed → embed) → act → dense(embed → 1): a logit per token
    that it was replaced by the generator.

    ``prior`` in (0, 1) starts the output bias at its logit, log(p / (1 - p)), so that the untrained
    head already predicts the replaced fraction (the "prior" initialisation of a classifier's bias
    in Lin et al., 2017, the focal-loss paper). With a zero bias, the first steps' gradient asks
    every token's last hidden state to move the same way (down to the prior); at a short warmup
    that common direction swamps token identity for a while (docs/records.md, "The
    discriminator's output bias"). 0, the default, keeps the zero bias of the paper's code: at the
    demo's budget a prior raises the AUC but lets this head's readout take over the last layer, and
    the checkpoint fine-tunes worse (docs/records.md, "What the discriminator's last layer holds")."""

    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs, prior: float = 0.0):
        if not 0.0 <= prior < 1.0:
            raise ValueError(f"prior={prior}: expected 0 (zero bias) or a replaced fraction in (0, 1)")
        self.act = activation(cfg)
        self.dense = dense(cfg, cfg.hidden_size, cfg.hidden_size, (axes.EMBED, None), rngs=rngs)
        self.prediction = dense(cfg, cfg.hidden_size, 1, (axes.EMBED, None), rngs=rngs)
        if prior:
            self.prediction.bias[...] = jnp.full((1,), math.log(prior / (1.0 - prior)), cfg.param_dtype)  # [1]

    def __call__(self, sequence_output):
        # sequence_output: [batch, length, embed]
        h = self.act(self.dense(sequence_output))  # [batch, length, embed]
        return self.prediction(h)[..., 0].astype(jnp.float32)  # [batch, length]


class SpanHead(nnx.Module):
    """Span QA: dense(embed → 2) per token → start and end logits."""

    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
        self.dense = dense(cfg, cfg.hidden_size, 2, (axes.EMBED, None), rngs=rngs)

    def __call__(self, sequence_output, input_mask):
        # sequence_output: [batch, length, embed]; input_mask: [batch, length]
        logits = self.dense(sequence_output).astype(jnp.float32)  # [batch, length, 2]
        logits = jnp.where(input_mask[..., None] > 0, logits, -1e9)  # never predict padding
        return logits[..., 0], logits[..., 1]  # start, end: [batch, length]
