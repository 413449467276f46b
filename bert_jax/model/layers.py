"""BERT's building blocks in Flax NNX: embeddings, self-attention, feed-forward, the block (post-LN as
BERT's; pre-LN, rotary positions, local attention and GeGLU as ModernBERT's, by `BertConfig` switches).

Axis letters in einsum strings: B batch, T query position, S key position, D model width (embed),
N heads, H per-head width (kv), F feed-forward width (mlp), G GeGLU's two halves (activation input,
gate). Dropout keys come in at call time
(``rngs=nnx.Rngs(dropout=key)``) so modules hold no random state: a training step is a pure function
of ``nnx.split`` state.
"""

from __future__ import annotations

import functools
import math
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bert_jax.model import axes
from bert_jax.model.activation_sharding import constrain, per_shard
from bert_jax.model.config import ATTENTION_IMPLS, BertConfig, LayerSpec
from bert_jax.model.dropout import Dropout
from bert_jax.model.flash import flash_applies, flash_attention
from bert_jax.model.fused_norm import add_dropout_norm, norm_applies
from bert_jax.model.splash import segment_ids_from_mask, splash_applies, splash_attention
from bert_jax.model.token_layout import PADDED, TokenLayout

MaskKind = Literal["padding", "packed"]

ACTIVATIONS = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),  # the paper's exact erf form
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
}


def erf_gelu(x: jax.Array) -> jax.Array:
    """The exact GELU as x · (1 + erf(x / √2)) / 2 (PyTorch's form), in float32, in x's dtype: GeGLU's,
    and the dense block's where ``gelu_impl`` is "erf". ``jax.nn.gelu`` goes through erfc, which XLA
    expands into branches that read their input many times: it then keeps GeGLU's intermediates in
    memory instead of fusing them (docs/records.md, "GeGLU through erf, with its own backward"), and
    its arithmetic, two divisions and one or two exponentials an element, bounds a GPU's GELU kernels
    ("GELU through erf on a GPU")."""
    x32 = x.astype(jnp.float32)
    return (0.5 * x32 * (1.0 + jax.lax.erf(x32 * np.float32(1 / math.sqrt(2))))).astype(x.dtype)


GATE_ACTIVATIONS = {**ACTIVATIONS, "gelu": erf_gelu}  # GeGLU's (ModernBERT's): the exact GELU through erf


def activation(cfg: BertConfig):
    """``cfg.hidden_act`` as a function; the exact GELU through erf where ``cfg.gelu_impl`` says "erf"."""
    return erf_gelu if cfg.hidden_act == "gelu" and cfg.gelu_impl == "erf" else ACTIVATIONS[cfg.hidden_act]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def gated(act, p: jax.Array) -> jax.Array:
    """GeGLU's act(u) · g of p = [..., 2, mlp] (u = p[..., 0, :], the gate g = p[..., 1, :]): [..., mlp].
    The backward keeps only p, the projection's product, and writes [du, dg] in one pass (autodiff
    also kept act(u) from the forward: docs/records.md, "GeGLU through erf, with its own backward")."""
    return act(p[..., 0, :]) * p[..., 1, :]


def _gated_fwd(act, p):
    return gated(act, p), p


def _gated_bwd(act, p, dy):
    # One elementwise pass over [..., 2, mlp]: the first half du = dy · g · act'(u), the second dg = dy · act(u).
    p32 = p.astype(jnp.float32)
    u, g = p32[..., :1, :], p32[..., 1:, :]  # [..., 1, mlp] each
    a, act_vjp = jax.vjp(act, u)
    dy = dy.astype(jnp.float32)[..., None, :]  # [..., 1, mlp]
    first = jax.lax.broadcasted_iota(jnp.int32, p.shape, p.ndim - 2) == 0  # [..., 2, mlp]
    return (jnp.where(first, act_vjp(dy * g)[0], dy * a).astype(p.dtype),)  # [..., 2, mlp]


gated.defvjp(_gated_fwd, _gated_bwd)


def weight_init(cfg: BertConfig, *names: str | None, output: bool = False):
    """N(0, σ²) cut at ±2σ (std 0.88σ: Google BERT's ``truncated_normal_initializer`` and PyTorch's
    ``trunc_normal_``), σ = initializer_range; with ``cfg.init_method`` "megatron" (ModernBERT's
    ``full_megatron``) the blocks' ``output`` projections (attention out, feed-forward out) take
    σ / sqrt(2 · num_layers)."""
    std = cfg.initializer_range
    if output and cfg.init_method == "megatron":
        std /= math.sqrt(2.0 * cfg.num_layers)
    return axes.init(jax.nn.initializers.truncated_normal(std), *names)


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
        use_bias=cfg.norm_bias,
        scale_metadata=axes.metadata(axes.EMBED),
        bias_metadata=axes.metadata(axes.EMBED),
        rngs=rngs,
    )


def dense(cfg: BertConfig, din: int, dout: int, names: tuple, *, rngs: nnx.Rngs, bias: bool = True,
          output: bool = False) -> nnx.Linear:
    return nnx.Linear(
        din,
        dout,
        use_bias=bias,
        dtype=cfg.compute_dtype,
        param_dtype=cfg.param_dtype,
        kernel_init=weight_init(cfg, *names, output=output),
        bias_init=zeros_init(names[-1]),
        rngs=rngs,
    )


def mask_kind(mask_shape: tuple[int, ...]) -> MaskKind:
    """A [batch, 1, 1, length] key mask is padding; a [batch, 1, length, length] one is packed rows."""
    return "padding" if mask_shape[-2] == 1 else "packed"


def attention_call(impl: str, kind: MaskKind, shape: tuple[int, ...] = (), dtype=jnp.float32) -> str:
    """What ``attention_impl`` (a config's) runs for a mask of ``kind`` and queries of ``shape``
    [batch, length, heads, kv]: "cudnn" (cuDNN's flash attention: bfloat16/float16, padding given as
    per-row key lengths, rows padded at the end as every pipeline here builds them) takes padding masks
    and leaves packed rows, which no key lengths express, to XLA (and local layers' bands too:
    `cudnn_layer`); "splash" and "flash" (and their interpreted forms) take both, at lengths, head
    widths and dtypes their kernels take (`splash.splash_applies`, `flash.flash_applies`), else XLA."""
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"attention_impl {impl!r}: expected one of {ATTENTION_IMPLS} (bert_jax.resolve "
                         "resolves a job config's choice for its platform)")
    if impl.startswith("splash"):
        return impl if shape and splash_applies(shape[1], shape[-1], dtype) else "xla"
    if impl.startswith("flash"):
        return impl if shape and flash_applies(shape[1], shape[-1], dtype) else "xla"
    return "xla" if impl == "cudnn" and kind == "packed" else impl


def splash_layer(q, k, v, segment_ids, spec: LayerSpec | None, window: int, interpret: bool) -> jax.Array:
    """Splash attention for a layer of ``spec`` (None: BERT's global layer): a local layer's window
    (``window``, the config's) is static in the kernel, so a scanned stack, whose spec is data,
    chooses between the global and the local kernel with ``lax.cond``. q, k, v: [batch, length,
    heads, kv]; segment_ids: [batch, length]."""
    def run(w):  # each device on its own rows and heads (a Pallas call is not partitioned by XLA)
        heads = (axes.ACT_BATCH, axes.ACT_LENGTH, axes.ACT_HEADS, axes.ACT_KV)
        kernel = functools.partial(splash_attention, window=w or None, interpret=interpret)
        return per_shard(kernel, heads, heads, heads, (axes.ACT_BATCH, axes.ACT_LENGTH))(q, k, v, segment_ids)

    return by_window(run, spec, window)  # [batch, length, heads, kv]


def by_window(run, spec: LayerSpec | None, window: int) -> jax.Array:
    """``run(0)`` for a global layer, ``run(w)`` for a local one of window w: a layer's own window when
    unrolled (``spec.window`` an int; ``spec`` None: BERT's global layer), else (a scanned stack,
    whose spec is data) ``lax.cond`` between the global and the local one of the config's ``window``."""
    if spec is None:
        return run(0)
    if isinstance(spec.window, int):
        return run(spec.window)
    return jax.lax.cond(spec.window == 0, lambda: run(0), lambda: run(window))


def flash_layer(q, k, v, segment_ids, spec: LayerSpec | None, window: int, key, rate: float, interpret: bool,
                bias=None) -> jax.Array:
    """The GPU's flash attention (`flash.flash_attention`) for a layer of ``spec`` (None: BERT's global
    layer), dropout ``rate`` drawn from ``key`` inside the kernel (None: no dropout); a scanned
    stack, whose spec is data, chooses between the global and the local kernel with ``lax.cond``.
    Each device runs its own rows and heads, numbered globally so the dropout mask does not depend
    on the split. q, k, v: [batch, length, heads, kv]; segment_ids: [batch, length]; bias: the
    projections' biases [3, heads, kv] the kernel adds to q, k, v (None: none)."""
    rows = jnp.arange(q.shape[0], dtype=jnp.int32)  # [batch]
    heads = jnp.arange(q.shape[2], dtype=jnp.int32)  # [heads]
    bias = jnp.zeros((3, *q.shape[2:]), q.dtype) if bias is None else bias  # [3, heads, kv]

    def run(w):
        def kernel(q, k, v, ids, rows, heads, bias):
            return flash_attention(q, k, v, ids, bias=bias, key=key, rate=rate, window=w, rows=rows, heads=heads,
                                   interpret=interpret)

        names = (axes.ACT_BATCH, axes.ACT_LENGTH, axes.ACT_HEADS, axes.ACT_KV)
        return per_shard(kernel, names, names, names, (axes.ACT_BATCH, axes.ACT_LENGTH), (axes.ACT_BATCH,),
                         (axes.ACT_HEADS,), (None, axes.ACT_HEADS, axes.ACT_KV))(q, k, v, segment_ids, rows, heads,
                                                                                  bias)

    return by_window(run, spec, window)  # [batch, length, heads, kv]


def fused_norm_layer(norm: nnx.LayerNorm, x, a, a_bias, key, rate: float, interpret: bool) -> jax.Array:
    """``norm``(x + dropout(a + a_bias)) as the GPU's one kernel (`fused_norm.add_dropout_norm`), dropout
    ``rate`` drawn from ``key`` inside it (None: none). Each device runs its own tokens, numbered
    globally so the dropout mask does not depend on the split. x, a: [*tokens, embed]; a_bias:
    [embed] (the sublayer's output bias, which the kernel adds as it loads a) or None."""
    tokens = jnp.arange(math.prod(x.shape[:2]), dtype=jnp.int32).reshape(x.shape[:2])  # [*tokens]
    scale = norm.scale[...]  # [embed]
    bias = jnp.zeros_like(scale) if norm.bias is None else norm.bias[...]  # [embed]
    a_bias = jnp.zeros_like(scale) if a_bias is None else a_bias  # [embed]

    def kernel(x, a, scale, bias, a_bias, tokens):
        return add_dropout_norm(x, a, scale, bias, a_bias=a_bias, eps=norm.epsilon, key=key, rate=rate,
                                tokens=tokens, interpret=interpret)

    rows = (axes.ACT_BATCH, axes.ACT_LENGTH, None)  # whole rows in every shard: the norm is over the width
    return per_shard(kernel, rows, rows, (None,), (None,), (None,), rows[:2])(
        x, a.astype(x.dtype), scale, bias, a_bias, tokens)


def folded_bias(proj: nnx.Einsum | nnx.Linear, left_out: bool) -> jax.Array | None:
    """``proj``'s bias [embed] when its caller left it out (``left_out``) and it has one; else None."""
    return proj.bias[...] if left_out and proj.bias is not None else None


def without_bias(proj: nnx.Einsum | nnx.Linear, x: jax.Array) -> jax.Array:
    """``proj(x)`` less its bias: the product as ``nnx.Einsum`` / ``nnx.Linear`` computes it, in its
    dtype, for a consumer that adds the bias itself (the flash kernel as it loads q, k and v; the
    recomputed GELU), so that no pass writes the sum."""
    inputs, kernel = proj.promote_dtype((x, proj.kernel[...]), dtype=proj.dtype)
    if isinstance(proj, nnx.Einsum):
        return jnp.einsum(proj.einsum_str, inputs, kernel, precision=proj.precision)
    return jax.lax.dot_general(inputs, kernel, (((inputs.ndim - 1,), (0,)), ((), ())), precision=proj.precision)


def cudnn_layer(q, k, v, mask, spec: LayerSpec | None, window: int) -> jax.Array:
    """Attention for ``attention_impl="cudnn"`` on a padding ``mask`` (bool [batch, 1, 1, length]):
    a global layer is cuDNN's flash attention with each row's key length (rows are padded at the end,
    as every pipeline here builds them); a local layer goes to XLA with its band (`local_mask`),
    because cuDNN takes a window only to the left of each query (``jax.nn.dot_product_attention``
    refuses a right window without a causal mask) and a [batch, 1, length, length] mask not at all.
    A scanned stack, whose spec is data, chooses with ``lax.cond``; ``window``: the config's local
    window. q, k, v: [batch, length, heads, kv]; returns [batch, length, heads, kv]."""
    def run(w: int):
        if w:  # a local layer
            return jax.nn.dot_product_attention(q, k, v, mask=local_mask(mask, w), implementation="xla")
        keys = jnp.broadcast_to(mask[:, 0, 0, :], (q.shape[0], mask.shape[-1]))  # [batch, length]
        lengths = keys.sum(-1, dtype=jnp.int32)  # [batch]
        return jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=lengths, implementation="cudnn")

    return by_window(run, spec, window)  # [batch, length, heads, kv]


def local_mask(mask: jax.Array, window) -> jax.Array:
    """``mask`` (bool [batch, 1, 1 | length, length], True = attend) narrowed to the keys within
    ``window // 2`` positions of each query: [batch, 1, length, length]. ``window`` 0 = global: the
    mask unchanged when it is a Python int (an unrolled block), else (a scanned one) selected in the graph."""
    if isinstance(window, int) and window == 0:
        return mask
    idx = jnp.arange(mask.shape[-1])  # [length]
    band = jnp.abs(idx[:, None] - idx[None, :]) <= window // 2  # [query, key]
    if not isinstance(window, int):
        band = band | (window == 0)
    return mask & band  # [batch, 1, length, length]


def rotary(x: jax.Array, positions: jax.Array, theta) -> jax.Array:
    """Rotary position embedding (RoPE, GPT-NeoX's layout: feature j pairs with j + kv/2), as
    Hugging Face ModernBERT computes it: angles in float32, cos/sin rounded to x's dtype, the rotation
    in float32. x: [batch, length, heads, kv]; positions: [batch | 1, length]; theta: the base."""
    kv = x.shape[-1]
    inv_freq = 1.0 / (jnp.asarray(theta, jnp.float32) ** (jnp.arange(0, kv, 2, dtype=jnp.float32) / kv))  # [kv/2]
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [batch | 1, length, kv/2]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]  # [batch | 1, length, 1, kv]
    cos = jnp.cos(angles).astype(x.dtype).astype(jnp.float32)
    sin = jnp.sin(angles).astype(x.dtype).astype(jnp.float32)
    xf = x.astype(jnp.float32)
    half = jnp.concatenate([-xf[..., kv // 2:], xf[..., :kv // 2]], axis=-1)  # [batch, length, heads, kv]
    return (xf * cos + half * sin).astype(x.dtype)


def select(flag, a, b):
    """``a`` where ``flag`` else ``b``: a Python bool picks one when tracing, a traced one selects."""
    if isinstance(flag, bool | np.bool_):
        return a if flag else b
    return jnp.where(flag, a, b)


def explicit_attention(q, k, v, mask, dropout: Dropout, *, deterministic: bool = True, rngs=None):
    """Attention as einsums, with dropout on the probabilities (what fused kernels cannot do).
    q, k, v: [batch, length, heads, kv]; mask: bool, broadcastable to [batch, heads, T, S], True =
    attend. Returns the context [batch, length, heads, kv] and the probabilities [batch, heads, T, S]."""
    logits = jnp.einsum("BTNH,BSNH->BNTS", q, k) / math.sqrt(q.shape[-1])
    logits = jnp.where(mask, logits.astype(jnp.float32), jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1).astype(q.dtype)  # [batch, heads, T, S]
    dropped = dropout(probs, deterministic=deterministic, rngs=rngs)
    return jnp.einsum("BNTS,BSNH->BTNH", dropped, v), probs  # [batch, length, heads, kv]


def lookup(table: nnx.Embed, ids: jax.Array) -> jax.Array:
    """Rows ``ids`` [*ids] of an embedding table gathered in its parameter dtype, then cast to its
    compute dtype: [*ids, E]. (``nnx.Embed`` casts the whole table first, so its gradient is a
    scatter-add in bfloat16, which GPUs run as compare-and-swap loops: the 2-row token-type table's
    took 95 ms of a 157 ms BERT-base step on an H200, docs/records.md "One GPU". Here the
    scatter-add is in float32.)"""
    rows = jnp.take(table.embedding[...], ids, axis=0)  # [*ids, E] float32
    return rows.astype(table.dtype or rows.dtype)


class Embeddings(nnx.Module):
    """word + absolute position + token-type embeddings → LayerNorm → dropout, all ``cfg.embed_dim``
    (E) wide; positions start at ``cfg.position_offset``. With one token type (RoBERTa) segment ids
    are ignored, so sentence-pair features built for BERT still run. Rotary positions (ModernBERT)
    have no table here (the blocks rotate queries and keys), and ``type_vocab_size`` 0 no type table."""

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
        self.position_embeddings = embed(cfg.max_position_embeddings, None) if not cfg.rotary else None
        self.token_type_embeddings = embed(cfg.type_vocab_size, None) if cfg.type_vocab_size else None
        self.layer_norm = layer_norm(cfg, rngs=rngs, width=cfg.embed_dim)
        self.dropout = Dropout(cfg.hidden_dropout_prob, cfg.dropout_impl)

    def __call__(self, input_ids, segment_ids, position_ids=None, *, deterministic=True, rngs=None):
        # input_ids, segment_ids, position_ids: [batch, length] int32; position_ids count from 0
        if position_ids is None:
            position_ids = jnp.arange(input_ids.shape[-1])[None, :]  # [1, length]
        x = lookup(self.word_embeddings, input_ids)  # [batch, length, E]
        if self.position_embeddings is not None:
            x = x + lookup(self.position_embeddings, position_ids + self.position_offset)  # [batch, length, E]
        if self.token_type_embeddings is not None:
            if self.token_type_embeddings.num_embeddings == 1:
                segment_ids = jnp.zeros_like(segment_ids)  # [batch, length]
            x = x + lookup(self.token_type_embeddings, segment_ids)  # [batch, length, E]
        x = self.layer_norm(x)
        return self.dropout(x, deterministic=deterministic, rngs=rngs)  # [batch, length, E]


class SelfAttention(nnx.Module):
    """Multi-head self-attention with a padding (or packing) mask and an output projection; with
    rotary positions, queries and keys rotated by position; in a local layer, a windowed mask."""

    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        n, h, d = cfg.num_heads, cfg.head_dim, cfg.hidden_size

        def project(spec: str, kernel_shape, kernel_axes, bias_shape, bias_axes, output=False) -> nnx.Einsum:
            return nnx.Einsum(
                spec,
                kernel_shape,
                bias_shape if cfg.use_bias else None,
                dtype=cfg.compute_dtype,
                param_dtype=cfg.param_dtype,
                kernel_init=weight_init(cfg, *kernel_axes, output=output),
                bias_init=zeros_init(*bias_axes),
                rngs=rngs,
            )

        qkv = ("BTD,DNH->BTNH", (d, n, h), (axes.EMBED, axes.HEADS, axes.KV), (n, h), (axes.HEADS, axes.KV))
        self.query = project(*qkv)
        self.key = project(*qkv)
        self.value = project(*qkv)
        self.output = project(
            "BTNH,NHD->BTD", (n, h, d), (axes.HEADS, axes.KV, axes.EMBED), (d,), (axes.EMBED,), output=True
        )
        self.dropout = Dropout(cfg.attention_dropout_prob, cfg.dropout_impl)

    def __call__(self, x, mask, layout: TokenLayout = PADDED, *, spec: LayerSpec | None = None, positions=None,
                 deterministic=True, rngs=None, return_probs=False, output_bias=True):
        # x: [*tokens, embed] in ``layout`` ([batch, length] padded, [shards, tokens] unpadded):
        # projections on those tokens, attention in [batch, length] places.
        # mask: bool [batch, 1, length | 1, length], True = attend.
        # spec: this layer's window and rotary base (`BertConfig.layer_specs`; None: BERT's global layer);
        # positions: [batch | 1, length], what rotary positions rotate by.
        # output_bias False: the output projection's bias left to the caller (the fused norm adds it).
        cfg = self.cfg
        heads = (axes.ACT_BATCH, axes.ACT_LENGTH, axes.ACT_HEADS, axes.ACT_KV)
        projections = (self.query, self.key, self.value)
        bias = None  # the projections' biases [3, heads, kv] when the flash kernel adds them
        if cfg.attention_impl.startswith("flash") and cfg.use_bias and not cfg.rotary:
            bias = jnp.stack([p.bias[...] for p in projections]).astype(cfg.compute_dtype)
            projections = [functools.partial(without_bias, p) for p in projections]
        q, k, v = (constrain(layout.to_rows(p(x)), *heads) for p in projections)  # [batch, length, heads, kv]
        if cfg.rotary:
            q, k = rotary(q, positions, spec.rope_theta), rotary(k, positions, spec.rope_theta)
        needs_dropout = not deterministic and cfg.attention_dropout_prob > 0.0
        probs = None
        impl = attention_call(cfg.attention_impl, mask_kind(mask.shape), q.shape, q.dtype)
        if return_probs or (needs_dropout and not impl.startswith("flash")):
            impl = "explicit"  # the probabilities themselves, or dropout no other kernel draws
        if bias is not None and not impl.startswith("flash"):  # not the kernel after all: the biases here
            q, k, v = (t + b for t, b in zip((q, k, v), bias, strict=True))
            bias = None
        with jax.named_scope("attention"):  # the profile's "attention" row (bert_jax/benchmark/profile.py)
            if impl.startswith("splash"):  # padding / packing as segment ids, the window as the kernel's block mask
                ids = segment_ids_from_mask(mask)  # [batch, length]
                ctx = splash_layer(q, k, v, ids, spec, cfg.local_window, interpret=impl == "splash_interpret")
            elif impl.startswith("flash"):  # segment ids and the window as splash; dropout inside the kernel
                ids = segment_ids_from_mask(mask)  # [batch, length]
                key = rngs.dropout() if needs_dropout else None
                rate = cfg.attention_dropout_prob if needs_dropout else 0.0
                ctx = flash_layer(q, k, v, ids, spec, cfg.local_window, key, rate, interpret=impl == "flash_interpret",
                                  bias=bias)
            elif impl == "cudnn":  # flash attention, padding as key lengths; a local layer's band on XLA
                ctx = cudnn_layer(q, k, v, mask, spec, cfg.local_window)
            else:
                if spec is not None:  # [batch, 1, length, length] in a local (or scanned) layer
                    mask = local_mask(mask, spec.window)
                if impl == "explicit":
                    ctx, probs = explicit_attention(q, k, v, mask, self.dropout, deterministic=deterministic,
                                                    rngs=rngs)
                else:
                    ctx = jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=impl)
        ctx = constrain(ctx, *heads)  # [batch, length, heads, kv]
        output = self.output if output_bias else functools.partial(without_bias, self.output)
        out = constrain(output(layout.to_tokens(ctx)), axes.ACT_BATCH, axes.ACT_LENGTH, axes.ACT_EMBED)
        return out, (probs if return_probs else None)


class FeedForward(nnx.Module):
    """dense(embed → mlp) → activation → dense(mlp → embed); GeGLU (``cfg.ffn = "geglu"``): one
    projection embed → [2, mlp] (kernel [embed, 2, mlp]), act(first) × second, dense(mlp → embed)."""

    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
        self.geglu = cfg.ffn == "geglu"
        self.act = GATE_ACTIVATIONS[cfg.hidden_act] if self.geglu else activation(cfg)
        self.recompute = cfg.recompute_activation and not self.geglu  # GeGLU measured no gain from it
        d, f = cfg.hidden_size, cfg.intermediate_size
        if self.geglu:
            self.intermediate = nnx.Einsum(
                "BTD,DGF->BTGF", (d, 2, f), (2, f) if cfg.use_bias else None, dtype=cfg.compute_dtype,
                param_dtype=cfg.param_dtype, kernel_init=weight_init(cfg, axes.EMBED, None, axes.MLP),
                bias_init=zeros_init(None, axes.MLP), rngs=rngs)
        else:
            self.intermediate = dense(cfg, d, f, (axes.EMBED, axes.MLP), rngs=rngs, bias=cfg.use_bias)
        self.output = dense(cfg, f, d, (axes.MLP, axes.EMBED), rngs=rngs, bias=cfg.use_bias, output=True)

    def __call__(self, x, output_bias=True):
        # x: [*tokens, embed]. output_bias False: the output's bias left to the caller (the fused
        # norm adds it). ``cfg.recompute_activation``: the dense block's activation recomputed in
        # the backward from its input (``jax.checkpoint``), the same numbers, instead of keeping the
        # intermediates of GELU's derivative, each as large as the activation (docs/records.md, "GELU
        # recomputed in the backward").
        if self.geglu:
            y = gated(self.act, self.intermediate(x))  # [*tokens, 2, mlp] (act's input, gate) → [*tokens, mlp]
        elif self.recompute and self.intermediate.bias is not None:  # the bias added inside the recomputed
            # activation: the backward keeps the product the matmul wrote, not a second copy with the bias
            bias = self.intermediate.bias[...].astype(self.intermediate.dtype)  # [mlp]
            y = jax.checkpoint(lambda h, b: self.act(h + b))(without_bias(self.intermediate, x), bias)  # [*tokens, mlp]
        else:
            act = jax.checkpoint(self.act) if self.recompute else self.act
            y = act(self.intermediate(x))  # [*tokens, mlp]
        y = constrain(y, axes.ACT_BATCH, axes.ACT_LENGTH, axes.ACT_MLP)  # [*tokens, mlp]
        output = self.output if output_bias else functools.partial(without_bias, self.output)
        return constrain(output(y), axes.ACT_BATCH, axes.ACT_LENGTH, axes.ACT_EMBED)  # [*tokens, embed]


class TransformerBlock(nnx.Module):
    """Post-LayerNorm transformer block, as in the paper: LN(x + drop(attn(x))), LN(h + drop(ffn(h)));
    pre-LayerNorm (``cfg.norm_position = "pre"``, ModernBERT): h = x + drop(attn(LN(x))),
    h + drop(ffn(LN(h))), its norms ``attention_norm`` and ``ffn_norm``; the first block's attention
    reads x as it is (``spec.norm_input`` False: the embeddings were just normed)."""

    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
        self.pre_norm = cfg.pre_norm
        self.attention = SelfAttention(cfg, rngs=rngs)
        self.attention_norm = layer_norm(cfg, rngs=rngs)
        self.ffn = FeedForward(cfg, rngs=rngs)
        if cfg.pre_norm:
            self.ffn_norm = layer_norm(cfg, rngs=rngs)
        else:
            self.output_norm = layer_norm(cfg, rngs=rngs)
        self.dropout = Dropout(cfg.hidden_dropout_prob, cfg.dropout_impl)
        self.norm_impl = cfg.norm_impl if norm_applies(cfg.hidden_size, cfg.compute_dtype) else "xla"

    def add_norm(self, norm: nnx.LayerNorm, x, a, a_bias, deterministic: bool, rngs):
        """norm(x + dropout(a + a_bias)) [*tokens, embed] (post-norm): XLA's ops, or one GPU kernel
        (``cfg.norm_impl``) that adds the sublayer's bias (a_bias [embed] or None) itself."""
        if self.norm_impl == "xla":
            a = a if a_bias is None else a + a_bias.astype(a.dtype)  # [*tokens, embed]
            return norm(x + self.dropout(a, deterministic=deterministic, rngs=rngs))
        rate = 0.0 if deterministic else self.dropout.rate
        if rate and rngs is None:
            raise ValueError("dropout in training mode needs rngs=nnx.Rngs(dropout=key)")
        key = rngs.dropout() if rate else None
        return fused_norm_layer(norm, x, a, a_bias, key, rate, interpret=self.norm_impl == "fused_interpret")

    def __call__(self, x, mask, layout: TokenLayout = PADDED, *, spec: LayerSpec | None = None, positions=None,
                 deterministic=True, rngs=None, return_probs=False):
        # x: [*tokens, embed] in ``layout`` ([batch, length] padded, [shards, tokens] unpadded)
        # spec, positions: see `SelfAttention` (None for BERT)
        attend = dict(spec=spec, positions=positions, deterministic=deterministic, rngs=rngs, return_probs=return_probs)
        if self.pre_norm:
            h = select(spec.norm_input, self.attention_norm(x), x)  # [*tokens, embed]
            a, probs = self.attention(h, mask, layout, **attend)
            h = x + self.dropout(a, deterministic=deterministic, rngs=rngs)  # [*tokens, embed]
            f = self.ffn(self.ffn_norm(h))  # [*tokens, embed]
            return h + self.dropout(f, deterministic=deterministic, rngs=rngs), probs
        fold = self.norm_impl != "xla"  # the kernel adds the output projections' biases as it loads a
        a, probs = self.attention(x, mask, layout, output_bias=not fold, **attend)
        h = self.add_norm(self.attention_norm, x, a, folded_bias(self.attention.output, fold), deterministic,
                          rngs)  # [*tokens, embed]
        f = self.ffn(h, output_bias=not fold)  # [*tokens, embed]
        out = self.add_norm(self.output_norm, h, f, folded_bias(self.ffn.output, fold), deterministic,
                            rngs)  # [*tokens, embed]
        return out, probs  # [*tokens, embed], [batch, heads, T, S] | None
