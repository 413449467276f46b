r"""Estimated step time, tokens/s and MFU of the training step on a TPU topology, from the TPU
compiler's own cost analysis (no TPU needed; needs ``libtpu``, like `bert_jax.benchmark.aot`).

    python -m bert_jax.benchmark.aot_estimate --config configs/pretrain.py:size=large --topology v4-128 \
        --config.model.dtype=bfloat16 [--config.batch_size=4096] [--config.per_device_batch=16] \
        [--steps 8599] [--output estimates.jsonl]

What it compiles, for the config's step exactly as ``train.py`` builds it (`aot.compile_step`):

1. the step as configured (layers scanned): the per-device memory and whether it fits;
2. the step with 1 and with 2 unrolled layers, accumulation 1, at the micro-batch (the batch
   over the micro-batches ``per_device_batch`` gives): XLA's cost analysis counts the body of a
   loop once, so a scanned stack (or the accumulation scan) would be counted as one layer (one micro-batch). Per-device
   FLOPs and HBM bytes are extrapolated linearly to L layers: ``c(L) = c(1) + (L - 1) (c(2) - c(1))``;
3. the optimizer update alone on the full parameter tree (no loop in it, so counted exactly), so that
   an accumulated step is ``k · (micro-step − update) + update``.

The estimate is a roofline per device: ``max(FLOPs / peak, bytes / HBM bandwidth)`` with the
published per-chip peaks (`aot.CHIPS`, halved per device on v3), unless the compiler's own estimate
is there: libtpu 0.0.42.1's ``optimal_seconds``, decoded (`aot.compiler_seconds`: it subtracts one
second per ``ConcatBitcast`` custom call), extrapolated from the 1- and 2-layer compiles, and no
faster than the FLOPs at peak (``source`` says which). The
scanned step's own counts the loop body once (BERT-large on v3-2048: 54 ms, below the 130 ms the
FLOPs need at peak), so it never is. Not in the roofline: the time of collectives over the
inter-chip links (the data-parallel gradient all-reduce; XLA overlaps it with the backward pass),
per-op overheads and the input pipeline. It is an estimate, not a measurement: a lower bound on the
step time of the compiled program. MFU = the model FLOPs (`bert_jax.benchmark.flops`) / (step time ×
chips × peak).
"""

from __future__ import annotations

import argparse
import json
import sys

from bert_jax.benchmark import aot
from input_pipeline import command_line as cli

COST_KEYS = ("flops", "bytes accessed")


def extrapolate(one: dict, two: dict, layers: int, keys=COST_KEYS) -> dict:
    """Cost of ``layers`` layers from the costs of 1 and 2 (linear in the layers)."""
    return {k: one[k] + (layers - 1) * (two[k] - one[k]) for k in keys}


def optimal_seconds(one: dict, two: dict, layers: int) -> float | None:
    """The compiler's own estimate (``compiler_seconds``: `aot.compiler_seconds`, libtpu's
    ``optimal_seconds`` decoded) extrapolated like the costs, when both compiles give a positive
    one; never the scanned step's own, which counts the loop body once."""
    if min(one.get("compiler_seconds", -1), two.get("compiler_seconds", -1)) <= 0:
        return None
    return extrapolate(one, two, layers, ("compiler_seconds",))["compiler_seconds"]


def accumulated(micro: dict, update: dict, steps: int) -> dict:
    """An optimizer step of ``steps`` micro-batches: the micro-step without its update, ``steps`` times,
    then one update."""
    return {k: steps * (micro[k] - update[k]) + update[k] for k in COST_KEYS}


def roofline(cost: dict, chip: aot.Chip, optimal_seconds: float | None = None) -> dict:
    """Per-device step time: the compiler's ``optimal_seconds`` when it gives one no faster than the
    FLOPs at peak, else max(FLOPs / peak, bytes / HBM bandwidth) on the device's share of the chip."""
    per = chip.devices_per_chip
    compute_s = cost["flops"] / (chip.peak_bf16 / per)
    memory_s = cost["bytes accessed"] / (chip.hbm_bandwidth / per)
    out = {"compute_s": compute_s, "memory_s": memory_s, "bound": "compute" if compute_s >= memory_s else "memory"}
    if optimal_seconds is not None and optimal_seconds >= compute_s:  # below the FLOPs' floor: not an estimate
        return dict(out, step_s=optimal_seconds, source="compiler optimal_seconds, decoded")
    return dict(out, step_s=max(compute_s, memory_s), source="roofline of the compiler's cost analysis")


def throughput(step_s: float, batch_size: int, length: int, model_flops: float | None, chip: aot.Chip,
               chips: int) -> dict:
    out = {"sequences_per_s": batch_size / step_s, "tokens_per_s": batch_size * length / step_s}
    if model_flops:
        out["mfu"] = model_flops / (step_s * chips * chip.peak_bf16)
    return out


def _with(config, **model):
    """``config`` with model fields replaced and no accumulation."""
    c = config.copy_and_resolve_references()
    with c.unlocked():
        for k, v in model.items():  # scan_layers is a string in the configs ("auto" | "true" | "false")
            c.model[k] = str(v).lower() if isinstance(v, bool) and isinstance(c.model.get(k), str) else v
        if "per_device_batch" in c:  # the whole (micro-)batch at once
            del c["per_device_batch"]
            c.per_device_batch = 0
    return c


def _progress(what: str, r: dict) -> None:
    print(f"  compiled {what} in {r['compile_s']} s", file=sys.stderr, flush=True)


def accumulation_steps(config, devices) -> int:
    """Micro-batches per optimizer step, as the trainer chooses them (``per_device_batch``)."""
    from bert_jax.training import sharding as sh
    from bert_jax.training import trainer

    rules = tuple(tuple(r) for r in config.sharding_rules)
    return trainer.accumulation_steps(config, sh.make_mesh(tuple(config.mesh_shape), devices), rules)


def update_cost(config, devices) -> dict:
    """The compiler's cost of the optimizer update alone (parameters, gradients and optimizer state
    sharded as in the step)."""
    import functools

    import jax

    from bert_jax.training import sharding as sh
    from bert_jax.training import train_step as ts
    from bert_jax.training import trainer
    from bert_jax.training.optim import make_optimizer

    config = _with(config)
    cfg = trainer.model_config(config, config.model.get("vocab_size") or 30522)
    steps = trainer.build_steps(config, cfg, sh.make_mesh(tuple(config.mesh_shape), devices))
    tx, schedule = make_optimizer(config.optimizer.to_dict())
    fn = jax.jit(functools.partial(ts.apply_gradients, tx=tx, schedule=schedule, metrics={}),
                 in_shardings=(steps.layout.shardings, steps.layout.shardings.params), donate_argnums=0)
    target = steps.layout.target()
    cost = fn.lower(target, target.params).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    return {k: float(cost[k]) for k in COST_KEYS}


def estimate(config, devices, chip: aot.Chip, steps: int | None = None, memory: bool = True) -> dict:
    """Memory of the configured step (``memory``: compiled as configured), and its estimated time,
    tokens/s and MFU (module docstring)."""
    from bert_jax.benchmark.flops import model_flops
    from bert_jax.training import trainer

    batch, k = config.batch_size, accumulation_steps(config, devices)
    if batch % k:
        raise ValueError(f"batch_size {batch} is not divisible by {k} micro-batches")
    cfg = trainer.model_config(config, config.model.get("vocab_size") or 30522)
    length, predictions = config.data.max_seq_length, config.data.max_predictions_per_seq
    if memory:
        full = aot.compile_step(config, devices, batch)
        _progress(f"the step ({cfg.num_layers} layers, batch {batch})", full)
    else:
        full = {"batch_size": batch, "length": length, "compile_s": 0.0, "memory_bytes": None, "total_bytes": None,
                "model_flops_per_step": model_flops(cfg, config.objective, batch, length, predictions),
                "model": {"size": config.model.size, "dtype": cfg.dtype, "remat": cfg.remat_policy,
                          "scan": cfg.scan_layers}, "compiler_error": "not compiled (--no_memory)"}
    full = aot.report(full, chip, len(devices))
    if memory and not full["fits"]:  # no time for a step that does not fit
        return dict(full, estimate=None, accumulation_steps=k)
    micro = batch // k
    one = aot.compile_step(_with(config, num_layers=1, scan_layers=False), devices, micro)
    _progress(f"1 unrolled layer, batch {micro}", one)
    two = aot.compile_step(_with(config, num_layers=2, scan_layers=False), devices, micro)
    _progress(f"2 unrolled layers, batch {micro}", two)
    full.setdefault("mesh", one["mesh"])
    cost = extrapolate(one["cost"], two["cost"], cfg.num_layers)
    total = accumulated(cost, update_cost(config, devices), k) if k > 1 else cost
    chips = len(devices) // chip.devices_per_chip
    compiler = optimal_seconds(one["cost"], two["cost"], cfg.num_layers) if k == 1 else None
    time = roofline(total, chip, compiler)
    est = dict(time, **throughput(time["step_s"], batch, length, full["model_flops_per_step"], chip, chips),
               flops_per_device=total["flops"], bytes_per_device=total["bytes accessed"],
               accumulation_steps=k, layers=cfg.num_layers, layer_costs=[one["cost"], two["cost"]],
               compile_s=round(full["compile_s"] + one["compile_s"] + two["compile_s"], 1))
    if steps:
        est.update(steps=steps, total_s=steps * time["step_s"])
    return dict(full, estimate=est)


def summary(r: dict) -> str:
    e = r["estimate"]
    if e is None:
        return aot.summary(r) + f"\n  (accumulation {r['accumulation_steps']}; no time estimate: it does not fit)"
    if r["memory_bytes"] is None and r.get("compiler_error", "").startswith("not compiled"):  # --no_memory
        line = (f"{r['chips']} x {r['chip']}, mesh {r['mesh']}, global batch {r['batch_size']} x {r['length']} "
                f"({r['model']['size']}, {r['model']['dtype']}, remat {r['model']['remat']}): memory not compiled")
    else:
        line = aot.summary(r)
    line += (f"\n  ESTIMATE ({e['source']}): step {e['step_s'] * 1e3:.1f} ms ({e['bound']}-bound: compute "
             f"{e['compute_s'] * 1e3:.1f} ms, HBM {e['memory_s'] * 1e3:.1f} ms), {e['sequences_per_s']:,.0f} "
             f"sequences/s, {e['tokens_per_s']:,.0f} tokens/s")
    if "mfu" in e:
        line += f", MFU {100 * e['mfu']:.1f}%"
    if e["accumulation_steps"] > 1:
        line += f" (accumulation {e['accumulation_steps']})"
    if "total_s" in e:
        line += f"; {e['steps']:,} steps: {e['total_s'] / 60:.1f} min"
    return line


def main(argv=None) -> list[dict]:
    p = cli.ArgumentParser(prog="python -m bert_jax.benchmark.aot_estimate",
                           description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="configs/pretrain.py[:<args>]")
    p.add_argument("--topology", required=True, help="e.g. v4-128, v5e-256, v5p-256, v3-2048 or v5e:16x16")
    p.add_argument("--steps", type=int, default=0, help="also the estimated time of this many steps")
    p.add_argument("--no_memory", action="store_true",
                   help="skip compiling the step as configured (its memory); estimate the time only")
    p.add_argument("--output", default="", help="append the result as a JSON line to this file")
    args, rest = p.parse_known_args(argv)
    unknown = [a for a in rest if not a.startswith("--config.")]
    if unknown:
        p.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.steps < 0:
        p.error(f"--steps {args.steps}: expected a number of steps >= 0")
    config = aot.load_config(args.config, rest)
    if "task" in config:
        p.error(f"--config {args.config}: the estimate is for pre-training configs (configs/pretrain.py)")
    chip, name, devices = aot.tpu_devices(args.topology)
    r = estimate(config, devices, chip, args.steps or None, memory=not args.no_memory)
    r.update(topology=args.topology, topology_name=name, config=args.config, overrides=rest)
    print(summary(r), flush=True)
    if args.output:
        with open(args.output, "a") as f:
            f.write(json.dumps(r) + "\n")
    return [r]


if __name__ == "__main__":
    cli.run(main)
