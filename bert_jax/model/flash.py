"""Flash attention with dropout for NVIDIA GPUs (a Pallas kernel, lowered to Triton): `flash_attention`.

cuDNN's fused attention (``attention_impl="cudnn"``) takes no dropout that JAX exposes, so a training
step with BERT's attention dropout (0.1) ran attention as einsums, writing and reading the
[batch, heads, T, S] scores, probabilities and mask several times a layer (docs/records.md, "The GPU
compiler's program at its roofline"). This kernel keeps a block of scores on chip and draws the
dropout mask inside itself from the step's key, in the forward, which keeps it for the backward as
bits (T · S / 8 bytes per row and head: 16 times less than the probabilities in bfloat16).

    ctx = flash_attention(q, k, v, segment_ids)                      # no dropout
    ctx = flash_attention(q, k, v, segment_ids, key=key, rate=0.1)   # BERT's training step
    ctx = flash_attention(q, k, v, segment_ids, window=128)          # ModernBERT's local layer
    ctx = flash_attention(q, k, v, segment_ids, bias=b, key=key, rate=0.1)  # b: [3, heads, head_dim]

* q, k, v: [batch, length, heads, head_dim], the model's layout; head_dim 16, 32, 64 or 128, the
  length a multiple of `BLOCK` (`flash_applies`).
* segment_ids: [batch, length] int32 as splash's (`splash.segment_ids_from_mask`): a query sees the
  keys of its own id (padding, 0, sees padding: nothing downstream reads those rows).
* bias: [3, heads, head_dim] or None, the query, key and value projections' biases (BERT's), so that
  the projections hand the kernel their products as the matrix units write them: the query bias is
  added to each query block as it is loaded; the key bias not at all (it adds one constant to a
  query's logits, which the softmax cancels: its gradient is 0); the value bias as rowsum(Z) · b_v at
  the end of the forward and as dO · b_v in the backward's dZ, so key and value blocks go from memory
  to the products untouched.
* window: 0 = global; else a query sees the keys within ``window // 2`` positions on either side
  (ModernBERT's local layers), and the kernel skips the key blocks outside the band.
* Dropout: probability (b, n, t, s) is kept, and scaled by 1 / (1 - rate), when 16 random bits are at
  least round(rate · 2¹⁶): a keep probability within 2⁻¹⁷ of 1 - rate (0.1: 0.900009). The bits come
  from Threefry-2x32 (the model's fused dropout's, `dropout.bits16`) keyed by ``key``, one call
  for 4 neighbouring keys (64 bits), counter ((n · T + t) · S / 4 + s / 4, b): global row and head
  numbers, so the mask does not depend on how the batch or the heads are split over devices.
  The backward reads the forward's bits (`pack`, `unpack`) instead of drawing them twice more: the
  Threefry's integer work, not the bits' bytes, is what a GPU would wait on (docs/records.md).
  `dropout_keep` draws the same mask outside the kernel; `reference_attention` is the kernel's
  computation in XLA, what the tests compare it with.
* interpret=True: Pallas' interpreter (any backend; how the CPU tests check the kernel).

The backward follows FlashAttention-2 with dropout: Z = keep ∘ P / (1 - rate) is the matrix that
multiplies V, so dV = Zᵀ dO, dP = keep ∘ (dO Vᵀ) / (1 - rate) and dS = P ∘ (dP - rowsum(dO ∘ O)).
Each backward program also writes its block's Σ dQ and Σ dV (the query and value biases' gradients)
so that no pass reads dQ and dV again for them.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from bert_jax.model.dropout import bits16, key_words, pack, threshold, unpack

BLOCK = 64  # query and key tokens per program and loop step (forward and backward): the default tiling
HEAD_DIMS = (16, 32, 64, 128)  # powers of two: Triton's blocks
DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32))
LOG2E = math.log2(math.e)  # the kernel's softmax is in base 2: e^x = 2^(x log2 e)
MASKED = -0.7 * float(np.finfo(np.float32).max)  # a hidden key's logit (finite: no inf - inf)


@dataclasses.dataclass(frozen=True)
class Tiling:
    """The kernels' blocks of tokens (queries and keys alike) and warps per program: not tuned on a GPU
    yet (`tests/gpu/run.py`'s ``attention_kernels`` stage times the others)."""
    block: int = BLOCK
    warps: int = 4

    def __post_init__(self):
        if self.block < 32 or self.block & (self.block - 1) or self.warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"flash Tiling(block={self.block}, warps={self.warps}): expected a block that is a "
                             "power of two of at least 32 (the dropout mask's 32-bit words) and 1-16 warps")

    def name(self, kernel: str, window: int) -> str:
        """The pallas_call's name, which `bert_jax.benchmark.roofline` reads back: window and block."""
        return kernel + (f"_window{window}" if window else "") + (f"_block{self.block}" if self.block != BLOCK else "")


def flash_applies(length: int, head_dim: int, dtype) -> bool:
    """Whether the kernel takes queries of ``length`` tokens, ``head_dim`` wide, in ``dtype``."""
    return length > 0 and length % BLOCK == 0 and head_dim in HEAD_DIMS and jnp.dtype(dtype) in DTYPES


def random16(k0, k1, b, n, t, quad, length: int):
    """16 random bits per (query, key): `dropout.bits16` of key (k0, k1) at counter ((n · length + t) ·
    length / 4 + quad, b), key 4 · quad + 2 · half + word. b, n: uint32 scalars or arrays broadcasting
    with t [..., R, 1] (query positions) and quad [..., 1, Q] (key positions / 4), all uint32.
    Returns [..., R, 4 Q] uint32 below 2¹⁶."""
    counter = (n * np.uint32(length) + t) * np.uint32(length // 4) + quad  # [..., R, Q]
    return bits16(k0, k1, counter, b)


def dropout_keep(key: jax.Array, rate: float, shape: tuple[int, int, int, int]) -> jax.Array:
    """The kernel's dropout mask for probabilities of ``shape`` [batch, heads, T, S]: bool, True = kept."""
    batch, heads, length, _ = shape
    k0, k1 = key_words(key)
    b = jax.lax.broadcasted_iota(jnp.uint32, (batch, 1, 1, 1), 0)
    n = jax.lax.broadcasted_iota(jnp.uint32, (1, heads, 1, 1), 1)
    t = jax.lax.broadcasted_iota(jnp.uint32, (1, 1, length, 1), 2)
    quad = jax.lax.broadcasted_iota(jnp.uint32, (1, 1, 1, length // 4), 3)
    return random16(k0, k1, b, n, t, quad, length) >= np.uint32(threshold(rate))  # [batch, heads, T, S]


def visible(q_ids, k_ids, rows, cols, window: int):
    """[R, C] bool: the keys (``cols`` [C], ids ``k_ids``) each query (``rows`` [R], ids ``q_ids``) sees."""
    seen = q_ids[:, None] == k_ids[None, :]
    if window:
        seen = seen & (jnp.abs(rows[:, None] - cols[None, :]) <= window // 2)
    return seen


def reference_attention(q, k, v, segment_ids, *, bias=None, key=None, rate: float = 0.0, window: int = 0):
    """The kernel's computation in XLA (einsums and a [batch, heads, T, S] mask): [batch, length, heads, kv]."""
    if bias is not None:
        q, k, v = (x + b.astype(x.dtype) for x, b in zip((q, k, v), bias, strict=True))
    length = q.shape[1]
    logits = jnp.einsum("BTNH,BSNH->BNTS", q, k, preferred_element_type=jnp.float32) / math.sqrt(q.shape[-1])
    pos = jnp.arange(length)  # [length]
    seen = jax.vmap(lambda ids: visible(ids, ids, pos, pos, window))(segment_ids)[:, None]  # [batch, 1, T, S]
    probs = jax.nn.softmax(jnp.where(seen, logits, MASKED), axis=-1)  # [batch, heads, T, S]
    if rate:
        probs = jnp.where(dropout_keep(key, rate, probs.shape), probs / (1.0 - rate), 0.0)
    return jnp.einsum("BNTS,BSNH->BTNH", probs.astype(v.dtype), v).astype(q.dtype)


def block_pairs(length: int, window: int, block: int = BLOCK) -> int:
    """The (query block, key block) pairs the kernel computes for ``length`` tokens and ``window``."""
    n, half = length // block, window // 2
    if not window:
        return n * n
    return sum(min(i * block + block - 1 + half, length - 1) // block + 1 - max(i * block - half, 0) // block
               for i in range(n))


def key_blocks(start, size: int, block: int, length: int, window: int):
    """The [first, last) blocks of ``block`` tokens holding a key within ``window // 2`` of the
    ``size`` queries from ``start`` (traced): all of them for a global layer."""
    if not window:
        return 0, length // block
    half = window // 2
    first = jax.lax.div(jnp.maximum(start - half, 0), block)
    last = jax.lax.div(jnp.minimum(start + size - 1 + half, length - 1), block) + 1
    return first, last


def logits(q, k, q_ids, k_ids, rows, cols, *, scale: float, window: int):
    """Base-2 logits [R, C] of queries q [R, H] (positions ``rows``, ids ``q_ids``) against keys k [C, H]
    (``cols``, ``k_ids``), the keys a query does not see at `MASKED`."""
    x = jnp.dot(q, k.T, preferred_element_type=jnp.float32) * (scale * LOG2E)
    return jnp.where(visible(q_ids, k_ids, rows, cols, window), x, MASKED)


def keep_block(seed_ref, row, head, rows, first_col, cols: int, *, rate: float, length: int):
    """[R, cols] bool, in a kernel: the dropout mask of row ``row`` and head ``head`` (uint32), queries
    ``rows`` [R] and the ``cols`` keys from ``first_col``, keyed by the words of ``seed_ref``."""
    t = rows.astype(jnp.uint32)[:, None]
    quad = (jax.lax.div(first_col, 4) + jnp.arange(cols // 4)).astype(jnp.uint32)[None, :]
    return random16(seed_ref[0], seed_ref[1], row, head, t, quad, length) >= np.uint32(threshold(rate))


def _forward_kernel(seed_ref, rows_ref, heads_ref, q_ref, k_ref, v_ref, ids_ref, bias_ref, o_ref, lse_ref, *mask_ref,
                    rate, window, scale, block):
    length = k_ref.shape[0]
    i = pl.program_id(0)
    keep = functools.partial(keep_block, seed_ref, rows_ref[0].astype(jnp.uint32), heads_ref[0].astype(jnp.uint32),
                             rate=rate, length=length)
    # The projections' biases without touching the key and value blocks: the key bias adds a constant
    # to each query's logits (softmax cancels it); the value bias adds rowsum(Z) · b_v to Z V.
    q = q_ref[...] + bias_ref[0][None, :]  # [block, H]
    rows = i * block + jnp.arange(block)  # [block]
    q_ids = ids_ref[pl.ds(i * block, block)]  # [block]

    def step(j, carry):  # online softmax over key block j
        o, m, total, kept_total = carry  # [block, H], [block] x 3 float32: output, row max, denominator, its kept part
        keys = pl.ds(j * block, block)
        x = logits(q, k_ref[keys, :], q_ids, ids_ref[keys], rows, j * block + jnp.arange(block), scale=scale,
                   window=window)  # [block, block]
        m_next = jnp.maximum(m, x.max(axis=-1))
        correction = jnp.exp2(m - m_next)
        p = jnp.exp2(x - m_next[:, None])  # [block, block] unnormalised probabilities
        total = correction * total + p.sum(axis=-1)
        if rate:  # the mask, kept as bits for the backward: [block, block / 32] words of this key block
            kept = keep(rows, j * block, block)  # [block, block]
            mask_ref[0][:, pl.ds(j * (block // 32), block // 32)] = pack(kept)
            p = jnp.where(kept, p, 0.0)
            kept_total = correction * kept_total + p.sum(axis=-1)  # without dropout: ``total`` itself
        pv = jnp.dot(p.astype(v_ref.dtype), v_ref[keys, :], preferred_element_type=jnp.float32)  # [block, H]
        return correction[:, None] * o + pv, m_next, total, kept_total

    zeros = jnp.zeros((block,), jnp.float32)
    init = (jnp.zeros(q.shape, jnp.float32), jnp.full((block,), -jnp.inf, jnp.float32), zeros, zeros)
    o, m, total, kept_total = jax.lax.fori_loop(*key_blocks(i * block, block, block, length, window), step, init)
    kept_total = kept_total if rate else total
    o = o + kept_total[:, None] * bias_ref[2].astype(jnp.float32)[None, :]  # Z (V + b_v) = Z V + rowsum(Z) b_v
    o_ref[...] = (o * (1.0 / (1.0 - rate) / total)[:, None]).astype(o_ref.dtype)
    lse_ref[...] = m + jnp.log2(total)  # [block]: the base-2 log of each row's softmax denominator


def _backward_kernel(q_ref, k_ref, v_ref, ids_ref, bias_ref, do_ref, lse_ref, delta_ref, dob_ref, *refs, rate,
                     window, scale, block):
    mask_ref, (dq_ref, dk_ref, dv_ref, sums_ref) = (refs[0], refs[1:]) if rate else (None, refs)
    length = k_ref.shape[0]
    inv_keep = 1.0 / (1.0 - rate)
    bq = bias_ref[0]  # [H]: the query bias (the key bias cancels; the value bias enters through dob)

    def grads(i, j, q, k, v, do):
        """dS [block, block] (logits' gradient, scaled) and Z (the dropped probabilities) of query
        block i and key block j."""
        queries = pl.ds(i * block, block)
        rows, cols = i * block + jnp.arange(block), j * block + jnp.arange(block)
        x = logits(q, k, ids_ref[queries], ids_ref[pl.ds(j * block, block)], rows, cols, scale=scale, window=window)
        p = jnp.exp2(x - lse_ref[queries][:, None])  # [block, block] probabilities
        # dO (V + b_v)ᵀ: dO Vᵀ and each query's dO · b_v
        dz = jnp.dot(do, v.T, preferred_element_type=jnp.float32) + dob_ref[queries][:, None]  # [block, block]
        z, dp = p, dz
        if rate:  # the forward's mask, from its bits
            keep = unpack(mask_ref[queries, pl.ds(j * (block // 32), block // 32)])  # [block, block]
            z, dp = jnp.where(keep, p * inv_keep, 0.0), jnp.where(keep, dz * inv_keep, 0.0)
        return p * (dp - delta_ref[queries][:, None]) * scale, z

    # dK and dV of key block c (this program's), over the query blocks that see it.
    c = pl.program_id(2)
    keys = pl.ds(c * block, block)
    k, v = k_ref[keys, :], v_ref[keys, :]  # [block, H]

    def dkv_step(i, carry):
        dk, dv = carry
        queries = pl.ds(i * block, block)
        q, do = q_ref[queries, :] + bq[None, :], do_ref[queries, :]
        ds, z = grads(i, c, q, k, v, do)
        dv = dv + jnp.dot(z.astype(do.dtype).T, do, preferred_element_type=jnp.float32)
        dk = dk + jnp.dot(ds.astype(q.dtype).T, q, preferred_element_type=jnp.float32)
        return dk, dv

    zeros = jnp.zeros(k.shape, jnp.float32)
    dk, dv = jax.lax.fori_loop(*key_blocks(c * block, block, block, length, window), dkv_step, (zeros, zeros))
    dk_ref[...], dv_ref[...] = dk.astype(dk_ref.dtype), dv.astype(dv_ref.dtype)
    sums_ref[1, :] = dv.sum(axis=0)  # [H]: this block's share of the value bias's gradient

    # dQ of query block c, over the key blocks it sees.
    queries = pl.ds(c * block, block)
    q, do = q_ref[queries, :] + bq[None, :], do_ref[queries, :]

    def dq_step(j, dq):  # dS (K + b_k) = dS K: dS's rows sum to 0
        keys = pl.ds(j * block, block)
        kj = k_ref[keys, :]
        ds, _ = grads(c, j, q, kj, v_ref[keys, :], do)
        return dq + jnp.dot(ds.astype(kj.dtype), kj, preferred_element_type=jnp.float32)

    dq = jax.lax.fori_loop(*key_blocks(c * block, block, block, length, window), dq_step, zeros)
    dq_ref[...] = dq.astype(dq_ref.dtype)
    sums_ref[0, :] = dq.sum(axis=0)  # [H]: and of the query bias's


def _specs(batch_first_grid: bool, length: int, head_dim: int, block: int):
    """Block specs of the kernels' shared inputs: seed, rows, heads, q (a block or whole), k, v, ids, bias."""
    if batch_first_grid:  # the backward's grid: (batch, heads, block)
        b, n = (lambda b, n, _: b), (lambda b, n, _: n)
        q = pl.BlockSpec((None, length, None, head_dim), lambda b, n, _: (b, 0, n, 0))
    else:  # the forward's: (query block, batch, heads)
        b, n = (lambda _, b, n: b), (lambda _, b, n: n)
        q = pl.BlockSpec((None, block, None, head_dim), lambda i, b, n: (b, i, n, 0))
    whole = pl.BlockSpec((None, length, None, head_dim), lambda *g: (b(*g), 0, n(*g), 0))
    return [pl.BlockSpec((2,), lambda *g: (0,)), pl.BlockSpec((1,), lambda *g: (b(*g),)),
            pl.BlockSpec((1,), lambda *g: (n(*g),)), q, whole, whole,
            pl.BlockSpec((None, length), lambda *g: (b(*g), 0)),
            pl.BlockSpec((3, None, head_dim), lambda *g: (0, n(*g), 0))]  # this head's q, k and v biases


def _forward(q, k, v, ids, bias, seed, rows, heads, rate, window, tiling, interpret):
    batch, length, num_heads, head_dim = q.shape
    block = tiling.block
    kernel = functools.partial(_forward_kernel, rate=rate, window=window, scale=1.0 / math.sqrt(head_dim), block=block)
    out_specs = [pl.BlockSpec((None, block, None, head_dim), lambda i, b, n: (b, i, n, 0)),  # o
                 pl.BlockSpec((None, None, block), lambda i, b, n: (b, n, i))]  # lse
    out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((batch, num_heads, length), jnp.float32)]
    if rate:  # the dropout mask's bits [batch, heads, T, S / 32], for the backward
        out_specs.append(pl.BlockSpec((None, None, block, length // 32), lambda i, b, n: (b, n, i, 0)))
        out_shape.append(jax.ShapeDtypeStruct((batch, num_heads, length, length // 32), jnp.uint32))
    return pl.pallas_call(
        kernel,
        grid=(length // block, batch, num_heads),
        in_specs=_specs(False, length, head_dim, block),
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=plgpu.CompilerParams(num_warps=tiling.warps, num_stages=2),
        interpret=interpret,
        name=tiling.name("flash_forward", window),
    )(seed, rows, heads, q, k, v, ids, bias)  # o, lse[, mask]


@functools.partial(jax.custom_vjp, nondiff_argnums=(8, 9, 10, 11))
def _flash(q, k, v, ids, bias, seed, rows, heads, rate, window, tiling, interpret):
    return _forward(q, k, v, ids, bias, seed, rows, heads, rate, window, tiling, interpret)[0]


def _flash_fwd(q, k, v, ids, bias, seed, rows, heads, rate, window, tiling, interpret):
    o, lse, *mask = _forward(q, k, v, ids, bias, seed, rows, heads, rate, window, tiling, interpret)
    return o, (q, k, v, ids, bias, o, lse, mask)  # the mask's bits stand for the seed, rows and heads


def _flash_bwd(rate, window, tiling, interpret, res, do):
    q, k, v, ids, bias, o, lse, mask = res
    batch, length, num_heads, head_dim = q.shape
    block = tiling.block
    # rowsum(dO ∘ O) and dO · b_v, [batch, heads, T] each, in one pass over dO
    both = jnp.stack([o.astype(jnp.float32), jnp.broadcast_to(bias[2].astype(jnp.float32), o.shape)])  # [2, *o.shape]
    delta, dob = jnp.einsum("BTNH,KBTNH->KBNT", do.astype(jnp.float32), both)
    kernel = functools.partial(_backward_kernel, rate=rate, window=window, scale=1.0 / math.sqrt(head_dim), block=block)
    per_row = pl.BlockSpec((None, None, length), lambda b, n, _: (b, n, 0))
    out = pl.BlockSpec((None, block, None, head_dim), lambda b, n, c: (b, c, n, 0))
    specs = _specs(True, length, head_dim, block)[3:]  # q, k, v, ids, bias (not the seed, rows and heads)
    bits = [pl.BlockSpec((None, None, length, length // 32), lambda b, n, _: (b, n, 0, 0))] if mask else []
    sums = pl.BlockSpec((None, None, None, 2, head_dim), lambda b, n, c: (b, n, c, 0, 0))  # Σ dq, Σ dv per program
    dq, dk, dv, sums = pl.pallas_call(
        kernel,
        grid=(batch, num_heads, length // block),
        in_specs=[*specs, specs[0], per_row, per_row, per_row, *bits],  # ..., do (as q), lse, delta, dob[, bits]
        out_specs=[out, out, out, sums],
        out_shape=[*(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v)),
                   jax.ShapeDtypeStruct((batch, num_heads, length // block, 2, head_dim), jnp.float32)],
        compiler_params=plgpu.CompilerParams(num_warps=tiling.warps, num_stages=2),
        interpret=interpret,
        name=tiling.name("flash_backward", window),
    )(q, k, v, ids, bias, do, lse, delta, dob, *mask)
    dq_bias, dv_bias = jnp.moveaxis(sums.sum(axis=(0, 2)), 1, 0)  # [N, H] each, from the programs' sums
    # The key bias's gradient, Σ dk = Σ_t Σ_s dS[s, t] q[s], is 0: dS's rows sum to 0.
    dbias = jnp.stack([dq_bias, jnp.zeros_like(dq_bias), dv_bias]).astype(bias.dtype)  # [3, N, H]
    return dq, dk, dv, None, dbias, None, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def flash_attention(q, k, v, segment_ids, *, bias=None, key=None, rate: float = 0.0, window: int = 0, rows=None,
                    heads=None, tiling: Tiling = Tiling(), interpret: bool = False) -> jax.Array:
    """Attention of q, k, v [batch, length, heads, head_dim] among tokens of one segment id
    ([batch, length] int32), ``window`` 0 or a local band, dropout ``rate`` on the probabilities drawn
    from ``key``: [batch, length, heads, head_dim]. ``bias`` [3, heads, head_dim] (or None): the
    query, key and value projections' biases, added as the kernel loads them (so the projections
    need not write their sums). ``rows`` [batch] and ``heads`` [heads] (int32): the global row and
    head numbers of this shard's (default: 0, 1, ...), which the dropout mask uses."""
    batch, length, num_heads, head_dim = q.shape
    if not flash_applies(length, head_dim, q.dtype) or length % tiling.block:
        raise ValueError(f"flash attention takes a length that is a multiple of {tiling.block}, a head width in "
                         f"{HEAD_DIMS} and {[str(d) for d in DTYPES]}: got {q.shape} {q.dtype}")
    if not 0.0 <= rate < 1.0 or (rate and key is None):
        raise ValueError(f"flash attention's dropout rate {rate}: expected 0 <= rate < 1, and a key when > 0")
    seed = jnp.stack(key_words(key)) if rate else jnp.zeros((2,), jnp.uint32)  # [2] uint32
    rows = jnp.arange(batch, dtype=jnp.int32) if rows is None else rows  # [batch]
    heads = jnp.arange(num_heads, dtype=jnp.int32) if heads is None else heads  # [heads]
    bias = jnp.zeros((3, num_heads, head_dim), q.dtype) if bias is None else bias.astype(q.dtype)  # [3, heads, kv]
    return _flash(q, k, v, segment_ids.astype(jnp.int32), bias, seed, rows, heads, float(rate), int(window), tiling,
                  interpret)
