"""Residual add, dropout and LayerNorm in one GPU kernel (Pallas, lowered to Triton): `add_dropout_norm`.

Each half of BERT's block ends in LN(x + dropout(a)): x the residual, a the sublayer's output. XLA
runs it, forward and backward, as about ten fusions that write and read the sum, float32 copies of
it and the mask (docs/records.md, "Residual, dropout and LayerNorm in one kernel"). This kernel reads
x and a once and writes the sum h and the normed y, drawing the dropout mask inside itself and
keeping it as bits; its backward reads dy, h and the bits once and writes dx and da, with the
scale's and bias' gradients summed per program.

    y = add_dropout_norm(x, a, scale, bias, eps=1e-12)                        # no dropout
    y = add_dropout_norm(x, a, scale, bias, eps=1e-12, key=key, rate=0.1)     # BERT's training step
    y = add_dropout_norm(x, a, scale, bias, a_bias=b, eps=1e-12, key=key, rate=0.1)  # LN(x + dropout(a + b))

* x, a: [..., width], one dtype; width a multiple of 32 (`norm_applies`). scale, bias: [width]
  (bias None: a norm without a shift). a_bias: [width] or None, the sublayer's output bias, added to
  a in float32 as it is loaded, so that no pass writes a + a_bias (its gradient is Σ da, summed per
  program as dscale's). y in x's dtype; statistics in float32 over h as stored.
* Dropout: element (token, c) of a is kept, and scaled by 1 / (1 - rate), when its 16 random bits
  are at least round(rate · 2¹⁶) (flash attention's rule, `dropout.threshold`): bits from
  `dropout.bits16` keyed by ``key``, counter (token · width / 4 + c / 4, 0), token the global
  number ``tokens`` gives (default 0, 1, ...), so the mask does not depend on how tokens are split
  over devices. `norm_keep` draws the same mask outside the kernel; `reference_add_norm` is the
  kernel's computation in XLA, what the tests compare it with.
* interpret=True: Pallas' interpreter (any backend; how the CPU tests check the kernel).
* tiling: `NormTiling`, the forward's tokens and warps per program and the backward's tokens a loop
  step and programs; not tuned on a GPU yet (`tests/gpu/run.py`'s ``norm_kernels`` stage times others
  beside XLA's).

The backward is LayerNorm's: with x̂ = (h - mean) / std and g = dy ∘ scale,
dh = (g - mean(g) - x̂ ∘ mean(g ∘ x̂)) / std; dx = dh, da = keep ∘ dh / (1 - rate),
dscale = Σ dy ∘ x̂, dbias = Σ dy, da_bias = Σ da over tokens.
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
from bert_jax.model.flash import DTYPES

ROWS = 8  # tokens per program in the forward
STEP_ROWS = 2  # tokens per loop step in the backward (it holds three float32 copies of them)
CHUNK = 256  # a row is loaded in pieces of at most this many features (Triton's blocks are powers of two)
PROGRAMS = 1024  # the backward's programs at most: each sums its tokens' share of dscale and dbias
WARPS = 8


@dataclasses.dataclass(frozen=True)
class NormTiling:
    """Tokens per program in the forward (`ROWS`; fewer where the tokens do not divide), warps per
    program (forward and backward), tokens per loop step in the backward (`STEP_ROWS`, at most
    ``rows``) and the backward's programs at most (`PROGRAMS`)."""
    rows: int = ROWS
    warps: int = WARPS
    step_rows: int = STEP_ROWS
    programs: int = PROGRAMS

    def __post_init__(self):
        powers = (self.rows, self.step_rows, self.programs)
        if min(powers) < 1 or any(n & (n - 1) for n in powers) or self.warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"{self}: expected rows, step_rows and programs powers of two and 1-16 warps")

    def label(self) -> str:
        """"rows/warps, backward step_rows x programs": the GPU script's name for it."""
        return f"{self.rows}/{self.warps}, bwd {self.step_rows}x{self.programs}"


def norm_applies(width: int, dtype) -> bool:
    """Whether the kernel takes rows ``width`` wide in ``dtype``."""
    return width > 0 and width % 32 == 0 and jnp.dtype(dtype) in DTYPES


def _chunk(width: int) -> int:
    return min(width & -width, CHUNK)  # the largest power of two that divides the width, at most CHUNK


def _keep(k0, k1, tokens, first: int, size: int, width: int, rate: float) -> jax.Array:
    """[R, size] bool: the mask of ``tokens`` [R] (uint32, global numbers) at features first..first+size."""
    quad = (first // 4 + jnp.arange(size // 4)).astype(jnp.uint32)[None, :]  # [1, size / 4]
    counter = tokens[:, None] * np.uint32(width // 4) + quad  # [R, size / 4]
    return bits16(k0, k1, counter, np.uint32(0)) >= np.uint32(threshold(rate))


def norm_keep(key: jax.Array, rate: float, tokens: jax.Array, width: int) -> jax.Array:
    """The kernel's dropout mask for ``tokens`` [M] (int32, global numbers): [M, width] bool, True = kept."""
    k0, k1 = key_words(key)
    return _keep(k0, k1, tokens.astype(jnp.uint32), 0, width, width, rate)


def reference_add_norm(x, a, scale, bias=None, *, a_bias=None, eps: float, key=None, rate: float = 0.0,
                       tokens=None):
    """`add_dropout_norm` in XLA, with the kernel's mask: what the tests compare the kernel with."""
    width = x.shape[-1]
    if a_bias is not None:
        a = a.astype(jnp.float32) + a_bias.astype(jnp.float32)  # [..., width]
    if rate:
        tokens = jnp.arange(x.size // width) if tokens is None else tokens.reshape(-1)
        keep = norm_keep(key, rate, tokens, width).reshape(a.shape)
        a = jnp.where(keep, a.astype(jnp.float32) * (1.0 / (1.0 - rate)), 0.0)
    h = (x.astype(jnp.float32) + a.astype(jnp.float32)).astype(x.dtype).astype(jnp.float32)  # [..., width]
    mean = h.mean(axis=-1, keepdims=True)
    rstd = jax.lax.rsqrt(jnp.square(h - mean).mean(axis=-1, keepdims=True) + eps)
    y = (h - mean) * rstd * scale.astype(jnp.float32)
    return (y if bias is None else y + bias.astype(jnp.float32)).astype(x.dtype)


def _forward_kernel(seed_ref, tokens_ref, x_ref, a_ref, scale_ref, bias_ref, a_bias_ref, y_ref, h_ref, mean_ref,
                    rstd_ref, *bits_ref, rate, eps, chunk):
    width = x_ref.shape[-1]
    starts = range(0, width, chunk)
    tokens = tokens_ref[...].astype(jnp.uint32)  # [R]
    hs = []
    for c in starts:
        a = a_ref[:, pl.ds(c, chunk)].astype(jnp.float32) + a_bias_ref[pl.ds(c, chunk)].astype(jnp.float32)[None, :]
        if rate:  # the mask, kept as bits for the backward: [R, chunk / 32] words
            kept = _keep(seed_ref[0], seed_ref[1], tokens, c, chunk, width, rate)
            bits_ref[0][:, pl.ds(c // 32, chunk // 32)] = pack(kept)
            a = jnp.where(kept, a * (1.0 / (1.0 - rate)), 0.0)
        h = (x_ref[:, pl.ds(c, chunk)].astype(jnp.float32) + a).astype(h_ref.dtype)  # [R, chunk]
        h_ref[:, pl.ds(c, chunk)] = h
        hs.append(h.astype(jnp.float32))
    mean = sum(h.sum(axis=-1) for h in hs) / width  # [R]
    rstd = jax.lax.rsqrt(sum(jnp.square(h - mean[:, None]).sum(axis=-1) for h in hs) / width + eps)  # [R]
    for c, h in zip(starts, hs, strict=True):
        y = (h - mean[:, None]) * rstd[:, None] * scale_ref[pl.ds(c, chunk)].astype(jnp.float32)[None, :]
        y_ref[:, pl.ds(c, chunk)] = (y + bias_ref[pl.ds(c, chunk)].astype(jnp.float32)[None, :]).astype(y_ref.dtype)
    mean_ref[...] = mean
    rstd_ref[...] = rstd


def _backward_kernel(dy_ref, h_ref, mean_ref, rstd_ref, scale_ref, *refs, rate, chunk, rows, steps, shifted):
    bits_ref, dx_ref, *rest = refs if rate else (None, *refs)
    da_ref, dscale_ref, dbias_ref, *da_bias_ref = rest if rate else (None, *rest)
    width = dy_ref.shape[-1]
    starts = range(0, width, chunk)

    def step(i, sums):  # rows i · rows ... of this program's tokens
        r = pl.ds(i * rows, rows)
        mean, rstd = mean_ref[r][:, None], rstd_ref[r][:, None]  # [R, 1]
        xhat = [(h_ref[r, pl.ds(c, chunk)].astype(jnp.float32) - mean) * rstd for c in starts]  # [R, chunk]
        dy = [dy_ref[r, pl.ds(c, chunk)].astype(jnp.float32) for c in starts]  # [R, chunk]
        g = [d * scale_ref[pl.ds(c, chunk)].astype(jnp.float32)[None, :] for c, d in zip(starts, dy, strict=True)]
        mean_g = (sum(gi.sum(axis=-1) for gi in g) / width)[:, None]  # [R, 1]
        mean_gx = (sum((gi * xi).sum(axis=-1) for gi, xi in zip(g, xhat, strict=True)) / width)[:, None]  # [R, 1]
        dscale, dbias, da_bias = (list(t) for t in sums)
        for j, (c, gi, xi) in enumerate(zip(starts, g, xhat, strict=True)):
            dh = rstd * (gi - mean_g - xi * mean_gx)  # [R, chunk]
            dx_ref[r, pl.ds(c, chunk)] = dh.astype(dx_ref.dtype)
            if rate:
                kept = unpack(bits_ref[r, pl.ds(c // 32, chunk // 32)])  # [R, chunk]
                dh = jnp.where(kept, dh * (1.0 / (1.0 - rate)), 0.0)  # [R, chunk]: da
                da_ref[r, pl.ds(c, chunk)] = dh.astype(da_ref.dtype)
            dscale[j] += (dy[j] * xi).sum(axis=0)
            dbias[j] += dy[j].sum(axis=0)
            if shifted:
                da_bias[j] += dh.sum(axis=0)
        return tuple(dscale), tuple(dbias), tuple(da_bias)

    zeros = tuple(jnp.zeros((chunk,), jnp.float32) for _ in starts)
    dscale, dbias, da_bias = jax.lax.fori_loop(0, steps, step, (zeros, zeros, zeros if shifted else ()))
    for c, s, b in zip(starts, dscale, dbias, strict=True):
        dscale_ref[pl.ds(c, chunk)] = s
        dbias_ref[pl.ds(c, chunk)] = b
    for c, s in zip(starts, da_bias, strict=False):  # none unless shifted
        da_bias_ref[0][pl.ds(c, chunk)] = s


def _programs(blocks: int, most: int = PROGRAMS) -> int:
    """The backward's programs: the largest power of two at most ``most`` that divides ``blocks``."""
    programs = 1
    while programs * 2 <= most and blocks % (programs * 2) == 0:
        programs *= 2
    return programs


def _forward(x, a, scale, bias, a_bias, seed, tokens, rate, eps, tiling, interpret):
    tokens_n, width = x.shape
    rows = tiling.rows
    a_bias = jnp.zeros((width,), x.dtype) if a_bias is None else a_bias  # [width]
    kernel = functools.partial(_forward_kernel, rate=rate, eps=eps, chunk=_chunk(width))
    block = pl.BlockSpec((rows, width), lambda i: (i, 0))
    per_token = pl.BlockSpec((rows,), lambda i: (i,))
    whole = pl.BlockSpec((width,), lambda i: (0,))
    out_specs = [block, block, per_token, per_token]  # y, h, mean, 1 / std
    out_shape = [jax.ShapeDtypeStruct(x.shape, x.dtype)] * 2 + [jax.ShapeDtypeStruct((tokens_n,), jnp.float32)] * 2
    if rate:  # the dropout mask's bits [tokens, width / 32], for the backward
        out_specs.append(pl.BlockSpec((rows, width // 32), lambda i: (i, 0)))
        out_shape.append(jax.ShapeDtypeStruct((tokens_n, width // 32), jnp.uint32))
    return pl.pallas_call(
        kernel,
        grid=(tokens_n // rows,),
        in_specs=[pl.BlockSpec((2,), lambda i: (0,)), per_token, block, block, whole, whole, whole],
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=plgpu.CompilerParams(num_warps=tiling.warps, num_stages=1),
        interpret=interpret,
        name="add_dropout_norm_forward",
    )(seed, tokens, x, a, scale, bias, a_bias)  # y, h, mean, rstd[, bits]


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9, 10))
def _norm(x, a, scale, bias, a_bias, seed, tokens, rate, eps, tiling, interpret):
    return _forward(x, a, scale, bias, a_bias, seed, tokens, rate, eps, tiling, interpret)[0]


def _norm_fwd(x, a, scale, bias, a_bias, seed, tokens, rate, eps, tiling, interpret):
    y, h, mean, rstd, *bits = _forward(x, a, scale, bias, a_bias, seed, tokens, rate, eps, tiling, interpret)
    return y, (h, mean, rstd, scale, bias, a_bias, bits)  # the mask's bits stand for the seed and tokens


def _norm_bwd(rate, eps, tiling, interpret, res, dy):
    h, mean, rstd, scale, bias, a_bias, bits = res
    tokens_n, width = h.shape
    step_rows = math.gcd(tiling.rows, tiling.step_rows)
    programs = _programs(tokens_n // step_rows, tiling.programs)
    steps = tokens_n // step_rows // programs
    shifted = a_bias is not None
    kernel = functools.partial(_backward_kernel, rate=rate, chunk=_chunk(width), rows=step_rows, steps=steps,
                               shifted=shifted)
    span = tokens_n // programs  # each program's tokens
    block = pl.BlockSpec((span, width), lambda p: (p, 0))
    per_token = pl.BlockSpec((span,), lambda p: (p,))
    sums = pl.BlockSpec((None, width), lambda p: (p, 0))
    in_specs = [block, block, per_token, per_token, pl.BlockSpec((width,), lambda p: (0,))]
    out_specs = [block, block] if rate else [block]
    out_shape = [jax.ShapeDtypeStruct(h.shape, dy.dtype)] * len(out_specs)
    if rate:
        in_specs.append(pl.BlockSpec((span, width // 32), lambda p: (p, 0)))
    n_sums = 3 if shifted else 2  # dscale, dbias[, da_bias] per program
    *grads, dscale, dbias, da_bias = [*pl.pallas_call(
        kernel,
        grid=(programs,),
        in_specs=in_specs,
        out_specs=[*out_specs, *[sums] * n_sums],
        out_shape=[*out_shape, *[jax.ShapeDtypeStruct((programs, width), jnp.float32)] * n_sums],
        compiler_params=plgpu.CompilerParams(num_warps=tiling.warps, num_stages=1),
        interpret=interpret,
        name="add_dropout_norm_backward",
    )(dy, h, mean, rstd, scale, *bits), *([] if shifted else [None])]
    dx, da = grads if rate else (grads[0], grads[0])
    da_bias = None if da_bias is None else da_bias.sum(axis=0).astype(a_bias.dtype)
    return (dx, da, dscale.sum(axis=0).astype(scale.dtype), dbias.sum(axis=0).astype(bias.dtype), da_bias, None, None)


_norm.defvjp(_norm_fwd, _norm_bwd)


def add_dropout_norm(x, a, scale, bias=None, *, a_bias=None, eps: float, key=None, rate: float = 0.0, tokens=None,
                     interpret: bool = False, tiling: NormTiling = NormTiling()) -> jax.Array:
    """LayerNorm(x + dropout(a + a_bias)) over the last axis, scale and bias [width] (bias None: none),
    a_bias [width] (None: none), dropout ``rate`` drawn from ``key``: x's shape and dtype. ``tokens``
    (int32, x's shape less the width): the global numbers of these tokens, which the dropout mask uses
    (default 0, 1, ...)."""
    width = x.shape[-1]
    vectors = [v.shape for v in (scale, bias, a_bias) if v is not None]
    if a.shape != x.shape or a.dtype != x.dtype or not norm_applies(width, x.dtype) or {*vectors} != {(width,)}:
        raise ValueError(f"add_dropout_norm takes x and a of one shape and dtype in {[str(d) for d in DTYPES]}, "
                         f"a width that is a multiple of 32 and scale, bias and a_bias of that width: got x "
                         f"{x.shape} {x.dtype}, a {a.shape} {a.dtype}, scale, bias, a_bias {vectors}")
    if not 0.0 <= rate < 1.0 or (rate and key is None):
        raise ValueError(f"add_dropout_norm's dropout rate {rate}: expected 0 <= rate < 1, and a key when > 0")
    tokens_n = math.prod(x.shape[:-1])
    rows = tiling.rows
    while tokens_n % rows:
        rows //= 2
    tokens = jnp.arange(tokens_n, dtype=jnp.int32) if tokens is None else tokens.reshape(tokens_n)  # [tokens]
    seed = jnp.stack(key_words(key)) if rate else jnp.zeros((2,), jnp.uint32)  # [2] uint32
    bias = jnp.zeros((width,), scale.dtype) if bias is None else bias
    y = _norm(x.reshape(tokens_n, width), a.reshape(tokens_n, width), scale, bias, a_bias, seed,
              tokens.astype(jnp.int32), float(rate), float(eps), dataclasses.replace(tiling, rows=rows),
              interpret)  # [tokens, width]
    return y.reshape(x.shape)
