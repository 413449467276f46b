r"""``python -m bert_jax.benchmark``: speed and memory of the pre-training step the trainer runs, for BERT
or its family (``--model``: configs/pretrain.py's recipes), beside its variants and Hugging Face's BERT
(bert_jax/benchmark/peers.py). docs/benchmarks.md shows the commands and what they print.

    python -m bert_jax.benchmark --size base --seq_len 128 --batch_size 8,32 [--steps 20] [--warmup 3]
        [--model bert|roberta|albert|electra] [--dtype bfloat16] [--remat full] [--noscan] [--json]
    python -m bert_jax.benchmark --size large --seq_len 512 --find_max_batch --memory_gb 16,40,80
    python -m bert_jax.benchmark --size base --batch_size 8 --variant "--rng_impl rbg" --variant "--noscan"

It compiles the trainer's own step (bert_jax/benchmark/trainer_steps.py: its optimizer, dropout,
sharding rules, micro-batches and donated state) for synthetic batches of the real shapes (P = 5/32
of the length; the paper's vocabulary), runs ``--warmup`` steps, then times ``--steps`` as the trainer
runs them, the next step queued while one runs (bert_jax/benchmark/timing.py; also each waited for
before the next, ``step_time_waited_median_s``), the input on the device: step time, tokens/s, model
FLOPs (bert_jax/benchmark/flops.py) and MFU,
XLA's memory per device, the parameters against the paper's. ``--memory_only`` and
``--find_max_batch`` compile only.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shlex
import sys
import time
from pathlib import Path

import jax
import numpy as np

from bert_jax.benchmark import peers, profile, timing, trainer_steps
from bert_jax.benchmark.flops import device_peak, model_flops
from bert_jax.config_args import config_module, load_config_file
from bert_jax.model.config import GELU_IMPLS
from bert_jax.resolve import resolve, resolve_per_device_batch
from bert_jax.training import compiler_options
from bert_jax.training import sharding as sh
from bert_jax.training.global_norm import GLOBAL_NORMS
from bert_jax.training.sharding_rules import config_rules
from input_pipeline import command_line as cli
from input_pipeline.pretraining.packing import PackedBatches
from input_pipeline.pretraining.synthetic import SyntheticBatches
from input_pipeline.unpadding import token_index, with_token_index

GIB = 2**30


# The papers' parameter counts, each with the vocabulary it used: BERT (Devlin et al., 2019, §3),
# RoBERTa (Liu et al., 2019, §5; base from fairseq's table), ALBERT (Lan et al., 2020, Table 1),
# ELECTRA (Clark et al., 2020, Table 6).
PAPER_VOCAB = {"bert": 30522, "roberta": 50265, "albert": 30000, "electra": 30522, "modernbert": 50368}
PAPER_PARAMS = {
    ("bert", "base"): 110e6, ("bert", "large"): 340e6, ("roberta", "base"): 125e6, ("roberta", "large"): 355e6,
    ("albert", "base"): 12e6, ("albert", "large"): 18e6, ("albert", "xlarge"): 60e6, ("albert", "xxlarge"): 235e6,
    ("electra", "small"): 14e6, ("electra", "base"): 110e6, ("electra", "large"): 335e6,
}


def param_counts(model: str, size: str, params, embed_dim: int, vocab_size: int, positions: int,
                 recipe_positions: int) -> dict:
    """The trained ``params`` (arrays or shape structs), the encoder's (``bert/``; ELECTRA's
    discriminator), and the encoder restated at the paper's vocabulary and the recipe's position table
    (the benchmark widens it for long sequences) against the paper's figure."""
    sizes = {jax.tree_util.keystr(k): math.prod(x.shape) for k, x in jax.tree_util.tree_flatten_with_path(params)[0]}
    encoder = sum(n for k, n in sizes.items() if k.startswith("['bert']"))
    at_paper = encoder + (PAPER_VOCAB[model] - vocab_size + recipe_positions - positions) * embed_dim
    paper = PAPER_PARAMS.get((model, size))
    return {"total": sum(sizes.values()), "encoder": encoder, "paper_vocab": PAPER_VOCAB[model],
            "encoder_at_paper_vocab": at_paper, "paper": paper and int(paper),
            "ours_over_paper": paper and round(at_paper / paper, 4)}


class Bench:
    """One command line's recipe, mesh and state; the trainer's step for any batch size."""

    def __init__(self, args):
        self.args = a = args
        config = load_config_file("pretrain", f"model={a.model},size={a.size},synthetic=True")
        m = config.model
        self.recipe_positions = m.max_position_embeddings
        dropout = m.attention_dropout_prob if a.attention_dropout is None else a.attention_dropout
        m.update(vocab_size=a.vocab_size, dtype=a.dtype, scan_layers=str(a.scan).lower(), remat_policy=a.remat,
                 attention_impl=a.attention_impl, dropout_impl=a.dropout_impl, norm_impl=a.norm_impl,
                 gelu_impl=a.gelu_impl, attention_dropout_prob=dropout,
                 recompute_activation=a.recompute_activation, stacked_params=a.stacked_params,
                 max_position_embeddings=max(m.max_position_embeddings, a.seq_len + (m.position_offset or 0)))
        config.update(per_device_batch=a.per_device_batch, unpad_multiple=a.unpad_multiple, global_norm=a.global_norm)
        config.data.update(max_seq_length=a.seq_len, max_predictions_per_seq=a.max_predictions)
        shape = tuple(int(x) for x in a.mesh.split(","))
        self.mesh = sh.make_mesh(shape, jax.devices() if -1 in shape else jax.devices()[: math.prod(shape)])
        self.config, self.rules = config, config_rules(config)
        self.objective = config.objective
        self.generator_fraction = config.electra.generator_fraction if "electra" in config else None
        self._steps, self._host = {}, (None, [])  # batch size -> its Steps; (batch size, its host batches)
        self.steps(a.batch_size[0])  # and self.cfg: the recipe's model as the trainer builds it
        self.rng, self.state = jax.random.key(0, impl=a.rng_impl), None
        self.options = compiler_options.parse(" ".join(a.xla_option), "--xla_option") or None

    def steps(self, batch_size: int):
        """The trainer's steps for a global batch of ``batch_size`` (its micro-batches follow the batch)."""
        if batch_size not in self._steps:
            c = self.config.copy_and_resolve_references()
            c.batch_size = batch_size
            c = resolve(c, jax.default_backend(), batch_shards=sh.batch_shards(self.mesh, self.rules))
            self._steps[batch_size], self.cfg, _ = trainer_steps.build(c, self.mesh)
            self.global_norm = c.global_norm
        return self._steps[batch_size]

    def host_batches(self, batch_size: int, packed: bool = True) -> list[dict[str, np.ndarray]]:
        """The 4 synthetic batches the steps cycle through (``--packing K``: up to K examples a row;
        ``--unpad_multiple``: each with a ``token_index`` of the fullest one's size)."""
        a, k = self.args, self.args.packing if packed else 0
        if not packed or self._host[0] != batch_size:
            data = SyntheticBatches(batch_size=batch_size * max(k, 1), seq_len=a.seq_len, vocab_size=a.vocab_size,
                                    max_predictions=a.max_predictions, short_seq_prob=a.short_seq_prob)
            host = [next(PackedBatches(data, batch_size, max_examples=k) if k else data) for _ in range(4)]
            if not packed:
                return host
            if a.unpad_multiple:
                shards, m = sh.batch_shards(self.mesh, self.rules), a.unpad_multiple
                tokens = max(token_index(b["input_mask"], shards, m).shape[1] for b in host)
                host = [with_token_index(b, shards, m, min_tokens=tokens) for b in host]
            self._host = (batch_size, host)
        return self._host[1]

    def block_tokens(self, batch_size: int) -> int | None:
        """The token slots the blocks run on with ``--unpad_multiple`` (None: all B·S)."""
        batch = self.host_batches(batch_size)[0] if self.args.unpad_multiple else {}
        return batch["token_index"].size if "token_index" in batch else None

    def lower(self, batch_size: int):
        """The step for ``batch_size``, lowered from shapes only (`jax.stages.Lowered`)."""
        shards = sh.batch_shards(self.mesh, self.rules)
        if batch_size % shards:
            raise ValueError(f"batch_size {batch_size} is not divisible by the {shards} batch shards of mesh "
                             f"{dict(self.mesh.shape)}")
        batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in self.host_batches(batch_size)[0].items()}
        steps = self.steps(batch_size)
        return steps.train_fn.lower(steps.layout.abstract, batch, self.rng)

    def compile(self, batch_size: int):
        """(the compiled step, seconds to lower and compile it)."""
        t = time.perf_counter()
        compiled = self.lower(batch_size).compile(compiler_options=self.options)
        return compiled, time.perf_counter() - t

    def stepper(self, compiled, batch_size: int) -> Stepper:
        """Steps of ``compiled`` on the host batches (on the device), from the state made once, then
        carried across batch sizes."""
        if self.state is None:
            self.state = self.steps(batch_size).layout.create(0, compiler_options=self.options)
        host = self.host_batches(batch_size)
        return Stepper(self, compiled, [sh.global_batch(b, self.mesh, self.rules) for b in host],
                       float(np.mean([b["input_mask"].sum() for b in host])))

    def flops(self, batch_size: int, max_predictions: int | None = None) -> int:
        """Model FLOPs of a step; ``max_predictions`` = seq_len: a dense MLM head."""
        p = self.args.max_predictions if max_predictions is None else max_predictions
        return model_flops(self.cfg, self.objective, batch_size, self.args.seq_len, p, self.block_tokens(batch_size),
                           self.generator_fraction)

    def describe(self, batch_size: int | None) -> dict:
        a, cfg, dev = self.args, self.cfg, jax.devices()[0]
        fused = cfg.attention_dropout_prob == 0.0 and cfg.attention_impl != "explicit"
        path = (f"{cfg.attention_impl}: Pallas flash attention, dropout inside" if "flash" in cfg.attention_impl else
                f"jax.nn.dot_product_attention(implementation={cfg.attention_impl})" if fused else
                "explicit einsum-softmax-dropout-einsum" + (" (attention dropout needs the probabilities)"
                                                            if cfg.attention_dropout_prob else ""))
        steps = self.steps(a.batch_size[0] if batch_size is None else batch_size)
        return {"model": a.model, "size": a.size, "objective": self.objective, "seq_len": a.seq_len,
                "batch_size": batch_size, "max_predictions": a.max_predictions, "vocab_size": cfg.vocab_size,
                "params": param_counts(a.model, a.size, steps.layout.abstract.params, cfg.embed_dim, cfg.vocab_size,
                                       cfg.max_position_embeddings, self.recipe_positions),
                "dtype": a.dtype, "remat": a.remat, "scan": cfg.scanned, "rng_impl": a.rng_impl,
                "dropout_impl": cfg.dropout_impl, "norm_impl": cfg.norm_impl, "gelu_impl": cfg.gelu_impl,
                "global_norm": self.global_norm,
                "recompute_activation": cfg.recompute_activation, "stacked_params": cfg.stacked_params,
                "attention_path": path, "unpad_multiple": a.unpad_multiple,
                "per_device_batch": a.per_device_batch, "accumulation_steps": steps.accumulation_steps,
                "mesh": dict(self.mesh.shape), "devices": self.mesh.devices.size, "device_kind": dev.device_kind,
                "jax": jax.__version__, "load_average": [round(x, 2) for x in os.getloadavg()],
                "glibc_tunables": os.environ.get("GLIBC_TUNABLES", "")}  # huge pages (docs/pretraining.md)


class Stepper:
    """The steps of one compiled train step, cycling through the benchmark's batches: a
    `bert_jax.benchmark.timing.Runner` (handles: the step's metrics); calling it runs one step and
    waits for it. ``real_tokens``: the mean real (not padding) tokens of a step."""

    def __init__(self, bench: Bench, compiled, batches: list[dict], real_tokens: float):
        self.bench, self.compiled, self.batches, self.real_tokens = bench, compiled, batches, real_tokens
        self.count = itertools.count()

    def launch(self) -> dict:
        b = self.bench
        b.state, metrics = self.compiled(b.state, self.batches[next(self.count) % len(self.batches)], b.rng)
        return metrics

    def wait(self, metrics: dict) -> dict:
        return jax.block_until_ready(metrics)

    def finish(self, metrics: dict) -> dict:
        return jax.block_until_ready((self.bench.state, metrics))[1]

    def __call__(self) -> dict:
        return self.finish(self.launch())


def run_one(bench: Bench, batch_size: int) -> dict:
    """Compiles, then (unless ``--memory_only``) times the step at ``batch_size``; one result."""
    a = bench.args
    compiled, compile_s = bench.compile(batch_size)
    out = {"mode": "memory_only" if a.memory_only else "train_step", **bench.describe(batch_size),
           "compile_s": round(compile_s, 3), "memory": trainer_steps.memory(compiled)}
    if a.memory_only:
        return out
    peak, source = device_peak(a.dtype, bench.mesh.devices.size)
    step = bench.stepper(compiled, batch_size)
    timing.waited_times(step, a.warmup)
    waited, _ = timing.waited_times(step, a.steps)  # each step waited for before the next is dispatched
    times, results = timing.queued_times(step, a.steps)  # as the trainer runs them: the next one queued
    median, loss, flops = float(np.median(times)), float(results[-1]["loss"]), bench.flops(batch_size)
    if a.profile:  # more steps, traced: python -m bert_jax.benchmark.profile, TensorBoard, Perfetto or xprof
        trace_steps(a.profile, compiled, step, a.profile_steps,
                    {"label": label(bench.describe(batch_size)), "step_time_median_s": median})
    if not math.isfinite(loss):
        raise FloatingPointError(f"loss is {loss} after {a.warmup + a.steps} steps: the benchmark is not valid")
    return {**out, "steps": a.steps, "warmup": a.warmup, "step_time_median_s": round(median, 5),
            "step_time_min_s": round(min(times), 5), "step_time_waited_median_s": round(float(np.median(waited)), 5),
            "sequences_per_s": round(batch_size / median, 2),
            "tokens_per_s": round(batch_size * a.seq_len / median, 1), "loss": round(loss, 4),
            "real_tokens_per_step": step.real_tokens, "real_tokens_per_s": round(step.real_tokens / median, 1),
            "model_flops_per_step": flops,
            "model_flops_dense_mlm_head": bench.flops(batch_size, a.seq_len),
            "achieved_flops_per_s": round(flops / median), "peak_flops_per_s": round(peak), "peak_source": source,
            "mfu": round(flops / median / peak, 4)}


def trace_steps(directory: str, compiled, step: Stepper, steps: int, meta: dict) -> dict:
    """Runs ``steps`` more steps as the trainer runs them under ``jax.profiler.trace(directory)`` and
    writes beside the trace what `bert_jax.benchmark.profile` reduces it with: the compiled step's HLO
    and the steps' wall time. Returns the last step's metrics."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / profile.HLO_FILE).write_text(compiled.as_text())
    with jax.profiler.trace(directory, create_perfetto_trace=True):
        wall, metrics = timing.queued_wall(step, steps)
    (out / profile.META_FILE).write_text(json.dumps({**meta, "steps": steps, "wall_s": wall}))
    return metrics


def label(r: dict) -> str:
    """One line naming a result's step: model, shapes, dtype, device."""
    return (f"{r['model']}-{r['size']} seq_len {r['seq_len']} batch {r['batch_size']} {r['dtype']} "
            f"(attention: {r['attention_path']}; scan={r['scan']}) on {r['device_kind']}")


def find_max_batch(bench: Bench, budgets_gib: list[float]) -> dict:
    """The largest multiple of ``--batch_multiple`` whose compiled memory fits each budget."""
    k, known = bench.args.batch_multiple, {}

    def mem(units: int) -> int:
        report = trainer_steps.memory(bench.compile(units * k)[0])
        if report is None:
            raise cli.UserError(f"{jax.devices()[0].platform}: XLA gives no memory analysis here")
        return report["total"]

    found = {str(g): trainer_steps.largest_fitting(mem, g * GIB, known=known) * k for g in sorted(budgets_gib)}
    return {"mode": "find_max_batch", **bench.describe(None), "batch_multiple": k, "max_batch": found,
            "estimates_gib": {u * k: round(b / GIB, 3) for u, b in sorted(known.items())}}


def summary(r: dict) -> str:
    p = r["params"]
    paper = (f"the paper {p['paper'] / 1e6:.0f}M, ours/paper {p['ours_over_paper']:.3f}" if p["paper"]
             else "no figure in the paper for this size")
    micro = f"; {r['accumulation_steps']} micro-batches" if r["accumulation_steps"] > 1 else ""
    lines = [f"{r['mode']}: {r['model']}-{r['size']} (objective {r['objective']}) seq_len {r['seq_len']} "
             f"batch {r['batch_size']} P {r['max_predictions']} {r['dtype']} remat={r['remat']} scan={r['scan']} "
             f"on {r['devices']} x {r['device_kind']} (load {r['load_average'][0]})"
             + ("; huge pages" if "hugetlb=1" in r["glibc_tunables"] else "") + micro,
             f"  attention: {r['attention_path']}"
             + (f"; blocks on the real tokens only (--unpad_multiple {r['unpad_multiple']})" if r["unpad_multiple"]
                else ""),
             f"  parameters: {p['total'] / 1e6:.2f}M trained ({p['encoder'] / 1e6:.2f}M encoder); encoder at the "
             f"paper's vocabulary {p['paper_vocab']}: {p['encoder_at_paper_vocab'] / 1e6:.2f}M, {paper}"]
    if r["mode"] == "find_max_batch":
        return "\n".join(lines + [
            f"  largest batch (multiple of {r['batch_multiple']}) whose compiled estimate fits: "
            + ", ".join(f"{g} GiB -> {b}" for g, b in r["max_batch"].items()),
            f"  estimates (GiB) by batch: {r['estimates_gib']}"])
    m = r["memory"] and {k: v / GIB for k, v in r["memory"].items()}
    lines += [f"  compile: {r['compile_s']:.1f} s",
              f"  memory: {m['total']:.2f} GiB per device (arguments {m['arguments']:.2f} + outputs {m['outputs']:.2f}"
              f" - aliased {m['aliased']:.2f} + temp {m['temporaries']:.2f} + code {m['generated_code']:.2f})"
              if m else "  memory: no analysis on this backend"]
    if r["mode"] == "train_step":
        lines += [f"  step: median {r['step_time_median_s'] * 1e3:.1f} ms, min {r['step_time_min_s'] * 1e3:.1f} ms "
                  f"over {r['steps']} steps ({r['warmup']} warm-up), the next one queued as the trainer runs them "
                  f"(each waited for: median {r['step_time_waited_median_s'] * 1e3:.1f} ms); loss {r['loss']}",
                  f"  throughput: {r['sequences_per_s']:.1f} rows/s, {r['tokens_per_s']:.0f} tokens/s, "
                  f"{r['real_tokens_per_s']:.0f} real (not padding) tokens/s ({r['real_tokens_per_step']:.0f} a step)",
                  f"  model FLOPs/step: {r['model_flops_per_step'] / 1e9:.1f} G (bert_jax/benchmark/flops.py; "
                  f"{r['model_flops_dense_mlm_head'] / 1e9:.1f} G with a dense MLM head)",
                  f"  achieved: {r['achieved_flops_per_s'] / 1e12:.4f} TFLOP/s; MFU {100 * r['mfu']:.1f}% of "
                  f"{r['peak_flops_per_s'] / 1e12:.4f} TFLOP/s ({r['peak_source']})"]
    return "\n".join(lines)


SHAPE_FLAGS = ("--model", "--size", "--seq_len", "--batch_size", "--max_predictions", "--vocab_size", "--mesh",
               "--short_seq_prob")  # the same for every variant: the work and the data


# The execution choices a flag sets (bert_jax/resolve.py says what "auto" means on each platform): the
# model's, and the trainer's global norm (config.global_norm).
IMPLS = {"model.attention_impl": ("xla", "cudnn", "explicit", "flash"), "model.dropout_impl": ("jax", "fused"),
         "model.norm_impl": ("xla", "fused"), "model.gelu_impl": GELU_IMPLS, "global_norm": GLOBAL_NORMS}


def parse_args(argv=None) -> argparse.Namespace:
    p = cli.ArgumentParser(prog="python -m bert_jax.benchmark", description=__doc__.split("\n\n")[1],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    recipes = config_module("pretrain")
    models = dict(recipes.SIZE_NAMES)
    add = p.add_argument
    add("--model", default="bert", choices=tuple(models), help="the recipe in configs/pretrain.py")
    add("--size", default=None, help="; ".join(f"{m}: {' | '.join(s)}" for m, s in models.items())
        + " (default: the recipe's: base; small for electra)")
    add("--seq_len", type=int, default=128)
    add("--batch_size", type=lambda s: [int(x) for x in s.split(",") if x], default=[32], help="a comma list runs each")
    add("--steps", type=int, default=20, help="timed steps")
    add("--warmup", type=int, default=3, help="untimed steps after compilation")
    add("--dtype", default="float32", choices=("float32", "bfloat16"), help="compute dtype")
    add("--remat", default="none", help="none | full | a jax.checkpoint_policies name")
    add("--scan", action="store_const", const=True, default="auto", help="scanned layers (default: the trainer's)")
    add("--noscan", dest="scan", action="store_const", const=False, help="unrolled layers")
    add("--attention_dropout", type=float, default=None, help="default: the recipe's")
    for key, choices in IMPLS.items():  # --attention_impl: config.model.attention_impl
        add(f"--{key.split('.')[-1]}", default="auto", choices=("auto", *choices), help=f"config.{key}")
    for switch in ("recompute_activation", "stacked_params"):  # config.model.<switch>
        add(f"--{switch}", default="auto", choices=("auto", "true", "false"), help=f"model.{switch}")
    add("--rng_impl", default="threefry2x32", choices=("threefry2x32", "philox4x32", "rbg", "unsafe_rbg"))
    add("--per_device_batch", default="auto", metavar="auto|N", help="config.per_device_batch (0: no micro-batches)")
    add("--max_predictions", type=int, default=None, help="P (default: 5/32 of seq_len)")
    add("--short_seq_prob", type=float, default=None, help="lengths: uniform in [2, S] with this probability, else S")
    add("--packing", type=int, default=0, metavar="K", help="pack up to K synthetic examples a row")
    add("--unpad_multiple", type=int, default=0, metavar="M", help="config.unpad_multiple (0: padded blocks)")
    add("--vocab_size", type=int, default=None, help="default: the paper's (bert 30522, albert 30000, ...)")
    add("--mesh", default=None, help="(data, fsdp, tensor); -1 = the rest (default -1,1,1; 1,1,1 with --compare)")
    add("--memory_only", action="store_true", help="compile and report memory; run nothing")
    add("--find_max_batch", action="store_true", help="the largest batch that fits --memory_gb")
    add("--memory_gb", default="16,40,80", help="GiB budgets for --find_max_batch")
    add("--batch_multiple", type=int, default=8, help="--find_max_batch granularity")
    add("--xla_option", action="append", default=[], metavar="KEY=VALUE", help="XLA compiler option (repeatable)")
    add("--variant", action="append", default=[], metavar='"--FLAG VALUE ..."',
        help="also time our step with these flags added, taking turns (repeatable)")
    add("--compare", default="", metavar="hf-torch,hf-torch-compile,hf-flax",
        help="also time Hugging Face's BERT, taking turns")
    add("--compare_block", type=int, default=5, help="steps per turn of --variant and --compare")
    add("--torch_threads", type=int, default=2, help="--compare hf-torch: torch.set_num_threads")
    add("--profile", default="", metavar="DIR", help="trace --profile_steps more steps with jax.profiler into DIR "
        "(python -m bert_jax.benchmark.profile DIR reduces it to a table)")
    add("--profile_steps", type=int, default=3, help="steps --profile traces")
    add("--json", action="store_true", help="print the JSON line instead of a summary")
    add("--output", default="", metavar="PATH", help="append each result to PATH as a JSON line")
    argv = joined_variants(sys.argv[1:] if argv is None else argv)
    a = p.parse_args(argv)
    if a.size is None:  # the recipe's default size
        a.size = load_config_file("pretrain", f"model={a.model}").model.size.removeprefix(f"{a.model}-")
    if a.size not in models[a.model]:
        p.error(f"--size {a.size} for --model {a.model}: expected one of {' | '.join(models[a.model])}")
    if a.model == "electra" and a.packing:
        p.error("--packing: ELECTRA has no sentence-level head for packed rows; use --packing 0 with --model electra")
    a.vocab_size = a.vocab_size or PAPER_VOCAB[a.model]
    a.max_predictions = a.max_predictions or max(1, round(a.seq_len * 5 / 32))  # the paper's 20 at 128, 80 at 512
    if not a.batch_size or min(a.batch_size) < 1:
        p.error(f"--batch_size {','.join(map(str, a.batch_size))}: expected a comma list of batch sizes >= 1")
    for flag, low in (("seq_len", 4), ("steps", 1), ("warmup", 0), ("profile_steps", 1), ("max_predictions", 1),
                      ("packing", 0), ("unpad_multiple", 0), ("batch_multiple", 1), ("compare_block", 1)):
        if getattr(a, flag) < low:
            p.error(f"--{flag} {getattr(a, flag)}: expected at least {low}")
    if a.max_predictions > a.seq_len:
        p.error(f"--max_predictions {a.max_predictions}: expected at most --seq_len ({a.seq_len})")
    if a.output and os.path.isdir(a.output):
        p.error(f"--output {a.output}: is a directory, expected a file to append JSON lines to")
    try:  # the trainer's own check of the value
        resolve_per_device_batch(a.per_device_batch, "cpu", rows=0)
    except ValueError as e:
        p.error(f"--{e}")
    if a.find_max_batch and a.per_device_batch == "auto":  # sizes whole batches for accelerator memory
        a.per_device_batch = "0"
    a.compare = [x for x in a.compare.split(",") if x]
    a.mesh = a.mesh or ("1,1,1" if a.compare else "-1,1,1")
    a.variants = [(v, variant_args(p, argv, v)) for v in a.variant]
    if a.compare or a.variant:
        peers.check_args(p, a)
    return a


def joined_variants(argv: list[str]) -> list[str]:
    """``argv`` with each ``--variant FLAGS`` as one ``--variant=FLAGS`` ("--variant --noscan": one
    value, where argparse would read two flags)."""
    out, given = [], list(argv)
    while given:
        x = given.pop(0)
        out.append(f"--variant={given.pop(0)}" if x == "--variant" and given else x)
    return out


def variant_args(parser, argv: list[str], variant: str) -> argparse.Namespace:
    """The arguments of ``--variant variant``: ``argv`` with the variant's flags added (they win)."""
    extra = shlex.split(variant)
    flags = {x.split("=")[0] for x in extra if x.startswith("--")}
    clash = sorted(flags & {*SHAPE_FLAGS, "--variant", "--compare", "--memory_only", "--find_max_batch"})
    if clash or not flags:
        parser.error(f"--variant {variant!r}: expected flags that change how the step runs (e.g. '--rng_impl rbg'), "
                     f"not the shapes or the mode; {', '.join(clash) or 'no flag'} given")
    return parse_args([x for x in argv if not x.startswith("--variant=")] + extra)


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    libs = peers.load_libraries(args.compare)  # before compiling: a missing package is one line
    bench, comparing = Bench(args), args.compare or args.variants
    results = []
    for size in [None] if args.find_max_batch else args.batch_size:
        if size is None:
            r = find_max_batch(bench, [float(g) for g in args.memory_gb.split(",") if g])
        elif comparing:
            r = peers.compare(bench, [(name, Bench(v)) for name, v in args.variants], libs, size)
        else:
            r = run_one(bench, size)
        line = json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **r})
        print(line if args.json else peers.summary(r) if comparing else summary(r), flush=True)
        if args.output:
            with open(args.output, "a") as f:
                f.write(line + "\n")
        results.append(r)
    return results
