r"""What attention costs in the TPU compiler's estimate, and what a fused kernel would change: the
attention core alone (scores, padding mask, softmax, dropout on the probabilities, context; forward
and backward) for one chip's share of a batch, compiled by libtpu for a TPU topology (no TPU needed;
needs ``libtpu``, like `bert_jax.benchmark.aot`).

    python -m bert_jax.benchmark.aot_attention --topology v5p-8 [--size large] [--rows 64] \
        [--seq_len 128] [--attention_dropout 0.1] [--output attention.jsonl]

Three variants, each compiled on one device of the topology:

* ``xla``: the encoder's attention with attention dropout (`bert_jax.model.layers.explicit_attention`:
  the einsums; dropout on the [rows, heads, T, S] probabilities, ``jax.random.bernoulli``);
* ``xla_no_dropout``: the same without dropout (what ``jax.nn.dot_product_attention`` computes on XLA);
* ``splash``: Pallas splash attention for the TPU
  (``jax.experimental.pallas.ops.tpu.splash_attention``; no dropout: the kernel has none; padding
  as segment ids).

Per variant: libtpu's estimate (``compiler_ms``, decoded as `aot.compiler_seconds`), the cost
analysis's FLOPs and bytes, and ``step_share_ms``: the estimate times the encoder's layers, the
attention's part of one step at that many rows per chip. The cost analysis does not look inside a
Mosaic kernel (the splash row's FLOPs are those of the code around it, not the kernel's), so its
estimate is the compiler's guess at a custom call, not a price; the XLA rows bound what any
attention kernel could save: at most their whole ``step_share_ms``.
"""

from __future__ import annotations

import argparse
import functools
import json
import math

from bert_jax.benchmark import aot
from input_pipeline import command_line as cli

VARIANTS = ("xla", "xla_no_dropout", "splash")


def xla_attention(q, k, v, mask, key, *, rate: float):
    """The encoder's explicit attention (`bert_jax.model.layers.explicit_attention`, the model's
    `Dropout` drawing with ``jax.random.bernoulli`` as on accelerators). q, k, v: [rows, T, heads,
    head_dim]; mask: int [rows, T], 1 = real token; key: a PRNG key for the dropout."""
    from flax import nnx

    from bert_jax.model.dropout import Dropout
    from bert_jax.model.layers import explicit_attention

    ctx, _ = explicit_attention(q, k, v, mask[:, None, None, :] > 0, Dropout(rate, "jax"), deterministic=not rate,
                                rngs=nnx.Rngs(dropout=key))
    return ctx  # [rows, T, heads, head_dim]


def splash_attention(q, k, v, mask, key, *, rate: float = 0.0):
    """Pallas splash attention (TPU only), the same inputs; padding as segment ids (real tokens
    attend to real tokens). No dropout."""
    import jax
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    del key, rate
    rows, length, heads, head_dim = q.shape
    block = min(length, 128)
    kernel = sk.make_splash_mha(
        sm.MultiHeadMask([sm.FullMask((length, length)) for _ in range(heads)]), head_shards=1, q_seq_shards=1,
        block_sizes=sk.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                                  block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block))

    def one(q, k, v, segments):  # [T, heads, head_dim] each; the kernel takes [heads, T, head_dim]
        out = kernel(q.transpose(1, 0, 2) / math.sqrt(head_dim), k.transpose(1, 0, 2), v.transpose(1, 0, 2),
                     segment_ids=segments)
        return out.transpose(1, 0, 2)

    return jax.vmap(one)(q, k, v, sk.SegmentIds(q=mask, kv=mask))  # [rows, T, heads, head_dim]


def compile_variant(variant: str, device, rows: int, length: int, heads: int, head_dim: int, rate: float) -> dict:
    """One variant's forward + backward compiled on ``device``: estimate, FLOPs, bytes."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding

    fn = {"xla": functools.partial(xla_attention, rate=rate),
          "xla_no_dropout": functools.partial(xla_attention, rate=0.0), "splash": splash_attention}[variant]

    def loss(q, k, v, mask, key):
        return (fn(q, k, v, mask, jax.random.wrap_key_data(key)).astype(jnp.float32) ** 2).mean()

    on = SingleDeviceSharding(device)
    x = jax.ShapeDtypeStruct((rows, length, heads, head_dim), jnp.bfloat16, sharding=on)
    mask = jax.ShapeDtypeStruct((rows, length), jnp.int32, sharding=on)
    key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=on)
    compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).lower(x, x, x, mask, key).compile()
    return dict(variant=variant, **aot.compiled_cost(compiled))


def share_parser(prog: str, doc: str, what: str, choices: tuple[str, ...]) -> cli.ArgumentParser:
    """The arguments of the tools that compile one chip's share of a batch: --topology, --size,
    --rows, --seq_len, --output and ``--<what>`` (a comma list of ``choices``)."""
    p = cli.ArgumentParser(prog=prog, description=doc.split("\n\n")[0],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topology", required=True, help="e.g. v5p-8, v4-8, v5e-8")
    p.add_argument("--size", default="large", help="the BERT size: its heads, widths and layers (default large)")
    p.add_argument("--rows", type=int, default=64, help="rows per chip (phase 1 at batch 256 on 4 chips: 64)")
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument(f"--{what}", default=",".join(choices), help=f"comma-separated, of {', '.join(choices)}")
    p.add_argument("--output", default="", help="append the rows as JSON lines to this file")
    return p


def parse_share(p: cli.ArgumentParser, argv, what: str, choices: tuple[str, ...], **model):
    """Parses and checks `share_parser`'s arguments: (args, the chosen ``what`` list, the size's
    `BertConfig` with ``model`` overrides)."""
    from bert_jax.model.config import BertConfig

    args = p.parse_args(argv)
    chosen = [v for v in getattr(args, what).split(",") if v]
    if bad := [v for v in chosen if v not in choices]:
        p.error(f"--{what}: unknown {', '.join(bad)}; expected some of {', '.join(choices)}")
    if args.rows < 1 or args.seq_len < 1:
        p.error(f"--rows {args.rows} --seq_len {args.seq_len}: expected positive numbers")
    try:
        cfg = BertConfig.from_size(args.size, **model)
    except (KeyError, ValueError) as e:
        p.error(f"--size {args.size!r}: {cli.message(e)}")
    return args, chosen, cfg


def append_rows(path: str, rows: list[dict]) -> list[dict]:
    """Appends ``rows`` as JSON lines to ``path`` (none if empty); returns them."""
    if path:
        with open(path, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return rows


def main(argv=None) -> list[dict]:
    p = share_parser("python -m bert_jax.benchmark.aot_attention", __doc__, "variants", VARIANTS)
    p.add_argument("--attention_dropout", type=float, default=0.1, help="the xla variant's dropout rate")
    args, variants, cfg = parse_share(p, argv, "variants", VARIANTS)
    if not 0.0 <= args.attention_dropout < 1.0:
        p.error(f"--attention_dropout {args.attention_dropout}: expected a rate in [0, 1)")
    chip, name, devices = aot.tpu_devices(args.topology)
    rows = []
    for variant in variants:
        r = compile_variant(variant, devices[0], args.rows, args.seq_len, cfg.num_heads, cfg.head_dim,
                            args.attention_dropout)
        r.update(topology=args.topology, size=args.size, layers=cfg.num_layers, rows=args.rows, seq_len=args.seq_len,
                 attention_dropout=args.attention_dropout if variant == "xla" else 0.0,
                 step_share_ms=None if r["compiler_ms"] is None else round(r["compiler_ms"] * cfg.num_layers, 2))
        print(f"{variant:15s} {r['compiler_ms']} ms per layer (x {cfg.num_layers} layers: {r['step_share_ms']} ms), "
              f"{r['flops'] / 1e9:.2f} GFLOP, {r['bytes'] / 1e6:.0f} MB", flush=True)
        rows.append(r)
    return append_rows(args.output, rows)


if __name__ == "__main__":
    cli.run(main)
