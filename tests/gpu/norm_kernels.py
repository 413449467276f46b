"""The residual add, dropout and LayerNorm alone on one GPU, forward and backward: the Pallas kernel
(bert_jax/model/fused_norm.py) in several tilings (`NormTiling`: the forward's rows and warps, the
backward's rows a step and programs) against the same computation in XLA
(`fused_norm.reference_add_norm`, the mask drawn outside), and the default tiling without its dropout,
each beside the least time of its compiled kernels at the card's roofline. What it answers: how near
its bound the fused kernel runs, what drawing the mask inside it costs (its Threefry is integer work a
roofline of bytes does not see), and which tiling to keep (BERT-base's step runs it 24 times). The
``norm_kernels`` stage of tests/gpu/run.py; on a CPU (``--quick``) the kernel runs in Pallas' interpreter.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tests.gpu.attention_kernels import measure, timed

# name: (tokens, width, dropout): BERT-base's phase 1 (256 x 128 tokens), BERT-large's at 512 (16 x 512)
CASES = {"bert-base-128": (32768, 768, 0.1), "bert-large-512": (8192, 1024, 0.1)}
QUICK_CASES = {"tiny": (64, 64, 0.1)}
# fused_norm.NormTiling's (rows, warps, backward step_rows, backward programs); the first is the default
TILINGS = ((8, 8, 2, 1024), (4, 4, 2, 1024), (16, 8, 2, 1024), (8, 8, 4, 1024), (8, 8, 2, 256), (8, 4, 1, 2048))


def implementations(gpu: bool) -> dict:
    """{label: f(x, a, scale, bias, a_bias, key, rate) -> y} for one case."""
    from bert_jax.model import fused_norm

    def kernel(tiling, dropout=True):
        return lambda x, a, s, b, ab, key, rate: fused_norm.add_dropout_norm(
            x, a, s, b, a_bias=ab, eps=1e-12, key=key, rate=rate if dropout else 0.0, interpret=not gpu,
            tiling=fused_norm.NormTiling(*tiling))

    impls = {"XLA (reference_add_norm)": lambda x, a, s, b, ab, key, rate: fused_norm.reference_add_norm(
        x, a, s, b, a_bias=ab, eps=1e-12, key=key, rate=rate)}
    impls.update({f"fused {fused_norm.NormTiling(*t).label()}": kernel(t) for t in TILINGS})
    impls[f"fused {fused_norm.NormTiling(*TILINGS[0]).label()}, no dropout"] = kernel(TILINGS[0], dropout=False)
    return impls


def table(quick: bool) -> tuple[str, list[dict]]:
    """The markdown table of every case and implementation, and its rows."""
    gpu = jax.devices()[0].platform == "gpu"
    dtype = jnp.bfloat16 if gpu else jnp.float32
    rows = ["| case | norm | fwd + bwd ms | least ms | least / measured |", "|---|---|---|---|---|"]
    results = []
    for case, (tokens, width, rate) in (QUICK_CASES if quick else CASES).items():
        keys = jax.random.split(jax.random.key(0), 4)
        x, a, dy = (jax.random.normal(k, (tokens, width), dtype) for k in keys[:3])  # [tokens, width]
        scale, bias, a_bias = (1.0 + 0.1 * jax.random.normal(k, (width,)) for k in jax.random.split(keys[3], 3))
        for name, fn in implementations(gpu).items():
            def fwd_bwd(x, a, s, b, ab, fn=fn, rate=rate, dy=dy):  # y and the gradients of every input
                y, vjp = jax.vjp(lambda *p: fn(*p, jax.random.key(1), rate), x, a, s, b, ab)
                return y, vjp(dy)

            args = (x, a, scale, bias, a_bias)
            measure(rows, results, (case, "norm", name),
                    lambda f=fwd_bwd, args=args: timed(jax.jit(f).lower(*args).compile(), args, 3 if quick else 20),
                    digits=3)
    return "\n".join(rows), results
