"""Splash attention (JAX's Pallas kernel for TPUs) for the model's self-attention: `splash_attention`.

The model's ``attention_impl="splash"`` runs this in place of ``jax.nn.dot_product_attention``:
block-sparse flash attention (``jax.experimental.pallas.ops.tpu.splash_attention``) with the
padding / packing mask given as segment ids and ModernBERT's sliding window as a static local mask,
so a local layer skips the key blocks outside its window instead of masking a full [T, S] matrix.

    ctx = splash_attention(q, k, v, segment_ids)               # global
    ctx = splash_attention(q, k, v, segment_ids, window=128)   # ModernBERT local: ±64 tokens

* q, k, v: [batch, length, heads, head_dim] (the model's layout); the kernel's [heads, length,
  head_dim] is taken per row by ``jax.vmap`` over the batch. q is scaled by 1/sqrt(head_dim) here,
  as the model's attention scales its logits.
* segment_ids: [batch, length] int32, 0 = padding, 1, 2, ... = packed examples (a plain padded batch:
  1 for real tokens). A query attends to the keys of its own segment; padding queries (segment 0)
  come back as zeros (the XLA path's values there are meaningless: a packed mask leaves the row
  fully masked, a padding mask lets it attend to the real keys; nothing downstream reads them).
  `segment_ids_from_mask` recovers them from the model's boolean masks.
* window: None = global; else ModernBERT's ``local_attention``: a token sees the keys within
  ``window // 2`` positions on either side, |i - j| <= window // 2 — Hugging Face's
  ``ModernBertModel._update_attention_mask`` (``distance <= local_attention // 2``) and its flash path
  (``window_size=(local_attention // 2,) * 2``), on row positions (a packed example's window is
  clipped by its segment, as there).
* The kernel's blocks are 512, 256 or 128 tokens (a global layer's: the largest dividing the length;
  a local layer's: the one that lets its band skip the most work, `local_block_size`, 128 at 1,024
  tokens and a 128-token window): the length must be a multiple of 128 (`block_size`; the model pads
  to one on TPU). Head widths: any since JAX 0.7.1
  (values are padded to the 128 lanes inside the kernel); JAX's own TPU tests cover 64, 128, 192 and
  256, float32 and bfloat16, which is what `splash_applies` admits.
* ``interpret=True`` runs the Pallas kernels in interpret mode (any backend, the CPU included).

Checked (tests/model/test_splash.py, interpret mode on the CPU, float32, batch 2, 2 heads, head width
64 and 128, lengths 128 and 256): forward and gradients w.r.t. q, k, v against plain XLA attention
with the boolean mask built from the same segment ids and window — padded rows, three packed
examples, window 32, global; the ModernBERT window against Hugging Face's definition. Not checked
here: the kernel compiled for a real TPU (Mosaic) and its speed.

On a multi-device mesh a Pallas call is not partitioned by XLA: run it per shard under
``jax.shard_map`` (batch and heads split, length whole), as MaxText does.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash_kernel
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as splash_mask

BLOCK_SIZES = (512, 256, 128)  # tokens per kernel block, largest first (multiples of the 128 TPU lanes)
HEAD_DIMS_TESTED = (64, 128, 192, 256)  # head widths JAX's splash tests run on TPU (jax >= 0.7.1)
DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))


def block_size(length: int) -> int:
    """The kernel's block (query and key tokens, forward and backward): the largest of 512, 256, 128
    dividing ``length``; a ValueError naming the length when none does."""
    for block in BLOCK_SIZES:
        if length > 0 and length % block == 0:
            return block
    raise ValueError(
        f"splash attention: sequence length {length} is not a multiple of 128 (the kernel's blocks are "
        f"{', '.join(map(str, BLOCK_SIZES))} tokens). The model pads lengths to multiples of 128 on TPU; pad "
        "the batch to one, or use attention_impl='xla'.")


def band_blocks(length: int, block: int, window: int | None) -> int:
    """How many (query block, key block) pairs of ``block`` tokens the kernel computes for a layer of
    ``window`` (None: global, every pair); a local layer skips the pairs its band does not reach."""
    n = length // block
    if window is None:
        return n * n
    w = window // 2
    return sum(min(n - 1, ((i + 1) * block - 1 + w) // block) - max(0, (i * block - w) // block) + 1 for i in range(n))


def local_block_size(length: int, window: int) -> int:
    """The block for a local layer: of 512, 256, 128 dividing ``length``, the one whose computed pairs
    cover the fewest query-key positions (`band_blocks` x block²), the larger on a tie. At 1,024 tokens
    and a 128-token window: 128 (22 of 64 pairs, 0.34 of the positions; 512-token blocks compute them all)."""
    blocks = [b for b in BLOCK_SIZES if length > 0 and length % b == 0]
    if not blocks:
        return block_size(length)  # the error naming the length
    return min(blocks, key=lambda b: (band_blocks(length, b, window) * b * b, -b))


def splash_applies(length: int, head_dim: int, dtype) -> bool:
    """Whether the splash kernel takes this shape: a length that is a positive multiple of 128 and a
    head width and dtype that JAX's TPU tests of the kernel cover (64, 128, 192, 256; float32, bfloat16).
    For the model's "auto" on TPU."""
    return (length > 0 and length % BLOCK_SIZES[-1] == 0 and head_dim in HEAD_DIMS_TESTED
            and jnp.dtype(dtype) in DTYPES)


def segment_ids_from_mask(mask: jax.Array) -> jax.Array:
    """The model's boolean attention mask → splash segment ids [batch, length] int32.

    * padding mask [batch, 1, 1, length] (True = real key): 1 for real tokens, 0 for padding;
    * packed mask [batch, 1, length, length] (``encoder.packed_mask``: a token attends to the real
      tokens of its own example): each token's id is 1 + the position of its example's first token,
      0 for padding (a row that attends to nothing). Any mask that is "same example and real key"
      (an equivalence on the real tokens) gives back exactly that mask."""
    if mask.shape[-2] == 1:
        return mask[:, 0, 0, :].astype(jnp.int32)  # [batch, length]
    rows = mask[:, 0]  # [batch, T, S]
    first = jnp.argmax(rows, axis=-1).astype(jnp.int32)  # [batch, T]: the first key each query sees
    return jnp.where(rows.any(axis=-1), first + 1, 0)  # [batch, T]


def local_window(window: int | None) -> tuple[int, int] | None:
    """ModernBERT's ``local_attention`` → the keys a token sees on its (left, right): window // 2 each."""
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(f"window {window!r}: expected None (global) or a local window of tokens >= 0")
    return (window // 2, window // 2)


def make_kernel(length: int, heads: int, *, window: int | None = None, interpret: bool = False):
    """The splash kernel for one row: [heads, length, head_dim] q, k, v and SegmentIds([length],
    [length]) → [heads, length, head_dim]. The mask is static (numpy, processed once per shape by the
    library's cache): full, or local with ``window``, whose blocks are `local_block_size`'s so that the
    band skips the key blocks it does not reach."""
    block = block_size(length) if window is None else local_block_size(length, window)
    shape = (length, length)
    sides = local_window(window)
    base = splash_mask.FullMask(shape) if sides is None else splash_mask.LocalMask(shape, sides, offset=0)
    sizes = splash_kernel.BlockSizes(
        block_q=block, block_kv=block, block_kv_compute=block,
        block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
        block_q_dq=block, block_kv_dq=block)
    return splash_kernel.make_splash_mha(
        splash_mask.MultiHeadMask((base,) * heads), block_sizes=sizes, head_shards=1, q_seq_shards=1,
        interpret=interpret)


def splash_attention(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array, *,
                     window: int | None = None, interpret: bool = False) -> jax.Array:
    """Softmax(q k^T / sqrt(head_dim), masked) v by the splash kernel.

    q, k, v: [batch, length, heads, head_dim]; segment_ids: [batch, length] int (0 = padding, 1, 2,
    ... = packed examples); window: None (global) or ModernBERT's local window (|i - j| <= window // 2).
    Returns the context [batch, length, heads, head_dim] in q's dtype; padding query rows are zeros."""
    batch, length, heads, head_dim = q.shape
    if k.shape != q.shape or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"q {q.shape}, k {k.shape}, v {v.shape}: expected [batch, length, heads, head_dim] alike")
    if segment_ids.shape != (batch, length):
        raise ValueError(f"segment_ids {segment_ids.shape}: expected [batch, length] = {(batch, length)}")
    kernel = make_kernel(length, heads, window=window, interpret=interpret)
    scale = 1.0 / math.sqrt(head_dim)
    qs = jnp.einsum("BTNH->BNTH", (q.astype(jnp.float32) * scale).astype(q.dtype))  # [batch, heads, T, H]
    ks = jnp.einsum("BSNH->BNSH", k)  # [batch, heads, S, H]
    vs = jnp.einsum("BSNH->BNSH", v)  # [batch, heads, S, H]
    ids = segment_ids.astype(jnp.int32)  # [batch, length]

    def row(q1, k1, v1, ids1):  # [heads, length, H] x3, [length] → [heads, length, H]
        return kernel(q1, k1, v1, segment_ids=splash_kernel.SegmentIds(q=ids1, kv=ids1))

    ctx = jax.vmap(row)(qs, ks, vs, ids)  # [batch, heads, T, H]
    ctx = jnp.einsum("BNTH->BTNH", ctx)  # [batch, T, heads, H]
    return jnp.where((ids > 0)[:, :, None, None], ctx, jnp.zeros((), ctx.dtype))  # [batch, T, heads, H]
