"""One pre-training step of BERT or its family (``--model``: the configs/pretrain.py recipe), the step
the trainer runs, compiled and timed: `Bench` builds it (`bert_jax.training.trainer.build_steps`,
synthetic batches of the real shapes, optional packing and unpadding), `run_one` times it and
`summary` prints a result. The command line and what it reports:
`bert_jax.benchmark.command` (``python -m bert_jax.benchmark``).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import time

import jax
import numpy as np

from bert_jax.benchmark import params as paper_params
from bert_jax.benchmark.flops import device_peak, formula, model_flops
from bert_jax.benchmark.memory import GIB, memory_report
from bert_jax.config_args import load_config_file
from bert_jax.training import job
from bert_jax.training import sharding as sh
from bert_jax.training.trainer import build_steps, model_config
from input_pipeline.pretraining.packing import PackedBatches
from input_pipeline.pretraining.synthetic import SyntheticBatches
from input_pipeline.unpadding import token_index, with_token_index


def dict_with(config, **fields):
    """A copy of ``config`` with ``fields`` replaced."""
    c = config.copy_and_resolve_references()
    c.update(fields)
    return c


def mean_real_tokens(batches: list[dict[str, np.ndarray]]) -> float:
    """Mean real (not padding) tokens per batch."""
    return float(np.mean([b["input_mask"].sum() for b in batches]))


class Bench:
    """The model, optimizer, mesh and jitted step for one configuration (any batch size)."""

    def __init__(self, args):
        self.args = args
        config = load_config_file("pretrain", f"model={args.model},size={args.size},synthetic=True")
        m = config.model
        self.recipe_positions = m.max_position_embeddings
        dropout = m.attention_dropout_prob if args.attention_dropout is None else args.attention_dropout
        m.update(vocab_size=args.vocab_size, dtype=args.dtype, scan_layers=str(args.scan).lower(),
                 remat_policy=args.remat,
                 attention_impl=args.attention_impl, attention_dropout_prob=dropout, dropout_impl=args.dropout_impl,
                 max_position_embeddings=max(m.max_position_embeddings,
                                             args.seq_len + (m.position_offset or 0)))
        config.update(per_device_batch=args.per_device_batch, unpad_multiple=args.unpad_multiple)
        shape = tuple(int(x) for x in args.mesh.split(","))
        devices = jax.devices() if -1 in shape else jax.devices()[: math.prod(shape)]
        self.mesh = sh.make_mesh(shape, devices)
        self.config = config  # "auto" kept: micro-batches follow the batch size (`resolved`)
        self.cfg = model_config(self.resolved(config), args.vocab_size)  # the recipe's model, as the trainer builds it
        self.objective = config.objective
        self.generator_fraction = config.electra.generator_fraction if "electra" in config else None
        # The trainer's own step, optimizer and shardings (the state's layout does not depend on the batch).
        steps = build_steps(self.resolved(dict_with(config, per_device_batch="0")), self.cfg, self.mesh)
        self.layout, self.rules, self.batch_sh = steps.layout, steps.rules, steps.batch_sharding
        self._steps: dict[int, object] = {}  # batch size -> its Steps (micro-batches follow the batch)
        self.rng, self.state = jax.random.key(0, impl=args.rng_impl), None
        self._host: tuple[int | None, list] = (None, [])  # (batch size, its host batches)
        self.compiler_options = {k: json.loads(v) if v[:1].isdigit() or v in ("true", "false") else v
                                 for k, _, v in (o.partition("=") for o in args.xla_option)}

    def data(self, batch_size: int, packed: bool = True):
        """Synthetic batches of ``batch_size`` rows; with ``--packing K`` (and ``packed``) each row
        packs up to K of the synthetic examples (input_pipeline/pretraining/packing.py)."""
        k = self.args.packing if packed else 0
        examples = SyntheticBatches(batch_size=batch_size * max(k, 1), seq_len=self.args.seq_len,
                                    max_predictions=self.args.max_predictions, vocab_size=self.cfg.vocab_size,
                                    short_seq_prob=self.args.short_seq_prob)
        return PackedBatches(examples, batch_size, max_examples=k) if k else examples

    def host_batches(self, batch_size: int, num_batches: int = 4) -> list[dict[str, np.ndarray]]:
        """The first ``num_batches`` (at most 4) of the synthetic batches the steps cycle through;
        with ``--unpad_multiple`` each has a ``token_index`` of one size, that of the fullest of the
        four (none if that is every slot). Made once per batch size (compile, step and report share them)."""
        if self._host[0] != batch_size:
            data = self.data(batch_size)
            host = [next(data) for _ in range(4)]
            if self.args.unpad_multiple:
                shards, m = sh.batch_shards(self.mesh, self.rules), self.args.unpad_multiple
                tokens = max(token_index(b["input_mask"], shards, m).shape[1] for b in host)
                host = [with_token_index(b, shards, m, min_tokens=tokens) for b in host]
            self._host = (batch_size, host)
        return self._host[1][:num_batches]

    def block_tokens(self, batch_size: int) -> int | None:
        """The token slots the blocks run on with ``--unpad_multiple`` (None: all B·S)."""
        batch = self.host_batches(batch_size, 1)[0] if self.args.unpad_multiple else {}
        return batch["token_index"].size if "token_index" in batch else None

    def lower(self, batch_size: int):
        """The step lowered for ``batch_size`` (from shapes only; `jax.stages.Lowered`)."""
        shards = math.prod(self.mesh.shape[a] for a in ("data", "fsdp"))
        if batch_size % shards:
            raise ValueError(f"batch_size {batch_size} is not divisible by the {shards} batch shards of mesh "
                             f"{dict(self.mesh.shape)}")
        # The shapes of the batches the steps will see (unpadded: the token count depends on the data).
        batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in self.host_batches(batch_size, 1)[0].items()}
        return self.steps(batch_size).train_fn.lower(self.layout.abstract, batch, self.rng)

    def steps(self, batch_size: int):
        """The trainer's steps for a global batch of ``batch_size`` (its micro-batches: `accumulation_steps`)."""
        if batch_size not in self._steps:
            self._steps[batch_size] = build_steps(self.resolved(dict_with(self.config, batch_size=batch_size)),
                                                  self.cfg, self.mesh)
        return self._steps[batch_size]

    def resolved(self, config):
        """``config`` resolved for this platform and mesh, as a job's is when it starts."""
        return job.resolved(config, self.mesh)

    def compile(self, batch_size: int):
        """(compiled step, lower seconds, compile seconds), from shapes only."""
        t0 = time.perf_counter()
        lowered = self.lower(batch_size)
        t1 = time.perf_counter()
        compiled = lowered.compile(compiler_options=self.compiler_options or None)
        return compiled, t1 - t0, time.perf_counter() - t1

    def stepper(self, compiled, batch_size: int, num_batches: int = 4):
        """A function running one step of ``compiled`` on the next of ``num_batches`` synthetic batches
        (already on the device) and waiting for it; it returns the step's metrics. The state is
        initialised once (a compiled init), then carried in ``self.state`` across batch sizes.
        ``step.real_tokens``: the mean real (not padding) tokens of those batches."""
        if self.state is None:
            self.state = self.layout.create(0, compiler_options=self.compiler_options or None)
        host = self.host_batches(batch_size, num_batches)
        batches = [sh.global_batch(b, self.mesh, self.rules) for b in host]
        count = itertools.count()

        def step() -> dict:
            self.state, metrics = compiled(self.state, batches[next(count) % len(batches)], self.rng)
            jax.block_until_ready((self.state, metrics))
            return metrics

        step.real_tokens = mean_real_tokens(host)
        return step

    def flops(self, batch_size: int, max_predictions: int | None = None) -> int:
        """Model FLOPs of a step (bert_jax/benchmark/flops.py); ``max_predictions`` = seq_len: a dense MLM head."""
        a = self.args
        p = a.max_predictions if max_predictions is None else max_predictions
        return model_flops(self.cfg, self.objective, batch_size, a.seq_len, p, self.block_tokens(batch_size),
                           self.generator_fraction)

    def formula(self) -> str:
        return formula(self.cfg, self.objective, self.generator_fraction)

    def describe(self, batch_size: int | None) -> dict:
        a, cfg, dev = self.args, self.cfg, jax.devices()[0]
        if cfg.attention_dropout_prob == 0.0 and cfg.attention_impl != "explicit":
            path = f"jax.nn.dot_product_attention(implementation={cfg.attention_impl})"
        else:
            path = "explicit einsum-softmax-dropout-einsum" + (
                " (attention dropout needs the probabilities)" if cfg.attention_dropout_prob else "")
        counts = paper_params.param_counts(a.model, a.size, self.layout.abstract.params, cfg.embed_dim,
                                           cfg.vocab_size, cfg.max_position_embeddings, self.recipe_positions)
        return {"model": a.model, "size": a.size, "objective": self.objective, "num_params": counts["total"],
                "params": counts,
                "seq_len": a.seq_len, "batch_size": batch_size, "max_predictions": a.max_predictions,
                "vocab_size": cfg.vocab_size, "dtype": a.dtype, "remat": a.remat, "scan": cfg.scanned,
                "rng_impl": a.rng_impl, "dropout_impl": a.dropout_impl, "attention_impl": a.attention_impl,
                "unpad_multiple": a.unpad_multiple, "per_device_batch": a.per_device_batch,
                "accumulation_steps": None if batch_size is None else self.steps(batch_size).accumulation_steps,
                "attention_dropout": cfg.attention_dropout_prob,
                "attention_path": path, "mesh": dict(self.mesh.shape), "devices": self.mesh.devices.size,
                "device_kind": dev.device_kind, "platform": dev.platform, "jax": jax.__version__,
                "load_average": [round(x, 2) for x in os.getloadavg()],
                "glibc_tunables": os.environ.get("GLIBC_TUNABLES", "")}  # huge pages: README, "CPU launch line"


def time_steps(bench: Bench, compiled, batch_size: int) -> tuple[list[float], float, float]:
    """Runs warm-up then timed steps; (step seconds, final loss, real tokens per step). The state
    lives on in ``bench``."""
    a = bench.args
    step = bench.stepper(compiled, batch_size, min(4, a.warmup + a.steps))
    times, metrics = [], None
    for i in range(a.warmup + a.steps):
        t = time.perf_counter()
        metrics = step()
        if i >= a.warmup:
            times.append(time.perf_counter() - t)
    if a.profile:  # one more step, traced: open in TensorBoard's profile plugin, Perfetto or xprof
        with jax.profiler.trace(a.profile, create_perfetto_trace=True):
            metrics = step()
    return times, float(metrics["loss"]), step.real_tokens


def run_one(bench: Bench, batch_size: int) -> dict:
    a = bench.args
    compiled, lower_s, compile_s = bench.compile(batch_size)
    out = {"mode": "memory_only" if a.memory_only else "train_step", **bench.describe(batch_size),
           "lower_s": round(lower_s, 3), "compile_s": round(lower_s + compile_s, 3),
           "memory": memory_report(compiled)}
    if a.memory_only:
        return out
    peak, source = device_peak(a.dtype, bench.mesh.devices.size)
    times, loss, real_tokens = time_steps(bench, compiled, batch_size)
    median, best = float(np.median(times)), float(np.min(times))
    flops = bench.flops(batch_size)
    out.update({
        "steps": a.steps, "warmup": a.warmup, "step_time_median_s": round(median, 5),
        "step_time_min_s": round(best, 5), "sequences_per_s": round(batch_size / median, 2),
        "tokens_per_s": round(batch_size * a.seq_len / median, 1), "loss": round(loss, 4),
        "real_tokens_per_step": real_tokens, "real_tokens_per_s": round(real_tokens / median, 1),
        "model_flops_per_step": flops, "flops_formula": bench.formula(),
        "model_flops_dense_mlm_head": bench.flops(batch_size, a.seq_len),
        "achieved_flops_per_s": round(flops / median), "peak_flops_per_s": round(peak), "peak_source": source,
        "mfu": round(flops / median / peak, 4),
    })
    if not math.isfinite(loss):
        raise FloatingPointError(f"loss is {loss} after {a.warmup + a.steps} steps: the benchmark is not valid")
    return out


NAMES = {"bert": "BERT", "roberta": "RoBERTa", "albert": "ALBERT", "electra": "ELECTRA"}


def model_name(r: dict) -> str:
    """``BERT-base``, ``ELECTRA-small (objective rtd)``, ... from a result."""
    return f"{NAMES.get(r['model'], r['model'])}-{r['size']} (objective {r['objective']})"


def summary(r: dict) -> str:
    batch = "" if r["batch_size"] is None else f"batch {r['batch_size']} "
    lines = [f"{r['mode']}: {model_name(r)} ({r['num_params'] / 1e6:.1f}M params) seq_len {r['seq_len']} {batch}"
             f"P {r['max_predictions']} {r['dtype']} remat={r['remat']} scan={r['scan']} "
             f"on {r['devices']} x {r['device_kind']} (load {r['load_average'][0]})"
             + ("; huge pages" if "hugetlb=1" in r.get("glibc_tunables", "") else ""),
             f"  attention: {r['attention_path']}", paper_params.summary(r["params"])]
    if (r.get("accumulation_steps") or 1) > 1:
        lines[0] += f"; {r['accumulation_steps']} micro-batches (--per_device_batch {r['per_device_batch']})"
    if r.get("unpad_multiple"):
        lines[1] += f"; blocks on the real tokens only (--unpad_multiple {r['unpad_multiple']})"
    if r["mode"] == "find_max_batch":
        return "\n".join(lines + [
            f"  largest batch (multiple of {r['batch_multiple']}) whose compiled estimate fits: "
            + ", ".join(f"{g} GiB -> {b}" for g, b in r["max_batch"].items()),
            f"  estimates (GiB) by batch: {r['estimates_gib']}"])
    m = r["memory"] and {k: v / GIB for k, v in r["memory"].items() if k.endswith("_bytes")}
    lines += [f"  compile: {r['compile_s']:.1f} s (lower {r['lower_s']:.1f} s)",
              "  memory: no analysis on this backend" if not m else
              f"  memory: {m['estimate_bytes']:.2f} GiB per device (arguments {m['argument_bytes']:.2f} + outputs "
              f"{m['output_bytes']:.2f} + temp {m['temp_bytes']:.2f} - aliased {m['alias_bytes']:.2f})"]
    if r["mode"] == "train_step":
        lines += [f"  step: median {r['step_time_median_s'] * 1e3:.1f} ms, min {r['step_time_min_s'] * 1e3:.1f} ms "
                  f"over {r['steps']} steps ({r['warmup']} warm-up); loss {r['loss']}",
                  f"  throughput: {r['sequences_per_s']:.1f} rows/s, {r['tokens_per_s']:.0f} tokens/s, "
                  f"{r['real_tokens_per_s']:.0f} real (not padding) tokens/s ({r['real_tokens_per_step']:.0f} a step)",
                  f"  model FLOPs/step: {r['model_flops_per_step'] / 1e9:.1f} G  ({r['flops_formula']}; "
                  f"{r['model_flops_dense_mlm_head'] / 1e9:.1f} G with a dense MLM head)",
                  f"  achieved: {r['achieved_flops_per_s'] / 1e12:.4f} TFLOP/s; MFU {100 * r['mfu']:.1f}% of "
                  f"{r['peak_flops_per_s'] / 1e12:.4f} TFLOP/s ({r['peak_source']})"]
    return "\n".join(lines)
