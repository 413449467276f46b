"""Attention alone on one GPU, forward and backward: the Pallas flash kernel (bert_jax/model/flash.py)
in several tilings, with and without its dropout, against XLA's explicit path (the model's, which
attention dropout takes today) and cuDNN's fused attention (no dropout), each beside the least time of
its compiled kernels at the card's roofline (bert_jax/benchmark/roofline.py). What it answers: how
near its bound the flash kernel runs, what drawing the dropout inside it costs, and which tiling to
keep. The ``attention_kernels`` stage of tests/gpu/run.py; on a CPU (``--quick``) the flash kernel runs
in Pallas' interpreter and cuDNN is skipped.
"""

from __future__ import annotations

import functools
import statistics
import time

import jax
import jax.numpy as jnp

# name: (batch, length, heads, head_dim, window, attention dropout): BERT-base's phase 1, ModernBERT-base's
# local layers at 1,024 tokens
CASES = {"bert-base-128": (256, 128, 12, 64, 0, 0.1), "modernbert-base-1024-local": (16, 1024, 12, 64, 128, 0.0)}
QUICK_CASES = {"tiny": (2, 128, 2, 64, 0, 0.1)}
TILINGS = ((64, 4), (64, 8), (128, 4), (128, 8))  # (block, warps); the first is the kernel's default


def implementations(window: int, rate: float, gpu: bool) -> dict:
    """{label: f(q, k, v, ids, key) -> [batch, length, heads, kv]} for one case."""
    from flax import nnx

    from bert_jax.model import flash
    from bert_jax.model.dropout import Dropout
    from bert_jax.model.layers import explicit_attention, local_mask

    def explicit(q, k, v, ids, key):
        mask = local_mask((ids > 0)[:, None, None, :], window)  # [batch, 1, 1 | T, S]
        return explicit_attention(q, k, v, mask, Dropout(rate), deterministic=not rate,
                                  rngs=nnx.Rngs(dropout=key))[0]

    def flash_with(tiling, p):
        return lambda q, k, v, ids, key: flash.flash_attention(q, k, v, ids, key=key, rate=p, window=window,
                                                               tiling=tiling, interpret=not gpu)

    dropout = " + dropout" if rate else ""
    impls = {"XLA explicit" + dropout: explicit}
    impls.update({f"flash {b}/{w}{dropout}": flash_with(flash.Tiling(b, w), rate) for b, w in TILINGS})
    if rate:
        impls["flash 64/4, no dropout"] = flash_with(flash.Tiling(), 0.0)
    if gpu and not window:
        impls["cuDNN, no dropout"] = lambda q, k, v, ids, key: jax.nn.dot_product_attention(
            q, k, v, key_value_seq_lengths=(ids > 0).sum(-1), implementation="cudnn")
    return impls


def least_ms(hlo: str) -> float | None:
    """The compiled program's least time on this card (None off the cards bert_jax.benchmark.aot knows)."""
    from bert_jax.benchmark import aot, roofline

    kind = jax.devices()[0].device_kind
    chip = aot.gpu_chip(kind)
    if chip is None:
        return None
    return roofline.table(roofline.kernels(hlo), chip.peak_bf16, chip.hbm_bandwidth)["ms"]


def time_one(fn, q, k, v, ids, key, steps: int) -> tuple[float, float | None]:
    """Median ms of forward + backward (gradients of q, k, v), and its compiled kernels' least ms."""
    cot = jax.random.normal(jax.random.key(9), q.shape, q.dtype)

    def loss(q, k, v):
        return jnp.sum(fn(q, k, v, ids, key).astype(jnp.float32) * cot)

    compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).lower(q, k, v).compile()
    return timed(compiled, (q, k, v), steps)


def timed(compiled, args: tuple, steps: int) -> tuple[float, float | None]:
    """Median ms of ``compiled(*args)`` over ``steps`` calls after one, and its kernels' least ms."""
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append((time.perf_counter() - t) * 1e3)
    try:
        bound = least_ms(compiled.as_text())
    except ValueError:  # a loop in the program: no roofline
        bound = None
    return statistics.median(times), bound


def table(quick: bool) -> tuple[str, list[dict]]:
    """The markdown table of every case and implementation, and its rows."""
    gpu = jax.devices()[0].platform == "gpu"
    rows, results = ["| case | attention | fwd + bwd ms | least ms | least / measured |", "|---|---|---|---|---|"], []
    for case, (b, t, n, h, window, rate) in (QUICK_CASES if quick else CASES).items():
        keys = jax.random.split(jax.random.key(0), 3)
        q, k, v = (jax.random.normal(x, (b, t, n, h), jnp.bfloat16 if gpu else jnp.float32) for x in keys)
        ids = jnp.ones((b, t), jnp.int32).at[:, t - t // 8:].set(0)  # [batch, length]: an eighth padding
        for name, fn in implementations(window, rate, gpu).items():
            measure(rows, results, (case, "attention", name),
                    functools.partial(time_one, fn, q, k, v, ids, jax.random.key(1), steps=3 if quick else 20))
    return "\n".join(rows), results


def measure(rows: list[str], results: list[dict], where: tuple[str, str, str], fn, digits: int = 2) -> None:
    """``fn() -> (ms, least ms)`` as a markdown row of ``rows`` and a result; ``where`` = (case, what the
    column names, the implementation). A failure is a row, not the end of the table."""
    case, column, name = where
    try:
        ms, bound = fn()
    except Exception as e:  # noqa: BLE001 - one implementation's failure is a row, not the end
        rows.append(f"| {case} | {name} | failed: {type(e).__name__}: {str(e)[:120]} | | |")
        return
    results.append({"case": case, column: name, "ms": ms, "least_ms": bound})
    least = "-" if bound is None else f"{bound:.{digits}f}"
    share = "-" if bound is None else f"{bound / ms:.0%}"
    rows.append(f"| {case} | {name} | {ms:.{digits}f} | {least} | {share} |")
