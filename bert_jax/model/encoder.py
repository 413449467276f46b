"""The BERT encoder: embeddings → a stack of transformer blocks → (optional) pooler.

Scanned (``cfg.scan_layers``; a job's default on TPU, bert_jax/resolve.py), the blocks'
parameters are stacked along a leading ``layers`` axis (built with ``nnx.vmap``) and run as one
``jax.lax.scan`` (fast compile, constant program size); unrolled, each block holds its own
parameters (``layers/0/...``, ``layers/1/...``), initialised to the same values, or with
``cfg.stacked_params`` slices them from the stack (fewer arrays: a GPU's default). Checkpoints and
stored weights hold the stacked layout and load into either (`bert_jax.model.layer_layout`).
Both can rematerialise each block under a ``jax.checkpoint`` policy. With ``share_layers`` (ALBERT)
the axis has length 1 and that one block runs ``num_layers`` times, scanned or not.
Factorised embeddings (``embedding_size`` E ≠ hidden) go through ``embedding_projection`` (E → hidden)
before the blocks; an encoder built ``with_embeddings=False`` (ELECTRA's generator) takes another
encoder's embedding output instead of owning tables.
Given ``token_index`` the blocks run on the real tokens only (`bert_jax.model.token_layout`).
ModernBERT's switches (`BertConfig`: rotary positions, local windows, pre-norm) add per-layer data
(`BertConfig.layer_specs`: each layer's window and rotary base) that the scan carries beside the
stacked parameters and an unrolled stack hands each block as Python values, the rotary positions
every block reads, and a final LayerNorm after the last block (``final_norm``).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from bert_jax.model import axes
from bert_jax.model.activation_sharding import constrain
from bert_jax.model.config import BertConfig
from bert_jax.model.layer_layout import unstack
from bert_jax.model.layers import Embeddings, TransformerBlock, dense, layer_norm
from bert_jax.model.token_layout import PADDED, TokenLayout, Unpadded

RESIDUAL = (axes.ACT_BATCH, axes.ACT_LENGTH, axes.ACT_EMBED)  # the residual stream [*tokens, embed]


class EncoderOutput(NamedTuple):
    sequence_output: jax.Array  # [batch, length, embed]
    pooled_output: jax.Array | None  # [batch, embed]; None without a pooler
    hidden_states: jax.Array | None  # [layers + 1, batch, length, embed]; 0 = embedding output
    attentions: jax.Array | None  # [layers, batch, heads, length, length]


def padding_mask(input_mask: jax.Array) -> jax.Array:
    """[batch, length] (1 = real token) → bool [batch, 1, 1, length] key mask for attention."""
    return (input_mask > 0)[:, None, None, :]


def packed_mask(example_ids: jax.Array) -> jax.Array:
    """Several examples packed in one row: example_ids [batch, length] (1, 2, ... per example, 0 =
    padding) → bool [batch, 1, length, length]: a token attends to the real tokens of its own example."""
    same = example_ids[:, None, :, None] == example_ids[:, None, None, :]  # [batch, 1, query, key]
    return same & (example_ids > 0)[:, None, None, :]


def packed_positions(example_ids: jax.Array) -> jax.Array:
    """[batch, length] example ids → [batch, length] positions that restart at 0 with each example."""
    pos = jnp.broadcast_to(jnp.arange(example_ids.shape[-1]), example_ids.shape)  # [batch, length]
    previous = jnp.pad(example_ids[:, :-1], ((0, 0), (1, 0)), constant_values=-1)  # [batch, length]
    start = jax.lax.cummax(jnp.where(example_ids != previous, pos, 0), axis=1)  # [batch, length]
    return pos - start


def remat_policy(name: str):
    """None for no remat, else a ``jax.checkpoint`` policy ("full" saves nothing)."""
    if name == "none":
        return None
    if name == "full":
        return "full"
    policy = getattr(jax.checkpoint_policies, name, None)
    if policy is None:
        raise ValueError(f"unknown remat_policy {name!r}: use none, full or a jax.checkpoint_policies name")
    return policy


class BertEncoder(nnx.Module):
    """What Hugging Face calls ``BertModel`` and Google ``bert/``: the encoder without task heads."""

    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs, with_embeddings: bool = True):
        self.cfg = cfg
        self.embeddings = Embeddings(cfg, rngs=rngs) if with_embeddings else None
        self.embedding_projection = (
            dense(cfg, cfg.embed_dim, cfg.hidden_size, (axes.EMBED, None), rngs=rngs)
            if cfg.embed_dim != cfg.hidden_size
            else None
        )

        @nnx.split_rngs(splits=cfg.stored_layers)
        @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: axes.LAYERS})
        def make_layers(rngs: nnx.Rngs) -> TransformerBlock:
            return TransformerBlock(cfg, rngs=rngs)

        stacked = make_layers(rngs)  # every parameter: [layers, ...] ([1, ...] when shared)
        # Unrolled, each block keeps its own arrays (no slicing out of, or gradients written back into, a
        # stack: measured faster on CPU, docs/records.md), with the values the stack was initialised to,
        # unless ``stacked_params`` keeps the stack (fewer arrays to dispatch and update: a GPU's choice).
        self.layers = stacked if cfg.stacks_layers else nnx.Dict(
            {str(i): block for i, block in enumerate(unstack(stacked, cfg))})
        self.final_norm = layer_norm(cfg, rngs=rngs) if cfg.pre_norm else None
        self.pooler = (
            dense(cfg, cfg.hidden_size, cfg.hidden_size, (axes.EMBED, None), rngs=rngs)
            if cfg.use_pooler
            else None
        )

    def __call__(
        self,
        input_ids,
        input_mask,
        segment_ids,
        *,
        attention_mask=None,
        position_ids=None,
        deterministic: bool = True,
        rngs: nnx.Rngs | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        token_index: jax.Array | None = None,
        embedding_output: jax.Array | None = None,
    ) -> EncoderOutput:
        """``token_index`` [shards, tokens]: run the blocks on those real tokens only
        (`token_layout.Unpadded`); the outputs at real positions are the same, padding positions
        come out as zeros. ``embedding_output`` [batch, length, E]: another encoder's embeddings of
        ``input_ids`` (required, and only allowed, when built ``with_embeddings=False``)."""
        # input_ids, input_mask, segment_ids: [batch, length] int32
        cfg = self.cfg
        if input_ids.shape[-1] + cfg.position_offset > cfg.max_position_embeddings:
            raise ValueError(
                f"sequence length {input_ids.shape[-1]} (+ position_offset {cfg.position_offset}) exceeds "
                f"max_position_embeddings {cfg.max_position_embeddings}"
            )
        if not deterministic and rngs is None:
            raise ValueError("training mode (deterministic=False) needs rngs=nnx.Rngs(dropout=key)")
        if (embedding_output is None) != (self.embeddings is not None):
            raise ValueError("pass embedding_output exactly when the encoder has no embeddings of its own")
        mask = padding_mask(input_mask) if attention_mask is None else attention_mask
        x = embedding_output if self.embeddings is None else self.embeddings(
            input_ids, segment_ids, position_ids, deterministic=deterministic, rngs=rngs
        )  # [batch, length, E]
        if self.embedding_projection is not None:
            x = self.embedding_projection(x)  # [batch, length, embed]
        x = constrain(x, *RESIDUAL)  # [batch, length, embed]: split like the batch, not like the tables
        embedding_output = x
        layout = PADDED
        if token_index is not None:
            if output_hidden_states or output_attentions:
                raise ValueError("token_index (unpadded blocks) does not go with output_hidden_states/attentions")
            layout = Unpadded(token_index, *input_ids.shape)
        # [*tokens, embed]: [batch, length] padded, [shards, tokens] unpadded
        x = constrain(layout.to_tokens(x), *RESIDUAL)
        positions = None
        if cfg.rotary:  # [batch | 1, length]: what the blocks rotate queries and keys by
            positions = jnp.arange(input_ids.shape[-1])[None, :] if position_ids is None else position_ids

        x, hiddens, probs = self.run_blocks(x, mask, layout, positions=positions, deterministic=deterministic,
                                            rngs=rngs, output_hidden_states=output_hidden_states,
                                            output_attentions=output_attentions)
        if self.final_norm is not None:
            x = self.final_norm(x)  # [*tokens, embed]
        x = constrain(layout.to_rows(x), *RESIDUAL)  # [batch, length, embed]
        hidden_states = None
        if output_hidden_states:
            if self.final_norm is not None:  # the last one after the final norm, as Hugging Face's
                hiddens = hiddens.at[-1].set(x)
            # [layers + 1, batch, length, embed]
            hidden_states = jnp.concatenate([embedding_output[None], hiddens], axis=0)
        pooled = None if self.pooler is None else self.pool(x)  # [batch, embed]
        return EncoderOutput(x, pooled, hidden_states, probs if output_attentions else None)

    def run_blocks(self, x, mask, layout: TokenLayout, *, positions=None, deterministic: bool, rngs,
                   output_hidden_states: bool, output_attentions: bool):
        """The transformer blocks over x [*tokens, embed]: one ``lax.scan`` over the stacked layers or
        unrolled, each block rematerialised under ``cfg.remat_policy``. Returns the last block's
        output [*tokens, embed], every block's output [layers, *tokens, embed] (or None) and the
        attention probabilities [layers, batch, heads, length, length] (or None). ``positions``
        [batch | 1, length]: the rotary positions (None without rotary)."""
        cfg = self.cfg
        keys = None if deterministic else jax.random.split(rngs.dropout(), cfg.num_layers)
        specs = cfg.layer_specs()  # per-layer data [layers] (None for BERT)
        if isinstance(self.layers, nnx.Dict):  # per-layer parameters ("0", "1", ...), unrolled
            graphdef, stacked = nnx.split(self.layers["0"])[0], None
        else:
            graphdef, stacked = nnx.split(self.layers)

        def layer(h, params, key, spec):
            block = nnx.merge(graphdef, params)
            layer_rngs = None if key is None else nnx.Rngs(dropout=key)
            return block(h, mask, layout, spec=spec, positions=positions, deterministic=deterministic,
                         rngs=layer_rngs, return_probs=output_attentions)

        scanned = stacked is not None and cfg.scanned
        policy = remat_policy(cfg.remat_policy)
        if policy is not None:  # an unrolled block's spec (Python values) stays static under remat
            layer = jax.checkpoint(layer, policy=None if policy == "full" else policy,
                                   static_argnums=() if scanned else (3,))

        shared = jax.tree.map(lambda a: a[0], stacked) if cfg.share_layers else None  # one block

        def step(h, xs):
            params, key, spec = xs
            h, probs = layer(h, shared if params is None else params, key, spec)
            h = constrain(h, *RESIDUAL)  # [*tokens, embed]: the scan's carry stays split like the batch
            return h, (h if output_hidden_states else None, probs)

        per_layer = None if cfg.share_layers else stacked  # scanned over; the shared block is closed over
        if scanned:
            x, (hiddens, probs) = jax.lax.scan(step, x, (per_layer, keys, specs), length=cfg.num_layers)
        else:
            outs = []
            for i in range(cfg.num_layers):
                key = None if keys is None else keys[i]
                if stacked is None:  # block i's own arrays
                    params = nnx.split(self.layers[str(i)])[1]
                else:  # ALBERT's shared block (or a stack run unrolled)
                    params = None if per_layer is None else jax.tree.map(lambda a, i=i: a[i], per_layer)
                x, out = step(x, (params, key, None if specs is None else specs.at(i)))
                outs.append(out)
            hiddens, probs = jax.tree.map(lambda *a: jnp.stack(a), *outs) if outs else (None, None)
        return x, hiddens, probs

    def pool(self, sequence_output, positions=None):
        """tanh(dense(the [CLS] vectors)): sequence_output [batch, length, embed] → [batch, embed]
        from position 0, or → [batch, K, embed] from ``positions`` [batch, K] (packed rows)."""
        if positions is None:
            return jnp.tanh(self.pooler(sequence_output[:, 0]))  # [batch, embed]
        cls = jnp.take_along_axis(sequence_output, positions[..., None], axis=1)  # [batch, K, embed]
        return jnp.tanh(self.pooler(cls))  # [batch, K, embed]
