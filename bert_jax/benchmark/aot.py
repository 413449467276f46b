r"""``python -m bert_jax.benchmark.aot``: the training step compiled ahead of time for a real TPU topology
or one NVIDIA GPU on any machine, and what the compiler (``libtpu``: ``pip install -e '.[tpu]'``; XLA's
GPU compiler: ``pip install -e '.[gpu-aot]'``) says of it: one tool over one table of chips (`CHIPS`)
and one reader of the compiler's costs (`cost`).

    python -m bert_jax.benchmark.aot compile --config configs/pretrain.py:size=large,phase=2 --topology v5e-256 \
        [--config.batch_size=512] [--config.model.dtype=bfloat16] [--find_max_batch] [--output aot.jsonl]
    python -m bert_jax.benchmark.aot estimate --config configs/pretrain.py:size=large --topology v4-128 \
        [--config.x=y ...] [--steps 8599] [--no_memory]
    python -m bert_jax.benchmark.aot estimate --config configs/pretrain.py:synthetic,size=base --topology h100

``compile``: the step ``train.py`` would run for the config ("auto" meaning the target's): memory per
device against HBM (a GPU: the share of it JAX takes), model FLOPs at 100% and 50% MFU. ``estimate``
(pre-training) on a TPU: the compiler counts a loop's body once (the scanned layers, the micro-batch
scan), so the step is also compiled with 1 and 2 unrolled layers at the micro-batch, extrapolated to L
layers; an accumulated step is k · (micro-step − update) + update; the time is libtpu's own estimate
(`compiler_seconds`) where it is no faster than the FLOPs at peak, else the roofline max(FLOPs / peak,
bytes / HBM bandwidth) per device: a lower bound without collectives, per-op overheads or the input. On
a GPU (``h100``, ``h200``: one card) the compiler gives no cost, so ``estimate`` reads the compiled
program's kernels (`bert_jax.benchmark.roofline`): each at least max(bytes / bandwidth, FLOPs / peak), a
table by the rows of the measured profile.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import sys
import time

import jax
from absl import flags
from ml_collections import config_flags

from bert_jax.benchmark import roofline as kernel_roofline
from bert_jax.benchmark import trainer_steps
from bert_jax.benchmark.flops import model_flops
from bert_jax.config_args import check_command_line, is_finetuning
from bert_jax.resolve import resolve
from bert_jax.training import compiler_options
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
    platform: str = "tpu"  # "gpu": one card, compiled by XLA's GPU compiler without the card (`gpu_devices`)
    cores: int = 0  # a GPU's streaming multiprocessors (its compiler's target description)

    @property
    def devices_per_chip(self) -> int:
        return 1 if self.megacore else self.cores_per_chip

    def device_bytes(self) -> float:
        """A device's memory for the step; a GPU's: JAX's share (``XLA_PYTHON_CLIENT_MEM_FRACTION``, 0.75)."""
        share = float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", 0.75)) if self.platform == "gpu" else 1.0
        return share * self.hbm_gib * 2**30 / self.devices_per_chip


# cloud.google.com/tpu/docs/{v3,v4,v5e,v5p,v6e}, "key specifications".
CHIPS = {
    "v3": Chip("TPU v3", 32, 123e12, 2, 2, 900e9, megacore=False),
    "v4": Chip("TPU v4", 32, 275e12, 2, 3, 1200e9),
    "v5e": Chip("TPU v5e", 16, 197e12, 1, 2, 819e9),
    "v5p": Chip("TPU v5p", 95, 459e12, 2, 3, 2765e9),
    "v6e": Chip("TPU v6e", 32, 918e12, 1, 2, 1638e9),
    # nvidia.com H100 and H200 datasheets (SXM): dense bf16 989 TFLOP/s, HBM3 3.35 TB/s, HBM3e 4.8 TB/s;
    # memory as nvidia-smi gives it (81,559 and 143,771 MiB). JAX takes 75% of it unless told otherwise.
    "h100": Chip("NVIDIA H100 80GB HBM3", 79.6, 989e12, 1, 0, 3.35e12, platform="gpu", cores=132),
    "h200": Chip("NVIDIA H200", 140.4, 989e12, 1, 0, 4.8e12, platform="gpu", cores=132),
}
GPU_TARGET = """gpu_device_info {{ threads_per_block_limit: 1024 threads_per_warp: 32 l2_cache_size: 52428800
  shared_memory_per_block: 49152 shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: {cores}
  fpus_per_core: 128 block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 block_dim_limit_z: 65535
  memory_bandwidth: {bandwidth} clock_rate_ghz: 1.98 device_memory_size: {memory} shared_memory_per_block_optin: 232448
  cuda_compute_capability {{ major: 9 minor: 0 }} registers_per_core_limit: 65536 registers_per_block_limit: 65536 }}
platform_name: "CUDA" dnn_version_info {{ major: 9 minor: 10 }} runtime_version {{ major: 13 minor: 0 }}
device_description_str: "{name}"
"""  # XLA's GpuTargetConfigProto for a Hopper card (sm_90): what its compiler needs instead of the card


def gpu_chip(device_kind: str) -> Chip | None:
    """The card of `CHIPS` a JAX device's ``device_kind`` names ("NVIDIA H100 80GB HBM3"), or None."""
    return next((c for c in CHIPS.values() if c.platform == "gpu" and c.name.split()[1] in device_kind), None)


def topology_name(spec: str) -> tuple[Chip, str, int]:
    """``v5e-256`` (an accelerator type) or ``v5e:16x16`` (a topology) → (chip, the compiler's topology
    name, chips). A GPU: ``h100`` or ``h100-1`` (one card)."""
    gen, sep, rest = spec.replace(":", "-", 1).partition("-")
    if gen in CHIPS and CHIPS[gen].platform == "gpu":
        if rest not in ("", "1"):
            raise ValueError(f"--topology {spec!r}: one GPU only ({gen} or {gen}-1)")
        return CHIPS[gen], "1x1x1", 1
    if gen not in CHIPS or not sep or not rest:
        tpus = ", ".join(k for k, c in CHIPS.items() if c.platform == "tpu")
        gpus = " or ".join(k for k, c in CHIPS.items() if c.platform == "gpu")
        raise ValueError(f"--topology {spec!r}: expected <generation>-<size> or <generation>:<AxB[xC]> with "
                         f"generation one of {tpus} (e.g. v5e-256, v4-32, v5p:2x2x1), or a GPU: {gpus}")
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


def has_cuda_plugin() -> bool:  # JAX's CUDA plugin (CUDA 13 or 12)
    plugins = importlib.util.find_spec("jax_plugins") is not None
    return plugins and any(importlib.util.find_spec(f"jax_plugins.xla_cuda{v}") for v in (13, 12))


def gpu_devices(spec: str):
    """(chip, "1x1x1", the device of one GPU for XLA's GPU compiler; no GPU needed). JAX's CUDA plugin
    must not start a backend on this machine, which has no card: the CPU is its only platform here."""
    chip, name, _ = topology_name(spec)
    if not has_cuda_plugin():
        raise cli.UserError("JAX's CUDA plugin is not installed: pip install -e '.[gpu-aot]'")
    jax.config.update("jax_platforms", "cpu")  # the card is a target of the compiler, not a device here
    from jax.experimental import topologies

    target = GPU_TARGET.format(cores=chip.cores, bandwidth=int(chip.hbm_bandwidth),
                               memory=int(chip.hbm_gib * 2**30), name=chip.name)
    try:
        devices = topologies.get_topology_desc(platform="cuda", target_config=target, topology=name).devices
    except Exception as e:  # noqa: BLE001  (the plugin's own exception types)
        raise ValueError(f"--topology {spec!r}: the CUDA plugin does not compile for it: {cli.message(e)}") from e
    return chip, name, devices


def load_config(spec: str, overrides: list[str], platform: str = "tpu"):
    """``configs/x.py[:arg]`` with ``--config.a.b=value`` overrides as ``train.py`` reads them, resolved
    for ``platform`` ("tpu", "gpu"): "auto" means the platform that runs it, not this host's CPU. Its
    ``xla_options`` are checked as the trainer checks them (on this host's backend)."""
    argv = ["aot", f"--config={spec}", *overrides]
    check_command_line(argv)  # a missing file or key: one line
    fv = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True, sys_argv=argv)
    try:
        fv(argv)
    except flags.Error as e:
        raise ValueError(cli.message(e)) from e
    config = resolve(fv.config, platform)
    compiler_options.check(compiler_options.of_config(config))
    return config


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
        # The mesh's abstract device names the target chip: Pallas's GPU lowering (JAX >= 0.11) reads
        # the compute capability from it when no GPU is attached.
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            lowered = steps.train_fn.lower(steps.layout.target(), batch, rng)
        compiled = lowered.compile()
    except jax.errors.JaxRuntimeError as e:  # the compiler's own verdict: it does not fit
        if (refusal := compiler_options.refused(e, compiler_options.of_config(config))) is not None:
            raise refusal from None  # the target's compiler refused an option (a TPU's own: checked here only)
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        return dict(out, compile_s=round(time.perf_counter() - start, 1), error=cli.message(e)[:300])
    c = cost(compiled)
    hlo = compiled.as_text() if not c["flops"] and not c["bytes"] else None  # a GPU's: read by `estimate`
    return dict(out, compile_s=round(time.perf_counter() - start, 1), memory=trainer_steps.memory(compiled),
                cost=c, hlo=hlo)


def report(r: dict, chip: Chip, devices: int) -> dict:
    """``r`` with its fit in a device's HBM and the step time at 100% and 50% MFU."""
    hbm, chips = chip.device_bytes(), devices // chip.devices_per_chip
    r = dict(r, chip=chip.name, chips=chips, platform=chip.platform, hbm_bytes=hbm,
             fits=bool(r["memory"]) and r["memory"]["total"] <= hbm)
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


def gpu_cost(hlo: str, chip: Chip) -> tuple[dict, dict]:
    """One GPU's step: (its cost, its estimate) from the least time of the compiled program's kernels
    (`bert_jax.benchmark.roofline`)."""
    t = kernel_roofline.table(kernel_roofline.kernels(hlo), chip.peak_bf16, chip.hbm_bandwidth)
    c = {"flops": t["flops"], "bytes": t["bytes"]}
    return c, dict(roofline(c, chip), step_s=t["ms"] / 1e3, table=t, source="the least time of the GPU's kernels")


def estimate(config, devices, chip: Chip, steps: int = 0, memory: bool = True) -> dict:
    """The step as configured (``memory``: compiled, else only described; on a GPU always compiled)
    and its estimated time."""
    gpu = chip.platform == "gpu"
    if gpu and (str(config.model.scan_layers).lower() == "true" or config.per_device_batch):
        raise ValueError("the GPU estimate reads every kernel of the step, so a loop would be counted once: "
                         "set --config.model.scan_layers=false and --config.per_device_batch=0")
    r = report(compile_step(config, devices, config.batch_size, compile=memory or gpu), chip, len(devices))
    hlo = r.pop("hlo", None)
    if (memory or gpu) and not r["fits"]:  # no time for a step that does not fit
        return dict(r, estimate=None)
    k, n = r["accumulation_steps"], r["layers"]
    if config.batch_size % k:
        raise ValueError(f"batch_size {config.batch_size} is not divisible by {k} micro-batches")
    if gpu:
        c, e = gpu_cost(hlo, chip)
    else:
        one, two = (compile_step(with_model(config, num_layers=i, scan_layers="false"), devices,
                                 config.batch_size // k) for i in (1, 2))
        print(f"  compiled 1 and 2 unrolled layers at batch {config.batch_size // k} in {one['compile_s']} s, "
              f"{two['compile_s']} s", file=sys.stderr, flush=True)
        c = {key: one["cost"][key] + (n - 1) * (two["cost"][key] - one["cost"][key]) for key in ("flops", "bytes")}
        seconds = [x["cost"]["compiler_seconds"] or -1 for x in (one, two)]
        compiler_s = seconds[0] + (n - 1) * (seconds[1] - seconds[0]) if min(seconds) > 0 and k == 1 else None
        if k > 1:
            update = update_cost(config, devices)
            c = {key: k * (c[key] - update[key]) + update[key] for key in c}
        e = dict(roofline(c, chip, compiler_s), layer_costs=[one["cost"], two["cost"]])
    b = config.batch_size
    e.update(sequences_per_s=b / e["step_s"], tokens_per_s=b * r["length"] / e["step_s"], flops_per_device=c["flops"],
             bytes_per_device=c["bytes"])
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
        line += (f"{m['total'] / g:.2f} of {r['hbm_bytes'] / g:.0f} GiB per device"
                 + (" (JAX's share of the card)" if r.get("platform") == "gpu" else "") + " -> "
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
        if "table" in e:
            line += "\n\n" + kernel_roofline.markdown(e["table"])
    return line + ("\n  no time estimate: it does not fit" if e is None else "")


def parse_args(argv=None):
    """(the subcommand's arguments, its ``--config.x=y`` overrides)."""
    p = cli.ArgumentParser(prog="python -m bert_jax.benchmark.aot", description=__doc__.split("\n\n")[1],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="{compile,estimate}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--topology", required=True, help="e.g. v5e-256, v4-32, v5p-8, v5e:16x16, or h100")
    common.add_argument("--output", default="", help="append each result as a JSON line to this file")
    for name, what in (("compile", "memory per device and FLOPs of the step"), ("estimate", "its time and MFU")):
        s = sub.add_parser(name, parents=[common], help=what)
        s.add_argument("--config", required=True, help="configs/<job>.py[:<args>], then --config.x=y overrides")
    sub.choices["compile"].add_argument("--find_max_batch", action="store_true", help="the largest batch that fits")
    sub.choices["estimate"].add_argument("--steps", type=int, default=0, help="also the time of this many steps")
    sub.choices["estimate"].add_argument("--no_memory", action="store_true", help="skip compiling the step itself")
    args, rest = p.parse_known_args(argv)
    if [a for a in rest if not a.startswith("--config.")] or (rest and "config" not in args):
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "estimate" and args.steps < 0:
        p.error(f"--steps {args.steps}: expected a number of steps >= 0")
    return args, rest


def main(argv=None) -> list[dict]:
    args, overrides = parse_args(argv)
    gpu = topology_name(args.topology)[0].platform == "gpu"
    config = load_config(args.config, overrides, "gpu" if gpu else "tpu")
    if args.command == "estimate" and is_finetuning(config):
        raise ValueError(f"--config {args.config}: the estimate is for pre-training configs (configs/pretrain.py)")
    chip, name, devices = (gpu_devices if gpu else tpu_devices)(args.topology)
    if args.command == "estimate":
        results = [estimate(config, devices, chip, args.steps, memory=not args.no_memory)]
    elif args.find_max_batch:
        shards = sh.batch_shards(sh.config_mesh(config, devices), config_rules(config))
        hbm, found = chip.device_bytes(), {}

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
        r.pop("hlo", None)  # the GPU program: read into the estimate's table
        r.update(topology=args.topology, topology_name=name, config=args.config, overrides=overrides)
        print(summary(r), flush=True)
        if args.output:
            with open(args.output, "a") as f:
                f.write(json.dumps(r) + "\n")
    return results


if __name__ == "__main__":
    cli.run(main)
