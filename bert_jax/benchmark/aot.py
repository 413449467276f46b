r"""Ahead-of-time compilation for real TPU topologies on a machine without a TPU.

    python -m bert_jax.benchmark.aot --config configs/pretrain.py:size=large,phase=2 --topology v5e-256 \
        [--config.mesh_shape='(1,-1,1)'] [--config.batch_size=512] [--config.model.dtype=bfloat16] \
        [--find_max_batch] [--output aot.jsonl]
    python -m bert_jax.benchmark.aot --config configs/squad.py:version=1.1 --topology v5e-1 \
        --config.batch_size=32 --config.max_seq_length=384 --config.model.size=large

It builds the step ``train.py`` would run for that config (pre-training: `trainer.build_steps`;
fine-tuning: `finetuning.trainer.build_steps`; same sharding rules, optimizer-state shardings and
batch shapes), lowers it for the topology's devices (`jax.experimental.topologies`, the real TPU
compiler in ``libtpu``) and compiles it. Reported per device (a chip; a TensorCore on v3): the
compiler's memory (arguments, outputs, temporaries, generated code; the donated state counted once)
against the device's HBM; and
the model FLOPs of a step with the step time they would take at 100% and at 50% MFU. These times are
arithmetic on published peaks, not measurements; the compiler's own estimate is in ``cost``
(``compiler_seconds``: libtpu's ``optimal_seconds`` decoded, `compiler_seconds`; like its FLOPs it
counts a scanned layer stack once, so `bert_jax.benchmark.aot_estimate` extrapolates it).
``--find_max_batch`` searches the largest global batch whose compiled memory fits.

Needs ``libtpu``: ``pip install -e '.[tpu]'`` (the ``jax[tpu]`` of the installed jax version).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import sys
import time

from bert_jax.benchmark.tpu_topology import CHIPS, Chip, topology_name, tpu_devices  # noqa: F401 (aot.CHIPS ...)
from bert_jax.resolve import resolve
from input_pipeline import command_line as cli


def load_config(spec: str, overrides: list[str]):
    """``configs/x.py[:arg]`` and ``--config.a.b=value`` overrides (Python literals, else strings)."""
    path, _, arg = spec.partition(":")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--config {path}: no such config file (expected configs/<job>.py[:<args>])")
    module_spec = importlib.util.spec_from_file_location("aot_config", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    config = module.get_config(arg or None)
    for item in overrides:
        key, eq, text = item.removeprefix("--config.").partition("=")
        if not eq:
            raise ValueError(f"{item}: expected --config.<key>=<value>")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        *parents, last = key.split(".")
        node = config
        for p in parents:
            node = node[p] if p in node else None
            if node is None:
                raise ValueError(f"--config.{key}: the config has no key {p!r}")
        if last not in node:
            raise ValueError(f"--config.{key}: the config has no key {last!r}")
        node[last] = tuple(value) if isinstance(node[last], tuple) and isinstance(value, list) else value
    return resolve(config, "tpu")  # "auto" means the platform that runs it: the TPU, not this host's CPU


CHARGED_CUSTOM_CALL = 'custom_call_target="ConcatBitcast"'


def compiler_seconds(optimal_seconds: float, hlo_text: str) -> float:
    """libtpu's own step-time estimate, decoded: its ``optimal_seconds`` is the estimate minus one
    second per ``ConcatBitcast`` custom call in the compiled program (a cost it does not model,
    counted as -1 s). Found on libtpu 0.0.42.1 (2026-11-26): in 7 compiles of the pre-training step
    (tiny and mini; v5e-1, v5e-8 data- and fsdp-parallel, v4-8; scanned and unrolled; with and
    without dropout) the negative integer part was exactly minus that count (-14.99 with 15, -31.99
    with 32, -10.998 with 11, ...), and programs without the call give a positive value as is. Like
    the FLOPs, it counts a loop's body once (docs/records.md)."""
    return optimal_seconds + hlo_text.count(CHARGED_CUSTOM_CALL)


def compiled_cost(compiled) -> dict:
    """A compiled program's decoded estimate (``compiler_ms``, None where libtpu gives none), FLOPs
    and bytes from the cost analysis."""
    cost = compiled.cost_analysis() or {}
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    seconds = (compiler_seconds(float(cost["optimal_seconds"]), compiled.as_text())
               if "optimal_seconds" in cost else None)
    return {"compiler_ms": None if seconds is None else round(seconds * 1e3, 4),
            "flops": float(cost.get("flops", 0.0)), "bytes": float(cost.get("bytes accessed", 0.0))}


def compile_step(config, devices, batch_size: int) -> dict:
    """Compiles ``config``'s training step for ``batch_size`` on ``devices``; its memory, FLOPs and the
    compiler's cost analysis per device (``cost``: flops, bytes accessed, optimal_seconds, compiler_seconds)."""
    import jax

    from bert_jax.benchmark.flops import model_flops
    from bert_jax.training import sharding as sh

    config = config.copy_and_resolve_references()
    config.batch_size = batch_size
    mesh = sh.make_mesh(tuple(config.mesh_shape), devices)
    if "task" in config:
        from bert_jax.finetuning import trainer as ft
        from input_pipeline.tasks import make_task
        from input_pipeline.tasks.base import feature_shapes

        # Only the task's kind and labels are needed: no data is read ("tfds" reads nothing until asked).
        task = make_task({**config.task.to_dict(), "source": config.task.get("source") or "tfds"})
        cfg = ft.model_config(config, None, config.model.get("vocab_size") or 30522, task.kind)
        steps = ft.build_steps(config, cfg, task.kind, task.num_labels, 1000, mesh)
        shapes = feature_shapes(task.kind, batch_size, config.max_seq_length)
        shapes["weight"] = ((batch_size,), "float32")
        length, predictions = config.max_seq_length, 0
    else:
        from bert_jax.training import trainer
        from input_pipeline.pretraining.batch import shapes as batch_shapes

        if config.data.pack_examples or config.unpad_multiple:
            raise ValueError("the AOT tool compiles padded, unpacked batches: set --config.data.pack_examples=0 "
                             "--config.unpad_multiple=0")
        cfg = trainer.model_config(config, config.model.get("vocab_size") or 30522)
        steps = trainer.build_steps(config, cfg, mesh)
        length, predictions = config.data.max_seq_length, config.data.max_predictions_per_seq
        shapes = batch_shapes(batch_size, length, predictions)
    batch = {k: jax.ShapeDtypeStruct(s, d, sharding=steps.batch_sharding) for k, (s, d) in shapes.items()}
    rng = jax.eval_shape(lambda: jax.random.key(0, impl=config.rng_impl))
    start = time.perf_counter()
    fraction = config.electra.generator_fraction if "electra" in config else None
    flops = model_flops(cfg, config.objective, batch_size, length, predictions, None, fraction) if predictions else None
    out = {"batch_size": batch_size, "mesh": dict(mesh.shape), "model_flops_per_step": flops, "length": length,
           "model": {"size": config.model.size, "dtype": cfg.dtype, "remat": cfg.remat_policy, "scan": cfg.scan_layers}}
    try:
        compiled = steps.train_fn.lower(steps.layout.target(), batch, rng).compile()
    except jax.errors.JaxRuntimeError as e:  # the compiler's own verdict: it does not fit
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        return dict(out, compile_s=round(time.perf_counter() - start, 1), memory_bytes=None, total_bytes=None,
                    compiler_error=cli.message(e).split("\n")[0][:300])
    m = compiled.memory_analysis()
    cost = compiled.cost_analysis() or {}
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    out["cost"] = {k: float(cost[k]) for k in ("flops", "bytes accessed", "transcendentals", "optimal_seconds")
                   if k in cost}
    if "optimal_seconds" in cost:
        out["cost"]["compiler_seconds"] = compiler_seconds(float(cost["optimal_seconds"]), compiled.as_text())
    parts = {"arguments": m.argument_size_in_bytes, "outputs": m.output_size_in_bytes,
             "aliased": m.alias_size_in_bytes, "temporaries": m.temp_size_in_bytes,
             "generated_code": m.generated_code_size_in_bytes}
    total = parts["arguments"] + parts["outputs"] - parts["aliased"] + parts["temporaries"] + parts["generated_code"]
    return dict(out, compile_s=round(time.perf_counter() - start, 1), memory_bytes=parts, total_bytes=total)


def fits(r: dict, hbm: float) -> bool:
    return r["total_bytes"] is not None and r["total_bytes"] <= hbm


def report(r: dict, chip: Chip, devices: int) -> dict:
    """Adds the fit against a device's HBM and the step time at 100% / 50% MFU."""
    hbm, chips = chip.hbm_gib * 2**30 / chip.devices_per_chip, devices // chip.devices_per_chip
    r = dict(r, chip=chip.name, chips=chips, hbm_bytes=hbm, fits=fits(r, hbm))
    if r["model_flops_per_step"]:
        ideal = r["model_flops_per_step"] / (chips * chip.peak_bf16)
        r.update(step_s_at_100_mfu=ideal, step_s_at_50_mfu=2 * ideal,
                 sequences_per_s_at_50_mfu=r["batch_size"] / (2 * ideal))
    return r


def find_max_batch(config, devices, multiple: int, start: int, hbm: float) -> dict | None:
    """The largest multiple of ``multiple`` whose step fits in ``hbm`` bytes (doubling from ``start``,
    then bisection)."""
    best, last = None, None
    size = max(multiple, start - start % multiple)
    while True:
        r = compile_step(config, devices, size)
        print(f"  batch {size}: {_gib(r)} per device", file=sys.stderr, flush=True)
        if not fits(r, hbm):
            last = size
            break
        best, size = r, size * 2
    low, high = (best["batch_size"] if best else 0), last
    while high - low > multiple:
        mid = (low + high) // 2 // multiple * multiple
        r = compile_step(config, devices, mid)
        print(f"  batch {mid}: {_gib(r)} per device", file=sys.stderr, flush=True)
        if fits(r, hbm):
            best, low = r, mid
        else:
            high = mid
    return best


def _gib(r: dict) -> str:
    return f"{r['total_bytes'] / 2**30:.2f} GiB" if r["total_bytes"] is not None else "out of memory"


def summary(r: dict) -> str:
    g = 2**30
    m = r["memory_bytes"]
    if m is None:
        return (f"{r['chips']} x {r['chip']}, mesh {r['mesh']}, global batch {r['batch_size']} x {r['length']} "
                f"({r['model']['size']}, {r['model']['dtype']}, remat {r['model']['remat']}): DOES NOT FIT: "
                f"{r['compiler_error']}")
    line = (f"{r['chips']} x {r['chip']}, mesh {r['mesh']}, global batch {r['batch_size']} x {r['length']} "
            f"({r['model']['size']}, {r['model']['dtype']}, remat {r['model']['remat']}): "
            f"{r['total_bytes'] / g:.2f} of {r['hbm_bytes'] / g:.0f} GiB per device -> "
            f"{'fits' if r['fits'] else 'DOES NOT FIT'} (arguments {m['arguments'] / g:.2f}, outputs "
            f"{m['outputs'] / g:.2f}, aliased {m['aliased'] / g:.2f}, temporaries {m['temporaries'] / g:.2f}, "
            f"code {m['generated_code'] / g:.2f}); compiled in {r['compile_s']} s")
    if r.get("model_flops_per_step"):
        line += (f"\n  model FLOPs/step {r['model_flops_per_step'] / 1e12:.2f} T: "
                 f"{r['step_s_at_100_mfu'] * 1e3:.1f} ms at 100% MFU, {r['step_s_at_50_mfu'] * 1e3:.1f} ms and "
                 f"{r['sequences_per_s_at_50_mfu']:,.0f} sequences/s at 50% (arithmetic, not measured)")
    return line


def main(argv=None) -> list[dict]:
    p = cli.ArgumentParser(prog="python -m bert_jax.benchmark.aot", description=__doc__.split("\n\n")[1],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="configs/<job>.py[:<args>]")
    p.add_argument("--topology", required=True, help="e.g. v5e-256, v4-32, v5p-8, or v5e:16x16")
    p.add_argument("--find_max_batch", action="store_true", help="search the largest global batch that fits")
    p.add_argument("--output", default="", help="append each result as a JSON line to this file")
    args, rest = p.parse_known_args(argv)
    unknown = [a for a in rest if not a.startswith("--config.")]
    if unknown:
        p.error(f"unrecognized arguments: {' '.join(unknown)}")
    config = load_config(args.config, rest)
    chip, name, devices = tpu_devices(args.topology)
    if args.find_max_batch:
        import numpy as np

        from bert_jax.training import sharding as sh

        mesh = sh.make_mesh(tuple(config.mesh_shape), devices)
        shards = int(np.prod([mesh.shape[a] for a in ("data", "fsdp")]))
        found = find_max_batch(config, devices, shards, config.batch_size, chip.hbm_gib * 2**30 / chip.devices_per_chip)
        results = [report(found, chip, len(devices))] if found else []
        if not found:
            print(f"no batch (a multiple of {shards}) fits in {chip.hbm_gib / chip.devices_per_chip} GiB", flush=True)
    else:
        results = [report(compile_step(config, devices, config.batch_size), chip, len(devices))]
    for r in results:
        r.update(topology=args.topology, topology_name=name, config=args.config, overrides=rest)
        print(summary(r), flush=True)
        if args.output:
            with open(args.output, "a") as f:
                f.write(json.dumps(r) + "\n")
    return results


if __name__ == "__main__":
    cli.run(main)
