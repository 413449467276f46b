r"""Where one encoder layer's time goes in the TPU compiler's estimate: each of its matmuls alone,
the attention core alone and the whole block, forward and backward, for one chip's share of a
batch, compiled by libtpu for a TPU topology (no TPU needed; needs ``libtpu``, like
`bert_jax.benchmark.aot`).

    python -m bert_jax.benchmark.aot_layer --topology v5p-8 [--size large] [--rows 64] \
        [--seq_len 128] [--output layer.jsonl]

Parts, each compiled alone on one device of the topology (bfloat16; forward, then the backward
from a given cotangent, so nothing but the part is compiled):

* ``projection``: [rows x T, D] x [D, D], the query, key, value and output projections (4 a layer);
* ``ffn``: [rows x T, D] x [D, F], the feed-forward's two matmuls (2 a layer: the output one,
  [rows x T, F] x [F, D], with its backward is the same three products);
* ``attention``: the attention core with its dropout (`bert_jax.benchmark.aot_attention`, ``xla``);
* ``block``: the encoder's `TransformerBlock` as pre-training runs it (dropout on; LayerNorms, GELU,
  residuals, biases: everything the parts leave out).

Per part: libtpu's estimate (``compiler_ms``, decoded as `aot.compiler_seconds`), the cost
analysis's FLOPs and bytes, and ``peak_fraction``: those FLOPs over the estimate at the chip's
published bf16 peak (what a part would give as MFU if the step were made of it). ``rest_ms`` (the
``block`` row) is the block less its parts times their count: the element-wise work between the
matmuls as the compiler prices it. Estimates, not measurements (docs/records.md, "TPU: the
compiler's estimate").
"""

from __future__ import annotations

from bert_jax.benchmark import aot
from input_pipeline import command_line as cli

PARTS = ("projection", "ffn", "attention", "block")
PER_LAYER = {"projection": 4, "ffn": 2, "attention": 1}  # the block counts itself


def matmul_with_grads(x, w, g):
    """y = x w, then the backward from the cotangent g: (y, dx, dw). x: [tokens, k]; w: [k, n];
    g: [tokens, n]."""
    import jax

    y, backward = jax.vjp(lambda x, w: x @ w, x, w)  # [tokens, n]
    return (y, *backward(g))


def block_with_grads(cfg, graphdef, params, x, mask, key, g):
    """The block forward in training mode (dropout from ``key``), then the backward from the
    cotangent g: (out, d params, d x). x, g: [rows, T, D]; mask: bool [rows, 1, 1, T]."""
    import jax
    from flax import nnx

    def forward(params, x):
        block = nnx.merge(graphdef, params)
        return block(x, mask, deterministic=False, rngs=nnx.Rngs(dropout=key))[0]  # [rows, T, D]

    out, backward = jax.vjp(forward, params, x)
    return (out, *backward(g))


def compile_part(part: str, cfg, device, rows: int, length: int) -> dict:
    """One part's forward + backward compiled on ``device``: estimate, FLOPs, bytes."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from jax.sharding import SingleDeviceSharding

    from bert_jax.benchmark import aot_attention
    from bert_jax.model.layers import TransformerBlock

    on = SingleDeviceSharding(device)

    def spec(shape, dtype=jnp.bfloat16):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=on)

    tokens, d, f = rows * length, cfg.hidden_size, cfg.intermediate_size
    if part == "attention":
        r = aot_attention.compile_variant("xla", device, rows, length, cfg.num_heads, cfg.head_dim,
                                          cfg.attention_dropout_prob)
        return {k: r[k] for k in ("compiler_ms", "flops", "bytes")}
    if part in ("projection", "ffn"):
        k, n = {"projection": (d, d), "ffn": (d, f)}[part]
        compiled = jax.jit(matmul_with_grads).lower(spec((tokens, k)), spec((k, n)), spec((tokens, n))).compile()
        return aot.compiled_cost(compiled)
    if part != "block":
        raise ValueError(f"unknown part {part!r}; expected one of {', '.join(PARTS)}")
    block = nnx.eval_shape(lambda: TransformerBlock(cfg, rngs=nnx.Rngs(0)))
    graphdef, params = nnx.split(block)
    params = jax.tree.map(lambda a: spec(a.shape, a.dtype), params)
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=on)
    fn = jax.jit(lambda p, x, m, key, g: block_with_grads(cfg, graphdef, p, x, m, key, g))
    x = spec((rows, length, d))
    return aot.compiled_cost(fn.lower(params, x, spec((rows, 1, 1, length), jnp.bool_), key, x).compile())


def main(argv=None) -> list[dict]:
    from bert_jax.benchmark import aot_attention

    p = aot_attention.share_parser("python -m bert_jax.benchmark.aot_layer", __doc__, "parts", PARTS)
    args, parts, cfg = aot_attention.parse_share(p, argv, "parts", PARTS, dtype="bfloat16", num_layers=1)
    chip, _, devices = aot.tpu_devices(args.topology)
    peak = chip.peak_bf16 / chip.devices_per_chip  # one device's share of the chip
    rows = []
    for part in parts:
        r = compile_part(part, cfg, devices[0], args.rows, args.seq_len)
        ms = r["compiler_ms"]
        r.update(part=part, topology=args.topology, size=args.size, rows=args.rows, seq_len=args.seq_len,
                 per_layer=PER_LAYER.get(part, 1),
                 peak_fraction=None if not ms else round(r["flops"] / (ms * 1e-3 * peak), 3))
        rows.append(r)
        print(f"{part:11s} {ms} ms (x {r['per_layer']} a layer), {r['flops'] / 1e9:.1f} GFLOP, "
              f"{r['bytes'] / 1e6:.0f} MB, {r['peak_fraction']:.0%} of the peak" if ms else f"{part}: no estimate",
              flush=True)
    by = {r["part"]: r for r in rows}
    if "block" in by and by["block"]["compiler_ms"] and all(by.get(q, {}).get("compiler_ms") for q in PER_LAYER):
        parts_ms = sum(by[q]["compiler_ms"] * n for q, n in PER_LAYER.items())
        by["block"]["rest_ms"] = round(by["block"]["compiler_ms"] - parts_ms, 4)
        print(f"block less its parts: {by['block']['rest_ms']} ms of {by['block']['compiler_ms']} "
              f"(parts {parts_ms:.4f} ms)", flush=True)
    return aot_attention.append_rows(args.output, rows)


if __name__ == "__main__":
    cli.run(main)
