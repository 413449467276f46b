r"""``python -m bert_jax.benchmark.aot``: the training step compiled ahead of time for a real TPU topology
on any machine, and what the TPU compiler (``libtpu``: ``pip install -e '.[tpu]'``) says of it: one
tool over one table of chips (`CHIPS`) and one reader of the compiler's costs (`cost`).

    python -m bert_jax.benchmark.aot compile --config configs/pretrain.py:size=large,phase=2 --topology v5e-256 \
        [--config.batch_size=512] [--config.model.dtype=bfloat16] [--find_max_batch] [--output aot.jsonl]
    python -m bert_jax.benchmark.aot estimate --config configs/pretrain.py:size=large --topology v4-128 \
        [--config.x=y ...] [--steps 8599] [--no_memory]
    python -m bert_jax.benchmark.aot attention --topology v5p-8 [--size large] [--rows 64] [--seq_len 128]
    python -m bert_jax.benchmark.aot layer --topology v5p-8 [--size large] [--rows 64] [--seq_len 128]

``compile``: the step ``train.py`` would run for the config ("auto" meaning the TPU's): memory per
device against HBM, model FLOPs at 100% and 50% MFU. ``estimate`` (pre-training): the compiler counts
a loop's body once (the scanned layers, the micro-batch scan), so the step is also compiled with 1 and
2 unrolled layers at the micro-batch, extrapolated to L layers; an accumulated step is k · (micro-step
− update) + update; the time is libtpu's own estimate (`compiler_seconds`) where it is no faster than
the FLOPs at peak, else the roofline max(FLOPs / peak, bytes / HBM bandwidth) per device: a lower
bound without collectives, per-op overheads or the input. ``attention``, ``layer``: one chip's share
of a batch through the attention core alone (with and without dropout) or each part of a layer.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import json
import math
import os
import sys
import time

import jax
import jax.numpy as jnp
from absl import flags
from flax import nnx
from jax.sharding import SingleDeviceSharding
from ml_collections import config_flags

from bert_jax.benchmark import trainer_steps
from bert_jax.benchmark.flops import model_flops
from bert_jax.config_args import check_command_line, is_finetuning
from bert_jax.model.config import BertConfig
from bert_jax.model.dropout import Dropout
from bert_jax.model.layers import TransformerBlock, explicit_attention
from bert_jax.resolve import resolve
from bert_jax.training import sharding as sh
from bert_jax.training.sharding_rules import config_rules
from input_pipeline import command_line as cli


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str
    hbm_gib: float  # per chip
    peak_bf16: float  # dense bf16 FLOP/s per chip
    cores_per_chip: int  # the N of "v4-N" counts TensorCores on v3/v4/v5p, chips on v5e/v6e
    dims: int  # torus dimensions of the topology name
    hbm_bandwidth: float  # bytes/s per chip
    megacore: bool = True  # the chip's TensorCores are one JAX device (v4, v5p); v3's are one device each

    @property
    def devices_per_chip(self) -> int:
        return 1 if self.megacore else self.cores_per_chip


# cloud.google.com/tpu/docs/{v3,v4,v5e,v5p,v6e}, "key specifications".
CHIPS = {
    "v3": Chip("TPU v3", 32, 123e12, 2, 2, 900e9, megacore=False),
    "v4": Chip("TPU v4", 32, 275e12, 2, 3, 1200e9),
    "v5e": Chip("TPU v5e", 16, 197e12, 1, 2, 819e9),
    "v5p": Chip("TPU v5p", 95, 459e12, 2, 3, 2765e9),
    "v6e": Chip("TPU v6e", 32, 918e12, 1, 2, 1638e9),
}


def topology_name(spec: str) -> tuple[Chip, str, int]:
    """``v5e-256`` (an accelerator type) or ``v5e:16x16`` (a topology) → (chip, the compiler's topology
    name, chips)."""
    gen, sep, rest = spec.replace(":", "-", 1).partition("-")
    if gen not in CHIPS or not sep or not rest:
        raise ValueError(f"--topology {spec!r}: expected <generation>-<size> or <generation>:<AxB[xC]> with "
                         f"generation one of {', '.join(CHIPS)} (e.g. v5e-256, v4-32, v5p:2x2x1)")
    chip = CHIPS[gen]
    if "x" in rest:
        dims = rest.split("x")
        if len(dims) != chip.dims or not all(d.isdigit() for d in dims):
            raise ValueError(f"--topology {spec!r}: {gen} topologies have {chip.dims} dimensions")
        return chip, f"{gen}:{rest}", math.prod(map(int, dims))
    if not rest.isdigit() or int(rest) % chip.cores_per_chip:
        raise ValueError(f"--topology {spec!r}: the size must be a multiple of {chip.cores_per_chip}")
    chips = int(rest) // chip.cores_per_chip
    if chips & (chips - 1):
        raise ValueError(f"--topology {spec!r}: {chips} chips is not a power of two")
    if chip.dims == 2:
        a = 2 ** (int(math.log2(chips)) // 2)
        return chip, f"{gen}:{a}x{chips // a}", chips
    dims = {1: [1, 1, 1], 2: [1, 2, 1]}.get(chips, [2, 2, 1])
    while math.prod(dims) < chips:  # double the last of the smallest dimensions
        dims[max(i for i, d in enumerate(dims) if d == min(dims))] *= 2
    return chip, f"{gen}:{'x'.join(map(str, dims))}", chips


def tpu_devices(spec: str):
    """(chip, topology name, the topology's devices for the real TPU compiler; no TPU needed)."""
    chip, name, _ = topology_name(spec)
    if importlib.util.find_spec("libtpu") is None:
        raise cli.UserError("libtpu is not installed: pip install -e '.[tpu]' (jax[tpu] of the installed jax)")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")  # no metadata server: this is not a TPU VM
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # compiling only: several tools may run at once
    from jax.experimental import topologies

    dims = [int(d) for d in name.partition(":")[2].split("x")]
    try:  # a host holds up to 2x2 chips; megacore: one device per chip
        devices = topologies.get_topology_desc(
            platform="tpu", topology_name=name, chips_per_host_bounds=(min(dims[0], 2), min(dims[1], 2), 1),
            chip_config_name="megacore" if chip.megacore and chip.cores_per_chip > 1 else "default").devices
    except Exception as e:  # noqa: BLE001  (libtpu rejects the shape, with its own exception types)
        raise ValueError(f"--topology {spec!r} ({name}): libtpu does not accept it: {cli.message(e)}") from e
    return chip, name, devices


def load_config(spec: str, overrides: list[str]):
    """``configs/x.py[:arg]`` with ``--config.a.b=value`` overrides as ``train.py`` reads them, resolved
    for the TPU: "auto" means the platform that runs it, not this host's CPU."""
    argv = ["aot", f"--config={spec}", *overrides]
    check_command_line(argv)  # a missing file or key: one line
    fv = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True, sys_argv=argv)
    try:
        fv(argv)
    except flags.Error as e:
        raise ValueError(cli.message(e)) from e
    return resolve(fv.config, "tpu")


def compiler_seconds(optimal_seconds: float, hlo_text: str) -> float:
    """libtpu's own step-time estimate, decoded: its ``optimal_seconds`` is the estimate minus one
    second per ``ConcatBitcast`` custom call in the program (libtpu 0.0.42.1: in 7 compiles of the
    step the negative integer part was exactly minus that count; docs/records.md)."""
    return optimal_seconds + hlo_text.count('custom_call_target="ConcatBitcast"')


def cost(compiled) -> dict:
    """The compiler's cost analysis of a compiled program, per device: ``flops``, ``bytes`` (accessed)
    and ``compiler_seconds`` (None where libtpu gives no estimate). Like XLA's, it counts a loop's body once."""
    c = compiled.cost_analysis() or {}
    c = c[0] if isinstance(c, list | tuple) else c
    seconds = compiler_seconds(float(c["optimal_seconds"]), compiled.as_text()) if "optimal_seconds" in c else None
    return {"flops": float(c.get("flops", 0.0)), "bytes": float(c.get("bytes accessed", 0.0)),
            "compiler_seconds": seconds}


def with_model(config, **model):
    """A copy of ``config`` (pre-training's) with model fields replaced and no micro-batches."""
    c = config.copy_and_resolve_references()
    with c.unlocked():
        c.model.update(model)
    c.per_device_batch = 0
    return c


def compile_step(config, devices, batch_size: int, compile: bool = True) -> dict:
    """``config``'s training step for a global batch of ``batch_size`` on ``devices``: its memory per
    device and the compiler's cost (``compile=False``: only what needs no compile), the model FLOPs."""
    config = config.copy_and_resolve_references()
    config.batch_size = batch_size
    pretraining = not is_finetuning(config)
    if pretraining and config.unpad_multiple:
        raise ValueError("the AOT tool compiles padded batches (packed ones too): set --config.unpad_multiple=0")
    mesh = sh.config_mesh(config, devices)
    steps, cfg, shapes = trainer_steps.build(config, mesh)
    length = config.data.max_seq_length if pretraining else config.max_seq_length
    fraction = config.electra.generator_fraction if "electra" in config else None
    flops = model_flops(cfg, config.objective, batch_size, length, config.data.max_predictions_per_seq, None,
                        fraction) if pretraining else None
    out = {"batch_size": batch_size, "length": length, "mesh": dict(mesh.shape), "model_flops_per_step": flops,
           "accumulation_steps": steps.accumulation_steps, "layers": cfg.num_layers, "memory": None,
           "model": {"size": config.model.size, "dtype": cfg.dtype, "remat": cfg.remat_policy, "scan": cfg.scan_layers}}
    if not compile:
        return dict(out, compile_s=0.0, error="not compiled (--no_memory)")
    batch = {k: jax.ShapeDtypeStruct(s, d, sharding=steps.batch_sharding) for k, (s, d) in shapes.items()}
    rng = jax.eval_shape(lambda: jax.random.key(0, impl=config.rng_impl))
    start = time.perf_counter()
    try:
        compiled = steps.train_fn.lower(steps.layout.target(), batch, rng).compile()
    except jax.errors.JaxRuntimeError as e:  # the compiler's own verdict: it does not fit
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        return dict(out, compile_s=round(time.perf_counter() - start, 1), error=cli.message(e)[:300])
    return dict(out, compile_s=round(time.perf_counter() - start, 1), memory=trainer_steps.memory(compiled),
                cost=cost(compiled))


def report(r: dict, chip: Chip, devices: int) -> dict:
    """``r`` with its fit in a device's HBM and the step time at 100% and 50% MFU."""
    hbm, chips = chip.hbm_gib * 2**30 / chip.devices_per_chip, devices // chip.devices_per_chip
    r = dict(r, chip=chip.name, chips=chips, hbm_bytes=hbm, fits=bool(r["memory"]) and r["memory"]["total"] <= hbm)
    if r["model_flops_per_step"]:
        ideal = r["model_flops_per_step"] / (chips * chip.peak_bf16)
        r.update(step_s_at_100_mfu=ideal, step_s_at_50_mfu=2 * ideal,
                 sequences_per_s_at_50_mfu=r["batch_size"] / ideal / 2)
    return r


def roofline(c: dict, chip: Chip, compiler_s: float | None = None) -> dict:
    """Per-device step time of cost ``c``: the compiler's estimate when it gives one no faster than the
    FLOPs at peak, else max(FLOPs / peak, bytes / HBM bandwidth) on the device's share of the chip."""
    per = chip.devices_per_chip
    compute_s, memory_s = c["flops"] / (chip.peak_bf16 / per), c["bytes"] / (chip.hbm_bandwidth / per)
    out = {"compute_s": compute_s, "memory_s": memory_s, "bound": "compute" if compute_s >= memory_s else "memory"}
    if compiler_s is not None and compiler_s >= compute_s:
        return dict(out, step_s=compiler_s, source="compiler optimal_seconds, decoded")
    return dict(out, step_s=max(compute_s, memory_s), source="roofline of the compiler's cost analysis")


def update_cost(config, devices) -> dict:
    """The compiler's cost of the optimizer update alone (sharded as in the step)."""
    steps = trainer_steps.build(with_model(config), sh.config_mesh(config, devices))[0]
    layout, target = steps.layout, steps.layout.target()
    fn = jax.jit(trainer_steps.update_fn(steps), in_shardings=(layout.shardings, layout.shardings.params),
                 donate_argnums=0)
    return cost(fn.lower(target, target.params).compile())


def estimate(config, devices, chip: Chip, steps: int = 0, memory: bool = True) -> dict:
    """The step as configured (``memory``: compiled, else only described) and its estimated time."""
    r = report(compile_step(config, devices, config.batch_size, compile=memory), chip, len(devices))
    if memory and not r["fits"]:  # no time for a step that does not fit
        return dict(r, estimate=None)
    k, n = r["accumulation_steps"], r["layers"]
    if config.batch_size % k:
        raise ValueError(f"batch_size {config.batch_size} is not divisible by {k} micro-batches")
    one, two = (compile_step(with_model(config, num_layers=i, scan_layers="false"), devices, config.batch_size // k)
                for i in (1, 2))
    print(f"  compiled 1 and 2 unrolled layers at batch {config.batch_size // k} in {one['compile_s']} s, "
          f"{two['compile_s']} s", file=sys.stderr, flush=True)
    c = {key: one["cost"][key] + (n - 1) * (two["cost"][key] - one["cost"][key]) for key in ("flops", "bytes")}
    seconds = [x["cost"]["compiler_seconds"] or -1 for x in (one, two)]
    compiler_s = seconds[0] + (n - 1) * (seconds[1] - seconds[0]) if min(seconds) > 0 and k == 1 else None
    if k > 1:
        update = update_cost(config, devices)
        c = {key: k * (c[key] - update[key]) + update[key] for key in c}
    e = roofline(c, chip, compiler_s)
    b = config.batch_size
    e.update(sequences_per_s=b / e["step_s"], tokens_per_s=b * r["length"] / e["step_s"], flops_per_device=c["flops"],
             bytes_per_device=c["bytes"], layer_costs=[one["cost"], two["cost"]])
    if r["model_flops_per_step"]:
        e["mfu"] = r["model_flops_per_step"] / (e["step_s"] * r["chips"] * chip.peak_bf16)
    if steps:
        e.update(steps=steps, total_s=steps * e["step_s"])
    return dict(r, estimate=e)


def summary(r: dict) -> str:
    g, m, e = 2**30, r["memory"], r.get("estimate", False)
    line = (f"{r['chips']} x {r['chip']}, mesh {r['mesh']}, global batch {r['batch_size']} x {r['length']} "
            f"({r['model']['size']}, {r['model']['dtype']}, remat {r['model']['remat']}): ")
    if m is None:
        line += f"memory {r['error']}" if r["error"].startswith("not compiled") else f"DOES NOT FIT: {r['error']}"
    else:
        parts = ", ".join(f"{k} {v / g:.2f}" for k, v in m.items() if k != "total")
        line += (f"{m['total'] / g:.2f} of {r['hbm_bytes'] / g:.0f} GiB per device -> "
                 f"{'fits' if r['fits'] else 'DOES NOT FIT'} ({parts}); compiled in {r['compile_s']} s")
    if r.get("model_flops_per_step"):
        line += (f"\n  model FLOPs/step {r['model_flops_per_step'] / 1e12:.2f} T: "
                 f"{r['step_s_at_100_mfu'] * 1e3:.1f} ms at 100% MFU, {r['step_s_at_50_mfu'] * 1e3:.1f} ms and "
                 f"{r['sequences_per_s_at_50_mfu']:,.0f} sequences/s at 50% (arithmetic, not measured)")
    if e:
        line += (f"\n  ESTIMATE ({e['source']}): step {e['step_s'] * 1e3:.1f} ms ({e['bound']}-bound: compute "
                 f"{e['compute_s'] * 1e3:.1f} ms, HBM {e['memory_s'] * 1e3:.1f} ms), {e['sequences_per_s']:,.0f} "
                 f"sequences/s, {e['tokens_per_s']:,.0f} tokens/s"
                 + (f", MFU {100 * e['mfu']:.1f}%" if "mfu" in e else "")
                 + (f" (accumulation {r['accumulation_steps']})" if r["accumulation_steps"] > 1 else "")
                 + (f"; {e['steps']:,} steps: {e['total_s'] / 60:.1f} min" if "total_s" in e else ""))
    return line + ("\n  no time estimate: it does not fit" if e is None else "")


def xla_attention(q, k, v, mask, key, *, rate: float):
    """The encoder's explicit attention (`bert_jax.model.layers.explicit_attention`, dropout drawn with
    ``jax.random.bernoulli`` as on accelerators). q, k, v: [rows, T, heads, head_dim]; mask: int
    [rows, T], 1 = real token. Returns the context [rows, T, heads, head_dim]."""
    return explicit_attention(q, k, v, mask[:, None, None, :] > 0, Dropout(rate, "jax"), deterministic=not rate,
                              rngs=nnx.Rngs(dropout=key))[0]


def block_with_grads(graphdef, params, x, mask, key, g):
    """The encoder block forward in training mode (dropout from ``key``), then the backward from the
    cotangent g: (out, d params, d x). x, g: [rows, T, D]; mask: bool [rows, 1, 1, T]."""
    def forward(params, x):
        return nnx.merge(graphdef, params)(x, mask, deterministic=False, rngs=nnx.Rngs(dropout=key))[0]

    out, backward = jax.vjp(forward, params, x)
    return (out, *backward(g))


VARIANTS = ("xla", "xla_no_dropout")  # the attention subcommand's parts: with and without dropout
PARTS = {"projection": 4, "ffn": 2, "attention": 1, "block": 1}  # the layer subcommand's, with their count a layer


def compile_part(part: str, cfg, device, rows: int, length: int, rate: float) -> dict:
    """One part's forward and backward (from a given cotangent) compiled on ``device``, bfloat16: its cost."""

    def spec(shape, dtype=jnp.bfloat16):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=SingleDeviceSharding(device))

    x = spec((rows, length, cfg.hidden_size))
    if part in ("projection", "ffn"):  # [rows·T, D] x [D, n]: y, and the backward's dx, dw
        n = cfg.hidden_size if part == "projection" else cfg.intermediate_size

        def fn(x, w, g):
            y, backward = jax.vjp(lambda x, w: x @ w, x, w)
            return (y, *backward(g))

        return cost(jax.jit(fn).lower(spec((rows * length, cfg.hidden_size)), spec((cfg.hidden_size, n)),
                                      spec((rows * length, n))).compile())
    if part == "block":
        graphdef, params = nnx.split(nnx.eval_shape(lambda: TransformerBlock(cfg, rngs=nnx.Rngs(0))))
        params = jax.tree.map(lambda a: spec(a.shape, a.dtype), params)
        key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=SingleDeviceSharding(device))
        fn = jax.jit(functools.partial(block_with_grads, graphdef))
        return cost(fn.lower(params, x, spec((rows, 1, 1, length), jnp.bool_), key, x).compile())
    def loss(q, k, v, mask, key):  # the attention core: "xla" and "attention" with the dropout, "xla_no_dropout"
        key = jax.random.wrap_key_data(key)
        out = xla_attention(q, k, v, mask, key, rate=0.0 if part == "xla_no_dropout" else rate)
        return (out.astype(jnp.float32) ** 2).mean()

    qkv = spec((rows, length, cfg.num_heads, cfg.head_dim))
    return cost(jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).lower(
        qkv, qkv, qkv, spec((rows, length), jnp.int32), spec((2,), jnp.uint32)).compile())


def parts_of(args, chip: Chip, devices) -> list[dict]:
    """The attention or layer subcommand: each part compiled on one device of the topology."""
    cfg = BertConfig.from_size(args.size, dtype="bfloat16")  # a block's parts do not depend on the layers
    rate = args.attention_dropout if args.command == "attention" else cfg.attention_dropout_prob
    peak, rows = chip.peak_bf16 / chip.devices_per_chip, []  # one device's share of the chip
    for part in args.chosen:
        r = compile_part(part, cfg, devices[0], args.rows, args.seq_len, rate)
        ms = r["compiler_seconds"] and round(r["compiler_seconds"] * 1e3, 4)
        r.update(part=part, topology=args.topology, size=args.size, rows=args.rows, seq_len=args.seq_len,
                 compiler_ms=ms)
        if args.command == "attention":
            r.update(attention_dropout=0.0 if part == "xla_no_dropout" else rate,
                     step_share_ms=ms and round(ms * cfg.num_layers, 2))
            print(f"{part:15s} {ms} ms per layer (x {cfg.num_layers} layers: {r['step_share_ms']} ms), "
                  f"{r['flops'] / 1e9:.2f} GFLOP, {r['bytes'] / 1e6:.0f} MB", flush=True)
        else:
            r.update(per_layer=PARTS[part], peak_fraction=ms and round(r["flops"] / (ms * 1e-3 * peak), 3))
            print(f"{part:11s} {ms} ms (x {PARTS[part]} a layer), {r['flops'] / 1e9:.1f} GFLOP, {r['bytes'] / 1e6:.0f} "
                  f"MB, {r['peak_fraction'] or 0:.0%} of the peak", flush=True)
        rows.append(r)
    by = {r["part"]: r for r in rows}
    if args.command == "layer" and all(by.get(p, {}).get("compiler_ms") for p in PARTS):
        parts_ms = sum(by[p]["compiler_ms"] * n for p, n in PARTS.items() if p != "block")
        by["block"]["rest_ms"] = round(by["block"]["compiler_ms"] - parts_ms, 4)
        print(f"block less its parts: {by['block']['rest_ms']} ms of {by['block']['compiler_ms']}", flush=True)
    return rows


def parse_args(argv=None):
    """(the subcommand's arguments, its ``--config.x=y`` overrides)."""
    p = cli.ArgumentParser(prog="python -m bert_jax.benchmark.aot", description=__doc__.split("\n\n")[1],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="{compile,estimate,attention,layer}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--topology", required=True, help="e.g. v5e-256, v4-32, v5p-8, or v5e:16x16")
    common.add_argument("--output", default="", help="append each result as a JSON line to this file")
    for name, what in (("compile", "memory per device and FLOPs of the step"), ("estimate", "its time and MFU")):
        s = sub.add_parser(name, parents=[common], help=what)
        s.add_argument("--config", required=True, help="configs/<job>.py[:<args>], then --config.x=y overrides")
    sub.choices["compile"].add_argument("--find_max_batch", action="store_true", help="the largest batch that fits")
    sub.choices["estimate"].add_argument("--steps", type=int, default=0, help="also the time of this many steps")
    sub.choices["estimate"].add_argument("--no_memory", action="store_true", help="skip compiling the step itself")
    for name, what, choices in (("attention", "variants", VARIANTS), ("layer", "parts", tuple(PARTS))):
        s = sub.add_parser(name, parents=[common], help=f"the cost of each of attention's {what} / a layer's parts")
        s.add_argument("--size", default="large", help="the BERT size: its heads, widths and layers")
        s.add_argument("--rows", type=int, default=64, help="rows per chip (phase 1 at batch 256 on 4 chips: 64)")
        s.add_argument("--seq_len", type=int, default=128)
        s.add_argument(f"--{what}", default=",".join(choices), help=f"comma-separated, of {', '.join(choices)}")
    sub.choices["attention"].add_argument("--attention_dropout", type=float, default=0.1, help="the xla variant's")
    args, rest = p.parse_known_args(argv)
    if [a for a in rest if not a.startswith("--config.")] or (rest and "config" not in args):
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "estimate" and args.steps < 0:
        p.error(f"--steps {args.steps}: expected a number of steps >= 0")
    if args.command in ("attention", "layer"):
        what, choices = ("variants", VARIANTS) if args.command == "attention" else ("parts", tuple(PARTS))
        args.chosen = [v for v in getattr(args, what).split(",") if v]
        if bad := [v for v in args.chosen if v not in choices]:
            p.error(f"--{what}: unknown {', '.join(bad)}; expected some of {', '.join(choices)}")
        if args.rows < 1 or args.seq_len < 1:
            p.error(f"--rows {args.rows} --seq_len {args.seq_len}: expected positive numbers")
        if not 0.0 <= getattr(args, "attention_dropout", 0.0) < 1.0:
            p.error(f"--attention_dropout {args.attention_dropout}: expected a rate in [0, 1)")
        try:
            BertConfig.from_size(args.size)
        except (KeyError, ValueError) as e:
            p.error(f"--size {args.size!r}: {cli.message(e)}")
    return args, rest


def main(argv=None) -> list[dict]:
    args, overrides = parse_args(argv)
    config = load_config(args.config, overrides) if "config" in args else None
    if args.command == "estimate" and is_finetuning(config):
        raise ValueError(f"--config {args.config}: the estimate is for pre-training configs (configs/pretrain.py)")
    chip, name, devices = tpu_devices(args.topology)
    if args.command in ("attention", "layer"):
        results = parts_of(args, chip, devices)
    elif args.command == "estimate":
        results = [estimate(config, devices, chip, args.steps, memory=not args.no_memory)]
    elif args.find_max_batch:
        shards = sh.batch_shards(sh.config_mesh(config, devices), config_rules(config))
        hbm, found = chip.hbm_gib * 2**30 / chip.devices_per_chip, {}

        def mem(units: int) -> float:  # a step that does not compile (out of memory): infinite
            found[units] = r = compile_step(config, devices, units * shards)
            total = r["memory"]["total"] if r["memory"] else math.inf
            print(f"  batch {units * shards}: {total / 2**30:.2f} GiB per device", file=sys.stderr, flush=True)
            return total

        best = trainer_steps.largest_fitting(mem, hbm)
        results = [report(found[best], chip, len(devices))] if best else []
        if not best:
            print(f"no batch (a multiple of {shards}) fits in {hbm / 2**30:.0f} GiB", flush=True)
    else:
        results = [report(compile_step(config, devices, config.batch_size), chip, len(devices))]
    for r in results:
        if args.command in ("compile", "estimate"):
            r.update(topology=args.topology, topology_name=name, config=args.config, overrides=overrides)
            print(summary(r), flush=True)
        if args.output:
            with open(args.output, "a") as f:
                f.write(json.dumps(r) + "\n")
    return results


if __name__ == "__main__":
    cli.run(main)
