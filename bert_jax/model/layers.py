"""BERT's building blocks in Flax NNX: embeddings, self-attention, feed-forward, post-LN block.

Axis letters in einsum strings: B batch, T query position, S key position, D model width (embed),
N heads, H per-head width (kv), F feed-forward width (mlp). Dropout keys come in at call time
(``rngs=nnx.Rngs(dropout=key)``) so modules hold no random state: a training step is a pure function
of ``nnx.split`` state.
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
from bert_jax.model.execution import attention_call, mask_kind
from bert_jax.model.token_layout import PADDED, TokenLayout

ACTIVATIONS = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),  # the paper's exact erf form
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
}


def weight_init(cfg: BertConfig, *names: str | None):
    """Google BERT's initializer: truncated normal (±2σ), σ = initializer_range."""
    return axes.init(jax.nn.initializers.truncated_normal(cfg.initializer_range), *names)


def zeros_init(*names: str | None):
    return axes.init(jax.nn.initializers.zeros, *names)


def layer_norm(cfg: BertConfig, *, rngs: nnx.Rngs, width: int | None = None) -> nnx.LayerNorm:
    """LayerNorm over ``width`` features (hidden_size unless given: embeddings are E wide)."""
    return nnx.LayerNorm(
        width or cfg.hidden_size,
        epsilon=cfg.layer_norm_eps,
        dtype=cfg.compute_dtype,
        param_dtype=cfg.param_dtype,
        use_fast_variance=False,  # two-pass variance, as the reference implementations compute it
        scale_metadata=axes.metadata(axes.EMBED),
        bias_metadata=axes.metadata(axes.EMBED),
        rngs=rngs,
    )


def dense(cfg: BertConfig, din: int, dout: int, names: tuple, *, rngs: nnx.Rngs) -> nnx.Linear:
    return nnx.Linear(
        din,
        dout,
        dtype=cfg.compute_dtype,
        param_dtype=cfg.param_dtype,
        kernel_init=weight_init(cfg, *names),
        bias_init=zeros_init(names[-1]),
        rngs=rngs,
    )



def explicit_attention(q, k, v, mask, dropout: Dropout, *, deterministic: bool = True, rngs=None):
    """Attention as einsums, with dropout on the probabilities (what fused kernels cannot do).
    q, k, v: [batch, length, heads, kv]; mask: bool, broadcastable to [batch, heads, T, S], True =
    attend. Returns the context [batch, length, heads, kv] and the probabilities [batch, heads, T, S]."""
    logits = jnp.einsum("BTNH,BSNH->BNTS", q, k) / math.sqrt(q.shape[-1])
    logits = jnp.where(mask, logits.astype(jnp.float32), jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1).astype(q.dtype)  # [batch, heads, T, S]
    dropped = dropout(probs, deterministic=deterministic, rngs=rngs)
    return jnp.einsum("BNTS,BSNH->BTNH", dropped, v), probs  # [batch, length, heads, kv]

class Embeddings(nnx.Module):
    """word + absolute position + token-type embeddings → LayerNorm → dropout, all ``cfg.embed_dim``
    (E) wide; positions start at ``cfg.position_offset``. With one token type (RoBERTa) segment ids
    are ignored, so sentence-pair features built for BERT still run."""

    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
        self.position_offset = cfg.position_offset

        def embed(num: int, axis: str | None) -> nnx.Embed:
            return nnx.Embed(
                num,
                cfg.embed_dim,
                dtype=cfg.compute_dtype,
                param_dtype=cfg.param_dtype,
                embedding_init=weight_init(cfg, axis, axes.EMBED),
                rngs=rngs,
            )

        self.word_embeddings = embed(cfg.vocab_size, axes.VOCAB)
        self.position_embeddings = embed(cfg.max_position_embeddings, None)
        self.token_type_embeddings = embed(cfg.type_vocab_size, None)
        self.layer_norm = layer_norm(cfg, rngs=rngs, width=cfg.embed_dim)
        self.dropout = Dropout(cfg.hidden_dropout_prob, cfg.dropout_impl)

    def __call__(self, input_ids, segment_ids, position_ids=None, *, deterministic=True, rngs=None):
        # input_ids, segment_ids, position_ids: [batch, length] int32; position_ids count from 0
        if position_ids is None:
            position_ids = jnp.arange(input_ids.shape[-1])[None, :]  # [1, length]
        x = self.word_embeddings(input_ids)  # [batch, length, E]
        x = x + self.position_embeddings(position_ids + self.position_offset)  # [batch, length, E]
        if self.token_type_embeddings.num_embeddings == 1:
            segment_ids = jnp.zeros_like(segment_ids)  # [batch, length]
        x = x + self.token_type_embeddings(segment_ids)  # [batch, length, E]
        x = self.layer_norm(x)
        return self.dropout(x, deterministic=deterministic, rngs=rngs)  # [batch, length, E]


class SelfAttention(nnx.Module):
    """Multi-head self-attention with a padding (or packing) mask and an output projection."""

    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        n, h, d = cfg.num_heads, cfg.head_dim, cfg.hidden_size

        def project(spec: str, kernel_shape, kernel_axes, bias_shape, bias_axes) -> nnx.Einsum:
            return nnx.Einsum(
                spec,
                kernel_shape,
                bias_shape,
                dtype=cfg.compute_dtype,
                param_dtype=cfg.param_dtype,
                kernel_init=weight_init(cfg, *kernel_axes),
                bias_init=zeros_init(*bias_axes),
                rngs=rngs,
            )

        qkv = ("BTD,DNH->BTNH", (d, n, h), (axes.EMBED, axes.HEADS, axes.KV), (n, h), (axes.HEADS, axes.KV))
        self.query = project(*qkv)
        self.key = project(*qkv)
        self.value = project(*qkv)
        self.output = project(
            "BTNH,NHD->BTD", (n, h, d), (axes.HEADS, axes.KV, axes.EMBED), (d,), (axes.EMBED,)
        )
        self.dropout = Dropout(cfg.attention_dropout_prob, cfg.dropout_impl)

    def __call__(self, x, mask, layout: TokenLayout = PADDED, *, deterministic=True, rngs=None,
                 return_probs=False):
        # x: [*tokens, embed] in ``layout`` ([batch, length] padded, [shards, tokens] unpadded):
        # projections on those tokens, attention in [batch, length] places.
        # mask: bool [batch, 1, length | 1, length], True = attend.
        cfg = self.cfg
        heads = (axes.ACT_BATCH, axes.ACT_LENGTH, axes.ACT_HEADS, axes.ACT_KV)
        q = constrain(layout.to_rows(self.query(x)), *heads)  # [batch, length, heads, kv]
        k = constrain(layout.to_rows(self.key(x)), *heads)  # [batch, length, heads, kv]
        v = constrain(layout.to_rows(self.value(x)), *heads)  # [batch, length, heads, kv]
        needs_dropout = not deterministic and cfg.attention_dropout_prob > 0.0
        probs = None
        if return_probs or needs_dropout or cfg.attention_impl == "explicit":
            ctx, probs = explicit_attention(q, k, v, mask, self.dropout, deterministic=deterministic, rngs=rngs)
        else:
            impl = attention_call(cfg.attention_impl, mask_kind(mask.shape))
            if impl == "cudnn":  # flash attention, padding as key lengths
                keys = jnp.broadcast_to(mask[:, 0, 0, :], (q.shape[0], mask.shape[-1]))  # [batch, length]
                lengths = keys.sum(-1, dtype=jnp.int32)  # [batch]: rows are padded at the end
                ctx = jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=lengths, implementation="cudnn")
            else:
                ctx = jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=impl)
        ctx = constrain(ctx, *heads)  # [batch, length, heads, kv]
        out = constrain(self.output(layout.to_tokens(ctx)), axes.ACT_BATCH, axes.ACT_LENGTH, axes.ACT_EMBED)
        return out, (probs if return_probs else None)


class FeedForward(nnx.Module):
    """dense(embed → mlp) → activation → dense(mlp → embed)."""

    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
        self.act = ACTIVATIONS[cfg.hidden_act]
        d, f = cfg.hidden_size, cfg.intermediate_size
        self.intermediate = dense(cfg, d, f, (axes.EMBED, axes.MLP), rngs=rngs)
        self.output = dense(cfg, f, d, (axes.MLP, axes.EMBED), rngs=rngs)

    def __call__(self, x):
        # x: [*tokens, embed]
        y = constrain(self.act(self.intermediate(x)), axes.ACT_BATCH, axes.ACT_LENGTH, axes.ACT_MLP)  # [*tokens, mlp]
        return constrain(self.output(y), axes.ACT_BATCH, axes.ACT_LENGTH, axes.ACT_EMBED)  # [*tokens, embed]


class TransformerBlock(nnx.Module):
    """Post-LayerNorm transformer block, as in the paper: LN(x + drop(attn(x))), LN(h + drop(ffn(h)))."""

    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
        self.attention = SelfAttention(cfg, rngs=rngs)
        self.attention_norm = layer_norm(cfg, rngs=rngs)
        self.ffn = FeedForward(cfg, rngs=rngs)
        self.output_norm = layer_norm(cfg, rngs=rngs)
        self.dropout = Dropout(cfg.hidden_dropout_prob, cfg.dropout_impl)

    def __call__(self, x, mask, layout: TokenLayout = PADDED, *, deterministic=True, rngs=None,
                 return_probs=False):
        # x: [*tokens, embed] in ``layout`` ([batch, length] padded, [shards, tokens] unpadded)
        a, probs = self.attention(x, mask, layout, deterministic=deterministic, rngs=rngs, return_probs=return_probs)
        h = self.attention_norm(x + self.dropout(a, deterministic=deterministic, rngs=rngs))
        f = self.ffn(h)  # [*tokens, embed]
        out = self.output_norm(h + self.dropout(f, deterministic=deterministic, rngs=rngs))
        return out, probs  # [*tokens, embed], [batch, heads, T, S] | None
