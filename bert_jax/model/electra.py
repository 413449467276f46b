"""ELECTRA (Clark et al., 2020): replaced-token detection with a generator and a discriminator.

The generator is a small masked-LM (`electra_generator_config`: the discriminator's config with
hidden, heads and feed-forward scaled by ``generator_fraction``) that reads the discriminator's
embedding tables (token, position, type: one set, ``bert/embeddings``) through its own projection.
Masked positions are filled with samples from its softmax (Gumbel-max, no gradient through the
sample), and the discriminator — the usual encoder at ``.bert``, what fine-tuning and feature
extraction restore — labels every real token original or replaced. The losses live in
`bert_jax.pretraining.objective`: generator MLM + ``rtd_weight`` · discriminator BCE.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from bert_jax.model.config import BertConfig
from bert_jax.model.encoder import BertEncoder, EncoderOutput, packed_mask, packed_positions
from bert_jax.model.heads import MaskedLMHead, ReplacedTokenHead


def electra_generator_config(cfg: BertConfig, fraction: float) -> BertConfig:
    """The generator's config: hidden, heads and feed-forward width × ``fraction`` (the paper:
    1/4 for small, 1/3 for base and large), the same depth and the discriminator's embedding width."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"generator_fraction={fraction}: expected a number in (0, 1]")
    heads = max(1, round(cfg.num_heads * fraction))
    hidden = max(heads, round(cfg.hidden_size * fraction / heads) * heads)  # divisible by heads
    return dataclasses.replace(cfg, hidden_size=hidden, num_heads=heads, embedding_size=cfg.embed_dim,
                               intermediate_size=max(1, round(cfg.intermediate_size * fraction)),
                               use_pooler=False)


def replace_masked(input_ids, positions, weights, values):
    """``input_ids`` [batch, length] with ``values`` [batch, P] written at ``positions`` [batch, P]
    where ``weights`` > 0 (padding prediction slots leave the row as it is)."""
    rows = jnp.arange(input_ids.shape[0])[:, None]  # [batch, 1]
    current = jnp.take_along_axis(input_ids, positions, axis=1)  # [batch, P]
    return input_ids.at[rows, positions].set(jnp.where(weights > 0, values, current).astype(input_ids.dtype))


class ElectraOutput(NamedTuple):
    mlm_logits: jax.Array  # [batch, P, vocab]: the generator's, at the masked positions
    rtd_logits: jax.Array  # [batch, length]: the discriminator's "replaced" logits
    rtd_labels: jax.Array  # [batch, length] float32: 1 where the corrupted token differs from the original
    nsp_logits: None = None  # no sentence-level objective
    encoder: EncoderOutput | None = None  # the discriminator's (representation health: bert_jax/pretraining/health.py)


class ElectraDiscriminator(nnx.Module):
    """The discriminator alone (Hugging Face's ``ElectraForPreTraining``): encoder + per-token head."""

    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
        self.bert = BertEncoder(cfg, rngs=rngs)
        self.rtd = ReplacedTokenHead(cfg, rngs=rngs)

    def __call__(self, input_ids, input_mask, segment_ids, *, deterministic=True, rngs=None):
        enc = self.bert(input_ids, input_mask, segment_ids, deterministic=deterministic, rngs=rngs)
        return self.rtd(enc.sequence_output)  # [batch, length]


class ElectraForPreTraining(nnx.Module):
    """Generator + discriminator, trained together in one step."""

    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs, generator_fraction: float = 0.25,
                 rtd_weight: float = 50.0, rtd_prior: float = 0.0, tie_embeddings: bool = True):
        """``rtd_prior``: the replaced fraction the discriminator's output bias starts at (0: a zero
        bias, the paper's; `ReplacedTokenHead`). ``tie_embeddings``: the generator reads (and decodes
        through) the discriminator's embedding tables, as the paper; False gives it its own
        (``generator/embeddings``; the reference's ``untied_generator_embeddings``)."""
        self.rtd_weight = float(rtd_weight)
        self.bert = BertEncoder(cfg, rngs=rngs)  # the discriminator; owns the shared embeddings
        gen_cfg = electra_generator_config(cfg, generator_fraction)
        self.generator = BertEncoder(gen_cfg, rngs=rngs, with_embeddings=not tie_embeddings)
        self.mlm = MaskedLMHead(gen_cfg, rngs=rngs)  # decodes through the generator's word embeddings
        self.rtd = ReplacedTokenHead(cfg, rngs=rngs, prior=rtd_prior)

    def __call__(self, input_ids, input_mask, segment_ids, masked_lm_positions, masked_lm_ids,
                 masked_lm_weights, *, sample_key, example_ids=None, token_index=None, deterministic=True,
                 rngs=None) -> ElectraOutput:
        """``input_ids`` are the masked inputs; ``masked_lm_ids`` the original tokens at
        ``masked_lm_positions`` (weights 0 on padding slots). ``sample_key`` draws the replacements."""
        packed = example_ids is not None
        kw = dict(attention_mask=packed_mask(example_ids) if packed else None, token_index=token_index,
                  position_ids=packed_positions(example_ids) if packed else None,
                  deterministic=deterministic, rngs=rngs)
        if self.generator.embeddings is None:  # tied: the discriminator's tables
            embeddings = self.bert.embeddings
            emb = embeddings(input_ids, segment_ids, kw["position_ids"], deterministic=deterministic,
                             rngs=rngs)  # [batch, length, E]
            gen = self.generator(input_ids, input_mask, segment_ids, embedding_output=emb, **kw)
        else:
            embeddings = self.generator.embeddings
            gen = self.generator(input_ids, input_mask, segment_ids, **kw)
        mlm_logits = self.mlm(gen.sequence_output, embeddings.word_embeddings, masked_lm_positions)  # [B, P, V]
        sampled = jax.random.categorical(sample_key, jax.lax.stop_gradient(mlm_logits))  # [batch, P]
        corrupted = replace_masked(input_ids, masked_lm_positions, masked_lm_weights, sampled)  # [B, L]
        original = replace_masked(input_ids, masked_lm_positions, masked_lm_weights, masked_lm_ids)  # [B, L]
        labels = ((corrupted != original) & (input_mask > 0)).astype(jnp.float32)  # [batch, length]
        disc = self.bert(corrupted, input_mask, segment_ids, **kw)
        return ElectraOutput(mlm_logits, self.rtd(disc.sequence_output), labels, encoder=disc)
